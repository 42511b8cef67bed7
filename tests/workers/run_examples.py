"""Runs docstring examples, each in a namespace of its own.

`run_example` runs one in the calling process (tests/test_docstring_examples.py
runs most of them so, in the pytest session of their device count) and puts
back what an example may change for the code after it: the working
directory, the environment, Keras' dtype policy, the SIGINT and SIGTERM
handlers. As a script, `python run_examples.py EXAMPLES.json LOGICAL_CPUS`
runs a list of `{"name": ..., "module": ..., "code": ...}` in a process split
into LOGICAL_CPUS logical CPUs; the last line of stdout is
`{name: null or the error}`. As in `doctest`, every example sees the names of
the module it is documented in (a copy of them), plus the imports a reader of
keras_scaling's docs is assumed to have made (`PREAMBLE`).

An example's output comments are checked (`check_outputs`): a line that ends
an expression statement and carries a comment, such as

    interval.samples_per_sec   # 640.0
    print(report.ok, report.step)   # True 8

states that statement's output, and the example fails when the output is
otherwise. The output of `print(...)` is the text it prints (without the
final newline); that of any other expression is its `repr()`, as the Python
prompt shows it (`None` included). The comment is the output, or the output
followed by `: ` and a remark (`# None: one process`). In the comparison,
runs of whitespace (newlines too) count as one space, `...` stands for any
text, and a number written with a decimal point or an exponent is compared
as a number, up to float rounding (a relative 1e-9: `# 0.05` holds for
`0.05000000000000001`, `# 312e12` for `312000000000000.0`). Comments
on other lines (assignments, `with`, lines of their own) are remarks.

In the script, the MirroredStrategy objects of each example number their
collective keys from a start of their own, so that they do not clash with
those of the examples before it (in a pytest session, tests/conftest.py's
`collective_keys_of_its_own` fixture does it).
"""

import ast
import contextlib
import importlib
import io
import json
import math
import os
import re
import signal
import sys
import tokenize
import traceback

# Apart enough for the collective groups of every strategy an example builds.
COLLECTIVE_KEYS_PER_EXAMPLE = 1000
PREAMBLE = "import keras\nimport numpy as np\nimport tensorflow as tf\nimport keras_scaling\n"

# The name the rewritten example calls to record outputs.
_RECORDER = "__example_outputs__"
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# In a comment: "...", a number, or a run of other text.
_COMMENT_PART = re.compile(rf"(\.\.\.)|({_NUMBER})|((?:(?!\.\.\.|{_NUMBER}).)+)", re.S)


class OutputMismatch(AssertionError):
    """An example's output differs from what its comments state."""


def stated_outputs(code):
    """`{line: comment}` of the expression statements whose last line carries a comment.

    Lines count from 1 at the example's first line.
    """
    trailing = {}
    for token in tokenize.generate_tokens(io.StringIO(code).readline):
        if token.type == tokenize.COMMENT and token.line[: token.start[1]].strip():
            trailing[token.start[0]] = token.string[1:].strip()
    return {
        node.end_lineno: trailing[node.end_lineno]
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Expr) and node.end_lineno in trailing
    }


def _is_print(node):
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    )


class _RecordOutputs(ast.NodeTransformer):
    """Wraps each expression statement with a stated output so that its output is recorded."""

    def __init__(self, lines):
        self.lines = lines

    def visit_Expr(self, node):
        if node.end_lineno not in self.lines:
            return node
        recorder = ast.Name(_RECORDER, ast.Load())
        line = ast.Constant(node.end_lineno)
        if _is_print(node.value):
            # with __example_outputs__.printed(line): print(...)
            printed = ast.Call(ast.Attribute(recorder, "printed", ast.Load()), [line], [])
            wrapped = ast.With([ast.withitem(printed)], [node])
        else:
            # __example_outputs__.shown(line, expression)
            shown = ast.Call(ast.Attribute(recorder, "shown", ast.Load()), [line, node.value], [])
            wrapped = ast.Expr(shown)
        return ast.fix_missing_locations(ast.copy_location(wrapped, node))


class _Outputs:
    """The outputs of the statements with a stated output, by line, in the order they ran."""

    def __init__(self):
        self.by_line = {}

    @contextlib.contextmanager
    def printed(self, line):
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            yield
        self.by_line.setdefault(line, []).append(buffer.getvalue().removesuffix("\n"))

    def shown(self, line, value):
        self.by_line.setdefault(line, []).append(repr(value))
        return value


