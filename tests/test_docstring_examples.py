"""Every ```python block under `Example:` in a public docstring runs.

Public docstrings are those of the names in the `__all__` of keras_scaling's
public modules, and of the public methods and properties of those classes.
Each example runs in a namespace of its own: as in `doctest`, the names of
the module it is documented in, plus the imports a reader is assumed to have
made (`import keras, numpy as np, tensorflow as tf, keras_scaling`); in a process started for the purpose
(`tests/workers/run_examples.py`) with its working directory in a temporary
directory: examples that split the CPU (`use_logical_cpus(N)`) or build a
`MirroredStrategy` in a process with N (default 2) logical CPUs, one process
per N; the others in one process with one device.
"""

import importlib
import inspect
import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "workers", "run_examples.py")
TIMEOUT_S = 600

MODULES = (
    "keras_scaling",
    "keras_scaling.callbacks",
    "keras_scaling.cluster",
    "keras_scaling.compat",
    "keras_scaling.data",
    "keras_scaling.devices",
    "keras_scaling.devices.strategies",
    "keras_scaling.doctor",
    "keras_scaling.explain",
    "keras_scaling.launch.launcher",
    "keras_scaling.mfu.flops",
    "keras_scaling.mfu.peak_flops",
    "keras_scaling.mfu.utilization",
    "keras_scaling.preemption.backup_and_restore",
    "keras_scaling.replica_sync.replica_state",
    "keras_scaling.replica_sync.replica_sync_check",
    "keras_scaling.throughput",
    "keras_scaling.throughput.arithmetic",
    "keras_scaling.throughput.baseline",
    "keras_scaling.throughput.throughput_logger",
)

# Examples known not to run yet, each to be fixed in its own module; a fixed
# example fails here until it is taken off this list.
PENDING = set()


def _examples_of(docstring):
    """The code of each ```python block after `Example:` (or `Examples:`)."""
    text = inspect.cleandoc(docstring or "")
    match = re.search(r"^\s*Examples?:\s*$", text, re.MULTILINE)
    if match is None:
        return []
    return [
        textwrap.dedent(block)
        for block in re.findall(r"```python\n(.*?)^\s*```", text[match.end() :], re.S | re.M)
    ]


def _documented(value):
    """(qualified name, module, docstring) of a public function or class and its members."""
    name = f"{value.__module__}.{value.__qualname__}"
    found = [(name, value.__module__, value.__doc__)]
    if inspect.isclass(value):
        for member_name, member in vars(value).items():
            if member_name.startswith("_"):
                continue
            if isinstance(member, (staticmethod, classmethod)):
                member = member.__func__
            if inspect.isfunction(member) or isinstance(member, property):
                found.append((f"{name}.{member_name}", value.__module__, member.__doc__))
    return found


def collect_examples():
    """[(name, module, code)]: every example of every public docstring, once."""
    seen, examples = set(), []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        values = [module] + [getattr(module, name) for name in getattr(module, "__all__", ())]
        for value in values:
            if inspect.ismodule(value):
                documented = (
                    [(value.__name__, value.__name__, value.__doc__)] if value is module else []
                )
            elif inspect.isclass(value) or inspect.isfunction(value):
                documented = _documented(value)
            else:
                continue
            for name, home, docstring in documented:
                if name in seen:
                    continue
                seen.add(name)
                for index, code in enumerate(_examples_of(docstring)):
                    examples.append((name if index == 0 else f"{name}[{index}]", home, code))
    return examples


def logical_cpus_for(code):
    """The logical CPUs an example's process needs: 1 unless it splits the CPU."""
    asked = re.search(r"use_logical_cpus\((\d+)\)", code)
    if asked:
        return int(asked.group(1))
    return 2 if "MirroredStrategy(" in code else 1


EXAMPLES = collect_examples()


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """{example name: None, or the error it raised}, one process per CPU count."""
    groups = {}
    for name, module, code in EXAMPLES:
        groups.setdefault(logical_cpus_for(code), []).append(
            {"name": name, "module": module, "code": code}
        )
    found = {}
    for count, group in sorted(groups.items()):
        directory = tmp_path_factory.mktemp(f"examples_{count}_cpus")
        path = directory / "examples.json"
        path.write_text(json.dumps(group))
        result = subprocess.run(
            [sys.executable, WORKER, str(path), str(count)],
            cwd=directory,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        assert result.returncode == 0, result.stderr[-4000:]
        found.update(json.loads(result.stdout.strip().splitlines()[-1]))
    return found


def test_examples_are_found_in_every_kind_of_public_docstring():
    names = {name for name, _, _ in EXAMPLES}
    assert "keras_scaling.devices.strategies.use_logical_cpus" in names  # a function
    assert "keras_scaling.devices.strategies.StrategyInfo" in names  # a class
    assert "keras_scaling.data.distribute" in names
    assert len(EXAMPLES) > 40


def test_pending_names_an_example_that_exists():
    names = {name for name, _, _ in EXAMPLES}
    assert PENDING <= names, sorted(PENDING - names)


@pytest.mark.timeout(2 * TIMEOUT_S)
@pytest.mark.parametrize("name", [name for name, _, _ in EXAMPLES])
def test_docstring_example_runs(name, outcomes):
    if name in PENDING:
        assert outcomes[name] is not None, f"{name} runs now: take it off PENDING"
        pytest.xfail("pending: fixed in its own module")
    assert outcomes[name] is None, outcomes[name]
