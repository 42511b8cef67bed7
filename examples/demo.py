"""`make demo`: the scaling table of a small model on 4 logical CPUs, why, and the fix measured.

First `keras-scaling bench` over 1, 2 and 4 replicas of `MirroredStrategy`
on logical CPU devices: the table of samples/sec, speedup and efficiency,
the plot, and the command that opens TensorBoard. Then `keras-scaling tune`
at 2 replicas: explain's verdict (what bounds the step), each knob measured
against the start in alternating rounds, the measured gain and the line
that applies it. It is the same as:

    keras-scaling bench --cpu-devices 4 --model mlp --per-replica-batch 128 \\
        --steps 50 --logdir logs/demo --overwrite
    keras-scaling tune --cpu-devices 2 --model mlp --per-replica-batch 128 \\
        --budget 90 --logdir logs/demo/tune
"""

import sys

from keras_scaling.cli import main

# Small enough that the whole demo takes under 2 minutes on a laptop.
_TUNE_BUDGET_S = "90"

if __name__ == "__main__":
    status = main(
        [
            "bench",
            "--cpu-devices",
            "4",
            "--model",
            "mlp",
            "--per-replica-batch",
            "128",
            "--steps",
            "50",
            "--logdir",
            "logs/demo",
            "--overwrite",
            *sys.argv[1:],
        ]
    )
    if status == 0:
        print("\nWhy, and the fix measured: keras-scaling tune at 2 replicas\n", flush=True)
        status = main(
            [
                "tune",
                "--cpu-devices",
                "2",
                "--model",
                "mlp",
                "--per-replica-batch",
                "128",
                "--budget",
                _TUNE_BUDGET_S,
                "--logdir",
                "logs/demo/tune",
            ]
        )
    sys.exit(status)
