"""Torch-dialect input: lower iree-turbine exports to what the rest of dispatchtune reads.

iree-turbine's `aot.export(...).save_mlir()` writes `!torch.vtensor` functions. They are lowered
once with IREE's own torch input pipeline (`iree-compile --iree-input-type=torch
--compile-to=input`: torch -> linalg on tensors, SDPA -> `iree_linalg_ext.attention`), and the
result is cached under the input's content hash, so a 100 MB export is hashed in one streaming
pass (never held in Python) and lowered by IREE only the first time it is seen.

`tune-model` benchmarks the model's own function with tensor inputs, which IREE's input phase wraps
in its `!hal.buffer_view` ABI; `lower_torch_to_function` runs the same pipeline (`torch-to-iree`)
with synchronous entry points instead, so the result is a plain `util.func public @main(tensor...)
-> tensor...` that IREE compiles like any tensor function.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from dispatchtune.errors import InputError
from dispatchtune.toolchain import first_error_line, run_tool

logger = logging.getLogger(__name__)

_TORCH_MARKER = b"!torch.vtensor"
_CHUNK = 1 << 20


def cache_dir() -> Path:
    """Where lowered inputs are kept (`$DISPATCHTUNE_CACHE`, else ~/.cache/dispatchtune)."""
    root = os.environ.get("DISPATCHTUNE_CACHE") or Path.home() / ".cache" / "dispatchtune"
    return Path(root) / "lowered"


_SCANNED: dict[tuple[str, int, int], tuple[str, bool]] = {}


def scan_input(path: Path) -> tuple[str, bool]:
    """(sha256 of the file, whether it is torch dialect), in one streaming pass.

    Remembered per (path, mtime, size) for the process, so the callers that need the hash (the
    lowering cache, a tune-model directory's identity) do not read a large file twice.
    """
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _SCANNED:
        _SCANNED[key] = _scan(path)
    return _SCANNED[key]


def _scan(path: Path) -> tuple[str, bool]:
    digest = hashlib.sha256()
    is_torch = False
    tail = b""
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            # Keep a short overlap so a marker split across two chunks is still found.
            is_torch = is_torch or _TORCH_MARKER in tail + chunk
            tail = chunk[-len(_TORCH_MARKER) :]
    return digest.hexdigest(), is_torch


# IREE's own torch input pipeline (the one `--iree-input-type=torch` runs: weights held as
# `util.global`s, as iree-turbine writes them, are legal there; torch-mlir's backend pipeline
# rejects them), with its lightweight synchronous entry points: a public `util.func @main` on
# tensors, no `!hal.buffer_view` wrapping. SDPA becomes `iree_linalg_ext.attention` as in IREE.
_FUNCTION_PIPELINE = "builtin.module(torch-to-iree{emit-async-entry-points=false})"


def lower_if_torch(path: Path) -> Path:
    """`path` itself, or for a torch-dialect file its lowering to IREE input (cached)."""
    return _lower(path, "input")


def lower_torch_to_function(path: Path) -> Path:
    """`path` itself, or for a torch-dialect file a plain tensor-function module (cached)."""
    return _lower(path, "function")


def _lower(path: Path, form: str) -> Path:
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    digest, is_torch = scan_input(path)
    if not is_torch:
        return path
    out = cache_dir() / (f"{digest}.mlir" if form == "input" else f"{digest}.{form}.mlir")
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    if form == "input":
        tool, args = "iree-compile", ["--iree-input-type=torch", "--compile-to=input"]
    else:
        tool, args = "iree-opt", [f"--pass-pipeline={_FUNCTION_PIPELINE}"]
    proc = run_tool(tool, [str(path), *args, "-o", str(tmp)], timeout=600.0)
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise InputError(
            f"IREE's torch input pipeline rejected {path}: {first_error_line(proc.stderr)}"
        )
    tmp.replace(out)  # atomic: a concurrent reader never sees half a file
    logger.info("lowered torch-dialect %s to %s (%s)", path, out, form)
    return out
