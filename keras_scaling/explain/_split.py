"""The arithmetic of `explain`: measured variants in, the step's split and a verdict out.

Plain functions of numbers, no TensorFlow. Variants of the training step are
timed (see `keras_scaling.explain`), each over several rounds:

- `real`: N replicas on the real input pipeline, at the model's
  `steps_per_execution` S;
- `input_wait`: what that run waits for its next batch, per step (the time
  in `IteratorGetNext`);
- `resident`: N replicas on one batch repeated from memory, at S;
- `resident_amortized`: the same at a larger `steps_per_execution` K;
- `one_replica`: one replica on one batch at the per-replica batch, at K.

Each variant counts the median of its rounds: a round slowed by other work
on the machine, or one that took batches buffered while other variants ran,
is one of several, where the fastest round would be the latter. The parts of
the step at S are:

    input           = input_wait  (real - resident when it is not measured)
    host            = (resident - resident_amortized) * (1/S) / (1/S - 1/K)
    synchronization = resident_amortized - one_replica
    compute         = one_replica - host per call / K

The pipeline makes batches in the background while the replicas train, so
the step is the longer of the two, not their sum: training (host,
synchronization, compute) plus what the run waits for data. So the parts add
up to the real step. A difference that noise makes negative counts as 0, and
the remainder is the unexplained rest. Each part's noise is the sum of the
half-ranges (over rounds) of the variants it comes from.

The verdict follows the critical path: it names the part whose removal
shortens the step most (`Part.saved_s`). Freeing the input saves what the run
waits for it (the step on a resident batch is the counterfactual that checks
it); freeing a part of training saves that part, but no more than training's
lead over the pipeline, since a faster training then waits for data:

    saved(input) = input
    saved(part)  = min(part, max(0, step - input - pipeline batch time))

where the pipeline's batch time is the global batch over its own rate, timed
alone.
"""

import dataclasses
import math
import statistics

PARTS = ("input", "compute", "synchronization", "host")
# Shares below this are not worth a remedy.
_MINOR_SHARE = 0.2
# The host share the advised steps_per_execution aims for.
_TARGET_HOST_SHARE = 0.05


@dataclasses.dataclass(frozen=True)
class Timing:
    """One variant's step time over rounds.

    Args:
        step_times_s: the step time of each round, seconds.
    """

    step_times_s: tuple

    @property
    def best_s(self):
        """The fastest round (reported; the split uses the median)."""
        return min(self.step_times_s)

    @property
    def median_s(self):
        """The median round: what the split counts."""
        return statistics.median(self.step_times_s)

    @property
    def noise_s(self):
        """Half the range over rounds: how far one round strays from another."""
        return (max(self.step_times_s) - min(self.step_times_s)) / 2

    def to_json(self):
        return {
            "best_s": self.best_s,
            "median_s": self.median_s,
            "noise_s": self.noise_s,
            "step_times_s": list(self.step_times_s),
        }


def timing(step_times_s, *, zero_allowed=False):
    """A `Timing` of per-round step times.

    Raises ValueError on none, or a negative one (a zero one too unless
    `zero_allowed`, as a wait may be).
    """
    step_times_s = tuple(float(value) for value in step_times_s)
    if not step_times_s:
        raise ValueError("step_times_s must hold at least one round's step time")
    if any(
        not math.isfinite(value) or value < 0 or (value == 0 and not zero_allowed)
        for value in step_times_s
    ):
        what = "seconds >= 0" if zero_allowed else "positive seconds"
        raise ValueError(f"step times must be {what}, got {list(step_times_s)}")
    return Timing(step_times_s)


@dataclasses.dataclass(frozen=True)
class Part:
    """One part of the step: its time, its share of the step and its noise.

    `saved_s` is how much shorter the step would be without the part: its
    time for input, and for a part of training no more than training's lead
    over the pipeline (see the module docstring).
    """

    name: str
    time_s: float
    share: float
    noise_s: float
    saved_s: float = 0.0


