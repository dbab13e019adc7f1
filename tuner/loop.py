"""The tuning loop: order candidates, compile them in parallel, benchmark, verify, log, resume.

`tune(path, target, output_dir, options)` tunes every dispatch of a model/function (or one dumped
dispatch benchmark):

1. dump the dispatch benchmarks, strip their configs and fill their buffers (`benchfile`);
2. enumerate the candidates with Z3 (`dispatchtune.search.enumerate_candidates`) and take them from
   a `search.source.CandidateSource`: a static order (`dispatchtune.rank`: heuristic, random or a
   learned model) or the online search, which is told every outcome;
3. build the compiler-default baseline (binary, reference outputs) and measure it on each device;
4. stream candidates through a pool of compile workers (spec -> binary -> applied-config check ->
   dedup by sha256 -> function build for verification) while the device workers benchmark and
   verify the binaries already built; the baseline is re-measured every `baseline_every`
   benchmarks per device, so drift is visible and every candidate is normalised by the nearest
   earlier baseline;
5. append each result to `results.jsonl` as soon as it is known (a run killed at any moment
   resumes without losing or re-measuring anything: candidates already recorded are skipped);
6. write `tuning_spec.mlir`, `summary.md` and `progress.png` (`report`).
"""

from __future__ import annotations

import itertools
import os
import queue
import shutil
import signal
import socket
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.candidate import Candidate
from dispatchtune.costmodel.rank import STATIC_ORDERS
from dispatchtune.datasets.records import (
    BASELINE_ID,
    RecordKind,
    ResultRecord,
    ResultsLog,
    read_results,
)
from dispatchtune.datasets.timing import ESTIMATORS, estimate, speedup
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.measure.benchfile import (
    PreparedDispatch,
    dump_dispatch_benchmarks,
    is_dispatch_benchmark,
    prepare_dispatch,
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
from dispatchtune.measure.process import kill_children
from dispatchtune.measure.runner import Artifact, BenchOutcome, BenchSettings, LocalRunner, Runner
from dispatchtune.measure.verify import Call, compare, problem_call
from dispatchtune.problem import Problem
from dispatchtune.search.source import CandidateSource, StaticOrder, ranked_order
from dispatchtune.targets import Target, get_target
from dispatchtune.toolchain import iree_compiler_version
from dispatchtune.tuner.report import TuneResult, summarize, usable_candidates, write_outputs

#: `--order` choices: the static orders of `rank`, and the online search.
TUNE_ORDERS: tuple[str, ...] = (*STATIC_ORDERS, "online")
ORDERS = TUNE_ORDERS  # the name the CLI modules import

__all__ = ["ORDERS", "TUNE_ORDERS", "CandidateFactory", "TuneOptions", "TuneResult", "tune"]


@dataclass
class TuneOptions:
    """Knobs of the loop (the CLI flags of `dispatchtune tune`)."""

    budget: int = 20  # candidates benchmarked per dispatch (failures and duplicates are free)
    order: str = "heuristic"  # heuristic | random | model (learned) | online (learns during the run)
    model_path: str | None = None  # learned model file for model/online (default: installed one)
    # Online search: Optuna storage URL (default: sqlite file study.db in the output directory),
    # a wall-clock limit per dispatch, and the no-improvement stop (0 = off).
    storage: str | None = None
    time_limit_s: float = 0.0
    stop_margin: float = 0.01
    stop_patience: int = 0
    devices: tuple[str, ...] = ()  # default: the target's device (local-sync for host)
    jobs: int = 0  # compile workers; 0 = one per core
    repetitions: int = 5
    min_time_s: float = 0.05
    baseline_every: int = 5  # re-measure the default config after this many benchmarks/device
    compile_timeout_s: float = 60.0
    benchmark_timeout_s: float = 120.0
    verify: bool = True
    check_applied: bool = True
    seed: int = 0
    max_attempts: int = 0  # candidates tried per dispatch; 0 = 4 x budget + 8
    # The best candidate enters the spec only above this speedup over the default: 2% is about
    # the run-to-run variation of a local-sync benchmark here, so smaller gains are not real.
    min_speedup: float = 1.02
    # At the end of a run that measured anything, the `confirm_top` best candidates are
    # re-measured in `confirm_rounds` rounds, each round benchmarking the default and then them
    # back to back; their speedups come from these paired measurements.
    confirm_top: int = 3
    confirm_rounds: int = 3
    keep_binaries: bool = False
    # Build and check candidates without running them (GPU targets on a machine without the GPU):
    # the budget then counts candidates built; no baseline runs, no verification, no spec.
    compile_only: bool = False
    estimator: str = "min"  # time of one measurement from its repetitions: min | median
    progress: bool | None = None  # None: a bar on a terminal, else one line per result

    def validate(self) -> None:
        if self.budget < 1:
            raise DispatchTuneError("--budget must be at least 1")
        if self.order not in TUNE_ORDERS:
            raise DispatchTuneError(f"--order must be one of {', '.join(TUNE_ORDERS)}")
        if self.repetitions < 1:
            raise DispatchTuneError("--repetitions must be at least 1")
        if self.baseline_every < 1:
            raise DispatchTuneError("--baseline-every must be at least 1")
        if self.estimator not in ESTIMATORS:
            raise DispatchTuneError(f"--estimator must be one of {', '.join(ESTIMATORS)}")
        if self.order == "online" and self.compile_only:
            raise DispatchTuneError("--order online learns from benchmarks; it cannot run --compile-only")
        if self.stop_patience < 0 or self.time_limit_s < 0:
            raise DispatchTuneError("--stop-patience and --time-limit must be >= 0")


#: `tune(candidates=...)` as a function: the candidate source of one dispatch.
CandidateFactory = Callable[[Problem, Target, TuneOptions], CandidateSource]


def candidate_source(
    problem: Problem,
    target: Target,
    options: TuneOptions,
    output_dir: Path,
    history: Sequence[ResultRecord] = (),
) -> CandidateSource:
    """The candidates of one dispatch as `options.order` asks: online, or a static ranking."""
    from dispatchtune.search import enumerate_candidates

    cset = enumerate_candidates(problem, target)
    model = None
    if options.order in ("model", "online") or options.model_path is not None:
        from dispatchtune.costmodel.defaults import model_for_target

        # Say which model orders the run: a missing default silently meaning "heuristic" would
        # be one more silent fallback.
        model, where = model_for_target(target.name, options.model_path)
        if options.progress is not False:
            how = "online search, prior from" if options.order == "online" else "candidates ordered by"
            print(f"{problem.key[:40]}: {how} the {where}", file=sys.stderr)
    if options.order != "online":
        return ranked_order(cset, options.order, options.seed, model)
    from dispatchtune.search.online_source import OnlineSource
    from dispatchtune.search.optuna_search import default_storage

    assert model is not None
    return OnlineSource(
        cset, model,
        storage=options.storage or default_storage(output_dir),
        budget=options.budget,
        worker=f"{socket.gethostname()}:{output_dir.resolve()}",
        seed=options.seed,
        time_limit_s=options.time_limit_s,
        margin=options.stop_margin,
        patience=options.stop_patience,
        estimator=options.estimator,
        history=history,
    )


# ---- preparing dispatches --------------------------------------------------------------------
def prepare_dispatches(path: Path, target: Target, work_dir: Path) -> list[PreparedDispatch]:
    """Stripped + filled benchmark files for every distinct tunable dispatch of `path`."""
    from dispatchtune.ir.frontend import load_problems, read_input

    path = Path(path)
    text = read_input(path)
    sources = (
        [path]
        if is_dispatch_benchmark(text)
        else dump_dispatch_benchmarks(path, target, work_dir / "dumped")
    )
    prepared: list[PreparedDispatch] = []
    seen: set[str] = set()
    for source in sources:
        try:
            problems = load_problems(source, target)
        except InputError:
            continue  # a dispatch without a tunable root op (e.g. an elementwise one)
        for problem in problems[:1]:  # a dispatch's first root op is the one its spec configures
            if problem.key in seen:
                continue
            seen.add(problem.key)
            out = work_dir / problem.key / "benchmark.mlir"
            prepared.append(prepare_dispatch(source, problem, out))
    if not prepared:
        raise InputError(f"{path}: no dispatch with a tunable root op")
    return prepared


# ---- per-device state -------------------------------------------------------------------------
@dataclass
class _Device:
    uri: str
    last_baseline_ms: list[float] = field(default_factory=list)
    since_baseline: int = 0


@dataclass
class _BenchOutcome:
    compiled: CompileOutcome
    device: str
    status: str
    error: str
    times_ms: list[float]
    baseline_times_ms: list[float]
    verify_status: str = "skipped"
    verify_error: str = ""
    max_abs_error: float | None = None


class _DispatchTuner:
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
    ) -> None:
        self.problem = prepared.problem
        self.prepared = prepared
        self.target = target
        self.options = options
        self.log = log
        self.session = session
        self.work_dir = work_dir
        self.devices = [_Device(d) for d in (options.devices or (target.device_uri,))]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self.jobs = options.jobs or cores
        self.slots = CpuSlots(cores if not target.is_gpu else self.jobs + len(self.devices))
        self.registry = BinaryRegistry()
        # Benchmarks and verification runs go through this interface only (local by default).
        self.runner: Runner = runner or LocalRunner(self.slots)
        self.settings = BenchSettings(
            options.repetitions, options.min_time_s, options.benchmark_timeout_s
        )
        self.stop = threading.Event()
        self.iree_version = iree_compiler_version()
        # Candidates are known by their configuration, not their id: ids are rows of one
        # enumeration, and a configuration logged under another enumeration is still done.
        mine = [r for r in history if r.is_candidate and r.belongs_to(self.problem.key, target.name)]
        self.done = {r.compilation_info for r in mine}
        self.benchmarked = sum(1 for r in mine if self._counts(r))
        # Binaries built by earlier runs count for dedup too (same compiler, same input).
        for r in mine:
            if r.compile_status == "ok" and r.binary_sha256:
                self.registry.claim(r.binary_sha256, r.candidate_id)
        self.space_digest = ""  # of the source's enumeration, set when the run starts
        self.reference: np.ndarray | None = None
        self.call: Call | None = None
        self.verify_note = ""
        self.default_config = ""
        self.function_mlir: Path | None = None  # set once the default's reference output exists
        self.baseline_vmfb = work_dir / "baseline" / "dispatch.vmfb"
        self.baseline_compile_s = 0.0
        self.baseline_sha = ""

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
        run = self.runner.run(Artifact(func_vmfb, self.devices[0].uri), self.call,
                              self.options.benchmark_timeout_s)
        if run.outputs is None:
            self.verify_note = f"default build did not run ({run.status}: {run.error})"
            return
        self.reference = run.outputs[0]
        self.function_mlir = function

    def _measure_baseline(self, device: _Device) -> None:
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

    def _benchmark(self, vmfb: Path, device: _Device) -> BenchOutcome:
        return self.runner.benchmark(Artifact(vmfb, device.uri), self.settings)

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
    def _bench_job(self, compiled: CompileOutcome, free: queue.Queue[_Device]) -> _BenchOutcome:
        device = free.get()
        try:
            if device.since_baseline >= self.options.baseline_every:
                self._measure_baseline(device)
            assert compiled.vmfb is not None
            result = self._benchmark(compiled.vmfb, device)
            device.since_baseline += 1
            outcome = _BenchOutcome(
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

    def _verify(self, compiled: CompileOutcome, device: _Device, outcome: _BenchOutcome) -> None:
        if self.reference is None or self.call is None:
            outcome.verify_error = self.verify_note
            return
        if compiled.verify_vmfb is None:
            outcome.verify_status, outcome.verify_error = "error", compiled.verify_error
            return
        run = self.runner.run(Artifact(compiled.verify_vmfb, device.uri), self.call,
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
    def _confirm(self, progress: Any) -> None:
        """Re-measure the best candidates in rounds interleaved with the default config."""
        top_n, rounds = self.options.confirm_top, self.options.confirm_rounds
        if top_n <= 0 or rounds <= 0:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # corrupt lines were reported when the run started
            records = list(read_results(self.log.path))
        frame = summarize(
            records, self.problem, self.target, self.options.min_speedup, self.options.estimator
        ).frame
        if frame is None or frame.empty:
            return
        finalists = usable_candidates(frame).head(top_n)
        if finalists.empty:
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

    def _record_compile_only(self, compiled: CompileOutcome) -> None:
        self._append(
            self._record(
                device="",
                compile_status=compiled.status,
                compile_error=compiled.error,
                compile_time_s=compiled.compile_time_s,
                binary_sha256=compiled.sha256,
                duplicate_of=compiled.duplicate_of,
                **self._candidate_fields(compiled.candidate),
            )
        )

    def _record_bench(self, bench: _BenchOutcome) -> ResultRecord:
        compiled = bench.compiled
        record = self._record(
                device=bench.device,
                compile_status="ok",
                compile_time_s=compiled.compile_time_s,
                binary_sha256=compiled.sha256,
                bench_status=bench.status,
                bench_error=bench.error,
                times_ms=bench.times_ms,
                baseline_times_ms=bench.baseline_times_ms,
                verify_status=bench.verify_status,
                verify_error=bench.verify_error,
                max_abs_error=bench.max_abs_error,
                **self._candidate_fields(compiled.candidate),
        )
        self._append(record)
        return record

    def _candidates(self, source: CandidateSource) -> Iterator[Candidate]:
        """The source's candidates this run has not tried yet, at most `max_attempts` of them."""
        attempts = self.options.max_attempts or 4 * self.options.budget + 8
        while attempts > 0 and (candidate := source.ask()) is not None:
            if candidate.compilation_info in self.done:
                source.skip(candidate)  # this output directory already holds its result
                continue
            attempts -= 1
            yield candidate

    def run(self, source: CandidateSource, progress: Any) -> None:
        """Try the source's candidates until the budget is spent, telling it every outcome."""
        budget = self.options.budget
        if self.benchmarked >= budget:
            return
        self.space_digest = source.space_digest
        pending: Iterator[Candidate] = self._candidates(source)
        first = next(pending, None)
        if first is None:
            return
        pending = itertools.chain([first], pending)
        self._prepare_baseline()
        if not self.options.compile_only:
            for device in self.devices:
                self._measure_baseline(device)
        ctx = self._context()
        free: queue.Queue[_Device] = queue.Queue()
        for device in self.devices:
            free.put(device)
        compiles: dict[Future[CompileOutcome], Candidate] = {}
        benches: dict[Future[_BenchOutcome], CompileOutcome] = {}
        exhausted = False
        compile_pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="dt-compile")
        bench_pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="dt-bench")
        try:
            while True:
                # Keep the compile workers busy with the next batch while benchmarks run, but do
                # not build far more binaries than the budget can still use.
                while (
                    not exhausted
                    and len(compiles) < 2 * self.jobs
                    and self.benchmarked + len(benches) + len(compiles) < budget + self.jobs
                ):
                    candidate = next(pending, None)
                    if candidate is None:
                        exhausted = True
                        break
                    compiles[compile_pool.submit(compile_candidate, ctx, candidate)] = candidate
                if not benches and (not compiles or self.benchmarked >= budget):
                    break
                in_flight: list[Future[Any]] = [*compiles, *benches]
                done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                for future in done:
                    if future in compiles:
                        del compiles[future]
                        compiled = future.result()  # type: ignore[assignment]
                        assert isinstance(compiled, CompileOutcome)
                        if compiled.status != "ok":
                            self._record_compile_only(compiled)
                            progress.note_compile(compiled.status)
                            if compiled.status == "duplicate":
                                source.skip(compiled.candidate)
                            else:
                                source.tell(compiled.candidate, None)
                        elif self.options.compile_only:
                            if self.benchmarked < budget:
                                self._record_compile_only(compiled)
                                self.benchmarked += 1
                                progress.note_built(compiled)
                                source.skip(compiled.candidate)  # built and logged: done
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
                        assert isinstance(bench, _BenchOutcome)
                        record = self._record_bench(bench)
                        self.benchmarked += 1
                        progress.note_bench(bench)
                        source.tell(bench.compiled.candidate,
                                    record.learned_time(self.options.estimator))
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


