"""`keras-scaling doctor` on a worker whose peers never join: it gives up after its timeout.

Its wall-clock time is the 20 s timeout, waited for with almost no CPU, so
`make test` runs it in a session of its own (`mostly_waits`).
"""

import json

import doctor_commands as commands
import pytest

pytestmark = pytest.mark.mostly_waits


def test_a_worker_whose_peers_never_join_gives_up_after_the_timeout(tmp_path):
    # TF_CONFIG names two workers; the second is never started.
    addresses = [f"127.0.0.1:{commands.free_port()}", f"127.0.0.1:{commands.free_port()}"]
    tf_config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": 0}}
    result = commands.run(
        commands.doctor("--timeout", "20"),
        tmp_path,
        env=commands.clean_env(TF_CONFIG=json.dumps(tf_config)),
    )
    output = result.stdout + result.stderr[-3000:]
    assert result.returncode == 1, output
    assert f"TF_CONFIG is set: 2 worker address(es) ({', '.join(addresses)})" in result.stdout
    assert "joins the other workers" in result.stdout, output
    assert not commands.check_lines(result.stdout), output
    # Where TensorFlow waits holding the interpreter's lock (building the
    # strategy), the message cannot be printed; faulthandler's traceback,
    # 5 s later, says where it waited instead.
    assert (
        "the checks did not finish within 20 s" in result.stdout
        or "Timeout (0:00:25)!" in result.stderr
    ), output
