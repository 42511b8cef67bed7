"""keras_scaling's own processes end without the interpreter's final collection; every exit handler still runs."""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import atexit

    from keras_scaling.cli import _worker

    if {freeze}:
        _worker.end_without_final_collection()


    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            print("collected", flush=True)


    Cycle()
    atexit.register(print, "handler ran", flush=True)
    """
)


def _output(freeze):
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(freeze=freeze)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_exit_handlers_run_and_the_final_collection_is_skipped():
    # A process left as it is collects the cycle after its exit handlers.
    assert _output(freeze=False) == ["handler", "ran", "collected"]
    assert _output(freeze=True) == ["handler", "ran"]
