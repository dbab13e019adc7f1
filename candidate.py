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


def configured_compilation_infos(module_text: str) -> list[str]:
    """The `compilation_info` of each configured root op of a module `iree-compile` wrote at
    `executable-configurations` (the op's `lowering_config` with its function's
    `translation_info`, an attention's decomposition inside: the candidate form), in IR order;
    "" for an op whose function has no `translation_info`."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    configs = []
    with ir.Context():
        module = ir.Module.parse(module_text)
        for op in _configured_root_ops(module):
            lowering = op.attributes["lowering_config"]
            func = op.parent
            while func is not None and "translation_info" not in func.attributes:
                func = func.parent
            if func is None:
                configs.append("")
                continue
            info = iree_codegen.CompilationInfoAttr.get(
                lowering, func.attributes["translation_info"]
            )
            if DECOMPOSITION_KEY in op.attributes:  # GPU attention: the candidate form
                info = with_decomposition(info, op.attributes[DECOMPOSITION_KEY])
            configs.append(str(info))
    return configs


def _configured_root_ops(module: Any) -> list[Any]:
    """Tunable ops that carry a `lowering_config`, in IR order.

    IREE marks root ops with `root_op` only when its own heuristics configured them; an op configured
    by a tuning spec loses the marker, so tunable kinds are recognised with the linalg bindings.
    """
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    found: list[Any] = []

    def visit(op: Any) -> Any:
        operation = op.operation
        if "lowering_config" in operation.attributes and (
            "root_op" in operation.attributes
            or (operation.name.startswith("iree_linalg_ext.") and "attention" in operation.name)
            or linalg.isa_contraction_op(operation)
            or linalg.isa_convolution_op(operation)
        ):
            found.append(operation)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found
