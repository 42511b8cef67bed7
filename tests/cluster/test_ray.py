"""Ray Train: `examples/ray/train_ray.py` and `keras-scaling doctor` on a local Ray cluster.

One Ray cluster for the module, on this machine only (`ray.init(num_cpus=2)`
with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, set by the example before Ray is
imported, and `_node_ip_address="127.0.0.1"`): every address in the workers'
`TF_CONFIG` is 127.0.0.1, which each test that reads one asserts, and
every socket Ray's own processes listen on is on loopback. Three
`TensorflowTrainer` runs of 2 workers: the example uninterrupted; the example
with worker 1 killed once after step 11 (Ray restarts the workers,
`BackupAndRestore` resumes from its save at step 10); and the doctor plus
training that records the sample ids. Needs the `cluster` extra
(`pip install -e '.[cluster]'`: ray[train]).
"""

import glob
import importlib.util
import json
import os
import re
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "multi_worker"))

pytestmark = pytest.mark.timeout(900)

WORKERS = 2
EPOCHS = 2
SAMPLES = 512  # 8 steps per epoch at 32 per worker
SAVE_EVERY_N_STEPS = 5
FAIL_AT_STEP = 11


def _load_example():
    path = os.path.join(REPO, "examples", "ray", "train_ray.py")
    spec = importlib.util.spec_from_file_location("train_ray", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["train_ray"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def ray_cluster():
    train_ray = _load_example()  # sets RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 before Ray loads
    try:
        import ray
        import ray.cloudpickle
    except ImportError:
        pytest.fail("Ray Train is not installed: pip install -e '.[cluster]'")
    import mw_common
    import ray_loops

    # The train loops go to the workers by value: they are not importable there.
    for module in (train_ray, ray_loops, mw_common):
        ray.cloudpickle.register_pickle_by_value(module)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    ray.init(
        num_cpus=WORKERS,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
    )
    try:
        yield train_ray
    finally:
        ray.shutdown()


def _train(train_ray, storage_dir, *extra):
    args = train_ray.parse_args(
        [
            "--storage-dir",
            str(storage_dir),
            "--workers",
            str(WORKERS),
            "--epochs",
            str(EPOCHS),
            "--samples",
            str(SAMPLES),
            "--save-every-n-steps",
            str(SAVE_EVERY_N_STEPS),
            *extra,
        ]
    )
    train_ray.run(args)
    workers = []
    for index in range(WORKERS):
        with open(os.path.join(storage_dir, "workers", f"worker-{index}.json")) as file:
            workers.append(json.load(file))
    return workers


@pytest.fixture(scope="module")
def uninterrupted(ray_cluster, tmp_path_factory):
    storage_dir = tmp_path_factory.mktemp("ray_uninterrupted")
    return storage_dir, _train(ray_cluster, storage_dir)


@pytest.fixture(scope="module")
def restarted(ray_cluster, tmp_path_factory):
    storage_dir = tmp_path_factory.mktemp("ray_restarted")
    return storage_dir, _train(ray_cluster, storage_dir, "--fail-at-step", str(FAIL_AT_STEP))


def _listening_sockets():
    """{(address in hex, port)} listened on, by socket inode, from /proc/net/tcp and tcp6."""
    found = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as file:
            for line in file.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    address, _, port = fields[1].partition(":")
                    found[fields[9]] = (address, int(port, 16))
    return found


def _ray_processes():
    """{pid: command line} of the processes of the Ray cluster (and this driver)."""
    found = {}
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(path, "rb") as file:
                command = file.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        pid = int(path.split("/")[2])
        if pid == os.getpid() or command.startswith("ray::") or "/site-packages/ray/" in command:
            found[pid] = command
    return found


_LOOPBACK_HEX = {
    "0100007F",  # 127.0.0.1
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
    "00000000000000000000000001000000",  # ::1
}


def test_ray_listens_on_127_0_0_1_only(ray_cluster):
    import ray

    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert [node["NodeManagerAddress"] for node in ray.nodes()] == ["127.0.0.1"]
    sockets = _listening_sockets()
    opened = []
    for pid, command in _ray_processes().items():
        for fd in glob.glob(f"/proc/{pid}/fd/*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else None
            if inode in sockets:
                opened.append((sockets[inode], command[:60]))
    assert opened, "found no listening socket of Ray's processes"
    assert all(address in _LOOPBACK_HEX for (address, _), _ in opened), opened


def _addresses(tf_config):
    return [address for addresses in tf_config["cluster"].values() for address in addresses]


def _assert_loopback_only(tf_config):
    addresses = _addresses(tf_config)
    assert len(addresses) == WORKERS
    assert all(address.startswith("127.0.0.1:") for address in addresses), addresses


def test_ray_gives_every_worker_a_tf_config_on_127_0_0_1_only(uninterrupted):
    _, workers = uninterrupted
    for index, worker in enumerate(workers):
        assert worker["tf_config"]["task"] == {"type": "worker", "index": index}
        _assert_loopback_only(worker["tf_config"])
    assert workers[0]["tf_config"]["cluster"] == workers[1]["tf_config"]["cluster"]


def test_the_example_trains_both_workers_to_identical_weights(uninterrupted):
    _, workers = uninterrupted
    steps = EPOCHS * SAMPLES // (WORKERS * 32)
    assert [worker["iterations"] for worker in workers] == [steps, steps]
    assert workers[0]["weights_sha256"] == workers[1]["weights_sha256"]
    assert [worker["start_step"] for worker in workers] == [0, 0]


def test_only_the_chief_writes_tensorboard_files(uninterrupted):
    storage_dir, workers = uninterrupted
    event_files = glob.glob(
        os.path.join(storage_dir, "logs", "**", "events.out.tfevents.*"), recursive=True
    )
    assert event_files
    # TensorFlow names each event file events.out.tfevents.<time>.<host>.<pid>.<n>[.v2].
    writers = {
        int(re.search(r"\.(\d+)\.\d+(\.v2)?$", os.path.basename(path)).group(1))
        for path in event_files
    }
    assert writers == {workers[0]["pid"]}


def test_a_worker_killed_once_is_restarted_by_ray_and_resumes_from_the_backup(restarted):
    storage_dir, workers = restarted
    with open(os.path.join(storage_dir, "failed-once")) as file:
        assert int(file.read()) == FAIL_AT_STEP
    # New processes, started again by Ray, restored the save of step 10.
    saved_step = FAIL_AT_STEP // SAVE_EVERY_N_STEPS * SAVE_EVERY_N_STEPS
    assert [worker["start_step"] for worker in workers] == [saved_step, saved_step]
    for worker in workers:
        _assert_loopback_only(worker["tf_config"])


def test_the_resumed_run_ends_bitwise_equal_to_the_uninterrupted_one(uninterrupted, restarted):
    _, reference = uninterrupted
    _, resumed = restarted
    assert [worker["iterations"] for worker in resumed] == [
        worker["iterations"] for worker in reference
    ]
    assert resumed[0]["weights_sha256"] == resumed[1]["weights_sha256"]
    assert resumed[0]["weights_sha256"] == reference[0]["weights_sha256"]


@pytest.fixture(scope="module")
def doctor_and_ids(ray_cluster, tmp_path_factory):
    import ray_loops
    from ray.train import RunConfig, ScalingConfig
    from ray.train.tensorflow import TensorflowTrainer

    out_dir = tmp_path_factory.mktemp("ray_doctor")
    TensorflowTrainer(
        ray_loops.doctor_then_record_ids,
        train_loop_config={"out_dir": str(out_dir), "samples": 96, "epochs": 2},
        scaling_config=ScalingConfig(num_workers=WORKERS, use_gpu=False),
        run_config=RunConfig(name="doctor", storage_path=str(out_dir / "ray")),
    ).fit()
    workers = []
    for index in range(WORKERS):
        with open(out_dir / f"worker-{index}.json") as file:
            workers.append(json.load(file))
    return workers


def test_doctor_in_a_ray_train_loop_passes_on_every_worker(doctor_and_ids):
    for worker in doctor_and_ids:
        assert worker["doctor_ok"], worker["checks"]
        assert set(worker["checks"]) == {
            "versions",
            "devices",
            "all-reduce",
            "first collective",
            "bandwidth",
            "server",
        }
        assert worker["num_replicas"] == WORKERS
        _assert_loopback_only(worker["tf_config"])


def test_under_ray_every_sample_is_trained_once_per_epoch_by_one_worker(doctor_and_ids):
    for epoch in ("0", "1"):
        ids_0 = doctor_and_ids[0]["ids_by_epoch"][epoch]
        ids_1 = doctor_and_ids[1]["ids_by_epoch"][epoch]
        assert len(ids_0) == len(set(ids_0)) == 48
        assert len(ids_1) == len(set(ids_1)) == 48
        assert not set(ids_0) & set(ids_1)
        assert set(ids_0) | set(ids_1) == set(range(96))
