"""Runs each test in a pytest process split into the logical CPUs it needs.

TensorFlow fixes its logical devices once per process. So `make test`
(`tests/run_sessions.py`) runs the unmarked tests in one session on one
device (`--logical-cpus=1`, the default), and the files with tests marked
`@pytest.mark.logical_cpus(N)` once more per N, in processes split into N
logical CPUs (`pytest FILES --logical-cpus=N`), which run only the tests
marked for N. A plain pytest session given the list of N (`--device-counts`)
fails, naming the files, when a test is marked with a count that no process
would run.

MirroredStrategy objects in one process clash in their collective
all-reduce: each numbers its collective groups and instances from the same
start ("Shape mismatch in the collective instance 100"; "joining a group with
size 4, but that group has size 2"). The strategies of each test module here
number theirs from a start of their own, so the modules can share a process.

Each test's garbage is collected when the test ends (see
`_garbage_collected_when_the_test_ends`).

The suite runs as on a machine without the extra `plot`: Keras imports
`matplotlib.pyplot` whenever it can, a median of 0.44 s of CPU time in each
process that imports it (`benchmarks/matplotlib_cost.py`), and the suite
starts dozens of them. So matplotlib cannot be imported here nor
in the processes the tests start (`tests/without_matplotlib` on PYTHONPATH);
the tests of the charts take `matplotlib_importable` or `env_with_matplotlib`.
"""

import gc
import itertools
import os
import sys

import pytest

# Apart enough for the collective groups of every strategy a module builds.
_COLLECTIVE_KEYS_PER_MODULE = 1000
_collective_key_bases = itertools.count(_COLLECTIVE_KEYS_PER_MODULE, _COLLECTIVE_KEYS_PER_MODULE)

_WITHOUT_MATPLOTLIB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "without_matplotlib")
# PYTHONPATH without the directory (which pytest-xdist's workers inherit).
_PYTHONPATH = [
    path
    for path in os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if path and path != _WITHOUT_MATPLOTLIB
]
_PYTHONPATH_WITHOUT_MATPLOTLIB = os.pathsep.join([_WITHOUT_MATPLOTLIB, *_PYTHONPATH])
os.environ["PYTHONPATH"] = _PYTHONPATH_WITHOUT_MATPLOTLIB
if "matplotlib" not in sys.modules:
    sys.modules["matplotlib"] = None  # `import matplotlib` raises


@pytest.fixture(scope="session")
def env_with_matplotlib():
    """The environment of a subprocess (and its children) that can import matplotlib."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(_PYTHONPATH)}


@pytest.fixture(scope="session")
def env_without_matplotlib():
    """The environment of a subprocess (and its children) where `import matplotlib` fails.

    As on a machine without the extra `keras-scaling[plot]`: Keras, which
    imports matplotlib when it can, carries on without it.
    """
    return {**os.environ, "PYTHONPATH": _PYTHONPATH_WITHOUT_MATPLOTLIB}


@pytest.fixture
def matplotlib_importable():
    """matplotlib importable in this process from this test on.

    Not hidden again afterwards: a second import of matplotlib beside the
    submodules of the first would mix two sets of its globals.
    """
    if "matplotlib" in sys.modules and sys.modules["matplotlib"] is None:
        del sys.modules["matplotlib"]


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
        help="the counts N that other processes run (such as '2 4'): a test "
        "marked logical_cpus(N) with another N is an error",
    )


def _runs_tests(config):
    """False in the controller of a pytest-xdist session, which only hands out tests."""
    return hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)


# Tests that need a cluster engine (a throw-away Slurm, a local Ray), run by
# `make test-cluster`: collected only when named on the command line.
_CLUSTER_TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster")


def pytest_ignore_collect(collection_path, config):
    if os.path.abspath(str(collection_path)) != _CLUSTER_TESTS:
        return None
    named = (os.path.abspath(arg.split("::")[0]) for arg in config.args)
    if any(path == _CLUSTER_TESTS or path.startswith(_CLUSTER_TESTS + os.sep) for path in named):
        return None
    return True


def pytest_configure(config):
    count = config.getoption("--logical-cpus")
    if count > 1 and _runs_tests(config):
        import keras_scaling

        keras_scaling.use_logical_cpus(count)


def _number_collective_keys_apart(config):
    """Has the MirroredStrategy objects built from now on number their collective keys apart.

    `_collective_key_base` is the class attribute TensorFlow's own tests set
    for this; each MirroredStrategy reads it when it is built.
    """
    if config.getoption("--logical-cpus") > 1:
        import tensorflow as tf

        tf.distribute.MirroredStrategy._collective_key_base = next(_collective_key_bases)


@pytest.fixture(autouse=True, scope="module")
def _collective_keys_of_its_own(request):
    _number_collective_keys_apart(request.config)


@pytest.fixture
def collective_keys_of_its_own(request):
    """For a test whose strategies have nothing to do with those of the tests before it."""
    _number_collective_keys_apart(request.config)


@pytest.fixture(autouse=True, scope="module")
def _garbage_collected_when_the_module_ends():
    """Collects everything the module's tests and fixtures left, frozen or not.

    Torn down after the module's other fixtures (it is set up first), so
    what they held is garbage by then.
    """
    yield
    if "tensorflow" in sys.modules:
        gc.unfreeze()
        gc.collect()
        gc.freeze()


@pytest.fixture(autouse=True)
def _garbage_collected_when_the_test_ends():
    """Frees the tf.data iterators a test left in reference cycles while they are young.

    Keras leaves each fit's iterators in reference cycles, and freeing a
    tf.data iterator can wait for its autotuning thread to wake up, which
    sleeps up to a minute between passes. Collected by chance during a later
    test, a few old iterators stalled that test for 40 to 170 s.

    What is still alive after the collection (TensorFlow, Keras, the
    module's fixtures, what Keras caches) is frozen: each collection then
    looks only at what its test made. Unfrozen, a collection looked at all of
    it again after every test, 0.04 s at the start of the session on 2
    logical CPUs and 0.4 s by its end. `_garbage_collected_when_the_module_ends`
    collects what was frozen and has died since.
    """
    yield
    if "tensorflow" in sys.modules:
        gc.collect()
        gc.freeze()


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


def _longest_first(items):
    """The files of `run_sessions.LONGEST_FIRST` first, for pytest-xdist's queue."""
    from run_sessions import LONGEST_FIRST, ROOT

    rank = {os.path.join(ROOT, path): index for index, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(str(item.path), len(rank)))


def pytest_collection_modifyitems(config, items):
    _check_device_counts(config, items)
    if hasattr(config, "workerinput"):
        _longest_first(items)
    count = config.getoption("--logical-cpus")
    selected, deselected = [], []
    for item in items:
        marker = item.get_closest_marker("logical_cpus")
        wanted = marker.args[0] if marker else 1
        (selected if wanted == count else deselected).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = selected
