"""`DispatchTuner`: the loop for one dispatch: baseline, compile pool, device workers, confirmation.

Candidates come from a `CandidateSource`; each is built by the measure layer's builder, benchmarked
and verified through a `Runner`, and logged as soon as its outcome is known.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import warnings
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.candidate import Candidate
from dispatchtune.datasets.records import (
    BASELINE_ID,
    MAX_ATTEMPTS,
    RecordKind,
    ResultRecord,
    ResultsLog,
    latest_attempts,
    read_results,
    transient_failure,
)
from dispatchtune.errors import DispatchTuneError
from dispatchtune.measure.benchfile import (
    PreparedDispatch,
)
from dispatchtune.measure.builder import (
    BINDINGS_LOCK,
    BinaryRegistry,
    CompileContext,
    CompileOutcome,
    CpuSlots,
    build_default,
    compile_candidate,
    write_spec_file,
)
from dispatchtune.measure.devices import parse_devices
from dispatchtune.measure.process import kill_children
from dispatchtune.measure.runner import Artifact, BenchOutcome, BenchSettings, LocalRunner, Runner
from dispatchtune.measure.verify import Call, compare, problem_call
from dispatchtune.search.source import CandidateSource
from dispatchtune.targets import Target
from dispatchtune.toolchain import iree_compiler_version
from dispatchtune.tuner.options import TuneOptions
from dispatchtune.tuner.report import confirmation_pending, summarize, usable_candidates

logger = logging.getLogger(__name__)


# ---- per-device state -------------------------------------------------------------------------
@dataclass
class Device:
    """One benchmark stream: a device, the runner that reaches it, and its own baseline.

    `uri` names it in the results log (`ssh://gpu1/hip://0` for a remote device, so two hosts'
    `hip://0` stay apart); `iree_uri` is the device where its runner runs the tools.
    """

    uri: str
    runner: Runner
    iree_uri: str = ""
    last_baseline_ms: list[float] = field(default_factory=list)
    since_baseline: int = 0

    def artifact(self, vmfb: Path) -> Artifact:
        return Artifact(vmfb, self.iree_uri or self.uri)


@dataclass
class BenchResult:
    compiled: CompileOutcome
    device: str
    status: str
    error: str
    times_ms: list[float]
    baseline_times_ms: list[float]
    verify_status: str = "skipped"
    verify_error: str = ""
    max_abs_error: float | None = None


class DispatchTuner:
    """Runs the loop for one dispatch; owns the pools, the devices and the baseline."""

    def __init__(
        self,
        prepared: PreparedDispatch,
        target: Target,
        options: TuneOptions,
        log: ResultsLog,
        history: Sequence[ResultRecord],
        session: str,
        work_dir: Path,
        runner: Runner | None = None,
        runners: Mapping[str, Runner] | None = None,
    ) -> None:
        """`runners`: the runner of each remote device by its name (`measure.devices`); the
        other devices use `runner`, by default the local one."""
        self.problem = prepared.problem
        self.prepared = prepared
        self.target = target
        self.options = options
        self.log = log
        self.session = session
        self.work_dir = work_dir
        specs = parse_devices(options.devices, options.runner, target.device_uri)
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.jobs = options.jobs or cores
        # A remote benchmark holds no core here: compiles keep every core busy beside it.
        local = sum(1 for s in specs if not s.runner)
        self.slots = CpuSlots(cores if not target.is_gpu else self.jobs + local)
        self.registry = BinaryRegistry()
        # Benchmarks and verification runs go through this interface only; which runner a device
        # has is decided here, once.
        local_runner: Runner = runner or LocalRunner(self.slots)
        remote = runners or {}
        missing = [s.name for s in specs if s.runner and s.name not in remote]
        if missing:
            raise DispatchTuneError(f"no runner was opened for device {missing[0]}")
        self.devices = [
            Device(s.name, remote[s.name] if s.runner else local_runner, s.uri) for s in specs
        ]
        self.runner: Runner = self.devices[0].runner  # the reference outputs' device
        self.settings = BenchSettings(
            options.repetitions, options.min_time_s, options.benchmark_timeout_s
        )
        self.stop = threading.Event()
        self.iree_version = iree_compiler_version()
        # Candidates are known by their configuration, not their id: ids are rows of one
        # enumeration, and a configuration logged under another enumeration is still done.
        mine = [r for r in history if r.is_candidate and r.belongs_to(self.problem.key, target.name)]
        attempts: dict[str, list[ResultRecord]] = defaultdict(list)
        for r in mine:
            attempts[r.compilation_info].append(r)
        # Done: measured, failed for good, or out of attempts; the rest is tried again.
        self.done = {info for info, tries in attempts.items() if not self._retry(tries)}
        self.benchmarked = sum(1 for r in mine if self._counts(r))
        # Binaries built by earlier runs count for dedup too (same compiler, same input).
        for r in mine:
            if r.compile_status == "ok" and r.binary_sha256:
                self.registry.claim(r.binary_sha256, r.candidate_id)
        self.space_digest = ""  # of the source's enumeration, set when the run starts
        self._attempts_left = 0  # candidates this run may still try (set by `run`)
        self.reference: np.ndarray | None = None
        self.call: Call | None = None
        self.verify_note = ""
        self.default_config = ""
        self.function_mlir: Path | None = None  # set once the default's reference output exists
        self.baseline_vmfb = work_dir / "baseline" / "dispatch.vmfb"
        self.baseline_compile_s = 0.0
        self.baseline_sha = ""

    def _retry(self, tries: Sequence[ResultRecord]) -> bool:
        """Whether a logged candidate is tried again: every failure with `retry_failed`, else
        failures that may be transient, up to `MAX_ATTEMPTS` tries (a timeout under a smaller
        compile timeout than this run's is not counted: a larger one is a new chance)."""
        if any(not t.failed for t in tries):
            return False
        if self.options.retry_failed:
            return True
        if not all(t.may_be_transient for t in tries):
            return False
        counted = [t for t in tries if not (
            t.compile_status == "timeout" and t.compile_timeout_s is not None
            and t.compile_timeout_s < self.options.compile_timeout_s)]
        return len(counted) < MAX_ATTEMPTS

    def _counts(self, record: ResultRecord) -> bool:
        """Whether a logged candidate used up budget (was benchmarked; compile-only: was built)."""
        if self.options.compile_only:
            return record.compile_status == "ok"
        return record.bench_status != "skipped"

    # -- records --------------------------------------------------------------------------------
    def _record(self, **fields: Any) -> ResultRecord:
        return ResultRecord(
            problem=self.problem.to_dict(),
            problem_key=self.problem.key,
            target=self.target.name,
            target_cpu="" if self.target.is_gpu else self.target.cpu_facts().cpu,
            iree_version=self.iree_version,
            session=self.session,
            order=self.options.order,
            space_digest=self.space_digest,
            **fields,
        )

    def _append(self, record: ResultRecord) -> None:
        if not self.stop.is_set():  # results of an interrupted run's killed children are void
            self.log.append(record)

    # -- baseline -------------------------------------------------------------------------------
    def _prepare_baseline(self) -> None:
        directory = self.work_dir / "baseline"
        directory.mkdir(parents=True, exist_ok=True)
        ctx = self._context()
        # The default build must succeed whatever the per-candidate timeout is.
        generous = max(self.options.compile_timeout_s, 300.0)
        result, self.baseline_sha = build_default(ctx, self.baseline_vmfb, generous)
        if not result.ok:
            raise DispatchTuneError(
                f"the compiler-default build of {self.problem.key} {result.status}: {result.error}"
            )
        self.baseline_compile_s = result.elapsed_s
        if self.options.check_applied:
            from dispatchtune.ir.spec import applied_configs

            try:
                with BINDINGS_LOCK:
                    found = applied_configs(self.prepared.benchmark, self.target, None)
                self.default_config = found[0] if found else ""
            except DispatchTuneError:
                self.default_config = ""
        if not self.options.verify or self.options.compile_only:
            self.verify_note = "verification disabled"
            return
        function = self.work_dir / "function.mlir"
        function.write_text(self.problem.to_mlir())
        self.call = problem_call(self.problem, self.work_dir / "inputs", self.options.seed)
        if self.call is None:
            self.verify_note = f"no random inputs for {'/'.join(self.problem.element_types)}"
            return
        func_vmfb = directory / "function.vmfb"
        built = ctx.compile(function, None, func_vmfb, with_target_flags=True, timeout_s=generous)
        if not built.ok:
            self.verify_note = f"function-level default build {built.status}: {built.error}"
            return
        run = self.runner.run(self.devices[0].artifact(func_vmfb), self.call,
                              self.options.benchmark_timeout_s)
        if run.outputs is None:
            self.verify_note = f"default build did not run ({run.status}: {run.error})"
            return
        self.reference = run.outputs[0]
        self.function_mlir = function

    def _measure_baseline(self, device: Device) -> None:
        result = self._benchmark(self.baseline_vmfb, device)
        if self.stop.is_set():
            return
        if not result.ok:
            raise DispatchTuneError(
                f"benchmarking the compiler default on {device.uri} {result.status}: {result.error}"
            )
        device.last_baseline_ms = result.times_ms
        device.since_baseline = 0
        self._append(
            self._record(
                kind="baseline",
                device=device.uri,
                candidate_id=BASELINE_ID,
                compilation_info=self.default_config,
                compile_status="ok",
                compile_time_s=self.baseline_compile_s,
                binary_sha256=self.baseline_sha,
                bench_status="ok",
                times_ms=result.times_ms,
            )
        )

    def _benchmark(self, vmfb: Path, device: Device) -> BenchOutcome:
        return device.runner.benchmark(device.artifact(vmfb), self.settings)

    def _context(self) -> CompileContext:
        return CompileContext(
            problem=self.problem,
            target=self.target,
            benchmark_mlir=self.prepared.benchmark,
            function_mlir=self.function_mlir,
            work_dir=self.work_dir,
            timeout_s=self.options.compile_timeout_s,
            slots=self.slots,
            registry=self.registry,
            check_applied=self.options.check_applied,
        )

    # -- device worker --------------------------------------------------------------------------
    def _bench_job(self, compiled: CompileOutcome, free: queue.Queue[Device]) -> BenchResult:
        device = free.get()
        try:
            if device.since_baseline >= self.options.baseline_every:
                self._measure_baseline(device)
            assert compiled.vmfb is not None
            result = self._benchmark(compiled.vmfb, device)
            device.since_baseline += 1
            outcome = BenchResult(
                compiled, device.uri, result.status, result.error, result.times_ms,
                list(device.last_baseline_ms),
            )
            if result.ok:
                self._verify(compiled, device, outcome)
            return outcome
        finally:
            free.put(device)
            if not self.options.keep_binaries:
                for path in (compiled.vmfb, compiled.verify_vmfb):
                    if path is not None:
                        path.unlink(missing_ok=True)

    def _verify(self, compiled: CompileOutcome, device: Device, outcome: BenchResult) -> None:
        if self.reference is None or self.call is None:
            outcome.verify_error = self.verify_note
            return
        if compiled.verify_vmfb is None:
            outcome.verify_status, outcome.verify_error = "error", compiled.verify_error
            return
        run = device.runner.run(device.artifact(compiled.verify_vmfb), self.call,
                              self.options.benchmark_timeout_s)
        if run.outputs is None:
            outcome.verify_status = "error"
            outcome.verify_error = f"run {run.status}: {run.error or 'no output'}"
            return
        status, max_abs = compare(run.outputs, [self.reference], [self.problem.output_type])
        outcome.verify_status, outcome.max_abs_error = status, max_abs
        if status == "mismatch":
            outcome.verify_error = (
                f"miscompile: max |error| {max_abs:.3g} vs the default build on seeded inputs"
            )

    # -- confirmation ---------------------------------------------------------------------------
    def _logged(self) -> list[ResultRecord]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # corrupt lines were reported when the run started
            return latest_attempts(read_results(self.log.path))

    def reconfirm_if_interrupted(self, progress: Any) -> None:
        """Confirm screening that an interrupted run left unconfirmed (`confirmation_pending`):
        a confirmation cut short, or one that never started."""
        if self.options.compile_only or self.options.confirm_top <= 0:
            return
        if not confirmation_pending(self._logged(), self.problem.key, self.target.name):
            return
        progress.write(f"the confirmation of {self.problem.key} was interrupted: redoing it")
        if not self.baseline_vmfb.exists():
            self._prepare_baseline()
        self._confirm(progress)

    def _log_confirmation_plan(self, finalists: int) -> None:
        """Log a confirmation's plan (rounds x `finalists`) before the steps it covers run.

        Resuming reads it (`report.latest_confirmation`), so a run interrupted anywhere in the
        confirmation, even before its first measurement, has it redone rather than deciding from
        one screening measurement; a plan of 0 finalists closes one with nothing to measure.
        """
        self._append(self._record(
            kind=RecordKind.CONFIRM, device=self.devices[0].uri, candidate_id=BASELINE_ID,
            confirm_rounds=self.options.confirm_rounds, confirm_finalists=finalists,
        ))

    def _confirm(self, progress: Any) -> None:
        """Re-measure the best candidates in rounds interleaved with the default config."""
        top_n, rounds = self.options.confirm_top, self.options.confirm_rounds
        if top_n <= 0 or rounds <= 0:
            return
        records = self._logged()
        frame = summarize(
            records, self.problem, self.target, self.options.min_speedup, self.options.estimator
        ).frame
        if frame is None or frame.empty:
            self._log_confirmation_plan(0)
            return
        finalists = usable_candidates(frame).head(top_n)
        # Confirmation separates real gains from noise near the threshold; a candidate that
        # screened slower than the default by more than the threshold's own margin (0.98x for
        # 1.02) cannot be kept, and re-measuring it only costs time.
        if self.options.min_speedup > 1.0:
            finalists = finalists[finalists["speedup"] >= 1.0 / self.options.min_speedup]
        if finalists.empty:
            progress.write(f"{self.problem.key}: no candidate screened near the default: "
                           "nothing to confirm")
            self._log_confirmation_plan(0)
            return
        knobs = {
            r.candidate_id: r.knobs
            for r in records
            if r.is_candidate and r.belongs_to(self.problem.key, self.target.name)
        }
        ctx = self._context()
        binaries: list[tuple[dict[Any, Any], Path]] = []
        for row in finalists.to_dict("records"):
            directory = self.work_dir / f"c{row['candidate_id']}"
            spec = directory / "spec.mlir"
            if not spec.exists():
                write_spec_file([(self.problem, str(row["compilation_info"]))], spec)
            vmfb = directory / "confirm.vmfb"
            built = ctx.compile(self.prepared.benchmark, spec, vmfb, with_target_flags=False)
            if built.ok:
                binaries.append((row, vmfb))
        if not binaries:
            self._log_confirmation_plan(0)
            return
        device = self.devices[0]
        progress.write(
            f"confirming the {len(binaries)} best candidate(s) of {self.problem.key}: "
            f"{rounds} rounds interleaved with the default on {device.uri}"
        )
        try:
            for round_index in range(rounds):
                # Logged as baseline records: each round is judged against the baselines just
                # before and just after it, like screening (see report.confirmations).
                self._measure_baseline(device)
                base = list(device.last_baseline_ms)
                shift = round_index % len(binaries)  # rotate to spread any position effect
                for row, vmfb in binaries[shift:] + binaries[:shift]:
                    run = self._benchmark(vmfb, device)
                    self._append(
                        self._record(
                            kind=RecordKind.CONFIRM,
                            device=device.uri,
                            candidate_id=int(row["candidate_id"]),
                            rank=int(row.get("rank", -1)),
                            pipeline=str(row.get("pipeline", "")),
                            knobs=dict(knobs.get(int(row["candidate_id"])) or {}),
                            compilation_info=str(row["compilation_info"]),
                            compile_status="ok",
                            binary_sha256=str(row.get("binary_sha256", "")),
                            bench_status=run.status,
                            bench_error=run.error,
                            times_ms=run.times_ms,
                            baseline_times_ms=base,
                            verify_status=str(row.get("verify_status", "skipped")),
                            confirm_round=round_index,
                            confirm_rounds=rounds,
                            confirm_finalists=len(binaries),
                        )
                    )
            self._measure_baseline(device)
        finally:
            if not self.options.keep_binaries:
                for _, vmfb in binaries:
                    vmfb.unlink(missing_ok=True)

    # -- main loop ------------------------------------------------------------------------------
    def _candidate_fields(self, candidate: Candidate) -> dict[str, Any]:
        return {
            "candidate_id": candidate.candidate_id,
            "rank": candidate.rank,
            "score": candidate.score,
            "pipeline": candidate.pipeline,
            "knobs": candidate.knobs,
            "compilation_info": candidate.compilation_info,
        }

    def _compile_record(self, compiled: CompileOutcome) -> ResultRecord:
        return self._record(
            device="",
            compile_status=compiled.status,
            compile_error=compiled.error,
            compile_time_s=compiled.compile_time_s,
            compile_timeout_s=self.options.compile_timeout_s,
            binary_sha256=compiled.sha256,
            duplicate_of=compiled.duplicate_of,
            transient=transient_failure(compiled.status, compiled.error),
            **self._candidate_fields(compiled.candidate),
        )

    def _bench_record(self, bench: BenchResult) -> ResultRecord:
        compiled = bench.compiled
        return self._record(
            device=bench.device,
            compile_status="ok",
            compile_time_s=compiled.compile_time_s,
            compile_timeout_s=self.options.compile_timeout_s,
            binary_sha256=compiled.sha256,
            bench_status=bench.status,
            bench_error=bench.error,
            times_ms=bench.times_ms,
            baseline_times_ms=bench.baseline_times_ms,
            verify_status=bench.verify_status,
            verify_error=bench.verify_error,
            max_abs_error=bench.max_abs_error,
            transient=transient_failure(bench.status, bench.error),
            **self._candidate_fields(compiled.candidate),
        )

    def _settle(self, source: CandidateSource, candidate: Candidate, record: ResultRecord) -> None:
        """Tell the source a measured, failed or (compiling only) built candidate's outcome, then
        log it.

        The source hears first: a shared study then holds the result before the log does, so a
        kill between the two never lets another worker measure the candidate again (the study
        keeps the record for this worker's next start, `OnlineSource.recovered`).
        """
        if self.stop.is_set():  # results of an interrupted run's killed children are void
            return
        time_ms = record.learned_time(self.options.estimator)
        source.tell(candidate, time_ms, record)
        self.done.add(candidate.compilation_info)
        self._append(record)

    def _next_candidate(self, source: CandidateSource) -> Candidate | None:
        """The source's next candidate this output directory has not settled, within the attempts."""
        while self._attempts_left > 0 and (candidate := source.ask()) is not None:
            if candidate.compilation_info in self.done:
                source.skip(candidate)  # this output directory already holds its result
                continue
            self._attempts_left -= 1
            return candidate
        return None

    def _log_recovered(self, source: CandidateSource) -> None:
        """Log results a shared study holds for this worker but its log lost (a kill between)."""
        for record in source.recovered:
            if record.compilation_info in self.done:
                continue
            self._append(record)
            self.done.add(record.compilation_info)
            self.benchmarked += self._counts(record)
            logger.info("%s: candidate %d's result restored from the study to the log",
                        self.problem.key, record.candidate_id)

    def run(self, source: CandidateSource, progress: Any) -> None:
        """Try the source's candidates until the budget is spent, telling it every outcome."""
        budget = self.options.budget
        self._log_recovered(source)
        if self.benchmarked >= budget:
            return
        self.space_digest = source.space_digest
        self._attempts_left = self.options.max_attempts or 4 * budget + 8
        first = self._next_candidate(source)
        if first is None:
            return
        self._prepare_baseline()
        if not self.options.compile_only:
            for device in self.devices:
                self._measure_baseline(device)
        ctx = self._context()
        free: queue.Queue[Device] = queue.Queue()
        for device in self.devices:
            free.put(device)
        compiles: dict[Future[CompileOutcome], Candidate] = {}
        benches: dict[Future[BenchResult], CompileOutcome] = {}
        waiting = False  # the source had nothing to give until something in flight ends
        ready: Candidate | None = first
        compile_pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="dt-compile")
        bench_pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="dt-bench")
        try:
            while True:
                # Keep the compile workers busy with the next batch while benchmarks run, but do
                # not build far more binaries than the budget can still use.
                # Once the benchmarks done and running cover the budget (each of them counts,
                # failed or not), a new build could only be thrown away.
                while (
                    not waiting
                    and len(compiles) < 2 * self.jobs
                    and self.benchmarked + len(benches) + len(compiles) < budget + self.jobs
                    and (self.options.compile_only or self.benchmarked + len(benches) < budget)
                ):
                    candidate = ready or self._next_candidate(source)
                    ready = None
                    if candidate is None:
                        waiting = True
                        break
                    compiles[compile_pool.submit(compile_candidate, ctx, candidate)] = candidate
                if not benches and (not compiles or self.benchmarked >= budget):
                    break
                in_flight: list[Future[Any]] = [*compiles, *benches]
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                # A source with no stop reason (a shared study whose budget is held by claims,
                # some of them ours) may have more once these outcomes are told.
                waiting = waiting and (bool(source.stop_reason) or self._attempts_left <= 0)
                for future in done:
                    if future in compiles:
                        del compiles[future]
                        compiled = future.result()  # type: ignore[assignment]
                        assert isinstance(compiled, CompileOutcome)
                        if compiled.status != "ok":
                            progress.note_compile(compiled.status)
                            if compiled.status == "duplicate":
                                self._append(self._compile_record(compiled))
                                self.done.add(compiled.candidate.compilation_info)
                                source.skip(compiled.candidate)
                            else:
                                self._settle(source, compiled.candidate,
                                             self._compile_record(compiled))
                        elif self.options.compile_only:
                            if self.benchmarked < budget:
                                # Built and logged: done (told, so an order learns it built).
                                self._settle(source, compiled.candidate,
                                             self._compile_record(compiled))
                                self.benchmarked += 1
                                progress.note_built(compiled)
                            else:
                                source.release(compiled.candidate)
                            if compiled.vmfb is not None:
                                compiled.vmfb.unlink(missing_ok=True)
                        elif self.benchmarked + len(benches) < budget:
                            job = bench_pool.submit(self._bench_job, compiled, free)
                            benches[job] = compiled
                        else:
                            # Budget spent: not recorded, so a later run with a larger budget
                            # builds and measures it then.
                            for path in (compiled.vmfb, compiled.verify_vmfb):
                                if path is not None:
                                    path.unlink(missing_ok=True)
                            source.release(compiled.candidate)
                    else:
                        del benches[future]
                        bench = future.result()
                        assert isinstance(bench, BenchResult)
                        self._settle(source, bench.compiled.candidate, self._bench_record(bench))
                        self.benchmarked += 1
                        progress.note_bench(bench)
                        if bench.verify_status == "mismatch":
                            progress.write(
                                f"MISCOMPILE: candidate {bench.compiled.candidate.candidate_id} "
                                f"of {self.problem.key}: {bench.verify_error}"
                            )
            # Budget spent: builds still running cannot be used; stop them (not recorded, so a
            # later run with a larger budget builds them again).
            for future in compiles:
                future.cancel()
                source.release(compiles[future])
            kill_children()
            compile_pool.shutdown(wait=True, cancel_futures=True)
            if not self.options.compile_only:
                if self.options.confirm_top > 0 and self.options.confirm_rounds > 0:
                    # Screening is over: from here on an interrupt leaves a confirmation that
                    # the next run redoes (with no budget left to screen, it would not come back
                    # here). The measurements carry the exact plan, once the finalists are built.
                    self._log_confirmation_plan(self.options.confirm_top)
                # Close with a baseline on every device so that drift over the run is visible.
                for device in self.devices:
                    if device.since_baseline:
                        self._measure_baseline(device)
                self._confirm(progress)
        except BaseException:
            self.stop.set()
            kill_children()
            cancelled: list[Future[Any]] = [*compiles, *benches]
            for pending_future in cancelled:
                pending_future.cancel()
            raise
        finally:
            compile_pool.shutdown(wait=True, cancel_futures=True)
            bench_pool.shutdown(wait=True, cancel_futures=True)
