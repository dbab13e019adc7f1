"""The evaluation harness: replay measured spaces and count benchmarks to a near-optimal candidate.

`dispatchtune evaluate --dataset PATH... --orders random,heuristic,rf,gbm,lambdarank,online,tpe`
treats each measured space (a Kernel Tuner cache, or each problem of `results.jsonl` logs / the
shipped CPU dataset) as the benchmark: an ordering "benchmarks" a candidate by looking up its
measured time. For every space, ordering and seed it records how many benchmarks it took to
reach the first candidate within `threshold` of the space's best (NaN if not within
`max_benchmarks`), next to the exact random expectation (N+1)/(k+1).

Orders:
- `random`: a seeded uniform permutation (its exact expectation is in every row too);
- `heuristic`: the handwritten model, ties broken by the seed (on a space without features, e.g.
  Kernel Tuner's convolution, the knob heuristic: power-of-two sizes first);
- `knobs`: the knob heuristic (power-of-two size knobs first) on every space;
- `rf`, `gbm`, `lambdarank`: learned models trained without the space they are scored on
  (leave-one-problem-out; `split="workload"` also leaves out the same workload measured on
  other devices, `split="device"` the space's whole device);
- `online`: `search.online.OnlineSearch` from a portfolio of priors (gbm when other spaces can
  train it, a forest over the raw knobs of the same kernel's other spaces, the handwritten and
  knob heuristics), each weighed by how well it predicts the run's own results; a learned prior
  leads only where it learnt from the space's architecture (`_online_priors`);
- `tpe`: Optuna's TPE over the raw knobs (each knob categorical over its values); a proposed
  combination that is not a measured configuration costs no benchmark but is counted in
  `invalid_proposals`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dispatchtune.costmodel.order import order_by_score
from dispatchtune.datasets.spaces import load_spaces
from dispatchtune.errors import InputError
from dispatchtune.features.kerneltuner import same_architecture
from dispatchtune.features.spaces import has_features, space_features
from dispatchtune.logs import progress_mode

logger = logging.getLogger(__name__)

#: The orderings the harness replays (not the tuner's `--order` choices, `tuner.loop.TUNE_ORDERS`).
EVALUATION_ORDERS = ("random", "heuristic", "knobs", "rf", "gbm", "lambdarank", "online", "tpe")
LEARNED = ("rf", "gbm", "lambdarank")
#: What a learned model scoring a space leaves out of its training (`_Models.sources`).
SPLITS = ("problem", "workload", "device")
STOCHASTIC = ("random", "online", "tpe")
COLUMNS = (
    "problem", "device", "order", "seed", "n_candidates", "n_good", "benchmarks_to_threshold",
    "random_expected", "invalid_proposals", "evaluated", "best_so_far",
)
HIT_BUDGETS = (10, 50, 200)
#: TPE stops after this many proposals (repeats and invalid points included) per benchmark allowed.
TPE_PROPOSALS_PER_BENCHMARK = 3
CURVE_POINTS = 1000


def hit_budgets(max_benchmarks: int) -> tuple[int, ...]:
    """The B of the hit@B columns (share of runs within B benchmarks) of a replay of at most
    `max_benchmarks` per run: `HIT_BUDGETS` up to it, and the cap itself when it cuts them short.
    A larger B would only repeat the cap's figure under a name that promises more benchmarks."""
    budgets = tuple(b for b in HIT_BUDGETS if b <= max_benchmarks)
    return budgets if max_benchmarks >= HIT_BUDGETS[-1] or max_benchmarks in budgets else (
        *budgets, max_benchmarks)


@dataclass
class ReplaySpace:
    """One measured space: valid candidates' times, their features (None: no mapping) and knobs."""

    problem: str
    device: str
    source: str
    times: np.ndarray
    knobs: pd.DataFrame
    features: pd.DataFrame | None
    workload: str  # what it computes on any device (`MeasuredSpace.workload`)

    @property
    def n(self) -> int:
        return len(self.times)

    def good(self, threshold: float) -> np.ndarray:
        return self.times <= self.times.min() * (1.0 + threshold)


