"""Kernel Tuner cache files (fully measured GPU search spaces) read as tables.

A cache (`.json` or `.json.gz`) holds a header (`kernel_name`, `device_name`, `problem_size`,
`tune_params_keys`, `tune_params`) and `cache`: one entry per configuration with its parameters and
`time` (mean, ms) or, for an invalid configuration, a string such as "CompilationFailedConfig".

`load_kerneltuner` returns one row per configuration: the raw parameters (the knobs, named by the
header's `tune_params_keys`), `GFLOP/s`, `time_ms` (NaN when invalid), `cost` (what tuning
minimises, see below), `valid`, `status` and `device`.

The header's `objective` (default `time`) names the entry field the cache was tuned for, and
`objective_higher_is_better` its direction where given; otherwise the direction is Kernel Tuner's
own for its named objectives (time and energy lower, rates such as GFLOP/s or GB/s higher). `cost`
is the objective where lower is better and its reciprocal where higher is: a kernel tuned for
GFLOP/s whose work grows with a knob (hotspot's temporal tiling) is ranked by its rate, not by
the time of one launch. An objective that no entry carries falls back to `time` with a warning.

The mapping of a CLBlast-style GEMM space (MWG, NWG, KWG, ...) onto the feature vocabulary lives
above this layer, in `dispatchtune.features.kerneltuner`.

`problem_size` may be a list or a single int (pnpoly), `device_name` may be empty or any string,
and parameters of any kernel load: numeric ones as numbers, others (strings) as they are. A cache
left open by an interrupted tuning run loads with the entries it holds, and an entry without its
parameters (older caches) takes them from its key.

The GEMM's M and N are the header's `problem_size`; K is not in the header, so it is recovered from
the measured `GFLOP/s` and `time` (FLOPs = 2*M*N*K), falling back to K = M when those are missing
(`KernelTunerSpace.gemm`).
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.errors import InputError

logger = logging.getLogger(__name__)

#: The parameters that make a cache a CLBlast-style GEMM space.
GEMM_KEYS = ("MWG", "NWG", "KWG", "MDIMC", "NDIMC")
#: Objectives where lower is better (Kernel Tuner's defaults); rates (".../s", ".../W", ".../J")
#: are higher-is-better.
LOWER_IS_BETTER = ("time", "energy")


@dataclass(frozen=True)
class KernelTunerGemm:
    """The GEMM a Kernel Tuner GEMM space solves (one element type for A, B and C)."""

    m: int
    n: int
    k: int
    element_bits: int

    @property
    def element_bytes(self) -> float:
        return self.element_bits / 8


@dataclass(frozen=True)
class KernelTunerSpace:
    """One loaded cache: header facts and the per-configuration table."""

    path: str
    kernel_name: str
    device_name: str
    problem_size: tuple[int, ...]
    tune_params_keys: tuple[str, ...]
    table: pd.DataFrame
    objective: str = "time"
    higher_is_better: bool = False

    @property
    def is_gemm(self) -> bool:
        return all(key in self.tune_params_keys for key in GEMM_KEYS)

    @property
    def valid(self) -> pd.DataFrame:
        """The rows that ran (a positive, finite objective)."""
        return self.table[self.table["valid"]]

    def gemm(self) -> KernelTunerGemm:
        """The GEMM this space solves (M, N from the header; K recovered, see the module doc)."""
        if not self.is_gemm:
            raise InputError(f"{self.path}: kernel {self.kernel_name!r} is not a GEMM space")
        m = int(self.problem_size[0])
        n = int(self.problem_size[1]) if len(self.problem_size) > 1 else m
        precisions = set(self.table["PRECISION"]) if "PRECISION" in self.table else {32}
        if len(precisions) != 1:
            # One problem has one element type: the rows of each precision are separate spaces.
            raise InputError(f"{self.path}: configurations of several precisions {precisions}")
        return KernelTunerGemm(m, n, _recover_k(self.table, m, n), int(precisions.pop()))

    def label(self) -> str:
        """The space's name in reports: "<device> GEMM MxNxK", else "<device> <kernel> <size>"."""
        # An empty device name would make two devices' caches of one kernel the same space.
        device = self.device_name or f"unknown device ({Path(self.path).name})"
        if self.is_gemm:
            g = self.gemm()
            return f"{device} GEMM {g.m}x{g.n}x{g.k}"
        return f"{device} {self.kernel_name} {'x'.join(map(str, self.problem_size))}"


def _recover_k(table: pd.DataFrame, m: int, n: int) -> int:
    if "GFLOP/s" in table and table["valid"].any():
        valid = table[table["valid"]]
        gflops = pd.to_numeric(valid["GFLOP/s"], errors="coerce").to_numpy(dtype=np.float64)
        seconds = valid["time_ms"].to_numpy(dtype=np.float64) * 1e-3
        estimate = np.nanmedian(gflops * 1e9 * seconds / (2.0 * m * n))
        if np.isfinite(estimate) and estimate >= 1:
            step = int(table["KWG"].max()) if "KWG" in table else 1
            return int(max(step, round(estimate / step) * step))
    return m


def _problem_size(raw: object) -> tuple[int, ...]:
    """The header's `problem_size`: a list of ints or one int (e.g. pnpoly's point count)."""
    if isinstance(raw, (int, float, str)):
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        raise TypeError(f"problem_size {raw!r}")
    return tuple(int(s) for s in raw)


