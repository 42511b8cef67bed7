"""Model FLOPs and MFU for `ThroughputLogger`: counted and looked up once per run.

The counting is `keras_scaling.flops`', the peak figures
`keras_scaling.peak_flops`', the arithmetic `keras_scaling.utilization`'s;
this module resolves the logger's arguments into figures, and turns a
throughput into the `tflops`/`mfu` tags, record keys and set-up rows.
"""

import logging
import weakref

import tensorflow as tf

from keras_scaling import _tf_data_internals
from keras_scaling import utilization as utilization_lib

logger = logging.getLogger("keras_scaling")

# A device without a peak figure is named once per process, not once per fit.
_PEAK_REASONS_LOGGED = set()
# Counting traces the model's training graph (a fixed cost of a few hundred
# ms); a model trained again on batches of the same spec is not counted again.
_COUNTED = weakref.WeakKeyDictionary()


class ModelFlops:
    """The FLOPs of one training sample and one replica's peak, with their sources.

    Args:
        flops_per_sample: float or None.
        flops_source: str, `"counted"`, `"given"` or why there is no figure.
        peak_flops_per_replica: float or None.
        peak_source: str or None.
        faster_dtypes: list of dtypes the device runs faster than the policy's.
        num_replicas: int, the run's replicas.
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
    ):
        self.flops_per_sample = flops_per_sample
        self.flops_source = flops_source
        self.peak_flops_per_replica = peak_flops_per_replica
        self.peak_source = peak_source
        self.faster_dtypes = list(faster_dtypes)
        self.num_replicas = num_replicas

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

    def scalars(self, samples_per_sec):
        """The `throughput/tflops*` and `throughput/mfu` tags of a throughput."""
        figures = self.utilization(samples_per_sec)
        if figures is None:
            return {}
        scalars = {
            "throughput/tflops_per_sec": figures.tflops_per_sec,
            "throughput/tflops_per_sec_per_replica": figures.tflops_per_sec_per_replica,
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
            flops_text = f"{self.flops_per_sample / 1e6:.2f} M ({self.flops_source})"
        else:
            flops_text = self.flops_source or "none"
        if self.peak_flops_per_replica is not None:
            peak_text = (
                f"{self.peak_flops_per_replica / 1e12:.2f} TFLOP/s per replica ({self.peak_source})"
            )
        else:
            peak_text = self.peak_source or "none (no mfu)"
        return [("model FLOPs per sample", flops_text), ("peak FLOPs", peak_text)]


def resolve(model, *, flops_per_sample, peak_flops, one_replica_spec, setup, device):
    """Counts or takes the FLOPs per sample and looks up the peak; a `ModelFlops`.

    Never raises: a figure that cannot be had is left out with the reason.

    Args:
        model: the Keras model being trained.
        flops_per_sample: `"auto"`, a number or None (the logger's argument).
        peak_flops: `"auto"`, `"measure"`, a number or None.
        one_replica_spec: one replica's batch spec (`one_replica_spec()`).
        setup: dict with `num_replicas` and `device_kind`.
        device: str, one replica's device.
    """
    from keras_scaling import flops as flops_lib
    from keras_scaling import peak_flops as peak_lib

    resolved = ModelFlops(num_replicas=setup["num_replicas"])
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
            logger.warning("ThroughputLogger: no model FLOPs, so no tflops or mfu tags: %s", reason)
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
        if reason not in _PEAK_REASONS_LOGGED:
            _PEAK_REASONS_LOGGED.add(reason)
            logger.warning("ThroughputLogger: no throughput/mfu: %s", reason)
        resolved.peak_source = f"unknown: {reason}"
        return resolved
    resolved.peak_flops_per_replica, resolved.peak_source = peak.flops_per_sec, peak.source
    resolved.faster_dtypes = peak_lib.faster_dtypes(peak)
    return resolved


def compute_dtype(model):
    """The compute dtype of the model's dtype policy, such as `"float32"`."""
    policy = getattr(model, "dtype_policy", None)
    return str(getattr(policy, "compute_dtype", "float32"))


def one_replica_spec(element_spec, per_replica_batch_size):
    """One replica's batch spec, its batch dimension set to the known size."""

    def one(spec):
        # A PerReplicaSpec holds one spec per local replica.
        spec = _tf_data_internals.first_replica_spec(spec)
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
