"""Whole-model tuning: from a model's MLIR to one tuning spec with a measured end-to-end speedup.

`tune_model(path, target, output_dir, options)`:

1. compile the model with the target's flags (the compiler default) and profile it with
   `iree-benchmark-module --dispatch_statistics` (per-dispatch time per call of the model);
2. attribute that time to tunable problems: a spec configures every dispatch of the same shape, so
   dispatches are grouped by problem key; pick the keys that cover `coverage` of the model's time;
3. share the candidate budget across them by expected gain (their time: the same relative speedup
   is worth more on a dispatch that takes more of the model) and tune each with the dispatch loop
   (`tuner.loop.tune` on the dumped benchmark of the key's slowest dispatch); all of them log to one
   `dispatches/results.jsonl` in the loop's format, so model runs feed `train-costmodel` too;
4. greedily, slowest key first, build the whole model with the spec kept so far plus each of the
   key's top few candidates, check that the config applied and that the model's outputs match the
   default build's, benchmark them in rounds interleaved with the current build, and keep the best
   candidate only if the model gets faster; the best dispatch in isolation can regress the model
   (other dispatches of the same shape, fusion, caches), so only the model decides;
5. measure the default and the final build interleaved, verify the final outputs once more, and
   write `tuning_spec.mlir`, `summary.md` and `model_tuning.png`.

Every model-level measurement and decision is appended to `model_log.jsonl` as soon as it is
known; a re-run with the same output directory reuses the profile, the dispatch results (the loop
resumes itself) and every model step whose inputs are unchanged, so nothing is measured twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.datasets.records import read_records
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.measure.process import ProcessResult, run_process
from dispatchtune.measure.verify import compare, numpy_dtype
from dispatchtune.problem import Problem
from dispatchtune.targets import Target, get_target
from dispatchtune.toolchain import iree_compiler_version, mlir_error_line, tool_path
from dispatchtune.tuner.loop import TuneOptions

MODEL_SCHEMA = "dispatchtune.model/1"
TIMERS = ("auto", "cpu", "real")


@dataclass
class ModelTuneOptions:
    """Knobs of `tune-model` (its CLI flags); `dispatch` holds the dispatch loop's own knobs."""

    budget: int = 30  # candidates benchmarked in all, shared across the selected dispatches
    coverage: float = 0.9  # tune the slowest problems until they cover this share of the model
    max_dispatches: int = 6
    # Below this share of the model a dispatch cannot pay back its tuning time: 2% of the model
    # at a typical 1.2x dispatch speedup is 0.3%, below the model's run-to-run noise here.
    min_share: float = 0.02
    min_per_dispatch: int = 2  # a dispatch gets at least this many benchmarks, or none
    top: int = 3  # candidates per dispatch tried in the whole model
    model_rounds: int = 5  # interleaved rounds per model-level decision
    final_rounds: int = 7  # interleaved rounds of default vs tuned at the end
    # A candidate is kept when its median paired model speedup beats this and it was faster in at
    # least two thirds of the rounds (one burst of outside load cannot make it look fast).
    min_model_speedup: float = 1.01
    repetitions: int = 5
    min_time_s: float = 0.05
    # Model time: `cpu` (process CPU time) or `real` (wall clock); `auto` = cpu on local-sync. A
    # local-sync run is one thread doing all the work, so its CPU time is the model's time minus
    # the time other processes held the core: measured here under load, the wall time of one
    # binary ranged 3.9-31.8 ms while its CPU time stayed within 2.9-4.0 ms.
    timer: str = "auto"
    function: str = ""  # entry function; default: the only public one (or `main`)
    device: str = ""  # default: the target's (local-sync for host)
    verify: bool = True
    seed: int = 0
    compile_timeout_s: float = 600.0
    benchmark_timeout_s: float = 300.0
    keep_binaries: bool = False
    progress: bool | None = None  # None: bars on a terminal, else one line per step
    dispatch: TuneOptions = field(default_factory=TuneOptions)

    def validate(self) -> None:
        if self.budget < 1:
            raise DispatchTuneError("--budget must be at least 1")
        if not 0.0 < self.coverage <= 1.0:
            raise DispatchTuneError("--coverage must be in (0, 1]")
        if self.max_dispatches < 1:
            raise DispatchTuneError("--max-dispatches must be at least 1")
        if self.top < 1:
            raise DispatchTuneError("--top must be at least 1")
        if self.model_rounds < 1 or self.final_rounds < 1:
            raise DispatchTuneError("--model-rounds and --final-rounds must be at least 1")
        if self.repetitions < 1:
            raise DispatchTuneError("--repetitions must be at least 1")
        if self.min_per_dispatch < 1:
            raise DispatchTuneError("--min-per-dispatch must be at least 1")
        if self.timer not in TIMERS:
            raise DispatchTuneError(f"--timer must be one of {', '.join(TIMERS)}")
        self.dispatch.validate()


# ---- the model's entry function and its inputs ---------------------------------------------------
@dataclass(frozen=True)
class TensorType:
    shape: tuple[int, ...]
    element_type: str

    @property
    def flag(self) -> str:
        """`--input=` type prefix, e.g. `128x256xf32`."""
        return "x".join([*(str(d) for d in self.shape), self.element_type])


@dataclass(frozen=True)
class EntryFunction:
    name: str
    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]


def _tensor_type(value_type: Any, what: str) -> TensorType:
    from iree.compiler import ir

    if not isinstance(value_type, ir.RankedTensorType):
        raise InputError(f"{what} is {value_type}; tune-model needs ranked tensor arguments/results")
    shaped = ir.RankedTensorType(value_type)
    if not shaped.has_static_shape:
        raise InputError(f"{what} has dynamic shape {value_type}; tune-model needs static shapes")
    return TensorType(tuple(int(d) for d in shaped.shape), str(shaped.element_type))


