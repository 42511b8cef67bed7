"""Why a data-parallel step takes the time it does: input, compute, synchronization, host (docs/guides/explain.md)."""

from typing import TYPE_CHECKING, Any

from keras_scaling import _callable_module, _validation
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

    Times variants of the step with the model's own train function over `rounds` rounds, and
    names the part whose removal shortens the step most (`part.saved_s`: with `prefetch`, the
    largest part need not bound the step), with the fix. The model trains meanwhile; its
    weights, optimizer state, metrics and `steps_per_execution` are put back afterwards. With
    several replicas it applies `keras_scaling.compat.enable_for(strategy)`.

    Args:
        model: a compiled `keras.Model`, built in `strategy`'s scope.
        data: a `tf.data.Dataset` of global batches, or arrays `(x, y)` or a
            `keras.utils.PyDataset` (batched by `keras_scaling.data.distribute`).
        strategy: the `tf.distribute.Strategy`; default the model's.
        steps: int >= 2, training steps each variant runs per round.
        rounds: int >= 2, rounds over all variants; their spread is the noise.
        per_replica_batch_size: int, for arrays and `PyDataset` data.
        amortized_steps_per_execution: int, the larger `steps_per_execution` the host part is
            measured against; default max(16, 4 x the model's).
        peak_flops: peak FLOPs/sec of one replica for the compute part's MFU: a number,
            `"auto"` (known GPUs and TPUs) or `"measure"`.
        log_dir: str, where to write `explain.json` and the TensorBoard run `explain`; None
            writes nothing.
        verbose: bool, print the table and the verdict.

    Returns:
        An `Explanation`: `.split` (`.step_s`, `.parts` with `.name`, `.time_s`, `.share`,
        `.noise_s`, `.saved_s`), `.verdict` (`.bound`, `.confidence`, `.text`, `.notes`) and
        `.record` (`explain.json`'s).

    Raises:
        ValueError, TypeError: before any measurement, for an argument that cannot work.
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
    # Usually "host": a tiny model's step is mostly the loop's cost.
    result.verdict.bound
    ```
    """
    import keras
    import tensorflow as tf

    from keras_scaling import data as data_module
    from keras_scaling.explain import _measure, _report, _writer

    # Refused here, before minutes of measuring.
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a compiled keras.Model, got {type(model).__name__}")
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        message = f"strategy must be a tf.distribute.Strategy or None (the model's), got {type(strategy).__name__} {strategy!r}"
        raise TypeError(message)
    steps = _validation.integer_at_least(steps, "steps", 2)
    rounds = _validation.integer_at_least(rounds, "rounds", 2)
    verbose = _validation.boolean(verbose, "verbose")
    per_replica_batch_size = _validation.optional_positive_int(
        per_replica_batch_size, "per_replica_batch_size"
    )
    unit, fix = "FLOPs/sec of one replica", "Leave it at 'auto' or pass 'measure'"
    peak_flops = _validation.positive_number_or_one_of(
        peak_flops, "peak_flops", ("auto", "measure"), unit=unit, fix=fix
    )
    if log_dir is not None:
        _validation.writable_directory(log_dir, "log_dir", "keras_scaling.explain")
    amortized = _validation.optional_positive_int(
        amortized_steps_per_execution, "amortized_steps_per_execution"
    )
    if not getattr(model, "compiled", False):
        raise ValueError("model must be compiled: call model.compile(...) before explain")
    strategy = strategy or model.distribute_strategy
    if not isinstance(data, tf.data.Dataset):
        if per_replica_batch_size is None and not isinstance(data, keras.utils.PyDataset):
            message = "per_replica_batch_size is needed for array data: pass per_replica_batch_size=..., or a tf.data.Dataset of global batches"
            raise ValueError(message)
        data = data_module.distribute(
            data, strategy=strategy, per_replica_batch_size=per_replica_batch_size, shuffle=False
        )
    steps_per_execution = int(model.steps_per_execution or 1)
    if amortized is not None and amortized <= steps_per_execution:
        message = f"amortized_steps_per_execution must exceed the model's steps_per_execution ({steps_per_execution}), got {amortized}"
        raise ValueError(message)
    measurements = _measure.measure(
        model, data, strategy, steps=steps, rounds=rounds, amortized=amortized
    )
    compute_s = _report.explanation(measurements).split.part("compute").time_s
    batch = measurements["per_replica_batch_size"]
    mfu, reason = _measure.compute_mfu(model, strategy, peak_flops, batch, compute_s)
    result = _report.explanation(measurements, mfu=mfu, mfu_reason=reason)
    if verbose:
        print(str(result))
    if log_dir is not None:
        _writer.write(str(log_dir), [result])
    return result


_callable_module.make_callable(__name__, explain)
