"""`OnlineSearch`: ask-and-tell search over a fixed candidate set that learns from its own run.

The cost model's scores are the prior, one opinion in a portfolio of priors weighed by how well
each ranks the run's own measurements. Until a few candidates are measured, candidates are asked
in prior order (every second ask another opinion's top or a random one, a challenge to the given
prior that a confident prior stops taking once challengers lose; a coarse opinion's tied top is
ordered by the given prior). From then on a small
extra-trees forest is refitted on the run's own measurements (the candidates' features, their raw
knobs, the knobs' power-of-two structure, the log2 products of every two size knobs and the
priors as more columns; label: the measured rank, mapped to normal scores), and each ask is one
of these steps, chosen by Thompson sampling on each step's record in this run (a proposal wins
when its time ranks among the best fifth measured before it):
- prior: the next candidate of the priors' weighted order;
- global: the highest upper confidence bound (mean + kappa x spread of the trees) over all
  candidates, blended with the priors, so the model's doubt is explored, not just its belief;
- local: the most promising candidate (a wider bound) among those one knob away from one of the
  best few measured; it climbs out of regions a deceptive average points to;
- evolved: a crossover or two-knob mutation of the best few measured.
A small fraction of asks is uniformly random: it keeps a wrong prior and a confident forest from
hiding a region forever. Failed candidates are told as `None` and learnt as slower than anything
measured.

The class only sees row positions and times; the tuning loop (through the Optuna sampler in
`search.optuna_search`) and the evaluation harness (replaying measured datasets) drive it alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel, size_knobs
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
    local_every: int = 2  # every n-th ask after the first refit is local (0: never; bandit: on/off)
    local_kappa: float = 4.0  # the local step's spread weight: neighbours are cheap to check
    local_incumbents: int = 3  # the local step searches around this many best measured
    evolve_every: int = 4  # every n-th ask breeds from the best (0: never; bandit: on/off)
    parents: int = 5  # evolutionary moves breed from this many best measured
    opinion_every: int = 2  # before the first refit, every n-th ask follows another prior (0: never)
    prior_steps: bool = True  # the priors' combined order is a step after the first refit
    prior_belief: float = 4.0  # measurements the given prior's trust is worth before evidence
    bandit: bool = True  # choose the step by Thompson sampling on its record (False: fixed cycle)
    credit_quantile: float = 0.2  # a step wins when its result is among this best share so far
    pair_sizes: bool = True  # log2 products of every two size knobs as forest columns
    credit_memory: float = 0.95  # discount of a step's older wins and losses per result
    challenges: bool = True  # a confident given prior keeps the initial asks once challengers lost
    confident_offset: bool = True  # a confident given prior asks its top three before a challenge
    tie_by_given: bool = True  # another opinion's tied candidates are ordered by the given prior


#: The steps after the first refit (see `OnlineSearch._next`).
STEPS = ("prior", "global", "local", "evolved", "random")


class OnlineSearch:
    """Ask-and-tell over the rows of `features`; `prior` scores (higher = better) seed the order."""

    def __init__(
        self,
        features: pd.DataFrame | np.ndarray,
        prior: Sequence[float] | np.ndarray,
        seed: int = 0,
        settings: OnlineSettings | None = None,
        knobs: pd.DataFrame | None = None,
        priors: Mapping[str, Sequence[float] | np.ndarray] | None = None,
    ) -> None:
        x = np.asarray(features, dtype=np.float64)
        self.settings = settings or OnlineSettings()
        # Knob values define the local step's neighbourhoods (none without knobs).
        self.knob_values = np.empty((x.shape[0], 0))
        if knobs is not None and len(knobs.columns):
            self.knob_values = numeric_knobs(knobs)
            # The raw knobs tell apart candidates that the shared feature vocabulary maps to the
            # same row; without them the forest keeps asking for twins of a measured candidate.
            x = np.column_stack([x, self.knob_values, power_of_two_part(knobs)])
            if self.settings.pair_sizes:
                x = np.column_stack([x, pair_sizes(knobs)])
        prior_arr = np.asarray(prior, dtype=np.float64)
        if x.ndim != 2 or prior_arr.shape != (x.shape[0],):
            raise InputError(f"{prior_arr.shape} prior scores for a {x.shape} feature table")
        self.rng = np.random.default_rng(seed)
        # The portfolio: the given prior first, then other opinions (named `priors`, and the knob
        # heuristic where there are size knobs); each is trusted as far as it predicts this run's
        # own measurements (`_prior_weights`), so a prior that does not transfer loses its say.
        named = {"prior": prior_arr, **{k: np.asarray(v, dtype=np.float64) for k, v in
                                         (priors or {}).items()}}
        if knobs is not None and size_knobs(knobs):
            named.setdefault("knobs", KnobHeuristicModel().predict(knobs))
        for name, scores in named.items():
            if scores.shape != (x.shape[0],):
                raise InputError(f"{scores.shape} {name} scores for a {x.shape} feature table")
        self.prior_names = list(named)
        self.priors_z = np.column_stack([_zscore(_finite(v)) for v in named.values()])
        self.prior_z = self.priors_z[:, 0]
        self.belief = np.zeros(len(named))
        self.belief[0] = 1.0
        self.weights = self.belief.copy()  # each prior's current weight (`_prior_weights`)
        self._tiebreak = 1e-9 * self.rng.random(x.shape[0])  # seeded order among equal scores
        # The priors become more columns: the forest learns where to trust each.
        self.x = np.nan_to_num(np.column_stack([x, self.priors_z]), nan=0.0, posinf=0.0, neginf=0.0)
        n = x.shape[0]
        # Prior order with a seeded tie-break: solver order clusters similar candidates.
        self._prior_orders = [order_by_score(z, self.rng) for z in self.priors_z.T]
        if self.settings.tie_by_given:
            self._prior_orders[1:] = [self._order_ties_by_given(z) for z in self.priors_z.T[1:]]
        self._prior_order = self._prior_orders[0]
        self.times = np.full(n, np.nan)  # measured time (inf = failed)
        self.pending: set[int] = set()
        self.skipped = np.zeros(n, dtype=bool)  # never to be asked, no result (e.g. duplicates)
        self._told: list[int] = []
        self._fitted: tuple[np.ndarray, np.ndarray] | None = None  # (global, local) scores
        self._fitted_at = 0
        self._asks = 0
        self.last_step = ""  # which step proposed the last asked row (diagnostics)
        self.steps: list[str] = []  # the step behind every asked row, in ask order
        # The steps' record for the bandit (`_credit`): discounted wins and losses, and which
        # step asked each row still out.
        self._wins = np.zeros(len(STEPS))
        self._losses = np.zeros(len(STEPS))
        self._asked_by: dict[int, int] = {}
        # The initial design as a contest (`_next_initial`): which prior's top asked each row
        # (0: the given prior's), and the challengers' record (won, lost) against its best.
        self._initial_by: dict[int, int] = {}
        self._challenges = np.zeros(2, dtype=np.int64)
        # A given prior with a single top candidate is confident; one whose top is a tie among
        # many (a coarse heuristic, a model that cannot tell its best apart) is not.
        self._confident = bool((self.prior_z == self.prior_z.max()).sum() == 1)

    def _order_ties_by_given(self, scores: np.ndarray) -> np.ndarray:
        """Another opinion's order with its ties broken by the given prior, then by the seed.

        A coarse opinion's top is a block of hundreds of equal scores (the knob heuristic: every
        candidate with power-of-two sizes); its challenge is then the member of that block the
        given prior ranks highest, not an arbitrary one: both opinions are used, not just one."""
        keys = np.vstack([self._tiebreak, -self.prior_z, -scores])  # last key sorts first
        return np.lexsort(keys)

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
            self.steps.append(self.last_step)
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
        self._credit(row, value)
        self._judge_challenge(row, value)

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
            return self._next_initial(free)
        self._asks += 1
        if settings.bandit:
            return self._next_bandit(free)
        self._scores()  # refit now: the priors' weights come from the refit
        # A prior step: the next candidate in the priors' combined order, as often as the priors
        # are trusted (their best rank agreement so far) and not yet outweighed by the run's own
        # model. A prior that ranks the best tenth keeps reaching it while the forest, fitted on
        # a handful of points, would wander off.
        n = self.n_told
        trust = float(self.weights.max()) ** 2 * (1.0 - n / (n + max(1, settings.prior_halflife)))
        if settings.prior_steps and self.rng.random() < trust:
            return self._step("prior", free)
        if settings.evolve_every and self._asks % settings.evolve_every == 1 % settings.evolve_every:
            row = self._step("evolved", free)
            if row is not None:
                return row
        if settings.local_every and self._asks % settings.local_every == 0:
            row = self._step("local", free)
            if row is not None:
                return row
        if self.rng.random() < settings.random_fraction:
            return self._step("random", free)
        return self._step("global", free)

    def _next_bandit(self, free: np.ndarray) -> int | None:
        """Thompson sampling over the steps, each credited by how its proposals ranked among
        the run's measurements when they came back (`_credit`): which step pays differs per space
        (the priors' order on a space they describe, the forest's bound or the local moves on a
        needle), and the run's own results say which."""
        settings = self.settings
        self._scores()  # refit now: the priors' weights come from the refit
        if self.rng.random() < settings.random_fraction:
            return self._step("random", free)
        arms = self._arms()
        draws = self.rng.beta(1.0 + self._wins[arms], 1.0 + self._losses[arms])
        for arm in np.asarray(arms)[np.argsort(-draws)]:
            row = self._step(STEPS[int(arm)], free)
            if row is not None:
                return row
        return self._step("global", free)

    def _arms(self) -> list[int]:
        settings = self.settings
        has_knobs = bool(self.knob_values.shape[1])
        enabled = {"prior": settings.prior_steps, "global": True,
                   "local": has_knobs and settings.local_every > 0,
                   "evolved": has_knobs and settings.evolve_every > 0}
        return [i for i, name in enumerate(STEPS) if enabled.get(name, False)]

    def _step(self, name: str, free: np.ndarray) -> int | None:
        """The row step `name` proposes (None when it has none), remembered for its credit."""
        if name == "prior":
            combined = self.priors_z @ self.weights + self._tiebreak
            row: int | None = int(np.argmax(np.where(free, combined, -np.inf)))
        elif name == "evolved":
            row = self._next_evolved(free)
        elif name == "local":
            row = self._next_local(free)
        elif name == "random":
            row = int(self.rng.choice(np.flatnonzero(free)))
        else:
            acquisition, _ = self._scores()
            row = int(np.argmax(np.where(free, acquisition, -np.inf)))
        if row is not None:
            self.last_step = name
            self._asked_by[row] = STEPS.index(name)
        return row

    def _credit(self, row: int, value: float) -> None:
        """Credit the step that proposed `row`: a win when its time is among the best
        `credit_quantile` of the times measured before it (a failure is a loss). Old evidence
        fades (`credit_memory`): the step that pays early (the priors) is not always the one
        that pays late (local moves around the incumbents)."""
        arm = self._asked_by.pop(row, None)
        if arm is None:
            return
        before = self.times[np.asarray(self._told[:-1], dtype=np.int64)]
        before = before[np.isfinite(before)]
        if before.size == 0:
            return
        win = bool(np.isfinite(value) and value <= np.quantile(before, self.settings.credit_quantile))
        self._wins *= self.settings.credit_memory
        self._losses *= self.settings.credit_memory
        if win:
            self._wins[arm] += 1.0
        else:
            self._losses[arm] += 1.0

    def _next_initial(self, free: np.ndarray) -> int:
        """Before the first refit: the given prior's top, and on every `opinion_every`-th ask
        the next other opinion's top or a uniformly random candidate, in turn. The spread is what
        the priors' trust is first measured on, and gives the forest more than one region.

        A contest (`challenges`): when the given prior is confident (a single top candidate)
        and the challengers have lost more often than they won against its best measured, the
        remaining initial asks stay with it. A right prior (a transfer from a similar GPU) then
        pays for one challenge, not two of its first six asks; a wrong one is beaten by the first
        challenger and keeps being challenged."""
        turn = self.n_told + len(self.pending)
        every = self.settings.opinion_every
        won, lost = self._challenges
        confident = self.settings.challenges and self._confident
        keep = confident and lost > won
        # A confident prior's third candidate comes before the first challenge.
        turn -= int(confident and self.settings.confident_offset)
        # A single prior (no portfolio) keeps its order until the first refit.
        if not every or turn < 2 or turn % every or len(self._prior_orders) == 1 or keep:
            self.last_step = f"initial:{self.prior_names[0]}"
            row = int(next(row for row in self._prior_order if free[row]))
            self._initial_by[row] = 0
            return row
        pick = 1 + (turn // every - 1) % len(self._prior_orders)
        if pick == len(self._prior_orders):
            self.last_step = "initial:random"
            row = int(self.rng.choice(np.flatnonzero(free)))
        else:
            self.last_step = f"initial:{self.prior_names[pick]}"
            row = int(next(row for row in self._prior_orders[pick] if free[row]))
        self._initial_by[row] = pick
        return row

    def _judge_challenge(self, row: int, value: float) -> None:
        """A challenger's initial ask wins when it beats every result of the given prior's own
        initial asks measured before it (a failure loses)."""
        pick = self._initial_by.get(row)
        if not pick:
            return
        own = [r for r in self._told[:-1] if self._initial_by.get(r) == 0]
        if not own:
            return
        self._challenges[0 if value < np.min(self.times[own]) else 1] += 1

    def _next_evolved(self, free: np.ndarray) -> int | None:
        """A child of the best measured: crossover of two parents (each knob from either) or a
        two-knob mutation of one, the free candidate closest to it with the best local bound.

        Local one-knob steps stall in a broad basin; a child two or more knobs away reaches a
        small better basin next to it (a "trap" space), and parents other than the best keep
        several basins alive.
        """
        if not self.knob_values.shape[1]:
            return None
        measured = np.where(np.isfinite(self.times), self.times, np.inf)
        best = [int(r) for r in np.argsort(measured)[: self.settings.parents] if np.isfinite(measured[r])]
        if len(best) < 2:
            return None
        _, local = self._scores()
        mother, father = (self.knob_values[r] for r in self.rng.choice(best, 2, replace=False))
        if self.rng.random() < 0.5:
            child = np.where(self.rng.random(mother.size) < 0.5, mother, father)
            reach = 1
        else:
            child, reach = mother, 2
        distance = (self.knob_values != child).sum(axis=1)
        distance = np.where(free, distance, np.iinfo(np.int64).max)
        nearest = int(distance.min())
        if nearest > max(reach, 1) + 1 or nearest == np.iinfo(np.int64).max:
            return None
        near = distance <= max(nearest, reach)
        return int(np.argmax(np.where(near, local, -np.inf)))

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
        y[ok] = normal_scores(-times[ok])
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
        # Trust moves from the priors to the run's own model as measurements accumulate, and each
        # prior keeps only as much weight as its rank agreement with what was measured so far.
        weight = rows.size / (rows.size + max(1, settings.prior_halflife))
        self.weights = self._prior_weights(rows[ok], y[ok])
        prior = (1.0 - weight) * settings.prior_weight * (self.priors_z @ self.weights)
        return (weight * _zscore(mean + settings.kappa * spread) + prior,
                weight * _zscore(mean + settings.local_kappa * spread) + prior)


    def _prior_weights(self, rows: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Each prior's weight: its rank correlation with the measured results, shrunk towards
        the initial belief (the given prior trusted, the others not) by `prior_belief` pseudo
        measurements. Measured candidates come mostly from the priors' tops, where agreement is
        noisy even for a good prior: only disagreement beyond that noise (~1/sqrt(n)) costs the
        given prior its trust."""
        n = rows.size
        noise = 1.5 / np.sqrt(max(1, n - 1))
        rho = np.array([_spearman(z[rows], y) for z in self.priors_z.T])
        evidence = np.clip(rho, 0.0, 1.0)
        evidence[0] = float(np.clip(rho[0] + noise, 0.0, 1.0))
        c = self.settings.prior_belief
        weights: np.ndarray = (c * self.belief + n * evidence) / (c + n)
        return weights


def _finite(values: np.ndarray) -> np.ndarray:
    """Non-finite scores become the worst finite one (0 when there is none)."""
    finite = np.isfinite(values)
    return np.where(finite, values, values[finite].min() if finite.any() else 0.0)


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


def pair_sizes(knobs: pd.DataFrame) -> np.ndarray:
    """log2 of the product of every two size knobs (threads per block = block x by block y,
    elements per block = block x tile): sums trees would need many splits for."""
    names = size_knobs(knobs)
    logs = {name: np.log2(knobs[name].to_numpy(dtype=np.float64)) for name in names}
    columns = [logs[a] + logs[b] for i, a in enumerate(names) for b in names[i + 1:]]
    return np.column_stack(columns) if columns else np.empty((len(knobs), 0))


def normal_scores(values: np.ndarray) -> np.ndarray:
    """Normal quantiles of the ranks of `values` (higher value, higher score): labels that keep
    the order and ignore how far outliers lie."""
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
    search: OnlineSearch, times: Any, max_benchmarks: int | None = None, batch: int = 1,
    stop: np.ndarray | None = None,
) -> np.ndarray:
    """Drive `search` against measured `times` (inf/NaN = failed); returns the rows in asked order.

    With a boolean mask `stop`, the replay ends once a row it marks has been measured."""
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
        if stop is not None and bool(stop[rows].any()):
            break
    return np.asarray(order, dtype=np.int64)
