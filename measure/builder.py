"""Building binaries: candidates of a dispatch with their spec, the compiler default, whole models.

Compile workers are threads that each drive `iree-compile` child processes (the work happens in
the children, so threads give true parallelism, and a crashing compiler only loses its child).
Compiles and CPU benchmarks share the host cores through `CpuSlots`: a compile child takes one
slot, a CPU benchmark all of them (`runner.slots_for_device`).

Error policy: a build never raises for the input's own failures; it returns an outcome with a
status (`ok` | `failed` | `timeout` | `crashed` | `not_applied` | `duplicate` | `error`) and a
one-line reason. Callers for whom a failure must abort (the compiler default, a whole model)
raise from the outcome themselves.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dispatchtune.candidate import Candidate
from dispatchtune.datasets.records import BASELINE_ID
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
        """Register a binary; return the earlier owner when another candidate produced it (a
        candidate built again, after it was released unmeasured, is not its own duplicate)."""
        with self._lock:
            owner = self._seen.setdefault(sha, candidate_id)
            return None if owner == candidate_id else owner


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (binaries are compared by it)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_spec_file(entries: Sequence[tuple[Problem, str]], path: Path) -> Path:
    """Write the spec giving each problem its configuration to `path` (atomically)."""
    from dispatchtune.ir.spec import tuning_spec, write_spec

    with BINDINGS_LOCK:
        return write_spec(tuning_spec(entries), path)


def compile_module(
    source: Path,
    target: Target,
    spec: Path | None,
    out: Path,
    timeout_s: float,
    *,
    with_target_flags: bool = True,
    slots: CpuSlots | None = None,
) -> ProcessResult:
    """`iree-compile source -o out` with the spec (`None`: the compiler default).

    A dumped dispatch benchmark carries its target; a model or function needs the target's flags.
    A missing or empty output counts as a failure even when the exit status is 0.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    flags = list(target.compile_flags) if with_target_flags else []
    if spec is not None:
        flags.extend(target.tuning_spec_flags(spec))
    command = [tool_path("iree-compile"), str(source), *flags, "-o", str(out)]
    with slots.hold(1) if slots is not None else contextlib.nullcontext():
        result = run_process(command, timeout_s)
    if result.ok and (not out.exists() or out.stat().st_size == 0):
        return ProcessResult(
            "failed", result.returncode, result.stdout, result.stderr, result.elapsed_s,
            "iree-compile exited 0 but wrote no binary",
        )
    return result


def check_applied(
    source: Path, target: Target, spec: Path, compilation_info: str,
    slots: CpuSlots | None = None,
) -> tuple[str, str]:
    """Whether compiling `source` with `spec` gives a root op `compilation_info`:
    (`ok` | `not_applied` | `error`, reason). A spec that does not match compiles silently with
    the compiler's own choice, so every build's applied configuration is read back."""
    from dispatchtune.ir.spec import applied_configs, config_applied

    try:
        with BINDINGS_LOCK, slots.hold(1) if slots is not None else contextlib.nullcontext():
            applied = applied_configs(source, target, spec)
    except DispatchTuneError as exc:
        return "error", f"applied-config check failed: {exc}"
    if any(config_applied(compilation_info, a) for a in applied):
        return "ok", ""
    return "not_applied", "spec did not apply; IREE used: " + (
        "; ".join(applied) if applied else "no configuration"
    )


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

    def compile(
        self, source: Path, spec: Path | None, out: Path, *, with_target_flags: bool,
        timeout_s: float | None = None,
    ) -> ProcessResult:
        """`compile_module` for this dispatch's target, holding one of its CPU slots."""
        return compile_module(source, self.target, spec, out, timeout_s or self.timeout_s,
                              with_target_flags=with_target_flags, slots=self.slots)


def build_default(ctx: CompileContext, out: Path, timeout_s: float) -> tuple[ProcessResult, str]:
    """The compiler-default build of the dispatch (no spec) and its sha256 ("" on failure).

    Its binary is registered first, so a candidate that builds the same binary is a duplicate
    of the default.
    """
    result = ctx.compile(ctx.benchmark_mlir, None, out, with_target_flags=False,
                         timeout_s=timeout_s)
    if not result.ok:
        return result, ""
    sha = sha256_file(out)
    ctx.registry.claim(sha, BASELINE_ID)
    return result, sha


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
    try:
        spec = write_spec_file([(ctx.problem, candidate.compilation_info)],
                               directory / "spec.mlir")
    except DispatchTuneError as exc:
        return CompileOutcome(candidate, "error", f"cannot build spec: {exc}")
    vmfb = directory / "dispatch.vmfb"
    result = ctx.compile(ctx.benchmark_mlir, spec, vmfb, with_target_flags=False)
    if not result.ok:
        vmfb.unlink(missing_ok=True)
        return CompileOutcome(candidate, result.status, result.error, result.elapsed_s)
    outcome = CompileOutcome(candidate, "ok", compile_time_s=result.elapsed_s, vmfb=vmfb)
    if ctx.check_applied:
        status, error = check_applied(ctx.benchmark_mlir, ctx.target, spec,
                                      candidate.compilation_info, ctx.slots)
        if status != "ok":
            outcome.status, outcome.error = status, error
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
        func = ctx.compile(ctx.function_mlir, spec, func_vmfb, with_target_flags=True)
        if func.ok:
            outcome.verify_vmfb = func_vmfb
        else:
            outcome.verify_error = f"function build {func.status}: {func.error}"
    return outcome
