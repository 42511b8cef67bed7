"""The package's modules import each other without cycles.

The graph is read from the source (every `import` statement, those inside
functions too: a local import only hides a cycle), so the test needs no
TensorFlow and runs in any session. A module's parent package is not an
edge: Python imports it first anyway, and `compat/__init__.py` importing
`compat._keras_source` is how a package is built, not a cycle between concerns.
"""

import ast
import pathlib

import keras_scaling

PACKAGE_DIR = pathlib.Path(keras_scaling.__file__).parent
PACKAGE = "keras_scaling"


def _module_name(path):
    parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(path): path for path in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imported(node, module, modules):
    """The package's modules that one import statement loads."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{node.module}" if node.module else package
        else:
            base = node.module or ""
        # `from package import name` loads package.name when it is a module.
        names = [f"{base}.{alias.name}" for alias in node.names] + [base]
    found = set()
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name != PACKAGE:
            found.add(name)
    return found


def _run_time_nodes(tree):
    """Every node of `tree` except those under `if TYPE_CHECKING:`, which never run."""
    pending = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                pending.extend(child.orelse)
            else:
                pending.append(child)


def import_graph():
    """{module: the package modules it imports}, parent packages left out."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        edges = set()
        for node in _run_time_nodes(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(node, module, modules)
        graph[module] = {
            target for target in edges if target != module and not module.startswith(target + ".")
        }
    return graph


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(module, path):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target, path + [target])
                if cycle:
                    return cycle
        state[module] = "done"
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module, [module])
            if cycle:
                return cycle
    return None


def test_the_import_graph_sees_the_known_edges():
    graph = import_graph()
    assert "keras_scaling.devices._topology" in graph["keras_scaling.devices.strategies"]
    assert "keras_scaling.compat" in graph["keras_scaling.devices.strategies"]
    assert "keras_scaling.compat._keras_source" in graph["keras_scaling.compat"]


def test_no_module_imports_itself_through_others():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_reports_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_devices_does_not_import_the_launcher():
    assert "keras_scaling.launch.launcher" not in import_graph()["keras_scaling.devices.strategies"]
