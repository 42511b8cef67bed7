"""The floating-point operations of one training sample, counted from the traced graph.

`training_flops_per_sample(model)` traces the model's own forward pass, loss
(`model.compute_loss`) and gradients with respect to the trainable weights
into one graph, on a batch of fixed shape, and adds up the operation counts
TensorFlow registers for each op (the "flops" statistics that
`tf.compat.v1.profiler.profile` with `ProfileOptionBuilder.float_operation()`
reports, the approach of TensorFlow Model Garden's `try_count_flops`). Unlike
the profiler, it counts only the ops the loss and gradients depend on (what
runs once TensorFlow prunes the graph), and it corrects or adds the counts of
a few ops (`_STATISTICS`): `Einsum` (attention layers) and the gradients of
`DepthwiseConv2D` and `Conv3D`, which TensorFlow does not count, and the
convolution gradients, which it over-counts with `padding="valid"`. The
optimizer update is not counted: MFU counts the model's arithmetic only.

Counted this way, forward and backward are about 2 times the forward pass for
an MLP (the first layer needs no gradient with respect to its input) and about
2.5 to 3 times for a CNN, so "3 x forward" is only a rule of thumb.

The count is refused (None, with the reason logged) when it would be wrong:

- loops (`While`: RNN layers) and other function calls (`If`, `Case`,
  `PartitionedCall`): the ops inside them are not counted, and a loop's
  body runs an unknown number of times;
- compute-heavy ops without statistics (`_HEAVY_OPS`);
- shapes that stay unknown with the batch given.
"""

import contextlib
import logging
import math
from typing import TYPE_CHECKING, Any

from keras_scaling import _threads
from keras_scaling.internals import _probes

if TYPE_CHECKING:
    import keras

__all__ = ["count_training_flops", "training_flops_per_sample"]

logger = logging.getLogger("keras_scaling")

# The batch traced when neither the sample nor the model fixes one.
_DEFAULT_BATCH_SIZE = 8
# Ops that run functions whose ops are not in the graph's own op list.
_LOOP_OPS = frozenset({"While", "StatelessWhile"})
_CALL_OPS = frozenset(
    {
        "If",
        "StatelessIf",
        "Case",
        "StatelessCase",
        "PartitionedCall",
        "StatefulPartitionedCall",
    }
)
# Ops whose cost dominates a step; one without statistics makes a count wrong.
_HEAVY_OPS = frozenset(
    {
        "MatMul",
        "BatchMatMul",
        "BatchMatMulV2",
        "BatchMatMulV3",
        "Einsum",
        "Conv2D",
        "Conv2DBackpropInput",
        "Conv2DBackpropFilter",
        "Conv2DBackpropInputV2",
        "Conv2DBackpropFilterV2",
        "Conv",
        "Conv3D",
        "Conv3DBackpropInputV2",
        "Conv3DBackpropFilterV2",
        "DepthwiseConv2dNative",
        "DepthwiseConv2dNativeBackpropInput",
        "DepthwiseConv2dNativeBackpropFilter",
        "CudnnRNN",
        "CudnnRNNV2",
        "CudnnRNNV3",
        "CudnnRNNBackprop",
        "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3",
        "XlaDot",
        "XlaDotV2",
        "XlaConv",
        "XlaConvV2",
        "XlaEinsum",
        "FFT",
        "FFT2D",
        "FFT3D",
        "IFFT",
        "IFFT2D",
        "IFFT3D",
        "MatrixInverse",
        "MatrixSolve",
        "Cholesky",
        "Qr",
        "Svd",
        "SelfAdjointEigV2",
    }
)


