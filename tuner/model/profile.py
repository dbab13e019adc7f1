"""Where a model's time goes: its profiled dispatches grouped by problem, which problems are worth
tuning, and how the candidate budget is shared among them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from dispatchtune.measure.runner import DispatchRow
from dispatchtune.problem import Problem
from dispatchtune.targets import Target


@dataclass
class DispatchShare:
    """A tunable problem of the model: its dispatches, their time, the budget it gets."""

    problem: Problem
    dispatches: list[str]
    calls: int
    time_ms: float
    share: float
    slowest: str  # the dispatch whose dumped benchmark is tuned
    budget: int = 0
    # Why this problem was not tuned ("" while it may be): an op IREE cannot be given a spec for,
    # a failed default build, not selected, ... (reported in summary.md with its share).
    skip_reason: str = ""

    @property
    def key(self) -> str:
        return self.problem.key


_DISPATCH_INDEX = re.compile(r"_dispatch_(\d+)(?:_|$)")


def dispatch_index(name: str) -> int | None:
    match = _DISPATCH_INDEX.search(name)
    return int(match.group(1)) if match else None


def attribute_time(
    rows: Sequence[DispatchRow], problems: Sequence[Problem]
) -> tuple[list[DispatchShare], float, float]:
    """Group the profiled dispatches by problem key; returns (shares by time, other ms, total ms).

    A spec matches by shape, so all dispatches of one key share its configuration and its time.
    Dispatches without a tunable root op (elementwise, reductions) are `other`.
    """
    by_index: dict[int, Problem] = {}
    for candidate in problems:
        position = dispatch_index(candidate.name)
        if position is not None and position not in by_index:
            by_index[position] = candidate
    total = sum(r.time_ms for r in rows)
    groups: dict[str, DispatchShare] = {}
    slowest_ms: dict[str, float] = {}
    other = 0.0
    for row in rows:
        index = dispatch_index(row.name)
        problem = by_index.get(index) if index is not None else None
        if problem is None:
            other += row.time_ms
            continue
        group = groups.get(problem.key)
        if group is None:
            group = groups[problem.key] = DispatchShare(problem, [], 0, 0.0, 0.0, row.name)
            slowest_ms[problem.key] = -1.0
        group.dispatches.append(row.name)
        group.calls += row.calls
        group.time_ms += row.time_ms
        if row.time_ms > slowest_ms[problem.key]:
            slowest_ms[problem.key], group.slowest = row.time_ms, row.name
    shares = sorted(groups.values(), key=lambda g: g.time_ms, reverse=True)
    for group in shares:
        group.share = group.time_ms / total if total > 0 else 0.0
    return shares, other, total


def configurable_reason(problem: Problem, target: Target) -> str:
    """"" when `problem` has at least one valid configuration on `target`, else why not.

    Checked before any budget is given or anything compiled: enumerating one candidate builds
    the Z3 model, which refuses known IREE limits (`UnsupportedProblem`) in one line.
    """
    from dispatchtune.errors import DispatchTuneError
    from dispatchtune.search import enumerate_candidates

    try:
        found = enumerate_candidates(problem, target, limit=1)
    except DispatchTuneError as exc:
        return str(exc)
    return "" if len(found) else "no valid configuration in the search space"


def select_dispatches(
    shares: Sequence[DispatchShare], coverage: float, max_dispatches: int, min_share: float
) -> list[DispatchShare]:
    """The slowest problems until they cover `coverage` of the model's time."""
    chosen: list[DispatchShare] = []
    covered = 0.0
    for share in shares:  # slowest first
        if covered >= coverage or len(chosen) >= max_dispatches or share.share < min_share:
            break
        chosen.append(share)
        covered += share.share
    return chosen


def allocate_budget(weights: Sequence[float], budget: int, min_each: int) -> list[int]:
    """Split `budget` in proportion to `weights`, each entry getting at least `min_each`.

    Entries whose proportional part is below `min_each` are raised to it and the rest is shared
    by the others in proportion; rounding gives the leftovers to the largest remainders. When the
    budget cannot give every entry `min_each`, the lightest entries (weights come sorted, heaviest
    first) get 0: a dispatch measured once cannot be judged against the default's noise anyway.
    """
    count = len(weights)
    while count > 1 and count * min_each > budget:
        count -= 1
    alloc = [0] * len(weights)
    if count == 0 or budget <= 0:
        return alloc
    floor = min(min_each, budget // count)
    w = np.asarray(weights[:count], dtype=float)
    w = w if w.sum() > 0 else np.ones(count)
    exact = np.zeros(count)
    fixed = np.zeros(count, dtype=bool)
    while True:
        free = ~fixed
        exact[free] = (budget - floor * fixed.sum()) * w[free] / w[free].sum()
        exact[fixed] = floor
        low = free & (exact < floor)
        if not low.any():
            break
        fixed |= low
    whole = np.floor(exact).astype(int)
    order = np.argsort(-(exact - whole), kind="stable")
    for i in order[: budget - int(whole.sum())]:
        whole[i] += 1
    for i in range(count):
        alloc[i] = int(whole[i])
    return alloc

