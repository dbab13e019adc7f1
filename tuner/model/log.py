"""`model_log.jsonl`: every model-level measurement and decision, appended as soon as it is known.

A re-run with the same output directory finds its earlier records here (`find`) and reuses them
instead of measuring again. Lines are written by the shared durable writer (`datasets.jsonl`).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

from dispatchtune.datasets.jsonl import JsonlWriter
from dispatchtune.errors import DispatchTuneError

MODEL_SCHEMA = "dispatchtune.model/1"


class Maybe:
    """A field that may be absent or null; when given, it has the wrapped shape."""

    def __init__(self, shape: Any) -> None:
        self.shape = shape


_NUMBER = (int, float)
_TIMES = [[_NUMBER]]  # rounds x repetitions, ms
_TRIED = {
    "candidate_id": int, "status": str, "dispatch_speedup": _NUMBER,
    "confirmed": Maybe(bool), "error": Maybe(str), "verify_status": Maybe(str),
    "max_abs_error": Maybe(_NUMBER), "model_speedup": Maybe(_NUMBER),
    "ratios": Maybe([_NUMBER]), "times_ms": Maybe(_TIMES), "rounds": Maybe(int),
    "wins": Maybe(int), "p_value": Maybe(_NUMBER),
}
#: What the readers of each kind rely on. `model_log.jsonl` is read back on every resume and may
#: have been edited or damaged: a record that does not have these shapes is skipped (its step is
#: measured again) instead of failing deep inside the run with a traceback.
RECORD_SHAPES: dict[str, dict[str, Any]] = {
    "profile": {
        "model": str, "source": Maybe(str), "model_sha256": Maybe(str),
        "target": Maybe(str), "device": Maybe(str), "function": Maybe(str),
        "timer": Maybe(str), "default_build_s": Maybe(_NUMBER),
        "compile_flags": Maybe([str]), "times_ms": Maybe([_NUMBER]),
        "dispatches": Maybe([{"name": str, "time_ms": _NUMBER, "calls": int}]),
    },
    "dispatch_failed": {"key": str, "budget": int, "reason": str},
    "step": {"key": str, "kept": Maybe(int), "tried": Maybe([_TRIED]),
             "note": Maybe(str)},
    "final": {"default_times_ms": _TIMES, "tuned_times_ms": _TIMES, "verify_status": Maybe(str),
              "max_abs_error": Maybe(_NUMBER), "verify_note": Maybe(str)},
}


def conforms(value: Any, shape: Any) -> bool:
    """Whether `value` (parsed JSON) has `shape`: a type or tuple of types (never bool for
    numbers), `[item shape]`, `{field: shape}` (other fields free) or `Maybe(shape)`."""
    if isinstance(shape, Maybe):
        return value is None or conforms(value, shape.shape)
    if isinstance(shape, list):
        return isinstance(value, list) and all(conforms(v, shape[0]) for v in value)
    if isinstance(shape, dict):
        return isinstance(value, dict) and all(
            conforms(value.get(k), v) if isinstance(v, Maybe) else k in value
            and conforms(value[k], v) for k, v in shape.items()
        )
    if isinstance(value, bool) and shape is not bool:
        return False
    return isinstance(value, shape)


class ModelLog:
    """The profile, model-level steps and final measurement of one tune-model output directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    warnings.warn(f"{path}:{number}: corrupt record skipped", stacklevel=2)
                    continue
                if not isinstance(record, dict) or record.get("schema") != MODEL_SCHEMA:
                    raise DispatchTuneError(
                        f"{path}:{number}: not a tune-model record (expected {MODEL_SCHEMA})"
                    )
                shape = RECORD_SHAPES.get(str(record.get("kind")))
                if shape is None or not conforms(record, shape):
                    warnings.warn(f"{path}:{number}: malformed {record.get('kind')!r} record "
                                  "skipped (measured again)", stacklevel=2)
                    continue
                self.records.append(record)
        self._writer = JsonlWriter(path)

    def find(self, kind: str, **match: Any) -> dict[str, Any] | None:
        """The latest record of `kind` whose fields equal `match`."""
        for record in reversed(self.records):
            if record.get("kind") == kind and all(record.get(k) == v for k, v in match.items()):
                return record
        return None


    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably; return it."""
        record = {"schema": MODEL_SCHEMA, "kind": kind, "timestamp": time.time(), **fields}
        self._writer.append(json.dumps(record, sort_keys=True))
        self.records.append(record)
        return record
