"""The steps of whole-model tuning: profile, tune dispatches, keep-if-the-model-gets-faster, final.

Every model-level measurement and decision is appended to `model_log.jsonl` as soon as it is
known, and each step first looks for its record there, so a re-run measures nothing twice.

Compile timeouts follow the measured default builds: a candidate build of the model or of a
dispatch gets `adaptive_timeout(default build time)` (at least 10 s, 5x the default), so a hung
compiler costs seconds instead of the configured ceiling. When the model's default build fails,
it is retried once with constant evaluation disabled (IREE 3.13 crashes in const-eval of BERT's
byte-pattern weights), and the whole run then uses that flag.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.datasets.records import ResultRecord, read_results
from dispatchtune.datasets.timing import speedup
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.ir.lowering import scan_input
from dispatchtune.logs import progress_mode
from dispatchtune.measure.builder import (
    check_applied,
    compile_module,
    sha256_file,
    write_spec_file,
)
from dispatchtune.measure.devices import DeviceSpec
from dispatchtune.measure.runner import Artifact, BenchOutcome, BenchSettings, LocalRunner, Runner
from dispatchtune.measure.verify import compare
from dispatchtune.problem import Problem
from dispatchtune.targets import Target
from dispatchtune.toolchain import NO_CONST_EVAL, iree_compiler_version
from dispatchtune.tuner.model.decide import KEEP_RULE, Verdict, judge, rounds_to_reach
from dispatchtune.tuner.model.entry import find_entry, model_call
from dispatchtune.tuner.model.log import ModelLog
from dispatchtune.tuner.model.options import ModelTuneOptions
from dispatchtune.tuner.model.profile import DispatchShare, dispatch_index

logger = logging.getLogger(__name__)


def adaptive_timeout(default_build_s: float, ceiling_s: float) -> float:
    """Compile timeout of a candidate build whose default build took `default_build_s`."""
    return min(ceiling_s, max(10.0, 5.0 * default_build_s))


@dataclass
class ModelStep:
    """One model-level decision: a key's top candidates built into the model and benchmarked."""

    key: str
    tried: list[dict[str, Any]]  # candidate_id, dispatch_speedup, model_speedup, status, ...
    kept: int | None  # candidate id kept, None when the model did not get faster
    note: str = ""


def benchmarked_per_key(records: Sequence[ResultRecord], target: Target) -> dict[str, int]:
    """Candidates that used up budget per problem key (as the loop counts them)."""
    counts: dict[str, int] = {}
    for r in records:
        if r.is_candidate and r.target == target.name and r.bench_status != "skipped":
            counts[r.problem_key] = counts.get(r.problem_key, 0) + 1
    return counts


