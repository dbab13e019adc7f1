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

``transient`` marks a failure that may not happen again (a timeout, a crash, an I/O error such as a
full disk, a compile killed under load): such candidates are tried again by later runs, at most
`MAX_ATTEMPTS` times in all (`may_be_transient` classifies logs written before the field).
``compile_timeout_s`` is the compile timeout a candidate was built under, so a run with a larger
one retries the timed-out. Confirm records carry their round (``confirm_round``) and the plan
of their confirmation (``confirm_rounds`` x ``confirm_finalists``), so an interrupted one is seen.
A confirmation opens with a *plan record* (``kind = "confirm"``, ``confirm_round = -1``,
``bench_status = "skipped"``, no times) written before anything is compiled or measured, so one
interrupted before its first measurement is seen too; a plan of 0 finalists closes a confirmation
that found nothing to measure.

``space_digest`` names the enumeration ``candidate_id`` is a row of (`CandidateSet.digest`; ""
for candidates that did not come from an enumeration, and in logs written before the field): a
log from another IREE, Z3 model or CPU numbers its rows differently.

`read_results` gives the records back as the `ResultRecord`s they were written from; a line whose
fields have the wrong types is skipped like a corrupt one.
"""

from __future__ import annotations

import functools
import gzip
import json
import os
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.datasets.jsonl import JsonlWriter
from dispatchtune.datasets.timing import estimate, speedup
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem

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

#: Tries of a candidate whose failures may be transient, across runs (the first and 2 retries).
MAX_ATTEMPTS = 3
#: Error text of failures the environment caused (the disk, memory, the process table).
_TRANSIENT_ERRORS = (
    "no space left on device", "input/output error", "cannot allocate memory", "out of memory",
    "disk quota exceeded", "resource temporarily unavailable", "too many open files",
    "[errno 28]", "[errno 5]", "[errno 12]", "[errno 122]",
)

_REQUIRED = ("schema", "kind", "problem_key", "target", "candidate_id", "compile_status")


class CorruptRecordWarning(UserWarning):
    """A `results.jsonl` line that could not be read; it is skipped."""


class RecordKind(StrEnum):
    """What a record measured (see the module docstring)."""

    CANDIDATE = "candidate"
    BASELINE = "baseline"
    CONFIRM = "confirm"


@dataclass
class ResultRecord:
    """One line of `results.jsonl` (see the module docstring for the kinds)."""

    problem: dict[str, Any]
    problem_key: str
    target: str
    device: str
    candidate_id: int
    kind: RecordKind = RecordKind.CANDIDATE
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
    #: `CandidateSet.digest` of the enumeration `candidate_id` is a row of ("": not known).
    space_digest: str = ""
    #: The failure may be transient (see the module docstring); False for successes.
    transient: bool = False
    compile_timeout_s: float | None = None
    #: confirm records: this round (0-based), and the rounds x finalists of the confirmation.
    confirm_round: int = -1
    confirm_rounds: int = 0
    confirm_finalists: int = 0

    def __post_init__(self) -> None:
        self.kind = RecordKind(self.kind)  # a plain "baseline" is accepted and stored typed

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, default=_json_default)

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object it is written as (`kind` a plain string)."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data

    @property
    def is_candidate(self) -> bool:
        return self.kind is RecordKind.CANDIDATE

    @property
    def is_baseline(self) -> bool:
        return self.kind is RecordKind.BASELINE

    @property
    def is_confirm(self) -> bool:
        return self.kind is RecordKind.CONFIRM

    @property
    def is_confirm_plan(self) -> bool:
        """The record a confirmation opens with: its plan, no measurement (module docstring)."""
        return self.is_confirm and self.confirm_round < 0 and self.bench_status == "skipped"

    def belongs_to(self, problem_key: str, target: str) -> bool:
        """Whether the record measured this dispatch on this target."""
        return self.problem_key == problem_key and self.target == target

    @property
    def failed(self) -> bool:
        """The candidate could not be built or benchmarked (a duplicate or a miscompile is a result)."""
        return self.compile_status not in ("ok", "duplicate") or self.bench_status in (
            "failed", "timeout", "crashed")

    @property
    def may_be_transient(self) -> bool:
        """A failure worth another try: flagged when written, or classified from its statuses."""
        if not self.failed:
            return False
        return self.transient or transient_failure(self.compile_status, self.compile_error) or (
            self.compile_status == "ok" and transient_failure(self.bench_status, self.bench_error))

    @property
    def median_ms(self) -> float | None:
        return float(np.median(self.times_ms)) if self.times_ms else None

    def learned_time(self, estimator: str = "min") -> float | None:
        """The time a search learns from: None for a failed or miscompiled candidate."""
        if (self.compile_status != "ok" or self.bench_status != "ok" or not self.times_ms
                or self.verify_status == "mismatch"):
            return None
        return estimate(self.times_ms, estimator)


def transient_failure(status: str, error: str) -> bool:
    """Whether a compile/benchmark/run outcome may not recur: timeouts, crashes (a compile killed
    under load), and errors of the environment (a full disk, no memory) rather than of the config."""
    if status in ("timeout", "crashed"):
        return True
    if status in ("ok", "duplicate", "skipped", "not_applied"):
        return False
    text = error.lower()
    return any(marker in text for marker in _TRANSIENT_ERRORS)


def latest_attempts(records: Iterable[ResultRecord]) -> list[ResultRecord]:
    """The records without the failed attempts a later attempt of the same candidate superseded."""
    records = list(records)

    def key(r: ResultRecord) -> tuple[str, str, str]:
        return r.problem_key, r.target, r.compilation_info or f"#{r.candidate_id}"

    last = {key(r): index for index, r in enumerate(records) if r.is_candidate}
    return [r for i, r in enumerate(records) if not r.is_candidate or last[key(r)] == i]


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


def read_results(path: str | os.PathLike[str]) -> Iterator[ResultRecord]:
    """Yield the records of a `results.jsonl` file as the `ResultRecord`s they were written from.

    Corrupt lines (not JSON, not an object, required fields missing, a field of the wrong type)
    are skipped with a `CorruptRecordWarning` naming the file and line number; optional fields a
    older log lacks take their defaults. A record of a foreign or newer schema raises
    `DispatchTuneError`. A missing file yields nothing. A name ending in `.gz` is read through
    gzip (the shipped datasets are compressed logs).
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
                    data = json.loads(text)
                except json.JSONDecodeError as exc:
                    _skip(where, exc.msg)
                    continue
                except RecursionError:
                    _skip(where, "nested too deeply")
                    continue
                if not isinstance(data, dict):
                    _skip(where, "not a JSON object")
                    continue
                check_schema(data.get("schema"), where)
                missing = [name for name in _REQUIRED if name not in data]
                if missing:
                    _skip(where, f"missing {', '.join(missing)}")
                    continue
                try:
                    yield _typed(data)
                except _WrongType as exc:
                    _skip(where, str(exc))
    except (EOFError, zlib.error, gzip.BadGzipFile) as exc:
        # A truncated or foreign .gz file: one line naming the file, not a traceback.
        raise DispatchTuneError(f"{path}: not a readable gzip log ({exc})") from exc


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """`read_results` as plain dicts, for readers not yet converted to the typed records."""
    for record in read_results(path):
        yield record.to_dict()


