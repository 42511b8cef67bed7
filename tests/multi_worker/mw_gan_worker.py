"""Worker of the GAN scenario on 2 workers: a run never stopped, and one crashed and resumed.

The keras.io-style GAN of `tests/workers/gan_model.py` steps the optimizers it
holds, never `model.optimizer`. With `BackupAndRestore` and `ThroughputLogger`
it trains 2 epochs never stopped; then a model built anew crashes on both
workers after step 5 of 8 (a backup every 2 steps, the last at step 4), and
another resumes from that backup to the end. Writes `worker{i}.json`.
"""

import hashlib
import os
import sys

import mw_common
import numpy as np

import keras_scaling
from keras_scaling.preemption import _backup

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers")
)
import gan_model  # noqa: E402

CRASH_AFTER = 5
SAVE_EVERY = 2


def _fit(strategy, callbacks):
    gan = gan_model.build_gan(strategy)
    gan.fit(gan_model.gan_data(strategy), epochs=gan_model.EPOCHS, callbacks=callbacks, verbose=0)
    return gan


def gan(strategy, out_dir):
    index = keras_scaling.describe_strategy(strategy).worker_index
    logs = os.path.join(out_dir, "logs")
    never_stopped = _fit(
        strategy,
        [
            keras_scaling.ThroughputLogger(logs, baseline=None),
            keras_scaling.BackupAndRestore(os.path.join(out_dir, "reference_backup")),
        ],
    )
    backup_dir = os.path.join(out_dir, "backup")
    try:
        _fit(
            strategy,
            [
                keras_scaling.BackupAndRestore(backup_dir, save_every_n_steps=SAVE_EVERY),
                gan_model.CrashAfter(CRASH_AFTER),
            ],
        )
    except RuntimeError:
        pass
    header, _ = _backup.read(backup_dir)
    resumed = _fit(strategy, [keras_scaling.BackupAndRestore(backup_dir)])
    values = gan_model.state(resumed)
    reference = gan_model.state(never_stopped)
    mw_common.write_json(
        os.path.join(out_dir, f"worker{index}.json"),
        {
            "backup_step_in_epoch": header["position"]["step_in_epoch"],
            "resumed_equals_never_stopped": all(
                np.array_equal(a, b) for a, b in zip(values, reference, strict=True)
            ),
            "generator_steps": int(resumed.g_optimizer.iterations.numpy()),
            "model_optimizer_steps": int(resumed.optimizer.iterations.numpy()),
            "digest": hashlib.sha256(b"".join(v.tobytes() for v in values)).hexdigest(),
        },
    )
