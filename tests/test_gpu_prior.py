"""The pairwise GPU prior: fit, model file, the shipped gfx942 default, and `rank --json`."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dispatchtune.costmodel.defaults import default_model_path, default_order, model_for_target
from dispatchtune.costmodel.modelfile import load_cost_model, load_model, save_model
from dispatchtune.costmodel.pairwise import (
    PIPELINES,
    POSITIVE,
    PairwiseModel,
    basis,
    basis_names,
    diversified,
    interleave,
    near_copies,
    towards_default,
)
from dispatchtune.costmodel.rank import rank
from dispatchtune.datasets.expert_specs import expert_columns, load_spec_file
from dispatchtune.errors import InputError
from dispatchtune.features import extract_features
from dispatchtune.problem import Problem
from dispatchtune.search import CandidateSet, enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures" / "expert_specs"
GFX942 = get_target("gfx942")
SMALL = Problem.matmul(256, 256, 512, "f16")


@functools.cache
def _small() -> CandidateSet:
    return enumerate_candidates(SMALL, GFX942)


def _one_expert() -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Features, labels and groups of one real space where one configuration plays the expert."""
    features = extract_features(SMALL, GFX942, _small().table)
    labels = np.zeros(len(features))
    labels[len(features) // 3] = POSITIVE
    return features, labels, np.zeros(len(features))


def _tileandfuse_expert() -> tuple[CandidateSet, pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """The small space, its features, labels with one TileAndFuse row as the expert, one group,
    and the TileAndFuse rows."""
    cands = _small()
    features = extract_features(SMALL, GFX942, cands.table)
    fused = np.flatnonzero(cands.table["pipeline"].astype(str).to_numpy() == "TileAndFuse")
    labels = np.where(np.arange(len(features)) == fused[len(fused) // 2], POSITIVE, 0.0)
    return cands, features, labels, np.zeros(len(features)), fused


def _fitted() -> tuple[PairwiseModel, np.ndarray]:
    """A prior fit on one real space where one configuration plays the expert."""
    features, labels, groups = _one_expert()
    return PairwiseModel(c=1.0).fit(features, labels, groups), labels


def test_fit_ranks_the_positive_first_and_scores_are_linear() -> None:
    model, labels = _fitted()
    features = extract_features(SMALL, GFX942, _small().table)
    order = model.rank(features)
    assert int(np.flatnonzero(order == int(np.argmax(labels)))[0]) < 0.05 * len(order)
    assert model.weights is not None and model.weights.shape == (len(basis_names()),)
    with pytest.raises(InputError, match="no positive row"):
        PairwiseModel().fit(features, np.zeros(len(features)), np.zeros(len(features)))


def test_model_file_round_trip_and_refusals(tmp_path: Path) -> None:
    model, _ = _fitted()
    features = extract_features(SMALL, GFX942, _small().table)
    path = save_model(model, tmp_path / "prior.json", {"command": "test"})
    loaded = load_cost_model(path)
    assert isinstance(loaded, PairwiseModel)
    assert np.array_equal(loaded.predict(features), model.predict(features))
    assert loaded.metadata["target_kinds"] == ["gpu"] and loaded.metadata["command"] == "test"
    with pytest.raises(InputError, match="pairwise GPU prior; read it with load_cost_model"):
        load_model(path)  # the tree-model reader says what the file is
    document = json.loads(path.read_text())
    bad_basis = json.loads(path.read_text())
    bad_basis["model"]["linear"]["basis"][0] = "log2_something_else"
    short = json.loads(path.read_text())
    short["model"]["linear"]["weights"]["length"] = 3
    bad_param = json.loads(path.read_text())
    bad_param["params"]["c"] = "lots"
    for broken, message in ((bad_basis, "basis"), (short, "length"), (bad_param, "params.c")):
        target = tmp_path / "broken.json"
        target.write_text(json.dumps(broken))
        with pytest.raises(InputError, match=message):
            load_cost_model(target)
    assert document["model_type"] == "pairwise"


@pytest.mark.parametrize("product", ["mi300x", "rocm:mi308x", "rocm:mi300a"])
def test_gfx942_products_use_the_gfx942_prior(product: str) -> None:
    # Product names IREE maps to gfx942 (MI308X: 80 CUs, MI300A: 228) rank with its model, not
    # the heuristic.
    assert default_model_path(product) == default_model_path("gfx942")
    assert default_order(product) == "model"
    assert model_for_target(product)[1] == "installed default model gfx942.json"


@pytest.mark.parametrize("target", ["gfx90a", "gfx950", "gfx908", "rocm:mi250x"])
def test_other_cdna_gpus_take_the_gfx942_prior_and_say_so(target: str) -> None:
    # Wave64 MFMA GPUs without a model of their own (docs/gpu_order.md, part 24).
    assert default_model_path(target) == default_model_path("gfx942")
    assert default_order(target) == "model"
    assert model_for_target(target)[1].endswith("(the gfx942 prior, for another CDNA GPU)")


@pytest.mark.parametrize("target", ["gfx1201", "gfx1100", "sm_86"])
def test_gpus_of_other_families_keep_the_heuristic(target: str) -> None:
    # RDNA (WMMA) and NVIDIA GPUs: no expert files teach them, and nothing says gfx942's do.
    assert default_model_path(target) is None and default_order(target) == "heuristic"


def test_shipped_gfx942_prior_is_the_default_and_finds_an_expert() -> None:
    path = default_model_path("gfx942")
    assert path is not None and path.name == "gfx942.json"
    model, where = model_for_target("gfx942")
    assert isinstance(model, PairwiseModel) and where == "installed default model gfx942.json"
    assert "expert_order_lofo.py" in model.metadata["command"]
    # Each pipeline's ranker is blended with its trees (docs/gpu_order.md, part 16).
    assert set(model.trees) == set(model.pipeline_rankers) == {"VectorDistribute", "TileAndFuse"}
    assert 0 < model.tree_weight < 1
    entries = {e.matcher: e for e in load_spec_file(FIXTURES / FIXTURE_SPEC)}
    entry = entries[FIXTURE_MATCHER]
    assert entry.problem is not None
    cands = enumerate_candidates(entry.problem, GFX942, heuristic_filters=False)
    ranked = rank(cands, order="model")  # the path `rank --order model` and `tune` take
    mask = np.ones(len(ranked), dtype=bool)
    for column, value in expert_columns(entry).items():
        mask &= ranked[column].to_numpy() == value
    assert mask.any()
    position = int(np.flatnonzero(mask)[0])
    assert position < 0.05 * len(ranked), (position, len(ranked))
    # Without the pipeline column (plain `predict`) the scores differ: the table matters.
    features = extract_features(entry.problem, GFX942, cands.table)
    assert not np.array_equal(model.predict(features),
                              model.predict_candidates(features, cands.table))


# An expert of a file the shipped prior was trained on (in-sample: held-out figures are in
# docs/gpu_order.md); its whole space (no heuristic filters) is the smallest of the fixtures.
FIXTURE_SPEC, FIXTURE_MATCHER = "sdxl_2024.mlir", "match_mmt_8192x640x640"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dispatchtune", *args], capture_output=True,
                          text=True, check=False, timeout=600)


def test_rank_json_prints_the_whole_order_as_candidates_json(tmp_path: Path) -> None:
    source = tmp_path / "mm.mlir"
    source.write_text(SMALL.to_mlir())
    proc = _run("rank", str(source), "--target", "gfx942", "--order", "model", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "installed default model gfx942.json" in proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    cands = _small()
    assert len(lines) == len(cands)  # every candidate: no --limit
    assert [line["rank"] for line in lines] == list(range(len(cands)))
    scores = [line["score"] for line in lines]
    assert scores == sorted(scores, reverse=True)
    assert sorted(line["candidate_id"] for line in lines) == list(range(len(cands)))
    schema = _run("candidates", str(source), "--target", "gfx942", "--json", "--limit", "1")
    assert set(json.loads(schema.stdout.splitlines()[0])) <= set(lines[0])
    for line in (lines[0], lines[len(lines) // 2], lines[-1]):
        assert line["compilation_info"] == cands.compilation_info(line["candidate_id"])
        assert line["knobs"]["tile_m"] == int(cands.table["tile_m"].iloc[line["candidate_id"]])
    limited = _run("rank", str(source), "--target", "gfx942", "--json", "--limit", "3")
    assert len(limited.stdout.splitlines()) == 3


def test_kind_terms_give_attention_weights_of_its_own() -> None:
    """With `kind_terms` the basis repeats itself on attention rows only (0 elsewhere)."""
    attention = Problem.attention(2, 256, 64, 64, 256, "f16")
    cands = enumerate_candidates(attention, GFX942)
    att = extract_features(attention, GFX942, cands.table)
    z = basis(att, cands.table, kind_terms=True)
    half = len(basis_names())
    assert z.shape == (len(att), 2 * half) and len(basis_names(kind_terms=True)) == 2 * half
    assert np.array_equal(z[:, :half], z[:, half:])
    mm = extract_features(SMALL, GFX942, _small().table)
    assert not basis(mm, _small().table, kind_terms=True)[:, half:].any()
    labels = np.zeros(len(att))
    labels[len(att) // 2] = POSITIVE
    model = PairwiseModel(c=1.0, kind_terms=True).fit(att, labels, np.zeros(len(att)))
    assert model.weights is not None and model.weights.shape == (2 * half,)
    assert model.params["kind_terms"] is True
    assert "kind_terms" not in PairwiseModel().params  # older model files stay loadable


def test_hard_negatives_refit_keeps_the_positive_on_top_and_loads(tmp_path: Path) -> None:
    """The second fit adds the top-scored other rows as pairs; the setting is training-only, so
    the saved model has the usual params and loads."""
    features, labels, groups = _one_expert()
    plain = PairwiseModel(c=1.0).fit(features, labels, groups)
    hard = PairwiseModel(c=1.0, hard_negatives=20).fit(features, labels, groups)
    assert hard.training_rows == plain.training_rows + 20
    order = hard.rank(features)
    assert int(np.flatnonzero(order == len(features) // 3)[0]) < 0.05 * len(order)
    assert "hard_negatives" not in hard.params
    loaded = load_cost_model(save_model(hard, tmp_path / "hard.json", {}))
    assert np.array_equal(loaded.predict(features), hard.predict(features))
    with pytest.raises(InputError, match="hard_negatives >= 0"):
        PairwiseModel(hard_negatives=-1)


def test_near_copies_are_the_rows_a_few_knobs_from_an_expert() -> None:
    """A row is a near copy of its group's expert when at most n configuration columns differ;
    the expert itself, and a group without one, have none."""
    cands = _small()
    table = cands.table
    _, labels, groups = _one_expert()
    expert = table.iloc[int(np.flatnonzero(labels)[0])]
    columns = ["pipeline", "tile_m", "tile_n", "tile_k", "intrinsic", "subgroups_m", "subgroups_n"]
    apart = (table[columns] != expert[columns]).sum(axis=1).to_numpy()
    one, two = near_copies(labels, groups, table, 1), near_copies(labels, groups, table, 2)
    assert one.any() and (one == ((apart <= 1) & (labels == 0))).all()
    assert (two == ((apart <= 2) & (labels == 0))).all() and two.sum() > one.sum()
    assert not one[labels > 0].any()
    assert not near_copies(np.zeros(len(labels)), groups, table, 1).any()
    # Beside another op kind's table (a column this one lacks is NaN here), nothing changes.
    other = table.assign(pv_intrinsic="MFMA_F32_32x32x8_F16")
    both = pd.concat([table, other], ignore_index=True)
    twice = near_copies(np.concatenate([labels, labels]), np.repeat([0, 1], len(labels)), both, 1)
    assert (twice == np.concatenate([one, one])).all()


def test_spare_neighbours_fits_as_if_the_near_copies_were_not_there(tmp_path: Path) -> None:
    """With `spare_neighbours` the pipeline rankers are the ones fit on the space without the
    expert's near copies; the setting is training-only, and refused below 0 or without a table."""
    cands, features, labels, groups, fused = _tileandfuse_expert()
    table = cands.table
    settings: dict[str, Any] = {"c": 1.0, "hard_negatives": 20, "listwise": 0.1,
                "pipeline_rankers": ["TileAndFuse"], "tree_weight": 0.2}
    spared = PairwiseModel(**settings, spare_neighbours=1).fit(features, labels, groups, table)
    keep = np.flatnonzero(~near_copies(labels, groups, table, 1))
    assert len(keep) < len(labels)
    dropped = PairwiseModel(**settings).fit(features.iloc[keep], labels[keep], groups[keep],
                                            table.iloc[keep])
    plain = PairwiseModel(**settings).fit(features, labels, groups, table)
    assert np.array_equal(spared.rankers["TileAndFuse"], dropped.rankers["TileAndFuse"])
    assert not np.array_equal(spared.rankers["TileAndFuse"], plain.rankers["TileAndFuse"])
    rows = np.isin(np.arange(len(labels)), fused)
    assert np.array_equal(spared.predict_candidates(features[rows], table[rows]),
                          dropped.predict_candidates(features[rows], table[rows]))
    order = np.argsort(-spared.predict_candidates(features, table), kind="stable")
    assert int(np.flatnonzero(order == np.flatnonzero(labels)[0])[0]) < 0.05 * len(order)
    assert "spare_neighbours" not in spared.params
    loaded = load_cost_model(save_model(spared, tmp_path / "spared.json", {}))
    assert np.array_equal(loaded.predict_candidates(features, table),
                          spared.predict_candidates(features, table))
    with pytest.raises(InputError, match="spare_neighbours >= 0"):
        PairwiseModel(spare_neighbours=-1)
    with pytest.raises(InputError, match="needs the candidate table"):
        PairwiseModel(spare_neighbours=1).fit(features, labels, groups)


def test_basis_weighs_the_intrinsic_in_three_columns_and_the_shipped_model_matches() -> None:
    # Part 6: the intrinsic's M, N and traffic per MAC are all basis columns (docs/gpu_order.md).
    from dispatchtune.costmodel.pairwise import basis_names

    names = basis_names()
    for column in ("log2_mma_m", "log2_mma_n", "log2_mma_area_to_volume", "log2_mma_k"):
        assert column in names
    model, _ = model_for_target("gfx942")
    assert isinstance(model, PairwiseModel) and model.weights is not None
    assert len(model.weights) == len(names)


@pytest.mark.parametrize(("name", "tile", "intrinsic"),
                         [("mma_tiles_m", "vec_m", "mma_m"), ("mma_tiles_n", "vec_n", "mma_n")])
def test_basis_holds_the_intrinsic_tiles_per_subgroup_and_a_preference_for_one_value(
    name: str, tile: str, intrinsic: str,
) -> None:
    """`mma_tiles_m` and `mma_tiles_n` (per-subgroup tile / intrinsic size) are basis columns with
    their squares, so a linear score can prefer one count of intrinsic tiles per subgroup over
    both fewer and more (parts 11 and 23: the columns of the tile and the intrinsic alone cannot)."""
    features, _, groups = _one_expert()
    names = basis_names()
    z = basis(features)
    tiles = np.log2(features[tile].to_numpy() / features[intrinsic].to_numpy())
    assert len(set(tiles.tolist())) >= 3  # the space holds several counts
    column = z[:, names.index(f"log2_{name}")]
    assert np.allclose(column, (tiles - tiles.mean()) / (tiles.std() + 1e-9))
    assert f"log2_{name}_sq" in names
    # The expert is a row with the middle count of tiles; the fit puts it near the top.
    middle = float(np.median(tiles))
    labels = np.zeros(len(features))
    labels[int(np.flatnonzero(tiles == middle)[0])] = POSITIVE
    model = PairwiseModel(c=1.0).fit(features, labels, groups)
    order = model.rank(features)
    assert int(np.flatnonzero(order == int(np.argmax(labels)))[0]) < 0.05 * len(order)
    with pytest.raises(InputError, match=f"lacks '{tile}'"):
        basis(features.drop(columns=[tile]))


def test_basis_holds_the_share_of_the_gpus_cus_a_candidate_fills() -> None:
    """`cu_fill` (workgroups per CU, at most 1) is a basis column with its square: it tells the
    candidates of a dispatch too small to fill the GPU apart, and standardises away on one whose
    every candidate fills it (part 22)."""
    features, _, _ = _one_expert()
    names = basis_names()
    per_cu = features["workgroups_per_cu"].to_numpy()
    assert (per_cu < 1).any() and len(set(per_cu.tolist())) >= 3  # 256 x 256 on 304 CUs
    fill = np.log2(np.minimum(per_cu, 1.0))
    column = basis(features)[:, names.index("log2_cu_fill")]
    assert np.allclose(column, (fill - fill.mean()) / (fill.std() + 1e-9))
    assert "log2_cu_fill_sq" in names
    full = features.assign(workgroups_per_cu=np.maximum(per_cu, 1.0) * 3)
    assert np.allclose(basis(full)[:, names.index("log2_cu_fill")], 0.0)
    assert not np.allclose(basis(full)[:, names.index("log2_workgroups_per_cu")], 0.0)


def test_listwise_half_keeps_the_positive_on_top_and_the_model_file_format() -> None:
    """`listwise` fits a softmax-per-group ranker on the same basis and stores the mean of the two
    unit weight vectors: one weight array, the usual params, and an order that still puts the
    positive first; the listwise direction alone does too."""
    features, labels, groups = _one_expert()
    plain = PairwiseModel(c=1.0).fit(features, labels, groups)
    mixed = PairwiseModel(c=1.0, listwise=0.1).fit(features, labels, groups)
    assert plain.weights is not None and mixed.weights is not None
    assert mixed.weights.shape == plain.weights.shape and "listwise" not in mixed.params
    assert not np.allclose(mixed.weights, plain.weights / np.linalg.norm(plain.weights))
    listwise = 2.0 * mixed.weights - plain.weights / np.linalg.norm(plain.weights)
    assert np.isclose(np.linalg.norm(listwise), 1.0)
    for scores in (mixed.predict(features), np.round(basis(features) @ listwise, 9)):
        ahead = int((scores > scores[len(features) // 3]).sum())
        assert ahead < 0.05 * len(features), ahead
    with pytest.raises(InputError, match="listwise >= 0"):
        PairwiseModel(listwise=-1.0)


def test_pipeline_terms_weigh_tileandfuse_rows_on_their_own_and_load(tmp_path: Path) -> None:
    """With `pipeline_terms` the basis repeats itself on TileAndFuse rows, standardised over
    those rows only (0 on VectorDistribute rows); such a model (and a per-kind one) saves and
    loads with its own basis."""
    cands = _small()
    pipelines = cands.table["pipeline"].astype(str).to_numpy()
    assert {"TileAndFuse", "VectorDistribute"} <= set(pipelines)
    features = extract_features(SMALL, GFX942, cands.table)
    half = len(basis_names())
    z = basis(features, cands.table, pipeline_terms=True)
    assert z.shape == (len(features), 2 * half)
    fused = pipelines == "TileAndFuse"
    assert not z[~fused, half:].any()
    tf = z[fused, half:]
    moving = tf.std(axis=0) > 0
    assert np.allclose(tf[:, moving].mean(axis=0), 0) and np.allclose(tf[:, moving].std(axis=0), 1)
    labels = np.zeros(len(features))
    labels[np.flatnonzero(fused)[len(np.flatnonzero(fused)) // 2]] = POSITIVE
    for kind_terms, pipeline_terms in ((False, True), (True, True), (True, False)):
        model = PairwiseModel(c=1.0, kind_terms=kind_terms, pipeline_terms=pipeline_terms).fit(
            features, labels, np.zeros(len(features)), cands.table)
        path = save_model(model, tmp_path / "m.json")
        loaded = load_cost_model(path)
        assert isinstance(loaded, PairwiseModel) and loaded.params == model.params
        assert np.array_equal(loaded.predict_candidates(features, cands.table),
                              model.predict_candidates(features, cands.table))
    document = json.loads(path.read_text())
    document["params"]["kind_terms"] = "yes"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="expected true or false"):
        load_cost_model(path)


def test_interleave_takes_each_pipelines_best_remaining_row_in_turn() -> None:
    scores = np.array([5.0, 4.0, 3.0, 9.0, 8.0, 1.0, 1.0])
    pipeline = np.array(["VD", "VD", "VD", "TF", "TF", "TF", "TF"])
    merged = interleave(scores, pipeline)
    order = np.argsort(-merged, kind="stable")
    assert order[:4].tolist() == [0, 3, 1, 4]  # the best of each, then the second of each
    assert merged[5] == merged[6] == -3.5  # tied rows share their mean rank


def test_pipeline_rankers_order_their_pipeline_and_interleave(tmp_path: Path) -> None:
    """A TileAndFuse ranker is fit only on the dispatches whose expert is TileAndFuse, on their
    TileAndFuse rows: it finds that expert early, the order alternates between the pipelines'
    own orders, and the model file keeps the ranker (and refuses a wrong one)."""
    cands = _small()
    pipelines = cands.table["pipeline"].astype(str).to_numpy()
    features = extract_features(SMALL, GFX942, cands.table)
    fused = np.flatnonzero(pipelines == "TileAndFuse")
    vector = np.flatnonzero(pipelines == "VectorDistribute")
    # Two copies of the space: one expert per pipeline, so both the shared score and the ranker
    # have a positive to learn from.
    both = pd.concat([features, features], ignore_index=True)
    table = pd.concat([cands.table, cands.table], ignore_index=True)
    labels = np.zeros(len(both))
    labels[fused[len(fused) // 2]] = POSITIVE
    labels[len(features) + vector[len(vector) // 2]] = POSITIVE
    groups = np.repeat([0, 1], len(features))
    model = PairwiseModel(c=1.0, pipeline_rankers=["TileAndFuse"]).fit(both, labels, groups, table)
    assert set(model.rankers) == {"TileAndFuse"}
    scores = model.predict_candidates(features, cands.table)
    order = np.argsort(-scores, kind="stable")
    assert sorted(pipelines[order[:2]].tolist()) == ["TileAndFuse", "VectorDistribute"]
    position = int(np.flatnonzero(order == fused[len(fused) // 2])[0])
    assert position < 0.05 * len(order)
    path = save_model(model, tmp_path / "m.json")
    loaded = load_cost_model(path)
    assert isinstance(loaded, PairwiseModel) and loaded.pipeline_rankers == ["TileAndFuse"]
    assert np.array_equal(loaded.predict_candidates(features, cands.table), scores)
    document = json.loads(path.read_text())
    document["params"]["pipeline_rankers"] = ["SIMT"]
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="pipeline names"):
        load_cost_model(path)
    with pytest.raises(InputError, match="no expert configuration uses TileAndFuse"):
        PairwiseModel(pipeline_rankers=["TileAndFuse"]).fit(
            features, np.where(np.arange(len(features)) == vector[0], POSITIVE, 0.0),
            np.zeros(len(features)), cands.table)


def test_ranker_trees_blend_into_contractions_but_not_attention(tmp_path: Path) -> None:
    """With `tree_weight` a pipeline ranker also fits LambdaRank trees on its rows: the linear
    weights are those of the same model without trees, contraction scores blend the two, the
    expert stays early, attention keeps the linear order, and the model file keeps the trees (and
    refuses a file that lost them or whose tree basis differs)."""
    cands, features, labels, groups, fused = _tileandfuse_expert()
    with pytest.raises(InputError, match="tree_weight needs pipeline_rankers"):
        PairwiseModel(tree_weight=0.5)
    with pytest.raises(InputError, match="tree_weight <= 1"):
        PairwiseModel(pipeline_rankers=["TileAndFuse"], tree_weight=2.0)
    linear = PairwiseModel(c=1.0, pipeline_rankers=["TileAndFuse"]).fit(
        features, labels, groups, cands.table)
    model = PairwiseModel(c=1.0, pipeline_rankers=["TileAndFuse"], tree_weight=0.5).fit(
        features, labels, groups, cands.table)
    assert set(model.trees) == {"TileAndFuse"} and not linear.trees
    assert np.array_equal(model.rankers["TileAndFuse"], linear.rankers["TileAndFuse"])
    scores = model.predict_candidates(features, cands.table)
    assert not np.array_equal(scores, linear.predict_candidates(features, cands.table))
    order = np.argsort(-scores, kind="stable")
    assert int(np.flatnonzero(order == fused[len(fused) // 2])[0]) < 0.05 * len(order)

    attention = Problem.attention(2, 256, 64, 64, 256, "f16")
    att_table = enumerate_candidates(attention, GFX942).table
    att = extract_features(attention, GFX942, att_table)
    assert np.array_equal(model.predict_candidates(att, att_table),
                          linear.predict_candidates(att, att_table))

    path = save_model(model, tmp_path / "m.json")
    loaded = load_cost_model(path)
    assert isinstance(loaded, PairwiseModel) and loaded.tree_weight == 0.5
    assert np.array_equal(loaded.predict_candidates(features, cands.table), scores)
    document = json.loads(path.read_text())
    document["model"]["trees_TileAndFuse"]["basis"][-1] = "log2_something_else"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="tree basis"):
        load_cost_model(path)
    del document["model"]["trees_TileAndFuse"]
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="trees_TileAndFuse"):
        load_cost_model(path)


def test_rank_a_gfx942_product_from_the_cli_uses_the_gfx942_prior(tmp_path: Path) -> None:
    """`rank FILE --target rocm:mi308x`, as the README suggests for a product: the gfx942 prior,
    not the heuristic."""
    source = tmp_path / "mm.mlir"
    source.write_text(SMALL.to_mlir())
    proc = _run("rank", str(source), "--target", "rocm:mi308x", "--json", "--limit", "2")
    assert proc.returncode == 0, proc.stderr
    assert "installed default model gfx942.json" in proc.stderr
    assert [json.loads(line)["rank"] for line in proc.stdout.splitlines()] == [0, 1]


def test_rank_speed_benchmark_times_rank_json_and_refuses_a_bad_conv(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`benchmarks/rank_speed.py` runs the CLI as a user does and prints every model's times; a
    malformed `--conv` is argparse's one-line error."""
    from dispatchtune.benchmarks import rank_speed

    assert rank_speed.main(["--conv", "1,8,8,64,64,1,1,f16", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "candidates, 1 runs per model" in out and "gfx942.json (shipped) |" in out
    with pytest.raises(SystemExit) as exit_info:
        rank_speed.main(["--conv", "1,8,8,64,64,1,1,x9"])
    assert exit_info.value.code == 2
    assert "unsupported element type 'x9'" in capsys.readouterr().err


def test_diversified_moves_a_familys_later_rows_behind_the_next_familys_best() -> None:
    """Each row loses weight x log2(1 + its rank within its family): a family's best row keeps
    its score, its third falls behind another family's best; no weight or no column: no change."""
    scores = np.array([5.0, 4.0, 3.0, 2.9])
    table = pd.DataFrame({"workgroup_threads": [256, 256, 256, 64]})
    out = diversified(scores, table, {"threads": 1.0})
    assert out.tolist() == [5.0, 3.0, 3.0 - np.log2(3.0), 2.9]
    assert np.argsort(-out, kind="stable").tolist() == [0, 1, 3, 2]
    assert diversified(scores, table, {"threads": 0.0}).tolist() == scores.tolist()
    assert diversified(scores, table, {"workgroup_split": 1.0}).tolist() == scores.tolist()
    both = table.assign(tile_m=[64, 64, 128, 32], tile_n=64, subgroups_m=1, subgroups_n=2)
    out = diversified(scores, both, {"threads": 1.0, "workgroup_split": 1.0})
    assert out.tolist() == [5.0, 4.0 - 2.0, 3.0 - np.log2(3.0), 2.9]  # rows 2, 3 lead their tiles


def test_diversity_spreads_each_rankers_order_and_round_trips(tmp_path: Path) -> None:
    """`diversity` reorders each pipeline ranker's rows (its best row stays first, more thread
    counts come early), is checked on construction and on load, and the model file keeps it; the
    shipped gfx942 prior has it."""
    cands, features, labels, groups, _ = _tileandfuse_expert()
    for bad, message in (({"tiles": 1.0}, "diversity maps names"),
                         ({"threads": -1.0}, "diversity maps names")):
        with pytest.raises(InputError, match=message):
            PairwiseModel(pipeline_rankers=["TileAndFuse"], diversity=bad)
    with pytest.raises(InputError, match="diversity needs pipeline_rankers"):
        PairwiseModel(diversity={"threads": 1.0})
    plain = PairwiseModel(c=1.0, pipeline_rankers=["TileAndFuse"]).fit(
        features, labels, groups, cands.table)
    spread = PairwiseModel(c=1.0, pipeline_rankers=["TileAndFuse"],
                           diversity={"threads": 1.0}).fit(features, labels, groups, cands.table)
    assert np.array_equal(spread.rankers["TileAndFuse"], plain.rankers["TileAndFuse"])
    before = np.argsort(-plain.predict_candidates(features, cands.table), kind="stable")
    scores = spread.predict_candidates(features, cands.table)
    after = np.argsort(-scores, kind="stable")
    assert after[0] == before[0]
    threads = cands.table["workgroup_threads"].to_numpy()
    assert len(set(threads[after[:8]])) > len(set(threads[before[:8]]))
    path = save_model(spread, tmp_path / "m.json")
    loaded = load_cost_model(path)
    assert isinstance(loaded, PairwiseModel) and loaded.diversity == {"threads": 1.0}
    assert np.array_equal(loaded.predict_candidates(features, cands.table), scores)
    document = json.loads(path.read_text())
    document["params"]["diversity"] = {"threads": "much"}
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"params\.diversity"):
        load_cost_model(path)
    installed = default_model_path("gfx942")
    assert installed is not None
    shipped = load_cost_model(installed)
    assert isinstance(shipped, PairwiseModel) and shipped.diversity


def test_towards_default_adds_the_weighted_match_for_the_sets_kind_only() -> None:
    """A pipeline's standardised scores plus the weight of the set's op kind x `default_match`;
    another kind, no weight or an unknown default (-1): unchanged."""
    scores = np.array([3.0, 2.0, 1.0])
    conv = pd.DataFrame({"kind_convolution": [1, 1, 1], "kind_contraction": 0})
    table = pd.DataFrame({"default_match": [0, 4, 8]})
    out = towards_default(scores, conv, table, {"convolution": 0.5})
    z = (scores - scores.mean()) / scores.std()
    assert np.allclose(out, z + 0.5 * np.array([0, 4, 8]))
    assert np.argsort(-out).tolist() == [2, 1, 0]
    assert towards_default(scores, conv, table, {"contraction": 0.5}) is scores
    assert towards_default(scores, conv, table, {"convolution": 0.0}) is scores
    unknown = pd.DataFrame({"default_match": [-1, -1, -1]})
    assert towards_default(scores, conv, unknown, {"convolution": 0.5}) is scores
    assert towards_default(scores, conv, pd.DataFrame(index=range(3)), {"convolution": 1.0}) is scores


def test_default_match_counts_the_knobs_iree_own_config_shares() -> None:
    """`default_match` of a GPU conv's rows: IREE's own configuration, read from the module its
    constraints come with, is what `iree-compile` applies without a spec, and its rows score 8;
    a batch matmul, whose constraints are another op's, has -1 throughout."""
    from dispatchtune import load_problems
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.datasets.expert_specs import configuration_columns
    from dispatchtune.ir.spec import applied_configs
    from dispatchtune.search.gpu import DEFAULT_KNOBS, iree_default_columns

    path = Path(__file__).parents[1] / "examples" / "conv_nhwc_f32.mlir"
    (problem,) = load_problems(path, GFX942)
    default = iree_default_columns(problem, GFX942)
    assert default is not None and default["intrinsic"]
    (applied,) = applied_configs(path, GFX942, None)
    assert dict(configuration_columns(applied, problem)) == default
    table = enumerate_candidates(problem, GFX942, heuristic_filters=False).table
    mask, _ = expert_mask(table, default)  # type: ignore[arg-type]
    match = table["default_match"].to_numpy()
    assert mask.any() and (match[mask] == len(DEFAULT_KNOBS)).all()
    assert match.min() >= 0 and match.max() == len(DEFAULT_KNOBS)
    batched = enumerate_candidates(Problem.batch_matmul(4, 128, 128, 256, "f16"), GFX942).table
    assert (batched["default_match"] == -1).all()


def test_default_match_of_an_attention_iree_collapses_is_its_compiled_default(
        tmp_path: Path) -> None:
    """An SDXL-layout attention (batch x heads, which IREE collapses when it compiles the op
    alone) takes its constraints from the op without the batch loop; IREE's configuration of
    that op, read from the module, is what `iree-compile` applies to the attention itself, and
    the candidate with it scores every knob."""
    from dispatchtune.benchmarks.expert_order import expert_mask
    from dispatchtune.datasets.expert_specs import attention_problem, configuration_columns
    from dispatchtune.ir.spec import applied_configs
    from dispatchtune.search.gpu import DEFAULT_KNOBS, iree_default_columns
    from dispatchtune.search.gpu_source import collapsed_loops, constraint_source

    problem = attention_problem((2, 4, 1024, 64, 64, 1024), "f16")
    source, left_out = constraint_source(problem, GFX942)
    assert left_out == collapsed_loops(problem, GFX942) == (0,) and source.key != problem.key
    default = iree_default_columns(problem, GFX942)
    assert default is not None and default["intrinsic"] and default["pv_intrinsic"]
    path = tmp_path / "attention.mlir"
    path.write_text(problem.to_mlir())
    (applied,) = applied_configs(path, GFX942, None)
    assert dict(configuration_columns(applied, problem)) == default
    table = enumerate_candidates(problem, GFX942).table
    mask, _ = expert_mask(table, default)  # type: ignore[arg-type]
    match = table["default_match"].to_numpy()
    assert mask.sum() == 1 and match[mask][0] == len(DEFAULT_KNOBS) == match.max()
    assert match.min() >= 0


def test_default_closeness_moves_convolution_rows_and_round_trips(tmp_path: Path) -> None:
    """`default_closeness` is checked on construction and on load, the model file keeps it, and
    the shipped gfx942 prior moves a convolution's IREE default earlier with it (not a
    contraction's: its weight is the convolutions' alone)."""
    from dispatchtune import load_problems

    for bad in ({"pooling": 1.0}, {"convolution": -1.0}):
        with pytest.raises(InputError, match="default_closeness maps names"):
            PairwiseModel(pipeline_rankers=["TileAndFuse"], default_closeness=bad)
    with pytest.raises(InputError, match="default_closeness needs pipeline_rankers"):
        PairwiseModel(default_closeness={"convolution": 1.0})
    installed = default_model_path("gfx942")
    assert installed is not None
    shipped = load_cost_model(installed)
    assert isinstance(shipped, PairwiseModel)
    assert set(shipped.default_closeness) == {"convolution"}
    path = save_model(shipped, tmp_path / "m.json")
    assert isinstance(loaded := load_cost_model(path), PairwiseModel)
    assert loaded.default_closeness == shipped.default_closeness
    document = json.loads(path.read_text())
    document["params"]["default_closeness"] = {"convolution": "near"}
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=r"params\.default_closeness"):
        load_cost_model(path)
    without = load_cost_model(installed)
    assert isinstance(without, PairwiseModel)
    without.params.pop("default_closeness")
    examples = Path(__file__).parents[1] / "examples"
    for name, moves in (("conv_nhwc_f32.mlir", True), ("matmul_transpose_b_f16.mlir", False)):
        (problem,) = load_problems(examples / name, GFX942)
        table = enumerate_candidates(problem, GFX942).table
        features = extract_features(problem, GFX942, table)
        default = table["default_match"].to_numpy() == table["default_match"].max()
        positions = []
        for model in (without, shipped):
            order = np.argsort(-model.predict_candidates(features, table), kind="stable")
            positions.append(int(np.flatnonzero(default[order])[0]))
        assert (positions[1] < positions[0]) if moves else positions[1] == positions[0], positions


def test_lofo_folds_deal_sorted_files_in_turn_and_refuse_one_fold(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`expert_order_lofo.py --folds K` holds files out K groups at a time, every file once."""
    from dispatchtune.benchmarks.expert_order_lofo import held_out_groups, main

    names = [f"f{i}.mlir" for i in range(7)]
    assert held_out_groups(names, 0) == [[n] for n in names]
    assert held_out_groups(names, 3) == [["f0.mlir", "f3.mlir", "f6.mlir"],
                                         ["f1.mlir", "f4.mlir"], ["f2.mlir", "f5.mlir"]]
    assert held_out_groups(names, 9) == [[n] for n in names]
    with pytest.raises(SystemExit) as exit_info:
        main(["specs", "--folds", "1"])
    assert exit_info.value.code == 2
    assert "--folds takes 0" in capsys.readouterr().err
    for option, bad in (("--diversity", "tiles=1"), ("--diversity", "threads=much"),
                        ("--diversity", "threads=-1"), ("--default-closeness", "pooling=0.1"),
                        ("--default-closeness", "convolution=-1")):
        with pytest.raises(SystemExit) as exit_info:
            main(["specs", option, bad])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert option in err and "Traceback" not in err


def test_lofo_refuses_spec_sets_it_cannot_hold_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One line and status 1, not a report of nans or a traceback: a set whose experts are all
    outside their spaces (here, unreadable), and one file alone (nothing left to train on)."""
    from dispatchtune.benchmarks.expert_order_lofo import main

    (tmp_path / "garbage.mlir").write_bytes(b"\x00\x01 not MLIR")
    assert main([str(tmp_path), "--cache", str(tmp_path / "c")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: no expert configuration of {tmp_path} is inside its space "
                   "(benchmarks/expert_order.py says why each is not)"]
    name = "sdxl_2024.mlir"
    (tmp_path / name).write_text((FIXTURES / name).read_text())
    assert main([str(tmp_path / name), "--cache", str(tmp_path / "c"), "--no-heuristic-filters",
                 "--priors", "prior_interleaved", "--pipeline-rankers"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: holding out {name} leaves no expert configuration")


def test_lofo_refuses_unwritable_outputs_before_fitting(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--per-expert` and `--save` paths that cannot be written end the script at once with one
    line, before any spec file is read (the fits take minutes to hours)."""
    from dispatchtune.benchmarks.expert_order_lofo import main

    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    for option, path in (("--per-expert", blocker / "experts.csv"), ("--save", tmp_path)):
        with pytest.raises(SystemExit) as exit_info:
            main([str(tmp_path / "no_specs"), option, str(path)])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"{option} {path}: cannot write there" in err and "Traceback" not in err


def test_lofo_collapse_repeats_keeps_the_first_copy_of_each_repeated_expert() -> None:
    """`--collapse-repeats` trains on one copy of an expert that several files repeat (same
    dispatch, same configuration), the first in file order, the others kept in order."""
    from dispatchtune.benchmarks.expert_order_lofo import Expert, one_per_repeat

    features, labels, _ = _one_expert()
    table = _small().table
    mask, default = labels > 0, np.zeros(len(labels), bool)

    def expert(file: str, identity: str) -> Expert:
        return Expert(file, "contraction", table, features, mask, default, identity, "mm")

    data = [expert("a.mlir", "x"), expert("a.mlir", "y"), expert("b.mlir", "x"),
            expert("c.mlir", "z"), expert("c.mlir", "y")]
    kept = one_per_repeat(data)
    assert ([(e.file, e.identity) for e in kept]
            == [("a.mlir", "x"), ("a.mlir", "y"), ("c.mlir", "z")])


def test_lofo_holds_out_repeats_and_measured_gemms_of_held_out_dispatches() -> None:
    """A fit holding experts out trains on neither them, nor another file's copy of them, nor a
    GEMM measured on the GPU for one of their dispatches; other measured GEMMs stay in."""
    from dispatchtune.benchmarks.expert_order_lofo import MEASURED, Expert, training_mask

    empty, none = pd.DataFrame(), np.zeros(0, bool)
    data = [Expert(file, "contraction", empty, empty, none, none, identity, key)
            for file, identity, key in [
                ("a.mlir", "mm_a [tile 64]", "mm_a"), ("a.mlir", "mm_a [tile 128]", "mm_a"),
                ("a.mlir", "mm_b [tile 64]", "mm_b"), ("b.mlir", "mm_a [tile 64]", "mm_a"),
                ("mm_a.csv", MEASURED + "mm_a", "mm_a"), ("mm_c.csv", MEASURED + "mm_c", "mm_c")]]
    tested = np.array([True, False, False, False, False, False])
    assert training_mask(data, tested).tolist() == [False, True, True, False, False, True]


def test_lofo_reads_measured_gemms_as_dispatches_whose_fastest_are_positives(
        tmp_path: Path) -> None:
    """`--train-measured`: a measured GEMM becomes one dispatch of the candidates that ran, its
    `top` fastest the positives, named for its problem so held-out folds can leave it out."""
    from dispatchtune.benchmarks.expert_order_lofo import load_measured
    from dispatchtune.benchmarks.measured_order import measured_rows, problem_of

    measured = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "measured"
    name = "square_gemm_2048_2048_2048_f8E4M3FNUZ_f32_tB.csv"
    (tmp_path / "m").mkdir()
    shutil.copy(measured / name, tmp_path / "m")
    (entry,) = load_measured(tmp_path / "m", tmp_path / "cache", False, 3)
    file, kind, table, features, mask, default, identity, key = entry
    rows = measured_rows(measured / name)
    ran = rows[rows["relative"].notna()]
    assert key == problem_of(Path(name)).key
    assert (file, kind, identity) == (name, "contraction", f"measured {key}")
    assert len(table) == len(features) == len(ran) and mask.sum() == 3 and not default.any()
    fastest = ran.nsmallest(3, "relative")
    keys = ["intrinsic", "tile_m", "tile_n", "tile_k", "subgroups_m", "subgroups_n"]
    chosen = table.loc[mask, keys].astype({"intrinsic": str})
    assert (sorted(map(tuple, chosen.to_numpy().tolist()))
            == sorted(map(tuple, fastest[keys].to_numpy().tolist())))


def test_lofo_command_reports_held_out_figures_once_per_repeat_and_saves(tmp_path: Path) -> None:
    """`expert_order_lofo.py SPECS ... --collapse-repeats --per-expert CSV --save FILE` as a
    subprocess on four fixture files and a copy of one: every expert held out, a row counting
    each repeated expert once, the model written with its recipe; a file set that leaves a
    pipeline without experts is one line, not a traceback."""
    specs = tmp_path / "specs"
    specs.mkdir()
    for name in ("sdxl_2024.mlir", "unet_fp16_vectordistribute.mlir",
                 "flux_tileandfuse_2025.mlir", "implicit_gemm_convolution.mlir"):
        (specs / name).write_text((FIXTURES / name).read_text())
    (specs / "sdxl_2024_copy.mlir").write_text((FIXTURES / "sdxl_2024.mlir").read_text())
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "benchmarks/expert_order_lofo.py", str(specs),
               "--cache", str(tmp_path / "cache"), "--no-heuristic-filters",
               "--priors", "prior_interleaved", "--pipeline-rankers", "--collapse-repeats"]
    proc = subprocess.run([*command, "--per-expert", str(tmp_path / "experts.csv"),
                           "--save", str(tmp_path / "prior.json")],
                          cwd=root, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    experts = pd.read_csv(tmp_path / "experts.csv")
    assert experts["prior_interleaved"].between(0, 1).all()
    copies = experts[experts["file"].str.startswith("sdxl_2024")]
    assert len(copies) == 2 * copies["expert"].nunique() >= 2  # the copy repeats each expert
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in proc.stdout.splitlines() if line.startswith("| ")}
    assert int(rows["all"]) == len(experts)
    assert int(rows["all, each repeated expert once"]) == experts["expert"].nunique() < len(experts)
    saved = load_cost_model(tmp_path / "prior.json")
    assert isinstance(saved, PairwiseModel) and set(saved.pipeline_rankers) == set(PIPELINES)
    assert saved.metadata["training_data"]["collapse_repeats"] is True
    assert saved.metadata["training_data"]["seed"] == 0
    (specs / "flux_tileandfuse_2025.mlir").unlink()
    (specs / "implicit_gemm_convolution.mlir").unlink()
    proc = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no expert configuration uses")
    # `--train-also` files are in every fit (and the saved one) but never held out or reported.
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "flux_tileandfuse_2025.mlir").write_text(
        (FIXTURES / "flux_tileandfuse_2025.mlir").read_text())
    # `--seed` draws the prior's pairs and tree rows anew, `--spare-neighbours` leaves an
    # expert's near copies out of its negatives; the saved model records both.
    proc = subprocess.run([*command, "--train-also", str(extra), "--seed", "3",
                           "--spare-neighbours", "1", "--per-expert",
                           str(tmp_path / "experts2.csv"), "--save", str(tmp_path / "prior2.json")],
                          cwd=root, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reported = pd.read_csv(tmp_path / "experts2.csv")
    assert set(reported["file"]) == {"sdxl_2024.mlir", "sdxl_2024_copy.mlir",
                                     "unet_fp16_vectordistribute.mlir"}
    saved = load_cost_model(tmp_path / "prior2.json")
    assert "flux_tileandfuse_2025.mlir" in saved.metadata["training_data"]["spec_files"]
    assert saved.metadata["training_data"]["seed"] == 3 and saved.seed == 3
    assert saved.metadata["training_data"]["spare_neighbours"] == 1
