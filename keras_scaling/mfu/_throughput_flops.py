"""Model FLOPs and MFU for `ThroughputLogger`: counted and looked up once per run.

The counting is `keras_scaling.flops`', the peak figures
`keras_scaling.peak_flops`', the arithmetic `keras_scaling.utilization`'s;
this module resolves the logger's arguments into figures, and turns a
throughput into the `tflops`/`mfu` tags, record keys and set-up rows.
"""

import logging
import weakref

import tensorflow as tf

from keras_scaling.internals import _tf_data
from keras_scaling.mfu import utilization as utilization_lib
from keras_scaling.throughput._dashboard import flops_text_of

logger = logging.getLogger("keras_scaling")

# Model FLOP/s in TensorBoard: GFLOP/s on CPUs, TFLOP/s on GPUs and TPUs, so
# that a chart's figures are between about 0.01 and 1000 (TensorBoard writes
# smaller and larger axis ticks in exponent notation).
_FLOPS_UNITS = {"CPU": ("gflops", 1e9), "GPU": ("tflops", 1e12), "TPU": ("tflops", 1e12)}

# A device without a peak figure is named once per process, not once per fit.
_PEAK_REASONS_LOGGED: set[str] = set()
# Counting traces the model's training graph (a fixed cost of a few hundred
# ms); a model trained again on batches of the same spec is not counted again.
_COUNTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class ModelFlops:
    """The FLOPs of one training sample and one replica's peak, with their sources.

    Args:
        flops_per_sample: float or None.
        flops_source: str, `"counted"`, `"given"` or why there is no figure.
        peak_flops_per_replica: float or None.
        peak_source: str or None.
        faster_dtypes: list of dtypes the device runs faster than the policy's.
        num_replicas: int, the run's replicas.
        device_kind: str, `"CPU"`, `"GPU"` or `"TPU"`: the unit of the FLOP/s tags.
    """

    def __init__(
        self,
        *,
        flops_per_sample=None,
        flops_source=None,
        peak_flops_per_replica=None,
        peak_source=None,
        faster_dtypes=(),
        num_replicas=1,
        device_kind="GPU",
    ):
        self.flops_per_sample = flops_per_sample
        self.flops_source = flops_source
        self.peak_flops_per_replica = peak_flops_per_replica
        self.peak_source = peak_source
        self.faster_dtypes = list(faster_dtypes)
        self.num_replicas = num_replicas
        self.device_kind = device_kind

    def utilization(self, samples_per_sec):
        """`keras_scaling.utilization.Utilization` of a throughput, or None."""
        if self.flops_per_sample is None:
            return None
        return utilization_lib.utilization(
            self.flops_per_sample,
            samples_per_sec,
            self.num_replicas,
            self.peak_flops_per_replica,
        )

    @property
    def flops_tag(self):
        """The tag of the model FLOP/s of all replicas, in this device's unit, or None."""
        if self.flops_per_sample is None:
            return None
        return f"throughput/{flops_unit(self.device_kind)[0]}_per_sec"

    @property
    def has_mfu(self):
        """Whether `throughput/mfu` is written: both FLOPs and a peak are known."""
        return self.flops_per_sample is not None and self.peak_flops_per_replica is not None

    def scalars(self, samples_per_sec):
        """The model FLOP/s tags (`flops_tag` and per replica) and `throughput/mfu`."""
        figures = self.utilization(samples_per_sec)
        if figures is None:
            return {}
        name, scale = flops_unit(self.device_kind)
        flops_per_sec = figures.tflops_per_sec * 1e12 / scale
        scalars = {
            f"throughput/{name}_per_sec": flops_per_sec,
            f"throughput/per_replica_{name}_per_sec": flops_per_sec / self.num_replicas,
        }
        if figures.mfu is not None:
            scalars["throughput/mfu"] = figures.mfu
        return scalars

    def record_fields(self, samples_per_sec):
        """The FLOPs keys of `throughput.json` for the steady-state throughput (or None)."""
        figures = self.utilization(samples_per_sec) if samples_per_sec else None
        return {
            "flops_per_sample": self.flops_per_sample,
            "flops_source": self.flops_source,
            "peak_flops_per_replica": self.peak_flops_per_replica,
            "peak_source": self.peak_source,
            "mfu": figures.mfu if figures is not None else None,
        }

    def setup_rows(self):
        """`(setting, value)` rows for the set-up table."""
        if self.flops_per_sample is not None:
            flops_text = f"{flops_text_of(self.flops_per_sample)} ({self.flops_source})"
        else:
            flops_text = self.flops_source or "none"
        if self.peak_flops_per_replica is not None:
            peak_text = (
                f"{flops_text_of(self.peak_flops_per_replica, '/s')} per replica "
                f"({self.peak_source})"
            )
        else:
            peak_text = self.peak_source or "none (no MFU)"
        return [("model FLOPs per sample", flops_text), ("peak FLOP/s", peak_text)]


