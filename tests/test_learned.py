"""Learned cost models on real measured spaces (Kernel Tuner GPU slice, IREE CPU logs)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dispatchtune.costmodel import learned
from dispatchtune.costmodel.learned import (
    GBMRegressorModel,
    LambdaRankModel,
    RandomForestModel,
    labels_from_times,
    make_model,
    merge_duplicates,
    normalized_labels,
    relevance_grades,
)
from dispatchtune.costmodel.metrics import expected_benchmarks_with_ties, near_optimal
from dispatchtune.costmodel.metrics import random_expected_benchmarks as random_expected
from dispatchtune.costmodel.train import TrainingData, load_training_data
from dispatchtune.errors import InputError
from dispatchtune.features.extract import FEATURE_NAMES

FIXTURES = Path(__file__).parent / "fixtures"
KT = FIXTURES / "kt_gemm_2080ti_slice.json.gz"
CPU_MATMUL = FIXTURES / "cpu_results_matmul_256x384x256.jsonl"
CPU_CONV = FIXTURES / "cpu_results_conv_2x14x14x128.jsonl"


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return load_training_data([KT, CPU_MATMUL, CPU_CONV])


def test_labels_are_normalised_per_problem() -> None:
    times = np.array([2.0, 4.0, 1.0, 3.0])
    y = normalized_labels(labels_from_times(times), ["a", "a", "b", "b"])
    np.testing.assert_allclose(y, np.log([1.0, 0.5, 1.0, 1 / 3]))
    # Scale-free: the same relative speeds in ms or in s give the same labels.
    np.testing.assert_allclose(normalized_labels(1 / (times * 1000), ["a", "a", "b", "b"]), y)
    with pytest.raises(InputError, match="positive"):
        normalized_labels([1.0, 0.0])
    with pytest.raises(InputError, match="groups"):
        normalized_labels([1.0, 2.0], ["a"])


def test_duplicate_rows_keep_their_best_label_per_problem() -> None:
    x = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [1.0, 2.0]])
    y = np.array([-0.5, -0.1, -0.3, -0.7])
    codes = np.array([0, 0, 0, 1])
    mx, my, mc = merge_duplicates(x, y, codes)
    got = {(int(c), *r): v for c, r, v in zip(mc, map(tuple, mx), my, strict=True)}
    assert got == {(0, 1.0, 2.0): -0.1, (0, 3.0, 4.0): -0.3, (1, 1.0, 2.0): -0.7}


def test_relevance_grades_top_grade_is_within_5_percent() -> None:
    ratios = np.array([1.0, 1 / 1.05, 1 / 1.06, 0.85, 0.75, 0.6, 0.4])
    assert relevance_grades(np.log(ratios)).tolist() == [5, 5, 4, 3, 2, 1, 0]


@pytest.mark.parametrize("kind", ["rf", "gbm", "lambdarank"])
def test_models_rank_held_in_spaces_better_than_random(kind: str, data: TrainingData) -> None:
    model = make_model(kind).fit(data.features, labels_from_times(data.times), data.groups)
    assert model.training_rows <= len(data.times)
    for problem in data.problems:
        mask = data.groups == problem
        scores = model.predict(data.features[mask])
        times = data.times[mask]
        assert scores.shape == (mask.sum(),) and np.isfinite(scores).all()
        k = int(near_optimal(times).sum())
        # In-sample: a fitted model must beat the random order clearly on its own data.
        assert expected_benchmarks_with_ties(scores, times) < random_expected(len(times), k) / 2
    shares = model.feature_importances()
    assert list(sorted(shares.index)) == sorted(FEATURE_NAMES)
    assert shares.sum() == pytest.approx(1.0) and shares.iloc[0] > 0


def test_numpy_forest_matches_scikit_learn(data: TrainingData) -> None:
    from sklearn.ensemble import RandomForestRegressor

    model = RandomForestModel(seed=3, n_estimators=10)
    model.fit(data.features, labels_from_times(data.times), data.groups)
    x = model.matrix(data.features)
    y = normalized_labels(labels_from_times(data.times), data.groups)
    codes = pd.factorize(data.groups, sort=True)[0]
    mx, my, _ = merge_duplicates(x, y, codes)
    reference = RandomForestRegressor(random_state=3, n_jobs=1, **model.params).fit(mx, my)
    np.testing.assert_allclose(model.predict(x), reference.predict(x), rtol=0, atol=1e-12)
    # Chunked prediction gives the same scores as one block.
    assert model.trees is not None
    np.testing.assert_array_equal(model.trees.predict(x, chunk_rows=7), model.predict(x))


def test_lambdarank_splits_large_problems_into_sub_queries(
    data: TrainingData, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(learned, "MAX_QUERY_ROWS", 40)
    model = LambdaRankModel(num_boost_round=20)
    model.fit(data.features, labels_from_times(data.times), data.groups)
    assert model.booster.num_trees() == 20


def test_bad_inputs_are_one_line_errors(data: TrainingData) -> None:
    model = GBMRegressorModel(num_boost_round=5)
    with pytest.raises(InputError, match="not trained"):
        model.predict(data.features)
    model.fit(data.features, labels_from_times(data.times), data.groups)
    with pytest.raises(InputError, match="lacks"):
        model.predict(data.features.drop(columns=["tile_m"]))
    with pytest.raises(InputError, match="columns"):
        model.predict(np.zeros((3, 4)))
    nan = data.features.head(3).copy()
    nan.iloc[0, 0] = np.nan
    with pytest.raises(InputError, match="NaN"):
        model.predict(nan)
    with pytest.raises(InputError, match="unknown gbm parameter"):
        GBMRegressorModel(n_trees=5)
    with pytest.raises(InputError, match="unknown model"):
        make_model("svm")
    # Plain arrays work as well as DataFrames (scikit-learn style).
    x = data.features[list(FEATURE_NAMES)].to_numpy()
    np.testing.assert_array_equal(model.predict(x), model.predict(data.features))


def test_learned_model_drives_rank_on_a_logged_cpu_space(data: TrainingData) -> None:
    from dispatchtune.costmodel.rank import rank
    from dispatchtune.datasets.records import load_results
    from dispatchtune.problem import Problem

    model = make_model("gbm").fit(data.features, labels_from_times(data.times), data.groups)
    table = load_results(CPU_MATMUL)
    problem = Problem.from_dict(table["problem"].iloc[0])
    ranked = rank(table, problem, "host", model=model)
    assert len(ranked) == len(table)
    assert ranked["score"].is_monotonic_decreasing
    times = ranked["min_ms"].to_numpy()
    # The model's first pick is far better than the median candidate of this space.
    assert times[0] < np.median(times)
