"""Every import path of keras_scaling 0.1 still works, and gives the objects of the new layout.

Each 0.1 module, with the names its `__all__` listed in 0.1, and the module
where each name lives now: the name read through the old path must be the
very object of its new home (a copy would miss a fix, and `isinstance` and
`except` would tell them apart).
"""

import importlib
import json
import subprocess
import sys

import pytest

# {0.1 module: (its 0.1 `__all__`, the module each name lives in now)}
PATHS_OF_0_1 = {
    "keras_scaling": {
        "BackupAndRestore": "keras_scaling.preemption.backup_and_restore",
        "ReplicaDivergenceError": "keras_scaling.replica_sync.replica_sync_check",
        "ReplicaSyncCheck": "keras_scaling.replica_sync.replica_sync_check",
        "StrategyInfo": "keras_scaling.devices.strategies",
        "ThroughputLogger": "keras_scaling.throughput.throughput_logger",
        "auto_strategy": "keras_scaling.devices.strategies",
        "describe_strategy": "keras_scaling.devices.strategies",
        "use_logical_cpus": "keras_scaling.devices.strategies",
        "baseline": "keras_scaling",
        "callbacks": "keras_scaling",
        "cluster": "keras_scaling",
        "compat": "keras_scaling",
        "data": "keras_scaling",
        "devices": "keras_scaling",
        "doctor": "keras_scaling",
        "explain": "keras_scaling",
        "flops": "keras_scaling",
        "launcher": "keras_scaling",
        "peak_flops": "keras_scaling",
        "replica_state": "keras_scaling",
        "throughput": "keras_scaling",
        "utilization": "keras_scaling",
    },
    "keras_scaling.callbacks": {
        "BackupAndRestore": "keras_scaling.preemption.backup_and_restore",
        "ReplicaDivergenceError": "keras_scaling.replica_sync.replica_sync_check",
        "ReplicaSyncCheck": "keras_scaling.replica_sync.replica_sync_check",
        "ThroughputLogger": "keras_scaling.throughput.throughput_logger",
    },
    "keras_scaling.callbacks.throughput": {
        "ThroughputLogger": "keras_scaling.throughput.throughput_logger",
    },
    "keras_scaling.callbacks.replica_sync": dict.fromkeys(
        ["ReplicaDivergenceError", "ReplicaSyncCheck"],
        "keras_scaling.replica_sync.replica_sync_check",
    ),
    "keras_scaling.callbacks.backup_and_restore": dict.fromkeys(
        ["BackupAndRestore", "BackupError", "EXIT_PREEMPTED"],
        "keras_scaling.preemption.backup_and_restore",
    ),
    "keras_scaling.baseline": dict.fromkeys(
        [
            "Baseline",
            "FIELDS",
            "THROUGHPUT_JSON",
            "VERSION",
            "for_run",
            "measure_samples_per_sec",
            "read_throughput_json",
            "resolve_baseline",
            "setup_differences",
            "speedup_of",
            "write_throughput_json",
        ],
        "keras_scaling.throughput.baseline",
    ),
    "keras_scaling.devices": {
        **dict.fromkeys(
            [
                "StrategyInfo",
                "auto_strategy",
                "describe_strategy",
                "strategy_kind",
                "tf_config",
                "use_logical_cpus",
                "warn_if_keras_distribution_set",
            ],
            "keras_scaling.devices.strategies",
        ),
        **dict.fromkeys(
            [
                "is_chief",
                "num_replicas",
                "num_workers",
                "replica_device_names",
                "replicas_per_worker",
                "worker_index",
            ],
            "keras_scaling.devices._topology",
        ),
    },
    "keras_scaling.flops": dict.fromkeys(
        ["count_training_flops", "training_flops_per_sample"], "keras_scaling.mfu.flops"
    ),
    "keras_scaling.peak_flops": dict.fromkeys(
        [
            "PEAK_FLOPS",
            "Peak",
            "device_key",
            "faster_dtypes",
            "lookup",
            "measure_matmul_flops_per_sec",
            "resolve",
        ],
        "keras_scaling.mfu.peak_flops",
    ),
    "keras_scaling.utilization": dict.fromkeys(
        [
            "Utilization",
            "check_flops_per_sample",
            "check_peak_flops",
            "underuse_advice",
            "utilization",
        ],
        "keras_scaling.mfu.utilization",
    ),
    "keras_scaling.replica_state": {
        **dict.fromkeys(
            [
                "DIVERGENCE",
                "FLOAT_DRIFT",
                "GRADIENT_ACCUMULATOR",
                "NON_TRAINABLE",
                "OPTIMIZER_ITERATIONS",
                "OPTIMIZER_VARIABLE",
                "PER_REPLICA_STATE",
                "PER_REPLICA_STATE_MODES",
                "SEED_GENERATOR",
                "TRAINABLE",
                "CopyDifference",
                "ReplicaSyncReport",
                "VariableReport",
                "compare_copies",
                "likely_cause",
            ],
            "keras_scaling.replica_sync._copy_comparison",
        ),
        "ReplicaStateChecker": "keras_scaling.replica_sync._replica_state_checker",
        **dict.fromkeys(
            ["TrackedVariable", "distributed_variable", "is_distributed", "tracked_variables"],
            "keras_scaling.replica_sync._tracked_variables",
        ),
    },
    "keras_scaling.throughput": dict.fromkeys(
        [
            "Interval",
            "ReadSchedule",
            "Speedup",
            "SteadyState",
            "ThroughputStats",
            "ThroughputWindow",
            "auto_update_freq",
            "spacing_for_points",
            "speedup",
            "weighted_percentile",
        ],
        "keras_scaling.throughput.arithmetic",
    ),
    "keras_scaling.launcher": dict.fromkeys(
        ["CPU_DEVICES_ENV", "LaunchResult", "free_ports", "launch", "worker_env"],
        "keras_scaling.launch.launcher",
    ),
}

