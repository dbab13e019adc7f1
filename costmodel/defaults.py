"""Which model ranks a target's candidates: a user's model file, the installed default, or the heuristic.

Default models ship in `costmodel/models/` (package data), one per target name (`host.json`),
trained on the shipped datasets (`datasets/data/`); see the dataset card for how. A target without
a default model is ranked by the handwritten heuristic.
"""

from __future__ import annotations

from pathlib import Path

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.heuristic import HeuristicModel

MODELS_DIR = Path(__file__).resolve().parent / "models"


def default_model_path(target_name: str) -> Path | None:
    """The installed default model file of a target, if one ships.

    A named llvm-cpu target (`llvm-cpu:znver4`) uses the host model: it is trained on CPU logs
    whose features already carry the vector width and registers of the CPU they ran on.
    """
    for name in (target_name, "host") if target_name.startswith("llvm-cpu:") else (target_name,):
        path = MODELS_DIR / f"{name}.json"
        if path.is_file():
            return path
    return None


def model_for_target(target_name: str, model_path: str | Path | None = None) -> tuple[CostModel, str]:
    """The model to rank with and a short description of where it came from.

    `model_path` (a user's file) wins; otherwise the target's installed default; otherwise the
    heuristic. A bad or mismatched model file is a one-line error (`load_model`).
    """
    from dispatchtune.costmodel.modelfile import load_model

    if model_path is not None:
        return load_model(model_path), f"model file {model_path}"
    default = default_model_path(target_name)
    if default is not None:
        return load_model(default), f"installed default model {default.name}"
    return HeuristicModel(), "heuristic (no model for this target)"
