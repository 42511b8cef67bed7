"""Two real workers read each of `fit`'s epochs exactly once between them, whatever one read before.

The chief looks at a batch of its dataset before training (as people do to
check shapes); the other worker does not. Before Keras' epochs numbered the
passes, the look shifted the chief's shuffle orders against the other
worker's, and 115 of 400 samples were trained on by both workers and 115 by
none, silently.

The same 2 workers (one `launch`: starting TensorFlow costs seconds of CPU
time) first read a `distribute` dataset padded and one dropping the last
batch through `experimental_distribute_dataset`, and fit on a third: each
reads only its own share, in as many steps as the other.
"""

import io
import json
import logging
import os
import sys
import textwrap

import numpy as np
import pytest

from keras_scaling import data
from keras_scaling.data import _passes
from keras_scaling.devices import StrategyInfo
from keras_scaling.internals import _probes, _versions
from keras_scaling.launch import launcher

NUM_SAMPLES = 400
EPOCHS = 2
HERE = os.path.dirname(os.path.abspath(__file__))
# The samples the workers read padded and dropping the last batch.
NUM_SHARED_SAMPLES = 1001

_WORKER_SCRIPT = textwrap.dedent(
    f"""
    import json, os, sys
    sys.path.insert(0, {os.path.join(HERE, "multi_worker")!r})
    import keras, numpy as np
    import tensorflow as tf
    from keras_scaling import data
    import mw_common

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ids = np.arange({NUM_SHARED_SAMPLES})
    for last_batch in ("pad", "drop"):
        dataset = data.distribute((ids, ids), strategy=strategy, per_replica_batch_size=32,
                                  last_batch=last_batch)
        plan = data.plan_of(dataset)
        steps, seen = 0, []
        for batch in strategy.experimental_distribute_dataset(dataset):
            steps += 1
            parts = [strategy.experimental_local_results(part) for part in batch]
            for replica in range(len(parts[0])):
                x = parts[0][replica].numpy()
                if len(parts) == 3:
                    x = x[parts[2][replica].numpy() > 0]
                seen.extend(x.tolist())
        print("RESULT " + json.dumps({{
            "scenario": last_batch, "worker": plan.worker_index,
            "num_workers": plan.num_workers, "steps": steps,
            "planned_steps": plan.steps_per_epoch,
            "dropped": plan.samples_dropped_per_epoch, "seen": seen}}), flush=True)

    class CountSteps(keras.callbacks.Callback):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            CountSteps.steps += 1

    x = np.random.default_rng(0).normal(size=({NUM_SHARED_SAMPLES}, 4)).astype("float32")
    train = data.distribute((x, x.sum(axis=1)), strategy=strategy, per_replica_batch_size=32)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(train, epochs=1, verbose=0, callbacks=[CountSteps()])
    print("RESULT " + json.dumps({{
        "scenario": "fit", "worker": data.plan_of(train).worker_index,
        "steps": CountSteps.steps,
        "planned_steps": data.plan_of(train).steps_per_epoch}}), flush=True)

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
        "scenario": "pass_order", "worker": plan.worker_index, "peeked": peeked,
        "dropped": plan.samples_dropped_per_epoch,
        "ids": {{str(epoch): ids for epoch, ids in recorder.ids_by_epoch.items()}},
    }}), flush=True)
    # Skips TensorFlow's shutdown barrier, which waits ~20 s for the cluster.
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def two_worker_results(tmp_path_factory):
    """`{scenario: [worker 0's result, worker 1's result]}` of one launch of the script above."""
    script = tmp_path_factory.mktemp("pass_order") / "worker.py"
    script.write_text(_WORKER_SCRIPT)
    output = io.StringIO()
    outcome = launcher.launch(
        [sys.executable, str(script)],
        num_workers=2,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        stdout=output,
        stderr=output,
    )
    assert outcome.exit_code == 0, f"{outcome.message}\n{output.getvalue()[-3000:]}"
    found = {}
    for line in output.getvalue().splitlines():
        _, _, payload = line.partition("] ")
        if payload.startswith("RESULT "):
            result = json.loads(payload[len("RESULT ") :])
            found.setdefault(result.pop("scenario"), []).append(result)
    assert sorted(found) == ["drop", "fit", "pad", "pass_order"], output.getvalue()[-3000:]
    for scenario, results in found.items():
        workers = sorted(result["worker"] for result in results)
        assert workers == [0, 1], (scenario, output.getvalue()[-3000:])
    return {
        scenario: sorted(results, key=lambda result: result["worker"])
        for scenario, results in found.items()
    }


@pytest.fixture(scope="module")
def results(two_worker_results):
    """The results of the peek-then-fit scenario, worker 0's first."""
    return two_worker_results["pass_order"]


@pytest.mark.timeout(300)
def test_two_real_workers_read_disjoint_shares_in_equal_steps(two_worker_results):
    for last_batch in ("pad", "drop"):
        results = two_worker_results[last_batch]
        assert sorted(result["worker"] for result in results) == [0, 1]
        assert {result["num_workers"] for result in results} == {2}
        assert {result["steps"] for result in results} == {results[0]["planned_steps"]}
        seen = [value for result in results for value in result["seen"]]
        assert len(seen) == len(set(seen)), f"{last_batch}: a sample was read by both workers"
        assert len(seen) == NUM_SHARED_SAMPLES - results[0]["dropped"]
        if last_batch == "pad":
            assert sorted(seen) == list(range(NUM_SHARED_SAMPLES))


@pytest.mark.timeout(300)
def test_fit_on_two_real_workers_runs_the_planned_steps(two_worker_results):
    results = two_worker_results["fit"]
    assert [result["steps"] for result in results] == [results[0]["planned_steps"]] * 2


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


@pytest.mark.parametrize("shuffle", [True, False])
def test_passes_numbered_by_reads_are_announced_with_several_workers(shuffle, monkeypatch, caplog):
    """Without Keras' adapter the order follows each process's reads: say so, when it matters."""
    monkeypatch.setenv(_probes.FAIL_PROBES_ENV, "keras.epoch_iterator_passes")
    # As in a process that never reached Keras' adapter: the probe is asked, and warns once.
    monkeypatch.setattr(_passes, "_installed", False)
    monkeypatch.setattr(_probes, "_warned", set())
    worker = StrategyInfo(
        kind="MultiWorkerMirroredStrategy",
        num_workers=2,
        worker_index=0,
        is_chief=True,
        num_replicas=2,
        local_devices=("/cpu:0",),
        device_kind="CPU",
    )
    ids = np.arange(100)
    with caplog.at_level(logging.WARNING, logger="keras_scaling"):
        data._distribute_for((ids, ids), worker, per_replica_batch_size=4, shuffle=shuffle)

    probe = _probes._registry["keras.epoch_iterator_passes"]
    messages = [record.getMessage() for record in caplog.records]
    (probe_warning,) = [message for message in messages if probe.reaches in message]
    assert f"Keras {_versions.keras_version()}" in probe_warning
    assert probe.lost in probe_warning and probe.workaround in probe_warning
    assert (data.UNNUMBERED_PASSES_WARNING in messages) == shuffle
