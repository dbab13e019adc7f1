"""The tuning loop: order candidates, compile them in parallel, benchmark, verify, log, resume.

`tune(path, target, output_dir, options)` tunes every dispatch of a model/function (or one dumped
dispatch benchmark, or a directory of them):

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

import logging
import os
import shutil
import signal
import socket
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchtune.candidate import Candidate
from dispatchtune.datasets.records import (
    ResultRecord,
    ResultsLog,
    read_results,
)
from dispatchtune.errors import InputError, StorageLost, skip_dispatch_on_error
from dispatchtune.logs import progress_mode
from dispatchtune.measure.benchfile import (
    PreparedDispatch,
    dump_dispatch_benchmarks,
    is_dispatch_benchmark,
    prepare_dispatch,
)
from dispatchtune.measure.devices import check_devices_here, parse_devices, remote_runners
from dispatchtune.measure.remote import RemoteError, RemoteRunner
from dispatchtune.problem import Problem
from dispatchtune.search.source import CandidateSource, StaticOrder, ranked_order
from dispatchtune.targets import Target, get_target
from dispatchtune.toolchain import NO_CONST_EVAL
from dispatchtune.tuner.dispatch import DispatchTuner
from dispatchtune.tuner.options import TUNE_ORDERS, TuneOptions, check_waves_per_eu
from dispatchtune.tuner.progress import Progress
from dispatchtune.tuner.report import TuneResult, write_outputs

logger = logging.getLogger(__name__)

__all__ = ["TUNE_ORDERS", "CandidateFactory", "TuneOptions", "TuneResult", "tune"]


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

    cset = enumerate_candidates(
        problem, target, heuristic_filters=options.heuristic_filters,
        extra_knobs={"waves_per_eu": options.waves_per_eu} if options.waves_per_eu else None,
    )
    if options.budget > len(cset):
        logger.info("%s: the space has %d candidates, fewer than --budget %d: every one will be "
                    "tried", problem.key, len(cset), options.budget)
    model = None
    if options.order in ("model", "online") or options.model_path is not None:
        from dispatchtune.costmodel.defaults import model_for_target

        # Say which model orders the run: a missing default silently meaning "heuristic" would
        # be one more silent fallback.
        model, where = model_for_target(target.name, options.model_path)
        if options.progress is not False:
            how = "online search, prior from" if options.order == "online" else "candidates ordered by"
            logger.info("%s: %s the %s", problem.key, how, where)
    if options.order != "online":
        return ranked_order(cset, options.order, options.seed, model, history)
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
        lease_s=options.lease_s,
        retry_failed=options.retry_failed,
        compile_timeout_s=options.compile_timeout_s,
    )


# ---- preparing dispatches --------------------------------------------------------------------
@dataclass
class PreparedInput:
    """What `prepare_dispatches` made of an input."""

    dispatches: list[PreparedDispatch]
    #: For the summary: how the model was built (a build the user must repeat with the flags).
    notes: list[str] = field(default_factory=list)
    #: A model or function: the flags that built it (None for dumped benchmarks).
    model_flags: tuple[str, ...] | None = None


def prepare_dispatches(path: Path, target: Target, work_dir: Path) -> PreparedInput:
    """Stripped + filled benchmark files for every distinct tunable dispatch of `path` (a model
    or function, a dumped dispatch benchmark, or a directory of them)."""
    from dispatchtune.ir.frontend import (
        dispatch_files,
        load_dispatch_files,
        load_problems,
        read_input,
        warn_if_f64_demoted,
    )

    path = Path(path)
    notes: list[str] = []
    model_flags: tuple[str, ...] | None = None
    text = "" if path.is_dir() else read_input(path)
    if path.is_dir():
        loaded = load_dispatch_files(dispatch_files(path), target, path)
    elif is_dispatch_benchmark(text):
        loaded = [(path, load_problems(path, target))]
    else:
        warn_if_f64_demoted(text, path)
        del text  # a large export is not held through the dump
        dumped = dump_dispatch_benchmarks(path, target, work_dir / "dumped")
        model_flags = dumped.compile_flags
        if NO_CONST_EVAL in dumped.compile_flags:
            # The spec was tuned on that build: the user's builds with the spec need the flag.
            notes.append(f"`{path.name}` fails to build with the target's flags (IREE's constant "
                         f"evaluation crashes on it), so its dispatches were dumped and tuned "
                         f"with `{NO_CONST_EVAL}`: compile it with that flag too.")
        # Most dispatches of a model are elementwise: skipped, as in a dump directory.
        loaded = load_dispatch_files(dumped.files, target, path)
    prepared: list[PreparedDispatch] = []
    seen: set[str] = set()
    for source, problems in loaded:
        for problem in problems[:1]:  # a dispatch's first root op is the one its spec configures
            if problem.key in seen:
                continue
            seen.add(problem.key)
            out = work_dir / problem.key / "benchmark.mlir"
            prepared.append(prepare_dispatch(source, problem, out))
    return PreparedInput(prepared, notes, model_flags)


LOCK_FILE = ".dispatchtune.lock"


@contextmanager
def locked_output_dir(out: Path) -> Iterator[None]:
    """Hold `out` for this process: a second run on it fails at once, naming the holder.

    An `fcntl.flock` on a lock file in the directory, held for the run: the kernel drops it when
    the process dies however it dies, so a dead run's lock is simply taken over. The file says
    who holds it (pid and host), for the message only.
    """
    import fcntl

    path = out / LOCK_FILE
    handle = path.open("a+")
    try:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            holder = handle.read().split()
            pid, host = [*holder, "?", "?"][:2]
            raise InputError(f"output directory {out} is in use by pid {pid} on host {host}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()} {socket.gethostname()}\n")
        handle.flush()
        yield
    finally:
        handle.close()  # releases the lock


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so a killed run stops cleanly with its log consistent.

    The handler raises in the main thread, which is never blocked for long in a call that does
    not return to Python: database calls have timeouts (`search.optuna_search.open_storage`)
    and waits poll.
    """
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
    options = options.for_target(target.name)
    check_waves_per_eu(options.waves_per_eu, target)
    devices = parse_devices(options.devices, options.runner, target.device_uri)
    if not options.compile_only:
        check_devices_here(devices, target)  # before anything is built
    # Absolute from here on: every path derived from these reaches IREE's tools, where a
    # relative name starting with '-' would be read as an option.
    out = Path(output_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    # Remote devices are connected (and their runtime version checked) before anything is built;
    # their connections serve every dispatch of the run.
    with (locked_output_dir(out), _sigterm_as_interrupt(),
          remote_runners(devices, connect=not options.compile_only) as runners):
        return _tune(Path(path).absolute(), target, out, options, candidates, runners)


def _tune(
    path: Path,
    target: Target,
    out: Path,
    options: TuneOptions,
    candidates: Sequence[Candidate] | CandidateFactory | None,
    runners: Mapping[str, RemoteRunner],
) -> TuneResult:
    results_path = out / "results.jsonl"
    history = list(read_results(results_path))
    log = ResultsLog(results_path)
    work = out / "work"
    session = uuid.uuid4().hex[:12]
    mode = progress_mode(options.progress)
    not_tuned: dict[str, str] = {}
    try:
        prepared_input = prepare_dispatches(path, target, work)
    except BaseException:
        # A refused input leaves the output directory as it found it (earlier runs' work stays).
        shutil.rmtree(work / "dumped", ignore_errors=True)
        with suppress(OSError):
            work.rmdir()  # only if this run created it and left it empty
        raise
    prepared = prepared_input.dispatches
    for dispatch in prepared:
        problem = dispatch.problem
        tuner = DispatchTuner(dispatch, target, options, log, history, session, work / problem.key,
                              runners=runners)
        source: CandidateSource | None = None
        progress = Progress(
            options.budget, tuner.benchmarked, problem.key, mode, options.estimator
        )
        try:
            # A device host that stays unreachable, or the study storage, stops the run: every
            # later dispatch needs them too. Re-running resumes.
            with skip_dispatch_on_error(problem.key, not_tuned, fatal=(RemoteError, StorageLost)):
                if tuner.benchmarked < options.budget:  # else resumed with the budget spent
                    if candidates is None:
                        source = candidate_source(problem, target, options, out, history)
                    elif callable(candidates):
                        source = candidates(problem, target, options)
                    else:
                        source = StaticOrder(candidates)
                    tuner.run(source, progress)
                tuner.reconfirm_if_interrupted(progress)
            if problem.key in not_tuned:
                logger.warning("%s: not tuned: %s", problem.key, not_tuned[problem.key])
        finally:
            progress.close()
            if source is not None:
                source.close()  # an online source hands its open claims back to the study
                if source.stop_reason and mode != "off":
                    logger.info("%s: search stopped: %s", problem.key, source.stop_reason)
        if not options.keep_binaries:
            # Binaries and raw inputs/outputs are rebuilt on demand; specs stay for the record.
            for pattern in ("c*/*.vmfb", "c*/*.bin", "baseline/*", "inputs/*.bin"):
                for leftover in (work / problem.key).glob(pattern):
                    leftover.unlink(missing_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # corrupt lines were already reported when resuming
        records = list(read_results(results_path))
    problems = [d.problem for d in prepared]
    result = write_outputs(records, problems, target, out, options, not_tuned=not_tuned,
                           notes=prepared_input.notes)
    if not options.keep_binaries:
        shutil.rmtree(work / "dumped", ignore_errors=True)
    if prepared_input.model_flags is not None:
        _say_configs_the_model_ignores(path, target, result, prepared_input.model_flags)
    return result


def spec_configs_not_applied(model: Path, target: Target, result: TuneResult,
                             flags: Sequence[str] | None = None) -> list[str]:
    """The dispatches whose spec configuration IREE does not apply when `model` itself is
    compiled with the spec. Each configuration was checked on its dumped benchmark, but IREE can
    give a dispatch another form inside the model (seen on gfx942: a batch matmul whose benchmark
    has a unit K loop the model's op lacks), and then the model silently keeps the default.
    `flags`: those that built the model (default: the target's)."""
    from dispatchtune.errors import DispatchTuneError
    from dispatchtune.ir.lowering import lower_if_torch
    from dispatchtune.ir.spec import applied_configs, config_applied

    chosen = [(s.problem.key, str(s.best["compilation_info"]))
              for s in result.summaries if s.in_spec and s.best]
    if not chosen:
        return []
    try:
        applied = applied_configs(lower_if_torch(model), target, result.spec_path, flags)
    except DispatchTuneError as exc:
        logger.warning("could not check the spec against the whole model: %s", exc)
        return []
    return [key for key, info in chosen if not any(config_applied(info, a) for a in applied)]


def _say_configs_the_model_ignores(model: Path, target: Target, result: TuneResult,
                                   flags: Sequence[str]) -> None:
    """Warn, and note in the summary, which spec configurations the model would not get."""
    missing = spec_configs_not_applied(model, target, result, flags)
    if not missing:
        return
    for key in missing:
        logger.warning("%s: its configuration applies to the dispatch's benchmark but not when %s "
                       "is compiled with the spec (IREE gives the op another form there): the "
                       "model keeps IREE's default for it", key, model.name)
    with result.summary_path.open("a") as summary:
        summary.write("\n## Checked against the whole model\n\n" + "".join(
            f"- `{key}`: the spec's configuration does not apply when `{model.name}` is compiled "
            "with it (IREE gives the op another form inside the model than in its benchmark)\n"
            for key in missing))
