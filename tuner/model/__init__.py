"""Whole-model tuning (`dispatchtune tune-model`): see `flow` for the steps.

Modules, one role each: `options` (the knobs), `entry` (the function benchmarked and its inputs),
`profile` (where the model's time goes, budget shares), `log` (`model_log.jsonl`), `decide` (the
keep rule over paired rounds), `steps` (the measured steps), `flow` (`tune_model`), `report`
(result, summary, plot). Building, running and comparing builds is the measure layer's
(`dispatchtune.measure`).
"""

from dispatchtune.tuner.model.entry import EntryFunction, find_entry, model_call
from dispatchtune.tuner.model.flow import tune_model
from dispatchtune.tuner.model.options import ModelTuneOptions
from dispatchtune.tuner.model.profile import (
    DispatchShare,
    allocate_budget,
    attribute_time,
    select_dispatches,
)
from dispatchtune.tuner.model.report import ModelTuneResult
from dispatchtune.tuner.model.steps import ModelStep, _ModelTuner

__all__ = [
    "DispatchShare",
    "EntryFunction",
    "ModelStep",
    "ModelTuneOptions",
    "ModelTuneResult",
    "_ModelTuner",
    "allocate_budget",
    "attribute_time",
    "find_entry",
    "model_call",
    "select_dispatches",
    "tune_model",
]
