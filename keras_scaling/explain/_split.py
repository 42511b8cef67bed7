"""The arithmetic of `explain`: variants' timings in, the step's split and verdict out (formulas: docs/guides/explain.md)."""

import dataclasses
import math
import statistics

PARTS = ("input", "compute", "synchronization", "host")
_MINOR_SHARE = 0.2  # below it, a part is not worth a remedy
_TARGET_HOST_SHARE = 0.05  # what the advised steps_per_execution aims for


@dataclasses.dataclass(frozen=True)
class Timing:
    """One variant's step time of each round, seconds."""

    step_times_s: tuple

    @property
    def best_s(self):
        return min(self.step_times_s)

    @property
    def median_s(self):
        return statistics.median(self.step_times_s)

    @property
    def noise_s(self):
        """Half the range over rounds."""
        return (max(self.step_times_s) - min(self.step_times_s)) / 2

    def to_json(self):
        figures = {"best_s": self.best_s, "median_s": self.median_s, "noise_s": self.noise_s}
        return {**figures, "step_times_s": list(self.step_times_s)}


def timing(step_times_s, *, zero_allowed=False):
    """A `Timing`; ValueError on none or a negative one (zero too unless `zero_allowed`)."""
    step_times_s = tuple(float(value) for value in step_times_s)
    if not step_times_s:
        raise ValueError("step_times_s must hold at least one round's step time")
    if not all(math.isfinite(t) and (t > 0 or zero_allowed and t == 0) for t in step_times_s):
        what = "seconds >= 0" if zero_allowed else "positive seconds"
        raise ValueError(f"step times must be {what}, got {list(step_times_s)}")
    return Timing(step_times_s)


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the step; `saved_s`: how much shorter the step would be without it."""

    name: str
    time_s: float
    share: float
    noise_s: float
    saved_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Split:
    """The step at S, its `parts` in `PARTS` order, and the `rest_s` they leave."""

    step_s: float
    parts: tuple
    rest_s: float
    host_per_call_s: float
    steps_per_execution: int
    amortized_steps_per_execution: int
    input_free_step_s: float | None = None
    pipeline_batch_s: float | None = None

    def part(self, name):
        return next(part for part in self.parts if part.name == name)

    @property
    def rest_share(self):
        return self.rest_s / self.step_s

    def host_share_at(self, steps_per_execution):
        """The host share at another `steps_per_execution` (host time scales as its inverse)."""
        host_s = self.host_per_call_s / steps_per_execution
        other_s = max(0.0, self.step_s - self.part("host").time_s)
        return host_s / (other_s + host_s)


def split_step(
    *,
    real,
    resident,
    resident_amortized,
    one_replica,
    steps_per_execution,
    amortized,
    input_wait=None,
    pipeline_batch_s=None,
):
    """The `Split` from the variants' `Timing`s (`input_wait` None: `real - resident`).

    Example: `real` 10 ms, `resident` 6 ms, `resident_amortized` 4 ms at
    K=4 with S=1, `one_replica` 3 ms: host 2 / (1 - 1/4) = 2.67 ms, input
    4, synchronization 1, compute 3 - 0.67 = 2.33: 10 ms in all.
    """
    if amortized <= steps_per_execution:
        raise ValueError(
            f"amortized steps_per_execution must exceed {steps_per_execution}, got {amortized}"
        )
    step_s = real.median_s
    per_call = 1 / steps_per_execution - 1 / amortized
    host_per_call_s = max(0.0, (resident.median_s - resident_amortized.median_s) / per_call)
    input_part = (real.median_s - resident.median_s, real.noise_s + resident.noise_s)
    raw = {
        "input": input_part if input_wait is None else (input_wait.median_s, input_wait.noise_s),
        "host": (
            host_per_call_s / steps_per_execution,
            (resident.noise_s + resident_amortized.noise_s) / (per_call * steps_per_execution),
        ),
        "synchronization": (
            resident_amortized.median_s - one_replica.median_s,
            resident_amortized.noise_s + one_replica.noise_s,
        ),
        "compute": (one_replica.median_s - host_per_call_s / amortized, one_replica.noise_s),
    }
    # Noise can make a difference negative or larger than the step.
    times_s = {name: min(max(0.0, raw[name][0]), step_s) for name in PARTS}
    lead_s = max(0.0, step_s - times_s["input"] - (pipeline_batch_s or 0.0))
    parts = tuple(
        Part(name, t, t / step_s, raw[name][1], t if name == "input" else min(t, lead_s))
        for name, t in times_s.items()
    )
    return Split(
        step_s=step_s,
        parts=parts,
        rest_s=step_s - sum(part.time_s for part in parts),
        host_per_call_s=host_per_call_s,
        steps_per_execution=steps_per_execution,
        amortized_steps_per_execution=amortized,
        input_free_step_s=resident.median_s,
        pipeline_batch_s=pipeline_batch_s,
    )


def implied_input_share(pipeline_samples_per_sec, global_batch_size, resident_step_s):
    """The input share a pipeline's own rate implies when it overlaps training fully.

    Example: 64 samples at 3,200 samples/s take 20 ms; trained in 5 ms: 0.75.
    """
    batch_time_s = global_batch_size / pipeline_samples_per_sec
    return max(0.0, 1 - resident_step_s / batch_time_s)


def advised_steps_per_execution(split, target_share=_TARGET_HOST_SHARE):
    """The smallest power of two (<= 1024, >= 2 S) bringing the host share under `target_share`."""
    candidate = 1
    while candidate < 1024 and split.host_share_at(candidate) > target_share:
        candidate *= 2
    return max(candidate, split.steps_per_execution * 2)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """`bound` (of `PARTS`), `confidence` ("clear", "likely", "uncertain"), the fix's `text`."""

    bound: str
    confidence: str
    text: str
    notes: tuple = ()


