"""Start-up shared by keras_scaling's own processes: the command, and the workers of `bench` and `tune`."""

import atexit
import gc
import sys

from keras_scaling.cli._errors import UsageError


def main(parser, run, usage_prefix, argv=None):
    """Parses `argv`, ties the process to its parent and returns `run(args)`'s exit status.

    A `UsageError` becomes status 2 and a last stderr line `usage_prefix + message`.
    """
    args = parser.parse_args(argv)
    _die_with_parent()
    end_without_final_collection()
    try:
        return run(args)
    except UsageError as error:
        print(f"{usage_prefix}{error}", file=sys.stderr, flush=True)
        return 2


def report_failure(log_path, returncode, usage_prefix, failed):
    """Raises `UsageError` when the worker ended on bad input; else prints `failed` and its log's tail."""
    with open(log_path, encoding="utf-8", errors="replace") as log:
        lines = [line.rstrip("\n") for line in log.readlines()[-25:]]
    usage = [line[len(usage_prefix) :] for line in lines if line.startswith(usage_prefix)]
    if returncode == 2 and usage:
        raise UsageError(usage[-1])
    tail = "\n".join(f"  {line}" for line in lines)
    print(f"{failed}. Last lines of {log_path}:\n{tail}", file=sys.stderr)


def end_without_final_collection():
    """Lets a process of keras_scaling's own end without the interpreter's last walk over its objects.

    Every exit handler still runs: the freeze only spares the collection that
    follows them, which walks every object TensorFlow made (about 0.6 s of CPU
    time per process).
    """
    atexit.register(gc.freeze)


def _die_with_parent():
    """Ends this process with SIGTERM when its parent dies (Linux only)."""
    try:
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
