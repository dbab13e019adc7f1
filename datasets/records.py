"""The versioned `results.jsonl` record format written by the tuning loop.

One JSON object per line, appended (flush + fsync) as soon as a result is known, so a killed run
loses at most the line being written. Readers skip a corrupt line with a warning that names the
file and line number, and refuse records of a foreign schema with a one-line `DispatchTuneError`.

Two kinds of record share the format:

* ``kind = "candidate"``: one tuning candidate (``candidate_id`` = its row in the enumeration table)
  with its compile, benchmark and verification outcome.
* ``kind = "baseline"``: one measurement of the compiler-default configuration
  (``candidate_id = -1``); the loop measures it at the start and again at intervals.
* ``kind = "confirm"``: a re-measurement of one of the best candidates at the end of a run, in
  rounds that alternate with the baseline (``baseline_times_ms`` = that round's baseline).
"""

from __future__ import annotations

import gzip
import json
import os
import time
import warnings
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.datasets.jsonl import JsonlWriter
from dispatchtune.errors import DispatchTuneError

SCHEMA_PREFIX = "dispatchtune.result/"
SCHEMA_VERSION = 1
SCHEMA = f"{SCHEMA_PREFIX}{SCHEMA_VERSION}"

BASELINE_ID = -1

#: `compile_status` values. `duplicate`: the binary is byte-identical to an earlier candidate's,
#: so it was not benchmarked again (`duplicate_of` names that candidate).
COMPILE_STATUSES = ("ok", "failed", "timeout", "crashed", "not_applied", "duplicate", "error")
#: `bench_status` values (`skipped` when there was nothing to benchmark).
BENCH_STATUSES = ("ok", "failed", "timeout", "crashed", "skipped")
#: `verify_status` values.
VERIFY_STATUSES = ("ok", "mismatch", "skipped", "error")

_REQUIRED = ("schema", "kind", "problem_key", "target", "candidate_id", "compile_status")


class CorruptRecordWarning(UserWarning):
    """A `results.jsonl` line that could not be read; it is skipped."""


@dataclass
class ResultRecord:
    """One line of `results.jsonl` (see the module docstring for the two kinds)."""

    problem: dict[str, Any]
    problem_key: str
    target: str
    device: str
    candidate_id: int
    kind: str = "candidate"
    schema: str = SCHEMA
    iree_version: str = ""
    session: str = ""
    order: str = ""
    rank: int = -1
    score: float | None = None
    pipeline: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    compilation_info: str = ""
    compile_status: str = "ok"
    compile_error: str = ""
    compile_time_s: float | None = None
    binary_sha256: str = ""
    duplicate_of: int | None = None
    bench_status: str = "skipped"
    bench_error: str = ""
    times_ms: list[float] = field(default_factory=list)
    baseline_times_ms: list[float] = field(default_factory=list)
    verify_status: str = "skipped"
    verify_error: str = ""
    max_abs_error: float | None = None
    timestamp: float = field(default_factory=time.time)
    #: llvm-cpu only: the CPU IREE compiled for (`host` resolved, e.g. znver4), so that features
    #: of a log are computed for the CPU it was measured on (`targets.record_target`).
    target_cpu: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=_json_default)

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.times_ms)) if self.times_ms else None


def _json_default(value: object) -> object:
    # Knob tables come from pandas/numpy: store their scalars as plain JSON numbers.
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, set)):
        return list(value)
    raise TypeError(f"cannot store {type(value).__name__} in a result record")


def check_schema(schema: object, where: str) -> None:
    """Raise a one-line error for a record written by another tool or a newer dispatchtune."""
    if not isinstance(schema, str) or not schema.startswith(SCHEMA_PREFIX):
        raise DispatchTuneError(
            f"{where}: not a dispatchtune result record (schema {schema!r}, expected {SCHEMA!r})"
        )
    version = schema[len(SCHEMA_PREFIX) :]
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise DispatchTuneError(
            f"{where}: record schema {schema!r} is newer than this dispatchtune reads ({SCHEMA!r});"
            " upgrade dispatchtune"
        )


