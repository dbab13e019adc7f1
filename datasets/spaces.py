"""Measured spaces: the one loader that training, evaluation and the benchmark scripts share.

A *measured space* is a set of candidates of one problem on one device, each with a measured
time: one (problem, target, CPU[, enumeration digest]) of dispatchtune `results.jsonl` logs, or one
Kernel Tuner cache. Inputs (`classify_inputs`) are `results.jsonl(.gz)` files, tune output
directories (or directories of them), Kernel Tuner caches (`.json` / `.json.gz`) and `shipped:NAME`.

Only valid rows are kept. A logged candidate counts when it compiled, ran, did not fail
verification and has a positive time; a candidate measured in several sessions counts once, with
its median over sessions. A cache row counts when it has a numeric time.

Knob columns come from what each source declares as its knobs: a log record's `knobs` dict (the
solver's own `knob_*` variables when the log has them, else the flattened knobs; those that never
vary within the problem are left out) and a cache's `tune_params_keys`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from dispatchtune.datasets.kerneltuner import KernelTunerGemm, load_kerneltuner
from dispatchtune.datasets.records import ResultRecord, read_results, records_frame
from dispatchtune.datasets.shipped import resolve
from dispatchtune.errors import InputError
from dispatchtune.problem import Problem
from dispatchtune.targets import record_target

logger = logging.getLogger(__name__)

#: Per-candidate time estimators of a log (`records_frame` columns).
TIME_COLUMNS = ("min_ms", "median_ms")
#: The column of a log naming the enumeration its candidate ids refer to, when the log has it.
DIGEST_COLUMN = "space_digest"
#: `MeasuredSpace.kind` values.
RESULTS = "results"
KERNELTUNER = "kerneltuner"


@dataclass(frozen=True)
class MeasuredSpace:
    """One measured space: the valid rows of one problem on one device (rows aligned throughout)."""

    label: str  # unique name in reports, e.g. "host contraction m=256 ... [key]" or "<GPU> GEMM MxNxK"
    source: str  # where it came from: "results.jsonl" or "Kernel Tuner <file name>"
    kind: str  # RESULTS (one problem of results logs) or KERNELTUNER (one cache)
    device: str  # logs: the target measured on (`host` of another CPU -> llvm-cpu:<cpu>); caches: device_name
    cpu: str  # logs: the recorded `target_cpu` ("" for GPU targets and older logs); caches: ""
    #: The problem: a `Problem` for logs, the GEMM for GEMM caches, None for other caches.
    problem: Problem | KernelTunerGemm | None
    table: pd.DataFrame  # the valid rows' raw columns, index 0..n-1
    times: np.ndarray  # ms, > 0 (a cache tuned for a rate: 1 / rate, `kerneltuner` module doc)
    knobs: pd.DataFrame  # the knob columns of the valid rows, index 0..n-1
    space_digest: str = ""  # logs: the enumeration digest, when the log records one

    @property
    def n(self) -> int:
        return len(self.times)

    @property
    def workload(self) -> str:
        """What the space computes, the same on every device: a log's problem key; a cache's
        label without its device (kernel and problem size)."""
        if isinstance(self.problem, Problem):
            return self.problem.key
        return self.label.removeprefix(self.device).strip()


def classify_inputs(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """Split inputs into results.jsonl files and Kernel Tuner caches (one-line error otherwise)."""
    logs: list[Path] = []
    caches: list[Path] = []
    for raw in paths:
        path = resolve(raw)
        if path.is_dir():
            found = [path / "results.jsonl"] if (path / "results.jsonl").exists() else sorted(
                path.glob("*/results.jsonl"))
            if not found:
                raise InputError(f"{path}: no results.jsonl in it or in its subdirectories")
            logs.extend(found)
        elif not path.exists():
            raise InputError(f"no such file: {path}")
        elif path.name.endswith((".jsonl", ".jsonl.gz")):
            logs.append(path)
        elif path.name.endswith((".json", ".json.gz")):
            caches.append(path)
        else:
            raise InputError(f"{path}: expected a results.jsonl(.gz) log, a tune output directory, "
                             "a Kernel Tuner cache (.json/.json.gz) or shipped:NAME")
    return logs, caches


def load_spaces(
    paths: Sequence[str | Path], time_column: str = "min_ms", progress: bool = False,
    min_rows: int = 2,
) -> list[MeasuredSpace]:
    """Every measured space in `paths` with at least `min_rows` valid rows: caches, then logs.

    `time_column` is a logged candidate's time from its repetitions: `min_ms` (the tuning loop's
    estimator) or `median_ms`. No space at all, or one label twice, is a one-line error.
    """
    if time_column not in TIME_COLUMNS:
        raise InputError(f"unknown time column {time_column!r}; use min_ms or median_ms")
    logs, caches = classify_inputs(paths)
    spaces = [cache_space(path) for path in tqdm(caches, desc="Kernel Tuner caches",
                                                 disable=not progress)]
    if logs:
        spaces.extend(log_spaces(logs, time_column, progress))
    spaces = [s for s in spaces if s.n >= min_rows]
    if not spaces:
        raise InputError(f"no measured space with at least {min_rows} valid candidates in the "
                         "inputs")
    labels = [s.label for s in spaces]
    if len(set(labels)) != len(labels):
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        raise InputError(f"space {dupes[0]!r} is given twice; pass each dataset once")
    return spaces


def cache_space(path: Path) -> MeasuredSpace:
    """The valid rows of one Kernel Tuner cache; its knobs are the header's `tune_params_keys`."""
    cache = load_kerneltuner(path)
    valid = cache.valid.reset_index(drop=True)
    return MeasuredSpace(
        label=cache.label(), source=f"Kernel Tuner {path.name}", kind=KERNELTUNER,
        device=cache.device_name, cpu="", problem=cache.gemm() if cache.is_gemm else None,
        table=valid, times=valid["cost"].to_numpy(dtype=np.float64),
        knobs=valid[list(cache.tune_params_keys)],
    )


