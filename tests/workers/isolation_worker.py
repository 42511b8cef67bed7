"""Worker of the isolation test: a MultiWorkerMirroredStrategy job under `launch`.

Once its strategy (and so TensorFlow's server) is up, it writes
`ports{i}` (the cluster's ports) and `ready{i}` (its pid) to OUT_DIR and waits for OUT_DIR/go, so that the test
can look at the listening ports while the job runs. Then it all-reduces a
value across the workers and trains a small model, and writes
`worker{i}.json`: the all-reduced sum and the final weights.
"""

import json
import os
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import keras_scaling
from keras_scaling import data


def main(out_dir):
    strategy = keras_scaling.auto_strategy()
    index = keras_scaling.describe_strategy(strategy).worker_index
    config = json.loads(os.environ["TF_CONFIG"])
    ports = [int(address.rsplit(":", 1)[1]) for address in config["cluster"]["worker"]]
    with open(os.path.join(out_dir, f"ports{index}"), "w") as file:
        json.dump(ports, file)
    with open(os.path.join(out_dir, f"ready{index}"), "w") as file:
        file.write(str(os.getpid()))
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(out_dir, "go")):
        if time.monotonic() > deadline:
            sys.exit("the test never wrote go")
        time.sleep(0.05)

    def replica_number():
        context = tf.distribute.get_replica_context()
        return tf.cast(context.replica_id_in_sync_group + 1, tf.float32)

    total = strategy.reduce("SUM", strategy.run(replica_number), axis=None)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    train = data.distribute((x, y), strategy=strategy, global_batch_size=16, seed=3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    history = model.fit(train, epochs=3, verbose=0)
    with open(os.path.join(out_dir, f"worker{index}.json"), "w") as file:
        json.dump(
            {
                "replica_sum": float(total.numpy()),
                "num_replicas": strategy.num_replicas_in_sync,
                "losses": history.history["loss"],
                "weights": [w.tolist() for w in model.get_weights()],
            },
            file,
        )
    sys.stdout.flush()
    # Skips TensorFlow's shutdown barrier, which waits for the whole cluster.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
