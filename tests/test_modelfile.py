"""Model files: exact round trips, numpy trees equal to LightGBM, refusal of anything else."""

from __future__ import annotations

import base64
import json
import logging
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatchtune.costmodel.learned import (
    LearnedModel,
    _LightGBMModel,
    labels_from_times,
    make_model,
)
from dispatchtune.costmodel.modelfile import FORMAT, MAX_MODEL_BYTES, load_model, save_model
from dispatchtune.costmodel.train import TrainingData, load_training_data
from dispatchtune.costmodel.trees import TreeArrays
from dispatchtune.errors import InputError
from dispatchtune.features.extract import FEATURE_SCHEMA_VERSION

FIXTURES = Path(__file__).parent / "fixtures"
HOST_MODEL = Path(__file__).parent.parent / "costmodel" / "models" / "host.json"


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return load_training_data([FIXTURES / "kt_gemm_2080ti_slice.json.gz",
                               FIXTURES / "cpu_results_matmul_256x384x256.jsonl"])


def _fitted(kind: str, data: TrainingData) -> LearnedModel:
    params: dict[str, Any] = {"n_estimators": 10} if kind == "rf" else {"num_boost_round": 30}
    return make_model(kind, **params).fit(data.features, labels_from_times(data.times),
                                          data.groups)


@pytest.fixture(scope="module")
def saved(data: TrainingData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("models")
    return {kind: save_model(_fitted(kind, data), out / f"{kind}.json", {"note": "test"})
            for kind in ("rf", "gbm", "lambdarank")}


@pytest.mark.parametrize("kind", ["rf", "gbm", "lambdarank"])
def test_round_trip_is_exact_and_keeps_metadata(
    kind: str, data: TrainingData, saved: dict[str, Path]
) -> None:
    model = _fitted(kind, data)  # same seed and data: the same model as the saved one
    loaded = load_model(saved[kind])
    assert loaded.kind == kind
    np.testing.assert_array_equal(loaded.predict(data.features), model.predict(data.features))
    assert loaded.metadata["note"] == "test"
    assert loaded.metadata["target_kinds"] == ["cpu", "gpu"]  # a GPU cache and a CPU log
    assert loaded.training_rows == model.training_rows
    shares = loaded.feature_importances()
    assert shares.sum() == pytest.approx(1.0)
    assert shares.index[0] == model.feature_importances().index[0]
    document = json.loads(saved[kind].read_text())
    assert document["format"] == FORMAT and document["model_type"] == kind
    assert set(document["model"]) == {"trees"}
    assert document["model"]["trees"]["aggregate"] == ("mean" if kind == "rf" else "sum")
    assert saved[kind].stat().st_size < 5_000_000


@pytest.mark.parametrize("kind", ["gbm", "lambdarank"])
def test_numpy_trees_match_lightgbm_on_real_and_random_rows(kind: str, data: TrainingData,
                                                             saved: dict[str, Path]) -> None:
    model = _fitted(kind, data)
    assert isinstance(model, _LightGBMModel)
    loaded = load_model(saved[kind])
    x = model.matrix(data.features)
    np.testing.assert_allclose(loaded.predict(x), model.booster.predict(x), rtol=0, atol=1e-9)
    # Random rows around (and far outside) the training range take other paths.
    rng = np.random.default_rng(1)
    wide = x[rng.integers(0, len(x), 3000)] * rng.lognormal(0, 1, (3000, x.shape[1]))
    wide[rng.random(wide.shape) < 0.1] = 0.0
    np.testing.assert_allclose(loaded.predict(wide), model.booster.predict(wide), atol=1e-9)


def test_missing_value_rules_match_lightgbm() -> None:
    # Our feature tables never hold NaN, but the predictor follows LightGBM's missing-value rules
    # for the split types it may meet: NaN as missing, zero as missing, and no missing type.
    import lightgbm

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4))
    x[rng.random(x.shape) < 0.15] = np.nan
    x[rng.random(x.shape) < 0.15] = 0.0
    y = np.nan_to_num(x[:, 0]) + 2 * (x[:, 1] == 0) - np.isnan(x[:, 2])
    probe = rng.normal(size=(2000, 4))
    probe[rng.random(probe.shape) < 0.2] = np.nan
    probe[rng.random(probe.shape) < 0.2] = 0.0
    probe[rng.random(probe.shape) < 0.05] = 1e-36  # zero within LightGBM's kZeroThreshold
    for zero_as_missing in (False, True):
        for use_missing in (False, True):
            params = {"objective": "regression", "verbosity": -1, "num_leaves": 8,
                      "min_data_in_leaf": 5, "zero_as_missing": zero_as_missing,
                      "use_missing": use_missing, "deterministic": True, "num_threads": 1}
            booster = lightgbm.train(params, lightgbm.Dataset(x, y), num_boost_round=20)
            trees = TreeArrays.from_lightgbm(booster.dump_model(), 4)
            np.testing.assert_allclose(trees.predict(probe), booster.predict(probe), atol=1e-9)