def _same_number(found, written):
    """Whether the numbers `found` and `written` (texts) differ by float rounding at most."""
    return math.isclose(float(found), float(written), rel_tol=1e-9, abs_tol=0.0)


def _matches(expected, output):
    """Whether `output` is what the comment text `expected` states (no remark in it)."""
    expected, output = " ".join(expected.split()), " ".join(output.split())
    pattern, numbers = "", []
    for ellipsis, number, text in _COMMENT_PART.findall(expected):
        if ellipsis:
            pattern += ".*?"
        elif number and re.search(r"[.eE]", number):
            pattern += f"({_NUMBER})"
            numbers.append(number)
        else:
            pattern += re.escape(number or text)
    match = re.fullmatch(pattern, output, re.S)
    return match is not None and all(
        _same_number(found, written) for found, written in zip(match.groups(), numbers)
    )


def output_matches(comment, output):
    """Whether `output` is the one `comment` states, alone or followed by `: ` and a remark."""
    candidates = [comment] + [comment[: m.start()] for m in re.finditer(": ", comment)]
    return any(_matches(expected, output) for expected in candidates if expected.strip())


def check_outputs(code, namespace, filename="<example>"):
    """Runs `code` in `namespace`; raises `OutputMismatch` where an output is not the one stated."""
    stated = stated_outputs(code)
    tree = _RecordOutputs(stated).visit(ast.parse(code))
    outputs = _Outputs()
    namespace[_RECORDER] = outputs
    exec(compile(tree, filename, "exec"), namespace)
    source = code.splitlines()
    wrong = []
    for line, comment in sorted(stated.items()):
        ran = outputs.by_line.get(line)
        if not ran:
            wrong.append(f"line {line}: {source[line - 1].strip()}\n  never ran")
        for output in ran or ():
            if not output_matches(comment, output):
                wrong.append(f"line {line}: {source[line - 1].strip()}\n  the output is: {output}")
    if wrong:
        raise OutputMismatch("output comments that do not hold:\n" + "\n".join(wrong))


@contextlib.contextmanager
def _put_back(work_dir):
    """Runs the block in `work_dir`, then puts back the process state an example may change."""
    import keras

    from keras_scaling import compat

    cwd, environ, policy = os.getcwd(), dict(os.environ), keras.config.dtype_policy()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    # compat's examples enable and disable the fixes: later tests expect them as they were.
    fixes_active, fixes_refused = compat.status().active, set(compat._disabled_by_user)
    os.chdir(work_dir)
    try:
        yield
    finally:
        if compat.status().active != fixes_active:
            compat.disable()
            if fixes_active:
                compat.enable()
        compat._disabled_by_user.clear()
        compat._disabled_by_user.update(fixes_refused)
        os.chdir(cwd)
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        keras.config.set_dtype_policy(policy)
        for number, handler in handlers.items():
            if signal.getsignal(number) is not handler and handler is not None:
                signal.signal(number, handler)


def run_example(example, work_dir):
    """Runs `{"name", "module", "code"}` in `work_dir`; returns None, or the error's traceback."""
    namespace = dict(vars(importlib.import_module(example["module"])))
    namespace["__name__"] = "__example__"
    try:
        with _put_back(work_dir), contextlib.redirect_stdout(io.StringIO()):
            exec(PREAMBLE, namespace)
            check_outputs(example["code"], namespace, example["name"])
    except BaseException:  # noqa: BLE001 - SystemExit too: report, go on
        return traceback.format_exc(limit=-3)
    return None


def main():
    path, logical_cpus = sys.argv[1], int(sys.argv[2])
    import keras_scaling

    if logical_cpus > 1:
        keras_scaling.use_logical_cpus(logical_cpus)
    with open(path) as file:
        examples = json.load(file)
    outcomes = {}
    for index, example in enumerate(examples):
        if logical_cpus > 1:
            import tensorflow as tf

            tf.distribute.MirroredStrategy._collective_key_base = (
                COLLECTIVE_KEYS_PER_EXAMPLE * index
            )
        outcomes[example["name"]] = run_example(example, os.getcwd())
    sys.stdout.flush()
    print(json.dumps(outcomes))
    sys.stdout.flush()
    # Thread pools of TensorFlow can keep a finished interpreter alive.
    os._exit(0)


if __name__ == "__main__":
    main()
