"""keras_scaling's own processes end without the interpreter's final collection, after every exit handler."""

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import atexit

    from keras_scaling.cli import _worker

    _worker.end_without_final_collection()


    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            print("collected", flush=True)


    Cycle()
    atexit.register(print, "handler ran", flush=True)
    {ending}
    """
)


def _run(ending):
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(ending=ending)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_exit_handlers_run_and_the_last_collection_is_skipped():
    # Without the freeze, the interpreter's last collection finds the cycle.
    assert _run("") == ["handler", "ran"]


def test_a_collection_before_the_end_still_frees_cycles():
    # The cycle is garbage a collection finds: the test above would fail without the freeze.
    assert _run("import gc; gc.collect()") == ["collected", "handler", "ran"]
