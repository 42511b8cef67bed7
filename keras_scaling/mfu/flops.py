"""The floating-point operations of one training sample, counted from the traced graph (see docs/guides/flops.md)."""

import logging
import math
from typing import Any

import keras
import tensorflow as tf

from keras_scaling import _threads
from keras_scaling.internals import _probes, _tf_data

__all__ = ["count_training_flops", "training_flops_per_sample"]

logger = logging.getLogger("keras_scaling")

# The batch traced when neither the sample nor the model fixes one.
_DEFAULT_BATCH_SIZE = 8
# Ops that run functions whose ops are not in the graph's own op list.
_LOOP_OPS = {"While", "StatelessWhile"}
_CALL_OPS = set("If StatelessIf Case StatelessCase PartitionedCall StatefulPartitionedCall".split())
# Ops whose cost dominates a step; one without statistics makes a count wrong.
_HEAVY_OPS = set(
    """MatMul BatchMatMul BatchMatMulV2 BatchMatMulV3 Einsum Conv2D Conv2DBackpropInput
    Conv2DBackpropFilter Conv2DBackpropInputV2 Conv2DBackpropFilterV2 Conv Conv3D
    Conv3DBackpropInputV2 Conv3DBackpropFilterV2 DepthwiseConv2dNative
    DepthwiseConv2dNativeBackpropInput DepthwiseConv2dNativeBackpropFilter CudnnRNN CudnnRNNV2
    CudnnRNNV3 CudnnRNNBackprop CudnnRNNBackpropV2 CudnnRNNBackpropV3 XlaDot XlaDotV2 XlaConv
    XlaConvV2 XlaEinsum FFT FFT2D FFT3D IFFT IFFT2D IFFT3D MatrixInverse MatrixSolve Cholesky
    Qr Svd SelfAdjointEigV2""".split()
)
# What every refusal ends with: the way around it.
_PASS_COUNT = "pass flops_per_sample=<your count> to ThroughputLogger"
_PASS_SAMPLE = "pass sample=(x, y) with one batch of the training data"
# Why a count is refused, in the order the reasons are given.
_REFUSALS = {
    "loop": f"the model runs a loop (While ops, as RNN layers do), and the operations inside a loop are not counted; {_PASS_COUNT}",
    "call": f"the model calls functions ({{}} ops) whose operations are not counted; {_PASS_COUNT}",
    "uncounted": f"TensorFlow has no operation count for {{}}; {_PASS_COUNT}",
    "unknown": f"shapes at {{}} ops are unknown; {_PASS_SAMPLE}",
}


def training_flops_per_sample(model: keras.Model, *, sample: Any = None) -> float | None:
    """Floating-point operations of one training sample: forward, loss and weight gradients.

    A multiply-add counts 2; the optimizer update is not counted; nothing runs.

    Args:
        model: a built `keras.Model`; uncompiled, the gradients of its output sum are counted.
        sample: one batch, `(x, y)`, `(x, y, sample_weight)` or `x` (arrays, tensors or
            `tf.TensorSpec`), for shapes that are not static or a target that is neither
            floats shaped like the output nor integer labels. A batch of None is traced as 8.

    Returns:
        float, or None (the reason logged) when the count would be wrong: loops such
        as RNN layers, function calls, unknown shapes.

    Raises:
        TypeError: `model` is not a `keras.Model`.

    Example:

    ```python
    from keras_scaling import flops
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    model.compile(optimizer="sgd", loss="mse")
    flops.training_flops_per_sample(model)   # 31449.625
    ```
    """
    flops_per_sample, reason = count_training_flops(model, sample=sample)
    if flops_per_sample is None:
        logger.warning("keras_scaling.flops: not counted: %s", reason)
    return flops_per_sample


def count_training_flops(
    model: keras.Model, *, sample: Any = None
) -> tuple[float, None] | tuple[None, str]:
    """The count of `training_flops_per_sample`, with the reason it failed instead of a log.

    Args:
        model: a built `keras.Model`.
        sample: one batch, as for `training_flops_per_sample`.

    Returns:
        `(flops_per_sample, None)` or `(None, reason)`.

    Raises:
        TypeError: `model` is not a `keras.Model`.

    Example:

    ```python
    from keras_scaling import flops
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    flops.count_training_flops(model)   # (50.625, None)
    ```
    """
    if not isinstance(model, keras.Model):
        raise TypeError(f"model must be a keras.Model, got {type(model).__name__}: {model!r}")
    try:
        candidates = _sample_specs(model, sample)
    except ValueError as error:
        return None, str(error)
    trace_error = ""
    for specs in candidates:
        if _batch_size_of(specs) is None:
            return None, f"the sample has no batch dimension; {_PASS_SAMPLE}"
        try:
            graph = _training_graph(model, specs)
        except Exception as error:  # a wrong guess of the target: the next guess
            trace_error = f"{type(error).__name__}: {error}"
            continue
        flops, reason = _count_graph(graph)
        return (None, reason) if flops is None else (flops / _batch_size_of(specs), None)
    return None, f"the loss and gradients could not be traced ({trace_error}); {_PASS_SAMPLE}"


