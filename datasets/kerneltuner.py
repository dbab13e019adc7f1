"""Kernel Tuner cache files (fully measured GPU search spaces) as candidate tables.

A cache (`.json` or `.json.gz`) holds a header (`kernel_name`, `device_name`, `problem_size`,
`tune_params_keys`, `tune_params`) and `cache`: one entry per configuration with its parameters and
`time` (mean, ms) or, for an invalid configuration, a string such as "CompilationFailedConfig".

`load_kerneltuner` returns one row per configuration: the raw parameters, `time_ms` (NaN when
invalid), `valid`, `status`, `device`, and, for CLBlast-style GEMM kernels (MWG, NWG, KWG, ...), the
mapping onto the common candidate vocabulary, so `dispatchtune.features` computes the same features
for these spaces as for IREE candidates:

| Kernel Tuner | candidate column | meaning |
|---|---|---|
| MWG, NWG, KWG | tile_m, tile_n, tile_k | workgroup tile, elements |
| MDIMC * NDIMC | workgroup_threads | threads per workgroup (thread grid MDIMC x NDIMC) |
| (32) | subgroup_size | NVIDIA warp |
| MDIMC, NDIMC | subgroups_m, subgroups_n | warps along M / N (see below) |
| MWG / subgroups_m, NWG / subgroups_n | vec_m, vec_n | per-subgroup (warp) tile, elements |
| VWM, VWN | load_vec_m, load_vec_n | elements per vectorised load of A / B |
| SA, SB | shared_lhs, shared_rhs | A / B staged in shared memory (0/1) |
| PRECISION | element bytes | 32 -> 4 bytes (f32), 16 -> 2 bytes (f16), 64 -> 8 |
| (none) | mma_m/n/k = 1 | scalar FMA, no matrix intrinsic |

A warp spans min(MDIMC, 32) threads along M (the fastest thread index) and 32 / that along N,
so subgroups_m = MDIMC / min(MDIMC, 32) and subgroups_n = NDIMC / (32 / min(MDIMC, 32)).

The GEMM's M and N are the header's `problem_size`; K is not in the header, so it is recovered from
the measured `GFLOP/s` and `time` (FLOPs = 2*M*N*K), falling back to K = M when those are missing.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.features.extract import ProblemScalars, TargetScalars, features_frame

#: Hardware facts of the devices in the public Kernel Tuner caches (vendor specifications: SM
#: count, 4 sub-partitions per SM, shared memory per SM, 64K 32-bit registers per SM = 512 per
#: lane of each sub-partition). Matched by a case-insensitive substring of `device_name`.
KT_DEVICES: dict[str, TargetScalars] = {
    "2080 ti": TargetScalars(
        is_gpu=True, compute_units=68, simds_per_cu=4, max_workgroup_memory_bytes=65536,
        registers_per_simd=512, subgroup_size=32,
    ),
    "titan rtx": TargetScalars(
        is_gpu=True, compute_units=72, simds_per_cu=4, max_workgroup_memory_bytes=65536,
        registers_per_simd=512, subgroup_size=32,
    ),
    "a4000": TargetScalars(
        is_gpu=True, compute_units=48, simds_per_cu=4, max_workgroup_memory_bytes=102400,
        registers_per_simd=512, subgroup_size=32,
    ),
}

_GEMM_KEYS = ("MWG", "NWG", "KWG", "MDIMC", "NDIMC")
_WARP = 32


@dataclass(frozen=True)
class KernelTunerSpace:
    """One loaded cache: header facts and the per-configuration table."""

    path: str
    kernel_name: str
    device_name: str
    problem_size: tuple[int, ...]
    tune_params_keys: tuple[str, ...]
    table: pd.DataFrame

    @property
    def is_gemm(self) -> bool:
        return all(key in self.tune_params_keys for key in _GEMM_KEYS)

    @property
    def valid(self) -> pd.DataFrame:
        """The rows that ran (a numeric `time`)."""
        return self.table[self.table["valid"]]

    def problem_scalars(self) -> ProblemScalars:
        """The GEMM this space solves (M, N from the header; K recovered, see the module doc)."""
        if not self.is_gemm:
            raise InputError(f"{self.path}: kernel {self.kernel_name!r} is not a GEMM space")
        m = int(self.problem_size[0])
        n = int(self.problem_size[1]) if len(self.problem_size) > 1 else m
        k = _recover_k(self.table, m, n)
        precisions = set(self.table["PRECISION"]) if "PRECISION" in self.table else {32}
        if len(precisions) != 1:
            # One problem has one element type: the rows of each precision are separate spaces.
            raise InputError(f"{self.path}: configurations of several precisions {precisions}")
        bits = int(precisions.pop())
        elem = bits / 8
        return ProblemScalars(
            kind="contraction", b=1, m=m, n=n, k=k, lhs_bytes=elem, rhs_bytes=elem,
            out_bytes=elem, flops=2.0 * m * n * k,
        )

    def target_scalars(self) -> TargetScalars:
        return device_facts(self.device_name)

    def features(self, rows: pd.DataFrame | None = None) -> pd.DataFrame:
        """The common feature table of this space's rows (all rows by default)."""
        table = self.table if rows is None else rows
        return features_frame(table, self.problem_scalars(), self.target_scalars())


