"""dispatchtune.costmodel: rank candidates (handwritten heuristic, random baseline, learned models)."""

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.heuristic import CPU_TERMS, GPU_TERMS, HeuristicModel, HeuristicTerm
from dispatchtune.costmodel.rank import ORDERS, rank

__all__ = [
    "CPU_TERMS",
    "GPU_TERMS",
    "ORDERS",
    "CostModel",
    "HeuristicModel",
    "HeuristicTerm",
    "rank",
]
