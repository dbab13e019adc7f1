"""dispatchtune: ML-guided tuning of IREE compiler dispatches.

Data flows one way: `tuner` (IREE side) -> `search` (Z3 enumeration, ordering) -> `costmodel`
(ranking) -> `features` (feature tables); `datasets` is the shared record format, and
`problem`/`targets` the shared vocabulary.
"""

from typing import TYPE_CHECKING, Any

from dispatchtune.errors import DispatchTuneError, InputError, TargetError
from dispatchtune.ir.frontend import load_problems
from dispatchtune.problem import Problem
from dispatchtune.targets import Target, get_target, list_targets
from dispatchtune.version import __version__

if TYPE_CHECKING:
    from dispatchtune.costmodel.rank import rank


__all__ = [
    "DispatchTuneError",
    "InputError",
    "Problem",
    "Target",
    "TargetError",
    "__version__",
    "get_target",
    "list_targets",
    "load_problems",
    "rank",
]


def __getattr__(name: str) -> Any:
    # Lazy: ranking imports pandas and the cost models; `import dispatchtune` stays cheap.
    if name == "rank":
        from dispatchtune.costmodel.rank import rank

        return rank
    raise AttributeError(f"module 'dispatchtune' has no attribute {name!r}")
