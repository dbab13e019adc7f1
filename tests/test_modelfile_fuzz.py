"""Fuzzing model files: thousands of mutated rf/gbm/lambdarank files loaded in this process.

The only allowed outcomes are a loaded model that predicts finite scores, or a one-line
`DispatchTuneError` that names the file. Anything else -- another exception, a hang, a crash of
the process (which would take pytest down) -- fails. Mutations: byte flips, truncations, inserted
tokens (NaN, Infinity, huge integers, deep nesting), deleted fields, swapped types, hostile values,
and tree arrays re-encoded with wrong child indices, features, values and sizes, so the checks
behind the base64 layer are reached too.

DISPATCHTUNE_FUZZ_CASES sets the number of mutations per model type (default 1500, ~10 s in all).
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatchtune.costmodel.learned import labels_from_times, make_model
from dispatchtune.costmodel.modelfile import load_model, save_model
from dispatchtune.costmodel.train import TrainingData, load_training_data
from dispatchtune.errors import DispatchTuneError

FIXTURES = Path(__file__).parent / "fixtures"
CASES = int(os.environ.get("DISPATCHTUNE_FUZZ_CASES", "1500"))
SMALL_PARAMS: dict[str, dict[str, Any]] = {
    "rf": {"n_estimators": 3, "max_leaf_nodes": 16},
    "gbm": {"num_boost_round": 6, "num_leaves": 7},
    "lambdarank": {"num_boost_round": 6, "num_leaves": 7},
}
TOKENS = [b"NaN", b"-Infinity", b"Infinity", b"1e999", b"-1", b"0", b"null", b"true", b'"',
          b"\\", b",", b":", b"{", b"}", b"[", b"]", b"9" * 40, b"[" * 5000, b"{\"a\":" * 200,
          b"\xff\xfe", b"\x00", b"1.5e308", b"-9223372036854775809"]
HOSTILE: list[Any] = [None, True, False, -1, 0, 1, 2**31, 2**63, 10**17, 1e308, -1e308,
                      float("nan"), float("inf"), "", "x", "<i4", [], {}, [0] * 1000, ["cpu"],
                      {"dtype": "<i4", "length": 1, "base64": "AAAAAA=="},
                      {"dtype": "<i4", "length": 10**9, "base64": ""}]


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return load_training_data([FIXTURES / "kt_gemm_2080ti_slice.json.gz",
                               FIXTURES / "cpu_results_matmul_256x384x256.jsonl"])


@pytest.fixture(scope="module")
def originals(data: TrainingData, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("fuzz_models")
    files = {}
    for kind, params in SMALL_PARAMS.items():
        model = make_model(kind, **params).fit(data.features, labels_from_times(data.times),
                                               data.groups)
        metadata = {"training_data": {"rows": 1, "per_problem": {"a [x]": 1}},
                    "cross_validation": {"per_problem": [{"problem": "a", "model": 1.0}]}}
        files[kind] = save_model(model, out / f"{kind}.json", metadata).read_bytes()
    return files


# ---- mutations ---------------------------------------------------------------------------------
Mutation = Callable[[np.random.Generator, bytes], bytes]


def flip_bytes(rng: np.random.Generator, raw: bytes) -> bytes:
    data = bytearray(raw)
    for position in rng.integers(0, len(data), rng.integers(1, 6)):
        data[position] ^= int(rng.integers(1, 256))
    return bytes(data)


def truncate(rng: np.random.Generator, raw: bytes) -> bytes:
    return raw[: int(rng.integers(0, len(raw)))]


def insert_token(rng: np.random.Generator, raw: bytes) -> bytes:
    at = int(rng.integers(0, len(raw)))
    return raw[:at] + TOKENS[int(rng.integers(len(TOKENS)))] + raw[at:]


def _paths(document: Any) -> list[list[Any]]:
    """Every position in the document (as key/index lists), the root excluded."""
    found: list[list[Any]] = []
    stack: list[tuple[Any, list[Any]]] = [(document, [])]
    while stack:
        value, path = stack.pop()
        items = (value.items() if isinstance(value, dict)
                 else enumerate(value) if isinstance(value, list) else ())
        for key, item in items:
            found.append([*path, key])
            stack.append((item, [*path, key]))
    return found


def _parent(document: Any, path: list[Any]) -> Any:
    for key in path[:-1]:
        document = document[key]
    return document


def _structural(edit: Callable[[np.random.Generator, Any, Any], None]) -> Mutation:
    def mutate(rng: np.random.Generator, raw: bytes) -> bytes:
        document = json.loads(raw)
        paths = _paths(document)
        path = paths[int(rng.integers(len(paths)))]
        edit(rng, _parent(document, path), path[-1])
        return json.dumps(document, allow_nan=True).encode()

    return mutate


def _delete(rng: np.random.Generator, parent: Any, key: Any) -> None:
    del parent[key]


def _hostile(rng: np.random.Generator, parent: Any, key: Any) -> None:
    parent[key] = copy.deepcopy(HOSTILE[int(rng.integers(len(HOSTILE)))])


def _swap_type(rng: np.random.Generator, parent: Any, key: Any) -> None:
    value = parent[key]
    parent[key] = ([value] if not isinstance(value, list) else {"0": value} if rng.random() < 0.5
                   else json.dumps(value))


def _nest(rng: np.random.Generator, parent: Any, key: Any) -> None:
    value: Any = parent[key]
    for _ in range(int(rng.integers(20, 60))):
        value = [value] if rng.random() < 0.5 else {"k": value}
    parent[key] = value


def mutate_tree_array(rng: np.random.Generator, raw: bytes) -> bytes:
    """Decode one tree array, damage its values or size, re-encode it with a consistent length."""
    document = json.loads(raw)
    trees = document["model"]["trees"]
    name = str(rng.choice([k for k, v in trees.items() if isinstance(v, dict)]))
    entry = trees[name]
    values = np.frombuffer(base64.b64decode(entry["base64"]), dtype=entry["dtype"]).copy()
    n = max(len(values), 1)
    op = int(rng.integers(7))
    picks = rng.integers(0, n, int(rng.integers(1, 4)))
    if op == 0 and values.size:  # wrong indices / values
        if values.dtype.kind == "f":
            values[picks % values.size] = rng.choice([np.nan, np.inf, -np.inf, 1e300, -1e300,
                                                      0.0, 1e-36, 5.0])
        else:
            info = np.iinfo(values.dtype)
            values[picks % values.size] = rng.choice(
                [-1, 0, n - 1, n, 2 * n, info.max, info.min, int(rng.integers(0, n))])
    elif op == 1:  # truncate
        values = values[: int(rng.integers(0, n))]
    elif op == 2:  # oversized: the array repeated
        values = np.tile(values, int(rng.choice([2, 50, 2000])))
    elif op == 3:  # shuffled
        rng.shuffle(values)
    elif op == 4 and values.size:  # plausible values: the model may still load
        values[picks % values.size] = values[rng.integers(0, values.size, picks.size)]
    elif op == 5:  # wrong dtype
        entry["dtype"] = str(rng.choice(["<i8", "<f4", ">i4", "|u1", "<i4", "<f8", "object"]))
    else:  # length field out of step
        entry["length"] = int(rng.choice([0, len(values) + 1, max(len(values) - 1, 0), 2**40]))
        return json.dumps(document).encode()
    entry["base64"] = base64.b64encode(values.tobytes()).decode()
    entry["length"] = int(values.size)
    return json.dumps(document).encode()


def retype_model(rng: np.random.Generator, raw: bytes) -> bytes:
    """Valid parts put together wrongly: another model type, format, feature list or flags."""
    document = json.loads(raw)
    edits = [
        lambda d: d.update(model_type=str(rng.choice(["rf", "gbm", "lambdarank", "xgb"]))),
        lambda d: d.update(format=str(rng.choice(["dispatchtune.costmodel/1",
                                                  "dispatchtune.costmodel/3",
                                                  "dispatchtune.costmodel/0",
                                                  "dispatchtune.costmodel/99999999999",
                                                  "dispatchtune.costmodel/²"]))),
        lambda d: d["feature_names"].reverse(),
        lambda d: d["model"]["trees"].update(aggregate=str(rng.choice(["sum", "mean", "max"]))),
        lambda d: d["model"]["trees"].update(float32_features=bool(rng.random() < 0.5)),
        lambda d: d.update(feature_schema_version=int(rng.choice([1, 2, 3, -1]))),
    ]
    edits[int(rng.integers(len(edits)))](document)
    return json.dumps(document).encode()


MUTATIONS: dict[str, Mutation] = {
    "flip_bytes": flip_bytes,
    "truncate": truncate,
    "insert_token": insert_token,
    "delete_field": _structural(_delete),
    "hostile_value": _structural(_hostile),
    "swap_type": _structural(_swap_type),
    "deep_nesting": _structural(_nest),
    "tree_array": mutate_tree_array,
    "retype": retype_model,
}


# ---- the test ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(SMALL_PARAMS))
def test_mutated_model_files_load_or_fail_in_one_line(
    kind: str, originals: dict[str, bytes], data: TrainingData, tmp_path: Path
) -> None:
    rng = np.random.default_rng(sum(map(ord, kind)))
    features = data.features.iloc[:: max(1, len(data.features) // 64)]
    path = tmp_path / f"fuzzed_{kind}.json"
    names = list(MUTATIONS)
    outcomes: Counter[str] = Counter()
    for case in range(CASES):
        name = names[case % len(names)]
        raw = originals[kind]
        for _ in range(int(rng.integers(1, 3))):  # one or two mutations stacked
            try:
                raw = MUTATIONS[name](rng, raw)
            except Exception:  # a second mutation that does not apply to the first
                break
        path.write_bytes(raw)
        where = f"case {case} ({name})"
        try:
            model = load_model(path)
        except DispatchTuneError as exc:
            message = str(exc)
            assert "\n" not in message and str(path) in message, f"{where}: {message!r}"
            outcomes["refused"] += 1
            continue
        scores = model.predict(features)
        assert scores.shape == (len(features),) and np.isfinite(scores).all(), where
        assert np.isfinite(model.feature_importances().to_numpy()).all(), where
        outcomes["loaded"] += 1
    # Both outcomes occur: the mutations reach past the parser and the checks refuse the damage.
    assert outcomes["refused"] > CASES / 4 and outcomes["loaded"] > 0, outcomes
