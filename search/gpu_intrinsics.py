"""The MMA intrinsics a constraint op's knob template offers, and how one lane holds their
fragments (IREE's single-subgroup layouts): their names, shapes and the bits a lane reads
contiguously, and whether attention's P changes layout between its two matmuls.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any


def mma_options(kind: Any) -> list[Any]:
    """The `mma_kind` attributes a template entry allows (one unless it is a one-of knob)."""
    from iree.compiler.dialects import iree_codegen

    return list(kind.options) if isinstance(kind, iree_codegen.OneOfKnobAttr) else [kind]


def _intrinsic_name(option: Any) -> str:
    """`MFMA_F32_16x16x16_F16` of `#iree_gpu.mma_layout<MFMA_F32_16x16x16_F16, col_major = true>`."""
    return re.sub(r".*<(\w+).*", r"\1", str(option))


def intrinsic_options(kind: Any) -> tuple[str, tuple[str, ...], tuple[tuple[int, int, int], ...]]:
    """The knob choosing an `mma_kind` (or "" when fixed), its options' names and M/N/K shapes."""
    from iree.compiler.dialects import iree_codegen, iree_gpu

    one_of = isinstance(kind, iree_codegen.OneOfKnobAttr)
    options = mma_options(kind)
    names, shapes = [], []
    for option in options:
        names.append(_intrinsic_name(option))
        try:
            mnk = iree_gpu.MMAAttr(option).mnk_shape
        except (TypeError, ValueError):
            mnk = iree_gpu.VirtualMMAAttr(option).mnk_shape
        shapes.append((int(mnk[0]), int(mnk[1]), int(mnk[2])))
    knob = str(iree_codegen.OneOfKnobAttr(kind).name) if one_of else "mma_idx"
    return knob, tuple(names), tuple(shapes)


Layout = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # thread, tstrides, element


@dataclass(frozen=True)
class MmaLayouts:
    """How one lane holds an intrinsic's A, B and C fragments (IREE's single-subgroup layouts)."""

    a: Layout
    b: Layout
    c: Layout
    col_major: bool  # the intrinsic computes C^T (operands swapped)
    operand_bits: int  # bits a lane reads contiguously per element vector of A


def mma_layouts(option: Any) -> MmaLayouts | None:
    """`MmaLayouts` of one `mma_kind` option; None for kinds IREE gives no layout for."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_gpu

    virtual = not iree_gpu.MMAAttr.isinstance(option)
    try:
        attr = iree_gpu.VirtualMMAAttr(option) if virtual else iree_gpu.MMAAttr(option)
        kind = "virtual_mma_intrinsic" if virtual else "mma_intrinsic"
        intrinsic = ir.Attribute.parse(f"#iree_gpu<{kind} {_intrinsic_name(option)}>")
        fragments: list[Layout] = []
        for fragment in range(3):
            layout = iree_gpu.get_single_subgroup_layout(intrinsic, fragment)
            fragments.append((tuple(layout.thread), tuple(layout.tstrides), tuple(layout.element)))
        width = ir.VectorType(attr.abc_vector_types[0]).element_type.width
    except (TypeError, ValueError, AttributeError):  # not an MMA kind IREE describes
        return None
    if not fragments[0][2]:
        return None
    a, b, c = fragments
    return MmaLayouts(a, b, c, col_major=bool(attr.col_major),
                      operand_bits=math.prod(a[2]) * int(width))


def p_relayout(qk: MmaLayouts | None, pv: MmaLayouts | None) -> int:
    """1 when attention's P, the Q x K^T result, is not held the way the P x V intrinsic reads
    it, so every tile of P is shuffled across lanes between the two matmuls (0 when it stays in
    registers as it is; unknown layouts count as shuffled).

    P is [M, K2]. Q x K^T holds it as its C fragment, transposed when col_major. P x V reads it
    as its A fragment ([M, K2]), or as B ([K2, M]) when col_major computes O^T = V^T P^T."""
    if qk is None or pv is None:
        return 1
    held = qk.c if qk.col_major else _transposed(qk.c)  # as [K2, M]
    read = pv.b if pv.col_major else _transposed(pv.a)
    return int(held != read)


def _transposed(layout: Layout) -> Layout:
    return (layout[0][::-1], layout[1][::-1], layout[2][::-1])
