"""Model files: exact round trips, and refusal of pickles, corrupt files and schema mismatches."""

from __future__ import annotations

import base64
import hashlib
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatchtune.costmodel.learned import LearnedModel, labels_from_times, make_model
from dispatchtune.costmodel.modelfile import FORMAT, load_model, save_model
from dispatchtune.costmodel.train import TrainingData, load_training_data
from dispatchtune.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures"


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
    assert loaded.training_rows == model.training_rows
    shares = loaded.feature_importances()
    assert shares.sum() == pytest.approx(1.0)
    assert shares.index[0] == model.feature_importances().index[0]
    document = json.loads(saved[kind].read_text())
    assert document["format"] == FORMAT and document["model_type"] == kind
    assert set(document["model"]) == ({"forest"} if kind == "rf" else {"lightgbm_text", "sha256"})
    assert saved[kind].stat().st_size < 5_000_000


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


def _edited(path: Path, tmp_path: Path, edit: Any) -> Path:
    document = json.loads(path.read_text())
    edit(document)
    out = tmp_path / f"edited_{path.name}"
    out.write_text(json.dumps(document))
    return out


def test_newer_format_and_other_feature_schema_are_refused(
    tmp_path: Path, saved: dict[str, Path]
) -> None:
    newer = _edited(saved["gbm"], tmp_path, lambda d: d.update(format="dispatchtune.costmodel/9"))
    with pytest.raises(InputError, match="newer"):
        load_model(newer)
    old = _edited(saved["gbm"], tmp_path, lambda d: d.update(feature_schema_version=1))
    with pytest.raises(InputError, match=r"feature schema v1 .*retrain"):
        load_model(old)
    fewer = _edited(saved["rf"], tmp_path, lambda d: d["feature_names"].pop())
    with pytest.raises(InputError, match="retrain"):
        load_model(fewer)


def _set_text(document: dict[str, Any], text: str, rehash: bool = True) -> None:
    document["model"]["lightgbm_text"] = text
    if rehash:
        document["model"]["sha256"] = hashlib.sha256(text.encode()).hexdigest()


def test_corrupt_lightgbm_text_is_refused_before_lightgbm_parses_it(
    tmp_path: Path, saved: dict[str, Path]
) -> None:
    text = json.loads(saved["gbm"].read_text())["model"]["lightgbm_text"]
    # LightGBM itself aborts the process on some of these; the checks must catch them first.
    cases = {
        "checksum": (text[:-40], False),
        "end of trees": (text[: len(text) // 2], True),
        "split_feature": (text.replace("split_feature=", "split_feature=4096 ", 1), True),
        "left_child": (text.replace("left_child=", "left_child=999 ", 1), True),
        "max_feature_idx": (text.replace("max_feature_idx=", "max_feature_idx=7", 1), True),
    }
    for message, (bad, rehash) in cases.items():
        path = _edited(saved["gbm"], tmp_path,
                       lambda d, bad=bad, rehash=rehash: _set_text(d, bad, rehash))
        with pytest.raises(InputError, match=message):
            load_model(path)


def test_corrupt_forest_arrays_are_refused(tmp_path: Path, saved: dict[str, Path]) -> None:
    def backwards(document: dict[str, Any]) -> None:
        entry = document["model"]["forest"]["left"]
        left = np.frombuffer(base64.b64decode(entry["base64"]), dtype="<i4").copy()
        internal = np.flatnonzero(left != np.arange(len(left)))
        left[internal[-1]] = 0  # a child before its parent: a walk could loop forever
        entry["base64"] = base64.b64encode(left.tobytes()).decode()

    with pytest.raises(InputError, match="valid trees"):
        load_model(_edited(saved["rf"], tmp_path, backwards))

    def truncated(document: dict[str, Any]) -> None:
        entry = document["model"]["forest"]["threshold"]
        entry["base64"] = entry["base64"][:-8]

    with pytest.raises(InputError, match="threshold"):
        load_model(_edited(saved["rf"], tmp_path, truncated))