class _ModelTuner:
    """The steps of one tune-model run; every measurement goes through `runner`."""

    def __init__(
        self, model: Path, target: Target, out: Path, options: ModelTuneOptions,
        runner: Runner | None = None, source: Path | None = None,
        device: DeviceSpec | None = None,
    ) -> None:
        self.model = model
        self.source = source or model  # the file the user gave (torch dialect is lowered first)
        self.target = target
        self.out = out
        self.options = options
        self.work = out / "work"
        self.log = ModelLog(out / "model_log.jsonl")
        self.entry = find_entry(model, options.function)
        device = device or DeviceSpec(options.device or target.device_uri)
        self.device = device.uri  # what the runner benchmarks on
        self.device_name = device.name  # what the log calls it (RUNNER/URI when remote)
        self.device_runner = device.runner
        self.timer = options.timer
        if self.timer == "auto":
            self.timer = "cpu" if self.device.startswith("local-sync") else "real"
        self.runner: Runner = runner or LocalRunner()
        self.settings = BenchSettings(options.repetitions, options.min_time_s,
                                      options.benchmark_timeout_s, self.timer)
        self.model_sha = scan_input(model)[0]  # streamed: a 100 MB model is never held twice
        self.model_timeout_s = options.compile_timeout_s  # until the default build is timed
        self.call = model_call(self.entry, self.work / "inputs", options.seed,
                               Path(options.inputs) if options.inputs else None)
        self.reference: list[np.ndarray] | None = None
        self.verify_note = ""
        self.builds: dict[str, Path] = {}
        self.problems: dict[str, Problem] = {}
        self.candidate_info: dict[tuple[str, int], str] = {}
        self.mode = progress_mode(options.progress)

    def say(self, text: str) -> None:
        if self.mode != "off":
            logger.info("tune-model: %s", text)

    # -- identity of the run (a results directory belongs to one model, target and device) ------
    def _check_identity(self) -> None:
        profile = self.log.find("profile")
        if profile is None:
            return
        for name, value in (("model_sha256", self.model_sha), ("target", self.target.name),
                            ("device", self.device_name), ("function", self.entry.name)):
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
        name = hashlib.sha1(json.dumps(sorted(kept)).encode()).hexdigest()[:12] if kept else "default"
        if name in self.builds:
            return self.builds[name], ""
        directory = self.work / "builds" / name
        spec: Path | None = None
        if kept:
            spec = write_spec_file(self._spec_entries(kept), directory / "spec.mlir")
        vmfb = directory / "model.vmfb"
        timeout = self.options.compile_timeout_s if not kept else self.model_timeout_s
        result = compile_module(self.model, self.target, spec, vmfb, timeout)
        if not kept and result.ok:
            self.model_timeout_s = adaptive_timeout(result.elapsed_s, self.options.compile_timeout_s)
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
        run = self.runner.run(Artifact(vmfb, self.device), self.call,
                              self.options.benchmark_timeout_s)
        if run.outputs is None:
            self.verify_note = f"default build did not run ({run.status}: {run.error})"
        self.reference = run.outputs
        return run.outputs

    def verify(self, vmfb: Path) -> tuple[str, float | None, str]:
        """(`ok` | `mismatch` | `error` | `skipped`, max |error|, note) against the default build."""
        reference = self.reference_outputs()
        if reference is None:
            return "skipped", None, self.verify_note or "verification disabled"
        run = self.runner.run(Artifact(vmfb, self.device), self.call,
                              self.options.benchmark_timeout_s)
        if run.outputs is None:
            return "error", None, f"run {run.status}: {run.error or 'no output'}"
        status, max_abs = compare(run.outputs, reference,
                                  [t.element_type for t in self.entry.results])
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
                    row[i] = self.benchmark(builds[i]).times_ms
                    bar.update(1)
                times.append(row)
        finally:
            bar.close()
        return times

    def benchmark(self, vmfb: Path, *, dispatch_statistics: bool = False) -> BenchOutcome:
        """One benchmark of a model build; a failure aborts the run (no decision without it)."""
        outcome = self.runner.benchmark(Artifact(vmfb, self.device), self.settings, self.call,
                                        dispatch_statistics=dispatch_statistics)
        if not outcome.ok:
            raise DispatchTuneError(f"benchmarking {vmfb.name} {outcome.status}: {outcome.error}")
        return outcome

    # -- 1. profile ----------------------------------------------------------------------------------
    def profile(self) -> dict[str, Any]:
        record = self.log.find("profile")
        if record is not None:
            self.say("reusing the profile in model_log.jsonl")
            self._use_flags(record)
            return record
        self.say(f"compiling {self.model.name} with the {self.target.name} flags and profiling it")
        started = time.monotonic()
        vmfb, error = self.build([])
        if vmfb is None and NO_CONST_EVAL not in self.target.compile_flags:
            self.say(f"the default build failed ({error}); retrying with {NO_CONST_EVAL}")
            self.target = replace(self.target,
                                  compile_flags=(*self.target.compile_flags, NO_CONST_EVAL))
            started = time.monotonic()
            vmfb, retry_error = self.build([])
            if vmfb is None:
                error = f"{error}; with {NO_CONST_EVAL}: {retry_error}"
            else:
                self.say(f"the model compiles with {NO_CONST_EVAL}: every build of this run uses it")
        if vmfb is None:
            raise InputError(f"{self.model}: the compiler-default {error}")
        build_s = time.monotonic() - started
        profiled = self.benchmark(vmfb, dispatch_statistics=True)
        return self.log.append(
            "profile", model=str(self.model), source=str(self.source),
            model_sha256=self.model_sha, target=self.target.name,
            device=self.device_name, function=self.entry.name,
            iree_version=iree_compiler_version(),
            timer=self.timer, default_build_s=build_s,
            compile_flags=list(self.target.compile_flags), times_ms=profiled.times_ms,
            dispatches=[{"name": r.name, "time_ms": r.time_ms, "calls": r.calls}
                        for r in profiled.dispatches],
        )

    def _use_flags(self, profile: dict[str, Any]) -> None:
        """Resume with the flags and build time the profile was made with."""
        flags = tuple(profile.get("compile_flags", self.target.compile_flags))
        if flags != self.target.compile_flags:
            self.target = replace(self.target, compile_flags=flags)
        if "default_build_s" in profile:
            self.model_timeout_s = adaptive_timeout(float(profile["default_build_s"]),
                                                    self.options.compile_timeout_s)

    # -- 3. dispatch tuning ----------------------------------------------------------------------
    def tune_dispatches(self, selected: Sequence[DispatchShare]) -> list[ResultRecord]:
        """Run the dispatch loop on each selected key with its budget; return every record."""
        from dispatchtune.ir.frontend import load_problems
        from dispatchtune.measure.benchfile import dump_dispatch_benchmarks
        from dispatchtune.tuner.loop import tune

        dispatch_dir = self.out / "dispatches"
        results = dispatch_dir / "results.jsonl"
        from dispatchtune.tuner.report import confirmation_pending

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the loop reports corrupt lines when it resumes
            logged = list(read_results(results))
        spent = benchmarked_per_key(logged, self.target)
        tuned = [s for s in selected if s.budget > 0]

        def unfinished(share: DispatchShare) -> bool:
            """Budget left, or screening an interrupted run left unconfirmed."""
            if spent.get(share.key, 0) < share.budget:
                return True
            return self.options.top > 0 and confirmation_pending(logged, share.key,
                                                                 self.target.name)

        # Finished keys are not handed to the loop again: it would only dump, strip and re-read
        # their benchmarks to find nothing left to do.
        todo = [s for s in tuned if unfinished(s)]
        for share in tuned:
            failed = self.log.find("dispatch_failed", key=share.key, budget=share.budget)
            if failed is not None:
                share.skip_reason = str(failed["reason"])
                self.say(f"{share.key}: not tuned in an earlier run ({share.skip_reason})")
            elif share not in todo:
                self.say(f"{share.key}: {spent[share.key]} benchmarks already in results.jsonl")
        todo = [s for s in todo if not s.skip_reason]
        if todo:
            dumped = dump_dispatch_benchmarks(self.model, self.target, self.work / "dumped")
            files = {dispatch_index(f.name): f for f in dumped.files}
        for position, share in enumerate(todo, start=1):
            self.say(
                f"[{position}/{len(todo)}] tuning {share.key} ({share.share:.0%} of the model, "
                f"{len(share.dispatches)} dispatch(es)) with {share.budget} benchmarks"
            )
            try:
                source = files.get(dispatch_index(share.slowest))
                if source is None:
                    raise DispatchTuneError(f"no dumped benchmark for dispatch {share.slowest}")
                found = load_problems(source, self.target)[0]
                if found.key != share.key:
                    raise DispatchTuneError(
                        f"dumped benchmark {source.name} holds {found.key}, not {share.key}"
                    )
                timeout = self._dispatch_timeout(source)
                # The dispatch loop benchmarks on the model's device, wherever that is.
                options = replace(self.options.dispatch, budget=share.budget,
                                  confirm_top=self.options.top, seed=self.options.seed,
                                  progress=self.options.progress, compile_timeout_s=timeout,
                                  devices=(self.device,), runner=self.device_runner)
                tune(source, self.target, dispatch_dir, options)
            except Exception as exc:  # one dispatch's failure must not discard the others' work
                reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
                share.skip_reason = f"dispatch tuning failed: {reason}"
                self.say(f"{share.key}: {share.skip_reason}; tuning the others")
                self.log.append("dispatch_failed", key=share.key, budget=share.budget,
                                reason=share.skip_reason)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # corrupt lines were reported by the loop
            records = list(read_results(results))
        if todo:
            self._write_dispatch_report(records, [s.problem for s in tuned if not s.skip_reason])
            if not self.options.keep_binaries:
                shutil.rmtree(self.work / "dumped", ignore_errors=True)
        return records

    def _dispatch_timeout(self, benchmark: Path) -> float:
        """Candidate compile timeout of a dispatch: adapted to its default build, timed here."""
        ceiling = self.options.compile_timeout_s
        probe = self.work / "dumped" / f"{benchmark.stem}.default.vmfb"
        result = compile_module(benchmark, self.target, None, probe, 300.0,
                                with_target_flags=False)
        probe.unlink(missing_ok=True)
        if not result.ok:
            return ceiling  # the loop's own default build reports the failure
        return adaptive_timeout(result.elapsed_s, ceiling)

    def _write_dispatch_report(self, records: list[ResultRecord], problems: list[Problem]) -> None:
        """`dispatches/summary.md` over every tuned key (each loop call wrote only its own)."""
        from dispatchtune.tuner.report import write_outputs

        write_outputs(records, problems, self.target, self.out / "dispatches",
                      self.options.dispatch)

    def finalists(self, records: Sequence[ResultRecord], problem: Problem) -> list[dict[str, Any]]:
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
        ids = [f["candidate_id"] for f in finalists]
        base = [list(k) for k in kept]
        done = self.log.find("step", key=share.key, base=base, candidates=ids, timer=self.timer,
                             rounds=self.options.model_rounds, rule=KEEP_RULE)
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
            if sha256_file(vmfb) == sha256_file(current):
                # The config is what the compiler already picks in this model: nothing to gain.
                entry.update(status="identical", error="model binary identical to the current one")
                continue
            applied, error = check_applied(self.model, self.target, vmfb.with_name("spec.mlir"),
                                           finalist["compilation_info"])
            if applied == "error":
                entry.update(status="error", error=error)
                continue
            if applied != "ok":
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
                ratios = [speedup(min(r[0]), min(r[index])) for r in times]
                entry.update(model_speedup=float(np.median(ratios)), ratios=ratios,
                             times_ms=[r[index] for r in times])
            base_times = [r[0] for r in times]
            best, best_vmfb = max(builds, key=lambda b: b[0]["model_speedup"])
            verdict = self._judge_adaptively(share.key, current, best, best_vmfb, base_times)
            if verdict.decision == "keep":
                kept_id = int(best["candidate_id"])
            else:
                note = (f"best candidate {best['candidate_id']}: {verdict.text}; kept only above "
                        f"{self.options.min_model_speedup}x with p <= {self.options.keep_alpha}")
        else:
            base_times = []
            counts: dict[str, int] = {}
            for t in tried:
                counts[t["status"]] = counts.get(t["status"], 0) + 1
            # e.g. "not_applied: 2": IREE dropped the spec in the model (said once, with the count)
            note = "no candidate could be measured in the model (" + ", ".join(
                f"{status}: {n}" for status, n in sorted(counts.items())) + ")"
        self.log.append("step", key=share.key, base=base, candidates=ids, timer=self.timer,
                        rounds=self.options.model_rounds, rule=KEEP_RULE, tried=tried,
                        kept=kept_id, note=note, base_times_ms=base_times)
        return ModelStep(share.key, tried, kept_id, note)

    def _judge_adaptively(
        self, key: str, current: Path, best: dict[str, Any], best_vmfb: Path,
        base_times: list[list[float]],
    ) -> Verdict:
        """`decide.judge` on the best candidate, adding rounds of it vs `current` while undecided.

        Only a close call pays for more rounds; `best` and `base_times` get the extra rounds.
        At least `rounds_to_reach(keep_alpha)` rounds in all, so a run with few `--model-rounds`
        can still keep a candidate that wins every round.
        """
        options = self.options
        limit = max(options.model_rounds, options.model_rounds_max,
                    rounds_to_reach(options.keep_alpha))
        verdict = judge(best["ratios"], options.min_model_speedup, options.keep_alpha)
        while verdict.decision == "undecided" and verdict.rounds < limit:
            extra = min(options.model_rounds, limit - verdict.rounds)
            self.say(f"model step {key}: candidate {best['candidate_id']} undecided "
                     f"({verdict.text}); {extra} more rounds")
            times = self.measure([current, best_vmfb], extra, f"model {key} (more rounds)")
            best["ratios"] += [speedup(min(r[0]), min(r[1])) for r in times]
            best["times_ms"] += [r[1] for r in times]
            base_times += [r[0] for r in times]
            best["model_speedup"] = float(np.median(best["ratios"]))
            verdict = judge(best["ratios"], options.min_model_speedup, options.keep_alpha)
        best.update(rounds=verdict.rounds, wins=verdict.wins, p_value=verdict.p_value)
        return verdict

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