def test_lightgbm_models_the_trees_cannot_hold_are_refused() -> None:
    import lightgbm

    rng = np.random.default_rng(0)
    x = rng.integers(0, 5, size=(300, 2)).astype(float)
    dataset = lightgbm.Dataset(x, x[:, 0] * 2.0, categorical_feature=[0])
    params = {"objective": "regression", "verbosity": -1, "min_data_in_leaf": 5,
              "min_data_per_group": 5, "cat_smooth": 1}
    booster = lightgbm.train(params, dataset, num_boost_round=3)
    with pytest.raises(InputError, match="categorical"):
        TreeArrays.from_lightgbm(booster.dump_model(), 2)
    binary = lightgbm.train({"objective": "binary", "verbosity": -1},
                            lightgbm.Dataset(x, (x[:, 0] > 2).astype(float)), num_boost_round=2)
    with pytest.raises(InputError, match="transforms its output"):
        TreeArrays.from_lightgbm(binary.dump_model(), 2)


def test_loading_never_touches_lightgbm(saved: dict[str, Path]) -> None:
    code = ("import sys; from dispatchtune.costmodel.modelfile import load_model; "
            f"m = load_model({str(saved['gbm'])!r}); "
            "print(m.kind, 'lightgbm' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.split() == ["gbm", "False"]


def test_installed_host_model_is_format_2_and_cpu_only() -> None:
    """The host model is trained on both shipped CPU datasets (AVX-512 and AVX2)."""
    document = json.loads(HOST_MODEL.read_text())
    assert document["format"] == FORMAT and document["model_type"] == "gbm"
    assert document["metadata"]["command"] == ("train-costmodel shipped:cpu_host shipped:cpu_avx2 "
                                               "--model gbm -o costmodel/models/host.json")
    model = load_model(HOST_MODEL)
    assert model.metadata["target_kinds"] == ["cpu"] and model.trees is not None
    assert model.trees.n_trees == model.params["num_boost_round"] == 100


def test_pickles_and_foreign_files_are_refused(tmp_path: Path, saved: dict[str, Path]) -> None:
    pickled = tmp_path / "model.pkl"
    pickled.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(InputError, match="pickle"):
        load_model(pickled)
    text = tmp_path / "notes.json"
    text.write_text("hello")
    with pytest.raises(InputError, match="not JSON"):
        load_model(text)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "sklearn/1"}))
    with pytest.raises(InputError, match="not a dispatchtune model file"):
        load_model(other)
    with pytest.raises(InputError, match="cannot read"):
        load_model(tmp_path / "missing.json")
    with pytest.raises(InputError, match="not a regular file"):
        load_model(tmp_path)


def test_oversized_files_are_refused_before_reading(tmp_path: Path) -> None:
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as handle:
        handle.truncate(2 * 1024**3)  # sparse: 2 GB on paper, nothing on disk
    with pytest.raises(InputError, match=f"at most {MAX_MODEL_BYTES // 2**20} MiB"):
        load_model(huge)


def _edited(path: Path, tmp_path: Path, edit: Any) -> Path:
    document = json.loads(path.read_text())
    edit(document)
    out = tmp_path / f"edited_{path.name}"
    out.write_text(json.dumps(document))
    return out


def test_old_and_newer_formats_and_other_feature_schemas_are_refused(
    tmp_path: Path, saved: dict[str, Path]
) -> None:
    newer = _edited(saved["gbm"], tmp_path, lambda d: d.update(format="dispatchtune.costmodel/9"))
    with pytest.raises(InputError, match=r"format 9, newer .*format 2"):
        load_model(newer)
    old = _edited(saved["gbm"], tmp_path, lambda d: d.update(
        format="dispatchtune.costmodel/1", model={"lightgbm_text": "tree\n", "sha256": ""}))
    with pytest.raises(InputError, match=r"format 1 is no longer read.*retrain with train-costmodel"):
        load_model(old)
    old_schema = _edited(saved["gbm"], tmp_path, lambda d: d.update(feature_schema_version=1))
    with pytest.raises(InputError, match=rf"feature schema v1 .*v{FEATURE_SCHEMA_VERSION}.*retrain"):
        load_model(old_schema)
    fewer = _edited(saved["rf"], tmp_path, lambda d: d["feature_names"].pop())
    with pytest.raises(InputError, match="retrain") as caught:
        load_model(fewer)
    current = f"v{FEATURE_SCHEMA_VERSION}"
    assert current in str(caught.value) and str(caught.value).count(current) == 1