def training_flops_per_sample(model: "keras.Model", *, sample: Any = None) -> float | None:
    """Floating-point operations of one training sample, forward and backward.

    Traces the model's forward pass (`training=True`), its loss
    (`model.compute_loss`, so the compiled loss and regularisation losses)
    and the gradients of the loss with respect to the trainable weights into
    one graph, counts its floating-point operations with TensorFlow's
    profiler, and divides by the batch size. The optimizer update is not
    counted. Nothing runs on a device: the graph is only traced, so the
    model's weights and the optimizer are untouched. Count once per model
    and input shape, outside the training loop (`ThroughputLogger` does).

    A multiply-add counts as 2 operations (TensorFlow's convention, the one
    datasheet peak figures use).

    Args:
        model: a built `keras.Model`; compiled, or its loss is not counted
            (then only the forward pass and the gradients of its output sum).
        sample: optional, one batch: `(x, y)`, `(x, y, sample_weight)` or `x`,
            each a structure of arrays, tensors or `tf.TensorSpec`. Needed
            for models whose input shapes are not static, or whose target
            cannot be guessed from the output (the guess: a float target
            shaped like the output, else integer labels). A batch dimension
            of None is traced with 8 samples.

    Returns:
        float, operations per sample, or None when the graph cannot be
        counted reliably; the reason is logged as a warning on the
        `keras_scaling` logger.

    Raises:
        TypeError: `model` is not a `keras.Model`.

    Example:

    ```python
    import keras
    from keras_scaling import flops
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512),
                              keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss="mse")
    flops.training_flops_per_sample(model)   # 1637401.625: forward, weight gradients,
    # and the input gradient of the second layer
    ```
    """
    flops_per_sample, reason = count_training_flops(model, sample=sample)
    if flops_per_sample is None:
        logger.warning("keras_scaling.flops: not counted: %s", reason)
    return flops_per_sample


def count_training_flops(
    model: "keras.Model", *, sample: Any = None
) -> tuple[float, None] | tuple[None, str]:
    """The count of `training_flops_per_sample`, with the reason it failed.

    For callers that report the reason themselves: nothing is logged.

    Args:
        model: a built `keras.Model`.
        sample: optional, one batch, as for `training_flops_per_sample`.

    Returns:
        `(flops_per_sample, None)`, or `(None, reason)` when the graph cannot
        be counted reliably.

    Raises:
        TypeError: `model` is not a `keras.Model`.

    Example:

    ```python
    import keras
    from keras_scaling import flops
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    flops_per_sample, reason = flops.count_training_flops(model)
    if flops_per_sample is None:
        print("not counted:", reason)
    ```
    """
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}: {model!r}")
    try:
        candidates = _sample_specs(model, sample)
    except ValueError as error:
        return None, str(error)
    last_error = None
    for specs in candidates:
        try:
            graph = _training_graph(model, specs)
        except Exception as trace_error:  # a wrong guess of the target
            last_error = trace_error
            continue
        batch_size = _batch_size_of(specs)
        if batch_size is None:
            return None, "the sample has no batch dimension; pass sample=(x, y) with one batch"
        flops, reason = _count_graph(graph)
        if flops is None:
            return None, reason
        return flops / batch_size, None
    return None, (
        f"the loss and gradients could not be traced ({type(last_error).__name__}: "
        f"{last_error}); pass sample=(x, y) with one batch of the training data"
    )


def _batch_size_of(specs):
    import tensorflow as tf

    for spec in tf.nest.flatten(specs):
        if spec is not None and spec.shape.rank:
            return int(spec.shape[0])
    return None


def _sample_specs(model, sample):
    """Candidate `(x, y, sample_weight)` specs with static shapes to trace."""
    import tensorflow as tf

    if sample is None:
        inputs = getattr(model, "inputs", None)
        outputs = getattr(model, "outputs", None)
        if not inputs or not outputs:
            raise ValueError(
                f"{type(model).__name__} has no symbolic inputs and outputs, so "
                "the shapes to trace are unknown; pass sample=(x, y) with one "
                "batch of the training data"
            )
        x = [_spec_of(t) for t in inputs]
        x = x[0] if len(x) == 1 else x
        outputs_flat = [_spec_of(t) for t in outputs]
        float_target = tf.nest.map_structure(
            lambda spec: tf.TensorSpec(spec.shape, "float32"), outputs_flat
        )
        label_target = [tf.TensorSpec(spec.shape[:-1], "int32") for spec in outputs_flat]
        # Each guess costs a trace, so the likelier one goes first.
        targets = [float_target, label_target]
        if _loss_takes_labels(model):
            targets.reverse()
        if len(outputs_flat) == 1:
            targets = [target[0] for target in targets]
        candidates: list[tuple] = [(x, y, None) for y in targets]
    else:
        if isinstance(sample, tuple) and 1 < len(sample) <= 3:
            parts = tuple(sample) + (None,) * (3 - len(sample))
        else:
            parts = (sample, None, None)
        candidates = [
            tuple(None if part is None else tf.nest.map_structure(_spec_of, part) for part in parts)
        ]
    return [_with_static_batch(specs) for specs in candidates]


