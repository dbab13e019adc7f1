"""Which model ranks a target's candidates: a user's model file, the installed default, or the heuristic.

Default models ship in `costmodel/models/` (package data), one per target name: `host.json`
(trained on the two shipped CPU datasets, AVX-512 and AVX2, `datasets/data/`; see their cards) and
`gfx942.json` (a pairwise GPU prior trained on expert tuning specs; docs/gpu_order.md). An AMD
CDNA GPU without a model of its own (gfx908, gfx90a, gfx950: wave64 with MFMA intrinsics) takes
gfx942's. A target without a default model is ranked by the handwritten heuristic.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.heuristic import HeuristicModel

MODELS_DIR = Path(__file__).resolve().parent / "models"

logger = logging.getLogger(__name__)

#: The model an AMD CDNA GPU (MFMA intrinsics) without its own takes. The prior's features are
#: relative to the chip (its CUs, LDS, intrinsics), and on the gfx90a and gfx950 spaces of the
#: expert files' dispatches it puts IREE's own default configurations for those GPUs far earlier
#: than the heuristic does, as on gfx942 (docs/gpu_order.md, part 24).
CDNA_MODEL = "gfx942"


def default_model_path(target_name: str) -> Path | None:
    """The installed default model file of a target, if one ships.

    A GPU target named by product (`mi300x`, `rocm:mi308x`) uses its architecture's model
    (`gfx942.json`); the architecture of a product name comes from IREE's target table. Another
    CDNA GPU (MFMA intrinsics in IREE's description) uses `CDNA_MODEL`'s. A named llvm-cpu
    target (`llvm-cpu:znver4`) uses the host model: it is trained on CPU logs whose features
    already carry the vector width and registers of the CPU they ran on.
    """
    return _default_model(target_name)[0]


def _default_model(target_name: str) -> tuple[Path | None, bool]:
    """`default_model_path`, and whether the model is `CDNA_MODEL`'s lent to another CDNA GPU."""
    from dispatchtune.errors import TargetError
    from dispatchtune.targets import get_target

    names = [target_name]
    target = None
    if target_name.startswith("llvm-cpu:"):
        names.append("host")
    else:
        try:
            target = get_target(target_name)
        except TargetError:
            target = None
        if target is not None and target.is_gpu:
            names.append(target.arch)
    for name in names:
        path = MODELS_DIR / f"{name}.json"
        if path.is_file():
            return path, False
    if target is not None and target.is_gpu:
        # A product name (`rocm:mi308x`): IREE knows its architecture (one cached probe).
        try:
            facts = target.gpu_facts()
        except TargetError:
            return None, False
        path = MODELS_DIR / f"{facts.arch}.json"
        if path.is_file():
            return path, False
        path = MODELS_DIR / f"{CDNA_MODEL}.json"
        if any(name.startswith("MFMA_") for name in facts.mma_intrinsics) and path.is_file():
            return path, True
    return None, False


def default_order(target_name: str, model_path: str | Path | None = None) -> str:
    """The order used when none is asked for: `model` with a model file or on a target that ships
    one, otherwise `heuristic`. Held out, the installed models beat the heuristic on every target
    they ship for: on gfx942 they put expert-tuned configurations far earlier (docs/gpu_order.md);
    on CPU the host model, trained on an AVX-512 and an AVX2 machine, needs a median of 2.5
    benchmarks to come within 5% of the best against the heuristic's 7.2, each dispatch held out
    on both machines (docs/costmodels.md)."""
    if model_path is not None:
        return "model"
    return "model" if default_model_path(target_name) is not None else "heuristic"


def model_for_target(target_name: str, model_path: str | Path | None = None) -> tuple[CostModel, str]:
    """The model to rank with and a short description of where it came from.

    `model_path` (a user's file) wins; otherwise the target's installed default; otherwise the
    heuristic. A bad or mismatched model file is a one-line error (`load_model`); a model trained
    only on the other kind of target (GPU logs for a CPU target, or the reverse) is used with a
    warning.
    """
    from dispatchtune.costmodel.modelfile import load_cost_model as load_model

    if model_path is not None:
        model, where = load_model(model_path), f"model file {model_path}"
    else:
        default, lent = _default_model(target_name)
        if default is None:
            return HeuristicModel(), "heuristic (no model for this target)"
        model, where = load_model(default), f"installed default model {default.name}"
        if lent:
            where += f" (the {CDNA_MODEL} prior, for another CDNA GPU)"
    warn_if_trained_elsewhere(model.metadata.get("target_kinds"), target_name, where)
    return model, where


def warn_if_trained_elsewhere(trained_on: object, target_name: str, where: str) -> bool:
    """Log a warning if a model's recorded target kinds ("cpu"/"gpu") exclude the target's kind."""
    from dispatchtune.targets import get_target

    if not isinstance(trained_on, list) or not trained_on:
        return False  # not recorded: nothing to say
    kind = "gpu" if get_target(target_name).is_gpu else "cpu"
    if kind in trained_on:
        return False
    logger.warning("the %s was trained on %s targets only; its ranking of %s target %s is "
                   "unvalidated", where, "/".join(map(str, trained_on)).upper(), kind.upper(),
                   target_name)
    return True

