"""Every ```python block under `Example:` in a public docstring runs.

Public docstrings are those of the names in the `__all__` of keras_scaling's
public modules, and of the public methods and properties of those classes.
Each example runs in a namespace of its own: as in `doctest`, the names of
the module it is documented in, plus the imports a reader is assumed to have
made (`import keras, numpy as np, tensorflow as tf, keras_scaling`), with its
working directory in a temporary directory
(`tests/workers/run_examples.py`). An example that splits the CPU
(`use_logical_cpus(N)`) or builds a `MirroredStrategy` needs N (default 2)
logical CPUs, the others one device. Each runs in the process of the pytest
session of its count, as a test marked `logical_cpus(N)`, which saves a start
of TensorFlow per count; a count that no session of `make test` runs
(`--device-counts`), and every count above 1 in a plain `pytest` run on one
device, runs its examples in a process started for them, one per count.

An example's output comments are checked as it runs: a comment after an
expression statement states its output (`interval.samples_per_sec   # 640.0`);
`tests/workers/run_examples.py` defines the convention, and the tests at the
end of this file show it, a wrong comment failing the runner.
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

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS_DIR)
WORKER = os.path.join(TESTS_DIR, "workers", "run_examples.py")
RUN_SESSIONS = os.path.join(TESTS_DIR, "run_sessions.py")
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
    "keras_scaling.tune",
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


def _runner():
    """tests/workers/run_examples.py as a module, to run examples in this process."""
    spec = importlib.util.spec_from_file_location("run_examples", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RUNNER = _runner()

# The counts of make test's sessions (TEST_DEVICE_COUNTS) whose examples run
# in that session's process; written out for tests/run_sessions.py, which
# finds the files of a count by their marks.
SESSION_MARKS = {2: pytest.mark.logical_cpus(2), 4: pytest.mark.logical_cpus(4)}


def in_processes_of_their_own(logical_cpus, device_counts):
    """[(name, count)] of the examples that a session with these options runs in processes of their own.

    `logical_cpus` and `device_counts` are the session's `--logical-cpus` and
    `--device-counts` (None in a plain run, where no other session runs).
    """
    if logical_cpus != 1:
        return []
    other_sessions = (
        {int(n) for n in device_counts.replace(",", " ").split()} if device_counts else set()
    )
    return [
        (name, count)
        for name, _, code in EXAMPLES
        for count in [logical_cpus_for(code)]
        if count != 1 and not (count in SESSION_MARKS and count in other_sessions)
    ]


def _options(config):
    return config.getoption("--logical-cpus"), config.getoption("--device-counts")


def pytest_generate_tests(metafunc):
    if metafunc.definition.name != "test_docstring_example_runs":
        return
    in_sessions = [
        pytest.param(name, False, marks=SESSION_MARKS.get(count, ()), id=name)
        for name, _, code in EXAMPLES
        for count in [logical_cpus_for(code)]
        if count == 1 or count in SESSION_MARKS
    ]
    in_processes = [
        pytest.param(name, True, id=f"{name} in a process of its own")
        for name, _ in in_processes_of_their_own(*_options(metafunc.config))
    ]
    metafunc.parametrize("name, in_a_process_of_its_own", in_sessions + in_processes)


# A docstring whose output comment is wrong, and the same with the right one: the first
# must fail in the runner.
_WRONG_COMMENT_DOCSTRING = """Spacing of the reads.

Example:

```python
auto_update_freq(0.010, 0.0002)    # 11: long steps, the floor
```
"""
(_WRONG_COMMENT_CODE,) = _examples_of(_WRONG_COMMENT_DOCSTRING)
RUNNER_CHECKS = [
    {"name": "wrong comment", "module": "keras_scaling.throughput", "code": _WRONG_COMMENT_CODE},
    {
        "name": "right comment",
        "module": "keras_scaling.throughput",
        "code": _WRONG_COMMENT_CODE.replace("# 11:", "# 10:"),
    },
]


@pytest.fixture(scope="module")
def outcomes_in_processes(request, tmp_path_factory):
    """{example name: None, or the error it raised}, run in one process per CPU count."""
    groups = {}
    by_name = {name: (module, code) for name, module, code in EXAMPLES}
    for name, count in in_processes_of_their_own(*_options(request.config)):
        module, code = by_name[name]
        groups.setdefault(count, []).append({"name": name, "module": module, "code": code})
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
def test_docstring_example_runs(name, in_a_process_of_its_own, tmp_path, request):
    if in_a_process_of_its_own:
        outcome = request.getfixturevalue("outcomes_in_processes")[name]
    else:
        request.getfixturevalue("collective_keys_of_its_own")
        (example,) = [
            {"name": name, "module": module, "code": code}
            for example_name, module, code in EXAMPLES
            if example_name == name
        ]
        outcome = RUNNER.run_example(example, tmp_path)
    if name in PENDING:
        assert outcome is not None, f"{name} runs now: take it off PENDING"
        pytest.xfail("pending: fixed in its own module")
    assert outcome is None, outcome


def test_make_test_runs_each_example_in_the_session_of_its_count_and_a_plain_run_runs_all():
    counts = {name: logical_cpus_for(code) for name, _, code in EXAMPLES}

    def needing(wanted):
        return [(name, count) for name, count in counts.items() if wanted(count)]

    # make test's sessions of 2 and 4 logical CPUs run this file, found by its marks.
    spec = importlib.util.spec_from_file_location("run_sessions", RUN_SESSIONS)
    run_sessions = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_sessions)
    sessions = run_sessions.logical_cpu_sessions(
        run_sessions.marked_counts(os.path.dirname(RUN_SESSIONS)), [2, 4]
    )
    this_file = os.path.relpath(__file__, ROOT)
    assert [count for count, files in sessions if this_file in files] == sorted(SESSION_MARKS)
    assert in_processes_of_their_own(1, "2 4") == needing(lambda count: count not in (1, 2, 4))
    assert in_processes_of_their_own(1, "2") == needing(lambda count: count not in (1, 2))
    assert in_processes_of_their_own(1, None) == needing(lambda count: count != 1)
    assert in_processes_of_their_own(2, None) == []


# --- the output comments of the examples are checked ---------------------------------


def test_the_runner_fails_an_example_whose_output_comment_is_wrong(tmp_path):
    wrong, right = (RUNNER.run_example(example, tmp_path) for example in RUNNER_CHECKS)
    assert right is None, right
    assert "OutputMismatch" in wrong
    assert "line 1: auto_update_freq(0.010, 0.0002)    # 11: long steps" in wrong
    assert "the output is: 10" in wrong


@pytest.mark.parametrize(
    "comment, output, holds",
    [
        ("640.0", "640.0", True),
        ("641.0", "640.0", False),
        ("True 8", "True 8", True),
        ("True 8", "True 9", False),
        ("'host'", "'host'", True),
        ('"host"', "'host'", False),  # the repr, as the Python prompt shows it
        ("None: one process", "None", True),  # the output, then a remark
        ("2: the chief and one worker", "3", False),
        ("{'type': 'worker', 'index': 1}", "{'type': 'worker', 'index': 1}", True),
        ("0.05", "0.05000000000000001", True),  # floats up to their rounding
        ("312e12", "312000000000000.0", True),
        ("0.2", "0.25", False),
        ("3", "3.0000001", False),
        ("8333", "83330", False),
        (
            "MirroredStrategy: 1 worker, 2 replicas ...",
            "MirroredStrategy: 1 worker, 2 replicas (x)",
            True,
        ),
        ("... steps per epoch: 32 ...", "plan:\n  steps per epoch:  32\n  shuffle: no", True),
        ("... steps per epoch: 32 ...", "plan:\n  steps per epoch:  31\n  shuffle: no", False),
    ],
)
def test_an_output_comment_holds_for_the_output_it_states(comment, output, holds):
    assert RUNNER.output_matches(comment, output) is holds


def test_a_printed_output_is_the_text_printed_and_a_value_its_repr():
    runner = RUNNER
    runner.check_outputs("x = [1, 'a']\nprint(*x)  # 1 a\nx  # [1, 'a']\n", {})
    with pytest.raises(runner.OutputMismatch, match=r"line 2: print\(\*x\)  # 1 'a'"):
        runner.check_outputs("x = [1, 'a']\nprint(*x)  # 1 'a'\n", {})
    with pytest.raises(runner.OutputMismatch, match="the output is: None"):
        runner.check_outputs("x = []\nx.append(1)  # appends 1\n", {})


def test_comments_on_assignments_and_lines_of_their_own_are_remarks():
    namespace = {}
    RUNNER.check_outputs("x = 2  # 3\n# 4\nif x:\n    y = x  # 5\n", namespace)
    assert namespace["y"] == 2


def test_a_line_run_several_times_holds_each_time_and_a_line_never_run_fails():
    runner = RUNNER
    with pytest.raises(runner.OutputMismatch, match="line 2: i % 2  # 0\n  the output is: 1"):
        runner.check_outputs("for i in (0, 2, 3):\n    i % 2  # 0\n", {})
    with pytest.raises(runner.OutputMismatch, match="line 2: 1  # 1\n  never ran"):
        runner.check_outputs("if False:\n    1  # 1\n", {})
