"""The search of `tune`: each knob, in the order of explain's verdict, against the incumbent."""

import collections
import logging
import math
import os
import statistics
import time

from keras_scaling.tune import _candidates, _decision, _report

logger = logging.getLogger("keras_scaling")

# Epochs of one round's `fit` (`_measure`): the first is not timed.
EPOCHS = 3

# The reason of a candidate the budget left no time for.
NOT_MEASURED = "not measured: the budget is spent"
# A budget below this cannot hold a warm-up, explain's split and one candidate.
MIN_BUDGET_S = 10.0
# Share of the budget explain's split may take: its verdict orders the
# search, but the measurements decide; a small budget goes to them.
_EXPLAIN_SHARE = 0.3
# Steps of explain's rounds: enough to split the step, few enough that its
# cost is mostly its tracing, which the estimate counts.
_EXPLAIN_MAX_STEPS = 20
# Explain traces three train functions of its own and copies the model:
# costed as this many warm-ups of the start (measured: 6 for the bench's
# mlp, 7 for its cnn, steps aside).
_EXPLAIN_WARMUPS = 5
# The final side by side's reserve, over its estimate: the fit calls'
# overhead grows with the machine's load during the search.
_CONFIRM_MARGIN = 1.5


class BudgetTooSmall(ValueError):
    """The budget cannot hold one candidate; `needed_s` would."""

    def __init__(self, needed_s, message):
        super().__init__(message)
        self.needed_s = needed_s


def _too_small(budget_s, clock, round_pair_s, warmup_s):
    spent_s, cost_s = clock.elapsed_s(), _decision.minimum_cost_s(round_pair_s, warmup_s)
    needed_s = max(math.ceil(spent_s + cost_s), math.ceil(budget_s) + 1)
    return BudgetTooSmall(
        needed_s,
        f"budget_s={budget_s:g} is too small to measure one candidate: "
        f"{spent_s:.0f} s went to preparing the start and one candidate needs about "
        f"{cost_s:.0f} s; pass budget_s={needed_s} or more",
    )


def round_s_for(budget_s):
    """Seconds of one epoch of a round: longer rounds average more noise, when the budget allows."""
    return min(1.0, max(0.2, budget_s / 240))


class _Clock:
    """The budget's clock; `now_s` is the runner's, which every worker reads alike."""

    def __init__(self, budget_s, now_s=time.perf_counter):
        self.budget_s = budget_s
        self.now_s = now_s
        self.started_s = now_s()

    def elapsed_s(self):
        return self.now_s() - self.started_s

    def left_s(self):
        return self.budget_s - self.elapsed_s()


def trial_record(knob, value, comparison=None, *, incumbent_ratio=1.0, reason=""):
    """A row of the table and of `tune.json`'s trials: `comparison` decided, or `reason`."""
    decision = _decision.decide(comparison) if comparison else None
    return {
        "knob": knob,
        "value": value,
        "samples_per_sec": comparison.candidate_median if comparison else None,
        "spread": (
            _decision.half_range(comparison.candidate_samples_per_sec) / comparison.candidate_median
            if comparison
            else None
        ),
        "incumbent_samples_per_sec": comparison.incumbent_median if comparison else None,
        "ratio_to_incumbent": comparison.ratio if comparison else None,
        "noise": comparison.noise if comparison else None,
        "ratio_to_start": incumbent_ratio * comparison.ratio if comparison else None,
        "rounds": len(comparison.ratios) if comparison else 0,
        "kept": bool(decision and decision.kept),
        "reason": decision.reason if decision else reason,
    }


def alternate(incumbent, candidate, steps, rounds, left_s, *, reserve_s=0.0, min_rounds=1):
    """Up to `rounds` pairs of rounds of two `(runner, settings)`, the first of each pair alternating.

    After `min_rounds`, no pair starts that would eat into `reserve_s` of `left_s()`, and the
    pairs stop once the decision is clear. Returns the `Comparison` and the slowest pair's seconds
    (the sum of its rounds' as the runners report them: across workers, the chief's).
    """
    rates: tuple[list[float], list[float]] = ([], [])
    order = ((incumbent, rates[0]), (candidate, rates[1]))
    slowest_pair_s = 0.0
    for index in range(rounds):
        if index >= min_rounds and left_s() - reserve_s < slowest_pair_s:
            break
        if index >= _decision.MIN_ROUNDS and _decision.is_clear(
            _decision.Comparison(tuple(rates[0]), tuple(rates[1]))
        ):
            break
        pair_s = 0.0
        for (runner, settings), values in order if index % 2 == 0 else reversed(order):
            rate, wall_s = runner.round(settings, steps)
            values.append(rate)
            pair_s += wall_s
        slowest_pair_s = max(slowest_pair_s, pair_s)
    return _decision.Comparison(tuple(rates[0]), tuple(rates[1])), slowest_pair_s


