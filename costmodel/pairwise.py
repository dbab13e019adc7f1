"""`PairwiseModel`: a linear GPU prior learned from which configuration beat the others.

Ground truth for GPU orders here is not timings but choices: an expert shipped one configuration
of a dispatch, so it ranks above the other candidates of that dispatch (IREE's own default is a
weaker positive). The model is logistic regression on feature differences of such pairs, so
`predict` is a plain linear score on a fixed basis: log2 of a few GPU features, their squares, the
handwritten heuristic's term scores, whether the row is a VectorDistribute one and a few
candidate-table columns (`TABLE_COLUMNS`), each standardised within the candidate set being
ranked (one call = one dispatch's candidates; the scale of a feature differs a lot between
dispatches, its rank within one does not). The pipeline and the layout columns are not features
(the feature schema is shared with the CPU models), so they come from the candidate table:
`predict_candidates(features, table)`, which `costmodel.rank` calls when a model has it;
`predict(features)` alone leaves those columns at 0 (held out, this loses most of the prior's
advantage: docs/gpu_order.md). Training can average the pairwise weights with those of a
listwise (softmax over each dispatch) fit on the same basis; the result is still one linear
score. A model may also hold rankers of its own for the rows of named pipelines
(`pipeline_rankers`): each is the same kind of linear score, fit only on the dispatches whose
expert used that pipeline and only on that pipeline's rows, and the order then takes the
pipelines' own orders in turn (`interleave`): spec files of different years disagree on the
pipeline for the same dispatch, and nothing in a dispatch tells which a GPU will prefer, so the
first candidates hedge between them (docs/gpu_order.md, part 15). With `tree_weight` each ranker
also holds LightGBM LambdaRank trees, which also see the problem's sizes; on contractions and
convolutions a ranker's score is then that share of the trees' score and the rest of its linear
one (part 16). With `diversity`, each ranker's order is spread over candidate families before
the pipelines are taken in turn: a row loses a little for every better-scored row of its family
(same workgroup size; same workgroup tile and subgroup split), so near copies of the favourite
stop crowding out the next family's best (`diversified`, part 25). With `spare_neighbours`,
training leaves the rows one configuration knob from an expert out of its negatives
(`near_copies`, part 33). The weight arrays are saved by
`costmodel/modelfile.py` as the "pairwise" kind. See
docs/gpu_order.md for how the shipped gfx942 model is trained and how it does on held-out spec
files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, get_args

import numpy as np
import pandas as pd

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.trees import TreeArrays
from dispatchtune.errors import InputError
from dispatchtune.problem import OpKind

#: Features whose log2 (and its square) form the basis: the GPU quantities experts trade off
#: (threads, accumulators, K tile and trips, workgroups per CU, intensity, occupancy, LDS share,
#: intrinsic shape, tile shape, padding, wave quantization). The intrinsic has three columns
#: beside `mma_k` (M, N and operand traffic per MAC): on MFMA they move together, so this gives
#: the intrinsic choice, the term most often against the held-out outliers, a lighter L2 penalty
#: than one column would (held out it helps: docs/gpu_order.md, part 6).
BASIS_FEATURES: tuple[str, ...] = (
    "threads", "acc_registers", "tile_k", "k_trips", "workgroups_per_cu", "wg_intensity",
    "occupancy", "subgroups", "shared_memory_fraction", "mma_m", "mma_k", "tile_mn_ratio",
    "vec_m", "vec_n", "padding_waste", "wave_quantization", "tile_m", "tile_n",
    "mma_n", "mma_area_to_volume",
)
#: Ratios of two features that enter the basis like `BASIS_FEATURES` (log2 and its square):
#: `mma_tiles_m` and `mma_tiles_n`, the intrinsic tiles one subgroup holds along M and N
#: (per-subgroup tile / intrinsic size). Each is a difference of two log columns already in the
#: basis, but a linear score cannot express a preference for a value of the difference (its
#: square) from their squares alone; held out they help contractions (docs/gpu_order.md, parts
#: 11 and 23).
DERIVED_FEATURES: dict[str, tuple[str, str]] = {
    "mma_tiles_m": ("vec_m", "mma_m"), "mma_tiles_n": ("vec_n", "mma_n"),
}
#: Features capped at a value before they enter the basis like `BASIS_FEATURES`: `cu_fill`, the
#: share of the GPU's compute units that get a workgroup (workgroups per CU, at most 1). It is 1
#: (and standardises away) on a dispatch whose every candidate fills the GPU, and says how much of
#: it a candidate leaves idle on a small one, apart from the tail of the last wave that
#: `wave_quantization` measures on large ones.
CAPPED_FEATURES: dict[str, tuple[str, float]] = {"cu_fill": ("workgroups_per_cu", 1.0)}
#: Label of a positive (expert) row, a weak positive (IREE default) row; other rows are 0.
POSITIVE, WEAK_POSITIVE = 1.0, 0.5
#: Pipelines of the gfx942 space (the candidate table's `pipeline` column), the names a model's
#: `pipeline_rankers` may take.
PIPELINES: tuple[str, ...] = ("VectorDistribute", "TileAndFuse")


#: Candidate-table columns the basis takes as they are (they are not features: the feature
#: schema is shared with the CPU models): the intrinsic's contiguous operand bits and, for
#: attention, whether P changes layout between its two matmuls (both from IREE's intrinsic
#: layouts; held out they order attention's intrinsic pairs: docs/gpu_order.md, part 10) and how
#: many workgroups recompute one Q x K^T block because they split the value head dim
#: (`qk_recompute`, part 12); and whether a convolution row lowers as an implicit GEMM (`igemm`:
#: every TileAndFuse convolution expert of the 31 public spec files does; the features see the
#: lowering only through what it moves, the K tile and its trips: part 18). A table without a
#: column (CPU, contractions, older enumerations) gives 0, which standardises away.
TABLE_COLUMNS: tuple[str, ...] = ("operand_bits", "p_relayout", "qk_recompute", "igemm")
#: What a pipeline ranker's trees (`tree_weight`) read beside the basis: log2 of the problem's
#: sizes and operand width and its kind, so that a split can depend on the dispatch (the basis is
#: standardised within it), and log2 of each workgroup tile over its problem size.
TREE_PROBLEM_FEATURES: tuple[str, ...] = (
    "problem_b", "problem_m", "problem_n", "problem_k", "lhs_bytes", "kind_attention",
    "kind_convolution",
)
TREE_TILE_FRACTIONS: tuple[tuple[str, str], ...] = (
    ("tile_m", "problem_m"), ("tile_n", "problem_n"), ("tile_k", "problem_k"),
)
#: LightGBM LambdaRank settings of the trees, and how many other rows of each dispatch they see
#: beside its expert rows (a random sample: the trees need not see all of a 59,000-row space).
TREE_SETTINGS: dict[str, Any] = {
    "n_estimators": 400, "num_leaves": 15, "learning_rate": 0.05, "min_child_samples": 20,
    "subsample": 0.8, "subsample_freq": 1, "colsample_bytree": 0.8,
}
TREE_NEGATIVES = 3000
#: Families of candidates a model's `diversity` may name: the rows of one pipeline that share the
#: values of these candidate-table columns. `threads`: the workgroup size; `workgroup_split`: the
#: workgroup tile and its subgroup split (rows that differ only in K tile, intrinsic or
#: lowering). A ranker's first rows are near copies of its favourite, while spec files disagree
#: with each other one knob at a time, so past a family's best rows the next family's best is
#: worth more (held out and outside: docs/gpu_order.md, part 25).
DIVERSITY_FAMILIES: dict[str, tuple[str, ...]] = {
    "threads": ("workgroup_threads",),
    "workgroup_split": ("tile_m", "tile_n", "subgroups_m", "subgroups_n"),
}

#: Candidate-table columns that make up a configuration as a spec file sets it: pipeline, tiles,
#: intrinsics (attention has two), subgroup split and a convolution's output tiles and lowering
#: (the workgroup size follows from the split). A row within `spare_neighbours` of these columns
#: of an expert row is a near copy of it (`near_copies`). Wider than `search.gpu.DEFAULT_KNOBS`,
#: which only lists what IREE's own configuration of every op kind sets.
CONFIGURATION_COLUMNS: tuple[str, ...] = (
    "pipeline", "tile_b", "tile_m", "tile_n", "tile_k", "intrinsic", "pv_intrinsic",
    "subgroups_m", "subgroups_n", "tile_oh", "tile_ow", "igemm",
)


def _standardised(z: np.ndarray) -> np.ndarray:
    return (z - z.mean(axis=0)) / (z.std(axis=0) + 1e-9) if len(z) else z


def basis(features: pd.DataFrame, table: pd.DataFrame | None = None,
          kind_terms: bool = False, pipeline_terms: bool = False) -> np.ndarray:
    """Rows x basis columns: log2 of each feature, `DERIVED_FEATURES` ratio and
    `CAPPED_FEATURES` value (floored at 2^-10), its square / 10, the heuristic's term scores,
    VectorDistribute (1/0) and the `TABLE_COLUMNS` of the candidate `table` (the same rows;
    without it those columns are 0); standardised over the rows given
    (one candidate set). `kind_terms`: the same columns again, times 1 on attention rows (else
    0), so attention gets its own weights on top of the shared ones (one candidate set is one
    op, so the flag is constant within it and comparisons stay within a kind). `pipeline_terms`:
    the columns once more on TileAndFuse rows only, standardised over those rows (else 0), so
    the order within that pipeline gets weights of its own (docs/gpu_order.md, part 14)."""
    from dispatchtune.costmodel.heuristic import HeuristicModel

    needed = [*BASIS_FEATURES, *(n for pair in DERIVED_FEATURES.values() for n in pair),
              *(name for name, _ in CAPPED_FEATURES.values())]
    missing = [name for name in needed if name not in features.columns]
    if missing:
        raise InputError(f"feature table lacks {missing[0]!r} needed by the pairwise model")
    values = features[list(BASIS_FEATURES)].to_numpy(np.float64)
    ratios = [features[a].to_numpy(np.float64) / np.maximum(features[b].to_numpy(np.float64), 1e-9)
              for a, b in DERIVED_FEATURES.values()]
    capped = [np.minimum(features[name].to_numpy(np.float64), cap)
              for name, cap in CAPPED_FEATURES.values()]
    x = np.log2(np.maximum(np.column_stack([values, *ratios, *capped]), 2.0**-10))
    terms = HeuristicModel().term_scores(features).to_numpy(np.float64)
    own = np.zeros((len(x), 1 + len(TABLE_COLUMNS)))
    pipeline = np.full(len(x), "", dtype=object)
    if table is not None:
        if len(table) != len(x):
            raise InputError("the candidate table and the feature table differ in rows")
        if "pipeline" in table:
            pipeline = table["pipeline"].astype(str).to_numpy()
        own[:, 0] = pipeline == "VectorDistribute"
        for i, name in enumerate(TABLE_COLUMNS, start=1):
            if name in table:
                # NaN where concatenated tables of other kinds lack the column.
                own[:, i] = np.nan_to_num(table[name].to_numpy(np.float64))
    raw = np.hstack([x, x**2 / 10.0, terms, own])
    z = _standardised(raw)
    if kind_terms:
        attention = features["kind_attention"].to_numpy(np.float64)[:, None] > 0
        z = np.hstack([z, z * attention])
    if pipeline_terms:
        fused = np.zeros_like(raw)
        rows = pipeline == "TileAndFuse"
        fused[rows] = _standardised(raw[rows])
        z = np.hstack([z, fused])
    return z


def basis_names(kind_terms: bool = False, pipeline_terms: bool = False) -> list[str]:
    """Names of the basis columns; a model file must list exactly these."""
    import pandas as pd

    from dispatchtune.costmodel.heuristic import HeuristicModel
    from dispatchtune.features.extract import FEATURE_NAMES

    # The heuristic's GPU terms: those it computes for a one-row GPU feature table.
    probe = pd.DataFrame({name: [1.0] for name in FEATURE_NAMES})
    terms = [f"term_{t}" for t in HeuristicModel().term_scores(probe).columns]
    logged = [*BASIS_FEATURES, *DERIVED_FEATURES, *CAPPED_FEATURES]
    names = ([f"log2_{n}" for n in logged] + [f"log2_{n}_sq" for n in logged]
             + terms + ["vector_distribute", *TABLE_COLUMNS])
    own = list(names)
    if kind_terms:
        names += [f"attention_{n}" for n in own]
    if pipeline_terms:
        names += [f"tileandfuse_{n}" for n in own]
    return names


def tree_basis(features: pd.DataFrame, table: pd.DataFrame | None = None,
               plain: np.ndarray | None = None) -> np.ndarray:
    """Rows x `tree_basis_names()`: the plain `basis` of the rows given (one candidate set of one
    pipeline; `plain` if already computed), then the `TREE_PROBLEM_FEATURES` and
    `TREE_TILE_FRACTIONS` as log2 (floored)."""
    missing = [name for name in (*TREE_PROBLEM_FEATURES, *(n for pair in TREE_TILE_FRACTIONS
                                                           for n in pair))
               if name not in features.columns]
    if missing:
        raise InputError(f"feature table lacks {missing[0]!r} needed by the pairwise model")
    problem = np.log2(np.maximum(features[list(TREE_PROBLEM_FEATURES)].to_numpy(np.float64),
                                 1e-3))
    fractions = np.log2(np.column_stack([
        np.maximum(features[tile].to_numpy(np.float64), 1.0)
        / np.maximum(features[size].to_numpy(np.float64), 1.0)
        for tile, size in TREE_TILE_FRACTIONS]))
    return np.hstack([basis(features, table) if plain is None else plain, problem, fractions])


def tree_basis_names() -> list[str]:
    """Names of the `tree_basis` columns."""
    return [*basis_names(), *(f"log2_{n}" for n in TREE_PROBLEM_FEATURES),
            *(f"log2_{tile}_over_{size}" for tile, size in TREE_TILE_FRACTIONS)]


def interleave(scores: np.ndarray, pipeline: np.ndarray) -> np.ndarray:
    """Scores of the order that takes each pipeline's best remaining row in turn: minus a row's
    rank within its own pipeline (tied rows share their mean rank), so the first rows of every
    pipeline come before the second rows of any."""
    out = np.empty(len(scores), dtype=np.float64)
    for name in pd.unique(pipeline):
        rows = pipeline == name
        # 1-based ranks from the best score down; numpy, not scipy.stats (0.6 s to import on
        # every `rank` and `tune`).
        _, tie, counts = np.unique(-scores[rows], return_inverse=True, return_counts=True)
        last = np.cumsum(counts)
        out[rows] = -(last - (counts - 1) / 2.0)[tie]
    return out


def _checked_weights(weights: Any, names: Sequence[str], setting: str) -> dict[str, float]:
    """`weights` as a setting mapping some of `names` to finite numbers >= 0 (from code, a model
    file or a command line), else one `InputError`."""
    if not isinstance(weights, dict) or any(
            name not in names or isinstance(weight, bool)
            or not isinstance(weight, int | float) or not 0 <= weight < float("inf")
            for name, weight in weights.items()):
        raise InputError(f"{setting} maps names of {', '.join(names)} to weights >= 0")
    return {name: float(weight) for name, weight in weights.items()}


def checked_diversity(weights: Any) -> dict[str, float]:
    """`weights` as a `diversity` setting: names of `DIVERSITY_FAMILIES` to weights >= 0."""
    return _checked_weights(weights, list(DIVERSITY_FAMILIES), "diversity")


def checked_default_closeness(weights: Any) -> dict[str, float]:
    """`weights` as a `default_closeness` setting: op kinds to weights >= 0."""
    return _checked_weights(weights, get_args(OpKind), "default_closeness")


def towards_default(scores: np.ndarray, features: pd.DataFrame, table: pd.DataFrame,
                    weights: dict[str, float]) -> np.ndarray:
    """`scores` of one pipeline's rows of a candidate set, standardised, plus the weight of the
    set's op kind x the row's `default_match` (how many knobs it shares with IREE's own
    configuration of the op, `search.gpu.DEFAULT_KNOBS`). Unchanged where the kind has no weight
    or IREE's default is unknown (`default_match` -1). Experts keep IREE's default value of a knob
    more often than the space does; weighed in, it moved held-out and outside convolution experts
    earlier and nothing else (docs/gpu_order.md, parts 27-28)."""
    match = table["default_match"].to_numpy() if "default_match" in table else None
    weight = next((w for kind, w in weights.items()
                   if w and bool(features[f"kind_{kind}"].to_numpy().any())), 0.0)
    if match is None or not weight or not (match >= 0).any():
        return scores
    return np.round(_standardised(scores) + weight * np.maximum(match, 0), 9)


def diversified(scores: np.ndarray, table: pd.DataFrame, weights: dict[str, float]) -> np.ndarray:
    """`scores` of one candidate set (`table`, the same rows) minus, for each family of
    `DIVERSITY_FAMILIES` named in `weights`, its weight x log2(1 + the row's rank among the rows of
    its family, best first: 0 for the family's best row). A family whose columns the table lacks
    is skipped."""
    out = np.asarray(scores, dtype=np.float64).copy()
    order = np.argsort(-out, kind="stable")
    for name, weight in weights.items():
        columns = [c for c in DIVERSITY_FAMILIES[name] if c in table]
        if not weight or not columns:
            continue
        family = table.groupby(columns, sort=False, dropna=False).ngroup().to_numpy()[order]
        rank = np.empty(len(out))
        rank[order] = pd.Series(family).groupby(family).cumcount().to_numpy()
        out -= weight * np.log2(1.0 + rank)
    return out


def near_copies(labels: np.ndarray, groups: np.ndarray, table: pd.DataFrame,
                knobs_apart: int) -> np.ndarray:
    """Rows labelled 0 whose `CONFIGURATION_COLUMNS` (those the `table` has) differ from a
    POSITIVE row of their group in at most `knobs_apart` columns. A column missing on both rows
    (NaN: the tables of several op kinds concatenated) is no difference."""
    columns = [c for c in CONFIGURATION_COLUMNS if c in table]
    near = np.zeros(len(labels), dtype=bool)
    for group in pd.unique(groups):
        rows = np.flatnonzero(groups == group)
        positive = labels[rows] >= POSITIVE
        if not positive.any():
            continue
        values = table.iloc[rows][columns].to_numpy()
        missing = pd.isna(values)
        for expert, gone in zip(values[positive], missing[positive], strict=True):
            apart = (values != expert) & ~(missing & gone)
            near[rows] |= apart.sum(axis=1) <= knobs_apart
    return near & (labels == 0)


def _unit(w: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(w))
    return w / norm if norm > 0 else w


class PairwiseModel(CostModel):
    """Linear score on `basis`, fit so that positives outscore the other rows of their group."""

    kind = "pairwise"

    def __init__(self, c: float = 0.01, pairs: int = 400, weak_weight: float = 0.5,
                 seed: int = 0, kind_terms: bool = False, hard_negatives: int = 0,
                 listwise: float = 0.0, pipeline_terms: bool = False,
                 pipeline_rankers: Sequence[str] = (), tree_weight: float = 0.0,
                 diversity: dict[str, float] | None = None,
                 default_closeness: dict[str, float] | None = None,
                 spare_neighbours: int = 0) -> None:
        if not (c > 0 and pairs > 0 and weak_weight >= 0 and hard_negatives >= 0
                and listwise >= 0 and 0 <= tree_weight <= 1 and spare_neighbours >= 0):
            raise InputError("pairwise model needs c > 0, pairs > 0, weak_weight >= 0, "
                             "hard_negatives >= 0, listwise >= 0, 0 <= tree_weight <= 1 and "
                             "spare_neighbours >= 0")
        unknown = [name for name in pipeline_rankers if name not in PIPELINES]
        if unknown or len(set(pipeline_rankers)) != len(pipeline_rankers):
            raise InputError(f"pipeline_rankers take distinct names of {', '.join(PIPELINES)}")
        if tree_weight and not pipeline_rankers:
            raise InputError("tree_weight needs pipeline_rankers (the trees rank within one)")
        diversity = checked_diversity(diversity or {})
        if diversity and not pipeline_rankers:
            raise InputError("diversity needs pipeline_rankers (it reorders each one's rows)")
        default_closeness = checked_default_closeness(default_closeness or {})
        if default_closeness and not pipeline_rankers:
            raise InputError("default_closeness needs pipeline_rankers (it moves each one's rows)")
        # Training settings, not prediction ones: kept out of the stored params.
        self.hard_negatives = int(hard_negatives)
        self.listwise = float(listwise)
        self.spare_neighbours = int(spare_neighbours)
        self.params: dict[str, Any] = {"c": float(c), "pairs": int(pairs),
                                       "weak_weight": float(weak_weight)}
        # Only stored when set: model files without them keep loading.
        if kind_terms:
            self.params["kind_terms"] = True
        if pipeline_terms:
            self.params["pipeline_terms"] = True
        if pipeline_rankers:
            self.params["pipeline_rankers"] = list(pipeline_rankers)
        if tree_weight:
            self.params["tree_weight"] = float(tree_weight)
        if diversity:
            self.params["diversity"] = diversity
        if default_closeness:
            self.params["default_closeness"] = default_closeness
        self.seed = seed
        self.weights: np.ndarray | None = None
        #: Pipeline -> weights on the plain `basis` of that pipeline's rows (`pipeline_rankers`).
        self.rankers: dict[str, np.ndarray] = {}
        #: Pipeline -> LambdaRank trees on `tree_basis` of that pipeline's rows (`tree_weight`).
        self.trees: dict[str, TreeArrays] = {}
        self.training_rows = 0
        self.metadata: dict[str, Any] = {"target_kinds": ["gpu"]}

    @property
    def kind_terms(self) -> bool:
        return bool(self.params.get("kind_terms", False))

    @property
    def pipeline_terms(self) -> bool:
        return bool(self.params.get("pipeline_terms", False))

    @property
    def pipeline_rankers(self) -> list[str]:
        return list(self.params.get("pipeline_rankers", []))

    @property
    def tree_weight(self) -> float:
        return float(self.params.get("tree_weight", 0.0))

    @property
    def diversity(self) -> dict[str, float]:
        return dict(self.params.get("diversity", {}))

    @property
    def default_closeness(self) -> dict[str, float]:
        return dict(self.params.get("default_closeness", {}))

    @property
    def fitted(self) -> bool:
        return self.weights is not None

    def fit(self, features: pd.DataFrame, labels: Any, groups: Any = None,
            table: pd.DataFrame | None = None) -> PairwiseModel:
        """`labels`: POSITIVE for expert rows, WEAK_POSITIVE for IREE's default, 0 otherwise;
        `groups`: the dispatch of each row; `table`: each row's candidate-table row (its pipeline
        and `TABLE_COLUMNS`; the candidate tables of the groups, concatenated). Each positive is
        paired with up to `pairs` rows of its group labelled lower (both orientations, so no
        intercept is needed). With `hard_negatives` = h, a second fit adds, for each positive,
        pairs with the h lower rows the first fit scores highest: the order is judged at its top,
        where random pairs are few (held out this helps: docs/gpu_order.md, part 5). With
        `listwise` = L2 strength > 0, a second linear ranker on the same basis is fit by
        `_fit_listwise` and the stored weights are the mean of the two unit weight vectors (one
        weight array as before; held out this helps: docs/gpu_order.md, part 7). Each of
        `pipeline_rankers` is then fit the same way on the groups whose POSITIVE row has that
        pipeline, on their rows of that pipeline only (the `table` is needed), and with
        `tree_weight` > 0 gets LambdaRank trees fit on the same rows (`_fit_trees`). With
        `spare_neighbours` = n > 0, the rows n or fewer configuration knobs away from a positive
        (`near_copies`, from the `table`) are left out of every fit but the shared basis's
        standardisation: spec files disagree one knob at a time, so such rows are no evidence
        against the expert, and sharing most of its features they score close to it, where the
        hard negatives are drawn (held out this helps: docs/gpu_order.md, part 33)."""

        y = np.asarray(labels, dtype=np.float64)
        g = np.asarray(groups if groups is not None else np.zeros(len(y)))
        if y.shape != (len(features),) or g.shape != y.shape:
            raise InputError("pairwise fit needs one label and one group per feature row")
        # Rows no fit sees (flagged, not dropped: a copy of 6 million rows would not fit).
        spared = np.zeros(len(y), dtype=bool)
        if self.spare_neighbours:
            if table is None:
                raise InputError("spare_neighbours needs the candidate table (its knob columns)")
            spared = near_copies(y, g, table, self.spare_neighbours)
        z = np.zeros((len(y), len(basis_names(self.kind_terms, self.pipeline_terms))))
        for group in pd.unique(g):
            rows = np.flatnonzero(g == group)
            z[rows] = basis(features.iloc[rows], None if table is None else table.iloc[rows],
                            self.kind_terms, self.pipeline_terms)
        rng = np.random.default_rng(self.seed)
        diffs, weights = [], []
        for group in pd.unique(g):
            rows = np.flatnonzero(g == group)
            for row in rows[y[rows] > 0]:
                lower = rows[(y[rows] < y[row]) & ~spared[rows]]
                if not len(lower):
                    continue
                pick = rng.choice(lower, min(self.params["pairs"], len(lower)), replace=False)
                diffs.append(z[row] - z[pick])
                share = 1.0 if y[row] >= POSITIVE else self.params["weak_weight"]
                weights.append(np.full(len(pick), share))
        if not diffs:
            raise InputError("pairwise fit found no positive row with lower-labelled rows beside it")
        self.weights = self._fit_pairs(diffs, weights)
        if self.hard_negatives:
            scores = z @ self.weights
            for group in pd.unique(g):
                rows = np.flatnonzero(g == group)
                for row in rows[y[rows] > 0]:
                    lower = rows[(y[rows] < y[row]) & ~spared[rows]]
                    top = lower[np.argsort(-scores[lower], kind="stable")[: self.hard_negatives]]
                    diffs.append(z[row] - z[top])
                    share = 1.0 if y[row] >= POSITIVE else self.params["weak_weight"]
                    weights.append(np.full(len(top), share))
            self.weights = self._fit_pairs(diffs, weights)
        self.training_rows = sum(len(d) for d in diffs)
        if self.listwise:
            listwise = self._fit_listwise(z[~spared], y[~spared], g[~spared])
            # Equal parts of the two directions (a linear score's scale does not change an order).
            self.weights = 0.5 * (_unit(self.weights) + _unit(listwise))
        # The shared basis and pairs are done with: free them before the rankers build their own
        # (31 spec files' spaces hold 6 million rows).
        del z, diffs, weights
        self.rankers = {name: self._fit_ranker(name, features, y, g, table, spared)
                        for name in self.pipeline_rankers}
        return self

    @staticmethod
    def _own_rows(name: str, y: np.ndarray, g: np.ndarray, table: pd.DataFrame | None,
                  spared: np.ndarray) -> np.ndarray:
        """Rows of pipeline `name` in the groups whose POSITIVE row has that pipeline, but for the
        `spared` ones."""
        if table is None or "pipeline" not in table:
            raise InputError("pipeline rankers need the candidate table's pipeline column")
        pipeline = table["pipeline"].astype(str).to_numpy()
        own = np.isin(g, pd.unique(g[(y >= POSITIVE) & (pipeline == name)])) & (pipeline == name)
        if not own.any():
            raise InputError(f"no expert configuration uses {name}: its ranker cannot be fit")
        return np.flatnonzero(own & ~spared)

    def _fit_ranker(self, name: str, features: pd.DataFrame, y: np.ndarray, g: np.ndarray,
                    table: pd.DataFrame | None, spared: np.ndarray) -> np.ndarray:
        """Weights of the ranker of pipeline `name` (see `fit`; not on the `spared` rows); its
        trees too (`tree_weight`)."""
        rows = self._own_rows(name, y, g, table, spared)
        assert table is not None
        ranker = PairwiseModel(self.params["c"], self.params["pairs"], self.params["weak_weight"],
                               self.seed, hard_negatives=self.hard_negatives,
                               listwise=self.listwise)
        ranker.fit(features.iloc[rows], y[rows], g[rows], table.iloc[rows])
        assert ranker.weights is not None
        self.training_rows += ranker.training_rows
        if self.tree_weight:
            self.trees[name] = self._fit_trees(features.iloc[rows], y[rows], g[rows],
                                               table.iloc[rows])
        return ranker.weights

    def _fit_trees(self, features: pd.DataFrame, y: np.ndarray, g: np.ndarray,
                   table: pd.DataFrame) -> TreeArrays:
        """LightGBM LambdaRank trees on `tree_basis` (computed per group), one query per group
        with a POSITIVE row: its positive rows (relevance 1) and up to `TREE_NEGATIVES` of its
        other rows drawn at random (relevance 0; IREE's default counts as another row).
        Nonlinear where the linear ranker is not: which tile a dispatch of this size wants
        depends on the size (held out, blended into the linear score: docs/gpu_order.md,
        part 16)."""
        import lightgbm

        rng = np.random.default_rng(self.seed)
        xs, labels, sizes = [], [], []
        for group in pd.unique(g):
            rows = np.flatnonzero(g == group)
            positive = y[rows] >= POSITIVE
            if not positive.any():
                continue
            others = rows[~positive]
            pick = np.concatenate([rows[positive], rng.choice(
                others, min(TREE_NEGATIVES, len(others)), replace=False)])
            x = tree_basis(features.iloc[rows], table.iloc[rows])
            xs.append(x[np.searchsorted(rows, pick)])
            labels.append((y[pick] >= POSITIVE).astype(int))
            sizes.append(len(pick))
        ranker = lightgbm.LGBMRanker(objective="lambdarank", random_state=self.seed, verbose=-1,
                                     deterministic=True, force_row_wise=True, **TREE_SETTINGS)
        ranker.fit(np.vstack(xs), np.concatenate(labels), group=sizes)
        self.training_rows += int(sum(sizes))
        return TreeArrays.from_lightgbm(ranker.booster_.dump_model(), len(tree_basis_names()))

    def _fit_listwise(self, z: np.ndarray, y: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Weights maximising, over the groups with a POSITIVE row, the softmax probability of the
        positive rows among all rows of their group (a conditional logit; weak positives count as
        other rows), with an L2 penalty `listwise` * |w|^2. Every other row of a group enters the
        loss in proportion to how far up it is scored, so the fit is judged at the top of each
        order, without choosing a number of hard negatives (docs/gpu_order.md, part 7)."""
        from scipy.optimize import minimize
        from scipy.special import logsumexp

        blocks = []
        for group in pd.unique(g):
            rows = np.flatnonzero(g == group)
            positive = y[rows] >= POSITIVE
            if positive.any():
                blocks.append((z[rows], positive))
        lam = self.listwise

        def loss(w: np.ndarray) -> tuple[float, np.ndarray]:
            total, grad = lam * float(w @ w), 2.0 * lam * w
            for rows, positive in blocks:
                s = rows @ w
                every, chosen = logsumexp(s), logsumexp(s[positive])
                total += every - chosen
                grad = grad + np.exp(s - every) @ rows - np.exp(s[positive] - chosen) @ rows[positive]
            return total, grad

        start = np.zeros(z.shape[1])
        result = minimize(loss, start, jac=True, method="L-BFGS-B", options={"maxiter": 500})
        return np.asarray(result.x, dtype=np.float64)

    def _fit_pairs(self, diffs: list[np.ndarray], weights: list[np.ndarray]) -> np.ndarray:
        """Logistic regression on pair differences (both orientations, no intercept)."""
        from sklearn.linear_model import LogisticRegression

        d, w = np.vstack(diffs), np.concatenate(weights)
        x = np.vstack([d, -d])
        target = np.concatenate([np.ones(len(d)), np.zeros(len(d))])
        fit = LogisticRegression(C=self.params["c"], fit_intercept=False, max_iter=5000)
        fit.fit(x, target, sample_weight=np.concatenate([w, w]))
        return np.asarray(fit.coef_[0], dtype=np.float64)

    def predict(self, features: pd.DataFrame) -> np.ndarray:
        return self.predict_candidates(features, None)

    def predict_candidates(self, features: pd.DataFrame, table: pd.DataFrame | None) -> np.ndarray:
        """Scores of one candidate set, its pipelines and `TABLE_COLUMNS` read from the
        candidate `table`."""
        if self.weights is None:
            raise InputError("the pairwise model is not trained")
        if not self.rankers or table is None or "pipeline" not in table:
            return self._shared_scores(features, table)
        pipeline = table["pipeline"].astype(str).to_numpy()
        # The shared score (standardised over the whole set) only for rows no ranker orders.
        scores = (np.zeros(len(features)) if np.isin(pipeline, list(self.rankers)).all()
                  else self._shared_scores(features, table))
        diversity, closeness = self.diversity, self.default_closeness
        for name in self.rankers:
            rows = np.flatnonzero(pipeline == name)
            if len(rows):
                own = self._ranker_scores(name, features.iloc[rows], table.iloc[rows])
                if closeness:
                    own = towards_default(own, features.iloc[rows], table.iloc[rows], closeness)
                if diversity:
                    own = np.round(diversified(own, table.iloc[rows], diversity), 9)
                scores[rows] = own
        return interleave(scores, pipeline)

    def _ranker_scores(self, name: str, features: pd.DataFrame, table: pd.DataFrame
                       ) -> np.ndarray:
        """Scores of one pipeline's rows of a candidate set by that pipeline's ranker: its linear
        score standardised over the rows, blended with its trees' (standardised too,
        `tree_weight` to the trees) except on attention, where the trees lose held out
        (docs/gpu_order.md, part 16)."""
        own = basis(features, table)
        linear = own @ self.rankers[name]
        trees = self.trees.get(name)
        if trees is None or bool(features["kind_attention"].to_numpy().any()):
            # Rounded so that candidates equal on every basis feature tie exactly; standardised so
            # that `diversity` weighs the same on every dispatch.
            return np.round(_standardised(linear), 9)
        w = self.tree_weight
        tree_scores = trees.predict(tree_basis(features, table, plain=own))
        blended = (1 - w) * _standardised(linear) + w * _standardised(tree_scores)
        return np.round(blended, 9)

    def _shared_scores(self, features: pd.DataFrame, table: pd.DataFrame | None) -> np.ndarray:
        assert self.weights is not None
        z = basis(features, table, self.kind_terms, self.pipeline_terms)
        # Rounded so that candidates equal on every basis feature tie exactly.
        return np.round(z @ self.weights, 9)

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a model file stores."""
        if self.weights is None:
            raise InputError("cannot save an untrained pairwise model")
        return {"weights": self.weights,
                **{f"weights_{name}": self.rankers[name] for name in self.pipeline_rankers}}

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], params: dict[str, Any], seed: int = 0,
                    trees: dict[str, TreeArrays] | None = None) -> PairwiseModel:
        """Rebuild from stored arrays (`weights`: one finite number per basis column) and, with
        `tree_weight`, each pipeline ranker's `trees` (checked ones, over `tree_basis_names`)."""
        model = cls(seed=seed, **params)
        size = len(basis_names(model.kind_terms, model.pipeline_terms))
        values = np.asarray(arrays["weights"], dtype=np.float64)
        if values.shape != (size,) or not np.isfinite(values).all():
            raise InputError(f"pairwise array 'weights' must hold {size} finite numbers")
        model.weights = values
        plain = len(basis_names())
        for name in model.pipeline_rankers:
            ranker = np.asarray(arrays[f"weights_{name}"], dtype=np.float64)
            if ranker.shape != (plain,) or not np.isfinite(ranker).all():
                raise InputError(f"pairwise array 'weights_{name}' must hold {plain} finite numbers")
            model.rankers[name] = ranker
            if model.tree_weight:
                if trees is None or name not in trees:
                    raise InputError(f"pairwise model with tree_weight lacks the trees of {name}")
                model.trees[name] = trees[name]
        return model
