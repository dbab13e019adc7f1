"""Learned cost models: a random forest and two LightGBM models behind the `CostModel` interface.

All three learn from measured candidates of many problems at once and predict a score where higher
means faster (`predict`), which `rank` turns into a benchmark order:

- `RandomForestModel`: scikit-learn's random forest regressor.
- `GBMRegressorModel`: LightGBM gradient-boosted trees regressing the normalised label with the
  quantile loss (alpha 0.9: an optimistic estimate, see below).
- `LambdaRankModel`: LightGBM's LambdaRank ranker on relevance grades (`relevance_grades`).

Each library only trains: the fitted trees are copied into plain node arrays (`TreeArrays`) and
every prediction runs the same vectorised numpy walker, so a trained and a loaded model predict
alike and loading a model file never hands its content to a C parser or unpickles it.

Labels. `fit(features, labels, groups)` takes any positive label where higher is faster (1/time,
speedup, GFLOP/s) and the problem of each row, and normalises per problem:
``y = log(label / best label of the problem)`` (= log(best time / time): 0 for the best candidate,
-0.69 for one twice as slow). One model thus serves many shapes: it learns relative speed, not
absolute times.

Duplicate feature rows. The features do not pin a candidate down completely (knobs without a
feature, measurement noise): on the Kernel Tuner GEMM spaces 17,956 configurations share 1,232
distinct feature rows. A model fitted to the mean label of such a row ranks the rows whose
*average* configuration is good, but the search wants the rows that *contain* a near-optimal
configuration. So rows of one problem with identical features are merged into one row that keeps
the best label (`merge_duplicates`), and the GBM regressor uses the 0.9 quantile loss for the same
reason. Measured effect on held-out GPUs (benchmarks to 5% of the best, docs/costmodels.md): mean
regression 282-930, merged/optimistic labels 7.8-9.2.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.trees import TreeArrays
from dispatchtune.errors import InputError
from dispatchtune.features.extract import FEATURE_NAMES

#: What the models regress / rank, stored in model files.
LABEL = "log(best time of the problem / time), per problem; duplicate feature rows keep the max"
#: LambdaRank relevance: grade g = number of these cuts that best_time / time reaches (0..5), so
#: the top grade is "within 5% of the best", the region the search is judged on.
RELEVANCE_CUTS: tuple[float, ...] = (0.5, 0.7, 0.8, 0.9, 1 / 1.05)
#: Largest LambdaRank query: bigger problems are split into random sub-queries of this size (the
#: pairwise gradients grow with the square of the query size).
MAX_QUERY_ROWS = 2000


# ---- labels -----------------------------------------------------------------------------------
def _groups(groups: Any, n: int) -> np.ndarray:
    if groups is None:
        return np.zeros(n, dtype=np.int64)
    values = np.asarray(groups)
    if values.shape != (n,):
        raise InputError(f"groups has {values.shape} entries for {n} rows")
    # Group codes, whatever the label type (str problem keys, ints).
    return pd.factorize(values, sort=True)[0].astype(np.int64)


def normalized_labels(labels: Any, groups: Any = None) -> np.ndarray:
    """log(label / best label of the row's group): 0 for each group's fastest, negative otherwise.

    `labels` are positive and higher is faster (1/time, speedup); `groups` names each row's problem
    (None: one problem).
    """
    y = np.asarray(labels, dtype=np.float64)
    if y.ndim != 1 or y.size == 0:
        raise InputError("labels must be a non-empty 1-D array")
    if not np.isfinite(y).all() or (y <= 0).any():
        raise InputError("labels must be positive and finite (higher = faster, e.g. 1 / time)")
    codes = _groups(groups, y.size)
    best = np.zeros(codes.max() + 1)
    np.maximum.at(best, codes, y)
    return np.log(y / best[codes])


def labels_from_times(times: Any) -> np.ndarray:
    """The `fit` label of measured times: 1 / time (higher = faster)."""
    t = np.asarray(times, dtype=np.float64)
    if not np.isfinite(t).all() or (t <= 0).any():
        raise InputError("times must be positive and finite")
    return 1.0 / t


def merge_duplicates(
    x: np.ndarray, y: np.ndarray, codes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of one group with identical features merged into one row with the largest label."""
    keyed = np.column_stack([codes.astype(np.float64), x])
    unique, inverse = np.unique(keyed, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    best = np.full(len(unique), -np.inf)
    np.maximum.at(best, inverse, y)
    return unique[:, 1:], best, unique[:, 0].astype(np.int64)


def relevance_grades(y: np.ndarray) -> np.ndarray:
    """LambdaRank grades 0..len(RELEVANCE_CUTS) of normalised labels (see `RELEVANCE_CUTS`)."""
    ratio = np.exp(np.asarray(y, dtype=np.float64))
    # Tiny tolerance: a candidate exactly at a cut (e.g. 1/1.05) must reach it despite rounding.
    return np.digitize(ratio * (1 + 1e-12), RELEVANCE_CUTS).astype(np.int32)


# ---- the common base ---------------------------------------------------------------------------
class LearnedModel(CostModel):
    """Shared plumbing: feature-matrix checks, label normalisation, duplicate merging, importances.

    `features` is a DataFrame with (at least) the `feature_names` columns, or a plain 2-D array
    whose columns are `feature_names` in order. `n_jobs` defaults to 1: LightGBM's OpenMP threads
    busy-wait, and on a shared 2-core machine 2 threads trained 8x slower than 1 (9.3 s vs 1.1 s).
    """

    kind: ClassVar[str]
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(
        self,
        feature_names: Sequence[str] = FEATURE_NAMES,
        seed: int = 0,
        n_jobs: int = 1,
        **params: Any,
    ) -> None:
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise InputError(
                f"unknown {self.kind} parameter(s): {', '.join(sorted(unknown))} "
                f"(known: {', '.join(sorted(self.defaults))})"
            )
        self.feature_names = tuple(feature_names)
        self.seed = int(seed)
        self.n_jobs = int(n_jobs)
        self.params: dict[str, Any] = {**self.defaults, **params}
        self.training_rows = 0
        self.metadata: dict[str, Any] = {}
        self.trees: TreeArrays | None = None
        self.importances_: np.ndarray | None = None  # raw importance per feature

    # ---- public interface
    def fit(self, features: Any, labels: Any, groups: Any = None) -> LearnedModel:
        x = self.matrix(features)
        y = normalized_labels(labels, groups)
        if len(y) != len(x):
            raise InputError(f"{len(y)} labels for {len(x)} feature rows")
        codes = _groups(groups, len(y))
        x, y, codes = merge_duplicates(x, y, codes)
        self._fit(x, y, codes)
        self.training_rows = len(y)
        if "is_gpu" in self.feature_names:
            # Recorded so that a model used for another kind of target can say so when loaded.
            gpu = np.unique(x[:, self.feature_names.index("is_gpu")] > 0)
            self.metadata["target_kinds"] = ["gpu" if g else "cpu" for g in gpu]
        return self

    @property
    def fitted(self) -> bool:
        return self.trees is not None

    def predict(self, features: Any) -> np.ndarray:
        if not self.fitted:
            raise InputError(f"{self.kind} model is not trained; call fit or load a model file")
        x = self.matrix(features)
        if len(x) == 0:
            return np.zeros(0)
        assert self.trees is not None
        return self.trees.predict(x)

    def feature_importances(self) -> pd.Series:
        """Each feature's share of the model's importance (sums to 1), largest first."""
        if self.importances_ is None:
            raise InputError(f"{self.kind} model is not trained")
        raw = np.asarray(self.importances_, dtype=np.float64)
        total = raw.sum()
        shares = raw / total if total > 0 else raw
        return pd.Series(shares, index=list(self.feature_names)).sort_values(ascending=False)

    def matrix(self, features: Any) -> np.ndarray:
        """The float64 feature matrix (columns = `feature_names`) of a DataFrame or array."""
        if isinstance(features, pd.DataFrame):
            missing = [n for n in self.feature_names if n not in features.columns]
            if missing:
                raise InputError(
                    f"feature table lacks {len(missing)} model feature(s), e.g. {missing[0]!r}; "
                    "build it with dispatchtune.features.extract_features"
                )
            x = features[list(self.feature_names)].to_numpy(dtype=np.float64)
        else:
            x = np.asarray(features, dtype=np.float64)
            if x.ndim != 2 or x.shape[1] != len(self.feature_names):
                raise InputError(
                    f"feature array of shape {x.shape}; the model expects "
                    f"{len(self.feature_names)} columns ({', '.join(self.feature_names[:3])}, ...)"
                )
        if not np.isfinite(x).all():
            raise InputError("feature table has NaN or infinite values")
        return x

    # ---- per model
    @abstractmethod
    def _fit(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray) -> None:
        """Train on merged rows; sets `trees` and `importances_`."""


# ---- random forest -----------------------------------------------------------------------------
class RandomForestModel(LearnedModel):
    """Random forest regressor of the normalised label (scikit-learn fit, numpy prediction).

    Trees are size-capped (`max_leaf_nodes`) so the model file stays small and prediction fast: 50
    trees of at most 256 leaves are at most 25,550 nodes. Each tree sees a bootstrap half of the
    rows (`max_samples`), which halves training time on large sets.
    """

    kind = "rf"
    defaults: ClassVar[dict[str, Any]] = {
        "n_estimators": 50,
        "max_leaf_nodes": 256,
        "min_samples_leaf": 1,
        "max_features": 0.5,
        "max_samples": 0.5,
    }

    def _fit(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray) -> None:
        from sklearn.ensemble import RandomForestRegressor

        forest = RandomForestRegressor(random_state=self.seed, n_jobs=self.n_jobs, **self.params)
        forest.fit(x, y)
        self.trees = TreeArrays.from_sklearn(forest, len(self.feature_names))
        self.importances_ = np.asarray(forest.feature_importances_, dtype=np.float64)


# ---- LightGBM ----------------------------------------------------------------------------------
class _LightGBMModel(LearnedModel):
    """LightGBM trains; its trees are converted to `TreeArrays` (from `Booster.dump_model()`).

    `booster` is kept after training for inspection; a model loaded from a file has none.
    """

    def __init__(self, feature_names: Sequence[str] = FEATURE_NAMES, seed: int = 0,
                 n_jobs: int = 1, **params: Any) -> None:
        super().__init__(feature_names, seed, n_jobs, **params)
        self.booster: Any = None

    def _train_params(self) -> dict[str, Any]:
        params = {k: v for k, v in self.params.items() if k != "num_boost_round"}
        return {**params, "seed": self.seed, "num_threads": self.n_jobs, "verbosity": -1,
                "deterministic": True, "force_col_wise": True}

    def _train(self, dataset: Any) -> None:
        import lightgbm

        self.booster = lightgbm.train(
            self._train_params(), dataset, num_boost_round=int(self.params["num_boost_round"])
        )
        self.trees = TreeArrays.from_lightgbm(self.booster.dump_model(), len(self.feature_names))
        self.importances_ = np.asarray(
            self.booster.feature_importance(importance_type="gain"), dtype=np.float64)


class GBMRegressorModel(_LightGBMModel):
    """LightGBM regressor of the normalised label, quantile loss (alpha 0.9: optimistic)."""

    kind = "gbm"
    defaults: ClassVar[dict[str, Any]] = {
        "objective": "quantile",
        "alpha": 0.9,
        "num_boost_round": 100,
        "learning_rate": 0.1,
        "num_leaves": 31,
        "min_data_in_leaf": 5,
    }

    def _fit(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray) -> None:
        import lightgbm

        names = list(self.feature_names)
        self._train(lightgbm.Dataset(x, label=y, feature_name=names, free_raw_data=True))


class LambdaRankModel(_LightGBMModel):
    """LightGBM LambdaRank on relevance grades (`relevance_grades`), one query per problem."""

    kind = "lambdarank"
    defaults: ClassVar[dict[str, Any]] = {
        "objective": "lambdarank",
        "num_boost_round": 100,
        "learning_rate": 0.1,
        "num_leaves": 31,
        "min_data_in_leaf": 5,
        "lambdarank_truncation_level": 30,
    }

    def _fit(self, x: np.ndarray, y: np.ndarray, codes: np.ndarray) -> None:
        import lightgbm

        grades = relevance_grades(y)
        # Queries: each problem, split into random sub-queries of at most MAX_QUERY_ROWS rows.
        rng = np.random.default_rng(self.seed)
        counts = np.bincount(codes)
        chunks = np.maximum(1, np.ceil(counts / MAX_QUERY_ROWS)).astype(np.int64)
        chunk = np.floor(rng.random(len(codes)) * chunks[codes]).astype(np.int64)
        query = np.concatenate([[0], np.cumsum(chunks)])[codes] + chunk
        order = np.argsort(query, kind="stable")
        sizes = np.bincount(query)
        sizes = sizes[sizes > 0]
        names = list(self.feature_names)
        dataset = lightgbm.Dataset(x[order], label=grades[order], group=sizes, feature_name=names)
        self._train(dataset)


MODELS: dict[str, type[LearnedModel]] = {
    RandomForestModel.kind: RandomForestModel,
    GBMRegressorModel.kind: GBMRegressorModel,
    LambdaRankModel.kind: LambdaRankModel,
}


def make_model(kind: str, **kwargs: Any) -> LearnedModel:
    """A fresh, untrained model of the given kind ("rf", "gbm", "lambdarank")."""
    if kind not in MODELS:
        raise InputError(f"unknown model {kind!r}; choose one of: {', '.join(MODELS)}")
    return MODELS[kind](**kwargs)
