"""Model FLOPs and MFU for `ThroughputLogger`: its arguments resolved once per run into tags and rows."""

import dataclasses
import logging
import weakref

import tensorflow as tf

from keras_scaling.internals import _tf_data
from keras_scaling.mfu import flops as flops_lib
from keras_scaling.mfu import peak_flops as peak_lib
from keras_scaling.mfu import utilization as utilization_lib
from keras_scaling.throughput._dashboard import flops_text_of

logger = logging.getLogger("keras_scaling")
# A device without a peak figure is named once per process, not once per fit.
_PEAK_REASONS_LOGGED: set[str] = set()


@dataclasses.dataclass
class ModelFlops:
    """The FLOPs of one training sample and one replica's peak, with their sources."""

    flops_per_sample: float | None = None
    flops_source: str | None = None  # "counted", "given", or why there is no figure
    peak_flops_per_replica: float | None = None
    peak_source: str | None = None
    faster_dtypes: list = dataclasses.field(default_factory=list)
    num_replicas: int = 1
    device_kind: str = "GPU"  # the unit of the FLOP/s tags

    def utilization(self, samples_per_sec):
        """`keras_scaling.utilization.Utilization` of a throughput, or None."""
        if self.flops_per_sample is None:
            return None
        return utilization_lib.utilization(
            self.flops_per_sample, samples_per_sec, self.num_replicas, self.peak_flops_per_replica
        )

    @property
    def _unit(self):
        # GFLOP/s on CPUs keeps figures within 0.01-1000, where TensorBoard's ticks are plain.
        return ("gflops", 1e9) if self.device_kind == "CPU" else ("tflops", 1e12)

    @property
    def flops_tag(self):
        """The tag of the model FLOP/s of all replicas, or None."""
        return None if self.flops_per_sample is None else f"throughput/{self._unit[0]}_per_sec"

    @property
    def has_mfu(self):
        return self.flops_per_sample is not None and self.peak_flops_per_replica is not None

    def scalars(self, samples_per_sec):
        """The model FLOP/s tags (all replicas and per replica) and `throughput/mfu`."""
        figures = self.utilization(samples_per_sec)
        if figures is None:
            return {}
        name, scale = self._unit
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
        names = ("flops_per_sample", "flops_source", "peak_flops_per_replica", "peak_source")
        fields = {name: getattr(self, name) for name in names}
        return {**fields, "mfu": figures.mfu if figures is not None else None}

    def setup_rows(self):
        """`(setting, value)` rows for the set-up table."""
        flops_text = self.flops_source or "none"
        if self.flops_per_sample is not None:
            flops_text = f"{flops_text_of(self.flops_per_sample)} ({self.flops_source})"
        peak_text = self.peak_source or "none (no MFU)"
        if self.peak_flops_per_replica is not None:
            peak = flops_text_of(self.peak_flops_per_replica, "/s")
            peak_text = f"{peak} per replica ({self.peak_source})"
        return [("model FLOPs per sample", flops_text), ("peak FLOP/s", peak_text)]


_COUNTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_OWN_TRAIN_STEP = (
    "the model's own train_step decides what a step computes (a GAN steps two networks), "
    "and the count would trace only model(x) and its compiled loss; "
    "pass flops_per_sample=<your count> to ThroughputLogger"
)


def _has_own_train_step(model):
    import keras

    return getattr(type(model), "train_step", None) is not keras.Model.train_step


def resolve(
    model, *, flops_per_sample, peak_flops, one_replica_spec, setup, device, command_line=False
):
    """A `ModelFlops`; never raises: a missing figure's reason names the fix (bench's with `command_line`)."""
    resolved = ModelFlops(num_replicas=setup["num_replicas"], device_kind=setup["device_kind"])
    if flops_per_sample != "auto":
        resolved.flops_per_sample = flops_per_sample
        given = flops_per_sample is not None
        resolved.flops_source = "given" if given else "off (flops_per_sample=None)"
    else:
        sample = one_replica_spec
        sample = tuple(sample) if isinstance(sample, list) else sample  # (x, y, sample_weight)
        # Counting traces the model's training graph, tens of milliseconds: once
        # per model, sample and loss, not at every fit.
        key = (repr(sample), repr(getattr(model, "loss", None)), type(model.optimizer).__name__)
        counted = _COUNTED.setdefault(model, {})
        if key not in counted and _has_own_train_step(model):
            counted[key] = (None, _OWN_TRAIN_STEP)
        if key not in counted:
            try:
                counted[key] = flops_lib.count_training_flops(model, sample=sample)
            except Exception as error:  # counting must never stop training
                counted[key] = (None, f"{type(error).__name__}: {error}")
        resolved.flops_per_sample, reason = counted[key]
        resolved.flops_source = "counted" if reason is None else f"not counted: {reason}"
        if reason is not None:
            logger.warning("ThroughputLogger: no model FLOPs, so no FLOP/s or MFU tags: %s", reason)
    if peak_flops is None or resolved.flops_per_sample is None:
        return resolved
    kind, dtype = setup["device_kind"], compute_dtype(model)
    try:
        peak, reason = peak_lib.resolve(
            peak_flops, device_kind=kind, device=device, compute_dtype=dtype
        )
    except Exception as error:  # a failed lookup must never stop training
        peak, reason = None, f"{type(error).__name__}: {error}"
    if peak is not None:
        resolved.peak_flops_per_replica, resolved.peak_source = peak.flops_per_sec, peak.source
        resolved.faster_dtypes = peak_lib.faster_dtypes(peak)
        return resolved
    reason = _as_command_line(str(reason)) if command_line else str(reason)
    if reason not in _PEAK_REASONS_LOGGED:
        _PEAK_REASONS_LOGGED.add(reason)
        # No datasheet gives a CPU's peak: expected there, and said in the set-up table.
        level = logging.INFO if kind == "CPU" else logging.WARNING
        logger.log(level, "ThroughputLogger: no MFU (throughput/mfu): %s", reason)
    resolved.peak_source = f"unknown: {reason}"
    return resolved


def _as_command_line(reason):
    return reason.replace("peak_flops='measure'", "--peak-flops measure").replace(
        "peak_flops=<", "--peak-flops <"
    )


def compute_dtype(model):
    """The compute dtype of the model's dtype policy, such as `"float32"`."""
    return str(getattr(getattr(model, "dtype_policy", None), "compute_dtype", "float32"))


def one_replica_spec(element_spec, per_replica_batch_size):
    """One replica's batch spec, its batch dimension set to the known size."""

    def one(spec):
        spec = _tf_data.first_replica_spec(spec)
        if isinstance(spec, tf.TensorSpec) and spec.shape.rank:
            shape = [per_replica_batch_size] + spec.shape.as_list()[1:]
            return tf.TensorSpec(shape, spec.dtype, spec.name)
        return spec

    return tf.nest.map_structure(one, element_spec)
