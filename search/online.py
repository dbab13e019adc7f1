"""`OnlineSearch`: ask-and-tell search over a fixed candidate set that learns from its own run.

The cost model's scores are the prior: until a few candidates are measured, candidates are asked in
prior order. From then on a small extra-trees forest is refitted on the run's own measurements (the
candidates' features, their raw knobs, the knobs' power-of-two structure and the prior score as
one more column; label: the measured rank, mapped to normal scores) and asks alternate between
- global: the highest upper confidence bound (mean + kappa x spread of the trees) over all
  candidates, so the model's doubt is explored, not just its belief, and
- local: the most promising candidate (a wider bound) among those one knob away from one of the
  best few measured; it climbs out of regions a deceptive average points to (a knob that is
  better on average but not at the optimum).
A small fraction of asks is uniformly random: it keeps a wrong prior and a confident forest from
hiding a region forever. Failed candidates are told as `None` and learnt as slower than anything
measured.

The class only sees row positions and times; the tuning loop (through the Optuna sampler in
`search.optuna_search`) and the evaluation harness (replaying measured datasets) drive it alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.costmodel.knob_heuristic import size_knobs
from dispatchtune.costmodel.order import order_by_score
from dispatchtune.errors import InputError


@dataclass(frozen=True)
class OnlineSettings:
    """Knobs of the online search (defaults chosen on the Kernel Tuner spaces, see docs/search.md)."""

    min_fit: int = 6  # measurements before the first refit: fewer cannot outvote the prior
    kappa: float = 0.5  # weight of the trees' spread in the upper confidence bound
    random_fraction: float = 0.05  # share of uniformly random asks (after the first refit)
    n_trees: int = 32
    refit_growth: float = 0.1  # refit when the measurements grew by this fraction (at least 1)
    prior_weight: float = 1.0  # weight of the prior's z-score in the acquisition, decaying with n
    prior_halflife: int = 20  # measurements after which the prior counts half as much
    local_every: int = 2  # every n-th ask after the first refit is local (0: never)
    local_kappa: float = 4.0  # the local step's spread weight: neighbours are cheap to check
    local_incumbents: int = 3  # the local step searches around this many best measured


class OnlineSearch:
    """Ask-and-tell over the rows of `features`; `prior` scores (higher = better) seed the order."""

    def __init__(
        self,
        features: pd.DataFrame | np.ndarray,
        prior: Sequence[float] | np.ndarray,
        seed: int = 0,
        settings: OnlineSettings | None = None,
        knobs: pd.DataFrame | None = None,
    ) -> None:
        x = np.asarray(features, dtype=np.float64)
        # Knob values define the local step's neighbourhoods (none without knobs).
        self.knob_values = np.empty((x.shape[0], 0))
        if knobs is not None and len(knobs.columns):
            self.knob_values = numeric_knobs(knobs)
            # The raw knobs tell apart candidates that the shared feature vocabulary maps to the
            # same row; without them the forest keeps asking for twins of a measured candidate.
            x = np.column_stack([x, self.knob_values, power_of_two_part(knobs)])
        prior_arr = np.asarray(prior, dtype=np.float64)
        if x.ndim != 2 or prior_arr.shape != (x.shape[0],):
            raise InputError(f"{prior_arr.shape} prior scores for a {x.shape} feature table")
        self.settings = settings or OnlineSettings()
        self.rng = np.random.default_rng(seed)
        prior_arr = np.where(np.isfinite(prior_arr), prior_arr, np.nanmin(prior_arr[np.isfinite(prior_arr)])
                             if np.isfinite(prior_arr).any() else 0.0)
        self.prior_z = _zscore(prior_arr)
        # The prior becomes one more column: the forest learns where to trust it.
        self.x = np.nan_to_num(np.column_stack([x, self.prior_z]), nan=0.0, posinf=0.0, neginf=0.0)
        n = x.shape[0]
        # Prior order with a seeded tie-break: solver order clusters similar candidates.
        self._prior_order = order_by_score(self.prior_z, self.rng)
        self.times = np.full(n, np.nan)  # measured time (inf = failed)
        self.pending: set[int] = set()
        self.skipped = np.zeros(n, dtype=bool)  # never to be asked, no result (e.g. duplicates)
        self._told: list[int] = []
        self._fitted: tuple[np.ndarray, np.ndarray] | None = None  # (global, local) scores
        self._fitted_at = 0
        self._asks = 0

    # -- state ------------------------------------------------------------------------------------
    @property
    def n_candidates(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_told(self) -> int:
        return len(self._told)

    @property
    def best(self) -> float:
        """Fastest measured time (inf before any success)."""
        measured = self.times[np.isfinite(self.times)]
        return float(measured.min()) if measured.size else float("inf")

    def available(self) -> np.ndarray:
        mask = np.isnan(self.times) & ~self.skipped
        if self.pending:
            mask[list(self.pending)] = False
        return mask

    # -- ask / tell -------------------------------------------------------------------------------
    def ask(self, n: int = 1) -> list[int]:
        """Up to `n` row positions to measure next (never one told or pending); they become pending."""
        chosen: list[int] = []
        for _ in range(n):
            row = self._next()
            if row is None:
                break
            self.pending.add(row)
            chosen.append(row)
        return chosen

    def tell(self, row: int, time: float | None) -> None:
        """Record a measurement: a time (lower is better) or `None` for a failed candidate."""
        if not 0 <= row < self.n_candidates:
            raise InputError(f"row {row} outside the {self.n_candidates} candidates")
        self.pending.discard(row)
        if not np.isnan(self.times[row]):
            return  # told twice (e.g. by another worker's trial): the first result stands
        value = float(time) if time is not None and np.isfinite(time) and time > 0 else np.inf
        self.times[row] = value
        self._told.append(row)

    def skip(self, row: int) -> None:
        """Never ask `row`, without learning anything from it (its binary duplicates another's)."""
        self.pending.discard(row)
        self.skipped[row] = True

    def release(self, row: int) -> None:
        """Give a pending row back unmeasured (its build was cancelled); it may be asked again."""
        self.pending.discard(row)

    def stalled(self, margin: float = 0.01, patience: int = 30) -> bool:
        """True when the last `patience` measurements did not beat the best before them by `margin`.

        A plain no-improvement rule: once the model has been refitted many times without finding
        anything better, more benchmarks are unlikely to improve the best by more than the margin.
        """
        if patience <= 0 or len(self._told) <= patience:
            return False
        history = self.times[np.asarray(self._told)]
        before = history[:-patience]
        finite = before[np.isfinite(before)]
        if finite.size == 0:
            return False
        recent = history[-patience:]
        return not bool((recent < finite.min() / (1.0 + margin)).any())

    # -- internals --------------------------------------------------------------------------------
    def _next(self) -> int | None:
        free = self.available()
        if not free.any():
            return None
        settings = self.settings
        successes = int(np.isfinite(self.times).sum())
        if successes < settings.min_fit:
            for row in self._prior_order:
                if free[row]:
                    return int(row)
        self._asks += 1
        if settings.local_every and self._asks % settings.local_every == 0:
            row = self._next_local(free)
            if row is not None:
                return row
        if self.rng.random() < settings.random_fraction:
            return int(self.rng.choice(np.flatnonzero(free)))
        acquisition, _ = self._scores()
        return int(np.argmax(np.where(free, acquisition, -np.inf)))

    def _next_local(self, free: np.ndarray) -> int | None:
        """The best-bounded free candidate one knob away from one of the best few measured."""
        if not self.knob_values.shape[1]:
            return None
        _, local = self._scores()
        measured = np.where(np.isfinite(self.times), self.times, np.inf)
        for incumbent in np.argsort(measured)[: self.settings.local_incumbents]:
            if not np.isfinite(measured[incumbent]):
                break
            near = free & ((self.knob_values != self.knob_values[incumbent]).sum(axis=1) <= 1)
            if near.any():
                return int(np.argmax(np.where(near, local, -np.inf)))
        return None

    def _scores(self) -> tuple[np.ndarray, np.ndarray]:
        """The global and local acquisition scores, refitted on every new result while there are
        few, then whenever the results grew by `refit_growth`."""
        grown = self.n_told - self._fitted_at
        if self._fitted is None or grown >= max(1, int(self.settings.refit_growth * self._fitted_at)):
            self._fitted = self._fit_acquisition()
            self._fitted_at = self.n_told
        return self._fitted

    def _fit_acquisition(self) -> tuple[np.ndarray, np.ndarray]:
        """Global and local acquisition scores of every row (higher = ask sooner)."""
        from sklearn.ensemble import ExtraTreesRegressor

        settings = self.settings
        rows = np.asarray(self._told)
        times = self.times[rows]
        ok = np.isfinite(times)
        y = np.empty(rows.size)
        # Normal scores of the measured ranks: a few 100x-slow outliers would otherwise dominate
        # the squared loss and flatten everything near the top, which is all that matters here.
        y[ok] = _normal_scores(-times[ok])
        # Failures are slower than anything measured: the forest learns to avoid their region.
        y[~ok] = y[ok].min() - 1.0 if ok.any() else -1.0
        # Extra-trees: randomised splits give a useful spread on tens of points, where bootstrap
        # forests of deep trees mostly agree; shallow leaves keep the spread from collapsing.
        forest = ExtraTreesRegressor(
            n_estimators=settings.n_trees,
            min_samples_leaf=2,
            max_features=0.5,
            random_state=int(self.rng.integers(2**31 - 1)),
            n_jobs=1,
        ).fit(self.x[rows], y)
        per_tree = np.stack([tree.predict(self.x) for tree in forest.estimators_])
        mean, spread = per_tree.mean(axis=0), per_tree.std(axis=0)
        # Trust moves from the prior to the run's own model as measurements accumulate, and the
        # prior keeps only as much weight as its rank agreement with what was measured so far.
        weight = rows.size / (rows.size + max(1, settings.prior_halflife))
        # Measured candidates mostly come from the prior's top, where rank agreement is noisy
        # even for a good prior: only disagreement beyond that noise (~1/sqrt(n)) costs trust.
        rho = _spearman(self.prior_z[rows[ok]], y[ok])
        agreement = float(np.clip(1.0 + rho + 1.5 / np.sqrt(max(1, int(ok.sum()) - 1)), 0.0, 1.0))
        prior = (1.0 - weight) * settings.prior_weight * agreement * self.prior_z
        return (weight * _zscore(mean + settings.kappa * spread) + prior,
                weight * _zscore(mean + settings.local_kappa * spread) + prior)


def numeric_knobs(knobs: pd.DataFrame) -> np.ndarray:
    """The knob table as numbers: numeric columns as they are, other columns as category codes."""
    columns = []
    for name in knobs.columns:
        column = knobs[name]
        if pd.api.types.is_numeric_dtype(column) or pd.api.types.is_bool_dtype(column):
            columns.append(column.to_numpy(dtype=np.float64))
        else:
            columns.append(pd.factorize(column.astype(str), sort=True)[0].astype(np.float64))
    return np.column_stack(columns) if columns else np.empty((len(knobs), 0))


def power_of_two_part(knobs: pd.DataFrame) -> np.ndarray:
    """log2 of the largest power of two dividing each positive integer knob with more than two
    values: GPU and CPU kernels favour power-of-two sizes, a pattern trees need many splits for."""
    columns = []
    for name in size_knobs(knobs):
        values = knobs[name].to_numpy(dtype=np.int64)
        columns.append(np.log2(values & -values))
    return np.column_stack(columns) if columns else np.empty((len(knobs), 0))


def _normal_scores(values: np.ndarray) -> np.ndarray:
    """Normal quantiles of the ranks of `values` (higher value, higher score)."""
    ranks = pd.Series(values).rank(method="average").to_numpy()
    quantile = np.vectorize(NormalDist().inv_cdf, otypes=[np.float64])
    return np.asarray(quantile((ranks - 0.5) / values.size), dtype=np.float64)


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (0 when undefined: fewer than 3 points or a constant side)."""
    if a.size < 3:
        return 0.0
    ra = pd.Series(a).rank().to_numpy()
    rb = pd.Series(b).rank().to_numpy()
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def _zscore(values: np.ndarray) -> np.ndarray:
    std = values.std()
    return (values - values.mean()) / std if std > 0 else np.zeros_like(values)


def replay(
    search: OnlineSearch, times: Any, max_benchmarks: int | None = None, batch: int = 1
) -> np.ndarray:
    """Drive `search` against measured `times` (inf/NaN = failed); returns the rows in asked order."""
    measured = np.asarray(times, dtype=np.float64)
    if measured.shape != (search.n_candidates,):
        raise InputError(f"{measured.size} times for {search.n_candidates} candidates")
    limit = search.n_candidates if max_benchmarks is None else min(max_benchmarks, search.n_candidates)
    order: list[int] = []
    while len(order) < limit:
        rows = search.ask(min(batch, limit - len(order)))
        if not rows:
            break
        for row in rows:
            value = measured[row]
            search.tell(row, float(value) if np.isfinite(value) else None)
        order.extend(rows)
    return np.asarray(order, dtype=np.int64)
