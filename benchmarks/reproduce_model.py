"""Reproduce a `tune-model` run's end-to-end speedup separately from the run (issue #21, goal 6).

    .venv/bin/python benchmarks/reproduce_model.py MODEL.mlir TUNE_OUT_DIR [--pairs 12]

The model is compiled with the run's own compile flags (the profile record of
`TUNE_OUT_DIR/model_log.jsonl`) once without and once with
`--iree-codegen-tuning-spec-path=TUNE_OUT_DIR/tuning_spec.mlir`. Then `--pairs` pairs of
`iree-benchmark-module` runs, alternating which build goes first (so a position effect, e.g. the
second run of a pair finding warm caches or a quieter core, cancels over the pairs), on the inputs
tune-model used (the same seeded inputs, or the same `--inputs` file). A run's time is its fastest
repetition with the run's timer (CPU time on local-sync), as in tune-model. Printed: default and
tuned ms, the median paired speedup with its range, "tuned faster in k of N", the load average,
and beside them the speedup tune-model reported (its final rounds in `model_log.jsonl`).

Building and benchmarking go through the project's measure layer (`measure.builder`,
`measure.runner`), the inputs through tune-model's own `model_call`: nothing here is a second
compile/benchmark stack.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune.datasets.timing import speedup
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.ir.lowering import lower_torch_to_function, scan_input
from dispatchtune.measure.builder import compile_module, sha256_file
from dispatchtune.measure.devices import split_entry
from dispatchtune.measure.runner import Artifact, BenchSettings, LocalRunner, Runner
from dispatchtune.targets import Target, get_target
from dispatchtune.tuner.model.entry import find_entry, model_call
from dispatchtune.tuner.model.log import ModelLog


@dataclass
class Reproduction:
    """A separate default-vs-tuned measurement of one tune-model output directory."""

    model: str
    out_dir: str
    pairs: int
    timer: str
    compile_flags: list[str]
    identical_binaries: bool  # the spec changed nothing (e.g. nothing was kept)
    default_ms: list[float]  # one value per pair: the run's fastest repetition
    tuned_ms: list[float]
    ratios: list[float]  # default / tuned per pair
    speedup: float  # median paired speedup
    tuned_faster: int  # pairs in which the tuned build was faster
    reported: float | None  # tune-model's median final speedup (None: no final record)
    reported_low: float | None
    reported_high: float | None
    load_before: float
    load_after: float

    @property
    def text(self) -> str:
        def spread(values: Sequence[float]) -> str:
            return f"{np.median(values):.3f} ms (min {min(values):.3f}, max {max(values):.3f})"

        lines = [
            f"{self.model}: {self.out_dir}/tuning_spec.mlir, {self.pairs} alternating pairs, "
            f"{self.timer} time, load average {self.load_before:.1f} -> {self.load_after:.1f}",
            f"  default {spread(self.default_ms)}",
            f"  tuned   {spread(self.tuned_ms)}",
            f"  separate run: {self.speedup:.3f}x (pairs {min(self.ratios):.3f}-"
            f"{max(self.ratios):.3f}), tuned faster in {self.tuned_faster} of {self.pairs}",
        ]
        if self.reported is not None:
            lines.append(f"  tune-model reported: {self.reported:.3f}x (rounds "
                         f"{self.reported_low:.3f}-{self.reported_high:.3f})")
        if self.identical_binaries:
            lines.append("  the spec changes nothing: both builds are byte-identical (an A/A "
                         "comparison: the spread is the noise)")
        return "\n".join(lines)


def reported_speedup(log: ModelLog) -> tuple[float, float, float] | None:
    """(median, min, max) of the paired round speedups tune-model's final record reports."""
    final = log.find("final")
    if final is None:
        return None
    default = np.asarray([min(t) for t in final["default_times_ms"]], dtype=float)
    tuned = np.asarray([min(t) for t in final["tuned_times_ms"]], dtype=float)
    ratios = speedup(default, tuned)
    return float(np.median(ratios)), float(ratios.min()), float(ratios.max())


def _run_target(profile: dict[str, Any]) -> Target:
    """The target with exactly the compile flags the run used (e.g. a const-eval retry's)."""
    target = get_target(str(profile["target"]))
    return replace(target, compile_flags=tuple(profile["compile_flags"]))