def _loss_takes_labels(model):
    """Whether the compiled loss takes integer labels (a sparse loss)."""
    import tensorflow as tf

    for loss in tf.nest.flatten(getattr(model, "loss", None)):
        if loss is None:
            continue
        name = (
            loss
            if isinstance(loss, str)
            else (
                getattr(loss, "name", None)
                or getattr(loss, "__name__", None)
                or type(loss).__name__
            )
        )
        if "sparse" in str(name).lower():
            return True
    return False


def _spec_of(value):
    import tensorflow as tf

    if isinstance(value, tf.TensorSpec):
        return value
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(
            f"sample holds a {type(value).__name__}, not an array, tensor or "
            "tf.TensorSpec; pass sample=(x, y) with one batch of the training data"
        )
    # A PerReplicaSpec holds one spec per local replica.
    value_specs = getattr(value, "_value_specs", None)
    if value_specs:
        return value_specs[0]
    return tf.TensorSpec(tuple(shape), tf.as_dtype(str(getattr(dtype, "name", dtype))))


def _with_static_batch(specs):
    """Sets an unknown batch dimension; refuses other unknown dimensions."""
    import tensorflow as tf

    flat = [spec for spec in tf.nest.flatten(specs) if spec is not None]
    batch_sizes = {spec.shape[0] for spec in flat if spec.shape.rank}
    known = {size for size in batch_sizes if size is not None}
    if len(known) > 1:
        raise ValueError(f"the sample's parts have different batch sizes {sorted(known)}")
    batch_size = known.pop() if known else _DEFAULT_BATCH_SIZE

    def fix(spec):
        if spec is None or not spec.shape.rank:
            return spec
        shape = [batch_size] + spec.shape.as_list()[1:]
        if None in shape:
            raise ValueError(
                f"an input has unknown dimensions {spec.shape}, so its operations "
                "cannot be counted; pass sample=(x, y) with one batch of the "
                "training data (or tf.TensorSpec with static shapes)"
            )
        return tf.TensorSpec(shape, spec.dtype)

    return tf.nest.map_structure(fix, specs)


def _training_graph(model, specs):
    """The graph of the forward pass, loss and gradients, traced on `specs`.

    Traced in a thread of its own: the training strategy's scope is
    thread-local, so the graph is that of one replica's computation.
    """
    import tensorflow as tf

    def loss_and_gradients(x, y, sample_weight):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            if getattr(model, "compiled", False):
                loss = model.compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
                )
            else:
                loss = tf.add_n([tf.reduce_sum(t) for t in tf.nest.flatten(y_pred)])
        return loss, tape.gradient(loss, model.trainable_variables)

    given = [index for index, spec in enumerate(specs) if spec is not None]

    def traced(*tensors):
        arguments = [None, None, None]
        for index, tensor in zip(given, tensors):
            arguments[index] = tensor
        return loss_and_gradients(*arguments)

    signature = [specs[index] for index in given]
    build_graph = _graph_builder()
    if build_graph is None:
        function = tf.function(traced, autograph=False)
        return _threads.run_outside_strategy(
            lambda: function.get_concrete_function(*signature).graph, "flops"
        )
    return _threads.run_outside_strategy(
        lambda: build_graph(
            "keras_scaling_flops",
            traced,
            None,
            None,
            signature=signature,
            add_control_dependencies=False,
        ),
        "flops",
    )


