"""`make demo`: the scaling table of a small model on 4 logical CPUs.

Runs `keras-scaling bench` over 1, 2 and 4 replicas of `MirroredStrategy`
on logical CPU devices, prints the table of samples/sec, speedup and
efficiency, writes the plot, and prints the command that opens TensorBoard.
It is the same as:

    keras-scaling bench --cpu-devices 4 --model mlp --per-replica-batch 128 \\
        --steps 50 --logdir logs/demo --overwrite
"""

import sys

from keras_scaling.cli import main

if __name__ == "__main__":
    sys.exit(
        main(
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
    )