def reproduce(
    model: Path, out_dir: Path, pairs: int = 12, *, repetitions: int = 5, min_time_s: float = 0.05,
    seed: int = 0, inputs: Path | None = None, runner: Runner | None = None,
    work: Path | None = None,
) -> Reproduction:
    """Build default and tuned once, then benchmark them in `pairs` alternating pairs."""
    if pairs < 1:
        raise InputError("--pairs must be at least 1")
    model, out_dir = model.absolute(), out_dir.absolute()
    spec = out_dir / "tuning_spec.mlir"
    if not (out_dir / "model_log.jsonl").is_file() or not spec.is_file():
        raise InputError(f"{out_dir} holds no finished tune-model run (model_log.jsonl and "
                         "tuning_spec.mlir)")
    log = ModelLog(out_dir / "model_log.jsonl")
    profile = log.find("profile")
    if profile is None:
        raise InputError(f"{out_dir}/model_log.jsonl has no profile record")
    lowered = lower_torch_to_function(model)  # the file the run compiled (cached lowering)
    if scan_input(lowered)[0] != profile["model_sha256"]:
        raise InputError(f"{out_dir} is a tune-model run of another model ({profile['model']})")
    target = _run_target(profile)
    entry = find_entry(lowered, str(profile["function"]))
    remote, device = split_entry(str(profile["device"]))
    if remote and runner is None:
        raise InputError(f"{out_dir} was measured on {profile['device']}: reproduce it on "
                         "that machine (this tool benchmarks here)")
    runner = runner or LocalRunner()
    settings = BenchSettings(repetitions, min_time_s, 300.0, str(profile["timer"]))
    with tempfile.TemporaryDirectory(dir=work, prefix="reproduce-") as tmp:
        builds = []
        for name, spec_path in (("default", None), ("tuned", spec)):
            vmfb = Path(tmp) / f"{name}.vmfb"
            result = compile_module(lowered, target, spec_path, vmfb, 1800.0)
            if not result.ok:
                raise DispatchTuneError(f"the {name} build failed ({result.status}): {result.error}")
            builds.append(Artifact(vmfb, device))
        identical = sha256_file(builds[0].vmfb) == sha256_file(builds[1].vmfb)
        call = model_call(entry, Path(tmp) / "inputs", seed, inputs)
        load_before = os.getloadavg()[0]
        times: list[list[float]] = [[], []]
        for pair in range(pairs):
            for index in ((0, 1) if pair % 2 == 0 else (1, 0)):
                outcome = runner.benchmark(builds[index], settings, call)
                if not outcome.ok:
                    raise DispatchTuneError(f"benchmarking the {('default', 'tuned')[index]} "
                                            f"build {outcome.status}: {outcome.error}")
                times[index].append(min(outcome.times_ms))
        load_after = os.getloadavg()[0]
    ratios = speedup(np.asarray(times[0]), np.asarray(times[1]))
    reported = reported_speedup(log)
    return Reproduction(
        model=str(model), out_dir=str(out_dir), pairs=pairs, timer=settings.timer,
        compile_flags=list(target.compile_flags), identical_binaries=identical,
        default_ms=times[0], tuned_ms=times[1], ratios=ratios.tolist(),
        speedup=float(np.median(ratios)), tuned_faster=int((ratios > 1.0).sum()),
        reported=reported[0] if reported else None, reported_low=reported[1] if reported else None,
        reported_high=reported[2] if reported else None,
        load_before=load_before, load_after=load_after,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="the model tune-model was given")
    parser.add_argument("out_dir", type=Path, help="tune-model's --output-dir")
    parser.add_argument("--pairs", type=int, default=12, help="alternating default/tuned pairs")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repetition")
    parser.add_argument("--seed", type=int, default=0, help="tune-model's --seed (inputs)")
    parser.add_argument("--inputs", type=Path, default=None, help="tune-model's --inputs .npz")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    try:
        result = reproduce(args.model, args.out_dir, args.pairs, repetitions=args.repetitions,
                           min_time_s=args.min_time, seed=args.seed, inputs=args.inputs)
    except DispatchTuneError as exc:
        print(f"error: {exc}".splitlines()[0], file=sys.stderr)
        return 2
    print(result.text)
    if args.json is not None:
        args.json.write_text(json.dumps({**asdict(result), "text": result.text}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
