"""dispatchtune.search: exact enumeration of every valid configuration of a dispatch.

GPU spaces come from IREE's own SMT constraints, CPU spaces from our Z3 model of llvm-cpu
(`search/cpu.py`); both are solved by the columnar engine (`search/engine.py`). Importing this
package is cheap: IREE and Z3 load on first use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dispatchtune.problem import Problem
    from dispatchtune.search.space import CandidateSet
    from dispatchtune.targets import Target

__all__ = ["HEURISTIC_FILTERS", "CandidateSet", "enumerate_candidates"]

#: Whether a GPU space keeps, by default, the constraints IREE marks as heuristic filters
#: ("Additional heuristic filters to narrow the search space"). It does not: on 14 GEMMs IREE's
#: tuner measured on an MI300X the fastest candidate lies outside them in 13, a median 6%
#: faster than the fastest inside, and so do most expert configurations (docs/gpu_order.md,
#: parts 2 and 35). Its validity constraints always stay.
HEURISTIC_FILTERS = False


def __getattr__(name: str) -> object:
    # Lazy: the table type pulls in pandas, which `import dispatchtune.search` should not.
    if name == "CandidateSet":
        from dispatchtune.search.space import CandidateSet

        return CandidateSet
    raise AttributeError(f"module 'dispatchtune.search' has no attribute {name!r}")


def enumerate_candidates(
    problem: Problem,
    target: Target | str,
    pipeline: str | None = None,
    limit: int | None = None,
    *,
    extra_knobs: Mapping[str, Sequence[int]] | None = None,
    heuristic_filters: bool = HEURISTIC_FILTERS,
) -> CandidateSet:
    """Every valid configuration of `problem` on `target`, as a `CandidateSet`.

    `pipeline` restricts to one pipeline ("TileAndFuse", "VectorDistribute", "DoubleTilingExpert",
    "ConvTileAndDecomposeExpert"); `limit` keeps the first N rows of the deterministic order.
    `extra_knobs` (GPU) turns knobs IREE's constraints fix into explicit dimensions, e.g.
    `{"prefetch_num_stages": (1, 2, 3)}`. `heuristic_filters=True` (GPU) keeps the constraints
    IREE marks as heuristic filters, which the default drops (`HEURISTIC_FILTERS`); IREE's
    validity constraints always stay.
    """
    from dispatchtune.errors import DispatchTuneError, UnsupportedProblem
    from dispatchtune.targets import get_target

    resolved = get_target(target) if isinstance(target, str) else target
    if limit is not None and limit < 0:
        raise DispatchTuneError(f"limit must be >= 0, got {limit}")
    if problem.is_pooling:
        # Said once for every target: on a GPU IREE's own answer ("no constraints ... no MMA
        # intrinsic fits these element types?") would blame the element types.
        raise UnsupportedProblem(
            "dispatchtune tunes contractions, convolutions and attention, not pooling (no channel "
            "loops to tile on the CPU; IREE emits no GPU constraints for it)"
        )
    if resolved.is_gpu:
        from dispatchtune.search.gpu import enumerate_gpu

        return enumerate_gpu(problem, resolved, pipeline, limit, extra_knobs, heuristic_filters)
    if extra_knobs:
        raise DispatchTuneError("extra_knobs applies to GPU targets only")
    from dispatchtune.search.cpu import enumerate_cpu

    return enumerate_cpu(problem, resolved, pipeline, limit)