# ---- loading ---------------------------------------------------------------------------------
def load_replay_spaces(paths: Sequence[str | Path]) -> list[ReplaySpace]:
    """Every measured space in `paths` (`datasets.spaces.load_spaces`), with its features where
    the feature vocabulary covers it."""
    return [
        ReplaySpace(s.label, s.device, s.source, s.times, s.knobs,
                    space_features(s) if has_features(s) else None, s.workload)
        for s in load_spaces(paths)
    ]


# ---- orders ----------------------------------------------------------------------------------
class _Models:
    """Learned models per held-out space, trained once and reused across seeds."""

    def __init__(self, spaces: Sequence[ReplaySpace], split: str) -> None:
        self.all_spaces = list(spaces)
        self.spaces = [s for s in spaces if s.features is not None]
        self.split = split
        self.cache: dict[tuple[str, str], Any] = {}

    def scores(self, kind: str, space: ReplaySpace) -> np.ndarray | None:
        if space.features is None:
            return None
        key = (kind, space.problem)
        if key not in self.cache:
            self.cache[key] = self._train(kind, space)
        model = self.cache[key]
        return None if model is None else np.asarray(model.predict(space.features), dtype=float)

    def sources(self, kind: str, held_out: ReplaySpace) -> list[ReplaySpace]:
        """The spaces a `kind` model for `held_out` learns from (never `held_out` itself): every
        other space with features (gbm, rf, ...), or, for the transferred model, the other spaces
        with all of `held_out`'s knobs, those of the same architecture only where there
        are any (a weaker teacher is not mixed in with a closer one)."""
        others = [s for s in self.all_spaces if s.problem != held_out.problem
                  and not (self.split == "device" and s.device == held_out.device)
                  and not (self.split == "workload" and s.workload == held_out.workload)]
        if kind != "transfer":
            return [s for s in others if s.features is not None]
        names = set(held_out.knobs.columns)
        same_kernel = [s for s in others if names and names <= set(s.knobs.columns)]
        close = [s for s in same_kernel if same_architecture(s.device, held_out.device)]
        return close or same_kernel

    def learnt_here(self, kind: str, space: ReplaySpace) -> bool:
        """Whether a `kind` model for `space` learnt from a device of its architecture."""
        return any(same_architecture(s.device, space.device) for s in self.sources(kind, space))

    def _train(self, kind: str, held_out: ReplaySpace) -> Any:
        from dispatchtune.costmodel.learned import labels_from_times, make_model

        train = self.sources(kind, held_out)
        if not train:
            return None
        features = pd.concat([s.features for s in train if s.features is not None],
                             ignore_index=True)
        times = np.concatenate([s.times for s in train])
        groups = np.concatenate([np.full(s.n, s.problem, dtype=object) for s in train])
        return make_model(kind, n_jobs=2).fit(features, labels_from_times(times), groups)


    def transfer(self, space: ReplaySpace) -> np.ndarray | None:
        """Scores from the other measured spaces of the same kernel (other devices): a forest over
        the raw knobs they share with `space` (None when no other space has all its knobs).

        What a performance engineer on a new GPU has: caches of the same kernel measured on other
        GPUs. Labels are each space's normal-scored ranks; a space with more knobs contributes the
        best of its configurations that agree on the shared ones.
        """
        key = ("transfer", space.problem)
        if key not in self.cache:
            self.cache[key] = self._transfer(space)
        scores: np.ndarray | None = self.cache[key]
        return scores

    def _transfer(self, space: ReplaySpace) -> np.ndarray | None:
        from sklearn.ensemble import ExtraTreesRegressor

        from dispatchtune.search.online import normal_scores, numeric_knobs, power_of_two_part

        names = list(space.knobs.columns)
        train = self.sources("transfer", space)
        if not train:
            return None
        parts = [s.knobs.loc[:, names].assign(_y=normal_scores(-s.times))
                 .groupby(names, as_index=False).agg(_y=("_y", "max")) for s in train]
        data = pd.concat(parts, ignore_index=True)
        # One encoding for training and scored rows (category codes must agree).
        both: pd.DataFrame = pd.concat([data.loc[:, names], space.knobs.loc[:, names]],
                                       ignore_index=True)
        x = np.column_stack([numeric_knobs(both), power_of_two_part(both)])
        model = ExtraTreesRegressor(n_estimators=64, min_samples_leaf=3, max_features=0.5,
                                    random_state=0, n_jobs=1).fit(x[: len(data)], data["_y"])
        return np.asarray(model.predict(x[len(data):]), dtype=np.float64)