def _parameter_column(column: pd.Series) -> pd.Series:
    """A parameter's values: numbers where they all are numbers, else the values as strings."""
    try:
        return pd.to_numeric(column)
    except (TypeError, ValueError):
        if column.isna().any() or column.map(lambda v: isinstance(v, (dict, list))).any():
            raise
        return column.astype(str)


def objective_direction(objective: str, given: object = None) -> bool:
    """Whether higher is better for `objective`: the header's `objective_higher_is_better` when it
    is a boolean, else lower for time and energy and higher for rates (Kernel Tuner's defaults)."""
    if isinstance(given, bool):
        return given
    name = objective.strip().lower()
    if name in LOWER_IS_BETTER:
        return False
    return bool(re.search(r"/\s*[swj]$|flops", name))


def _loads_open_or_closed(text: bytes, path: Path) -> object:
    """The cache's JSON; a cache Kernel Tuner left open (it appends one entry per benchmark and
    closes the file at the end, so an interrupted or running tuning leaves `..., "cache": {entry,`)
    is read as Kernel Tuner reads it: closed after its last complete entry."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        body = text.rstrip()
        if b'"cache"' not in body or not body.endswith((b",", b"}")):
            raise
        data = json.loads(body.rstrip(b",") + b"}\n}")
        logger.warning("%s: an open Kernel Tuner cache (a tuning run was interrupted or still "
                       "writes it): read the entries it holds", path)
        return data


def _with_parameters(cache: dict[str, Any], keys: tuple[str, ...], tune_params: object) -> list[Any]:
    """The cache's entries, each with every parameter: an entry that lacks one (older caches keep
    only results in the entry) takes it from its cache key, Kernel Tuner's comma-joined values
    in `tune_params_keys` order, read back as the `tune_params` value that prints the same."""
    values = tune_params if isinstance(tune_params, dict) else {}
    known: dict[str, dict[str, Any]] | None = None  # printed value -> value, built when needed
    entries: list[Any] = []
    for cache_key, entry in cache.items():
        if isinstance(entry, dict) and not all(k in entry for k in keys):
            tokens = str(cache_key).split(",")
            if len(tokens) == len(keys):
                if known is None:
                    known = {k: {str(v): v for v in values.get(k, [])
                                 if not isinstance(v, (dict, list))} for k in keys}
                entry = {**{k: known[k].get(t, t) for k, t in zip(keys, tokens, strict=True)},
                         **entry}
        entries.append(entry)
    return entries


def _read_json(path: Path) -> dict[str, object]:
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = _loads_open_or_closed(text, path)
    except FileNotFoundError as exc:
        raise InputError(f"Kernel Tuner cache not found: {path}") from exc
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"corrupt Kernel Tuner cache {path}: {reason}") from exc
    if not isinstance(data, dict):
        raise InputError(f"corrupt Kernel Tuner cache {path}: top level is not an object")
    return data


def load_kerneltuner(path: str | Path) -> KernelTunerSpace:
    """Load a Kernel Tuner cache into a `KernelTunerSpace` (see the module doc for the columns)."""
    path = Path(path)
    data = _read_json(path)
    try:
        keys = tuple(str(k) for k in data["tune_params_keys"])  # type: ignore[attr-defined]
        cache = data["cache"]
        device = str(data.get("device_name", ""))
        kernel = str(data.get("kernel_name", ""))
        size = _problem_size(data.get("problem_size", ()))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"corrupt Kernel Tuner cache {path}: missing or bad header {exc}") from exc
    if not isinstance(cache, dict) or not cache:
        raise InputError(f"corrupt Kernel Tuner cache {path}: 'cache' is empty or not an object")
    objective = str(data.get("objective") or "time")
    higher = objective_direction(objective, data.get("objective_higher_is_better"))
    wanted = list(dict.fromkeys([*keys, "time", "GFLOP/s", objective]))
    try:
        entries = _with_parameters(cache, keys, data.get("tune_params"))
        table = pd.DataFrame.from_records(entries, columns=wanted)
        for key in keys:
            table[key] = _parameter_column(table[key])
    except (TypeError, ValueError) as exc:
        raise InputError(f"corrupt Kernel Tuner cache {path}: bad configuration entry ({exc})") from exc
    if table[list(keys)].isna().any().any():
        raise InputError(f"corrupt Kernel Tuner cache {path}: a configuration lacks a parameter")
    numeric_time = pd.to_numeric(table["time"], errors="coerce")
    ran = numeric_time.notna() & np.isfinite(numeric_time)
    value = pd.to_numeric(table[objective], errors="coerce").to_numpy(dtype=np.float64)
    if objective != "time" and not np.isfinite(value).any():
        logger.warning("%s: no entry carries the objective %r; ranking by time", path, objective)
        objective, higher, value = "time", False, numeric_time.to_numpy(dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        cost = 1.0 / value if higher else value
    # A failed configuration's objective is missing, an error string, or a sentinel such as 0 GFLOP/s.
    valid = ran.to_numpy() & np.isfinite(cost) & (cost > 0)
    table["time_ms"] = numeric_time.where(ran).astype(np.float64)
    table["cost"] = np.where(valid, cost, np.nan)
    table["valid"] = valid
    table["status"] = np.where(valid, "ok", np.where(ran, f"no {objective}", table["time"].astype(str)))
    table["device"] = device
    table = table.drop(columns=[c for c in dict.fromkeys(["time", objective]) if c != "GFLOP/s"])
    table.insert(0, "candidate_id", np.arange(len(table)))
    return KernelTunerSpace(str(path), kernel, device, size, keys, table, objective, higher)

