"""The arithmetic of `tune`: is a candidate faster than the incumbent, and is there time to tell.

Plain functions of numbers, no TensorFlow. A candidate and the incumbent
run in turns, one round each, so a slow spell of the machine lands on both.
Each round gives one samples/sec figure of each; the rounds pair up, and the
candidate's gain is the median of the paired ratios minus 1. The noise is
half the range of those ratios (the highest and lowest left out from 5
rounds on, so that one disturbed round does not decide): a change is kept
only when its gain exceeds the noise and `MIN_GAIN`.
"""

import dataclasses
import math
import statistics

# A gain below this is not worth a change of settings, however sure.
MIN_GAIN = 0.05
# Rounds of each of a candidate and the incumbent: fewer cannot tell noise
# from a gain; more than enough only spend the budget.
MIN_ROUNDS = 3
MAX_ROUNDS = 5


def half_range(values):
    """Half the range of `values`: how far one round strays from another."""
    return (max(values) - min(values)) / 2


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Samples/sec of the incumbent and a candidate, round by round, in the order they ran.

    Args:
        incumbent_samples_per_sec: the incumbent's figure of each round.
        candidate_samples_per_sec: the candidate's figure of the same rounds.
    """

    incumbent_samples_per_sec: tuple
    candidate_samples_per_sec: tuple

    def __post_init__(self):
        rates = self.incumbent_samples_per_sec + self.candidate_samples_per_sec
        if not self.incumbent_samples_per_sec or len(self.incumbent_samples_per_sec) != len(
            self.candidate_samples_per_sec
        ):
            raise ValueError(
                "a comparison needs the same number (at least 1) of rounds of each, got "
                f"{len(self.incumbent_samples_per_sec)} and {len(self.candidate_samples_per_sec)}"
            )
        if any(not math.isfinite(rate) or rate <= 0 for rate in rates):
            raise ValueError(f"samples/sec must be positive numbers, got {list(rates)}")

    @property
    def ratios(self):
        """Candidate over incumbent, round by round."""
        return tuple(
            candidate / incumbent
            for incumbent, candidate in zip(
                self.incumbent_samples_per_sec, self.candidate_samples_per_sec
            )
        )

    @property
    def ratio(self):
        """The median of the paired ratios: the candidate's speed over the incumbent's."""
        return statistics.median(self.ratios)

    @property
    def noise(self):
        """Half the range of the paired ratios, without the extremes from 5 rounds on."""
        ratios = sorted(self.ratios)
        if len(ratios) >= 5:
            ratios = ratios[1:-1]
        return half_range(ratios)

    @property
    def candidate_median(self):
        return statistics.median(self.candidate_samples_per_sec)

    @property
    def incumbent_median(self):
        return statistics.median(self.incumbent_samples_per_sec)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether a candidate is kept, and why, in one sentence."""

    kept: bool
    reason: str


def decide(comparison, min_gain=MIN_GAIN):
    """Keeps a candidate only when its gain exceeds both the noise and `min_gain`.

    Example: paired ratios 2.1, 2.4, 2.6 give a gain of +140% against a
    noise of 25%: kept. Ratios 0.9, 1.05, 1.1 give +5% within a noise of
    10%: not kept.
    """
    gain = comparison.ratio - 1
    noise = comparison.noise
    if gain <= 0:
        return Decision(False, f"slower: {gain:+.0%} (noise {noise:.0%})")
    if gain <= noise:
        return Decision(False, f"{gain:+.0%} is within the noise ({noise:.0%})")
    if gain <= min_gain:
        return Decision(False, f"{gain:+.0%} is below the {min_gain:.0%} worth a change")
    return Decision(True, f"{gain:+.0%}, beyond the noise ({noise:.0%})")


def is_clear(comparison, min_gain=MIN_GAIN):
    """Whether more rounds would not change the decision: `MIN_ROUNDS` or more, and a gain or loss twice the noise.

    Example: paired ratios 1.9, 2.0, 2.1 (+100%, noise 10%) are clear;
    1.02, 1.10, 1.18 (+10%, noise 8%) are not.
    """
    if len(comparison.ratios) < MIN_ROUNDS:
        return False
    gain = comparison.ratio - 1
    return abs(gain) > 2 * comparison.noise and (gain < 0 or gain > 2 * min_gain)


def rounds_affordable(left_s, round_pair_s, warmup_s, *, reserve_s=0.0):
    """How many rounds of a candidate and the incumbent fit in `left_s`, or 0.

    Args:
        left_s: seconds of the budget left.
        round_pair_s: seconds of one round of the incumbent and one of the candidate.
        warmup_s: seconds to prepare the candidate (tracing, a first epoch).
        reserve_s: seconds kept back for what must follow.

    Returns:
        `MAX_ROUNDS`, or fewer down to `MIN_ROUNDS`, or 0 when even
        `MIN_ROUNDS` do not fit.

    Example: 30 s left, 4 s a round pair, 5 s of warm-up: (30 - 5) // 4 = 6,
    so `MAX_ROUNDS` (5).
    """
    if round_pair_s <= 0:
        raise ValueError(f"round_pair_s must be positive seconds, got {round_pair_s}")
    rounds = math.floor((left_s - reserve_s - warmup_s) / round_pair_s)
    if rounds < MIN_ROUNDS:
        return 0
    return min(rounds, MAX_ROUNDS)


def minimum_cost_s(round_pair_s, warmup_s):
    """Seconds one candidate needs at least: its warm-up and `MIN_ROUNDS` round pairs."""
    return warmup_s + MIN_ROUNDS * round_pair_s


def steps_per_round(step_s, round_s, multiple):
    """Steps of one timed round: about `round_s` seconds, a multiple of `multiple`.

    Example: 2 ms steps, 0.5 s rounds, steps_per_execution up to 16: 250
    steps rounded up to 256.
    """
    steps = max(1, math.ceil(round_s / step_s))
    return multiple * math.ceil(steps / multiple)