@_probes.guarded(
    "tf.func_graph_from_py_func",
    reaches="tensorflow.python.framework.func_graph.func_graph_from_py_func",
    lost=(
        "FLOP counting traces through tf.function instead, which adds "
        "automatic control dependencies and takes about a fifth longer"
    ),
    workaround="Nothing to do: the count is the same.",
)
def _graph_builder():
    """TensorFlow's graph builder without `tf.function`'s automatic control dependencies.

    Those dependencies order stateful ops for execution; a graph that is only
    counted does not run, and building them is a sixth of the tracing time.
    """
    import inspect

    from tensorflow.python.framework import func_graph

    build = func_graph.func_graph_from_py_func
    parameters = inspect.signature(build).parameters
    if "signature" not in parameters or "add_control_dependencies" not in parameters:
        raise TypeError(f"func_graph_from_py_func takes {list(parameters)}")
    return build


@_probes.guarded(
    "tf.ops.flops_statistics",
    reaches="tensorflow.python.framework.ops.get_stats_for_node_def, _stats_registry",
    lost="training FLOPs cannot be counted, so no TFLOP/s or MFU",
    workaround="Pass flops_per_sample=<your count> to ThroughputLogger.",
)
def _flops_statistics():
    """TensorFlow's per-op FLOP statistics, and the op types that have one."""
    from tensorflow.python.framework import ops as tf_ops

    counted_types = frozenset(
        name.rsplit(",", 1)[0] for name in tf_ops._stats_registry.list() if name.endswith(",flops")
    )
    if not counted_types:
        raise LookupError("no op has a registered flops statistic")
    return tf_ops.get_stats_for_node_def, counted_types


# TensorFlow's own FLOP statistics (flops_registry) call this function, which
# TensorFlow deprecated: its warning is about TensorFlow's code, not the user's.
_DEPRECATED_IN_FLOPS_REGISTRY = "tensor_shape_from_node_def_name"


class _DropsWarningsNaming(logging.Filter):
    def __init__(self, name):
        super().__init__()
        self._name = name

    def filter(self, record):
        return self._name not in record.getMessage()


@contextlib.contextmanager
def _deprecation_warning_silenced(function_name):
    """Drops TensorFlow's log records that name `function_name`, within the block only."""
    tf_logger = logging.getLogger("tensorflow")
    drop = _DropsWarningsNaming(function_name)
    tf_logger.addFilter(drop)
    try:
        yield
    finally:
        tf_logger.removeFilter(drop)


def _count_graph(graph):
    """`(flops, None)` for the ops the graph's outputs depend on, or `(None, reason)`."""
    statistics = _flops_statistics()
    if statistics is None:
        from keras_scaling.internals import _versions

        return None, (
            f"TensorFlow {_versions.tf_version()} does not give the per-op FLOP "
            "statistics its profiler uses; pass flops_per_sample=<your count>"
        )
    statistics_of, counted_types = statistics
    loops, calls, uncounted, unknown = set(), set(), set(), set()
    total = 0
    with _deprecation_warning_silenced(_DEPRECATED_IN_FLOPS_REGISTRY):
        for op in _live_ops(graph):
            if op.type in _LOOP_OPS:
                loops.add(op.type)
                continue
            if op.type in _CALL_OPS:
                calls.add(op.type)
                continue
            try:
                if op.type in _STATISTICS:
                    flops = _STATISTICS[op.type](op)
                elif op.type in counted_types:
                    flops = statistics_of(graph, op.node_def, "flops").value
                else:
                    flops = None
            except ValueError:
                if op.type in _HEAVY_OPS:
                    unknown.add(op.type)
                continue
            if flops is None:
                if op.type in _HEAVY_OPS:
                    uncounted.add(op.type)
                continue
            total += int(flops)
    if loops:
        return None, (
            "the model runs a loop (While ops, as RNN layers do), and the "
            "operations inside a loop are not counted. Pass "
            "flops_per_sample=<your count> to ThroughputLogger"
        )
    if calls:
        return None, (
            f"the model calls functions ({', '.join(sorted(calls))} ops) whose "
            "operations are not counted. Pass flops_per_sample=<your count> to "
            "ThroughputLogger"
        )
    if uncounted:
        return None, (
            f"TensorFlow has no operation count for {', '.join(sorted(uncounted))}. "
            "Pass flops_per_sample=<your count> to ThroughputLogger"
        )
    if unknown:
        return None, (
            f"shapes at {', '.join(sorted(unknown))} ops are unknown; pass "
            "sample=(x, y) with one batch of the training data"
        )
    return float(total), None


