"""Two real workers read each of `fit`'s epochs exactly once between them, whatever one read before.

The chief looks at a batch of its dataset before training (as people do to
check shapes); the other worker does not. Before Keras' epochs numbered the
passes, the look shifted the chief's shuffle orders against the other
worker's, and 115 of 400 samples were trained on by both workers and 115 by
none, silently.
"""

import io
import json
import os
import subprocess
import sys
import textwrap

import pytest

from keras_scaling import data
from keras_scaling.internals import _probes, _versions
from keras_scaling.launch import launcher

NUM_SAMPLES = 400
EPOCHS = 2
HERE = os.path.dirname(os.path.abspath(__file__))

_WORKER_SCRIPT = textwrap.dedent(
    f"""
    import json, os, sys
    sys.path.insert(0, {os.path.join(HERE, "multi_worker")!r})
    import keras, numpy as np
    import keras_scaling
    from keras_scaling import data
    import mw_common

    strategy = keras_scaling.auto_strategy()
    x, y = mw_common.make_data({NUM_SAMPLES})
    train = data.distribute((x, y), strategy=strategy, per_replica_batch_size=8)
    plan = data.plan_of(train)
    peeked = None
    if plan.worker_index == 0:
        peeked = next(iter(train))[0][:, 0].numpy().astype(int).tolist()
    recorder = mw_common.IdRecorder()

    class Epochs(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            recorder.epoch = epoch

    with strategy.scope():
        model = mw_common.build_model(recorder)
    model.fit(train, epochs={EPOCHS}, verbose=0, callbacks=[Epochs()])
    print("RESULT " + json.dumps({{
        "worker": plan.worker_index, "peeked": peeked,
        "dropped": plan.samples_dropped_per_epoch,
        "ids": {{str(epoch): ids for epoch, ids in recorder.ids_by_epoch.items()}},
    }}), flush=True)
    # Skips TensorFlow's shutdown barrier, which waits ~20 s for the cluster.
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    script = tmp_path_factory.mktemp("pass_order") / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    output = io.StringIO()
    outcome = launcher.launch(
        [sys.executable, str(script)],
        num_workers=2,
        cpu_devices=1,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=output,
        stderr=output,
    )
    assert outcome.exit_code == 0, f"{outcome.message}\n{output.getvalue()[-3000:]}"
    found = []
    for line in output.getvalue().splitlines():
        _, _, payload = line.partition("] ")
        if payload.startswith("RESULT "):
            found.append(json.loads(payload[len("RESULT ") :]))
    assert sorted(result["worker"] for result in found) == [0, 1], output.getvalue()[-3000:]
    return sorted(found, key=lambda result: result["worker"])


@pytest.mark.timeout(300)
def test_only_the_chief_peeks(results):
    assert results[0]["peeked"] and results[1]["peeked"] is None


@pytest.mark.timeout(300)
@pytest.mark.parametrize("epoch", range(EPOCHS))
def test_every_sample_is_trained_once_per_epoch_across_workers_after_a_peek(results, epoch):
    shares = [result["ids"][str(epoch)] for result in results]
    assert all(shares)
    both = set(shares[0]) & set(shares[1])
    assert not both, f"epoch {epoch}: {len(both)} samples trained by both workers"
    trained = shares[0] + shares[1]
    assert len(trained) == len(set(trained)) == NUM_SAMPLES - results[0]["dropped"]


@pytest.mark.timeout(300)
def test_the_epochs_of_fit_read_new_orders(results):
    chief = results[0]["ids"]
    assert set(chief["0"]) != set(chief["1"])


_UNNUMBERED_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    from keras_scaling import data
    from keras_scaling.devices import StrategyInfo

    worker = StrategyInfo(
        kind="MultiWorkerMirroredStrategy", num_workers=2, worker_index=0,
        is_chief=True, num_replicas=2, local_devices=("/cpu:0",), device_kind="CPU",
    )
    ids = np.arange(100)
    data._distribute_for((ids, ids), worker, per_replica_batch_size=4, shuffle={shuffle})
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [True, False])
def test_passes_numbered_by_reads_are_announced_with_several_workers(shuffle):
    """Without Keras' adapter the order follows each process's reads: say so, when it matters."""
    env = dict(os.environ, KERAS_SCALING_FAIL_PROBES="keras.epoch_iterator_passes")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    process = subprocess.run(
        [sys.executable, "-c", _UNNUMBERED_SCRIPT.format(shuffle=shuffle)],
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert process.returncode == 0, process.stderr[-3000:]
    probe = _probes._registry["keras.epoch_iterator_passes"]
    (probe_warning,) = [line for line in process.stderr.splitlines() if probe.reaches in line]
    assert f"Keras {_versions.keras_version()}" in probe_warning
    assert probe.lost in probe_warning and probe.workaround in probe_warning
    assert (data.UNNUMBERED_PASSES_WARNING in process.stderr) == shuffle
