"""Checking candidates against the compiler default on seeded random inputs.

The dispatch benchmark has no outputs to compare, so verification works at the function level:
`Problem.to_mlir()` is compiled with the candidate's spec (the matcher is exact-shape, so it applies
there too), run with `iree-run-module` on random inputs stored as raw binary files, and its output
is compared with the default build's. Raw files (not .npy) carry every element type, bf16 and f8
included. A mismatch is a miscompile: a tuner is also a compiler fuzzer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dispatchtune.measure.process import ProcessResult, run_process
from dispatchtune.problem import Problem
from dispatchtune.toolchain import tool_path


def numpy_dtype(element_type: str) -> np.dtype | None:
    """numpy dtype of an MLIR element type (None when numpy/ml_dtypes cannot hold it)."""
    import ml_dtypes

    table: dict[str, object] = {
        "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
        "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
        "f8E4M3FNUZ": ml_dtypes.float8_e4m3fnuz, "f8E5M2FNUZ": ml_dtypes.float8_e5m2fnuz,
        "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2,
    }
    found = table.get(element_type)
    return np.dtype(found) if found is not None else None  # type: ignore[call-overload]


def tolerance(element_type: str) -> float:
    """Allowed max |candidate - default| relative to max |default| for an output element type.

    Candidates change the reduction order, so floats differ by rounding: f32 accumulates about
    1e-6 relative error on these sizes (1e-4 leaves room for long reductions); 16-bit floats keep
    3 significant digits; integers are exact.
    """
    if element_type in ("f64", "f32"):
        return 1e-4
    if element_type in ("f16", "bf16"):
        return 1e-2
    if element_type.startswith("f8"):
        return 1.25e-1
    return 0.0


@dataclass(frozen=True)
class VerifyInputs:
    """Random inputs of one problem written to disk, and the `--input=` flags that load them."""

    flags: tuple[str, ...]
    output_type: str
    output_shape: tuple[int, ...]
    output_dtype: np.dtype | None

    @property
    def supported(self) -> bool:
        return self.output_dtype is not None and bool(self.flags)


def write_inputs(problem: Problem, directory: Path, seed: int = 0) -> VerifyInputs:
    """Write seeded random inputs for `problem.to_mlir()` (one raw file per argument)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    flags: list[str] = []
    for i, (shape, etype) in enumerate(
        zip(problem.operand_shapes[:-1], problem.element_types[:-1], strict=True)
    ):
        dtype = numpy_dtype(etype)
        if dtype is None:
            return VerifyInputs((), problem.output_type, problem.operand_shapes[-1], None)
        if np.issubdtype(dtype, np.integer):
            values = rng.integers(-4, 5, size=shape).astype(dtype)
        else:
            values = rng.standard_normal(size=shape).astype(np.float32).astype(dtype)
        path = directory / f"input{i}.bin"
        values.tofile(path)
        dims = "x".join(str(d) for d in shape)
        flags.append(f"--input={dims}x{etype}=@{path}")
    return VerifyInputs(
        tuple(flags),
        problem.output_type,
        tuple(problem.operand_shapes[-1]),
        numpy_dtype(problem.output_type),
    )


def run_function(
    vmfb: Path, device: str, inputs: VerifyInputs, out_path: Path, timeout: float
) -> tuple[ProcessResult, np.ndarray | None]:
    """Run `main` of a function-level build on `device`; return the process and its output."""
    out_path.unlink(missing_ok=True)
    result = run_process(
        [
            tool_path("iree-run-module"),
            f"--module={vmfb}",
            f"--device={device}",
            "--function=main",
            *inputs.flags,
            f"--output=@{out_path}",
        ],
        timeout,
    )
    if not result.ok or not out_path.exists() or inputs.output_dtype is None:
        return result, None
    data = np.fromfile(out_path, dtype=inputs.output_dtype)
    if data.size != int(np.prod(inputs.output_shape)):
        return result, None
    return result, data.reshape(inputs.output_shape)


def compare(output: np.ndarray, reference: np.ndarray, element_type: str) -> tuple[str, float]:
    """(`ok` | `mismatch`, max absolute error) of a candidate output against the default's."""
    got = output.astype(np.float64)
    want = reference.astype(np.float64)
    if got.shape != want.shape:
        return "mismatch", float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)):
        return "mismatch", float("inf")
    diff = np.abs(got[finite] - want[finite])
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(want[finite]).max()) if diff.size else 0.0
    allowed = tolerance(element_type) * max(scale, 1.0)
    return ("ok" if max_abs <= allowed else "mismatch"), max_abs