def find_entry(path: Path, function: str = "") -> EntryFunction:
    """The function to benchmark: `function`, else the only public one, else `main`."""
    from iree.compiler import ir

    from dispatchtune.ir.frontend import read_input

    text = read_input(path)
    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise InputError(f"malformed MLIR in {path}: {mlir_error_line(exc)}") from None
        public: dict[str, Any] = {}
        for op in module.body.operations:
            operation = op.operation
            if operation.name not in ("func.func", "util.func"):
                continue
            attrs = operation.attributes
            visibility = str(attrs["sym_visibility"]).strip('"') if "sym_visibility" in attrs else ""
            if visibility == "private" or not operation.regions[0].blocks:
                continue
            public[str(attrs["sym_name"]).strip('"')] = operation
        if not public:
            raise InputError(f"{path}: no public function to benchmark")
        if function:
            if function not in public:
                raise InputError(
                    f"{path}: no public function @{function} (found: {', '.join(sorted(public))})"
                )
            name = function
        elif len(public) == 1:
            name = next(iter(public))
        elif "main" in public:
            name = "main"
        else:
            raise InputError(
                f"{path}: several public functions ({', '.join(sorted(public))}); "
                "choose one with --function"
            )
        ftype = ir.FunctionType(ir.TypeAttr(public[name].attributes["function_type"]).value)
        inputs = tuple(
            _tensor_type(t, f"argument {i} of @{name}") for i, t in enumerate(ftype.inputs)
        )
        results = tuple(
            _tensor_type(t, f"result {i} of @{name}") for i, t in enumerate(ftype.results)
        )
    if not results:
        raise InputError(f"{path}: @{name} returns nothing to compare")
    return EntryFunction(name, inputs, results)


def write_model_inputs(entry: EntryFunction, directory: Path, seed: int) -> list[str]:
    """Seeded random inputs as raw files; returns the `--input=` flags that load them.

    Floats are normal(0, 0.1): weight-sized values keep softmax and layer-norm inputs in a range
    where f32 rounding differences between configurations stay far below the comparison tolerance.
    """
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    flags = []
    for i, tensor in enumerate(entry.inputs):
        dtype = numpy_dtype(tensor.element_type)
        if dtype is None:
            raise InputError(
                f"argument {i} of @{entry.name}: no random inputs for {tensor.element_type}"
            )
        if np.issubdtype(dtype, np.integer):
            values = rng.integers(-4, 5, size=tensor.shape).astype(dtype)
        else:
            values = (0.1 * rng.standard_normal(size=tensor.shape)).astype(np.float32).astype(dtype)
        path = directory / f"input{i}.bin"
        values.tofile(path)
        flags.append(f"--input={tensor.flag}=@{path}")
    return flags


# ---- building, running and benchmarking the model ------------------------------------------------
def compile_model(
    model: Path, target: Target, spec: Path | None, out: Path, timeout_s: float
) -> ProcessResult:
    """`iree-compile model <target flags> [spec] -o out`; a missing output counts as a failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    flags = list(target.compile_flags)
    if spec is not None:
        flags.append(f"{target.tuning_spec_flag}={spec}")
    result = run_process([tool_path("iree-compile"), str(model), *flags, "-o", str(out)], timeout_s)
    if result.ok and (not out.exists() or out.stat().st_size == 0):
        return ProcessResult("failed", result.returncode, result.stdout, result.stderr,
                             result.elapsed_s, "iree-compile exited 0 but wrote no binary")
    return result


def run_model(
    vmfb: Path, entry: EntryFunction, inputs: Sequence[str], device: str, out_dir: Path,
    timeout_s: float,
) -> tuple[ProcessResult, list[np.ndarray] | None]:
    """Run the entry function once; return the process and its outputs (None on failure)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"output{i}.bin" for i in range(len(entry.results))]
    for path in paths:
        path.unlink(missing_ok=True)
    result = run_process(
        [tool_path("iree-run-module"), f"--module={vmfb}", f"--device={device}",
         f"--function={entry.name}", *inputs, *(f"--output=@{p}" for p in paths)],
        timeout_s,
    )
    if not result.ok:
        return result, None
    outputs = []
    for path, tensor in zip(paths, entry.results, strict=True):
        dtype = numpy_dtype(tensor.element_type)
        if dtype is None or not path.exists():
            return result, None
        data = np.fromfile(path, dtype=dtype)
        if data.size != int(np.prod(tensor.shape)):
            return result, None
        outputs.append(data.reshape(tensor.shape))
        path.unlink()
    return result, outputs


def compare_outputs(
    outputs: Sequence[np.ndarray], reference: Sequence[np.ndarray], entry: EntryFunction
) -> tuple[str, float]:
    """(`ok` | `mismatch`, max |error|) over every output, with the dispatch loop's tolerances."""
    status, worst = "ok", 0.0
    for got, want, tensor in zip(outputs, reference, entry.results, strict=True):
        one, max_abs = compare(got, want, tensor.element_type)
        worst = max(worst, max_abs)
        if one != "ok":
            status = one
    return status, worst


@dataclass(frozen=True)
class DispatchRow:
    """One dispatch function's time in one model call (from `--dispatch_statistics`)."""

    name: str
    time_ms: float
    calls: int


_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


