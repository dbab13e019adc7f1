"""The keep rule of a model step: is a candidate build really faster than the current one?

The evidence is a list of paired rounds, each the ratio current / candidate of the two builds
measured back to back. Outside load moves both builds of a round together but not exactly, so a
round's ratio is noisy around the true speedup; with the same binary on both sides (an A/A pair)
a ratio is above 1 as often as below. The rule:

- **keep** when the median ratio exceeds the minimum effect (`min_model_speedup`, 1.01) *and* a
  one-sided sign test rejects "no faster" at `alpha` (0.05): the chance that an A/A pair wins at
  least as many rounds is at most 5%. The sign test needs no model of the noise, which here is
  skewed and changes with the other jobs' load; it needs 5 rounds at least (0.5^5 = 3%).
- **reject** when the median is not above 1, the candidate won at most half of the rounds, or it
  is significantly faster by less than the minimum effect: more rounds would not make it a gain
  worth keeping.
- otherwise **undecided**: the caller measures more rounds (only then: a clear decision costs
  the configured rounds) and judges again; undecided at the last look is not kept.

The rule it replaces (median above 1.01 and two thirds of the rounds won) kept an A/A pair in 5
rounds with probability up to 6/32 (19%); on this machine's A/A rounds (the final rounds of runs
that kept nothing: both builds the default binary) it kept 4 of 18 five-round windows and 2 of 6
seven-round runs, the sign test none (docs/model_tuning.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

KEEP_RULE = "sign-test/1"  # logged with each step: a step decided by another rule is re-measured


def sign_test_p(wins: int, rounds: int) -> float:
    """One-sided p-value of `wins` of `rounds` under "as likely to lose as to win"."""
    return sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2.0**rounds


def rounds_to_reach(alpha: float) -> int:
    """The fewest rounds in which winning all of them reaches `alpha`."""
    return max(1, math.ceil(math.log(alpha) / math.log(0.5) - 1e-12))


@dataclass(frozen=True)
class Verdict:
    decision: str  # keep | reject | undecided
    median: float
    wins: int
    rounds: int
    p_value: float

    @property
    def text(self) -> str:
        return (f"median {self.median:.3f}x, faster in {self.wins}/{self.rounds} rounds "
                f"(sign test p={self.p_value:.3f})")


def judge(ratios: Sequence[float], min_speedup: float, alpha: float) -> Verdict:
    """The keep rule above, on the paired ratios measured so far."""
    values = np.asarray(ratios, dtype=float)
    rounds = len(values)
    median = float(np.median(values)) if rounds else 0.0
    wins = int((values > 1.0).sum())
    p_value = sign_test_p(wins, rounds)
    if median > min_speedup and p_value <= alpha:
        decision = "keep"
    elif median <= 1.0 or 2 * wins <= rounds or p_value <= alpha:
        decision = "reject"
    else:
        decision = "undecided"
    return Verdict(decision, median, wins, rounds, p_value)