def log_spaces(
    logs: Sequence[Path], time_column: str = "min_ms", progress: bool = False
) -> list[MeasuredSpace]:
    """One space per (problem, target, CPU[, enumeration digest]) of results logs."""
    records = [record for path in logs for record in read_results(path)]
    frame = records_frame(records)
    if frame.empty:
        return []
    knob_names = _knob_names(records)
    frame = frame[_valid_rows(frame, time_column)]
    keys = ["problem_key", "target", "target_cpu"]
    if DIGEST_COLUMN in frame:
        # Logs written before the digest existed have none: they form their own group.
        frame = frame.assign(**{DIGEST_COLUMN: frame[DIGEST_COLUMN].fillna("").astype(str)})
        keys.append(DIGEST_COLUMN)
    groups = list(frame.groupby(keys, sort=True))
    digests_per_problem = Counter(key[:3] for key, _ in groups)
    spaces = []
    for key, group in tqdm(groups, desc="logged problems", disable=not progress):
        problem_key, target_name, cpu = (str(k) for k in key[:3])
        digest = str(key[3]) if len(key) > 3 else ""
        # A candidate measured in several sessions counts once, with its median over sessions.
        first = {c: "first" for c in group.columns if c not in ("candidate_id", time_column)}
        rows = group.groupby("candidate_id", sort=True).agg(
            {**first, time_column: "median"}).reset_index()
        problem = Problem.from_dict(rows["problem"].iloc[0])
        device = record_target(target_name, cpu).name
        label = f"{device} {problem.describe()} [{problem_key}]"
        if digests_per_problem[key[:3]] > 1:
            label = f"{label[:-1]} @{digest[:8] or 'no digest'}]"
        spaces.append(MeasuredSpace(
            label=label, source="results.jsonl", kind=RESULTS, device=device, cpu=cpu,
            problem=problem, table=rows, times=rows[time_column].to_numpy(dtype=np.float64),
            knobs=_logged_knobs(rows, knob_names), space_digest=digest,
        ))
    logger.debug("%d logged spaces from %d logs", len(spaces), len(logs))
    return spaces


def _valid_rows(frame: pd.DataFrame, time_column: str) -> np.ndarray:
    """Rows that compiled, ran, were not found wrong and have a positive time."""
    ok = frame["compile_status"] == "ok"
    if "bench_status" in frame:
        ok &= frame["bench_status"] == "ok"
    if "verify_status" in frame:
        ok &= frame["verify_status"] != "mismatch"
    times = frame[time_column].to_numpy(dtype=np.float64)
    return ok.to_numpy() & np.isfinite(times) & (times > 0)


def _knob_names(records: Iterable[ResultRecord]) -> list[str]:
    """Every knob name the records log, in first-seen order (`records_frame` flattens them)."""
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(record.knobs or {}))
    return list(names)


def _logged_knobs(rows: pd.DataFrame, knob_names: Sequence[str]) -> pd.DataFrame:
    """The knob columns of one problem's logged candidates; constant ones are left out."""
    # A log mixing sources has every knob as a column; a problem's own are the ones it fills.
    names = [c for c in knob_names if c in rows and rows[c].notna().any()]
    # The solver's own variables (`knob_*`) are the search dimensions; the table's other columns
    # (tile_m, workgroups, ...) are derived from them. Older logs have only the latter.
    raw = [c for c in names if c.startswith("knob_")]
    names = raw or names
    knobs = rows[names].reset_index(drop=True)
    varying = [c for c in names if knobs[c].astype(str).nunique() > 1]
    return knobs[varying]