def benchmark_model(
    vmfb: Path, entry: EntryFunction, inputs: Sequence[str], device: str,
    repetitions: int, min_time_s: float, timeout_s: float, *, timer: str = "real",
    dispatch_statistics: bool = False,
) -> tuple[list[float], list[DispatchRow]]:
    """Each repetition's time of one model call (ms, `timer`: real | cpu) and, if asked, the
    per-dispatch rows (device time of each dispatch function per model call)."""
    command = [
        tool_path("iree-benchmark-module"), f"--module={vmfb}", f"--device={device}",
        f"--function={entry.name}", *inputs, f"--benchmark_repetitions={repetitions}",
        f"--benchmark_min_time={min_time_s:g}s", "--benchmark_format=json",
    ]
    if dispatch_statistics:
        command.append("--dispatch_statistics=true")
    result = run_process(command, timeout_s)
    if not result.ok:
        raise DispatchTuneError(f"benchmarking {vmfb.name} {result.status}: {result.error}")
    try:
        rows = json.loads(result.stdout).get("benchmarks", [])
    except ValueError as exc:
        raise DispatchTuneError(f"unreadable benchmark output for {vmfb.name}: {exc}") from None
    times: list[float] = []
    dispatches: list[DispatchRow] = []
    for row in rows:
        if row.get("run_type", "iteration") != "iteration":
            continue
        unit = _UNIT_MS[row.get("time_unit", "ns")]
        if "calls" in row:  # a dispatch row: time of that function per model call
            name = str(row["name"]).split("/", 1)[-1]
            dispatches.append(DispatchRow(name, float(row["real_time"]) * unit, int(row["calls"])))
        else:
            times.append(float(row["cpu_time" if timer == "cpu" else "real_time"]) * unit)
    if not times:
        raise DispatchTuneError(f"benchmarking {vmfb.name} reported no repetitions")
    if dispatch_statistics and not dispatches:
        raise DispatchTuneError(
            f"iree-benchmark-module gave no per-dispatch rows on {device}; "
            "--dispatch_statistics needs a backend with lightweight HAL profiling"
        )
    return times, dispatches


# ---- where the time goes -------------------------------------------------------------------------
@dataclass
class DispatchShare:
    """A tunable problem of the model: its dispatches, their time, the budget it gets."""

    problem: Problem
    dispatches: list[str]
    calls: int
    time_ms: float
    share: float
    slowest: str  # the dispatch whose dumped benchmark is tuned
    budget: int = 0

    @property
    def key(self) -> str:
        return self.problem.key


_DISPATCH_INDEX = re.compile(r"_dispatch_(\d+)(?:_|$)")


def dispatch_index(name: str) -> int | None:
    match = _DISPATCH_INDEX.search(name)
    return int(match.group(1)) if match else None


def attribute_time(
    rows: Sequence[DispatchRow], problems: Sequence[Problem]
) -> tuple[list[DispatchShare], float, float]:
    """Group the profiled dispatches by problem key; returns (shares by time, other ms, total ms).

    A spec matches by shape, so all dispatches of one key share its configuration and its time.
    Dispatches without a tunable root op (elementwise, reductions) are `other`.
    """
    by_index: dict[int, Problem] = {}
    for candidate in problems:
        position = dispatch_index(candidate.name)
        if position is not None and position not in by_index:
            by_index[position] = candidate
    total = sum(r.time_ms for r in rows)
    groups: dict[str, DispatchShare] = {}
    slowest_ms: dict[str, float] = {}
    other = 0.0
    for row in rows:
        index = dispatch_index(row.name)
        problem = by_index.get(index) if index is not None else None
        if problem is None:
            other += row.time_ms
            continue
        group = groups.get(problem.key)
        if group is None:
            group = groups[problem.key] = DispatchShare(problem, [], 0, 0.0, 0.0, row.name)
            slowest_ms[problem.key] = -1.0
        group.dispatches.append(row.name)
        group.calls += row.calls
        group.time_ms += row.time_ms
        if row.time_ms > slowest_ms[problem.key]:
            slowest_ms[problem.key], group.slowest = row.time_ms, row.name
    shares = sorted(groups.values(), key=lambda g: g.time_ms, reverse=True)
    for group in shares:
        group.share = group.time_ms / total if total > 0 else 0.0
    return shares, other, total


def select_dispatches(
    shares: Sequence[DispatchShare], coverage: float, max_dispatches: int, min_share: float
) -> list[DispatchShare]:
    """The slowest problems until they cover `coverage` of the model's time."""
    chosen: list[DispatchShare] = []
    covered = 0.0
    for share in shares:  # slowest first
        if covered >= coverage or len(chosen) >= max_dispatches or share.share < min_share:
            break
        chosen.append(share)
        covered += share.share
    return chosen