def flops_unit(device_kind):
    """`(name, scale)` of the model FLOP/s tags on a device kind: `("gflops", 1e9)` on CPUs."""
    return _FLOPS_UNITS.get(device_kind, _FLOPS_UNITS["GPU"])


def resolve(
    model, *, flops_per_sample, peak_flops, one_replica_spec, setup, device, command_line=False
):
    """Counts or takes the FLOPs per sample and looks up the peak; a `ModelFlops`.

    Never raises: a figure that cannot be had is left out with the reason.
    With `command_line=True` (`keras-scaling bench`), the reason names the
    command line's options (`--peak-flops measure`) instead of Python's.

    Args:
        model: the Keras model being trained.
        flops_per_sample: `"auto"`, a number or None (the logger's argument).
        peak_flops: `"auto"`, `"measure"`, a number or None.
        one_replica_spec: one replica's batch spec (`one_replica_spec()`).
        setup: dict with `num_replicas` and `device_kind`.
        device: str, one replica's device.
    """
    from keras_scaling.mfu import flops as flops_lib
    from keras_scaling.mfu import peak_flops as peak_lib

    resolved = ModelFlops(num_replicas=setup["num_replicas"], device_kind=setup["device_kind"])
    if flops_per_sample is None:
        resolved.flops_source = "off (flops_per_sample=None)"
    elif flops_per_sample != "auto":
        resolved.flops_per_sample, resolved.flops_source = flops_per_sample, "given"
    else:
        sample = _training_sample(one_replica_spec)
        key = repr(sample)
        if key in _COUNTED.get(model, {}):
            counted, reason = _COUNTED[model][key]
        else:
            try:
                counted, reason = flops_lib.count_training_flops(model, sample=sample)
            except Exception as error:  # counting must never stop training
                counted, reason = None, f"{type(error).__name__}: {error}"
            _COUNTED.setdefault(model, {})[key] = (counted, reason)
        if counted is None:
            logger.warning("ThroughputLogger: no model FLOPs, so no FLOP/s or MFU tags: %s", reason)
            resolved.flops_source = f"not counted: {reason}"
        else:
            resolved.flops_per_sample, resolved.flops_source = counted, "counted"
    if peak_flops is None or resolved.flops_per_sample is None:
        return resolved
    try:
        peak, reason = peak_lib.resolve(
            peak_flops,
            device_kind=setup["device_kind"],
            device=device,
            compute_dtype=compute_dtype(model),
        )
    except Exception as error:  # a failed lookup must never stop training
        peak, reason = None, f"{type(error).__name__}: {error}"
    if peak is None:
        if command_line:
            reason = _as_command_line(reason)
        if reason not in _PEAK_REASONS_LOGGED:
            _PEAK_REASONS_LOGGED.add(reason)
            # No datasheet gives a CPU's peak: on a CPU that is the expected
            # case, said in the set-up table; an unknown GPU is worth a warning.
            level = logging.INFO if setup["device_kind"] == "CPU" else logging.WARNING
            logger.log(level, "ThroughputLogger: no MFU (throughput/mfu): %s", reason)
        resolved.peak_source = f"unknown: {reason}"
        return resolved
    resolved.peak_flops_per_replica, resolved.peak_source = peak.flops_per_sec, peak.source
    resolved.faster_dtypes = peak_lib.faster_dtypes(peak)
    return resolved


def _as_command_line(reason):
    """A reason that names `peak_flops=` as `keras-scaling bench`'s `--peak-flops` option."""
    return reason.replace("peak_flops='measure'", "--peak-flops measure").replace(
        "peak_flops=<", "--peak-flops <"
    )


def compute_dtype(model):
    """The compute dtype of the model's dtype policy, such as `"float32"`."""
    policy = getattr(model, "dtype_policy", None)
    return str(getattr(policy, "compute_dtype", "float32"))


def one_replica_spec(element_spec, per_replica_batch_size):
    """One replica's batch spec, its batch dimension set to the known size."""

    def one(spec):
        # A PerReplicaSpec holds one spec per local replica.
        spec = _tf_data.first_replica_spec(spec)
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
            shape = [per_replica_batch_size] + spec.shape.as_list()[1:]
            return tf.TensorSpec(shape, spec.dtype, spec.name)
        return spec

    return tf.nest.map_structure(one, element_spec)


def _training_sample(spec):
    """`(x, y, sample_weight)` of a one-replica spec, for counting FLOPs."""
    if isinstance(spec, dict) or not isinstance(spec, (tuple, list)):
        return spec
    return tuple(spec)