def steps_for(step_s, round_s, *settings):
    """Steps of a round of each of `settings`: a multiple of their largest steps_per_execution."""
    spe = max(int(each["compile"].get("steps_per_execution", 1)) for each in settings)
    return _decision.steps_per_round(step_s, round_s, spe)


def search(runner, start, budget_s, allowed, explain_fn, verbose, confirm=True):
    """Runs the search on a `_measure.Runner`; returns what `tune.json` records of it.

    `explain_fn(dataset, steps)` gives an `Explanation`; `confirm=False` leaves
    the final side by side of best and start to the caller, which measures more knobs.
    """
    # Across workers, the chief's budget: each worker's start took its own time.
    budget_s = runner.agree(budget_s)
    clock = _Clock(budget_s, runner.clock_s)
    round_s = round_s_for(budget_s)
    say = print if verbose else (lambda *args, **kwargs: None)

    # Warm-up: traces the start's train function and times a step.
    steps = steps_for(0.01, 0.1, start)
    _, warmup_s = runner.round(start, steps)
    rate, call_s = runner.round(start, steps)
    step_s = runner.global_batch_size(start["data"]) / rate
    # What a fit call costs beyond its steps: making the iterator, callbacks.
    overhead_s = max(0.0, call_s - EPOCHS * steps * step_s)
    timeline = {"warm_up_s": clock.elapsed_s()}
    notes = []
    bound = advised = None
    explain_steps = max(2, min(_EXPLAIN_MAX_STEPS, int(round_s / step_s)))
    # Explain runs 4 variants over 2 rounds after a warm-up of 2 calls each;
    # two of them run at least 2 calls of K = max(16, 4 x steps_per_execution)
    # steps; it traces 3 train functions of its own.
    amortized = max(16, 4 * int(start["compile"].get("steps_per_execution", 1)))
    explain_steps_total = 6 * explain_steps + 6 * max(explain_steps, 2 * amortized)
    explain_cost_s = explain_steps_total * step_s + _EXPLAIN_WARMUPS * warmup_s
    # Kept back for the final side by side: MIN_ROUNDS round pairs at the start's speed at most.
    start_round_s = EPOCHS * steps_for(step_s, round_s, start) * step_s + overhead_s
    confirm_reserve_s = confirm * (_CONFIRM_MARGIN * _decision.MIN_ROUNDS * 2 * start_round_s)
    if runner.num_workers > 1:
        # Its rounds would have to run alike on every worker; the rounds of
        # the search decide anyway.
        notes.append("explain's split was left out across workers; the host-bound order was tried")
    elif (clock.left_s() - confirm_reserve_s) * _EXPLAIN_SHARE <= explain_cost_s:
        notes.append(
            f"explain's split was left out: it would take about {explain_cost_s:.0f} s, "
            f"more than {_EXPLAIN_SHARE:.0%} of the budget; the host-bound order was tried"
        )
    else:
        try:
            explanation = explain_fn(runner.dataset(start["data"]), explain_steps)
        except Exception as error:  # a model explain cannot copy or time: tune goes on
            logger.warning("tune: explain could not split the step: %s", error)
            notes.append(f"explain could not split the step ({first_line(error)})")
        else:
            bound = explanation.verdict.bound
            advised = explanation.record.get("advised_steps_per_execution")
            say(f"explain: {explanation.verdict.text} ({explanation.verdict.confidence})")
            notes.append(f"explain's verdict: {explanation.verdict.text}")
            timeline["explain_s"] = clock.elapsed_s() - timeline["warm_up_s"]
    plan = runner.plan(start["data"]) if start["data"] else None
    # What decides the knobs, as the chief sees it (-1: unknown).
    array_bytes, free_bytes, cores = runner.agree(
        _or_minus_one(_array_bytes(runner.data)), _or_minus_one(_free_bytes()), os.cpu_count() or 1
    )
    context = _candidates.Context(
        device_kind=runner.device_kind,
        local_replicas=runner.local_replicas,
        pipeline_built=plan is not None,
        arrays=array_bytes >= 0,
        shuffled=plan is None or plan.shuffle,
        array_bytes=max(0, int(array_bytes)),
        free_bytes=None if free_bytes < 0 else int(free_bytes),
        cores=int(cores),
        workers=runner.num_workers,
        communication_settable=runner.communication_settable,
        gradient_sizes=runner.gradient_sizes() if runner.num_workers > 1 else (),
    )
    incumbent, incumbent_ratio, trials = start, 1.0, []
    if context.pipeline_built:
        trials += [
            trial_record(knob, None, reason="not tried: already AUTOTUNE in distribute")
            for knob in _candidates.AUTOTUNED
        ]
    # The start's rates of the first comparisons: none until one is measured.
    start_rates: list[float] = []
    kept_comparisons = []
    out_of_budget = False
    # Each knob's first value in turn, then the rest of each ladder still
    # paying: one knob's ladder does not spend the budget of the others.
    queue: collections.deque[tuple[str, tuple | None]] = collections.deque()
    for knob in _candidates.knob_order(bound, allowed):
        if knob in _candidates.ACROSS_WORKERS and context.workers == 1:
            continue  # one machine's all-reduce is `cross_device_ops`
        reason = _candidates.reason_not_tried(knob, context)
        if reason is not None:
            trials.append(trial_record(knob, None, reason=f"not tried: {reason}"))
        else:
            queue.append((knob, None))
    while queue:
        knob, rest = queue.popleft()
        if out_of_budget:
            value = rest[0] if rest else None
            trials.append(trial_record(knob, value, reason=NOT_MEASURED))
            continue
        values = (
            rest
            if rest is not None
            else _candidates.values_to_try(
                knob, incumbent, context, advised_steps_per_execution=advised
            )
        )
        if not values:
            current = incumbent[_candidates.SECTION[knob]].get(knob)
            trials.append(trial_record(knob, None, reason=f"not tried: already {current}"))
        for index, value in enumerate(values):
            if index == 1 and rest is None:
                queue.append((knob, values[1:]))
                break
            candidate = _candidates.with_value(incumbent, knob, value)
            steps = steps_for(step_s, round_s, incumbent, candidate)
            round_pair_s = 2 * (EPOCHS * steps * step_s + overhead_s)
            # The first candidate is measured against the start itself: kept
            # alone, its own rounds are the side by side, so it needs no
            # reserve, and once begun it runs MIN_ROUNDS rather than fail.
            first = not start_rates
            reserve_s = 0.0 if first else confirm_reserve_s
            rounds = _decision.rounds_affordable(
                clock.left_s(), round_pair_s, warmup_s, reserve_s=reserve_s
            )
            comparison = None
            if rounds:
                try:
                    _, candidate_warmup_s = runner.round(
                        candidate, steps_for(step_s, 0.05, candidate)
                    )
                except Exception as error:  # a setting this model or device cannot run
                    trials.append(trial_record(knob, value, reason=f"failed: {first_line(error)}"))
                    logger.warning("tune: %s=%r failed: %s", knob, value, error)
                    break
                # A larger steps_per_execution traces a longer loop: later
                # candidates are costed with the slowest warm-up seen.
                warmup_s = max(warmup_s, candidate_warmup_s)
                rounds = _decision.rounds_affordable(
                    clock.left_s(), round_pair_s, 0.0, reserve_s=reserve_s
                )
            if rounds:
                comparison, slowest_pair_s = alternate(
                    (runner, incumbent),
                    (runner, candidate),
                    steps,
                    rounds,
                    clock.left_s,
                    reserve_s=reserve_s,
                    min_rounds=_decision.MIN_ROUNDS if first else 1,
                )
                # What a fit call costs beyond its steps, as the rounds showed.
                overhead_s = max(overhead_s, slowest_pair_s / 2 - EPOCHS * steps * step_s)
            if comparison is None or len(comparison.ratios) < _decision.MIN_ROUNDS:
                if first:
                    raise _too_small(budget_s, clock, round_pair_s, warmup_s)
                trials.append(trial_record(knob, value, reason=NOT_MEASURED))
                out_of_budget = True
                break
            if incumbent is start:
                start_rates.extend(comparison.incumbent_samples_per_sec)
            trial = trial_record(knob, value, comparison, incumbent_ratio=incumbent_ratio)
            trial["ended_at_s"] = clock.elapsed_s()
            trials.append(trial)
            say(_report.trial_line(trial))
            if not trial["kept"]:
                if comparison.ratio <= 1:
                    break
                continue  # faster within the noise: the next, larger value may show more
            incumbent, incumbent_ratio = candidate, trial["ratio_to_start"]
            kept_comparisons.append(comparison)
            step_s = runner.global_batch_size(incumbent["data"]) / comparison.candidate_median
            if knob in _candidates.CHANGES_ROUNDING + _candidates.CHANGES_TRAINING:
                notes.append(_candidates.describe_change(knob, value, start))
    timeline["knobs_done_s"] = clock.elapsed_s()
    start_samples_per_sec = statistics.median(start_rates or [rate])
    record = {
        "start": {"samples_per_sec": start_samples_per_sec, "settings": start},
        "best": {
            "samples_per_sec": start_samples_per_sec * incumbent_ratio,
            "settings": incumbent,
            "ratio_to_start": incumbent_ratio,
            "ratio_source": (
                "no change kept"
                if incumbent is start
                else "the product of the kept changes' ratios"
            ),
            "trains_the_same": not any(
                trial["kept"] and trial["knob"] in _candidates.CHANGES_TRAINING for trial in trials
            ),
        },
        "trials": trials,
        "notes": notes,
        "explain_bound": bound,
        "timeline": timeline,
    }
    if confirm and incumbent is not start:
        steps = steps_for(step_s * incumbent_ratio, round_s, start, incumbent)
        round_pair_s = EPOCHS * steps * step_s * (1 + incumbent_ratio) + 2 * overhead_s
        rounds = _decision.rounds_affordable(clock.left_s(), round_pair_s, 0.0)
        if not rounds and len(kept_comparisons) == 1:
            # The one kept change took what the reserve would have held; its
            # own rounds against the start are the side by side.
            where = ", its own trial (no time was left to confirm it)"
            confirm_best(record, kept_comparisons[0], where)
        else:
            # Its reserve was kept for it: it runs at least MIN_ROUNDS.
            confirmation, _ = alternate(
                (runner, start),
                (runner, incumbent),
                steps,
                max(rounds, _decision.MIN_ROUNDS),
                clock.left_s,
                min_rounds=_decision.MIN_ROUNDS,
            )
            confirm_best(record, confirmation)
    timeline["end_s"] = record["elapsed_s"] = clock.elapsed_s()
    return record


