"""A Ray Train loop of the tests: `keras_scaling.doctor.run_checks()`, then training that records sample ids.

Runs on every worker of a `TensorflowTrainer`; writes
`worker-I.json` (the doctor's verdicts, `TF_CONFIG`, the sample ids each
epoch trained on) to `config["out_dir"]`.
"""

import json
import os

import mw_common


def doctor_then_record_ids(config):
    import keras

    import keras_scaling
    from keras_scaling import data, doctor

    strategy = keras_scaling.auto_strategy()
    report = doctor.run_checks(strategy, size_mb=1, rounds=1)
    info = keras_scaling.describe_strategy(strategy)

    train = data.distribute(
        mw_common.make_data(config["samples"]),
        strategy=strategy,
        per_replica_batch_size=8,
        shuffle=True,
        seed=3,
    )
    recorder = mw_common.IdRecorder()

    class TellEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            recorder.epoch = epoch

    with strategy.scope():
        model = mw_common.build_model(recorder)
    model.fit(train, epochs=config["epochs"], callbacks=[TellEpoch()], verbose=0)
    mw_common.write_json(
        os.path.join(config["out_dir"], f"worker-{info.worker_index}.json"),
        {
            "doctor_ok": report.ok,
            "checks": {check.name: check.ok for check in report.checks},
            "num_replicas": info.num_replicas,
            "tf_config": json.loads(os.environ["TF_CONFIG"]),
            "ids_by_epoch": {str(epoch): ids for epoch, ids in recorder.ids_by_epoch.items()},
        },
    )