class ResultsLog:
    """Append-only, durable writer of `results.jsonl`; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._writer = JsonlWriter(path)
        self.path = self._writer.path

    def append(self, record: ResultRecord) -> None:
        """Write one record and make it durable before returning."""
        self._writer.append(record.to_json())


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Yield the records of a `results.jsonl` file as dicts.

    Corrupt lines (not JSON, not an object, required fields missing) are skipped with a
    `CorruptRecordWarning` naming the file and line number. A record of a foreign or newer schema
    raises `DispatchTuneError`. A missing file yields nothing. A name ending in `.gz` is read
    through gzip (the shipped datasets are compressed logs).
    """
    path = Path(path)
    if not path.exists():
        return
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                text = line.strip()
                if not text:
                    continue
                where = f"{path}:{number}"
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    warnings.warn(
                        f"{where}: corrupt record skipped ({exc.msg})", CorruptRecordWarning,
                        stacklevel=2,
                    )
                    continue
                if not isinstance(record, dict):
                    warnings.warn(
                        f"{where}: corrupt record skipped (not a JSON object)", CorruptRecordWarning,
                        stacklevel=2,
                    )
                    continue
                check_schema(record.get("schema"), where)
                missing = [name for name in _REQUIRED if name not in record]
                if missing:
                    warnings.warn(
                        f"{where}: corrupt record skipped (missing {', '.join(missing)})",
                        CorruptRecordWarning, stacklevel=2,
                    )
                    continue
                yield record
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # A truncated or foreign .gz file: one line naming the file, not a traceback.
        raise DispatchTuneError(f"{path}: not a readable gzip log ({exc})") from exc


def record_from_dict(data: Mapping[str, Any]) -> ResultRecord:
    """Rebuild a `ResultRecord` from a dict read back from the log (unknown keys are ignored)."""
    names = ResultRecord.__dataclass_fields__.keys()
    return ResultRecord(**{k: v for k, v in data.items() if k in names})


def _median(values: object) -> float:
    if isinstance(values, list) and values:
        return float(np.median(np.asarray(values, dtype=float)))
    return float("nan")


#: Columns `records_frame` adds to the record fields and the flattened knobs.
DERIVED_COLUMNS = ("median_ms", "min_ms", "baseline_median_ms", "speedup")


def records_frame(
    records: Iterable[Mapping[str, Any]],
    *,
    include_baselines: bool = False,
    kinds: Sequence[str] = ("candidate",),
) -> pd.DataFrame:
    """One row per record of the given kinds, with the knobs flattened into columns.

    By default only `candidate` records (one per candidate tried); `include_baselines` adds the
    baseline measurements, `kinds` selects any kinds (`confirm`: the interleaved re-measurements
    of the top candidates at the end of a run).

    Adds `median_ms`, `min_ms`, `baseline_median_ms` and `speedup` (baseline median / candidate
    median, > 1 is faster than the compiler default); NaN where not measured. Knob columns keep
    the names of the enumeration table (`tile_m`, `vec_n`, ...), so tables can be joined on them.
    """
    rows: list[dict[str, Any]] = []
    for record in records:
        kind = record.get("kind")
        if kind not in kinds and not (include_baselines and kind == "baseline"):
            continue
        row = {k: v for k, v in record.items() if k not in ("knobs", "problem")}
        row.setdefault("target_cpu", "")  # logs written before the field: this machine's CPU
        knobs = record.get("knobs") or {}
        for name, value in knobs.items():
            if name not in row or name == "pipeline":
                row[name] = value
        row["problem"] = record.get("problem")
        times = record.get("times_ms") or []
        row["median_ms"] = _median(times)
        row["min_ms"] = float(min(times)) if times else float("nan")
        row["baseline_median_ms"] = _median(record.get("baseline_times_ms"))
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["speedup"] = frame["baseline_median_ms"] / frame["median_ms"]
    return frame


def load_results(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    include_baselines: bool = False,
    kinds: Sequence[str] = ("candidate",),
) -> pd.DataFrame:
    """Read one or more `results.jsonl` files (or output directories) into a DataFrame."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records: list[dict[str, Any]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            path = path / "results.jsonl"
        if not path.exists():
            raise DispatchTuneError(f"no results file at {path}")
        records.extend(read_records(path))
    return records_frame(records, include_baselines=include_baselines, kinds=kinds)
