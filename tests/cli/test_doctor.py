"""`keras-scaling doctor`: its verdicts, alone and on every worker of a launched job.

The verdicts are plain functions, tested with made-up reports and sums; the
command runs in real processes over real strategies, alone, under
`keras-scaling launch`, and with one worker importing another keras_scaling.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

import doctor_commands as commands
import pytest

from keras_scaling.doctor._checks import (
    all_reduce_bandwidth_mb_per_s,
    bandwidth_check,
    check_all_reduce,
    compare_devices,
    compare_versions,
    expected_all_reduce_sum,
    listening_addresses,
    server_exposure_check,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECK_NAMES = ("versions", "devices", "all-reduce", "first collective", "bandwidth", "server")

SAME = {"python": "3.11.7", "tensorflow": "2.21.0", "keras": "3.15.1", "keras_scaling": "0.1.0"}


def _report(worker, host, **versions):
    return {"worker": worker, "host": host, "versions": dict(SAME, **versions)}


# ---- the verdicts, from made-up inputs ----


def test_same_versions_on_every_worker_pass_and_are_listed():
    check = compare_versions([_report(0, "a"), _report(1, "b"), _report(2, "c")], 3)
    assert check.ok
    assert "3 workers run Python 3.11.7, TensorFlow 2.21.0, Keras 3.15.1" in check.message


def test_a_worker_with_another_tensorflow_is_named_with_its_version():
    reports = [_report(0, "a"), _report(1, "b", tensorflow="2.20.0"), _report(2, "c")]
    check = compare_versions(reports, 3)
    assert not check.ok
    assert "TensorFlow differs: worker 1 (b) runs 2.20.0" in check.message
    assert "2 workers (0, 2) run 2.21.0" in check.message
    assert "keras_scaling differs" not in check.message


def test_each_differing_package_is_named():
    reports = [_report(0, "a"), _report(1, "b", keras="3.8.0", python="3.10.12")]
    check = compare_versions(reports, 2)
    assert not check.ok
    assert "Python differs" in check.message
    assert "Keras differs" in check.message
    assert "TensorFlow differs" not in check.message


def test_on_an_even_split_worker_0_holds_the_reference_version():
    check = compare_versions([_report(0, "a"), _report(1, "b", keras_scaling="0.2.0")], 2)
    assert "worker 1 (b) runs 0.2.0" in check.message
    assert "1 worker (0) runs 0.1.0" in check.message


def test_a_worker_missing_from_the_gather_fails_the_version_check():
    check = compare_versions([_report(0, "a"), _report(2, "c")], 3)
    assert not check.ok
    assert "no report from worker(s) 1 of 3" in check.message


def _devices(worker, count, kind="CPU", address=None):
    names = [f"/job:worker/replica:0/task:{worker}/device:{kind}:{i}" for i in range(count)]
    report = {"worker": worker, "host": "vm", "devices": names, "device_kind": kind}
    return dict(report, address=address) if address else report


def test_workers_with_the_same_replicas_pass_the_device_check():
    check = compare_devices([_devices(0, 2), _devices(1, 2)], 2)
    assert check.ok, check.message
    assert check.message == "2 workers, 2 CPU replicas each: 4 replicas in all"


def test_workers_with_different_replica_counts_fail_and_each_is_named():
    reports = [_devices(0, 2, address="127.0.0.1:2222"), _devices(1, 1, address="127.0.0.1:2223")]
    check = compare_devices(reports, 2)
    assert not check.ok
    assert (
        "worker 0 (vm, 127.0.0.1:2222) has 2 CPU replicas (CPU:0, CPU:1), "
        "worker 1 (vm, 127.0.0.1:2223) has 1 CPU replica (CPU:0)"
    ) in check.message
    assert "--cpu-devices" in check.message


def test_workers_with_different_device_kinds_fail():
    check = compare_devices([_devices(0, 1, "GPU"), _devices(1, 1, "CPU")], 2)
    assert not check.ok
    assert "has 1 GPU replica (GPU:0)" in check.message
    assert "has 1 CPU replica (CPU:0)" in check.message


def test_a_worker_missing_from_the_exchange_fails_the_device_check():
    check = compare_devices([_devices(0, 2)], 2)
    assert not check.ok
    assert "unknown for worker(s) 1 of 2" in check.message


def test_the_known_sum_over_n_replicas_passes():
    assert expected_all_reduce_sum(4) == 10
    check = check_all_reduce([10.0] * 8, num_replicas=4)
    assert check.ok, check.message


def test_a_wrong_element_of_the_sum_fails_and_is_located():
    check = check_all_reduce([10.0, 10.0, 9.0, 10.0], num_replicas=4)
    assert not check.ok
    assert "gave 9 at element 2 (1 of 4 elements wrong), expected 10" in check.message


def test_a_sum_missing_a_worker_fails():
    # 4 replicas expected (1 + 2 + 3 + 4); only the first worker's 2 replicas summed.
    check = check_all_reduce([3.0] * 4, num_replicas=4)
    assert not check.ok


def test_bandwidth_is_bytes_over_seconds_in_megabytes():
    assert all_reduce_bandwidth_mb_per_s(102_000_000, 2.0) == pytest.approx(51.0)
    with pytest.raises(ValueError, match="seconds must be positive"):
        all_reduce_bandwidth_mb_per_s(1, 0.0)


def test_bandwidth_check_reports_the_median_round():
    check = bandwidth_check(10_000_000, [0.5, 0.1, 0.2])
    assert check.ok
    assert "median 0.200 s over 3 rounds (0.100 to 0.500 s), 50 MB/s" in check.message


def test_one_replica_has_no_bandwidth_and_says_there_is_nothing_to_combine():
    check = bandwidth_check(102_228_128, [], num_replicas=1)
    assert check.ok
    assert "nothing to combine" in check.message
    assert "MB/s" not in check.message


def test_a_tensor_under_one_mb_is_too_small_to_time():
    check = bandwidth_check(4, [0.002, 0.003, 0.004])
    assert "all-reduce of 4 bytes of float32" in check.message
    assert "median 3.000 ms over 3 rounds (2.000 to 4.000 ms)" in check.message
    assert "too small to time" in check.message
    assert "MB/s" not in check.message
    assert "pass a larger size (--size-mb)" in check.message


def test_a_round_under_one_millisecond_is_too_small_to_time():
    check = bandwidth_check(10_000_000, [0.0005, 0.0004, 0.0006])
    assert "too small to time" in check.message
    assert "MB/s" not in check.message


def test_a_slow_bandwidth_keeps_its_significant_digits():
    # 1 MB in 20 s: 0.05 MB/s, which a whole number of MB/s would print as 0.
    check = bandwidth_check(1_000_000, [20.0])
    assert check.message.endswith(", 0.05 MB/s")


_PROC_NET_TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0
"""
_PROC_NET_TCP6 = """\
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A
   1: 0000000000000000FFFF00000100007F:1F92 00000000000000000000000000000000:0000 0A
"""