def device_facts(device_name: str) -> TargetScalars:
    """Hardware scalars of a Kernel Tuner device; unknown devices raise a one-line error."""
    wanted = device_name.lower()
    for key, facts in KT_DEVICES.items():
        if key in wanted:
            return facts
    known = ", ".join(KT_DEVICES)
    raise InputError(f"no hardware facts for device {device_name!r}; known: {known}")


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


def _read_json(path: Path) -> dict[str, object]:
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        data = json.loads(text)
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
        size = tuple(int(s) for s in data.get("problem_size", ()))  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"corrupt Kernel Tuner cache {path}: missing or bad header {exc}") from exc
    if not isinstance(cache, dict) or not cache:
        raise InputError(f"corrupt Kernel Tuner cache {path}: 'cache' is empty or not an object")
    wanted = [*keys, "time", "GFLOP/s"]
    try:
        table = pd.DataFrame.from_records(list(cache.values()), columns=wanted)
        for key in keys:
            table[key] = pd.to_numeric(table[key])
    except (TypeError, ValueError) as exc:
        raise InputError(f"corrupt Kernel Tuner cache {path}: bad configuration entry ({exc})") from exc
    if table[list(keys)].isna().any().any():
        raise InputError(f"corrupt Kernel Tuner cache {path}: a configuration lacks a parameter")
    numeric_time = pd.to_numeric(table["time"], errors="coerce")
    valid = numeric_time.notna() & np.isfinite(numeric_time)
    table["time_ms"] = numeric_time.where(valid).astype(np.float64)
    table["valid"] = valid.to_numpy()
    table["status"] = np.where(valid, "ok", table["time"].astype(str))
    table["device"] = device
    table = table.drop(columns=["time"])
    table.insert(0, "candidate_id", np.arange(len(table)))
    space = KernelTunerSpace(str(path), kernel, device, size, keys, table)
    if space.is_gemm:
        _map_gemm(table)
    return space


def _map_gemm(table: pd.DataFrame) -> None:
    """Add the common candidate columns for a CLBlast-style GEMM space (see the module doc)."""

    def col(name: str, default: float) -> np.ndarray:
        if name in table:
            return table[name].to_numpy(dtype=np.float64)
        return np.full(len(table), default)

    mwg, nwg, kwg = col("MWG", 1), col("NWG", 1), col("KWG", 1)
    mdimc, ndimc = col("MDIMC", 1), col("NDIMC", 1)
    if (mdimc <= 0).any() or (ndimc <= 0).any():
        raise DispatchTuneError("Kernel Tuner GEMM space has a non-positive MDIMC/NDIMC")
    threads = mdimc * ndimc
    warp_m = np.minimum(mdimc, _WARP)  # threads of one warp along M (M is the fastest index)
    warp_n = np.maximum(_WARP / warp_m, 1.0)
    sg_m = np.maximum(mdimc / warp_m, 1.0)
    sg_n = np.maximum(ndimc / warp_n, 1.0)
    table["pipeline"] = "KernelTuner"
    table["tile_b"] = 1
    table["tile_m"] = mwg
    table["tile_n"] = nwg
    table["tile_k"] = kwg
    table["vec_m"] = mwg / sg_m
    table["vec_n"] = nwg / sg_n
    table["mma_m"] = 1
    table["mma_n"] = 1
    table["mma_k"] = 1
    table["subgroups_m"] = sg_m
    table["subgroups_n"] = sg_n
    table["subgroup_size"] = _WARP
    table["workgroup_threads"] = threads
    table["prefetch_stages"] = 0
    table["load_vec_m"] = col("VWM", 1)
    table["load_vec_n"] = col("VWN", 1)
    table["shared_lhs"] = col("SA", 1)
    table["shared_rhs"] = col("SB", 1)
