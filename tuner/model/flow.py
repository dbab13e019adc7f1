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

Steps 1 and 3-5 are `steps._ModelTuner`'s, the profile arithmetic of 2 is `profile`'s, the outputs
of 5 are `report`'s. Every model-level measurement and decision is appended to `model_log.jsonl`
as soon as it is known; a re-run with the same output directory reuses the profile, the dispatch
results (the loop resumes itself) and every model step whose inputs are unchanged, so nothing is
measured twice.
"""

from __future__ import annotations

import os
from pathlib import Path

from dispatchtune.errors import InputError
from dispatchtune.measure.builder import write_spec_file
from dispatchtune.measure.runner import DispatchRow
from dispatchtune.targets import Target, get_target
from dispatchtune.tuner.model.options import ModelTuneOptions
from dispatchtune.tuner.model.profile import allocate_budget, attribute_time, select_dispatches
from dispatchtune.tuner.model.report import ModelTuneResult, write_result
from dispatchtune.tuner.model.steps import ModelStep, _ModelTuner


def tune_model(
    path: str | os.PathLike[str],
    target: Target | str,
    output_dir: str | os.PathLike[str],
    options: ModelTuneOptions | None = None,
) -> ModelTuneResult:
    """Tune a whole model; write `output_dir/tuning_spec.mlir` and `summary.md` (resumable)."""
    from dispatchtune.ir.frontend import load_problems

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
        write_spec_file(tuner._spec_entries(kept), out / "tuning_spec.mlir")
    finally:
        tuner.cleanup()
    return write_result(out, target, tuner, profile, shares, other_ms, total_ms, steps, kept,
                        final)

