"""Model files: one JSON document per learned model, safe to load from anyone.

Loading never runs code from the file and never hands file content to a C parser: there is no
pickle, and the trees of every model (random forest, LightGBM regressor, LambdaRank) are stored as
plain node arrays (`TreeArrays`: roots, right child, feature, threshold, value, missing-value
handling), each a little-endian binary array in base64 inside the JSON, predicted with numpy.

Layout (`FORMAT` = "dispatchtune.costmodel/2")::

    {"format": "dispatchtune.costmodel/2",
     "model_type": "gbm" | "lambdarank" | "rf",
     "feature_schema_version": 2, "feature_names": [...],   # checked on load
     "label": "...", "params": {...}, "seed": 0, "training_rows": N,
     "feature_importances": {name: share, ...},
     "created": "...", "versions": {...},
     "metadata": {"target_kinds": ["cpu"], ...},   # training data, cross-validation, command
     "model": {"trees": {"aggregate": "sum" | "mean", "float32_features": false,
                         "roots": {"dtype": "<i4", "length": n, "base64": "..."}, "right": ...,
                         "feature": ..., "threshold": ..., "value": ...,
                         "default_left": ..., "missing_type": ...}}}

The "pairwise" kind (`costmodel/pairwise.py`, a linear GPU prior) stores, instead of trees,
`"model": {"linear": {"basis": [...], "weights": {array}}}` (a float64 array as above);
`basis` must name the basis this dispatchtune computes. A model with `params.pipeline_rankers`
also stores `"weights_<pipeline>"` for each (on the plain basis, without kind or pipeline terms),
and one with `params.tree_weight` each ranker's LambdaRank trees as `"model": {"trees_<pipeline>":
{"basis": [...], <trees as above>}}` (`basis` names the columns the trees read, `tree_basis`).
`params.diversity` (`{"threads": 0.05, ...}`, names of `pairwise.DIVERSITY_FAMILIES`) is a
prediction setting: how much each ranker's order spreads over candidate families; so is
`params.default_closeness` (`{"convolution": 0.1}`, op kinds): how much a row that shares knobs
with IREE's own configuration of the op moves up (`pairwise.towards_default`).

Reading is bounded before any parsing: a file larger than `MAX_MODEL_BYTES` (64 MiB) is refused
from `os.stat`, JSON may not nest deeper than `MAX_JSON_DEPTH`, hold more than `MAX_JSON_ITEMS`
containers and items, integers beyond 10^18, or NaN/Infinity. Every field is then type- and
range-checked and the trees validated (`TreeArrays.checked`). Anything wrong -- another format,
format 1 (LightGBM text, no longer read), a newer format, a pickle, a corrupt or crafted file, a
model built for a different feature schema -- is one `InputError` line naming the file and the field.
"""

from __future__ import annotations

import base64
import datetime as _dt
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, get_args

import numpy as np

from dispatchtune.costmodel.learned import LABEL, MODELS, LearnedModel
from dispatchtune.costmodel.pairwise import (
    DIVERSITY_FAMILIES,
    PIPELINES,
    PairwiseModel,
    basis_names,
    checked_default_closeness,
    checked_diversity,
    tree_basis_names,
)
from dispatchtune.costmodel.trees import TreeArrays
from dispatchtune.errors import InputError
from dispatchtune.features.extract import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    check_feature_schema,
)
from dispatchtune.problem import OpKind
from dispatchtune.version import __version__

FORMAT_PREFIX = "dispatchtune.costmodel/"
FORMAT_VERSION = 2
FORMAT = f"{FORMAT_PREFIX}{FORMAT_VERSION}"

#: Largest model file read. Trained files are about 0.3-1 MB (100k training rows).
MAX_MODEL_BYTES = 64 * 1024 * 1024
#: Deepest JSON nesting accepted (model files nest 5 levels; metadata a few more).
MAX_JSON_DEPTH = 32
#: Most JSON containers and items (counted as '[', '{' and ',' bytes) accepted: bounds the memory
#: a file of millions of tiny objects would take once parsed.
MAX_JSON_ITEMS = 2_000_000
#: Integers in a model file are counts, seeds and indices: at most 18 digits.
MAX_INT_DIGITS = 18
#: Every ensemble of the format: name -> little-endian dtype.
_ARRAY_DTYPES = {"roots": "<i4", "right": "<i4", "feature": "<i4", "threshold": "<f8",
                 "value": "<f8", "default_left": "|u1", "missing_type": "|u1"}