def _heuristic_scores(space: ReplaySpace) -> np.ndarray:
    """The handwritten heuristic; over the raw knobs where the feature vocabulary does not reach."""
    from dispatchtune.costmodel.heuristic import HeuristicModel
    from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel

    if space.features is None:
        return np.asarray(KnobHeuristicModel().predict(space.knobs), dtype=float)
    return np.asarray(HeuristicModel().predict(space.features), dtype=float)


def _knob_scores(space: ReplaySpace) -> np.ndarray:
    from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel

    return np.asarray(KnobHeuristicModel().predict(space.knobs), dtype=float)


def _online_priors(space: ReplaySpace, models: _Models) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The online search's portfolio: the main prior (gbm where features exist, else the model
    transferred from the same kernel's other spaces, else the handwritten heuristic where
    features exist, else the knob heuristic) and the others as opinions; the search adds the
    knob heuristic.

    A learned model leads only where it learnt from a device of the space's architecture
    (`same_architecture`: vendor and generation); learnt on other architectures only (a model
    learnt on NVIDIA Turing GPUs on an Ampere or an AMD one), it is one more opinion and a
    heuristic leads: which thread counts and tile shapes are fast differs across architectures,
    and a wrong given prior costs the initial design and the prior
    steps before the run's own measurements outvote it (docs/search.md part 7)."""
    candidates = {"gbm": models.scores("gbm", space), "transfer": models.transfer(space)}
    if space.features is not None:
        candidates["heuristic"] = _heuristic_scores(space)
    available = {k: v for k, v in candidates.items() if v is not None}
    leaders = [k for k in available if k == "heuristic" or models.learnt_here(k, space)]
    demoted = [k for k in available if k != "heuristic" and k not in leaders]
    if demoted:
        logger.info("%s: %s learnt on other architectures only: one opinion, not the lead",
                    space.problem, " and ".join(demoted))
    if not leaders:
        return _knob_scores(space), available
    return available.pop(leaders[0]), available


def _online_order(space: ReplaySpace, priors: tuple[np.ndarray, dict[str, np.ndarray]], seed: int,
                  limit: int, stop: np.ndarray | None = None) -> np.ndarray:
    from dispatchtune.search.online import OnlineSearch, replay

    features = space.features if space.features is not None else pd.DataFrame(index=space.knobs.index)
    search = OnlineSearch(features, priors[0], seed=seed, knobs=space.knobs, priors=priors[1])
    return replay(search, space.times, max_benchmarks=limit, stop=stop)


def _tpe_order(space: ReplaySpace, seed: int, limit: int) -> tuple[np.ndarray, int]:
    """Rows TPE benchmarks (in order) and how many of its proposals were not valid configs.

    An invalid combination costs no benchmark; it is told as slower than anything measured
    (twice the slowest time) rather than as a failed trial: TPE ignores failed trials and would
    keep proposing invalid points (kerneltuner_replay.md), spending minutes of Optuna work per run.
    """
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    knobs = space.knobs.astype(str)
    choices = {c: sorted(knobs[c].unique().tolist()) for c in knobs.columns}
    lookup = {tuple(row): i for i, row in enumerate(knobs.itertuples(index=False, name=None))}
    study = optuna.create_study(direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=seed))
    penalty = 2.0 * float(space.times.max())  # a space holds valid candidates only
    order: list[int] = []
    seen: set[int] = set()
    invalid = 0
    for _ in range(TPE_PROPOSALS_PER_BENCHMARK * limit):
        if len(order) >= limit or len(seen) == space.n:
            break
        trial = study.ask()
        config = tuple(trial.suggest_categorical(c, choices[c]) for c in knobs.columns)
        row = lookup.get(config)
        if row is None:
            invalid += 1
            study.tell(trial, penalty)
            continue
        if row not in seen:
            seen.add(row)
            order.append(row)
        study.tell(trial, float(space.times[row]))
    return np.asarray(order, dtype=np.int64), invalid


