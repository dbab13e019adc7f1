"""dispatchtune.costmodel: rank candidates (handwritten heuristics, random baseline, learned models).

`KnobHeuristicModel` scores a foreign kernel's raw knob table where the feature vocabulary does
not reach (power-of-two sizes first).

The learned models (`RandomForestModel`, `GBMRegressorModel`, `LambdaRankModel`, `make_model`) and
their safe file format (`save_model`, `load_model`) are imported on first use: they pull in
scikit-learn and LightGBM, which ranking with the heuristic does not need.
"""

from typing import Any

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.heuristic import CPU_TERMS, GPU_TERMS, HeuristicModel, HeuristicTerm
from dispatchtune.costmodel.knob_heuristic import KnobHeuristicModel
from dispatchtune.costmodel.rank import ORDERS, rank

_LAZY = {
    "LearnedModel": "learned", "RandomForestModel": "learned", "GBMRegressorModel": "learned",
    "LambdaRankModel": "learned", "MODELS": "learned", "make_model": "learned",
    "save_model": "modelfile", "load_model": "modelfile", "model_for_target": "defaults",
    "default_model_path": "defaults",
}

__all__ = [
    "CPU_TERMS",
    "GPU_TERMS",
    "ORDERS",
    "CostModel",
    "HeuristicModel",
    "HeuristicTerm",
    "KnobHeuristicModel",
    "rank",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"dispatchtune.costmodel.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dispatchtune.costmodel' has no attribute {name!r}")