def test_json_beyond_the_limits_is_refused(tmp_path: Path, saved: dict[str, Path]) -> None:
    text = saved["gbm"].read_text()
    cases = {
        "NaN is not allowed": text.replace('"training_rows": ', '"training_rows": NaN, "x": ', 1),
        "Infinity is not allowed": text.replace('"seed": 0', '"seed": -Infinity', 1),
        "integer of 5000 digits": text.replace('"seed": 0', '"seed": ' + "9" * 5000, 1),
        "overflows": text.replace('"seed": 0', '"seed": 1e999', 1),
        "nested deeper": text.replace('"metadata": {', '"metadata": {"x": ' + "[" * 40
                                      + "]" * 40 + ", ", 1),
        "nested deeper than": text.replace('"metadata": {', '"metadata": {"x": ' + "[" * 100_000
                                           + "]" * 100_000 + ", ", 1),
        "JSON items": text.replace('"metadata": {', '"metadata": {"x": [' + "{}," * 2_000_000
                                   + "{}], ", 1),
    }
    for message, bad in cases.items():
        path = tmp_path / "bad.json"
        path.write_text(bad)
        with pytest.raises(InputError, match=message):
            load_model(path)


def _set_array(document: dict[str, Any], name: str, edit: Any) -> None:
    entry = document["model"]["trees"][name]
    values = np.frombuffer(base64.b64decode(entry["base64"]), dtype=entry["dtype"]).copy()
    edit(values)
    entry["base64"] = base64.b64encode(values.tobytes()).decode()


def test_corrupt_tree_arrays_are_refused(tmp_path: Path, saved: dict[str, Path]) -> None:
    def internal(values: np.ndarray) -> int:
        return int(np.flatnonzero(values != np.arange(len(values)))[-1])

    def backwards(values: np.ndarray) -> None:
        values[internal(values)] = 0  # a child before its parent: a walk could loop forever

    def shared(values: np.ndarray) -> None:
        values[0] = values[internal(values)]  # the root adopts another node's right child

    cases: dict[str, tuple[str, Any]] = {
        "child out of range or before its parent": ("right", backwards),
        "two parents or none": ("right", shared),
        "index outside": ("feature", lambda v: v.__setitem__(3, 4096)),
        "'threshold' has a NaN": ("threshold",
                                                       lambda v: v.__setitem__(0, np.nan)),
        "'value' has a value that is not finite": ("value", lambda v: v.__setitem__(-1, np.inf)),
        "'roots' has a node index out of range": ("roots", lambda v: v.__setitem__(0, -5)),
        "unknown missing type": ("missing_type", lambda v: v.__setitem__(0, 7)),
    }
    for message, (name, edit) in cases.items():
        kind = "rf" if name == "right" else "gbm"
        path = _edited(saved[kind], tmp_path,
                       lambda d, name=name, edit=edit: _set_array(d, name, edit))
        with pytest.raises(InputError, match=f"{path}: field 'model.trees': .*{message}"):
            load_model(path)

    def truncated(document: dict[str, Any]) -> None:
        entry = document["model"]["trees"]["threshold"]
        entry["base64"] = entry["base64"][:-8]

    with pytest.raises(InputError, match=r"model\.trees\.threshold\.base64"):
        load_model(_edited(saved["rf"], tmp_path, truncated))


