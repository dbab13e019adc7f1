"""Checking candidates against the compiler default on seeded random inputs.

The dispatch benchmark has no outputs to compare, so dispatch verification works at the function
level: `Problem.to_mlir()` is compiled with the candidate's spec (the matcher is exact-shape, so it
applies there too), run on random inputs stored as raw binary files, and its output is compared
with the default build's. Whole-model tuning checks a model build against the default build the
same way. Raw files (not .npy) carry every element type, bf16 and f8 included. A mismatch is a
miscompile: a tuner is also a compiler fuzzer. Running the builds is the runner's (`runner.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dispatchtune.problem import Problem


def numpy_dtype(element_type: str) -> np.dtype | None:
    """numpy dtype of an MLIR element type (None when numpy/ml_dtypes cannot hold it)."""
    import ml_dtypes

    table: dict[str, object] = {
        "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
        "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8,
        "i1": np.bool_,  # one byte per element at IREE's ABI, as numpy stores bools
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
class TensorType:
    """A statically shaped tensor of a function's signature."""

    shape: tuple[int, ...]
    element_type: str

    @property
    def flag(self) -> str:
        """`--input=` type prefix, e.g. `128x256xf32`."""
        return "x".join([*(str(d) for d in self.shape), self.element_type])


@dataclass(frozen=True)
class Call:
    """One function of a module with its `--input=` flags, and the results it returns."""

    function: str
    inputs: tuple[str, ...]
    results: tuple[TensorType, ...]


def write_random_inputs(
    tensors: Sequence[TensorType], directory: Path, seed: int, scale: float = 1.0,
    int_ranges: Sequence[tuple[int, int] | None] = (),
) -> tuple[str, ...] | None:
    """Seeded random inputs as raw files, one per tensor; returns the `--input=` flags that load
    them (None when numpy cannot hold an element type). Floats are normal(0, `scale`), integers
    uniform in `int_ranges[i]` = [low, high) where given (token ids, indices), else in [-4, 4]
    (small, so integer accumulation never overflows), booleans (i1) 0 or 1."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    flags: list[str] = []
    for i, tensor in enumerate(tensors):
        dtype = numpy_dtype(tensor.element_type)
        if dtype is None:
            return None
        if dtype == np.bool_:
            # Masks: half set, so that either convention (True keeps or drops a key) leaves
            # rows with keys to attend to.
            values = rng.integers(0, 2, size=tensor.shape).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            low, high = (int_ranges[i] if i < len(int_ranges) else None) or (-4, 5)
            values = rng.integers(low, high, size=tensor.shape).astype(dtype)
        else:
            normal = rng.standard_normal(size=tensor.shape)
            values = (normal if scale == 1.0 else scale * normal).astype(np.float32).astype(dtype)
        path = directory / f"input{i}.bin"
        values.tofile(path)
        flags.append(f"--input={tensor.flag}=@{path}")
    return tuple(flags)


def problem_call(problem: Problem, directory: Path, seed: int = 0) -> Call | None:
    """`main` of `problem.to_mlir()` with seeded random inputs written to `directory`; None when
    numpy cannot hold one of its element types (bf16 and f8 it can, through ml_dtypes)."""
    shapes = [tuple(int(d) for d in s) for s in problem.operand_shapes]
    tensors = [TensorType(s, t) for s, t in zip(shapes, problem.element_types, strict=True)]
    if numpy_dtype(problem.output_type) is None:
        return None
    inputs = tensors[:-1]
    if problem.mask_map:  # `main`'s last argument (`Problem.to_mlir`): without it the call fails
        inputs.append(TensorType(problem.mask_shape, problem.mask_type))
    flags = write_random_inputs(inputs, directory, seed)
    if flags is None:
        return None
    return Call("main", flags, (TensorType(shapes[-1], problem.output_type),))


def read_outputs(paths: Sequence[Path], results: Sequence[TensorType]) -> list[np.ndarray] | None:
    """The raw output files of a run as arrays (None when one is missing or of the wrong size)."""
    outputs = []
    for path, tensor in zip(paths, results, strict=True):
        dtype = numpy_dtype(tensor.element_type)
        if dtype is None or not path.exists():
            return None
        data = np.fromfile(path, dtype=dtype)
        if data.size != int(np.prod(tensor.shape)):
            return None
        outputs.append(data.reshape(tensor.shape))
    return outputs


def compare(
    outputs: Sequence[np.ndarray], references: Sequence[np.ndarray], element_types: Sequence[str]
) -> tuple[str, float]:
    """(`ok` | `mismatch`, max absolute error) of a build's outputs against the default build's."""
    status, worst = "ok", 0.0
    for output, reference, element_type in zip(outputs, references, element_types, strict=True):
        one, max_abs = _compare_one(output, reference, element_type)
        worst = max(worst, max_abs)
        if one != "ok":
            status = one
    return status, worst


def _compare_one(output: np.ndarray, reference: np.ndarray, element_type: str) -> tuple[str, float]:
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
