"""A throw-away single-node Slurm cluster on 127.0.0.1, for tests.

Its own MUNGE key, `slurm.conf` and state under one temporary directory;
`munged`, `slurmctld -D` and `slurmd -D` started as child processes and
stopped by PID whatever happens. The node is this host's short name mapped
to 127.0.0.1 (`NodeAddr`), the controller listens on 127.0.0.1, so nothing
but loopback is used. Clients find the cluster through `SLURM_CONF`, which
`env()` sets: without it `srun` would look for a controller in DNS.

Needs Debian's `slurmctld slurmd slurm-client munge` (`.ci/install-slurm`)
and root (the daemons run as root, and so do the jobs).

Usage:

    with SlurmCluster(tmp_dir) as cluster:
        cluster.run(["srun", "-n", "2", "hostname"])
        job_id = cluster.sbatch(["job.sbatch"])
        cluster.wait_for_job(job_id, timeout_s=120)
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
# CPUs the node declares, whatever the machine has (SlurmdParameters=
# config_overrides): jobs of several tasks run on a 2-core machine.
NODE_CPUS = 8
_END_STATES = {
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "TIMEOUT",
}


def missing_commands():
    """The Slurm and MUNGE commands this helper needs that are not installed."""
    needed = ("munged", "slurmctld", "slurmd", "srun", "sbatch", "scontrol", "scancel")
    return [name for name in needed if _which(name) is None]


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _free_ports(count):
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class SlurmError(RuntimeError):
    """A Slurm command or daemon failed; the message holds its output and the daemons' logs."""


