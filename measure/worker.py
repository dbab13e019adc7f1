"""The two worker roles of the tuning loop: compile a candidate, benchmark a binary on a device.

Compile workers are threads that each drive `iree-compile` child processes (the work happens in
the children, so threads give true parallelism, and a crashing compiler only loses its child).
Benchmark workers own one device each. Both kinds share the host cores through `CpuSlots`: a
compile child takes one slot, a CPU benchmark takes all of them (compiles pause while it runs), a
GPU benchmark one (compiles of the next batch overlap with it). Noise from outside the tuner is
measured by re-running the baseline at intervals and normalised away.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dispatchtune.candidate import Candidate
from dispatchtune.errors import DispatchTuneError
from dispatchtune.measure.process import ProcessResult, run_process
from dispatchtune.problem import Problem
from dispatchtune.targets import Target
from dispatchtune.toolchain import tool_path

# IREE's Python bindings are used in-process for spec building and reading applied configs; one
# context at a time keeps them away from any thread-safety question.
BINDINGS_LOCK = threading.Lock()


class CpuSlots:
    """A first-come-first-served counting semaphore; a holder may take several slots at once.

    First come, first served matters: a CPU benchmark waits for every slot, and with a plain
    semaphore the compile workers, each re-taking a slot as soon as one frees up, starved it
    (measured: 14 s before the first benchmark could start).
    """

    def __init__(self, total: int) -> None:
        self.total = max(1, total)
        self._free = self.total
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()
        self._tickets = itertools.count()

    @contextmanager
    def hold(self, count: int = 1) -> Iterator[None]:
        count = min(max(1, count), self.total)
        with self._cond:
            ticket = next(self._tickets)
            self._queue.append(ticket)
            self._cond.wait_for(lambda: self._queue[0] == ticket and self._free >= count)
            self._queue.popleft()
            self._free -= count
            self._cond.notify_all()  # the next in line may fit in what is left
        try:
            yield
        finally:
            with self._cond:
                self._free += count
                self._cond.notify_all()


@dataclass
class CompileOutcome:
    """What a compile worker produced for one candidate."""

    candidate: Candidate
    status: str  # ok | failed | timeout | crashed | not_applied | duplicate | error
    error: str = ""
    compile_time_s: float = 0.0
    vmfb: Path | None = None
    verify_vmfb: Path | None = None
    verify_error: str = ""
    sha256: str = ""
    duplicate_of: int | None = None


class BinaryRegistry:
    """sha256 of every binary seen -> the candidate that produced it first (dedup)."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def claim(self, sha: str, candidate_id: int) -> int | None:
        """Register a binary; return the earlier owner when it was already seen."""
        with self._lock:
            owner = self._seen.get(sha)
            if owner is None:
                self._seen[sha] = candidate_id
            return owner


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class CompileContext:
    """Everything a compile worker needs for one dispatch."""

    problem: Problem
    target: Target
    benchmark_mlir: Path
    function_mlir: Path | None
    work_dir: Path
    timeout_s: float
    slots: CpuSlots
    registry: BinaryRegistry
    check_applied: bool = True


def build_spec(problem: Problem, compilation_info: str) -> str:
    """Spec text that gives `problem` one candidate configuration."""
    from dispatchtune.ir.spec import tuning_spec

    with BINDINGS_LOCK:
        return tuning_spec([(problem, compilation_info)])


def compile_module(
    ctx: CompileContext,
    source: Path,
    spec: Path | None,
    out: Path,
    *,
    with_target_flags: bool,
    timeout_s: float | None = None,
) -> ProcessResult:
    """`iree-compile source -o out` with the spec (`None`: the compiler default).

    A missing or empty output counts as a failure even when the exit status is 0.
    """
    out.unlink(missing_ok=True)
    flags = list(ctx.target.compile_flags) if with_target_flags else []
    if spec is not None:
        flags.append(f"{ctx.target.tuning_spec_flag}={spec}")
    command = [tool_path("iree-compile"), str(source), *flags, "-o", str(out)]
    with ctx.slots.hold(1):
        result = run_process(command, timeout_s or ctx.timeout_s)
    if result.ok and (not out.exists() or out.stat().st_size == 0):
        return ProcessResult(
            "failed", result.returncode, result.stdout, result.stderr, result.elapsed_s,
            "iree-compile exited 0 but wrote no binary",
        )
    return result


def compile_candidate(ctx: CompileContext, candidate: Candidate) -> CompileOutcome:
    """Spec -> dispatch binary -> applied-config check -> dedup -> function binary.

    Never raises for a candidate's own problems: they become its status (`error` for anything
    unexpected), so one bad candidate cannot stop the run.
    """
    try:
        return _compile_candidate(ctx, candidate)
    except Exception as exc:
        return CompileOutcome(candidate, "error", f"{type(exc).__name__}: {exc}".splitlines()[0])


