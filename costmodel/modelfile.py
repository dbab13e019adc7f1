"""Model files: one JSON document per learned model, safe to load from anyone.

Loading never runs code from the file: there is no pickle anywhere. A LightGBM model is stored as
LightGBM's own text format (`Booster.model_to_string()`, parsed by LightGBM's text parser); a
random forest as its node arrays (`ForestArrays`: children, feature, threshold, value), each a
little-endian binary array in base64 inside the JSON, checked to form valid trees before use.

Layout (`FORMAT` = "dispatchtune.costmodel/1")::

    {"format": "dispatchtune.costmodel/1",
     "model_type": "gbm" | "lambdarank" | "rf",
     "feature_schema_version": 2, "feature_names": [...],   # checked on load
     "label": "...", "params": {...}, "seed": 0, "training_rows": N,
     "feature_importances": {name: share, ...},
     "metadata": {...},             # training data summary, cross-validation metrics, versions
     "model": {"lightgbm_text": "..."}  or  {"forest": {"roots": {...}, "left": {...}, ...}}}

A file of another format, a newer format version, a pickle, a corrupt file or a model built for a
different feature schema is refused with a one-line `DispatchTuneError`.
"""

from __future__ import annotations

import base64
import datetime as _dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.costmodel.learned import (
    LABEL,
    MODELS,
    ForestArrays,
    LearnedModel,
    RandomForestModel,
    _LightGBMModel,
)
from dispatchtune.errors import InputError
from dispatchtune.features.extract import check_feature_schema

FORMAT_PREFIX = "dispatchtune.costmodel/"
FORMAT_VERSION = 1
FORMAT = f"{FORMAT_PREFIX}{FORMAT_VERSION}"

_ARRAY_DTYPES = {"roots": "<i4", "left": "<i4", "right": "<i4", "feature": "<i4",
                 "threshold": "<f8", "value": "<f8"}


def _encode(array: np.ndarray, dtype: str) -> dict[str, Any]:
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype))
    return {"dtype": dtype, "length": int(data.size),
            "base64": base64.b64encode(data.tobytes()).decode("ascii")}


def _decode(entry: Any, dtype: str, name: str) -> np.ndarray:
    if not isinstance(entry, dict) or entry.get("dtype") != dtype:
        raise InputError(f"forest array {name!r} is missing or not {dtype}")
    try:
        raw = base64.b64decode(str(entry["base64"]), validate=True)
        array = np.frombuffer(raw, dtype=np.dtype(dtype))
    except (KeyError, ValueError) as exc:
        raise InputError(f"forest array {name!r} is corrupt ({exc})") from exc
    if array.size != entry.get("length"):
        raise InputError(f"forest array {name!r} has {array.size} entries, header says "
                         f"{entry.get('length')}")
    return array.astype(np.dtype(dtype).newbyteorder("="))


def model_document(model: LearnedModel, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON document of a trained model (what `save_model` writes)."""
    from dispatchtune import __version__
    from dispatchtune.features.extract import FEATURE_SCHEMA_VERSION

    if not model.fitted:
        raise InputError(f"cannot save an untrained {model.kind} model")
    payload: dict[str, Any]
    versions: dict[str, str] = {"dispatchtune": __version__}
    if isinstance(model, RandomForestModel):
        import sklearn

        assert model.forest is not None
        forest = model.forest
        payload = {"forest": {
            **{name: _encode(getattr(forest, name), kind) for name, kind in _ARRAY_DTYPES.items()},
            "depth": forest.depth,
        }}
        versions["scikit-learn"] = sklearn.__version__
    elif isinstance(model, _LightGBMModel):
        import lightgbm

        text = model.booster.model_to_string()
        payload = {"lightgbm_text": text, "sha256": _sha256(text)}
        versions["lightgbm"] = lightgbm.__version__
    else:
        raise InputError(f"no file format for {type(model).__name__}")
    importances = model.feature_importances()
    return {
        "format": FORMAT,
        "model_type": model.kind,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "feature_names": list(model.feature_names),
        "label": LABEL,
        "params": model.params,
        "seed": model.seed,
        "training_rows": model.training_rows,
        "feature_importances": {k: round(float(v), 6) for k, v in importances.items()},
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": versions,
        "metadata": {**model.metadata, **(metadata or {})},
        "model": payload,
    }


def save_model(
    model: LearnedModel, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> Path:
    """Write the model (and `metadata`, merged over `model.metadata`) as one JSON file."""
    path = Path(path)
    document = model_document(model, metadata)
    text = json.dumps(document, sort_keys=False, default=_json_default)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # never leave a half-written model file behind
    return path


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a model file")


def load_model(path: str | os.PathLike[str]) -> LearnedModel:
    """Read a model file written by `save_model`; refuses anything else with a one-line error."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if raw[:1] == b"\x80" or raw[:2] in (b"PK", b"\x1f\x8b"):
        raise InputError(
            f"{path} is a pickle/joblib/archive, not a dispatchtune model file; pickled models are "
            "refused because loading them runs code"
        )
    try:
        document = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path} is not a dispatchtune model file (not JSON: {exc})") from exc
    return model_from_document(document, str(path))


