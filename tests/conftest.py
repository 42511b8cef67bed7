"""Runs each test in a pytest process split into the logical CPUs it needs.

TensorFlow fixes its logical devices once per process, and MirroredStrategy
objects in one process clash in their collective all-reduce. So `make test`
runs the unmarked tests in one process (`--logical-cpus=1`, the default), and
each file with tests marked `@pytest.mark.logical_cpus(N)` once more per N, in
a process of its own (`pytest FILE --logical-cpus=N`), which runs only the
tests marked for N.
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


def pytest_configure(config):
    count = config.getoption("--logical-cpus")
    if count > 1:
        import keras_scaling

        keras_scaling.use_logical_cpus(count)


def pytest_collection_modifyitems(config, items):
    count = config.getoption("--logical-cpus")
    selected, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("logical_cpus")
        wanted = marker.args[0] if marker else 1
        (selected if wanted == count else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
