"""README.md's quick start runs as written, on this Keras and TensorFlow."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TIMEOUT_S = 300
QUICK_START_HEADING = "## Quick start"


def python_block_after(heading):
    """The first ```python block after the Markdown heading `heading`."""
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as file:
        text = file.read()
    start = text.index(f"\n{heading}\n")
    block_start = text.index("```python\n", start) + len("```python\n")
    return text[block_start : text.index("```", block_start)]


def quick_start():
    """The README's quick start, as a user copies it."""
    return python_block_after(QUICK_START_HEADING)


def test_the_quick_start_trains_and_logs_on_two_replicas(tmp_path):
    code = quick_start()
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=_TIMEOUT_S,
    )

    assert result.returncode == 0, result.stderr[-4000:]
    with open(tmp_path / "logs" / "run" / "throughput.json") as file:
        record = json.load(file)
    assert record["num_replicas"] == 2 and record["global_batch_size"] == 128
    assert record["samples_per_sec"] > 0
    assert "diverged" not in result.stderr
    events = [
        name
        for _, _, names in os.walk(tmp_path / "logs")
        for name in names
        if name.startswith("events.out.tfevents")
    ]
    assert events


if __name__ == "__main__":
    # `make dist-check` runs the quick start against the installed wheel.
    print(quick_start())
