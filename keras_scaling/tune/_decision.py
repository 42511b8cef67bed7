"""The arithmetic of `tune`: is a candidate faster than the incumbent, and is there time to tell.

Rounds of the two pair up; the gain is the median paired ratio minus 1, the
noise half the range of the ratios (docs/guides/tune.md, "How a change is decided").
"""

import dataclasses
import math
import statistics

# A knob's gain below this is not worth a change, however sure; sure small
# gains add up, so the best must then beat the start by `MIN_GAIN_OVERALL`.
MIN_GAIN = 0.02
MIN_GAIN_OVERALL = 0.05
# Rounds of each of a candidate and the incumbent: fewer cannot tell noise
# from a gain; more than enough only spend the budget.
MIN_ROUNDS = 3
MAX_ROUNDS = 5


def half_range(values):
    """Half the range of `values`: how far one round strays from another."""
    return (max(values) - min(values)) / 2


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Samples/sec of the incumbent and a candidate, round by round, in the order they ran."""

    incumbent_samples_per_sec: tuple
    candidate_samples_per_sec: tuple

    def __post_init__(self):
        incumbent, candidate = self.incumbent_samples_per_sec, self.candidate_samples_per_sec
        if not incumbent or len(incumbent) != len(candidate):
            raise ValueError(
                "a comparison needs the same number (at least 1) of rounds of each, got "
                f"{len(incumbent)} and {len(candidate)}"
            )
        if any(not math.isfinite(rate) or rate <= 0 for rate in incumbent + candidate):
            raise ValueError(f"samples/sec must be positive numbers, got {incumbent + candidate}")

    @property
    def ratios(self):
        """Candidate over incumbent, round by round."""
        pairs = zip(self.incumbent_samples_per_sec, self.candidate_samples_per_sec)
        return tuple(candidate / incumbent for incumbent, candidate in pairs)

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
    """Whether a candidate is kept, and why in one sentence."""

    kept: bool
    reason: str


def decide(comparison, min_gain=MIN_GAIN):
    """Keeps a candidate only when its gain exceeds both the noise and `min_gain`."""
    gain = comparison.ratio - 1
    noise = comparison.noise
    if gain <= 0:
        return Decision(False, f"slower: {gain:+.0%} (noise {noise:.0%})")
    # One decimal where a gain is set against a bound, lest both round alike.
    if gain <= noise:
        return Decision(False, f"{gain:+.1%} is within the noise ({noise:.1%})")
    if gain <= min_gain:
        return Decision(False, f"{gain:+.1%} is below the {min_gain:.0%} worth a change")
    return Decision(True, f"{gain:+.0%}, beyond the noise ({noise:.0%})")


def is_clear(comparison, min_gain=MIN_GAIN):
    """Whether more rounds would not change the decision: `MIN_ROUNDS` or more, and a gain or loss twice the noise."""
    if len(comparison.ratios) < MIN_ROUNDS:
        return False
    gain = comparison.ratio - 1
    return abs(gain) > 2 * comparison.noise and (gain < 0 or gain > 2 * min_gain)


def rounds_affordable(left_s, round_pair_s, warmup_s, *, reserve_s=0.0):
    """Round pairs that fit in `left_s` after the candidate's warm-up and `reserve_s`: up to `MAX_ROUNDS`, or 0 below `MIN_ROUNDS`."""
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
    """Steps of one timed round: about `round_s` seconds, a multiple of `multiple`."""
    steps = max(1, math.ceil(round_s / step_s))
    return multiple * math.ceil(steps / multiple)
