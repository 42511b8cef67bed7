"""Runs docstring examples, each in a namespace of its own; prints the outcome as JSON.

Usage: `python run_examples.py EXAMPLES.json LOGICAL_CPUS`. The file holds a
list of `{"name": ..., "module": ..., "code": ...}`. As in `doctest`, every
example sees the names of the module it is documented in (a copy of them),
plus the imports a reader of keras_scaling's docs is assumed to have made
(`PREAMBLE`). The last line of stdout is `{name: null or the error}`.

The MirroredStrategy objects of each example number their collective keys
from a start of their own, so that they do not clash with those of the
examples before it.
"""

import contextlib
import importlib
import io
import json
import os
import sys
import traceback

# Apart enough for the collective groups of every strategy an example builds.
COLLECTIVE_KEYS_PER_EXAMPLE = 1000
PREAMBLE = "import keras\nimport numpy as np\nimport tensorflow as tf\nimport keras_scaling\n"


def main():
    path, logical_cpus = sys.argv[1], int(sys.argv[2])
    import keras_scaling

    if logical_cpus > 1:
        keras_scaling.use_logical_cpus(logical_cpus)
    with open(path) as file:
        examples = json.load(file)
    outcomes = {}
    for index, example in enumerate(examples):
        if logical_cpus > 1:
            import tensorflow as tf

            tf.distribute.MirroredStrategy._collective_key_base = (
                COLLECTIVE_KEYS_PER_EXAMPLE * index
            )
        namespace = dict(vars(importlib.import_module(example["module"])))
        namespace["__name__"] = "__example__"
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                exec(compile(PREAMBLE + example["code"], example["name"], "exec"), namespace)
            outcomes[example["name"]] = None
        except BaseException:  # noqa: BLE001 - SystemExit too: report, go on
            outcomes[example["name"]] = traceback.format_exc(limit=-3)
    sys.stdout.flush()
    print(json.dumps(outcomes))
    sys.stdout.flush()
    # Thread pools of TensorFlow can keep a finished interpreter alive.
    os._exit(0)


if __name__ == "__main__":
    main()