def _confidence(first, second):
    margin_s, noise_s = first.saved_s - second.saved_s, first.noise_s + second.noise_s
    if margin_s > 2 * noise_s:
        return "clear", None
    if margin_s > noise_s:
        return "likely", None
    note = f"freeing {first.name} would save {first.saved_s * 1e3:.2f} ms and {second.name} {second.saved_s * 1e3:.2f} ms: within noise of each other; more steps or rounds narrow it"
    return "uncertain", note


def _counterfactual_doubt(split, first, second):
    """A note when the step on a resident batch (the input free) contradicts the wait."""
    if split.input_free_step_s is None:
        return None
    freed_s = split.step_s - split.input_free_step_s
    tolerance_s = first.noise_s + second.noise_s + 0.1 * split.step_s
    if first.name == "input" and freed_s + tolerance_s < first.saved_s:
        found = f"only {max(0.0, freed_s) * 1e3:.2f} ms"
    elif first.name != "input" and freed_s > first.saved_s + tolerance_s:
        found = f"{freed_s * 1e3:.2f} ms"
    else:
        return None
    waited_ms = split.part("input").time_s * 1e3
    return f"the run waits {waited_ms:.2f} ms per step for its next batch, and the step on a resident batch is {found} shorter: the two measurements disagree; more steps or rounds narrow it"


def _rates_note(bound, pipeline_samples_per_sec, training_samples_per_sec):
    """A note when the pipeline's rate alone points elsewhere than the wait, else None."""
    if not pipeline_samples_per_sec or not training_samples_per_sec:
        return None
    rates = f"alone, the pipeline gives {pipeline_samples_per_sec:,.0f} samples/s and training takes {training_samples_per_sec:,.0f} with the input free"
    if bound == "input" and pipeline_samples_per_sec > 1.2 * training_samples_per_sec:
        return f"{rates}, yet the run waits for them: beside training the pipeline slows down"
    if bound != "input" and 1.2 * pipeline_samples_per_sec < training_samples_per_sec:
        return f"{rates}, yet the run hardly waits for them; check with more steps"
    return None


def _percent(share):
    return f"{share * 100:.0f}%"


