"""Runs each test in the pytest session whose process has its device count.

TensorFlow fixes its logical devices once per process, and MirroredStrategy
instances of different sizes in one process break each other's collective
all-reduce. So `make test` runs one pytest session per device count
(`--logical-cpus=N`), and a test marked `@pytest.mark.logical_cpus(N)` runs
only in session N; an unmarked test runs in session 1 (the process as it is).
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
