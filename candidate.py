"""`Candidate`: one configuration of one problem, as search produces it and measure consumes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: GPU attention candidates carry IREE's `decomposition_config` (the intrinsics and subgroups of
#: its two matmuls) inside their lowering_config, so that a candidate stays one
#: `compilation_info` string; a spec moves it back to the op's own attribute (`ir.spec`).
DECOMPOSITION_KEY = "decomposition_config"


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: its row in the enumeration table and its `compilation_info`."""

    candidate_id: int
    compilation_info: str
    pipeline: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    rank: int = -1
    score: float | None = None


def with_decomposition(info: Any, decomposition: Any) -> Any:
    """A compilation_info whose lowering_config carries `decomposition` (the candidate form)."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    info = iree_codegen.CompilationInfoAttr(info)
    if not iree_gpu.LoweringConfigAttr.isinstance(info.lowering_config):
        return info
    lowering = iree_gpu.LoweringConfigAttr(info.lowering_config).attributes
    entries = {lowering[i].name: lowering[i].attr for i in range(len(lowering))}
    entries[DECOMPOSITION_KEY] = decomposition
    config_attr = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
    return iree_codegen.CompilationInfoAttr.get(config_attr, info.translation_info)