def _compile_candidate(ctx: CompileContext, candidate: Candidate) -> CompileOutcome:
    directory = ctx.work_dir / f"c{candidate.candidate_id}"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        spec_text = build_spec(ctx.problem, candidate.compilation_info)
    except DispatchTuneError as exc:
        return CompileOutcome(candidate, "error", f"cannot build spec: {exc}")
    spec = directory / "spec.mlir"
    spec.write_text(spec_text)
    vmfb = directory / "dispatch.vmfb"
    result = compile_module(ctx, ctx.benchmark_mlir, spec, vmfb, with_target_flags=False)
    if not result.ok:
        vmfb.unlink(missing_ok=True)
        return CompileOutcome(candidate, result.status, result.error, result.elapsed_s)
    outcome = CompileOutcome(candidate, "ok", compile_time_s=result.elapsed_s, vmfb=vmfb)
    if ctx.check_applied:
        from dispatchtune.ir.spec import applied_configs, config_applied

        try:
            with BINDINGS_LOCK, ctx.slots.hold(1):
                applied = applied_configs(ctx.benchmark_mlir, ctx.target, spec)
            matched = any(config_applied(candidate.compilation_info, a) for a in applied)
        except DispatchTuneError as exc:
            outcome.status, outcome.error = "error", f"applied-config check failed: {exc}"
            return outcome
        if not matched:
            outcome.status = "not_applied"
            outcome.error = "spec did not apply; IREE used: " + (
                "; ".join(applied) if applied else "no configuration"
            )
            return outcome
    outcome.sha256 = sha256_file(vmfb)
    owner = ctx.registry.claim(outcome.sha256, candidate.candidate_id)
    if owner is not None:
        outcome.status, outcome.duplicate_of = "duplicate", owner
        outcome.error = "binary identical to " + (
            "the compiler default" if owner < 0 else f"candidate {owner}"
        )
        vmfb.unlink(missing_ok=True)
        outcome.vmfb = None
        return outcome
    if ctx.function_mlir is not None:
        func_vmfb = directory / "function.vmfb"
        func = compile_module(ctx, ctx.function_mlir, spec, func_vmfb, with_target_flags=True)
        if func.ok:
            outcome.verify_vmfb = func_vmfb
        else:
            outcome.verify_error = f"function build {func.status}: {func.error}"
    return outcome


# ---- benchmarking --------------------------------------------------------------------------------
_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class BenchSettings:
    repetitions: int = 5
    min_time_s: float = 0.05
    timeout_s: float = 120.0


def parse_benchmark_json(text: str) -> list[float]:
    """Every repetition's real time in ms from `iree-benchmark-module --benchmark_format=json`."""
    data = json.loads(text)
    times = []
    for row in data.get("benchmarks", []):
        if row.get("run_type", "iteration") != "iteration":
            continue
        times.append(float(row["real_time"]) * _UNIT_MS[row.get("time_unit", "ns")])
    return times


def slots_for_device(device: str, slots: CpuSlots) -> int:
    """CPU slots a benchmark on `device` holds.

    A CPU benchmark holds them all: measured here, a compile running beside a `local-sync`
    benchmark on the other core made it 2x slower and the ranking noisy, so compiles pause for
    the ~0.5 s a CPU benchmark takes. A GPU benchmark needs one host thread; compiles go on.
    """
    return slots.total if device.startswith("local") else 1


def benchmark_vmfb(
    vmfb: Path, device: str, settings: BenchSettings, slots: CpuSlots
) -> tuple[ProcessResult, list[float]]:
    """Run a dispatch benchmark binary; return the process and each repetition's time (ms)."""
    command = [
        tool_path("iree-benchmark-module"),
        f"--module={vmfb}",
        f"--device={device}",
        f"--benchmark_repetitions={settings.repetitions}",
        f"--benchmark_min_time={settings.min_time_s:g}s",
        "--benchmark_format=json",
        "--batch_size=1",
    ]
    with slots.hold(slots_for_device(device, slots)):
        result = run_process(command, settings.timeout_s)
    if not result.ok:
        return result, []
    try:
        times = parse_benchmark_json(result.stdout)
    except (ValueError, KeyError) as exc:
        return ProcessResult(
            "failed", result.returncode, result.stdout, result.stderr, result.elapsed_s,
            f"unreadable benchmark output: {exc}",
        ), []
    if not times:
        return ProcessResult(
            "failed", result.returncode, result.stdout, result.stderr, result.elapsed_s,
            "benchmark reported no repetitions",
        ), []
    return result, times


def median(values: list[float]) -> float:
    return float(np.median(values)) if values else float("nan")