# ---- replay ----------------------------------------------------------------------------------
def _row(space: ReplaySpace, order_name: str, seed: int, order: np.ndarray, threshold: float,
         invalid: int = 0) -> dict[str, Any]:
    good = space.good(threshold)
    hits = good[order]
    first = int(np.argmax(hits)) + 1 if hits.any() else float("nan")
    best = space.times.min()
    curve = best / np.minimum.accumulate(space.times[order[:CURVE_POINTS]])
    k = int(good.sum())
    return {
        "problem": space.problem, "device": space.device, "order": order_name, "seed": seed,
        "n_candidates": space.n, "n_good": k, "benchmarks_to_threshold": float(first),
        "random_expected": (space.n + 1) / (k + 1),
        "invalid_proposals": invalid if order_name == "tpe" else 0,
        "evaluated": len(order),
        "best_so_far": json.dumps([round(float(v), 4) for v in curve]),
    }


def replay_spaces(
    spaces: Sequence[ReplaySpace],
    orders: Sequence[str],
    seeds: Sequence[int],
    threshold: float = 0.05,
    max_benchmarks: int = 1000,
    split: str = "problem",
    progress: bool | None = None,
    only: Sequence[str] | None = None,
    stop_at_hit: bool = False,
) -> pd.DataFrame:
    """One row per (space, order, seed): see `COLUMNS`. Orders without what they need are skipped.

    `only` names the spaces to replay (default: all); the others still train learned models.
    `stop_at_hit` ends online runs at their first hit (same count, shorter `evaluated` and curve).
    `progress` as `tune`'s (`logs.progress_mode`): None is a bar on a terminal, else a line per
    space and order.
    """
    unknown = [o for o in orders if o not in EVALUATION_ORDERS]
    if unknown:
        raise InputError(f"unknown order {unknown[0]!r}; choose from {', '.join(EVALUATION_ORDERS)}")
    if threshold <= 0:
        raise InputError("--threshold must be > 0")
    if split not in SPLITS:
        raise InputError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    models = _Models(spaces, split)
    rows = []
    jobs = [(s, o) for s in spaces for o in orders if only is None or s.problem in only]
    mode = progress_mode(progress)
    for done, (space, name) in enumerate(tqdm(jobs, desc="replaying", disable=mode != "bar")):
        if mode == "lines":
            logger.info("[%d/%d] replaying %s on %s", done + 1, len(jobs), name, space.problem)
        limit = min(max_benchmarks, space.n)
        if name in LEARNED:
            scores = models.scores(name, space)
        elif name == "heuristic":
            scores = _heuristic_scores(space)
        elif name == "knobs":
            scores = _knob_scores(space)
        else:
            scores = None
        if name in (*LEARNED, "heuristic", "knobs") and scores is None:
            continue  # no features for this space, or no other space to learn from
        priors = _online_priors(space, models) if name == "online" else None
        for seed in seeds:
            invalid = 0
            if name == "random":
                order = np.random.default_rng(seed).permutation(space.n)[:limit]
            elif name == "online":
                assert priors is not None
                stop = space.good(threshold) if stop_at_hit else None
                order = _online_order(space, priors, seed, limit, stop)
            elif name == "tpe":
                order, invalid = _tpe_order(space, seed, limit)
            else:
                assert scores is not None
                order = order_by_score(scores, seed)[:limit]
            rows.append(_row(space, name, seed, order, threshold, invalid))
    return pd.DataFrame(rows, columns=list(COLUMNS))


