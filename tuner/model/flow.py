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

Nothing one dispatch does aborts the run: a problem IREE cannot be given a configuration for is
refused before any budget goes to it (`profile.configurable_reason`), and any failure while
tuning or deciding one problem (its default build, its benchmark, a spec IREE drops) becomes that
problem's `skip_reason`, reported in `summary.md` with its share of the model's time. The run
fails only when the model itself does not compile or run. iree-turbine's torch-dialect exports are
lowered to a plain tensor function first (`ir.lowering.lower_torch_to_function`).

Steps 1 and 3-5 are `steps._ModelTuner`'s, the profile arithmetic of 2 is `profile`'s, the outputs
of 5 are `report`'s. Every model-level measurement and decision is appended to `model_log.jsonl`
as soon as it is known; a re-run with the same output directory reuses the profile, the dispatch
results (the loop resumes itself) and every model step whose inputs are unchanged, so nothing is
measured twice.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from dispatchtune.datasets.records import ResultRecord
from dispatchtune.errors import InputError
from dispatchtune.measure.builder import write_spec_file
from dispatchtune.measure.devices import (
    DeviceSpec,
    check_devices_here,
    parse_devices,
    remote_runners,
)
from dispatchtune.measure.runner import DispatchRow, Runner
from dispatchtune.targets import Target, get_target
from dispatchtune.tuner.model.options import ModelTuneOptions
from dispatchtune.tuner.model.profile import (
    DispatchShare,
    allocate_budget,
    attribute_time,
    configurable_reason,
    select_dispatches,
)
from dispatchtune.tuner.model.report import ModelTuneResult, write_result
from dispatchtune.tuner.model.steps import ModelStep, _ModelTuner

logger = logging.getLogger(__name__)


def tune_model(
    path: str | os.PathLike[str],
    target: Target | str,
    output_dir: str | os.PathLike[str],
    options: ModelTuneOptions | None = None,
) -> ModelTuneResult:
    """Tune a whole model; write `output_dir/tuning_spec.mlir` and `summary.md` (resumable).

    `options.device` may be `RUNNER/URI`, or a bare URI on `options.dispatch.runner`'s machine:
    then every benchmark and run, the dispatch loop's and the model's, happens there.
    """
    from dispatchtune.ir.lowering import lower_torch_to_function

    options = options or ModelTuneOptions()
    options.validate()
    target = get_target(target) if isinstance(target, str) else target
    (device,) = parse_devices([options.device] if options.device else [],
                              options.dispatch.runner, target.device_uri)
    source = Path(path).absolute()  # absolute: no derived path can read as a tool option
    if not source.is_file():
        raise InputError(f"no such file: {source}")
    # As `tune` does, before anything is built; there is no --compile-only to suggest here.
    check_devices_here([device], target, suggest_compile_only=False)
    model = lower_torch_to_function(source)
    out = Path(output_dir).absolute()
    out.mkdir(parents=True, exist_ok=True)
    # A remote device is connected (runtime version and driver checked) before anything is built.
    with remote_runners([device], suggest_compile_only=False) as runners:
        return _tune_model(model, source, target, out, options, device, runners.get(device.name))


def _tune_model(
    model: Path, source: Path, target: Target, out: Path, options: ModelTuneOptions,
    device: DeviceSpec, runner: Runner | None,
) -> ModelTuneResult:
    from dispatchtune.ir.frontend import load_problems

    tuner = _ModelTuner(model, target, out, options, runner=runner, source=source, device=device)
    if model != source:
        tuner.say(f"{source.name} is torch dialect: lowered to a tensor function ({model})")
    tuner._check_identity()
    try:
        profile = tuner.profile()
        profiled = profile.get("dispatches") or []
        # find_entry parsed the model already: the front end does not read it again.
        problems = load_problems(model, tuner.target, function_file=True) if profiled else []
        rows = [DispatchRow(d["name"], float(d["time_ms"]), int(d["calls"])) for d in profiled]
        shares, other_ms, total_ms = attribute_time(rows, problems)
        if not shares:
            raise InputError(f"{model}: no profiled dispatch has a tunable root op")
        selected = _select(shares, tuner.target, options)
        tuner.problems = {s.key: s.problem for s in shares}
        records = tuner.tune_dispatches(selected)

        kept: list[tuple[str, int]] = []
        steps: list[ModelStep] = []
        for share in selected:
            if share.budget == 0 or share.skip_reason:
                continue
            step = _decide(tuner, share, records, kept)
            steps.append(step)
            if step.kept is not None:
                kept.append((share.key, step.kept))
        final = tuner.final(kept)
        write_spec_file(tuner._spec_entries(kept), out / "tuning_spec.mlir")
    finally:
        tuner.cleanup()
    return write_result(out, tuner.target, tuner, profile, shares, other_ms, total_ms, steps,
                        kept, final)