def model_from_document(document: Any, where: str = "model") -> LearnedModel:
    """Rebuild a model from its JSON document (see the module doc), validating every part."""
    if not isinstance(document, dict):
        raise InputError(f"{where} is not a dispatchtune model file (top level is not an object)")
    fmt = document.get("format")
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX):
        raise InputError(
            f"{where} is not a dispatchtune model file (format {fmt!r}, expected {FORMAT!r})"
        )
    version = fmt[len(FORMAT_PREFIX):]
    if not version.isdigit() or int(version) > FORMAT_VERSION:
        raise InputError(f"{where} has model format {fmt!r}, newer than this dispatchtune reads "
                         f"({FORMAT!r}); upgrade dispatchtune")
    kind = document.get("model_type")
    if kind not in MODELS:
        raise InputError(f"{where}: unknown model type {kind!r} (known: {', '.join(MODELS)})")
    names = document.get("feature_names")
    schema = document.get("feature_schema_version")
    if not isinstance(names, list) or not isinstance(schema, int):
        raise InputError(f"{where}: model file lacks its feature schema")
    check_feature_schema(schema, names, where=where)
    params = document.get("params")
    payload = document.get("model")
    if not isinstance(params, dict) or not isinstance(payload, dict):
        raise InputError(f"{where}: model file lacks 'params' or 'model'")
    try:
        model = MODELS[kind](feature_names=names, seed=int(document.get("seed", 0)), **params)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{where}: bad model parameters ({exc})") from exc
    if isinstance(model, RandomForestModel):
        model.forest = _load_forest(payload.get("forest"), len(names), where)
        shares = document.get("feature_importances") or {}
        model.importances_ = np.array([float(shares.get(n, 0.0)) for n in names])
    else:
        assert isinstance(model, _LightGBMModel)
        model.booster = _load_booster(payload.get("lightgbm_text"), payload.get("sha256"),
                                      len(names), where)
    model.training_rows = int(document.get("training_rows", 0))
    metadata = document.get("metadata")
    model.metadata = dict(metadata) if isinstance(metadata, dict) else {}
    return model


def _load_forest(entry: Any, n_features: int, where: str) -> ForestArrays:
    if not isinstance(entry, dict):
        raise InputError(f"{where}: random forest model without its 'forest' arrays")
    try:
        arrays = {name: _decode(entry.get(name), dtype, name) for name, dtype in
                  _ARRAY_DTYPES.items()}
        forest = ForestArrays(**arrays, depth=int(entry.get("depth", -1)))
        forest.validate(n_features)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from exc
    return forest


def _load_booster(text: Any, digest: Any, n_features: int, where: str) -> Any:
    import lightgbm

    if not isinstance(text, str) or not text.startswith("tree\n"):
        raise InputError(f"{where}: LightGBM model text is missing or not LightGBM's text format")
    if digest != _sha256(text):
        raise InputError(f"{where}: LightGBM model text does not match its checksum (corrupt file)")
    try:
        text = check_lightgbm_text(text, n_features)
    except InputError as exc:
        raise InputError(f"{where}: {exc}") from exc
    try:
        booster = lightgbm.Booster(model_str=text)
    except lightgbm.basic.LightGBMError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "parse error"
        raise InputError(f"{where}: corrupt LightGBM model text ({first})") from exc
    if booster.num_feature() != n_features:
        raise InputError(f"{where}: LightGBM model has {booster.num_feature()} features, the file "
                         f"declares {n_features}")
    return booster


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