def replay_rows(
    datasets: Sequence[str | Path],
    orders: Sequence[str],
    seeds: Sequence[int],
    threshold: float = 0.05,
    max_benchmarks: int = 1000,
    split: str = "problem",
    progress: bool | None = None,
) -> pd.DataFrame:
    """`replay_spaces` over every space of `datasets` (paths)."""
    return replay_spaces(load_replay_spaces(datasets), orders, seeds, threshold, max_benchmarks, split,
                         progress)


# ---- summary and report ------------------------------------------------------------------------
def _bootstrap_median_ci(values: np.ndarray, seed: int = 0, rounds: int = 1000) -> tuple[float, float]:
    if values.size == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(values, size=(rounds, values.size)), axis=1)
    return float(np.percentile(medians, 2.5)), float(np.percentile(medians, 97.5))


def _top_score(row: pd.Series, k: int) -> float:
    curve = json.loads(row["best_so_far"])
    return float(curve[min(k, len(curve)) - 1]) if curve else float("nan")


def summarize(rows: pd.DataFrame, max_benchmarks: int = 1000) -> pd.DataFrame:
    """Per (problem, order) and per order over all problems: median/mean/p90 with a bootstrap 95%
    CI of the median, hit rates within 10/50/200 benchmarks (`hit_budgets`: none beyond
    `max_benchmarks`), top-1/top-5 and the random figure.

    Runs that never reached the threshold count as `max_benchmarks + 1` in the statistics (so a
    median is an honest lower bound) and as misses in the hit rates.
    """
    if rows.empty:
        return pd.DataFrame()
    frame = rows.copy()
    frame["b"] = frame["benchmarks_to_threshold"].fillna(max_benchmarks + 1)
    frame["top1"] = frame.apply(_top_score, axis=1, k=1)
    frame["top5"] = frame.apply(_top_score, axis=1, k=5)
    out = []
    keys: list[tuple[str, pd.DataFrame]] = [
        (str(problem), group) for problem, group in frame.groupby("problem", sort=False)
    ]
    keys.append(("ALL", frame))
    for problem, group in keys:
        for order, g in group.groupby("order", sort=False):
            values = g["b"].to_numpy(dtype=float)
            if problem == "ALL":
                # Over problems: each problem's median over seeds, so seeds do not outweigh spaces.
                values = g.groupby("problem")["b"].median().to_numpy(dtype=float)
                random_expected = float(g.groupby("problem")["random_expected"].first().median())
            else:
                random_expected = float(g["random_expected"].iloc[0])
            low, high = _bootstrap_median_ci(values)
            record: dict[str, Any] = {
                "problem": problem, "order": order, "runs": len(g),
                "median": float(np.median(values)), "ci_low": low, "ci_high": high,
                "mean": float(values.mean()), "p90": float(np.percentile(values, 90)),
                "random_expected": random_expected,
            }
            record["x_fewer_than_random"] = random_expected / record["median"]
            for budget in hit_budgets(max_benchmarks):
                record[f"hit@{budget}"] = float((g["benchmarks_to_threshold"] <= budget).mean())
            record["top1"] = float(g["top1"].mean())
            record["top5"] = float(g["top5"].mean())
            record["invalid_proposals"] = float(g["invalid_proposals"].mean())
            out.append(record)
    return pd.DataFrame(out)


def _markdown_table(table: pd.DataFrame) -> str:
    shown = table.copy()
    for column in shown.columns:
        if shown[column].dtype.kind == "f":
            shown[column] = shown[column].map(lambda v: f"{v:.3g}" if np.isfinite(v) else "n/a")
    header = "| " + " | ".join(map(str, shown.columns)) + " |"
    rule = "|" + "---|" * len(shown.columns)
    body = ["| " + " | ".join(map(str, r)) + " |" for r in shown.itertuples(index=False, name=None)]
    return "\n".join([header, rule, *body])


