"""Why a data-parallel step takes the time it does: input, compute, synchronization, host.

`keras_scaling.explain(model, data)` times variants of the model's training
step and splits the step into the time the replicas wait for data, one
replica's own arithmetic, what several replicas add over one (the all-reduce
and waiting for the slowest), and the training loop's per-call cost; then
names what bounds the step and the fix, with measured numbers.
`keras-scaling bench --explain` does the same at each replica count of a sweep.
See docs/guides/explain.md.

The package is callable: `keras_scaling.explain(...)` is `explain.explain(...)`
whether Python bound the name to this package or to its function.
"""

import sys
import types
from typing import TYPE_CHECKING, Any

from keras_scaling import _validation
from keras_scaling.explain._report import Explanation

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

__all__ = ["explain"]


def explain(
    model: "keras.Model",
    data: Any,
    *,
    strategy: "tf.distribute.Strategy | None" = None,
    steps: int = 50,
    rounds: int = 3,
    per_replica_batch_size: int | None = None,
    amortized_steps_per_execution: int | None = None,
    peak_flops: float | str = "auto",
    log_dir: str | None = None,
    verbose: bool = True,
) -> Explanation:
    """Splits the training step into input, compute, synchronization and host overhead.

    Each part is measured by running a variant of the step with the model's
    own Keras train function, in turns over `rounds` rounds of `steps`
    steps each:

    | part | measured as |
    |---|---|
    | input | what the step on `data` waits for its next batch (the time in `IteratorGetNext`), checked against the same step on one batch repeated from memory |
    | compute | one replica alone (a copy of the model on the first device) on a resident batch at the per-replica batch, host cost per call taken out |
    | synchronization | all replicas minus one replica, both on resident batches at `amortized_steps_per_execution` |
    | host | the per-call cost of the training loop: the resident step at the model's `steps_per_execution` against a larger one |

    Each variant counts the median of its rounds; each round on `data`
    starts a fresh iterator, so it takes no batches buffered while other
    variants ran. The parts add up to the measured step but for the
    unexplained rest (differences that noise made negative count as 0).

    The pipeline overlaps training (`prefetch`), so the largest part need
    not bound the step: the verdict names the part whose removal shortens
    the step most (`part.saved_s`). Freeing the input saves what the step
    waits for it; freeing a part of training saves no more than training's
    lead over the pipeline alone. It gives the fix with numbers, and how
    sure it is ("uncertain" when the top two savings are within noise, or
    when the step on a resident batch contradicts the wait).

    The model trains during the measurement; its weights, optimizer state,
    metrics and `steps_per_execution` are put back afterwards. With several
    replicas it applies `keras_scaling.compat.enable_for(strategy)`, whose
    fix lets `steps_per_execution` > 1 run on several replicas.

    Args:
        model: a compiled `keras.Model`, built in `strategy`'s scope.
        data: a `tf.data.Dataset` of global batches (as
            `keras_scaling.data.distribute` makes), or arrays `(x, y)` or a
            `keras.utils.PyDataset`, which are wrapped by
            `keras_scaling.data.distribute` as training would.
        strategy: the `tf.distribute.Strategy`; default the model's.
        steps: int >= 2, training steps each variant runs per round.
        rounds: int >= 2, rounds over all variants; their spread is the noise.
        per_replica_batch_size: int, for arrays and `PyDataset` data.
        amortized_steps_per_execution: int, the larger `steps_per_execution`
            the host part is measured against; default max(16, 4 x the model's).
        peak_flops: peak FLOPs/sec of one replica for the MFU of the compute
            part: a number, `"auto"` (known GPUs and TPUs) or `"measure"`.
        log_dir: str, where to write `explain.json` and the TensorBoard run
            `explain` (Custom Scalars and Text tabs); None writes nothing.
        verbose: bool, print the table and the verdict.

    Returns:
        An `Explanation`: `.split` (`.step_s`, `.parts` with `.name`,
        `.time_s`, `.share`, `.noise_s`, `.saved_s`; `.rest_s`,
        `.input_free_step_s`), `.verdict` (`.bound`:
        "input", "compute", "synchronization" or "host"; `.confidence`;
        `.text`; `.notes`) and `.record` (the dict of `explain.json`).

    Raises:
        ValueError, TypeError: before any measurement, for an argument that
            cannot work: a model that is not a compiled `keras.Model`, array
            data without `per_replica_batch_size`, `steps` or `rounds` below
            2, a `peak_flops` that is not a positive number, `"auto"` or
            `"measure"` (None included).
        OSError: a `log_dir` that cannot be written.

    Example:

    ```python
    import numpy as np
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.zeros((256, 8), "float32"), np.zeros((256, 1), "float32")
    result = keras_scaling.explain(
        model, (x, y), per_replica_batch_size=32, steps=10, rounds=2, verbose=False
    )
    [part.name for part in result.split.parts]  # ['input', 'compute', 'synchronization', 'host']
    # Usually "host": a tiny model's step is mostly the loop's cost; on a
    # loaded machine the parts can fall within noise of each other.
    result.verdict.bound
    ```
    """
    import keras
    import tensorflow as tf

    from keras_scaling import data as data_module
    from keras_scaling.explain import _measure, _report, _writer

    # Everything that cannot work is refused here, before minutes of measuring.
    if not isinstance(model, keras.Model):
        raise TypeError(
            f"model must be a compiled keras.Model, got {type(model).__name__}; "
            "pass the model you train"
        )
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            f"strategy must be a tf.distribute.Strategy or None (the model's), got "
            f"{type(strategy).__name__} {strategy!r}"
        )
    steps = _validation.integer_at_least(steps, "steps", 2)
    rounds = _validation.integer_at_least(rounds, "rounds", 2)
    verbose = _validation.boolean(verbose, "verbose")
    per_replica_batch_size = _validation.optional_positive_int(
        per_replica_batch_size, "per_replica_batch_size"
    )
    peak_flops = _validation.positive_number_or_one_of(
        peak_flops,
        "peak_flops",
        ("auto", "measure"),
        unit="FLOPs/sec of one replica",
        fix="Leave it at 'auto' (the default: known GPUs and TPUs; elsewhere the "
        "MFU is left out with the reason) or pass 'measure'",
    )
    if log_dir is not None:
        _validation.writable_directory(log_dir, "log_dir", "keras_scaling.explain")
    if amortized_steps_per_execution is not None:
        amortized_steps_per_execution = _validation.positive_int(
            amortized_steps_per_execution, "amortized_steps_per_execution"
        )
    if not getattr(model, "compiled", False):
        raise ValueError(
            "model must be compiled: call model.compile(optimizer=..., loss=...) "
            "before keras_scaling.explain"
        )
    strategy = strategy or model.distribute_strategy
    if not isinstance(data, tf.data.Dataset):
        if per_replica_batch_size is None and not _is_py_dataset(data):
            raise ValueError(
                "per_replica_batch_size is needed for array data: pass "
                "per_replica_batch_size=..., or a tf.data.Dataset of global batches"
            )
        data = data_module.distribute(
            data,
            strategy=strategy,
            per_replica_batch_size=per_replica_batch_size,
            shuffle=False,
        )
    steps_per_execution = int(model.steps_per_execution or 1)
    if (
        amortized_steps_per_execution is not None
        and amortized_steps_per_execution <= steps_per_execution
    ):
        raise ValueError(
            f"amortized_steps_per_execution must exceed the model's steps_per_execution "
            f"({steps_per_execution}), got {amortized_steps_per_execution}"
        )
    measurements = _measure.measure(
        model,
        data,
        strategy,
        steps=steps,
        rounds=rounds,
        amortized=amortized_steps_per_execution,
    )
    result = _report.explanation(measurements)
    compute_s = result.split.part("compute").time_s
    mfu, reason = _measure.compute_mfu(
        model, strategy, peak_flops, measurements["per_replica_batch_size"], compute_s
    )
    result = _report.explanation(measurements, mfu=mfu, mfu_reason=reason)
    if verbose:
        print(str(result))
    if log_dir is not None:
        _writer.write(str(log_dir), [result])
    return result


def _is_py_dataset(data: object) -> bool:
    import keras

    return isinstance(data, keras.utils.PyDataset)


class _CallableModule(types.ModuleType):
    """This package, callable as its `explain` function.

    The package and its function share the name `keras_scaling.explain`;
    importing `keras_scaling.explain._measure` binds the package to it.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Explanation:
        return explain(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
