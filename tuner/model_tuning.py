"""Kept for importers of the old module path (the CLI); the code lives in `tuner.model`."""

from dispatchtune.tuner.model import ModelTuneOptions, ModelTuneResult, tune_model

__all__ = ["ModelTuneOptions", "ModelTuneResult", "tune_model"]