def _batch_size_of(specs):
    sizes = [s.shape[0] for s in tf.nest.flatten(specs) if s is not None and s.shape.rank]
    return int(sizes[0]) if sizes else None


def _sample_specs(model, sample):
    """Candidate `(x, y, sample_weight)` specs with static shapes to trace."""
    if sample is not None:
        parts = tuple(sample) if isinstance(sample, tuple) and 1 < len(sample) <= 3 else (sample,)
        parts += (None,) * (3 - len(parts))
        specs = [p if p is None else tf.nest.map_structure(_spec_of, p) for p in parts]
        return [_with_static_batch(specs)]
    if not getattr(model, "inputs", None) or not getattr(model, "outputs", None):
        message = f"{type(model).__name__} has no symbolic inputs and outputs, so the shapes to trace are unknown; {_PASS_SAMPLE}"
        raise ValueError(message)
    x = [_spec_of(t) for t in model.inputs]
    outputs = [_spec_of(t) for t in model.outputs]
    floats = [tf.TensorSpec(spec.shape, "float32") for spec in outputs]
    labels = [tf.TensorSpec(spec.shape[:-1], "int32") for spec in outputs]
    # Each guess of the target costs a trace, so the likelier one goes first.
    sparse = "sparse" in repr(getattr(model, "loss", None)).lower()
    x = x[0] if len(x) == 1 else x
    return [
        _with_static_batch([x, y[0] if len(y) == 1 else y, None])
        for y in ([labels, floats] if sparse else [floats, labels])
    ]


def _spec_of(value):
    value = _tf_data.first_replica_spec(value)  # of a PerReplicaSpec
    if isinstance(value, tf.TensorSpec):
        return value
    shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
    if shape is None or dtype is None:
        raise ValueError(f"sample holds a {type(value).__name__}, not an array; {_PASS_SAMPLE}")
    return tf.TensorSpec(tuple(shape), tf.as_dtype(str(getattr(dtype, "name", dtype))))


def _with_static_batch(specs):
    """Sets an unknown batch dimension; refuses other unknown dimensions."""
    flat = [spec for spec in tf.nest.flatten(specs) if spec is not None]
    known = {spec.shape[0] for spec in flat if spec.shape.rank} - {None}
    if len(known) > 1:
        raise ValueError(f"the sample's parts have different batch sizes {sorted(known)}")
    batch_size = known.pop() if known else _DEFAULT_BATCH_SIZE

    def fix(spec):
        if spec is None or not spec.shape.rank:
            return spec
        if None in spec.shape.as_list()[1:]:
            raise ValueError(f"an input has unknown dimensions {spec.shape}; {_PASS_SAMPLE}")
        return tf.TensorSpec([batch_size] + spec.shape.as_list()[1:], spec.dtype)

    return tf.nest.map_structure(fix, specs)


def _training_graph(model, specs):
    """The graph of the loss and gradients, traced outside the (thread-local) strategy scope."""
    given = [index for index, spec in enumerate(specs) if spec is not None]

    def loss_and_gradients(*tensors):
        x, y, sample_weight = [dict(zip(given, tensors)).get(index) for index in range(3)]
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            if getattr(model, "compiled", False):
                loss = model.compute_loss(
                    x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True
                )
            else:
                loss = tf.add_n([tf.reduce_sum(t) for t in tf.nest.flatten(y_pred)])
        return loss, tape.gradient(loss, model.trainable_variables)

    function = tf.function(loss_and_gradients, autograph=False)
    signature = [specs[index] for index in given]
    return _threads.run_outside_strategy(
        lambda: function.get_concrete_function(*signature).graph, "flops"
    )