class SlurmCluster:
    """One node, one partition, daemons of its own; a context manager.

    Args:
        root: str, an empty directory for the key, configuration, state and logs.
        start_timeout_s: float, how long to wait for the node to become idle.
    """

    def __init__(self, root, start_timeout_s=60.0):
        self.root = os.path.abspath(root)
        self.start_timeout_s = start_timeout_s
        self.node_name = socket.gethostname().split(".")[0]
        self.conf_path = os.path.join(self.root, "slurm.conf")
        self.munge_socket = os.path.join(self.root, "munge", "munge.socket")
        self._processes = {}
        self.startup_s = None

    # -- lifetime ---------------------------------------------------------

    def __enter__(self):
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def start(self):
        start_s = time.monotonic()
        self._write_files()
        munge_dir = os.path.dirname(self.munge_socket)
        self._spawn(
            "munged",
            [
                _which("munged"),
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={os.path.join(munge_dir, 'munge.key')}",
                f"--log-file={os.path.join(self.root, 'munged.log')}",
                f"--pid-file={os.path.join(munge_dir, 'munged.pid')}",
                f"--seed-file={os.path.join(munge_dir, 'munged.seed')}",
            ],
        )
        self._wait_for(lambda: os.path.exists(self.munge_socket), "munged's socket")
        self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", self.conf_path])
        self._wait_for(self._controller_answers, "slurmctld to answer")
        self._spawn("slurmd", [_which("slurmd"), "-D", "-f", self.conf_path, "-N", self.node_name])
        self._wait_for(self._node_idle, f"node {self.node_name} to become idle")
        self.startup_s = time.monotonic() - start_s

    def stop(self):
        """Ends the jobs, then stops every daemon this cluster started, by PID.

        Jobs are cancelled first; whatever of them is left (a job's
        `slurmstepd` outlives `slurmd`) is killed by PID, found by the
        `SLURM_CONF` of this cluster in its environment. Daemons get SIGTERM,
        then SIGKILL after 10 s.
        """
        if self._processes.get("slurmctld") and self._processes["slurmctld"].poll() is None:
            try:
                self.run(["scancel", "--full", "--user", "root"], check=False, timeout_s=30)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    queue = self.run(["squeue", "--noheader"], check=False, timeout_s=30)
                    if queue.returncode != 0 or not queue.stdout.strip():
                        break
                    time.sleep(0.2)
            except SlurmError:
                pass
        for name in reversed(DAEMONS):
            process = self._processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

        self._kill_leftovers()

    def _kill_leftovers(self):
        """SIGKILLs every process whose environment names this cluster's slurm.conf."""
        marker = f"SLURM_CONF={self.conf_path}".encode()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as file:
                    if marker not in file.read().split(b"\0"):
                        continue
                os.kill(int(entry), signal.SIGKILL)
            except (OSError, ProcessLookupError):
                continue

    def pids(self):
        """`{daemon name: pid}` of the daemons started and still known."""
        return {name: process.pid for name, process in self._processes.items()}

    # -- clients ----------------------------------------------------------

    def env(self, extra=None):
        """This process's environment with `SLURM_CONF` pointing at this cluster."""
        env = {
            key: value
            for key, value in os.environ.items()
            # A test run inside a Slurm job must not hand its own job's
            # variables to the jobs it submits here.
            if not key.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))
        }
        env["SLURM_CONF"] = self.conf_path
        env.update(extra or {})
        return env

    def run(self, args, timeout_s=120, check=True, env=None, cwd=None):
        """Runs a client command (`srun`, `sbatch`, `scontrol` ...) against this cluster.

        Returns:
            The `subprocess.CompletedProcess`, output as text.

        Raises:
            SlurmError: the command failed (with `check`) or timed out; the
                message holds its output and the daemons' log tails.
        """
        try:
            result = subprocess.run(
                args,
                env=self.env(env),
                cwd=cwd,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as error:
            raise SlurmError(
                f"{' '.join(map(str, args))} did not finish in {timeout_s} s\n"
                f"stdout: {error.stdout}\nstderr: {error.stderr}\n{self.logs()}"
            ) from None
        if check and result.returncode != 0:
            raise SlurmError(
                f"{' '.join(map(str, args))} exited with {result.returncode}\n"
                f"stdout: {result.stdout}\nstderr: {result.stderr}\n{self.logs()}"
            )
        return result

    def sbatch(self, args, env=None, cwd=None):
        """Submits a batch job; returns its job id."""
        result = self.run(["sbatch", "--parsable", *args], env=env, cwd=cwd)
        return int(result.stdout.strip().split(";")[0])

    def job_state(self, job_id):
        """`{field: value}` of `scontrol show job` for the job (JobState, Restarts, ExitCode ...)."""
        result = self.run(["scontrol", "show", "job", "--oneliner", str(job_id)], check=False)
        if result.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", result.stdout))

    def wait_for_job(self, job_id, timeout_s, states=_END_STATES):
        """Waits until the job's state is one of `states`; returns its `job_state`.

        Raises:
            SlurmError: not there within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            fields = self.job_state(job_id)
            if fields.get("JobState") in states:
                return fields
            if time.monotonic() > deadline:
                self.run(["scancel", str(job_id)], check=False)
                raise SlurmError(
                    f"job {job_id} not in {sorted(states)} after {timeout_s} s: {fields}\n"
                    f"{self.logs()}"
                )
            time.sleep(0.2)

    def logs(self, lines=30):
        """The last `lines` lines of each daemon's log, for failure messages."""
        parts = []
        for name in DAEMONS:
            path = os.path.join(self.root, f"{name}.log")
            try:
                with open(path, errors="replace") as file:
                    tail = file.readlines()[-lines:]
            except OSError:
                continue
            parts.append(f"--- {name}.log ---\n{''.join(tail)}")
        return "\n".join(parts)

    # -- internals --------------------------------------------------------

    def _write_files(self):
        munge_dir = os.path.dirname(self.munge_socket)
        for directory in (self.root, munge_dir, *self._state_dirs()):
            os.makedirs(directory, mode=0o700, exist_ok=True)
        key_path = os.path.join(munge_dir, "munge.key")
        with open(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400), "wb") as file:
            file.write(os.urandom(1024))
        controller_port, node_port = _free_ports(2)
        state, spool = self._state_dirs()
        with open(self.conf_path, "w") as file:
            file.write(
                f"""\
ClusterName=keras-scaling-test
SlurmctldHost={self.node_name}(127.0.0.1)
SlurmctldPort={controller_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job starts again this long after it ended
# (default 120 s): its old credentials are revoked until then.
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={state}
SlurmdSpoolDir={spool}
SlurmctldPidFile={os.path.join(self.root, "slurmctld.pid")}
SlurmdPidFile={os.path.join(self.root, "slurmd.pid")}
SlurmctldLogFile={os.path.join(self.root, "slurmctld.log")}
SlurmdLogFile={os.path.join(self.root, "slurmd.log")}
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
# Look at pending jobs every second, not every minute: tests wait on them.
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MinJobAge=600
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
Waittime=0
NodeName={self.node_name} NodeAddr=127.0.0.1 NodeHostname={self.node_name} CPUs={NODE_CPUS} State=UNKNOWN
PartitionName=test Nodes={self.node_name} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
            )

    def _state_dirs(self):
        return os.path.join(self.root, "state"), os.path.join(self.root, "spool")

    def _spawn(self, name, args):
        log = open(os.path.join(self.root, f"{name}.stdout"), "w")
        with log:
            self._processes[name] = subprocess.Popen(
                args,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_for(self, ready, what):
        deadline = time.monotonic() + self.start_timeout_s
        while not ready():
            for name, process in self._processes.items():
                if process.poll() is not None:
                    raise SlurmError(
                        f"{name} exited with {process.returncode} while waiting for {what}\n"
                        f"{self._stdout(name)}\n{self.logs()}"
                    )
            if time.monotonic() > deadline:
                raise SlurmError(
                    f"timed out after {self.start_timeout_s} s waiting for {what}\n{self.logs()}"
                )
            time.sleep(0.05)

    def _stdout(self, name):
        try:
            with open(os.path.join(self.root, f"{name}.stdout"), errors="replace") as file:
                return file.read()[-4000:]
        except OSError:
            return ""

    def _controller_answers(self):
        result = self.run(["scontrol", "ping"], check=False, timeout_s=30)
        return "UP" in result.stdout

    def _node_idle(self):
        result = self.run(
            ["sinfo", "--noheader", "--nodes", self.node_name, "--format", "%T"],
            check=False,
            timeout_s=30,
        )
        return result.stdout.strip().rstrip("*") == "idle"