def _skip(where: str, why: str) -> None:
    warnings.warn(f"{where}: corrupt record skipped ({why})", CorruptRecordWarning, stacklevel=3)


def record_from_dict(data: Mapping[str, Any]) -> ResultRecord:
    """Rebuild a `ResultRecord` from a dict (unknown keys are ignored, missing ones defaulted).

    A field of the wrong type is a one-line `DispatchTuneError`.
    """
    try:
        return _typed(data)
    except _WrongType as exc:
        raise DispatchTuneError(f"not a result record: {exc}") from exc


def as_records(records: Iterable[ResultRecord | Mapping[str, Any]]) -> list[ResultRecord]:
    """Typed records from typed ones or dicts (callers still holding `read_records` dicts)."""
    return [r if isinstance(r, ResultRecord) else record_from_dict(r) for r in records]


# ---- field types, checked on reading ---------------------------------------------------------
class _WrongType(ValueError):
    """A record field whose JSON value does not have the field's type."""


def _expect(kind: type | tuple[type, ...], what: str) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise _WrongType(what)  # JSON true is not a number here
        if not isinstance(value, kind):
            raise _WrongType(what)
        return value

    return convert


def _number(value: Any) -> float:
    return float(_expect((int, float), "a number")(value))


def _optional(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda value: None if value is None else convert(value)


def _numbers(value: Any) -> list[float]:
    # Logs of the first versions wrote null for "no times".
    return [] if value is None else [_number(v) for v in _expect(list, "a list")(value)]


def _kind(value: Any) -> RecordKind:
    try:
        return RecordKind(_expect(str, "a string")(value))
    except ValueError as exc:
        raise _WrongType(f"one of {', '.join(k.value for k in RecordKind)}") from exc


#: How a JSON value becomes each field's type, by the field's annotation. A field of a new type
#: fails here at import, not on some user's log.
_CONVERTERS: dict[str, Callable[[Any], Any]] = {
    "str": _expect(str, "a string"),
    "bool": _expect(bool, "a boolean"),
    "int": _expect(int, "an integer"),
    "int | None": _optional(_expect(int, "an integer")),
    "float": _number,
    "float | None": _optional(_number),
    "list[float]": _numbers,
    "dict[str, Any]": _expect(dict, "an object"),
    "RecordKind": _kind,
}
_FIELD_CONVERTERS = {f.name: _CONVERTERS[str(f.type)] for f in fields(ResultRecord)}
#: Fields without a default that logs written before them may lack.
_READ_DEFAULTS: dict[str, Any] = {"problem": {}, "device": ""}


def _typed(data: Mapping[str, Any]) -> ResultRecord:
    values = dict(_READ_DEFAULTS)
    for name, value in data.items():
        convert = _FIELD_CONVERTERS.get(name)
        if convert is None:
            continue  # a field of a newer minor version, or of another tool: ignored
        try:
            values[name] = convert(value)
        except _WrongType as exc:
            raise _WrongType(f"{name} is {type(value).__name__} {value!r:.40}, expected {exc}") from None
    if values["problem"]:
        _check_problem(values["problem"])
    return ResultRecord(**values)


@functools.lru_cache(maxsize=256)
def _problem_error(text: str) -> str:
    """Why a record's problem dict does not describe a `Problem` ('' when it does)."""
    try:
        Problem.from_dict(json.loads(text))
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def _check_problem(problem: dict[str, Any]) -> None:
    # Training and evaluation rebuild the problem of every logged space from its first record;
    # a malformed one is a corrupt line, not a crash later. A log repeats a few problems many
    # times, so each distinct one is checked once.
    try:
        text = json.dumps(problem, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise _WrongType(f"problem that cannot be stored ({exc})") from None
    why = _problem_error(text)
    if why:
        raise _WrongType(f"problem that describes no root op ({why:.80})")


#: Columns `records_frame` adds to the record fields and the flattened knobs.
DERIVED_COLUMNS = ("median_ms", "min_ms", "baseline_median_ms", "speedup")


def records_frame(
    records: Iterable[ResultRecord],
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
    wanted = {str(k) for k in kinds} | ({RecordKind.BASELINE.value} if include_baselines else set())
    rows: list[dict[str, Any]] = []
    for record in records:
        if record.kind.value not in wanted:
            continue
        row = {k: v for k, v in vars(record).items() if k not in ("knobs", "problem")}
        row["kind"] = record.kind.value
        for name, value in record.knobs.items():
            if name not in row or name == "pipeline":
                row[name] = value
        row["problem"] = record.problem
        row["median_ms"] = estimate(record.times_ms, "median")
        row["min_ms"] = estimate(record.times_ms, "min")
        row["baseline_median_ms"] = estimate(record.baseline_times_ms, "median")
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        return frame
    frame["speedup"] = speedup(frame["baseline_median_ms"].to_numpy(), frame["median_ms"].to_numpy())
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
    records: list[ResultRecord] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            path = path / "results.jsonl"
        if not path.exists():
            raise DispatchTuneError(f"no results file at {path}")
        records.extend(read_results(path))
    return records_frame(records, include_baselines=include_baselines, kinds=kinds)
