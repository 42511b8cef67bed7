"""The advice `ThroughputLogger` gives: pure functions from figures to sentences (None: nothing to say)."""

import math

from keras_scaling.mfu.utilization import underuse_advice

# Shorter steps are dominated by the loop's fixed cost per call (Python,
# callbacks, dispatch), which steps_per_execution amortises.
SHORT_STEP_S = 0.005
LOW_EFFICIENCY = 0.8
# An input pipeline this much faster than training is not the bottleneck.
_INPUT_HEADROOM = 1.2


def short_steps(step_time_s, steps_per_execution):
    """Advice to run several steps per call when steps are very short."""
    if steps_per_execution != 1 or step_time_s >= SHORT_STEP_S:
        return None
    return f"steps take {step_time_s * 1e3:.2f} ms, so the training loop's fixed cost per call is a large share of each step. Run several steps per call: model.compile(..., steps_per_execution={max(2, math.ceil(0.02 / step_time_s))})."


def low_efficiency(
    figures, samples_per_sec, input_samples_per_sec, input_reason, *, host_cpu_replicas
):
    """Why scaling efficiency is low, given the input pipeline's own rate (None: not timed, and why)."""
    if figures.ideal_speedup <= 1 or figures.efficiency >= LOW_EFFICIENCY:
        return None
    if input_samples_per_sec is None:
        diagnosis = f"The input pipeline could not be timed alone ({input_reason})."
    else:
        rate = f"The input pipeline alone yields {input_samples_per_sec:.0f} samples/sec"
        if input_samples_per_sec < _INPUT_HEADROOM * samples_per_sec:
            diagnosis = f"{rate}, barely more than training takes ({samples_per_sec:.0f})."
        else:
            diagnosis = f"{rate}, well above the {samples_per_sec:.0f} training takes."
    diagnosis += " To see where each step's time goes (input, compute, synchronizing the replicas, the loop's cost per call) and the fix, run keras_scaling.explain(model, data) or `keras-scaling bench --explain`."
    if host_cpu_replicas:
        diagnosis += " The replicas are CPU devices of one host, which share its cores: they speed up only as far as free cores allow."
    return f"scaling efficiency is {figures.efficiency:.2f} (speedup {figures.speedup:.2f} of an ideal {figures.ideal_speedup:.2f}). {diagnosis}"


def shared_cores_baseline(num_replicas):
    """What a baseline measured in-process on logical CPUs means, and what to use instead."""
    return f"the baseline ran one replica with all of the host's cores, while the {num_replicas} logical CPU replicas of this run share those cores, so speedup and efficiency here understate what as many real devices would give. For device-like figures run `keras-scaling bench --cpu-devices {num_replicas}`, which gives each replica a thread pool of its own."


def due(given, *, steady, figures, utilization, input_samples_per_sec, **run):
    """The `(kind, text)` advice not given yet (kinds: short_steps, low_efficiency, underused).

    `input_samples_per_sec()` times the pipeline: called only when the advice needs it.
    """
    advice = {}
    if "short_steps" not in given:
        advice["short_steps"] = short_steps(steady.step_time_p50_s, run["steps_per_execution"])
    efficiency = None if figures is None else figures.efficiency
    if "low_efficiency" not in given and efficiency is not None and efficiency < LOW_EFFICIENCY:
        rate, reason = input_samples_per_sec()
        host_cpu_replicas = run["host_cpu_replicas"]
        advice["low_efficiency"] = low_efficiency(
            figures, steady.samples_per_sec, rate, reason, host_cpu_replicas=host_cpu_replicas
        )
    mfu = getattr(utilization, "mfu", None)
    if "underused" not in given and efficiency is not None and mfu is not None:
        keys = ("per_replica_batch_size", "compute_dtype", "faster_dtypes")
        arguments = dict(efficiency=efficiency, mfu=mfu, **{key: run[key] for key in keys})
        if underuse_advice(**arguments) is not None:  # only then is the input timed
            advice["underused"] = underuse_advice(
                **arguments,
                input_samples_per_sec=input_samples_per_sec()[0],
                samples_per_sec=steady.samples_per_sec,
            )
    return [(kind, text) for kind, text in advice.items() if text is not None]