@dataclasses.dataclass(frozen=True)
class Split:
    """The measured step at `steps_per_execution` S and its parts.

    `parts` holds input, compute, synchronization and host in that order;
    `rest_s` is the step minus their sum. `input_free_step_s` is the step on
    a resident batch (the input free), `pipeline_batch_s` the time the
    pipeline alone takes to make a global batch (None when not measured).
    """

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
        """The host share of the step at another `steps_per_execution`.

        The host part scales as 1 / steps_per_execution; the rest of the
        step stays.
        """
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
    """The `Split` of the step from the variants' `Timing`s (their medians).

    Args:
        real, resident, resident_amortized, one_replica: `Timing`s of the
            variants (see the module docstring); with one replica,
            `one_replica` is `resident_amortized`.
        steps_per_execution: int, S of `real` and `resident`.
        amortized: int, K of `resident_amortized` and `one_replica`, > S.
        input_wait: `Timing` of what `real` waits for its next batch per
            step, or None to take `real - resident` as the input part.
        pipeline_batch_s: seconds the pipeline alone takes per global batch,
            or None; caps what freeing a part of training saves.

    Example: `real` 10 ms, `resident` 6 ms, `resident_amortized` 4 ms at
    K=4 with S=1, `one_replica` 3 ms: host per call = 2 / (1 - 1/4) = 2.67
    ms, host 2.67 ms, input 4 ms, synchronization 1 ms, compute
    3 - 0.67 = 2.33 ms: 10 ms in all. With a pipeline making a batch in
    8 ms, training (6 ms) leads it by 6 - 8 < 0: freeing compute saves
    nothing, freeing the input saves 4 ms.
    """
    if amortized <= steps_per_execution:
        raise ValueError(
            f"amortized steps_per_execution must exceed {steps_per_execution}, got {amortized}"
        )
    step_s = real.median_s
    per_call = 1 / steps_per_execution - 1 / amortized
    host_per_call_s = max(0.0, (resident.median_s - resident_amortized.median_s) / per_call)
    if input_wait is not None:
        input_part = (input_wait.median_s, input_wait.noise_s)
    else:
        input_part = (real.median_s - resident.median_s, real.noise_s + resident.noise_s)
    raw = {
        "input": input_part,
        "host": (
            host_per_call_s / steps_per_execution,
            (resident.noise_s + resident_amortized.noise_s) / (per_call * steps_per_execution),
        ),
        "synchronization": (
            resident_amortized.median_s - one_replica.median_s,
            resident_amortized.noise_s + one_replica.noise_s,
        ),
        "compute": (
            one_replica.median_s - host_per_call_s / amortized,
            one_replica.noise_s,
        ),
    }
    # Noise can make a difference negative or larger than the step itself.
    times_s = {name: min(max(0.0, raw[name][0]), step_s) for name in PARTS}
    lead_s = max(0.0, step_s - times_s["input"] - (pipeline_batch_s or 0.0))
    parts = []
    for name in PARTS:
        time_s = times_s[name]
        saved_s = time_s if name == "input" else min(time_s, lead_s)
        parts.append(
            Part(
                name=name,
                time_s=time_s,
                share=time_s / step_s,
                noise_s=raw[name][1],
                saved_s=saved_s,
            )
        )
    return Split(
        step_s=step_s,
        parts=tuple(parts),
        rest_s=step_s - sum(part.time_s for part in parts),
        host_per_call_s=host_per_call_s,
        steps_per_execution=steps_per_execution,
        amortized_steps_per_execution=amortized,
        input_free_step_s=resident.median_s,
        pipeline_batch_s=pipeline_batch_s,
    )


def implied_input_share(pipeline_samples_per_sec, global_batch_size, resident_step_s):
    """The input share a pipeline's own rate implies, if it overlaps training fully.

    A batch takes `global_batch_size / pipeline_samples_per_sec` to make and
    `resident_step_s` to train; the step is the longer of the two, and the
    input share is what the pipeline adds: `1 - resident_step_s / batch_time`
    when the pipeline is slower, else 0.

    Example: 64 samples at 3,200 samples/s take 20 ms; trained in 5 ms, the
    input share is 0.75.
    """
    batch_time_s = global_batch_size / pipeline_samples_per_sec
    return max(0.0, 1 - resident_step_s / batch_time_s)