def test_listening_addresses_read_proc_net_tcp():
    assert listening_addresses(_PROC_NET_TCP, 8080) == ["0.0.0.0"]  # established line skipped
    assert listening_addresses(_PROC_NET_TCP, 8081) == ["127.0.0.1"]
    assert listening_addresses(_PROC_NET_TCP6, 8080) == ["::"]
    assert listening_addresses(_PROC_NET_TCP6, 8082) == ["127.0.0.1"]
    assert listening_addresses(_PROC_NET_TCP, 9999) == []


def test_server_note_says_every_interface_and_points_to_the_security_section():
    check = server_exposure_check(8080, ["::"], ["lo", "eth0"])
    assert check.ok
    assert "listens on port 8080 on every network interface" in check.message
    assert "authenticates nobody" in check.message
    assert "eth0" in check.message
    assert "Security section" in check.message


def test_server_note_with_only_loopback_says_nothing_outside_reaches_it():
    check = server_exposure_check(8080, ["0.0.0.0"], ["lo"])
    assert "only loopback" in check.message


def test_server_note_without_a_server():
    assert "no TensorFlow server" in server_exposure_check(None, [], ["lo"]).message


# ---- the command, in real processes ----


def test_doctor_alone_passes_every_check_on_one_worker(tmp_path):
    result = commands.run(commands.doctor(), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert commands.check_lines(result.stdout) == {name: "ok" for name in CHECK_NAMES}
    assert "this is worker 0 of 1" in result.stdout
    assert "TF_CONFIG is not set" in result.stdout
    assert "all 6 checks passed" in result.stdout
    assert "bandwidth: one replica in all: an all-reduce has nothing to combine" in result.stdout
    assert "MB/s" not in result.stdout


def test_doctor_with_cpu_devices_sums_over_every_logical_cpu(tmp_path):
    result = commands.run(commands.doctor("--cpu-devices", "3"), tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "MirroredStrategy: 1 worker, 3 replicas on CPU" in result.stdout
    assert "summing r + 1 over 3 replicas gave 6" in result.stdout


@pytest.mark.parametrize(
    "option, value",
    [
        ("--size-mb", "inf"),
        ("--size-mb", "0"),
        ("--size-mb", "-1"),
        ("--size-mb", "nan"),
        ("--size-mb", "1e15"),
        ("--timeout", "inf"),
        ("--timeout", "0"),
        ("--timeout", "-5"),
        ("--timeout", "nan"),
        ("--timeout", "1e10"),
    ],
)
def test_a_size_or_timeout_that_cannot_work_is_a_usage_error(capsys, option, value):
    # In this process: the arguments are checked before any check runs.
    from keras_scaling.cli import main

    status = main(["doctor", option, value])
    stderr = capsys.readouterr().err
    assert status == 2, stderr[-3000:]
    unit = "MB" if option == "--size-mb" else "seconds"
    assert f"argument {option}: must be a number of {unit} above 0 and at most " in stderr
    assert f"got '{value}'" in stderr


def test_a_usage_error_of_the_command_exits_2_without_a_traceback(tmp_path):
    result = commands.run(
        [sys.executable, "-m", "keras_scaling", "doctor", "--size-mb", "0"], tmp_path
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "argument --size-mb: must be a number of MB above 0 and at most " in result.stderr
    assert "got '0'" in result.stderr
    assert "Traceback" not in result.stderr


class _TimedProcess:
    """A process whose output lines are read as they come, each with the time it came."""

    def __init__(self, args, env, cwd):
        self.process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[tuple[float, str]] = []
        self.ended_at = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout_s):
        try:
            returncode = self.process.wait(timeout=timeout_s)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        self.ended_at = time.monotonic()
        self._reader.join(timeout=10)
        return returncode

    @property
    def output(self):
        return "\n".join(line for _, line in self.lines)

    def seconds_after(self, text):
        """Seconds from the first line holding `text` to the process's end."""
        at = next(when for when, line in self.lines if text in line)
        return self.ended_at - at


# Workers whose devices differ get the verdict from the first exchange, not
# after the whole --timeout: they say it within this many seconds of joining.
MISMATCH_VERDICT_S = 30


def test_workers_that_disagree_on_devices_all_fail_fast_naming_each_workers_devices(tmp_path):
    addresses = [f"127.0.0.1:{commands.free_port()}", f"127.0.0.1:{commands.free_port()}"]
    workers = []
    for index, cpu_devices in enumerate((2, 1)):
        tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
        workers.append(
            _TimedProcess(
                commands.doctor("--cpu-devices", str(cpu_devices), "--timeout", "240"),
                env=commands.clean_env(TF_CONFIG=json.dumps(tf_config)),
                cwd=tmp_path,
            )
        )
    returncodes = [worker.wait(commands.TIMEOUT_S) for worker in workers]
    host = socket.gethostname()
    expected = (
        f"FAIL  devices: the workers' devices differ: worker 0 ({host}, {addresses[0]}) has 2 "
        f"CPU replicas (CPU:0, CPU:1), worker 1 ({host}, {addresses[1]}) has 1 CPU replica "
        "(CPU:0)."
    )
    for index, worker in enumerate(workers):
        output = worker.output
        assert returncodes[index] == 1, output[-6000:]
        assert expected in output, output[-6000:]
        assert "the checks did not finish" not in output, output[-6000:]
        assert "all-reduce:" not in output, output[-6000:]
        assert "keras-scaling doctor: FAILED: devices" in output
        # From the strategy built (every worker joined) to the exit.
        assert worker.seconds_after("this is worker") < MISMATCH_VERDICT_S, output[-6000:]


def _worker_output(output, index):
    prefix = f"[worker {index}] "
    return "\n".join(line[len(prefix) :] for line in output.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def launch_without_the_key_value_store(tmp_path_factory):
    """A launched doctor on 2 workers of 2 logical CPUs each, its reports sent by an all-gather.

    Shared by the 2-device case of the launch test and the all-gather test:
    how the reports travel does not depend on the replica count, and one
    launch starts 2 TensorFlow processes fewer.
    """
    env = commands.clean_env(KERAS_SCALING_FAIL_PROBES="tf.coordination_key_value_store")
    cwd = tmp_path_factory.mktemp("without_the_key_value_store")
    return commands.run(commands.launch(*commands.doctor("--cpu-devices", "2")), cwd, env=env)


@pytest.mark.parametrize("cpu_devices", [1, 2])
def test_doctor_under_launch_passes_on_both_workers_with_the_same_checks(
    tmp_path, cpu_devices, request
):
    if cpu_devices == 1:
        result = commands.run(
            commands.launch(*commands.doctor("--cpu-devices", str(cpu_devices))), tmp_path
        )
    else:
        result = request.getfixturevalue("launch_without_the_key_value_store")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for index in (0, 1):
        output = _worker_output(result.stdout, index)
        assert commands.check_lines(output) == {name: "ok" for name in CHECK_NAMES}, output
        assert f"this is worker {index} of 2" in output
        assert "TF_CONFIG is set: 2 worker address(es) (127.0.0.1:" in output
        replicas = 2 * cpu_devices
        assert f"MultiWorkerMirroredStrategy: 2 workers, {replicas} replicas on CPU" in output
        assert "2 workers run Python" in output
        total = replicas * (replicas + 1) // 2
        assert f"summing r + 1 over {replicas} replicas gave {total} " in output
        assert "TensorFlow gRPC server listens on port" in output


def test_without_the_key_value_store_the_reports_go_through_an_all_gather(
    launch_without_the_key_value_store,
):
    result = launch_without_the_key_value_store
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    for index in (0, 1):
        output = _worker_output(result.stdout, index)
        assert commands.check_lines(output) == {name: "ok" for name in CHECK_NAMES}, output
        assert "2 workers, 2 CPU replicas each: 4 replicas in all" in output
    assert "keras-scaling doctor sends the workers' reports through an all-gather" in (
        result.stdout + result.stderr
    )


# Worker 1 runs the command with PYTHONPATH on a copy of keras_scaling whose
# __version__ differs: a genuinely different keras_scaling imported by one worker.
_SPLIT_VERSIONS = """\
import json, os, sys
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
env = dict(os.environ)
if index == 1:
    env["PYTHONPATH"] = sys.argv[1]
os.execve(sys.executable, [sys.executable, "-m", "keras_scaling", *sys.argv[2:]], env)
"""


def test_a_worker_importing_another_keras_scaling_version_fails_and_is_named(tmp_path):
    other = tmp_path / "other"
    shutil.copytree(
        os.path.join(REPO, "keras_scaling"),
        other / "keras_scaling",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    init = other / "keras_scaling" / "__init__.py"
    text = init.read_text()
    assert '__version__ = "0.1.0"' in text
    init.write_text(text.replace('__version__ = "0.1.0"', '__version__ = "0.1.0+other"'))
    command = [sys.executable, "-c", _SPLIT_VERSIONS, str(other)]
    command += ["doctor", "--size-mb", "1", "--rounds", "1"]
    result = commands.run(commands.launch(*command), tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr[-3000:]
    for index in (0, 1):
        output = _worker_output(result.stdout, index)
        assert re.search(r"^FAIL +versions: keras_scaling differs: worker 1 \(", output, re.M), (
            output
        )
        assert "runs 0.1.0+other; 1 worker (0) runs 0.1.0" in output