_TARGET_KINDS = ("cpu", "gpu")


# ---- writing -----------------------------------------------------------------------------------
def model_document(
    model: LearnedModel | PairwiseModel, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The JSON document of a trained model (what `save_model` writes)."""
    if isinstance(model, PairwiseModel):
        return _pairwise_document(model, metadata)
    if not model.fitted:
        raise InputError(f"cannot save an untrained {model.kind} model")
    assert model.trees is not None
    trees = model.trees
    versions: dict[str, str] = {"dispatchtune": __version__}
    if model.kind == "rf":
        import sklearn

        versions["scikit-learn"] = sklearn.__version__
    else:
        import lightgbm

        versions["lightgbm"] = lightgbm.__version__
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
        "feature_importances": {k: float(v) for k, v in importances.items()},
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": versions,
        "metadata": {**model.metadata, **(metadata or {})},
        "model": {"trees": _trees_document(trees)},
    }


def _pairwise_document(model: PairwiseModel, metadata: dict[str, Any] | None) -> dict[str, Any]:
    import sklearn

    arrays = model.arrays()
    return {
        "format": FORMAT,
        "model_type": model.kind,
        "feature_schema_version": FEATURE_SCHEMA_VERSION,
        "feature_names": list(FEATURE_NAMES),
        "label": "pairwise: expert configuration above the other candidates of its dispatch",
        "params": model.params,
        "seed": model.seed,
        "training_rows": model.training_rows,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "versions": {"dispatchtune": __version__, "scikit-learn": sklearn.__version__},
        "metadata": {**model.metadata, **(metadata or {})},
        "model": {"linear": {"basis": basis_names(model.kind_terms, model.pipeline_terms),
                             **{k: _encode(v, "<f8") for k, v in arrays.items()}},
                  **{f"trees_{name}": {"basis": tree_basis_names(), **_trees_document(trees)}
                     for name, trees in model.trees.items()}},
    }


def _trees_document(trees: TreeArrays) -> dict[str, Any]:
    return {"aggregate": "mean" if trees.average else "sum",
            "float32_features": trees.float32_features,
            **{name: _encode(getattr(trees, name), dtype) for name, dtype in _ARRAY_DTYPES.items()}}


def save_model(
    model: LearnedModel | PairwiseModel, path: str | os.PathLike[str], metadata: dict[str, Any] | None = None
) -> Path:
    """Write the model (and `metadata`, merged over `model.metadata`) as one JSON file."""
    path = Path(path)
    document = model_document(model, metadata)
    text = json.dumps(document, sort_keys=False, default=_json_default, allow_nan=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)  # never leave a half-written model file behind
    return path


def _encode(array: np.ndarray, dtype: str) -> dict[str, Any]:
    data = np.ascontiguousarray(array, dtype=np.dtype(dtype))
    return {"dtype": dtype, "length": int(data.size),
            "base64": base64.b64encode(data.tobytes()).decode("ascii")}


def _json_default(value: object) -> object:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"cannot store {type(value).__name__} in a model file")


# ---- reading -----------------------------------------------------------------------------------
def load_model(path: str | os.PathLike[str]) -> LearnedModel:
    """Read a learned (tree) model file written by `save_model`; refuses anything else with a
    one-line error."""
    return model_from_document(read_document(path), str(path))


def load_cost_model(path: str | os.PathLike[str]) -> LearnedModel | PairwiseModel:
    """Read any model file `save_model` writes: a learned tree model or a pairwise GPU prior."""
    document = read_document(path)
    if isinstance(document, dict) and document.get("model_type") == PairwiseModel.kind:
        fields = _Fields(document, str(path))
        _check_format(document.get("format"), document, str(path))
        return _pairwise_from_document(fields)
    return model_from_document(document, str(path))


def read_document(path: str | os.PathLike[str]) -> Any:
    """The parsed JSON of a model file, within the size, nesting and number limits (module doc)."""
    path = Path(path)
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"model file {path} is not a regular file")
        if info.st_size > MAX_MODEL_BYTES:
            raise InputError(_too_big(path, info.st_size))
        with open(path, "rb") as handle:
            raw = handle.read(MAX_MODEL_BYTES + 1)  # the file may have grown since the stat
    except OSError as exc:
        raise InputError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
    if len(raw) > MAX_MODEL_BYTES:
        raise InputError(_too_big(path, len(raw)))
    if raw[:1] == b"\x80" or raw[:2] in (b"PK", b"\x1f\x8b"):
        raise InputError(
            f"{path} is a pickle/joblib/archive, not a dispatchtune model file; pickled models are "
            "refused because loading them runs code"
        )
    counts = np.bincount(np.frombuffer(raw, dtype=np.uint8), minlength=256)
    if int(counts[ord("[")] + counts[ord("{")] + counts[ord(",")]) > MAX_JSON_ITEMS:
        raise InputError(f"{path} has more than {MAX_JSON_ITEMS:,} JSON items; not a model file")
    try:
        document = json.loads(raw.decode("utf-8"), parse_constant=_no_constant,
                              parse_int=_bounded_int, parse_float=_finite_float)
    except _Refused as exc:
        raise InputError(f"{path} is not a dispatchtune model file ({exc})") from exc
    except RecursionError as exc:
        raise InputError(f"{path} is not a dispatchtune model file (JSON nested deeper than "
                         f"{MAX_JSON_DEPTH} levels)") from exc
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        raise InputError(f"{path} is not a dispatchtune model file (not JSON: {exc})") from exc
    if _nesting(document) > MAX_JSON_DEPTH:
        raise InputError(f"{path} is not a dispatchtune model file (JSON nested deeper than "
                         f"{MAX_JSON_DEPTH} levels)")
    return document


class _Refused(ValueError):
    """A JSON value outside the model file limits (raised from the parser's hooks)."""


def _too_big(path: Path, size: int) -> str:
    return (f"model file {path} is {size / 2**20:.1f} MiB; model files are at most "
            f"{MAX_MODEL_BYTES // 2**20} MiB (a trained model is about 1 MiB)")


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not allowed in a model file")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refused(f"integer of {len(text.lstrip('-'))} digits, at most {MAX_INT_DIGITS}")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:20]} overflows")
    return value


def _nesting(document: Any) -> int:
    """Deepest nesting of lists and dicts (iterative: a crafted file cannot exhaust the stack)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_JSON_DEPTH:
                return depth
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items if isinstance(item, dict | list))
    return deepest


# ---- validation --------------------------------------------------------------------------------
class _Fields:
    """Typed access to the fields of one JSON object; a wrong field is a one-line `InputError`."""

    def __init__(self, document: dict[str, Any], where: str, prefix: str = "") -> None:
        self.document, self.where, self.prefix = document, where, prefix

    def error(self, name: str, problem: str) -> InputError:
        return InputError(f"{self.where}: field {self.prefix + name!r} {problem}")

    def get(self, name: str, kind: type | tuple[type, ...], what: str, default: Any = ...) -> Any:
        if name not in self.document:
            if default is not ...:
                return default
            raise self.error(name, "is missing")
        value = self.document[name]
        # bool is an int to Python, never to a model file.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self.error(name, f"is {_short(value)}, expected {what}")
        if not isinstance(value, kind):
            raise self.error(name, f"is {_short(value)}, expected {what}")
        return value

    def integer(self, name: str, low: int, high: int, default: Any = ...) -> int:
        value = self.get(name, int, f"an integer in {low}..{high}", default)
        if not low <= value <= high:
            raise self.error(name, f"is {value}, expected an integer in {low}..{high}")
        return int(value)

    def nested(self, name: str) -> _Fields:
        return _Fields(self.get(name, dict, "an object"), self.where, f"{self.prefix}{name}.")


def _short(value: Any, limit: int = 60) -> str:
    """`repr` (one line, whatever the value holds), cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def model_from_document(document: Any, where: str = "model") -> LearnedModel:
    """Rebuild a model from its JSON document (see the module doc), validating every part."""
    if not isinstance(document, dict):
        raise InputError(f"{where} is not a dispatchtune model file (top level is not an object)")
    fields = _Fields(document, where)
    _check_format(document.get("format"), document, where)
    kind = fields.get("model_type", str, "a model type")
    if kind == PairwiseModel.kind:
        raise fields.error("model_type", "is a pairwise GPU prior; read it with load_cost_model")
    if kind not in MODELS:
        raise fields.error("model_type", f"is {_short(kind)}, known: {', '.join(MODELS)}")
    names = _feature_names(fields)
    params = fields.get("params", dict, "an object")
    unknown = sorted(set(params) - set(MODELS[kind].defaults))
    if unknown:
        raise fields.error("params", f"has {_short(unknown[0])}, not a {kind} parameter "
                           f"(known: {', '.join(sorted(MODELS[kind].defaults))})")
    for key, value in params.items():
        if not isinstance(value, str | int | float | bool) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise fields.error(f"params.{key}", f"is {_short(value)}, expected a number or text")
    seed = fields.integer("seed", -(2**63), 2**63 - 1, 0)
    try:
        model = MODELS[kind](feature_names=names, seed=seed, **params)
    except (TypeError, InputError) as exc:
        raise fields.error("params", f"is not valid for {kind} ({exc})") from exc
    model.training_rows = fields.integer("training_rows", 0, 2**63 - 1, 0)
    model.importances_ = _importances(fields, names)
    model.metadata = _metadata(fields)
    model.trees = _trees(fields.nested("model").nested("trees"), len(names))
    return model


def _pairwise_from_document(fields: _Fields) -> PairwiseModel:
    _feature_names(fields)  # the basis is computed from this feature schema
    params = fields.get("params", dict, "an object")
    numbers, flags = ("c", "pairs", "weak_weight", "tree_weight"), ("kind_terms", "pipeline_terms")
    lists, maps = ("pipeline_rankers",), {"diversity": (checked_diversity, DIVERSITY_FAMILIES),
                                          "default_closeness": (checked_default_closeness,
                                                                get_args(OpKind))}
    known = (*numbers, *flags, *lists, *maps)
    for key, value in params.items():
        if key not in known:
            raise fields.error("params", f"has {_short(key)}, not a pairwise parameter "
                               f"(known: {', '.join(known)})")
        if key in maps:
            checked, names = maps[key]
            try:
                checked(value)
            except InputError:
                raise fields.error(f"params.{key}", f"is {_short(value)}, expected an object of "
                                   f"weights >= 0 named {', '.join(names)}") from None
        if key in lists and not (isinstance(value, list) and len(value) <= len(PIPELINES)
                                 and all(name in PIPELINES for name in value)):
            raise fields.error(f"params.{key}", f"is {_short(value)}, expected a list of "
                               f"pipeline names ({', '.join(PIPELINES)})")
        if key in flags and not isinstance(value, bool):
            raise fields.error(f"params.{key}", f"is {_short(value)}, expected true or false")
        if key in numbers and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise fields.error(f"params.{key}", f"is {_short(value)}, expected a number")
    seed = fields.integer("seed", -(2**63), 2**63 - 1, 0)
    linear = fields.nested("model").nested("linear")
    names = basis_names(bool(params.get("kind_terms")), bool(params.get("pipeline_terms")))
    if linear.get("basis", list, "a list of basis names") != names:
        raise linear.error("basis", "differs from this dispatchtune's pairwise basis; retrain it")
    size = len(names)
    arrays = {}
    # A pipeline's own ranker reads the plain basis (no kind or pipeline terms).
    expected = {"weights": size, **{f"weights_{name}": len(basis_names())
                                    for name in params.get("pipeline_rankers", [])}}
    for name, length in expected.items():
        array = linear.nested(name)
        if array.integer("length", 0, MAX_MODEL_BYTES // 8) != length:
            raise array.error("length", f"is not {length} (one entry per basis column)")
        arrays[name] = _decode(array, "<f8")
    # With `tree_weight`, each pipeline ranker's trees read `tree_basis`.
    trees = {}
    for name in params.get("pipeline_rankers", []) if params.get("tree_weight") else []:
        stored = fields.nested("model").nested(f"trees_{name}")
        if stored.get("basis", list, "a list of basis names") != tree_basis_names():
            raise stored.error("basis", "differs from this dispatchtune's tree basis; retrain it")
        trees[name] = _trees(stored, len(tree_basis_names()))
    try:
        model = PairwiseModel.from_arrays(arrays, params, seed, trees)
    except (TypeError, InputError) as exc:
        raise fields.error("model", f"is not a valid pairwise model ({exc})") from exc
    model.training_rows = fields.integer("training_rows", 0, 2**63 - 1, 0)
    model.metadata = _metadata(fields)
    return model


def _check_format(fmt: Any, document: dict[str, Any], where: str) -> None:
    if not isinstance(fmt, str) or not fmt.startswith(FORMAT_PREFIX):
        raise InputError(
            f"{where} is not a dispatchtune model file (format {_short(fmt)}, expected {FORMAT!r})")
    version = fmt[len(FORMAT_PREFIX):]
    if not version.isdecimal() or len(version) > 6 or int(version) == 0:
        raise InputError(f"{where}: unknown model file format {_short(fmt)} (this dispatchtune "
                         f"reads format {FORMAT_VERSION})")
    if int(version) > FORMAT_VERSION:
        raise InputError(f"{where} has model file format {int(version)}, newer than this "
                         f"dispatchtune reads (format {FORMAT_VERSION}); upgrade dispatchtune")
    if int(version) < FORMAT_VERSION:
        metadata = document.get("metadata")
        command = metadata.get("command") if isinstance(metadata, dict) else None
        made = f" (it was made by: {_short(command, 300)})" if isinstance(command, str) else ""
        raise InputError(
            f"{where}: model file format {int(version)} is no longer read (this dispatchtune reads "
            f"format {FORMAT_VERSION}, trees as plain arrays); retrain with train-costmodel{made}")


def _feature_names(fields: _Fields) -> list[str]:
    schema = fields.integer("feature_schema_version", 0, 10**6)
    names = fields.get("feature_names", list, "a list of feature names")
    if not all(isinstance(name, str) for name in names):
        raise fields.error("feature_names", "holds a value that is not text")
    if schema == FEATURE_SCHEMA_VERSION and tuple(names) != FEATURE_NAMES:
        # Same version, other list: say where they differ rather than "v2 ... v2".
        first = next((i for i, (a, b) in enumerate(zip(names, FEATURE_NAMES, strict=False))
                      if a != b), min(len(names), len(FEATURE_NAMES)))
        found = _short(names[first]) if first < len(names) else "nothing"
        wanted = _short(FEATURE_NAMES[first]) if first < len(FEATURE_NAMES) else "nothing"
        raise fields.error("feature_names", (
            f"has {len(names)} features, not the {len(FEATURE_NAMES)} of feature schema "
            f"v{FEATURE_SCHEMA_VERSION} (feature {first} is {found}, expected {wanted}): "
            "a modified file; retrain it"))
    check_feature_schema(schema, names, where=fields.where)
    return names


def _importances(fields: _Fields, names: list[str]) -> np.ndarray:
    shares = fields.get("feature_importances", dict, "an object of feature shares", {})
    unknown = set(shares) - set(names)
    if unknown:
        raise fields.error("feature_importances", f"names an unknown feature "
                           f"{_short(sorted(unknown)[0])}")
    values = np.zeros(len(names))
    for i, name in enumerate(names):
        share = shares.get(name, 0.0)
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
            raise fields.error(f"feature_importances.{name}", f"is {_short(share)}, expected a "
                               "share in 0..1")
        values[i] = share
    return values


def _metadata(fields: _Fields) -> dict[str, Any]:
    metadata = dict(fields.get("metadata", dict, "an object", {}))
    kinds = metadata.get("target_kinds")
    if kinds is not None and (not isinstance(kinds, list) or not kinds
                              or not all(kind in _TARGET_KINDS for kind in kinds)):
        raise fields.error("metadata.target_kinds", f"is {_short(kinds)}, expected a list of "
                           f"{' / '.join(_TARGET_KINDS)}")
    return metadata


def _trees(fields: _Fields, n_features: int) -> TreeArrays:
    aggregate = fields.get("aggregate", str, "'sum' or 'mean'")
    if aggregate not in ("sum", "mean"):
        raise fields.error("aggregate", f"is {_short(aggregate)}, expected 'sum' or 'mean'")
    float32 = fields.get("float32_features", bool, "true or false")
    arrays = {name: _decode(fields.nested(name), dtype) for name, dtype in _ARRAY_DTYPES.items()}
    try:
        return TreeArrays.checked(arrays, n_features, average=aggregate == "mean",
                                  float32_features=float32)
    except InputError as exc:
        raise InputError(f"{fields.where}: field {fields.prefix.rstrip('.')!r}: {exc}") from exc


def _decode(fields: _Fields, dtype: str) -> np.ndarray:
    if fields.get("dtype", str, repr(dtype)) != dtype:
        raise fields.error("dtype", f"is {_short(fields.document['dtype'])}, expected {dtype!r}")
    item = np.dtype(dtype).itemsize
    length = fields.integer("length", 0, MAX_MODEL_BYTES // item)
    try:
        raw = base64.b64decode(fields.get("base64", str, "base64 text"), validate=True)
    except ValueError as exc:  # binascii.Error
        raise fields.error("base64", f"is not base64 ({exc})") from exc
    if len(raw) != length * item:
        raise fields.error("base64", f"holds {len(raw) / item:g} entries, 'length' says {length}")
    return np.frombuffer(raw, dtype=np.dtype(dtype)).astype(np.dtype(dtype).newbyteorder("="))