class _Progress:
    """Progress of one dispatch: a tqdm bar on a terminal, else one stderr line per result."""

    def __init__(self, total: int, initial: int, desc: str, mode: str, estimator: str = "min") -> None:
        from tqdm import tqdm

        self.mode = mode  # bar | lines | off
        self.estimator = estimator
        self.total, self.done, self.desc = total, min(initial, total), desc
        self.bar = tqdm(
            total=total, initial=self.done, desc=desc, unit="bench",
            disable=mode != "bar", file=sys.stderr, dynamic_ncols=True, leave=True,
        )
        self.best = 0.0
        self.failures = 0

    def note_compile(self, status: str) -> None:
        if status != "duplicate":
            self.failures += 1
        self._postfix()

    def note_bench(self, bench: _BenchOutcome) -> None:
        took_ms = estimate(bench.times_ms, self.estimator)
        ratio = speedup(estimate(bench.baseline_times_ms, self.estimator), took_ms)
        if bench.verify_status == "mismatch":
            ratio = float("nan")
        elif ratio == ratio:  # not NaN
            self.best = max(self.best, ratio)
        if bench.status != "ok":
            self.failures += 1
        self.done += 1
        self.bar.update(1)
        self._postfix()
        if self.mode == "lines":
            took = f"{took_ms:.3f} ms" if bench.times_ms else bench.status
            print(
                f"[{self.done}/{self.total}] {self.desc} candidate "
                f"{bench.compiled.candidate.candidate_id}: {took} {ratio:.3f}x "
                f"(verify {bench.verify_status}; best {self.best:.3f}x, failed {self.failures})",
                file=sys.stderr, flush=True,
            )

    def note_built(self, compiled: CompileOutcome) -> None:
        self.done += 1
        self.bar.update(1)
        self._postfix()
        if self.mode == "lines":
            print(
                f"[{self.done}/{self.total}] {self.desc} candidate "
                f"{compiled.candidate.candidate_id}: built in {compiled.compile_time_s:.2f} s "
                f"(failed {self.failures})",
                file=sys.stderr, flush=True,
            )

    def _postfix(self) -> None:
        self.bar.set_postfix(best=f"{self.best:.3f}x", failed=self.failures, refresh=False)

    def write(self, text: str) -> None:
        if self.mode != "off":
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so a killed run stops cleanly with its log consistent."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def tune(
    path: str | os.PathLike[str],
    target: Target | str,
    output_dir: str | os.PathLike[str],
    options: TuneOptions | None = None,
    *,
    candidates: Sequence[Candidate] | CandidateFactory | None = None,
) -> TuneResult:
    """Tune every dispatch of `path` for `target`; results and spec go to `output_dir`.

    `candidates` replaces the enumerator + ranker: a fixed list (tried in order on every dispatch)
    or a function `(problem, target, options) -> CandidateSource`. Resuming is automatic: results
    already in `output_dir/results.jsonl` are kept and their candidates are not tried again.
    """
    options = options or TuneOptions()
    options.validate()
    target = get_target(target) if isinstance(target, str) else target
    if not options.compile_only:
        target.check_runs_here()
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.jsonl"
    history = list(read_results(results_path))
    log = ResultsLog(results_path)
    work = out / "work"
    session = uuid.uuid4().hex[:12]
    if options.progress is None:
        mode = "bar" if sys.stderr.isatty() else "lines"
    else:
        mode = "bar" if options.progress else "off"
    with _sigterm_as_interrupt():
        prepared = prepare_dispatches(Path(path), target, work)
        for dispatch in prepared:
            problem = dispatch.problem
            tuner = _DispatchTuner(dispatch, target, options, log, history, session, work / problem.key)
            source: CandidateSource | None = None
            if tuner.benchmarked < options.budget:  # else resumed with the budget spent
                if candidates is None:
                    source = candidate_source(problem, target, options, out, history)
                elif callable(candidates):
                    source = candidates(problem, target, options)
                else:
                    source = StaticOrder(candidates)
            progress = _Progress(
                options.budget, tuner.benchmarked, problem.key[:40], mode, options.estimator
            )
            try:
                if source is not None:
                    tuner.run(source, progress)
            finally:
                progress.close()
                if source is not None:
                    source.close()  # an online source hands its open claims back to the study
                    if source.stop_reason and mode != "off":
                        print(f"{problem.key[:40]}: search stopped: {source.stop_reason}",
                              file=sys.stderr)
            if not options.keep_binaries:
                # Binaries and raw inputs/outputs are rebuilt on demand; specs stay for the record.
                for pattern in ("c*/*.vmfb", "c*/*.bin", "baseline/*", "inputs/*.bin"):
                    for leftover in (work / problem.key).glob(pattern):
                        leftover.unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # corrupt lines were already reported when resuming
        records = list(read_results(results_path))
    result = write_outputs(records, [d.problem for d in prepared], target, out, options)
    if not options.keep_binaries:
        shutil.rmtree(work / "dumped", ignore_errors=True)
    return result