def verdict(
    split,
    *,
    num_replicas,
    global_batch_size,
    pipeline_samples_per_sec=None,
    training_samples_per_sec=None,
    mfu=None,
    mfu_reason=None,
    efficient_per_replica_batch=None,
    per_replica_batch_size=None,
    host_cpu_replicas=False,
    cpu_cores=None,
    compute_dtype=None,
):
    """The `Verdict` of a `Split`: the part with the largest `saved_s`, how sure (its margin over the next against their noise), and notes."""
    ranked = sorted(split.parts, key=lambda part: (part.saved_s, part.time_s), reverse=True)
    first, second = ranked[0], ranked[1]
    confidence, doubt = _confidence(first, second)
    contradiction = _counterfactual_doubt(split, first, second)
    confidence = "uncertain" if contradiction else confidence
    share = _percent(first.share)
    if first.name == "input":
        rates = "the replicas wait for data"
        if pipeline_samples_per_sec is not None and training_samples_per_sec is not None:
            rates = f"the pipeline gives {pipeline_samples_per_sec:,.0f} samples/s across workers and training takes {training_samples_per_sec:,.0f}"
        text = f"input-bound: input is {share} of the step ({first.saved_s * 1e3:.2f} ms shorter without it); {rates}: parallel `map` (num_parallel_calls=tf.data.AUTOTUNE), `cache`, more reader files or the tf.data service."
    elif first.name == "synchronization":
        now = f" (now {per_replica_batch_size})" if per_replica_batch_size else ""
        batch = f"a larger per-replica batch{now}; `keras-scaling bench --per-replica-batch 32,64,128,256` finds the one that reaches 90% efficiency"
        if efficient_per_replica_batch is not None:
            batch = f"the per-replica batch that reaches 90% efficiency is {efficient_per_replica_batch}, from the sweep"
        text = f"synchronization-bound: combining the replicas' updates is {share} of the step: {batch}."
    elif first.name == "host":
        advised = advised_steps_per_execution(split)
        measured = split.amortized_steps_per_execution
        text = f"host-bound: the training loop's per-call cost is {share} of the step: steps_per_execution={measured} took the host share from {share} to {_percent(split.host_share_at(measured))} (measured); model.compile(..., steps_per_execution={advised}) brings it to {_percent(split.host_share_at(advised))}."
    else:
        utilization = f"MFU unknown ({mfu_reason or 'no FLOPs or peak figure'})"
        hint = "; mixed precision would help on GPUs and TPUs"
        if mfu is not None:
            utilization = f"MFU {mfu * 100:.0f}%"
            hint = "; mixed precision would help" if mfu < 0.5 else "; the devices are well used"
        if compute_dtype in ("float16", "bfloat16") and (mfu is None or mfu < 0.5):
            hint = f"; it computes in {compute_dtype} already"
        text = f"compute-bound: the model's own arithmetic is {share} of the step (good): {utilization}{hint}."
    rates_note = _rates_note(first.name, pipeline_samples_per_sec, training_samples_per_sec)
    notes = [note for note in (doubt, contradiction, rates_note) if note]
    notes += [
        f"{part.name} is also {_percent(part.share)} of the step; without it the step would be {part.saved_s * 1e3:.2f} ms shorter"
        for part in ranked[1:]
        if part.share >= _MINOR_SHARE
    ]
    if abs(split.rest_share) >= 0.1:
        rest = f"the parts and the measured step differ by {_percent(abs(split.rest_share))} of the step"
        notes.append(f"{rest} (noise between rounds); more steps or rounds narrow it")
    if host_cpu_replicas and num_replicas > 1:
        notes.append(shared_cores_note(num_replicas, cpu_cores))
    return Verdict(bound=first.name, confidence=confidence, text=text, notes=tuple(notes))


def shared_cores_note(num_replicas, cpu_cores=None):
    """What replicas that are logical CPUs of one host do to each part."""
    cores = f"its {cpu_cores} cores" if cpu_cores else "its cores"
    return f"the {num_replicas} replicas are logical CPUs of one host and share {cores}: synchronization also holds them slowing each other down, which real devices would not; input competes with training for the same cores"


def format_table(rows):
    """A text table of the split per replica count, from `(num_replicas, Split)` rows."""
    header = ["replicas", "step ms"] + [f"{name} ms (%)" for name in PARTS] + ["rest ms"]
    lines = [header] + [
        [str(num_replicas), f"{split.step_s * 1e3:.2f}"]
        + [f"{part.time_s * 1e3:.2f} ({part.share * 100:.0f}%)" for part in split.parts]
        + [f"{split.rest_s * 1e3:.2f}"]
        for num_replicas, split in rows
    ]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)
