"""How long `keras_scaling.explain` takes, how close its step lands to fit's, and its verdicts.

Cases, at one replica (on this process's one device):

- `mlp`, `cnn`: the presets of `keras-scaling bench` on cached batches;
- `input12_compute7`: a pipeline whose `map` sleeps 12 ms per batch and a
  model whose step sleeps 7 ms, prefetched: the step is the pipeline's, so
  the answer is input-bound (freeing compute saves nothing);
- `input3_compute12`: the other way round: compute-bound.

Each round runs `explain` and then times the same model's step with
`model.fit` on the same pipeline (the median epoch after the first of three
epochs of `--steps` steps). It prints, per case, the medians and spread over
rounds of:

- the seconds `explain` takes;
- |explain's step - fit's step| / fit's step (goal: within 15%);
- |sum of parts - fit's step| / fit's step;
- the verdicts of the rounds, with their confidence.

Usage: python benchmarks/explain.py [--rounds 3] [--steps 30]
    [--cases mlp,cnn,input12_compute7,input3_compute12]
"""

import argparse
import collections
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

_SLEEP_CASES = {"input12_compute7": (0.012, 0.007), "input3_compute12": (0.003, 0.012)}


def _fit_step_s(model, dataset, steps, epochs=3):
    """fit's step time: the median epoch after the first, over `steps`.

    The first epoch holds the start-up (iterator, warm-up); the epoch hooks
    add no wait per step, where a batch hook would.
    """
    import keras

    epoch_s = []

    class EpochTimes(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start_s = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_s.append(time.perf_counter() - self.start_s)

    model.fit(
        dataset,
        steps_per_epoch=steps,
        epochs=epochs,
        verbose=0,
        shuffle=False,
        callbacks=[EpochTimes()],
    )
    return statistics.median(epoch_s[1:]) / steps


def _sleep(seconds):
    import numpy as np
    import tensorflow as tf

    def sleep():
        time.sleep(seconds)
        return np.float32(0)

    return tf.py_function(sleep, [], tf.float32)


def _sleep_case(strategy, input_s, compute_s, batch=8, width=4):
    """A model whose step sleeps `compute_s`, on batches that take `input_s` to make."""
    import keras
    import numpy as np
    import tensorflow as tf

    class Sleep(keras.layers.Layer):
        def call(self, x):
            with tf.control_dependencies([_sleep(compute_s)]):
                return tf.identity(x)

    with strategy.scope():
        model = keras.Sequential([keras.Input((width,)), Sleep(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")

    def slow(x, y):
        with tf.control_dependencies([_sleep(input_s)]):
            return tf.identity(x), tf.identity(y)

    x, y = np.ones((batch, width), "float32"), np.ones((batch, 1), "float32")
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat().map(slow)
    return model, dataset.prefetch(tf.data.AUTOTUNE)


def _preset_case(strategy, preset, per_replica_batch):
    from keras_scaling import data
    from keras_scaling.cli import _models

    model = _models.build_model(preset)
    _models.compile_for_bench(model, preset, 1)
    x, y = _models.synthetic_data(model, per_replica_batch * 16)
    dataset = data.distribute((x, y), strategy=strategy, per_replica_batch_size=per_replica_batch)
    return model, dataset.repeat()


def _spread(values):
    return f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--cases", default="mlp,cnn,input12_compute7,input3_compute12")
    args = parser.parse_args()

    import tensorflow as tf

    import keras_scaling

    strategy = tf.distribute.get_strategy()
    for case in args.cases.split(","):
        if case in _SLEEP_CASES:
            model, dataset = _sleep_case(strategy, *_SLEEP_CASES[case])
        else:
            model, dataset = _preset_case(strategy, case, args.per_replica_batch)
        _fit_step_s(model, dataset, 5, epochs=2)  # traces fit's function
        took_s, step_gap, parts_gap, verdicts = [], [], [], collections.Counter()
        for _ in range(args.rounds):
            start_s = time.perf_counter()
            result = keras_scaling.explain(
                model, dataset, strategy=strategy, steps=args.steps, verbose=False
            )
            took_s.append(time.perf_counter() - start_s)
            fit_s = _fit_step_s(model, dataset, args.steps)
            parts_s = sum(part.time_s for part in result.split.parts)
            step_gap.append(abs(result.split.step_s - fit_s) / fit_s)
            parts_gap.append(abs(parts_s - fit_s) / fit_s)
            verdicts[f"{result.verdict.bound} ({result.verdict.confidence})"] += 1
        print(f"{case}: verdicts {dict(verdicts)}")
        print(f"  explain takes, s:                      {_spread(took_s)}")
        print(f"  |explain's step - fit's| / fit's:      {_spread(step_gap)}")
        print(f"  |sum of parts - fit's step| / fit's:   {_spread(parts_gap)}")
        print(f"  last split:\n{result}")


if __name__ == "__main__":
    main()
