"""How long `keras_scaling.explain` takes, and how far its parts land from a measured step.

For the `mlp` and `cnn` presets of `keras-scaling bench` at one replica (on
this process's one device), each round runs `explain` and, beside it, times
the same model's step with `model.fit` on the same pipeline. It
prints, per preset, the medians and spread over rounds of:

- the seconds `explain` takes;
- |sum of parts - explain's measured step| / step (the rest, by construction
  small: the parts are differences of measured variants);
- |sum of parts - fit's step| / fit's step: how far the split lands from a
  step measured independently, by `fit` itself (the second of two epochs of
  `--steps` steps; goal: within 10%).

On a loaded machine the medians stray; the best rounds (the least disturbed)
are printed too.

Usage: python benchmarks/explain.py [--rounds 3] [--steps 30] [--presets mlp,cnn]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _fit_step_s(model, dataset, steps):
    """fit's step time: the second of two epochs of `steps` steps, over `steps`.

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

    model.fit(dataset, steps_per_epoch=steps, epochs=2, verbose=0, callbacks=[EpochTimes()])
    return epoch_s[1] / steps


def _spread(values):
    return f"median {statistics.median(values):.3g} (min {min(values):.3g}, max {max(values):.3g})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--per-replica-batch", type=int, default=64)
    parser.add_argument("--presets", default="mlp,cnn")
    args = parser.parse_args()

    import tensorflow as tf

    import keras_scaling
    from keras_scaling import data
    from keras_scaling.cli import _models

    strategy = tf.distribute.get_strategy()
    for preset in args.presets.split(","):
        model = _models.build_model(preset)
        _models.compile_for_bench(model, preset, 1)
        x, y = _models.synthetic_data(model, args.per_replica_batch * 16)
        dataset = data.distribute(
            (x, y), strategy=strategy, per_replica_batch_size=args.per_replica_batch
        ).repeat()
        _fit_step_s(model, dataset, 5)  # traces fit's function
        took_s, rest, against_fit, parts_by_round, fit_by_round = [], [], [], [], []
        for _ in range(args.rounds):
            start_s = time.perf_counter()
            result = keras_scaling.explain(
                model, dataset, strategy=strategy, steps=args.steps, verbose=False
            )
            took_s.append(time.perf_counter() - start_s)
            parts_s = sum(part.time_s for part in result.split.parts)
            rest.append(abs(parts_s - result.split.step_s) / result.split.step_s)
            fit_s = _fit_step_s(model, dataset, args.steps)
            against_fit.append(abs(parts_s - fit_s) / fit_s)
            parts_by_round.append(parts_s)
            fit_by_round.append(fit_s)
        print(f"{preset}: verdict {result.verdict.bound} ({result.verdict.confidence})")
        print(f"  explain takes, s:                      {_spread(took_s)}")
        print(f"  |parts - explain's step| / step:       {_spread(rest)}")
        print(f"  |parts - fit's step| / fit's step:     {_spread(against_fit)}")
        best_parts_s, best_fit_s = min(parts_by_round), min(fit_by_round)
        print(
            f"  best rounds: parts {best_parts_s * 1e3:.2f} ms, fit {best_fit_s * 1e3:.2f} ms, "
            f"{abs(best_parts_s - best_fit_s) / best_fit_s:.1%} apart"
        )
        print(f"  last split:\n{result}")


if __name__ == "__main__":
    main()
