"""Runs each test in a pytest process split into the logical CPUs it needs.

TensorFlow fixes its logical devices once per process, and MirroredStrategy
objects in one process clash in their collective all-reduce. So `make test`
(`tests/run_sessions.py`) runs the unmarked tests in one session on one
device (`--logical-cpus=1`, the default), and each file with tests marked
`@pytest.mark.logical_cpus(N)` once more per N, in a process of its own
(`pytest FILE --logical-cpus=N`), which runs only the tests marked for N. A
plain pytest session given the list of N (`--device-counts`) fails, naming
the files, when a test is marked with a count that no process would run.
"""

import pytest


def pytest_addoption(parser):
    parser.addoption(
        "--logical-cpus",
        type=int,
        default=1,
        help="split this process's CPU into N logical devices and run the "
        "tests marked logical_cpus(N)",
    )
    parser.addoption(
        "--device-counts",
        default=None,
        help="the counts N that other processes run (such as '2 3 4'): a test "
        "marked logical_cpus(N) with another N is an error",
    )


def pytest_configure(config):
    count = config.getoption("--logical-cpus")
    if count > 1:
        import keras_scaling

        keras_scaling.use_logical_cpus(count)


def _check_device_counts(config, items):
    listed = config.getoption("--device-counts")
    if listed is None:
        return
    runnable = {1, *(int(n) for n in listed.replace(",", " ").split())}
    unrun = sorted(
        {
            f"{item.path.relative_to(config.rootpath)} (logical_cpus({marker.args[0]}))"
            for item in items
            for marker in [item.get_closest_marker("logical_cpus")]
            if marker and marker.args[0] not in runnable
        }
    )
    if unrun:
        raise pytest.UsageError(
            "tests marked with a device count that make test does not run "
            f"(TEST_DEVICE_COUNTS is {listed!r}): {', '.join(unrun)}. Add the "
            "count to TEST_DEVICE_COUNTS in the Makefile, or mark the tests "
            "with a listed one."
        )


def pytest_collection_modifyitems(config, items):
    _check_device_counts(config, items)
    count = config.getoption("--logical-cpus")
    selected, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("logical_cpus")
        wanted = marker.args[0] if marker else 1
        (selected if wanted == count else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
