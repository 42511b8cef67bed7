"""Worker of the tests that share one launch: their scenarios in turn, in one process.

Run under `keras-scaling launch --workers 2 --cpu-devices 2 -- python
mw_scenarios_worker.py OUT_DIR DATA_DIR`. Starting TensorFlow and the cluster costs
each process seconds of CPU time, so one strategy serves, in this order:

- `OUT_DIR/train`: training with the adapter and both callbacks
  (`mw_train_worker.py`'s defaults);
- `OUT_DIR/input_timing`: the same on 192 samples for 3 epochs, with a
  baseline so high that the low-efficiency advice times the input pipeline;
- `OUT_DIR/diverge`: worker 1 alone changes a copy of a kernel before `fit`
  (`mw_diverge_worker.py`);
- `OUT_DIR/resync`: ReplicaSyncCheck's verdict and repair (`mw_resync_worker.py`);
- `OUT_DIR/data_wrapping`: every source of `tests/workers/data_wrapping_sources.py`,
  written to DATA_DIR, read for an epoch and trained on (`mw_data_wrapping_worker.py`);
- `OUT_DIR/tune`: `keras_scaling.tune` on both workers, then each all-reduce
  packing it tried, trained (`mw_tune_worker.py`);
- `OUT_DIR/gan`: a keras.io-style GAN never stopped, and crashed and resumed
  by `BackupAndRestore` (`mw_gan_worker.py`);
- `OUT_DIR/loss_scale`: mixed precision whose first step overflows on the last
  replica only (`mw_loss_scale_worker.py`).

Each writes what its test reads to its directory.
"""

import os
import sys

import mw_common
import mw_data_wrapping_worker
import mw_diverge_worker
import mw_gan_worker
import mw_loss_scale_worker
import mw_resync_worker
import mw_train_worker
import mw_tune_worker

import keras_scaling

SCENARIOS = (
    "train",
    "input_timing",
    "diverge",
    "resync",
    "data_wrapping",
    "tune",
    "gan",
    "loss_scale",
)


def main(out_dir, data_dir):
    strategy = keras_scaling.auto_strategy()
    index = keras_scaling.describe_strategy(strategy).worker_index
    mw_common.record_pid(out_dir, f"worker{index}")
    directories = {name: os.path.join(out_dir, name) for name in SCENARIOS}
    for directory in directories.values():
        os.makedirs(directory, exist_ok=True)
    train = directories["train"]
    mw_train_worker.train(
        strategy, mw_train_worker.parse_args(["--out-dir", train, "--log-dir", f"{train}/logs"])
    )
    timed = directories["input_timing"]
    mw_train_worker.train(
        strategy,
        mw_train_worker.parse_args(
            ["--out-dir", timed, "--log-dir", f"{timed}/logs", "--epochs", "3", "--samples", "192"]
            # Far above what 4 CPU replicas reach: the efficiency is low.
            + ["--baseline", "1e9", "--update-freq", "1"]
        ),
    )
    mw_diverge_worker.diverge(strategy, directories["diverge"])
    mw_resync_worker.resync(strategy, directories["resync"])
    mw_data_wrapping_worker.wrap(strategy, directories["data_wrapping"], data_dir)
    mw_tune_worker.tune(strategy, directories["tune"])
    mw_gan_worker.gan(strategy, directories["gan"])
    mw_loss_scale_worker.loss_scale(strategy, directories["loss_scale"])


if __name__ == "__main__":
    from keras_scaling.cli._worker import end_without_final_collection

    end_without_final_collection()
    main(sys.argv[1], sys.argv[2])
