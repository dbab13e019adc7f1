"""dispatchtune: ML-guided tuning of IREE compiler dispatches.

Imports flow one way (README "Layout", checked by tests/test_architecture.py): `cli` -> `tuner`
-> (`measure` -> `ir`) and (`search` -> `costmodel` -> `features` -> `datasets`), every layer on
the shared vocabulary (`problem`, `targets`, `candidate`, `toolchain`, `errors`, `logs`).
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
