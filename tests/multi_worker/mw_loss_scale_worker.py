"""Worker of the mixed precision scenario on 2 workers: an overflow on the last replica only.

`tests/workers/overflowing_model.py` trains one epoch of 6 steps of 16 samples,
in order; only the last replica's gradients overflow at the first step.
Writes `worker{i}.json`.
"""

import hashlib
import os
import sys

import mw_common
import numpy as np

import keras_scaling

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workers")
)
import overflowing_model  # noqa: E402

GLOBAL_BATCH_SIZE = 16
NUM_SAMPLES = 96


def loss_scale(strategy, out_dir):
    index = keras_scaling.describe_strategy(strategy).worker_index
    # The first batch's last 4 samples: the last replica's share, on worker 1.
    x, y = overflowing_model.data(NUM_SAMPLES, GLOBAL_BATCH_SIZE, GLOBAL_BATCH_SIZE * 3 // 4)
    model = overflowing_model.build(strategy)
    data = keras_scaling.data.distribute(
        (x, y), strategy=strategy, global_batch_size=GLOBAL_BATCH_SIZE, shuffle=False
    )
    model.fit(data, epochs=1, verbose=0)
    copies = list(mw_common.local_copies(strategy, model.variables).values())
    mw_common.write_json(
        os.path.join(out_dir, f"worker{index}.json"),
        {
            "updates": int(model.optimizer.inner_optimizer.iterations.numpy()),
            "loss_scale": float(model.optimizer.dynamic_scale.numpy()),
            "finite": all(bool(np.isfinite(c).all()) for local in copies for c in local),
            "replicas_equal": all(np.array_equal(c, local[0]) for local in copies for c in local),
            "digest": hashlib.sha256(b"".join(local[0].tobytes() for local in copies)).hexdigest(),
        },
    )