def confirm_best(record, comparison, where=""):
    """Updates `record` with the side by side of start and best: unless its gain exceeds the noise, the start is handed back."""
    best, start = record["best"], record["start"]
    decision = _decision.decide(comparison, _decision.MIN_GAIN_OVERALL)
    rounds = len(comparison.ratios)
    start["samples_per_sec"] = comparison.incumbent_median
    if decision.kept:
        best["ratio_to_start"] = comparison.ratio
        best["samples_per_sec"] = comparison.incumbent_median * comparison.ratio
        best["ratio_source"] = f"best against start, {rounds} alternating rounds{where}"
        return
    record["notes"].append(
        f"the kept changes ran at {comparison.ratio:.2f}x the start side by side "
        f"({decision.reason}): the start is kept"
    )
    best.update(
        settings=start["settings"],
        samples_per_sec=comparison.incumbent_median,
        ratio_to_start=1.0,
        ratio_source=f"kept changes not faster than the start in {rounds} alternating rounds",
        trains_the_same=True,
    )
    for trial in record["trials"]:
        if trial["kept"]:
            trial["kept"] = False
            trial["reason"] += "; not confirmed against the start"


def first_line(error):
    """The error's type and the first line of its message, for a row of the table."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def _or_minus_one(value):
    return -1 if value is None else value


def _array_bytes(data):
    """The size of `data` when it is arrays (NumPy or tensors), else None."""
    import numpy as np
    import tensorflow as tf

    leaves = tf.nest.flatten(data) if isinstance(data, (tuple, list, dict)) else [data]
    if not all(isinstance(leaf, (np.ndarray, tf.Tensor)) for leaf in leaves):
        return None
    return sum(
        leaf.nbytes if isinstance(leaf, np.ndarray) else leaf.shape.num_elements() * leaf.dtype.size
        for leaf in leaves
    )


def _free_bytes():
    """The memory available for new data (Linux's MemAvailable), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