# A submodule's new home, for the submodule names of `keras_scaling.__all__`.
_MODULE_HOMES = {
    "baseline": "keras_scaling.throughput.baseline",
    "flops": "keras_scaling.mfu.flops",
    "peak_flops": "keras_scaling.mfu.peak_flops",
    "utilization": "keras_scaling.mfu.utilization",
    "replica_state": "keras_scaling.replica_sync.replica_state",
    "launcher": "keras_scaling.launch.launcher",
}

CASES = [(module, name) for module, names in PATHS_OF_0_1.items() for name in names]


@pytest.mark.parametrize("module_name, name", CASES, ids=[f"{m}.{n}" for m, n in CASES])
def test_a_name_of_0_1_is_the_object_of_its_new_home(module_name, name):
    old = getattr(importlib.import_module(module_name), name)
    home = PATHS_OF_0_1[module_name][name]
    if home == "keras_scaling":  # a submodule name of `keras_scaling.__all__`
        new = importlib.import_module(_MODULE_HOMES.get(name, f"keras_scaling.{name}"))
        if name in _MODULE_HOMES:
            # The 0.1 module re-exports its new home's names, and is a module of its own.
            assert old.__name__ == f"keras_scaling.{name}"
            assert all(getattr(old, each) is getattr(new, each) for each in new.__all__)
            return
    else:
        new = getattr(importlib.import_module(home), name)
    assert old is new


@pytest.mark.parametrize("module_name", sorted(PATHS_OF_0_1))
def test_a_module_of_0_1_still_lists_every_name_it_listed(module_name):
    module = importlib.import_module(module_name)
    assert set(PATHS_OF_0_1[module_name]) <= set(getattr(module, "__all__", ())), module_name


STATEMENTS_OF_0_1 = [
    "import keras_scaling.baseline",
    "from keras_scaling.callbacks.throughput import ThroughputLogger",
    "from keras_scaling.callbacks.replica_sync import ReplicaSyncCheck",
    "from keras_scaling.callbacks.backup_and_restore import BackupAndRestore",
    "from keras_scaling.replica_state import compare_copies",
    "from keras_scaling.flops import training_flops_per_sample",
    "from keras_scaling.peak_flops import PEAK_FLOPS",
    "from keras_scaling.utilization import utilization",
    "from keras_scaling.throughput import ThroughputWindow",
    "from keras_scaling.devices import use_logical_cpus",
    "from keras_scaling.launcher import launch",
]

# Runs each statement with no module of keras_scaling imported: the first in
# a fresh process, each other after every keras_scaling module is forgotten,
# so that none finds the new home of its names imported before it. Prints
# `{statement: None or the traceback}`.
_RUN_EACH_ALONE = """
import json, sys, traceback

errors = {}
for statement in json.loads(sys.argv[1]):
    for name in [name for name in sys.modules if name.split(".")[0] == "keras_scaling"]:
        del sys.modules[name]
    try:
        exec(statement, {})
        errors[statement] = None
    except BaseException:
        errors[statement] = traceback.format_exc()[-2000:]
print(json.dumps(errors))
"""


@pytest.fixture(scope="module")
def errors_of_0_1_statements():
    # Not in this process: here an earlier import of the new home would make
    # a statement pass whatever its old path does.
    result = subprocess.run(
        [sys.executable, "-c", _RUN_EACH_ALONE, json.dumps(STATEMENTS_OF_0_1)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("statement", STATEMENTS_OF_0_1)
def test_a_0_1_import_statement_runs_with_no_module_of_keras_scaling_imported(
    statement, errors_of_0_1_statements
):
    assert errors_of_0_1_statements[statement] is None, errors_of_0_1_statements[statement]


def test_the_launcher_path_of_0_1_loads_no_tensorflow():
    code = "import sys, keras_scaling.launcher; print('tensorflow' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "False"