def allocate_budget(weights: Sequence[float], budget: int, min_each: int) -> list[int]:
    """Split `budget` in proportion to `weights`, each entry getting at least `min_each`.

    Entries whose proportional part is below `min_each` are raised to it and the rest is shared
    by the others in proportion; rounding gives the leftovers to the largest remainders. When the
    budget cannot give every entry `min_each`, the lightest entries (weights come sorted, heaviest
    first) get 0: a dispatch measured once cannot be judged against the default's noise anyway.
    """
    count = len(weights)
    while count > 1 and count * min_each > budget:
        count -= 1
    alloc = [0] * len(weights)
    if count == 0 or budget <= 0:
        return alloc
    floor = min(min_each, budget // count)
    w = np.asarray(weights[:count], dtype=float)
    w = w if w.sum() > 0 else np.ones(count)
    exact = np.zeros(count)
    fixed = np.zeros(count, dtype=bool)
    while True:
        free = ~fixed
        exact[free] = (budget - floor * fixed.sum()) * w[free] / w[free].sum()
        exact[fixed] = floor
        low = free & (exact < floor)
        if not low.any():
            break
        fixed |= low
    whole = np.floor(exact).astype(int)
    order = np.argsort(-(exact - whole), kind="stable")
    for i in order[: budget - int(whole.sum())]:
        whole[i] += 1
    for i in range(count):
        alloc[i] = int(whole[i])
    return alloc


# ---- the model log -------------------------------------------------------------------------------
class ModelLog:
    """`model_log.jsonl`: profile, model-level steps and the final measurement, appended durably."""

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
                self.records.append(record)

    def find(self, kind: str, **match: Any) -> dict[str, Any] | None:
        """The latest record of `kind` whose fields equal `match`."""
        for record in reversed(self.records):
            if record.get("kind") == kind and all(record.get(k) == v for k, v in match.items()):
                return record
        return None

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        record = {"schema": MODEL_SCHEMA, "kind": kind, "timestamp": time.time(), **fields}
        line = json.dumps(record, sort_keys=True)
        # A killed run may leave a torn last line: start on a fresh one.
        torn = self.path.exists() and self.path.stat().st_size > 0 and not self.path.read_bytes(
        ).endswith(b"\n")
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(("\n" if torn else "") + line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.records.append(record)
        return record


# ---- results -------------------------------------------------------------------------------------
@dataclass
class ModelStep:
    """One model-level decision: a key's top candidates built into the model and benchmarked."""

    key: str
    tried: list[dict[str, Any]]  # candidate_id, dispatch_speedup, model_speedup, status, ...
    kept: int | None  # candidate id kept, None when the model did not get faster
    note: str = ""


@dataclass
class ModelTuneResult:
    output_dir: Path
    spec_path: Path
    summary_path: Path
    plot_path: Path | None
    results_path: Path
    default_ms: list[float]
    tuned_ms: list[float]
    speedup: float
    speedup_low: float
    speedup_high: float
    verify_status: str
    max_abs_error: float | None
    shares: list[DispatchShare]
    other_ms: float
    steps: list[ModelStep]
    kept: dict[str, int]
    text: str = ""


# ---- the flow ------------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _ModelTuner:
    def __init__(
        self, model: Path, target: Target, out: Path, options: ModelTuneOptions
    ) -> None:
        self.model = model
        self.target = target
        self.out = out
        self.options = options
        self.work = out / "work"
        self.log = ModelLog(out / "model_log.jsonl")
        self.entry = find_entry(model, options.function)
        self.device = options.device or target.device_uri
        self.timer = options.timer
        if self.timer == "auto":
            self.timer = "cpu" if self.device.startswith("local-sync") else "real"
        self.model_sha = _sha256(model)
        self.inputs = write_model_inputs(self.entry, self.work / "inputs", options.seed)
        self.reference: list[np.ndarray] | None = None
        self.verify_note = ""
        self.builds: dict[str, Path] = {}
        self.problems: dict[str, Problem] = {}
        self.candidate_info: dict[tuple[str, int], str] = {}
        if options.progress is None:
            self.mode = "bar" if sys.stderr.isatty() else "lines"
        else:
            self.mode = "bar" if options.progress else "off"

    def say(self, text: str) -> None:
        if self.mode != "off":
            print(f"tune-model: {text}", file=sys.stderr, flush=True)

    # -- identity of the run (a results directory belongs to one model, target and device) ------
    def _check_identity(self) -> None:
        profile = self.log.find("profile")
        if profile is None:
            return
        for name, value in (("model_sha256", self.model_sha), ("target", self.target.name),
                            ("device", self.device), ("function", self.entry.name)):
            if profile.get(name) != value:
                raise DispatchTuneError(
                    f"{self.out} holds a tune-model run of another {name.split('_')[0]} "
                    f"({profile.get(name)}); use a new --output-dir"
                )

    # -- builds ------------------------------------------------------------------------------------
    def _spec_entries(self, kept: Sequence[tuple[str, int]]) -> list[tuple[Problem, str]]:
        return [(self.problems[k], self.candidate_info[(k, c)]) for k, c in kept]

    def build(self, kept: Sequence[tuple[str, int]]) -> tuple[Path | None, str]:
        """The model built with a spec configuring `kept` (key, candidate id); (vmfb, error)."""
        from dispatchtune.ir.spec import tuning_spec, write_spec
        from dispatchtune.measure.worker import BINDINGS_LOCK

        name = hashlib.sha1(json.dumps(sorted(kept)).encode()).hexdigest()[:12] if kept else "default"
        if name in self.builds:
            return self.builds[name], ""
        directory = self.work / "builds" / name
        spec: Path | None = None
        if kept:
            with BINDINGS_LOCK:
                spec = write_spec(tuning_spec(self._spec_entries(kept)), directory / "spec.mlir")
        vmfb = directory / "model.vmfb"
        result = compile_model(self.model, self.target, spec, vmfb, self.options.compile_timeout_s)
        if not result.ok:
            return None, f"model build {result.status}: {result.error}"
        self.builds[name] = vmfb
        return vmfb, ""

    def reference_outputs(self) -> list[np.ndarray] | None:
        """The default build's outputs on the seeded inputs (computed once, on first need)."""
        if self.reference is not None or self.verify_note or not self.options.verify:
            return self.reference
        vmfb, error = self.build([])
        if vmfb is None:
            raise DispatchTuneError(f"the compiler-default {error}")
        run, outputs = run_model(vmfb, self.entry, self.inputs, self.device,
                                 self.work / "outputs", self.options.benchmark_timeout_s)
        if outputs is None:
            self.verify_note = f"default build did not run ({run.status}: {run.error})"
        self.reference = outputs
        return outputs

    def verify(self, vmfb: Path) -> tuple[str, float | None, str]:
        """(`ok` | `mismatch` | `error` | `skipped`, max |error|, note) against the default build."""
        reference = self.reference_outputs()
        if reference is None:
            return "skipped", None, self.verify_note or "verification disabled"
        run, outputs = run_model(vmfb, self.entry, self.inputs, self.device,
                                 self.work / "outputs", self.options.benchmark_timeout_s)
        if outputs is None:
            return "error", None, f"run {run.status}: {run.error or 'no output'}"
        status, max_abs = compare_outputs(outputs, reference, self.entry)
        return status, max_abs, ""

    def measure(self, builds: Sequence[Path], rounds: int, desc: str) -> list[list[list[float]]]:
        """times[round][build] = repetitions (ms); builds are interleaved, rotated per round."""
        from tqdm import tqdm

        times: list[list[list[float]]] = []
        bar = tqdm(total=rounds * len(builds), desc=desc[:40], unit="bench",
                   disable=self.mode != "bar", file=sys.stderr, dynamic_ncols=True)
        try:
            for round_index in range(rounds):
                row: list[list[float]] = [[] for _ in builds]
                shift = round_index % len(builds)  # spread any position effect over the builds
                for i in [*range(shift, len(builds)), *range(shift)]:
                    row[i], _ = benchmark_model(
                        builds[i], self.entry, self.inputs, self.device, self.options.repetitions,
                        self.options.min_time_s, self.options.benchmark_timeout_s,
                        timer=self.timer,
                    )
                    bar.update(1)
                times.append(row)
        finally:
            bar.close()
        return times

    # -- 1. profile ----------------------------------------------------------------------------------
    def profile(self) -> dict[str, Any]:
        record = self.log.find("profile")
        if record is not None:
            self.say("reusing the profile in model_log.jsonl")
            return record
        self.say(f"compiling {self.model.name} with the {self.target.name} flags and profiling it")
        vmfb, error = self.build([])
        if vmfb is None:
            raise InputError(f"{self.model}: the compiler-default {error}")
        times, rows = benchmark_model(
            vmfb, self.entry, self.inputs, self.device, self.options.repetitions,
            self.options.min_time_s, self.options.benchmark_timeout_s, timer=self.timer,
            dispatch_statistics=True,
        )
        return self.log.append(
            "profile", model=str(self.model), model_sha256=self.model_sha, target=self.target.name,
            device=self.device, function=self.entry.name, iree_version=iree_compiler_version(),
            timer=self.timer,
            compile_flags=list(self.target.compile_flags), times_ms=times,
            dispatches=[{"name": r.name, "time_ms": r.time_ms, "calls": r.calls} for r in rows],
        )

    # -- 3. dispatch tuning ----------------------------------------------------------------------
    def tune_dispatches(self, selected: Sequence[DispatchShare]) -> list[dict[str, Any]]:
        """Run the dispatch loop on each selected key with its budget; return every record."""
        from dispatchtune.ir.frontend import load_problems
        from dispatchtune.measure.benchfile import dump_dispatch_benchmarks
        from dispatchtune.tuner.loop import tune

        dispatch_dir = self.out / "dispatches"
        results = dispatch_dir / "results.jsonl"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the loop reports corrupt lines when it resumes
            spent = _benchmarked(list(read_records(results)), self.target)
        tuned = [s for s in selected if s.budget > 0]
        # Keys whose budget is already spent are not handed to the loop again: it would only
        # dump, strip and re-read their benchmarks to find nothing left to do.
        todo = [s for s in tuned if spent.get(s.key, 0) < s.budget]
        for share in tuned:
            if share not in todo:
                self.say(f"{share.key}: {spent[share.key]} benchmarks already in results.jsonl")
        if todo:
            dumped = dump_dispatch_benchmarks(self.model, self.target, self.work / "dumped")
            files = {dispatch_index(f.name): f for f in dumped}
        for position, share in enumerate(todo, start=1):
            source = files.get(dispatch_index(share.slowest))
            if source is None:
                raise DispatchTuneError(f"no dumped benchmark for dispatch {share.slowest}")
            found = load_problems(source, self.target)[0]
            if found.key != share.key:
                raise DispatchTuneError(
                    f"dumped benchmark {source.name} holds {found.key}, not {share.key}"
                )
            self.say(
                f"[{position}/{len(todo)}] tuning {share.key} ({share.share:.0%} of the model, "
                f"{len(share.dispatches)} dispatch(es)) with {share.budget} benchmarks"
            )
            options = _copy_options(self.options.dispatch, budget=share.budget,
                                    confirm_top=self.options.top, seed=self.options.seed,
                                    progress=self.options.progress)
            tune(source, self.target, dispatch_dir, options)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # corrupt lines were reported by the loop
            records = list(read_records(results))
        if todo:
            self._write_dispatch_report(records, [s.problem for s in tuned])
            if not self.options.keep_binaries:
                shutil.rmtree(self.work / "dumped", ignore_errors=True)
        return records

    def _write_dispatch_report(self, records: list[dict[str, Any]], problems: list[Problem]) -> None:
        """`dispatches/summary.md` over every tuned key (each loop call wrote only its own)."""
        from dispatchtune.tuner.report import write_outputs

        write_outputs(records, problems, self.target, self.out / "dispatches",
                      self.options.dispatch)

    def finalists(self, records: list[dict[str, Any]], problem: Problem) -> list[dict[str, Any]]:
        """A key's best candidates by dispatch speedup (confirmed first), faster than the default."""
        from dispatchtune.tuner.report import summarize, usable_candidates

        summary = summarize(records, problem, self.target, self.options.dispatch.min_speedup,
                            self.options.dispatch.estimator)
        if summary.frame is None or summary.frame.empty:
            return []
        usable = usable_candidates(summary.frame)
        if usable.empty:
            return []
        speed = {int(c): float(s) for c, s in zip(usable["candidate_id"], usable["speedup"],
                                                   strict=True)}
        confirmed: dict[int, float] = {}
        if summary.confirmed is not None and not summary.confirmed.empty:
            confirmed = {int(c): float(s) for c, s in zip(
                summary.confirmed["candidate_id"], summary.confirmed["speedup"], strict=True)}
        infos = {int(c): str(i) for c, i in zip(usable["candidate_id"], usable["compilation_info"],
                                                 strict=True)}
        # Confirmed (interleaved, repeated) speedups outrank single screening measurements.
        order = sorted(speed, key=lambda c: (c not in confirmed, -confirmed.get(c, speed[c])))
        picked = []
        for cid in order:
            value = confirmed.get(cid, speed[cid])
            if value <= 1.0:
                continue
            picked.append({"candidate_id": cid, "dispatch_speedup": value,
                           "confirmed": cid in confirmed, "compilation_info": infos[cid]})
            if len(picked) >= self.options.top:
                break
        return picked

    # -- 4. greedy keep-if-the-model-gets-faster -----------------------------------------------------
    def model_step(
        self, share: DispatchShare, finalists: list[dict[str, Any]], kept: list[tuple[str, int]]
    ) -> ModelStep:
        from dispatchtune.ir.spec import applied_configs, config_applied
        from dispatchtune.measure.worker import BINDINGS_LOCK

        ids = [f["candidate_id"] for f in finalists]
        base = [list(k) for k in kept]
        done = self.log.find("step", key=share.key, base=base, candidates=ids, timer=self.timer,
                             rounds=self.options.model_rounds)
        if done is not None:
            return ModelStep(share.key, done["tried"], done["kept"], done.get("note", ""))
        self.say(f"model step {share.key}: building the model with {len(ids)} candidate(s)")
        current, error = self.build(kept)
        if current is None:
            raise DispatchTuneError(f"the model build with the spec kept so far failed: {error}")
        tried: list[dict[str, Any]] = []
        builds: list[tuple[dict[str, Any], Path]] = []
        jobs = max(1, min(len(finalists), len(os.sched_getaffinity(0))))
        with ThreadPoolExecutor(jobs) as pool:
            built = list(pool.map(lambda f: self.build([*kept, (share.key, f["candidate_id"])]),
                                  finalists))
        for finalist, (vmfb, error) in zip(finalists, built, strict=True):
            entry = {k: finalist[k] for k in ("candidate_id", "dispatch_speedup", "confirmed")}
            tried.append(entry)
            if vmfb is None:
                entry.update(status="build_failed", error=error)
                continue
            if _sha256(vmfb) == _sha256(current):
                # The config is what the compiler already picks in this model: nothing to gain.
                entry.update(status="identical", error="model binary identical to the current one")
                continue
            spec = vmfb.with_name("spec.mlir")
            with BINDINGS_LOCK:
                applied = applied_configs(self.model, self.target, spec)
            if not any(config_applied(finalist["compilation_info"], a) for a in applied):
                entry.update(status="not_applied", error="the config did not apply in the model")
                continue
            status, max_abs, note = self.verify(vmfb)
            entry.update(verify_status=status, max_abs_error=max_abs)
            if status in ("mismatch", "error"):
                entry.update(status="miscompile" if status == "mismatch" else "run_failed",
                             error=note or f"outputs differ from the default build (max |error| "
                             f"{max_abs:.3g})")
                continue
            entry["status"] = "measured"
            builds.append((entry, vmfb))
        kept_id: int | None = None
        note = ""
        if builds:
            times = self.measure([current, *(v for _, v in builds)], self.options.model_rounds,
                                 f"model {share.key}")
            for index, (entry, _) in enumerate(builds, start=1):
                ratios = [min(r[0]) / min(r[index]) for r in times]
                entry.update(model_speedup=float(np.median(ratios)), ratios=ratios,
                             times_ms=[r[index] for r in times])
            base_times = [r[0] for r in times]
            best = max(builds, key=lambda b: b[0]["model_speedup"])[0]
            wins = sum(r > 1.0 for r in best["ratios"])
            if best["model_speedup"] > self.options.min_model_speedup and 3 * wins >= 2 * len(
                best["ratios"]
            ):
                kept_id = int(best["candidate_id"])
            else:
                note = (f"best model speedup {best['model_speedup']:.3f}x (faster in {wins}/"
                        f"{len(best['ratios'])} rounds): not above {self.options.min_model_speedup}")
        else:
            base_times = []
            note = "no candidate could be measured in the model"
        self.log.append("step", key=share.key, base=base, candidates=ids, timer=self.timer,
                        rounds=self.options.model_rounds, tried=tried,
                        kept=kept_id, note=note, base_times_ms=base_times)
        return ModelStep(share.key, tried, kept_id, note)

    # -- 5. final measurement ----------------------------------------------------------------------
    def final(self, kept: list[tuple[str, int]]) -> dict[str, Any]:
        entries = [list(k) for k in kept]
        done = self.log.find("final", kept=entries, timer=self.timer,
                             rounds=self.options.final_rounds)
        if done is not None:
            return done
        default, error = self.build([])
        if default is None:
            raise DispatchTuneError(f"the compiler-default {error}")
        if kept:
            tuned, error = self.build(kept)
            if tuned is None:
                raise DispatchTuneError(f"the final model build failed: {error}")
            status, max_abs, note = self.verify(tuned)
        else:
            tuned, status, max_abs, note = default, "ok", 0.0, "nothing kept: the default build"
        self.say(f"final: default vs tuned model, {self.options.final_rounds} interleaved rounds")
        times = self.measure([default, tuned], self.options.final_rounds, "model default vs tuned")
        return self.log.append(
            "final", kept=entries, timer=self.timer, rounds=self.options.final_rounds,
            default_times_ms=[r[0] for r in times],
            tuned_times_ms=[r[1] for r in times], verify_status=status, max_abs_error=max_abs,
            verify_note=note,
        )

    def cleanup(self) -> None:
        if not self.options.keep_binaries:
            shutil.rmtree(self.work / "builds", ignore_errors=True)
            shutil.rmtree(self.work / "outputs", ignore_errors=True)


def _benchmarked(records: Sequence[dict[str, Any]], target: Target) -> dict[str, int]:
    """Candidates that used up budget per problem key (as the loop counts them)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.get("kind") == "candidate" and r.get("target") == target.name and r.get(
            "bench_status"
        ) != "skipped":
            key = str(r.get("problem_key"))
            counts[key] = counts.get(key, 0) + 1
    return counts


def _copy_options(options: TuneOptions, **changes: Any) -> TuneOptions:
    from dataclasses import replace

    return replace(options, **changes)


def tune_model(
    path: str | os.PathLike[str],
    target: Target | str,
    output_dir: str | os.PathLike[str],
    options: ModelTuneOptions | None = None,
) -> ModelTuneResult:
    """Tune a whole model; write `output_dir/tuning_spec.mlir` and `summary.md` (resumable)."""
    from dispatchtune.ir.frontend import load_problems
    from dispatchtune.ir.spec import tuning_spec, write_spec
    from dispatchtune.measure.worker import BINDINGS_LOCK

    options = options or ModelTuneOptions()
    options.validate()
    target = get_target(target) if isinstance(target, str) else target
    target.check_runs_here()
    model = Path(path)
    if not model.is_file():
        raise InputError(f"no such file: {model}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    tuner = _ModelTuner(model, target, out, options)
    tuner._check_identity()
    try:
        profile = tuner.profile()
        problems = load_problems(model, target) if profile["dispatches"] else []
        rows = [DispatchRow(d["name"], float(d["time_ms"]), int(d["calls"]))
                for d in profile["dispatches"]]
        shares, other_ms, total_ms = attribute_time(rows, problems)
        if not shares:
            raise InputError(f"{model}: no profiled dispatch has a tunable root op")
        selected = select_dispatches(shares, options.coverage, options.max_dispatches,
                                     options.min_share)
        if not selected:
            selected = shares[:1]  # every key is below min_share: tune the slowest anyway
        for share, budget in zip(
            selected,
            allocate_budget([s.time_ms for s in selected], options.budget, options.min_per_dispatch),
            strict=True,
        ):
            share.budget = budget
        tuner.problems = {s.key: s.problem for s in shares}
        records = tuner.tune_dispatches(selected)

        kept: list[tuple[str, int]] = []
        steps: list[ModelStep] = []
        for share in selected:
            if share.budget == 0:
                continue
            finalists = tuner.finalists(records, share.problem)
            for f in finalists:
                tuner.candidate_info[(share.key, f["candidate_id"])] = f["compilation_info"]
            if not finalists:
                steps.append(ModelStep(share.key, [], None,
                                       "no candidate beat the default in isolation"))
                continue
            step = tuner.model_step(share, finalists, kept)
            steps.append(step)
            if step.kept is not None:
                kept.append((share.key, step.kept))
        final = tuner.final(kept)
        spec_path = out / "tuning_spec.mlir"
        with BINDINGS_LOCK:
            write_spec(tuning_spec(tuner._spec_entries(kept)), spec_path)
    finally:
        tuner.cleanup()
    result = _result(out, target, tuner, profile, shares, other_ms, total_ms, steps, kept, final)
    return result


# ---- reporting ---------------------------------------------------------------------------------------
def _per_round(times: Sequence[Sequence[float]]) -> np.ndarray:
    return np.asarray([min(t) for t in times], dtype=float)


def _result(
    out: Path, target: Target, tuner: _ModelTuner, profile: dict[str, Any],
    shares: list[DispatchShare], other_ms: float, total_ms: float, steps: list[ModelStep],
    kept: list[tuple[str, int]], final: dict[str, Any],
) -> ModelTuneResult:
    default = _per_round(final["default_times_ms"])
    tuned = _per_round(final["tuned_times_ms"])
    ratios = default / tuned
    result = ModelTuneResult(
        output_dir=out, spec_path=out / "tuning_spec.mlir", summary_path=out / "summary.md",
        plot_path=None, results_path=out / "dispatches" / "results.jsonl",
        default_ms=default.tolist(), tuned_ms=tuned.tolist(),
        speedup=float(np.median(ratios)), speedup_low=float(ratios.min()),
        speedup_high=float(ratios.max()), verify_status=str(final["verify_status"]),
        max_abs_error=final.get("max_abs_error"), shares=shares, other_ms=other_ms,
        steps=steps, kept=dict(kept),
    )
    result.plot_path = plot_model(result, out / "model_tuning.png")
    lines = _summary_lines(result, target, tuner, profile, total_ms)
    result.summary_path.write_text("\n".join(lines) + "\n")
    result.text = "\n".join(_console_lines(result, target))
    return result


def _ms(values: np.ndarray | Sequence[float]) -> str:
    arr = np.asarray(values, dtype=float)
    return f"{np.median(arr):.3f} ms (min {arr.min():.3f}, max {arr.max():.3f})"


def _console_lines(result: ModelTuneResult, target: Target) -> list[str]:
    lines = [
        f"default model: {_ms(result.default_ms)} over {len(result.default_ms)} rounds",
        f"tuned model:   {_ms(result.tuned_ms)}",
        f"speedup {result.speedup:.3f}x (rounds {result.speedup_low:.3f}-"
        f"{result.speedup_high:.3f}x); outputs vs default build: {result.verify_status}",
    ]
    for step in result.steps:
        lines.append(
            f"  {step.key}: " + (f"kept candidate {step.kept}" if step.kept is not None
                                 else f"default kept ({step.note})")
        )
    lines.append(
        f"spec: {result.spec_path} ({len(result.kept)} configuration(s); pass it with "
        f"{target.tuning_spec_flag}=...)  summary: {result.summary_path}"
    )
    return lines


def _summary_lines(
    result: ModelTuneResult, target: Target, tuner: _ModelTuner, profile: dict[str, Any],
    total_ms: float,
) -> list[str]:
    steps = {s.key: s for s in result.steps}
    flags = " ".join(profile.get("compile_flags", []))
    lines = [
        f"# dispatchtune tune-model summary ({target.name})",
        "",
        f"Model `{profile.get('model')}`, function `@{profile.get('function')}`, device "
        f"`{profile.get('device')}`, IREE {profile.get('iree_version')}.",
        "",
        "## End to end",
        "",
        f"Measured in {len(result.default_ms)} rounds, each benchmarking the default and the tuned "
        f"build back to back ({tuner.options.repetitions} repetitions each, {tuner.timer} time; "
        "a round's time is its fastest repetition, since outside load only slows runs down)."
        + ("" if result.kept else " No configuration was kept, so both rows are the compiler "
           "default build: their spread is the measurement noise."),
        "",
        "| build | median ms | min ms | max ms |",
        "|---|---:|---:|---:|",
    ]
    for label, values in (("compiler default", result.default_ms),
                          ("tuned (`tuning_spec.mlir`)", result.tuned_ms)):
        arr = np.asarray(values)
        lines.append(f"| {label} | {np.median(arr):.3f} | {arr.min():.3f} | {arr.max():.3f} |")
    err = result.max_abs_error
    lines += [
        "",
        f"**Speedup {result.speedup:.3f}x** (median of the paired rounds; range "
        f"{result.speedup_low:.3f}-{result.speedup_high:.3f}x). Outputs of the tuned build vs the "
        f"default build on seeded random inputs: **{result.verify_status}**"
        + (f" (max abs error {err:.3g})" if isinstance(err, (int, float)) else "") + ".",
        "",
        f"`tuning_spec.mlir` configures {len(result.kept)} problem(s). Reproduce:",
        "",
        "```sh",
        f"iree-compile {profile.get('model')} {flags} \\",
        f"    {target.tuning_spec_flag}={result.spec_path} -o model.vmfb",
        "```",
        "",
        "## Where the time goes",
        "",
        f"Profile of the default build (`iree-benchmark-module --dispatch_statistics`): "
        f"{total_ms:.3f} ms of dispatches per call. A spec configures every dispatch of the same "
        "shape, so dispatches are grouped by problem.",
        "",
        "| problem | dispatches | calls | ms | share | budget | best isolated speedup | "
        "model speedup | in spec |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for share in result.shares:
        step = steps.get(share.key)
        isolated = model = ""
        if step is not None and step.tried:
            isolated = f"{max(t['dispatch_speedup'] for t in step.tried):.3f}x"
            measured = [t for t in step.tried if "model_speedup" in t]
            if measured:
                model = f"{max(t['model_speedup'] for t in measured):.3f}x"
        names = ", ".join(str(dispatch_index(d)) for d in share.dispatches)
        kept = "yes" if share.key in result.kept else ("no" if step is not None else "")
        lines.append(
            f"| `{share.key}` | {names} | {share.calls} | {share.time_ms:.3f} | "
            f"{share.share:.1%} | {share.budget or ''} | {isolated} | {model} | {kept} |"
        )
    lines += [f"| other (no tunable root op) | | | {result.other_ms:.3f} | "
              f"{result.other_ms / total_ms if total_ms else 0:.1%} | | | | |", ""]
    lines += ["## Model-level decisions", ""]
    if not result.steps:
        lines.append("No dispatch was tuned.")
    for step in result.steps:
        verdict = (f"kept candidate {step.kept}" if step.kept is not None
                   else f"default kept: {step.note}")
        lines.append(f"- `{step.key}`: {verdict}")
        for t in step.tried:
            detail = (f"model {t['model_speedup']:.3f}x (rounds "
                      f"{min(t['ratios']):.3f}-{max(t['ratios']):.3f}x)"
                      if "model_speedup" in t else f"{t.get('status')}: {t.get('error', '')}")
            how = "confirmed" if t.get("confirmed") else "screening"
            lines.append(f"  - candidate {t['candidate_id']}: isolated {t['dispatch_speedup']:.3f}x "
                         f"({how}), {detail}")
    lines += [
        "",
        "Dispatch-level results: `dispatches/results.jsonl` (the dispatch loop's format; "
        "`train-costmodel` reads it) and `dispatches/summary.md`; model-level measurements: "
        "`model_log.jsonl`.",
        "",
    ]
    if result.plot_path is not None:
        lines.append(f"![share and gain per problem]({result.plot_path.name})")
    return lines


def plot_model(result: ModelTuneResult, path: Path) -> Path | None:
    """Bar chart per problem: share of the model's time, isolated and model-level speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = result.shares[:10]
    if not shares:
        return None
    steps = {s.key: s for s in result.steps}
    labels = [s.key.rsplit("_", 1)[0].replace("contraction_", "mm ") for s in shares]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.5 * len(shares) + 2.2))
    y = np.arange(len(shares))
    left.barh(y, [100 * s.share for s in shares], color="tab:blue")
    left.set_yticks(y, labels, fontsize=7)
    left.invert_yaxis()
    left.set_xlabel("share of the default model's dispatch time (%)")
    isolated, model = [], []
    for share in shares:
        step = steps.get(share.key)
        tried = step.tried if step is not None else []
        isolated.append(max((t["dispatch_speedup"] for t in tried), default=np.nan))
        model.append(max((t["model_speedup"] for t in tried if "model_speedup" in t),
                         default=np.nan))
    right.barh(y - 0.2, isolated, height=0.4, label="best dispatch alone", color="tab:gray")
    right.barh(y + 0.2, model, height=0.4, label="whole model with it", color="tab:green")
    right.axvline(1.0, color="black", linewidth=1, linestyle="--")
    right.set_yticks(y, [""] * len(shares))
    right.invert_yaxis()
    right.set_xlabel("speedup over the compiler default (x)")
    finite = [v for v in isolated + model if np.isfinite(v)]
    if finite:
        right.set_xlim(min(0.9, min(finite) - 0.02), max(finite) + 0.05)
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"tune-model: end-to-end {result.speedup:.3f}x "
                 f"({_ms(result.default_ms).split(' (')[0]} -> {_ms(result.tuned_ms).split(' (')[0]})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