def test_wrongly_typed_fields_name_the_field(tmp_path: Path, saved: dict[str, Path]) -> None:
    cases: dict[str, Any] = {
        "'seed' is 'seven'": lambda d: d.update(seed="seven"),
        "'seed' is 1e+30": lambda d: d.update(seed=1e30),
        "'training_rows' is -1": lambda d: d.update(training_rows=-1),
        "'params.alpha' is": lambda d: d["params"].update(alpha=[0.9]),
        "'params' has 'n_jobs'": lambda d: d["params"].update(n_jobs="x"),
        "'feature_importances.tile_m' is": lambda d: d["feature_importances"].update(tile_m={}),
        "'metadata.target_kinds'": lambda d: d["metadata"].update(target_kinds=["tpu"]),
        "'model.trees.roots' is missing": lambda d: d["model"]["trees"].pop("roots"),
        "'model.trees.aggregate' is": lambda d: d["model"]["trees"].update(aggregate=1),
        "'model.trees.right.length' is": lambda d: d["model"]["trees"]["right"].update(
            length=True),
        "'model' is missing": lambda d: d.pop("model"),
        "'model_type' is 'svm'": lambda d: d.update(model_type="svm"),
    }
    for message, edit in cases.items():
        path = _edited(saved["gbm"], tmp_path, edit)
        with pytest.raises(InputError, match=re.escape(f"{path}: field {message}")):
            load_model(path)


def test_a_model_of_the_other_target_kind_is_used_with_a_warning(
    tmp_path: Path, saved: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    from dispatchtune.costmodel.defaults import model_for_target

    gpu = _edited(saved["gbm"], tmp_path, lambda d: d["metadata"].update(target_kinds=["gpu"]))
    with caplog.at_level(logging.WARNING, logger="dispatchtune"):
        model_for_target("host", gpu)
        assert "trained on GPU targets only" in caplog.text and "CPU target host" in caplog.text
        caplog.clear()
        model_for_target("gfx942", HOST_MODEL)
        assert "trained on CPU targets only" in caplog.text
        caplog.clear()
        model_for_target("host", saved["gbm"])  # trained on both kinds
        model_for_target("llvm-cpu:znver4")  # the installed host model
        assert caplog.text == ""


def test_cli_reports_a_corrupt_model_file_in_one_line(tmp_path: Path,
                                                      saved: dict[str, Path]) -> None:
    bad = _edited(saved["gbm"], tmp_path, lambda d: _set_array(
        d, "right", lambda v: v.__setitem__(0, 10**6)))
    code = ("from dispatchtune.costmodel.modelfile import load_model\n"
            "from dispatchtune.errors import DispatchTuneError\n"
            f"try:\n    load_model({str(bad)!r})\n"
            "except DispatchTuneError as exc:\n    print(exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.count("\n") == 1 and "field 'model.trees'" in result.stdout
    assert result.stderr == ""
    example = Path(__file__).parent.parent / "examples" / "matmul_f32_512.mlir"
    result = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "rank", str(example), "--cost-model", str(bad)],
        capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and str(bad) in result.stderr


def _chain(depth: int) -> dict[str, np.ndarray]:
    """One tree: a chain of `depth` splits, each with a leaf on the right (preorder layout)."""
    n = 2 * depth + 1
    # Internal nodes 0..depth-1 chain through their left child i + 1; node depth is the deepest
    # (left) leaf, and internal node i's right child is the leaf depth + 1 + i.
    right = np.concatenate([np.arange(depth) + depth + 1, np.arange(depth, n)])
    zeros = np.zeros(n, dtype=np.uint8)
    return {"roots": np.array([0]), "right": right, "feature": np.zeros(n, dtype=np.int64),
            "threshold": np.zeros(n), "value": np.arange(n, dtype=np.float64),
            "default_left": zeros, "missing_type": zeros}


def test_tree_arrays_bound_depth_memory_and_leaf_fields() -> None:
    trees = TreeArrays.checked(_chain(50), 1, average=False, float32_features=False)
    assert trees.depth == 50
    # x <= 0 goes left down the chain to the deepest leaf; x > 0 leaves at the first right.
    np.testing.assert_array_equal(trees.predict(np.array([[-1.0], [1.0]])), [50.0, 51.0])
    with pytest.raises(InputError, match="deeper than 4096"):
        TreeArrays.checked(_chain(5000), 1, average=False, float32_features=False)
    # A crafted leaf claiming a NaN-missing split with default left must not step off the leaf.
    many = 300_000  # one-leaf trees: prediction works through rows in small chunks
    leaf: dict[str, np.ndarray] = {
        "roots": np.arange(many), "right": np.arange(many), "feature": np.zeros(many),
        "threshold": np.zeros(many), "value": np.ones(many),
        "default_left": np.ones(many, dtype=np.uint8),
        "missing_type": np.full(many, 2, dtype=np.uint8)}
    forest = TreeArrays.checked(leaf, 1, average=True, float32_features=False)
    np.testing.assert_array_equal(forest.predict(np.array([[np.nan]] * 40)), np.ones(40))