def _select(
    shares: list[DispatchShare], target: Target, options: ModelTuneOptions
) -> list[DispatchShare]:
    """The problems to tune with their budgets; every other one gets its `skip_reason`.

    Known limits are checked first, so no budget goes to a problem that cannot be configured.
    """
    for share in shares:
        reason = configurable_reason(share.problem, target)
        if reason:
            share.skip_reason = f"cannot be configured: {reason}"
    configurable = [s for s in shares if not s.skip_reason]
    selected = select_dispatches(configurable, options.coverage, options.max_dispatches,
                                 options.min_share)
    if not selected and configurable:
        selected = configurable[:1]  # every key is below min_share: tune the slowest anyway
    # The coverage goal needs every selected problem tuned: say which budget reaches them all.
    enough = options.min_per_dispatch * len(selected)
    for share, budget in zip(
        selected,
        allocate_budget([s.time_ms for s in selected], options.budget, options.min_per_dispatch),
        strict=True,
    ):
        share.budget = budget
        if budget == 0:
            share.skip_reason = (f"no budget left (--budget {options.budget}, at least "
                                 f"{options.min_per_dispatch} per problem; --budget {enough} "
                                 f"reaches all {len(selected)} problems of --coverage "
                                 f"{options.coverage:g})")
    covered = sum(s.share for s in selected)
    # Coverage is the goal and the other knobs cap its cost: when a cap stops it short, the
    # reason names that cap and the value that would reach the goal, not just "not selected".
    short = "" if covered >= options.coverage else (
        f" (coverage stops at {covered:.1%}; {_reaching(configurable, options)})")
    for share in configurable:
        if share in selected:
            continue
        if share.share < options.min_share:
            share.skip_reason = f"below --min-share {options.min_share:g}{short}"
        elif covered >= options.coverage:
            share.skip_reason = (f"outside --coverage {options.coverage:g} (the "
                                 f"{len(selected)} slower problems cover {covered:.1%})")
        else:
            share.skip_reason = f"beyond --max-dispatches {options.max_dispatches}{short}"
    return selected


def _reaching(configurable: list[DispatchShare], options: ModelTuneOptions) -> str:
    """The --max-dispatches and --min-share with which the selection reaches --coverage."""
    covered, count = 0.0, 0
    for share in configurable:  # slowest first, as select_dispatches takes them
        if covered >= options.coverage:
            break
        covered += share.share
        count += 1
    if covered < options.coverage:
        return f"the configurable problems cover only {covered:.1%}"
    smallest = configurable[count - 1].share
    knobs = [f"--max-dispatches {count}"] if count > options.max_dispatches else []
    if smallest < options.min_share:
        knobs.append(f"--min-share {math.floor(smallest * 1000) / 1000:g}")
    budget = options.min_per_dispatch * count
    if budget > options.budget:
        knobs.append(f"--budget {budget}")
    return " ".join(knobs) + f" reach {options.coverage:g}"


def _decide(
    tuner: _ModelTuner, share: DispatchShare, records: list[ResultRecord],
    kept: list[tuple[str, int]],
) -> ModelStep:
    """The model-level step of one tuned problem; a failure of its own skips it, not the run."""
    try:
        finalists = tuner.finalists(records, share.problem)
        for f in finalists:
            tuner.candidate_info[(share.key, f["candidate_id"])] = f["compilation_info"]
        if not finalists:
            return ModelStep(share.key, [], None, "no candidate beat the default in isolation")
        return tuner.model_step(share, finalists, kept)
    except Exception as exc:  # one problem's failure must not discard the others' work
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        logger.warning("model step of %s failed: %s", share.key, reason)
        tuner.say(f"{share.key}: model step failed ({reason}); the model keeps its default")
        share.skip_reason = f"model step failed: {reason}"
        return ModelStep(share.key, [], None, share.skip_reason)