@_probes.guarded(
    "tf.ops.flops_statistics",
    reaches="tensorflow.python.framework.ops.get_stats_for_node_def, _stats_registry",
    lost="training FLOPs cannot be counted, so no TFLOP/s or MFU",
    workaround="Pass flops_per_sample=<your count> to ThroughputLogger.",
)
def _flops_statistics():
    """TensorFlow's per-op FLOP statistics, and the op types that have one."""
    from tensorflow.python.framework import ops as tf_ops

    registered = tf_ops._stats_registry.list()
    counted_types = {name.rsplit(",", 1)[0] for name in registered if name.endswith(",flops")}
    if not counted_types:
        raise _probes.ReachError("no op has a registered flops statistic")
    return tf_ops.get_stats_for_node_def, counted_types


def _drops_deprecation_warning(record):
    return "tensor_shape_from_node_def_name" not in record.getMessage()


def _count_graph(graph):
    """`(flops, None)` for the ops the graph's outputs depend on, or `(None, reason)`."""
    statistics = _flops_statistics()
    if statistics is None:
        return None, f"TensorFlow gives no per-op FLOP statistics; {_PASS_COUNT}"
    statistics_of, counted_types = statistics
    refused: dict[str, set] = {kind: set() for kind in _REFUSALS}
    total = 0
    # TensorFlow's own flops_registry calls a function TensorFlow deprecated: not the user's concern.
    logging.getLogger("tensorflow").addFilter(_drops_deprecation_warning)
    for op in _live_ops(graph):
        if op.type in _LOOP_OPS or op.type in _CALL_OPS:
            refused["loop" if op.type in _LOOP_OPS else "call"].add(op.type)
            continue
        try:
            count = _STATISTICS.get(op.type)
            flops = count(op) if count else None
            if count is None and op.type in counted_types:
                flops = statistics_of(graph, op.node_def, "flops").value
        except ValueError:  # a shape TensorFlow could not infer
            flops, refused_as = None, "unknown"
        else:
            refused_as = "uncounted"
        if flops is not None:
            total += int(flops)
        elif op.type in _HEAVY_OPS:
            refused[refused_as].add(op.type)
    for kind, reason in _REFUSALS.items():
        if refused[kind]:
            return None, reason.format(", ".join(sorted(refused[kind])))
    return float(total), None


def _live_ops(graph):
    """The ops the outputs depend on by data edges: Grappler prunes the rest, and side effects are not the model's."""
    pending = [tensor.op for tensor in graph.outputs if tensor is not None]
    live = {}
    while pending:
        op = pending.pop()
        if op.name not in live:
            live[op.name] = op
            pending.extend(tensor.op for tensor in op.inputs)
    return list(live.values())


def _shape(tensor):
    tensor.shape.assert_is_fully_defined()
    return tensor.shape.as_list()


def _einsum_flops(op):
    """Every combination of index values: a multiply-add (2) when an index is summed."""
    inputs, _, output = op.get_attr("equation").decode().replace(" ", "").partition("->")
    operands = inputs.split(",")
    sizes: dict[str, int] = {}
    for labels, tensor in zip(operands, op.inputs):
        head, _, tail = labels.partition("...")
        shape = _shape(tensor)
        for label, size in [*zip(head, shape), *zip(tail, shape[len(shape) - len(tail) :])]:
            sizes[label] = max(sizes.get(label, 1), size)  # broadcast
    summed = [size for label, size in sizes.items() if label not in output]
    if len(operands) == 1 and not summed:
        return 0
    total = math.prod(_shape(op.outputs[0])) * math.prod(summed)
    return 2 * total if summed and len(operands) > 1 else total


def _gradient_flops(window_of, filter_is_output):
    """2 x output gradient x window, as the forward (TensorFlow over-counts `padding="valid"`)."""

    def count(op):
        filter_shape = _shape(op.outputs[0] if filter_is_output else op.inputs[1])
        return 2 * math.prod(_shape(op.inputs[2])) * math.prod(window_of(filter_shape))

    return count


# Counts TensorFlow's statistics lack or get wrong. A convolution's filter is
# [spatial..., in, out], a depthwise one's [height, width, in, multiplier].
_STATISTICS = {"Einsum": _einsum_flops}
for _name, _window_of in (
    ("Conv2DBackprop{}", lambda shape: shape[:-1]),
    ("Conv3DBackprop{}V2", lambda shape: shape[:-1]),
    ("DepthwiseConv2dNativeBackprop{}", lambda shape: shape[:2]),
):
    for _part in ("Input", "Filter"):
        _STATISTICS[_name.format(_part)] = _gradient_flops(_window_of, _part == "Filter")