def plot_best_so_far(rows: pd.DataFrame, path: Path, max_benchmarks: int = 1000) -> Path:
    """Best-so-far (best time / best found) against benchmarks: one panel per space, one line per
    order (median over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = list(dict.fromkeys(rows["problem"]))
    shown = problems[:12]
    cols = min(3, len(shown))
    nrows = -(-len(shown) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.6 * nrows), squeeze=False)
    # One style per order across every panel (a space without some order must not shift the
    # colours of the rest); past ten orders the colours repeat dashed.
    palette = [plt.get_cmap("tab10")(i) for i in range(10)]
    styles = {order: {"color": palette[i % 10], "linestyle": "-" if i < 10 else "--",
                      "linewidth": 2.2 if order == "online" else 1.3}
              for i, order in enumerate(dict.fromkeys(rows["order"]))}
    handles: dict[str, Any] = {}
    for ax, problem in zip(axes.flat, shown, strict=False):
        group = rows[rows["problem"] == problem]
        for order, g in group.groupby("order", sort=False):
            curves = [json.loads(c) for c in g["best_so_far"]]
            length = min(max(len(c) for c in curves), max_benchmarks)
            padded = np.array([np.pad(c, (0, length - len(c)), mode="edge") if c else
                               np.zeros(length) for c in curves])
            (line,) = ax.plot(np.arange(1, length + 1), np.median(padded, axis=0),
                              label=str(order), **styles[order])
            handles.setdefault(str(order), line)
        ax.set_xscale("log")
        ax.axhline(1 / 1.05, color="grey", linestyle=":", linewidth=1)
        ax.set_title(problem[:48], fontsize=8)
        ax.set_xlabel("benchmarks")
        ax.set_ylabel("best time / best so far")
        ax.set_ylim(0, 1.02)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    axes.flat[0].legend(handles.values(), handles.keys(), fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rows: pd.DataFrame, out_dir: Path, threshold: float, title: str,
                 max_benchmarks: int = 1000, command: str = "") -> Path:
    """Write `report.md`, `results.csv` (one row per problem and order, seeds aggregated by their
    median), `runs.csv` (every run) and `best_so_far.png`; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows.to_csv(out_dir / "runs.csv", index=False)
    per_problem = (
        rows.assign(b=rows["benchmarks_to_threshold"].fillna(max_benchmarks + 1))
        .groupby(["problem", "order"], sort=False)
        .agg(n_candidates=("n_candidates", "first"), benchmarks_to_threshold=("b", "median"),
             random_expected=("random_expected", "first"), seeds=("seed", "count"),
             hits=("benchmarks_to_threshold", lambda s: int(s.notna().sum())))
        .reset_index()
    )
    per_problem.to_csv(out_dir / "results.csv", index=False)
    summary = summarize(rows, max_benchmarks)
    plot = plot_best_so_far(rows, out_dir / "best_so_far.png", max_benchmarks)
    overall = summary[summary["problem"] == "ALL"].drop(columns=["problem"])
    detail = summary[summary["problem"] != "ALL"][
        ["problem", "order", "median", "ci_low", "ci_high", "p90", "random_expected",
         "x_fewer_than_random", f"hit@{hit_budgets(max_benchmarks)[-1]}"]]
    lines = [
        f"# {title}", "",
        f"Benchmarks until the first candidate within {threshold:.0%} of each space's best "
        f"(replayed measurements; runs that never got there within {max_benchmarks} count as "
        f"{max_benchmarks + 1}). Learned models never saw the space they are scored on.", "",
    ]
    if command:
        lines += ["Reproduce:", "", f"    {command}", ""]
    lines += [
        "## All spaces", "",
        "median/mean/p90 over spaces of each space's median over seeds; 95% bootstrap CI of the "
        "median; hit@B = share of runs within B benchmarks; top-k = best time / best of the "
        "first k; invalid = mean proposals that were not valid configurations (TPE).", "",
        _markdown_table(overall), "",
        f"![best so far]({plot.name})", "",
        "## Per space", "", _markdown_table(detail), "",
    ]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines))
    return report