_TREE_INT = ("num_leaves", "num_cat", "is_linear")
_TREE_ARRAYS = ("split_feature", "threshold", "decision_type", "left_child", "right_child",
                "leaf_value")


def check_lightgbm_text(text: str, n_features: int) -> str:
    """Check LightGBM model text before LightGBM parses it; returns the text to parse.

    LightGBM's parser aborts the whole process (not an exception) on some malformed input, and it
    trusts the indices in the file. So every tree is checked here: array lengths match
    `num_leaves`, split features are in range, children point inside the tree, no categorical or
    linear trees (dispatchtune trains neither), finite values. The `tree_sizes` header line (byte
    offsets LightGBM uses to parse trees in parallel) is dropped, so LightGBM parses sequentially
    and a wrong offset cannot send it out of bounds.
    """
    head, sep, rest = text.partition("\n\nTree=")
    if not sep or "\nend of trees" not in rest:
        raise InputError("LightGBM model text has no trees or no 'end of trees' marker")
    header = dict(line.split("=", 1) for line in head.splitlines()[1:] if "=" in line)
    if header.get("max_feature_idx") != str(n_features - 1):
        raise InputError(f"LightGBM model text has max_feature_idx {header.get('max_feature_idx')}"
                         f", expected {n_features - 1}")
    if header.get("num_class") != "1" or header.get("num_tree_per_iteration") != "1":
        raise InputError("LightGBM model text is not a single-output model")
    trees = ("Tree=" + rest.split("\nend of trees", 1)[0]).split("\n\n")
    count = 0
    for block in trees:
        if not block.strip():
            continue
        fields = dict(line.split("=", 1) for line in block.strip().splitlines() if "=" in line)
        try:
            _check_tree(fields, n_features)
        except (KeyError, ValueError) as exc:
            tree = fields.get("Tree", "?")
            raise InputError(f"LightGBM tree {tree} is malformed ({exc})") from exc
        count += 1
    if count == 0:
        raise InputError("LightGBM model text has no trees")
    lines = [line for line in head.splitlines() if not line.startswith("tree_sizes=")]
    return "\n".join(lines) + sep + rest


def _check_tree(fields: dict[str, str], n_features: int) -> None:
    ints = {name: int(fields[name]) for name in _TREE_INT}
    leaves = ints["num_leaves"]
    if leaves < 1 or ints["num_cat"] != 0 or ints["is_linear"] != 0:
        raise ValueError("num_leaves < 1, or categorical/linear tree")
    if leaves == 1:
        values = np.array(fields["leaf_value"].split(), dtype=np.float64)
        if values.size != 1 or not np.isfinite(values).all():
            raise ValueError("bad leaf_value")
        return
    arrays = {name: np.array(fields[name].split(), dtype=np.float64) for name in _TREE_ARRAYS}
    for name, values in arrays.items():
        want = leaves if name == "leaf_value" else leaves - 1
        if values.size != want or not np.isfinite(values).all():
            raise ValueError(f"{name} has {values.size} entries, expected {want}, or is not finite")
    feature = arrays["split_feature"]
    if ((feature < 0) | (feature >= n_features) | (feature != np.round(feature))).any():
        raise ValueError("split_feature out of range")
    if (arrays["decision_type"].astype(np.int64) & 1).any():
        raise ValueError("categorical split")
    for side in ("left_child", "right_child"):
        child = arrays[side]
        # Internal children are 0..leaves-2; leaves are stored as ~leaf = -1..-leaves.
        if ((child >= leaves - 1) | (child < -leaves) | (child != np.round(child))).any():
            raise ValueError(f"{side} out of range")


def describe_model(model: LearnedModel) -> str:
    """One line about a model: type, label, training data, held-out figure if recorded."""
    meta = model.metadata
    data = meta.get("training_data", {})
    cv = meta.get("cross_validation", {})
    parts = [f"{model.kind} model", f"{model.training_rows} training rows"]
    if data:
        parts.append(f"{data.get('problems', '?')} problems")
    if cv.get("model_median") is not None:
        parts.append(f"held-out median {cv['model_median']:.1f} benchmarks to 5% "
                     f"(random {cv.get('random_median', float('nan')):.1f})")
    return ", ".join(parts)