def advised_steps_per_execution(split, target_share=_TARGET_HOST_SHARE):
    """The smallest power of two that brings the host share to `target_share` or below.

    Never below the measured K when that already meets it, never above 1024.
    """
    candidate = 1
    while candidate < 1024 and split.host_share_at(candidate) > target_share:
        candidate *= 2
    return max(candidate, split.steps_per_execution * 2)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What bounds the step, how sure that is, and the fix with its numbers.

    `bound` is one of `"input"`, `"compute"`, `"synchronization"`, `"host"`;
    `confidence` one of `"clear"`, `"likely"`, `"uncertain"`.
    """

    bound: str
    confidence: str
    text: str
    notes: tuple = ()


def _confidence(first, second):
    margin_s = first.saved_s - second.saved_s
    noise_s = first.noise_s + second.noise_s
    if margin_s > 2 * noise_s:
        return "clear", None
    if margin_s > noise_s:
        return "likely", None
    return "uncertain", (
        f"freeing {first.name} would save {first.saved_s * 1e3:.2f} ms and freeing "
        f"{second.name} {second.saved_s * 1e3:.2f} ms: within noise of each other "
        f"(+/- {first.noise_s * 1e3:.2f} and {second.noise_s * 1e3:.2f} ms over rounds): "
        "either may bound the step; more steps or rounds narrow it"
    )


def _counterfactual_doubt(split, first, second):
    """A note when the step on a resident batch contradicts the verdict, else None.

    The resident step is the step with the input free, measured: it saves
    what the run waits for data, within noise.
    """
    if split.input_free_step_s is None:
        return None
    freed_s = split.step_s - split.input_free_step_s
    tolerance_s = first.noise_s + second.noise_s + 0.1 * split.step_s
    waited_s = split.part("input").time_s
    if first.name == "input" and freed_s + tolerance_s < first.saved_s:
        found = f"only {max(0.0, freed_s) * 1e3:.2f} ms"
    elif first.name != "input" and freed_s > first.saved_s + tolerance_s:
        found = f"{freed_s * 1e3:.2f} ms"
    else:
        return None
    return (
        f"the run waits {waited_s * 1e3:.2f} ms per step for its next batch, and the "
        f"step on a resident batch (the input free) is {found} shorter than on the "
        "pipeline: the two measurements disagree; more steps or rounds narrow it"
    )


def _rates_note(bound, pipeline_samples_per_sec, training_samples_per_sec):
    """A note when the pipeline's rate alone points elsewhere than the wait, else None."""
    if not pipeline_samples_per_sec or not training_samples_per_sec:
        return None
    rates = (
        f"alone, the pipeline gives {pipeline_samples_per_sec:,.0f} samples/s and "
        f"training takes {training_samples_per_sec:,.0f} with the input free"
    )
    if bound == "input" and pipeline_samples_per_sec > 1.2 * training_samples_per_sec:
        return (
            f"{rates}, yet the run waits for its batches: beside training the "
            "pipeline slows down (they share the host's cores or its disk)"
        )
    if bound != "input" and 1.2 * pipeline_samples_per_sec < training_samples_per_sec:
        return (
            f"{rates}, yet the run hardly waits for its batches; check the "
            "pipeline's rate with more steps"
        )
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
):
    """The `Verdict` of a `Split`: the part whose removal shortens the step most.

    Parts are ranked by `Part.saved_s` (see the module docstring); the
    confidence compares the first two with their noise, and falls to
    "uncertain" when the step on a resident batch contradicts the wait.

    Args:
        split: the `Split`.
        num_replicas: int.
        global_batch_size: int.
        pipeline_samples_per_sec: the input pipeline's own rate, all workers.
        training_samples_per_sec: what training takes with the input free
            (the global batch over the resident step).
        mfu: float or None, of the compute part.
        mfu_reason: why MFU is None.
        efficient_per_replica_batch: from a sweep over per-replica batches,
            the smallest reaching 90% efficiency, or None.
        per_replica_batch_size: int.
        host_cpu_replicas: whether the replicas are logical CPUs of one host.
        cpu_cores: int, the host's cores, for the note on shared cores.
    """
    ranked = sorted(split.parts, key=lambda part: (part.saved_s, part.time_s), reverse=True)
    first, second = ranked[0], ranked[1]
    confidence, doubt = _confidence(first, second)
    contradiction = _counterfactual_doubt(split, first, second)
    if contradiction:
        confidence = "uncertain"
    share = _percent(first.share)
    if first.name == "input":
        if pipeline_samples_per_sec is not None and training_samples_per_sec is not None:
            rates = (
                f"the pipeline gives {pipeline_samples_per_sec:,.0f} samples/s across "
                f"workers and training takes {training_samples_per_sec:,.0f}"
            )
        else:
            rates = "the replicas wait for data"
        text = (
            f"input-bound: input is {share} of the step (the wait for the next "
            f"batch; with the input free the step would be "
            f"{first.saved_s * 1e3:.2f} ms shorter); {rates}: parallel `map` "
            "(num_parallel_calls=tf.data.AUTOTUNE), `cache`, more reader files or "
            "the tf.data service."
        )
    elif first.name == "synchronization":
        if efficient_per_replica_batch is not None:
            batch = (
                f"the per-replica batch that reaches 90% efficiency is "
                f"{efficient_per_replica_batch}, from the sweep"
            )
        else:
            now = f" (now {per_replica_batch_size})" if per_replica_batch_size else ""
            batch = (
                f"a larger per-replica batch{now} spreads the all-reduce over more "
                "samples; `keras-scaling bench --per-replica-batch 32,64,128,256` "
                "finds the one that reaches 90% efficiency"
            )
        text = (
            f"synchronization-bound: combining the replicas' updates is {share} of "
            f"the step: {batch}."
        )
    elif first.name == "host":
        advised = advised_steps_per_execution(split)
        measured = split.amortized_steps_per_execution
        text = (
            f"host-bound: the training loop's per-call cost is {share} of the step: "
            f"steps_per_execution={measured} took the host share from {share} to "
            f"{_percent(split.host_share_at(measured))} (measured); "
            f"model.compile(..., steps_per_execution={advised}) brings it to "
            f"{_percent(split.host_share_at(advised))}."
        )
    else:
        if mfu is not None:
            utilization = f"MFU {mfu * 100:.0f}%"
            hint = "; mixed precision would help" if mfu < 0.5 else "; the devices are well used"
        else:
            utilization = f"MFU unknown ({mfu_reason or 'no FLOPs or peak figure'})"
            hint = "; mixed precision would help on GPUs and TPUs"
        text = (
            f"compute-bound: the model's own arithmetic is {share} of the step "
            f"(good): {utilization}{hint}."
        )
    notes = [note for note in (doubt, contradiction) if note]
    rates_note = _rates_note(first.name, pipeline_samples_per_sec, training_samples_per_sec)
    if rates_note:
        notes.append(rates_note)
    for part in ranked[1:]:
        if part.share >= _MINOR_SHARE:
            notes.append(
                f"{part.name} is also {_percent(part.share)} of the step; without it "
                f"the step would be {part.saved_s * 1e3:.2f} ms shorter"
            )
    if abs(split.rest_share) >= 0.1:
        notes.append(
            f"the parts and the measured step differ by {_percent(abs(split.rest_share))} "
            "of the step (noise between rounds made some differences negative or "
            "too large); more steps or rounds narrow it"
        )
    if host_cpu_replicas and num_replicas > 1:
        notes.append(shared_cores_note(num_replicas, cpu_cores))
    return Verdict(bound=first.name, confidence=confidence, text=text, notes=tuple(notes))


def shared_cores_note(num_replicas, cpu_cores=None):
    """What replicas that are logical CPUs of one host do to each part."""
    cores = f"its {cpu_cores} cores" if cpu_cores else "its cores"
    return (
        f"the {num_replicas} replicas are logical CPUs of one host and share {cores}: "
        "compute is one replica running alone; synchronization also holds the "
        "replicas slowing each other down on the shared cores, so real devices "
        "would show less of it; input competes with training for the same cores; "
        "host overhead is paid once per call for all replicas"
    )


def format_table(rows):
    """A text table of the split per replica count.

    Args:
        rows: list of `(num_replicas, Split)`.
    """
    header = ["replicas", "step ms"] + [f"{name} ms (%)" for name in PARTS] + ["rest ms"]
    lines = [header]
    for num_replicas, split in rows:
        line = [str(num_replicas), f"{split.step_s * 1e3:.2f}"]
        for part in split.parts:
            line.append(f"{part.time_s * 1e3:.2f} ({part.share * 100:.0f}%)")
        line.append(f"{split.rest_s * 1e3:.2f}")
        lines.append(line)
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    text = ["  ".join(cell.rjust(width) for cell, width in zip(line, widths)) for line in lines]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)