def _live_ops(graph):
    """The ops whose values the loss and gradients are computed from.

    The gradient of a convolution computes its input gradient even for the
    first layer, whose input is data; nothing uses it, and TensorFlow's graph
    optimizer removes it before running, so it is not counted. Only data
    edges are followed: side effects ordered by control edges (the loss
    tracker's update, BatchNormalization's moving statistics) are not the
    model's arithmetic.
    """
    pending = [tensor.op for tensor in graph.outputs if tensor is not None]
    seen = set()
    live = []
    while pending:
        op = pending.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        live.append(op)
        pending.extend(tensor.op for tensor in op.inputs)
    return live


# Counts TensorFlow's statistics lack or get wrong: a multiply-add is 2.


def _shape(tensor):
    shape = tensor.shape
    shape.assert_is_fully_defined()
    return shape.as_list()


def _einsum_flops(op):
    equation = op.get_attr("equation").decode()
    return _einsum_count(equation, [_shape(tensor) for tensor in op.inputs])


def _einsum_count(equation, shapes):
    """Operations of `tf.einsum(equation, *operands)` with operands of `shapes`.

    Every combination of index values is one multiply-add (2 operations)
    when some index is summed over, one operation otherwise.
    """
    inputs, _, output = equation.replace(" ", "").partition("->")
    operands = inputs.split(",")
    if len(operands) != len(shapes):
        raise ValueError(f"einsum {equation!r} has {len(shapes)} operands")
    sizes: dict[str, int] = {}
    for labels, shape in zip(operands, shapes):
        head, ellipsis, tail = labels.partition("...")
        names = list(head)
        if ellipsis:
            # Broadcast dimensions line up from the right.
            count = len(shape) - len(head) - len(tail)
            names += [f"...{count - 1 - index}" for index in range(count)]
        names += list(tail)
        if len(names) != len(shape):
            raise ValueError(f"einsum {equation!r} does not match the shape {shape}")
        for name, size in zip(names, shape):
            sizes[name] = max(sizes.get(name, 1), int(size))
    summed = [name for name in sizes if len(name) == 1 and name not in output]
    if len(operands) == 1 and not summed:
        return 0
    total = math.prod(sizes.values())
    return 2 * total if summed and len(operands) > 1 else total


def _gradient_flops(out_backprop, window):
    """2 x (elements of the output gradient) x (inputs of one output element).

    The exact multiply-adds of a convolution's input or filter gradient, the
    same as its forward pass. TensorFlow's own statistics for
    `Conv2DBackpropInput` / `Conv2DBackpropFilter` multiply by the input's
    spatial size instead, which over-counts `padding="valid"` convolutions.
    """
    return 2 * math.prod(_shape(out_backprop)) * math.prod(window)


def _conv_backprop_input_flops(op):
    filter_shape = _shape(op.inputs[1])  # [spatial..., in, out]
    return _gradient_flops(op.inputs[2], filter_shape[:-1])


def _conv_backprop_filter_flops(op):
    filter_shape = _shape(op.outputs[0])
    return _gradient_flops(op.inputs[2], filter_shape[:-1])


def _depthwise_backprop_input_flops(op):
    filter_shape = _shape(op.inputs[1])  # [height, width, in, multiplier]
    return _gradient_flops(op.inputs[2], filter_shape[:2])


def _depthwise_backprop_filter_flops(op):
    filter_shape = _shape(op.outputs[0])
    return _gradient_flops(op.inputs[2], filter_shape[:2])


_STATISTICS = {
    "Einsum": _einsum_flops,
    "Conv2DBackpropInput": _conv_backprop_input_flops,
    "Conv2DBackpropFilter": _conv_backprop_filter_flops,
    "Conv3DBackpropInputV2": _conv_backprop_input_flops,
    "Conv3DBackpropFilterV2": _conv_backprop_filter_flops,
    "DepthwiseConv2dNativeBackpropInput": _depthwise_backprop_input_flops,
    "DepthwiseConv2dNativeBackpropFilter": _depthwise_backprop_filter_flops,
}
