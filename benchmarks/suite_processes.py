"""Which processes `make test` starts: how many load TensorFlow, and the CPU time of each kind.

Run: `python benchmarks/suite_processes.py [--most N]`, from the repository
(one whole `make test`, about 8 to 10 minutes on 2 cores).

`benchmarks/suite_cpu.py` charges each test with the CPU time of the
processes it waited for; this one counts the processes themselves. While
`make test` runs it reads `/proc` every quarter of a second: each Python
process below `make`, its own CPU time (not its children's), and whether it
has mapped TensorFlow's library. It prints the processes by kind (the script
or module they run, temporary paths left out), largest CPU time first, and
the totals: the processes that load TensorFlow each pay its start, which on
this machine is 3 to 4.5 s of CPU for `import keras` and TensorFlow alone.
A process is seen only after its first quarter of a second, and its CPU time
as of the last reading, so the figures are a little low.
"""

import argparse
import collections
import os
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERVAL_S = 0.25
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def read_stat(pid):
    """`(parent pid, CPU s of the process itself, start time in ticks)` from `/proc/PID/stat`."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS_PER_S, int(fields[19])


def read_cmdline(pid):
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return [part.decode(errors="replace") for part in cmdline.read().split(b"\0") if part]


def _is_python(command):
    return bool(command) and "python" in os.path.basename(command[0])


def loads_tensorflow(pid):
    with open(f"/proc/{pid}/maps") as maps:
        return "libtensorflow" in maps.read()


class Sampler:
    """Reads every process in `/proc` each `INTERVAL_S` until `stop` is set."""

    def __init__(self):
        self.processes = {}  # (pid, start ticks): {"pid", "parent", "command", "cpu_s", "tensorflow"}
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(INTERVAL_S):
            for name in os.listdir("/proc"):
                if name.isdigit():
                    try:
                        self._read(int(name))
                    except (OSError, ValueError, IndexError):
                        pass  # ended while read

    def _read(self, pid):
        parent, cpu_s, start = read_stat(pid)
        process = self.processes.get((pid, start))
        if process is None:
            process = {"pid": pid, "parent": parent, "command": read_cmdline(pid)}
            process.update(cpu_s=0.0, tensorflow=False)
            self.processes[(pid, start)] = process
        if not _is_python(process["command"]):  # a shell may exec Python in its own process
            process["command"] = read_cmdline(pid)
        process["cpu_s"] = max(process["cpu_s"], cpu_s)
        if not process["tensorflow"] and cpu_s > 1 and _is_python(process["command"]):
            process["tensorflow"] = loads_tensorflow(pid)

    def below(self, root_pid):
        """The Python processes descended from `root_pid`, as far as their parents were seen."""
        children = collections.defaultdict(list)
        for process in self.processes.values():
            children[process["parent"]].append(process)
        found, waiting = [], [root_pid]
        while waiting:
            for child in children.pop(waiting.pop(), []):
                waiting.append(child["pid"])
                if _is_python(child["command"]):
                    found.append(child)
        return found


def kind(command):
    """What a Python command line runs: its script's name, or its module and first argument."""
    words, arguments = [], iter(command[1:])
    for word in arguments:
        if word in ("-X", "-W"):
            next(arguments, None)
        elif word in ("-m", "-c") or not word.startswith("-"):
            words.append(word)
    if words[:1] == ["-c"]:
        return "-c " + " ".join(words[1:2])[:40].replace("\n", " ")
    if words[:1] == ["-m"]:
        return " ".join(os.path.basename(word) for word in words[1:3])
    return os.path.basename(words[0]) if words else ""


def table(processes, most):
    kinds = collections.defaultdict(list)
    for process in processes:
        kinds[(kind(process["command"]), process["tensorflow"])].append(process["cpu_s"])
    ranked = sorted(kinds.items(), key=lambda item: -sum(item[1]))
    lines = [f"{'CPU s':>7} {'procs':>5} {'least s':>7} {'TF':>3}  kind"]
    for (name, tensorflow), cpu in ranked[:most]:
        lines.append(
            f"{sum(cpu):7.1f} {len(cpu):5d} {min(cpu):7.2f} {'yes' if tensorflow else '':>3}  {name}"
        )
    if len(ranked) > most:
        rest = [cpu for _, cpus in ranked[most:] for cpu in cpus]
        lines.append(f"{sum(rest):7.1f} {len(rest):5d} {'':7} {'':3}  the other kinds")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--most", type=int, default=30, help="kinds listed (default 30)")
    args = parser.parse_args(argv)
    if args.most < 1:
        parser.error(f"--most must be at least 1, got {args.most}")
    sampler = Sampler()
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    started = time.monotonic()
    make = subprocess.Popen(["make", "test"], cwd=ROOT)
    status = make.wait()
    wall_s = time.monotonic() - started
    sampler.stop.set()
    thread.join()
    processes = sampler.below(make.pid)
    print()
    print(table(processes, args.most))
    tensorflow = [process for process in processes if process["tensorflow"]]
    own = os.times()
    print(
        f"\nmake test: {wall_s:.0f} s wall ({'passed' if status == 0 else f'exit {status}'}); "
        f"{len(processes)} Python processes, {sum(p['cpu_s'] for p in processes):.0f} s CPU; "
        f"{len(tensorflow)} of them loaded TensorFlow, "
        f"{sum(p['cpu_s'] for p in tensorflow):.0f} s CPU; "
        f"this script's reading took {own.user + own.system:.1f} s CPU"
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
