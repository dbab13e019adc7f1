"""Expert tuning specs: the configurations engineers shipped for real dispatches, as data.

A tuning spec is a transform-dialect module whose `match_*` named sequences each name one root op
(shape, element types, indexing maps) and the `compilation_info` to give it. This module turns each
matcher into an `ExpertEntry`: the op rebuilt as a `Problem` and the configuration described by
meaning (`ExpertConfig`: workgroup/reduction tiles per loop, intrinsic, subgroup counts, workgroup
size, pipeline), so it can be looked up in an enumerated candidate table (`expert_columns`).

Current syntax (`#iree_gpu.lowering_config<{workgroup = ..., mma_kind = ...}>`) is parsed with
IREE's Python bindings. Older syntax is mapped by meaning first:
- 2025 TileAndFuse specs: `translation_info = <pipeline = LLVMGPUTileAndFuse ...>`;
- 2024 specs: `#iree_codegen.lowering_config<tile_sizes = [[...]]>` (one level: parallel loops
  carry workgroup tiles, reduction loops reduction tiles), `#iree_gpu.mma_schedule<intrinsic =
  ..., subgroup_m_count, subgroup_n_count>` and intrinsic names `MFMA_<in>_MxNxK_<out>`.
Dynamic sizes (`dims_equal [-1, ...]`, `tensor<?x...>`) become `dynamic_size` (2: the SDXL batch).
Ops are rebuilt from IREE 3.13's matcher ops (`transform.iree.match.contraction` / `convolution`
/ `attention` / `online_attention`: indexing maps, element types, `dims_equal` per dimension
class, as IREE's tuner and dispatchtune's own specs write them), from DAG matchers
(`cast_compatible_dag_from_root`) and from 2024 named-op matchers. A convolution configured as an
implicit GEMM (tile lists shorter than its loops) is read in IREE's IGEMM loops; unit loops IREE
folds (batch 1) are dropped when the lists are that much shorter. Attention matchers that name
no size (any f16 `online_attention`, some with static dims or `dim_is_multiple_of`) become one
entry per SDXL attention shape they match (`SDXL_ATTENTION_SHAPES`, sized class by class in the
matcher's own layout when it states its maps); those with `dims_equal` are the one attention
they name. Either way the `decomposition_config`
(intrinsic, subgroup basis) is read with IREE's bindings. A file that matches one op twice with
one configuration (attention in both forms) counts it once. Matchers the project cannot rebuild
(transform-dialect scripts) are kept with a reason.

A dispatch two matchers of a file match gets the configuration of the first in the file's
`foreach_match` order, as in IREE; the other is skipped as shadowed. A file's name may state the
product and compute-partition mode it was tuned on (`named_product`, `named_partitions`: `_mi308`,
`_qpx`), which per-CU features need.

Spec files are read as a hostile reader would: text only (nothing is executed), `//` comments
dropped, every matcher (a named sequence that yields a configuration) either becomes an entry or
is skipped with a reason (`skip_reasons` counts them), and nothing a file says can raise anything
but a one-line `InputError` for the file (unreadable, not UTF-8, aliases that expand without bound).
Intermediate syntax generations are mapped to IREE 3.13's before its bindings read them
(`modernise`): `translation_info<LLVMGPUVectorDistribute ...>` / `<pipeline = LLVMGPU...>` pipeline
spellings, 2024 intrinsic names, `mma_schedule` in the translation config and
`subgroup_m_count`/`subgroup_n_count` in a `#iree_gpu.lowering_config`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dispatchtune.errors import InputError
from dispatchtune.problem import DIM_CLASSES, Problem

#: Size given to dynamic dimensions: SDXL/punet specs are tuned for batch 2 (classifier-free
#: guidance), and IREE's collapsed static shapes in the README (2x1024 -> 2048) agree.
DYNAMIC_SIZE = 2

#: SDXL UNet attention at 1024x1024 (batch 2, head dim 64): (B, heads, M, N, K1, K2) self- and
#: cross-attention (64 text tokens) at the 64x64 (10 heads) and 32x32 (20 heads) latent levels,
#: the shapes the shape-free attention matchers were tuned for (IREE's own gfx942 spec names
#: 2x10x4096x64x64x64).
SDXL_ATTENTION_SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, 10, 4096, 64, 64, 4096), (2, 10, 4096, 64, 64, 64),
    (2, 20, 1024, 64, 64, 1024), (2, 20, 1024, 64, 64, 64),
)
#: The SDXL export's attention layout: Q [B, H, M, K1], K [B, H, K2, K1], V [B, H, N, K2] (V
#: transposed), O [B, H, M, N]; loops d0..d5 = B, H, M, N, K1, K2 (IREE's gfx942 spec maps).
_SDXL_ATTENTION_MAPS = ((0, 1, 2, 4), (0, 1, 5, 4), (0, 1, 3, 5), (0, 1, 2, 3))


@dataclass(frozen=True)
class ExpertConfig:
    """One expert configuration, by meaning, per loop of the op as the spec matched it."""

    pipeline: str  # "VectorDistribute" or "TileAndFuse"
    workgroup: tuple[int, ...]  # workgroup tile per loop (0 = not tiled)
    reduction: tuple[int, ...]  # reduction tile per loop, in elements (0 = not tiled)
    intrinsic: str  # current IREE name, e.g. "MFMA_F32_16x16x16_F16"
    mma_shape: tuple[int, int, int]
    subgroup_counts: tuple[int, int]  # (M, N) subgroups per workgroup
    workgroup_size: tuple[int, ...]
    subgroup_size: int
    waves_per_eu: int = 0  # 0 = compiler default
    pv_intrinsic: str = ""  # attention: the P x V intrinsic (`intrinsic` is the Q x K^T one)
    syntax: str = "current"  # "current", "tileandfuse-2025", "modernised" (other older) or "2024"


@dataclass(frozen=True)
class ExpertEntry:
    """One matcher of a spec file: the dispatch and its expert configuration (or why not)."""

    file: str
    matcher: str
    problem: Problem | None = None
    config: ExpertConfig | None = None
    skipped: str = ""  # non-empty when the matcher could not be turned into (problem, config)
    notes: tuple[str, ...] = field(default=())

    @property
    def usable(self) -> bool:
        return self.problem is not None and self.config is not None


# ---- text helpers -------------------------------------------------------------------------------
_SEQUENCE = re.compile(r"transform\.named_sequence\s+@(\w+)\s*\(")
#: `#attr = ...` and `!type = ...` aliases (specs name the tensor types of their matchers too).
_ALIAS = re.compile(r"^([#!]\w+)\s*=\s*(.*)$", re.MULTILINE)
_MAP = re.compile(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>")
_MAP_TEXT = re.compile(r"affine_map<\([^)]*\)\s*->\s*\([^)]*\)>")
_TENSOR = re.compile(r"tensor<([^>]*)>")
_OLD_INTRINSIC = re.compile(r"^(MFMA|WMMA)_([A-Z0-9]+)_(\d+x\d+x\d+)_([A-Z0-9]+)$")
_COMMENT = re.compile(r"//[^\n]*")
#: A sequence's result types (a matcher yields (op, configuration): a transform param).
_RESULTS = re.compile(r"\)\s*->\s*\(([^)]*)\)\s*\{")
#: Aliases may expand a file at most this many times its size (a hostile file could nest them).
_ALIAS_GROWTH = 16


def _balanced(text: str, start: int) -> str:
    """The `<...>` group opening at or after `start` (arrows `->` are not brackets)."""
    begin = text.find("<", start)
    if begin < 0:
        raise InputError("no '<' after a tuning spec attribute name")
    depth = 0
    i = begin
    while i < len(text):
        ch = text[i]
        if ch == "<":
            depth += 1
        elif ch == ">" and text[i - 1] != "-":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise InputError("unbalanced '<' in a tuning spec attribute")


def _sequences(text: str) -> Iterator[tuple[str, str]]:
    """(name, body) of every named sequence, body up to the next sequence."""
    starts = list(_SEQUENCE.finditer(text))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        yield match.group(1), text[match.start() : end]


def _resolve_aliases(text: str) -> str:
    """Inline `#name = attr` aliases (IREE's printer uses them for compilation_info) and
    `!name = type` ones."""
    aliases = dict(_ALIAS.findall(text))
    body = _ALIAS.sub("", text)
    if not aliases:
        return body
    pattern = re.compile("|".join(re.escape(n) for n in sorted(aliases, key=len, reverse=True))
                         + r"(?![\w])")

    limit = _ALIAS_GROWTH * max(len(text), 1024)
    grown = [0]

    def expand(match: re.Match[str]) -> str:
        value = aliases[match.group(0)]
        grown[0] += len(value)  # checked as it grows: nested aliases could exhaust memory
        if grown[0] > limit:
            raise InputError(f"attribute aliases expand the spec beyond {_ALIAS_GROWTH}x its size")
        return value

    for _ in range(4):  # aliases refer to aliases (compilation -> translation)
        body = pattern.sub(expand, body)
    return body


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"-?\d+", text))


def _loops(expr_list: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"d(\d+)", expr_list))


def current_intrinsic(name: str) -> str:
    """Map a 2024 intrinsic name (`MFMA_F16_16x16x16_F32`) to IREE's current one."""
    match = _OLD_INTRINSIC.match(name)
    if not match:
        return name
    family, first, shape, last = match.groups()
    # Old names put the input type first; current ones put the accumulator first.
    if first in {"F32", "I32"} and last not in {"F32", "I32"}:
        return name
    return f"{family}_{last}_{shape}_{first}"


def _mma_shape(intrinsic: str) -> tuple[int, int, int]:
    match = re.search(r"(\d+)x(\d+)x(\d+)", intrinsic)
    if not match:
        raise InputError(f"cannot read the shape of intrinsic {intrinsic!r}")
    m, n, k = (int(v) for v in match.groups())
    return m, n, k


# ---- problems -----------------------------------------------------------------------------------
def contraction_problem(
    maps: list[str], shapes: list[tuple[int, ...]], types: list[str], name: str = ""
) -> Problem:
    """A contraction from its indexing maps (MLIR text), operand shapes (-1 = dynamic) and types."""
    parsed = [_MAP.search(m) for m in maps]
    if len(parsed) != 3 or any(p is None for p in parsed):
        raise InputError(f"{name}: expected three affine maps, got {maps}")
    n_loops = len(_loops(parsed[0].group(1)))  # type: ignore[union-attr]
    results = [_loops(p.group(2)) for p in parsed]  # type: ignore[union-attr]
    sizes = [-1] * n_loops
    for loops, shape in zip(results, shapes, strict=True):
        for loop, size in zip(loops, shape, strict=True):
            if size > 0:
                sizes[loop] = size
    sizes = [s if s > 0 else DYNAMIC_SIZE for s in sizes]
    lhs, rhs, out = (set(r) for r in results)
    dims = {
        "batch": tuple(sorted(lhs & rhs & out)),
        "m": tuple(sorted((lhs & out) - rhs)),
        "n": tuple(sorted((rhs & out) - lhs)),
        "k": tuple(sorted((lhs & rhs) - out)),
    }
    names = [f"d{i}" for i in range(n_loops)]
    return Problem(
        kind="contraction",
        loop_sizes=tuple(sizes),
        dims=dims,
        element_types=tuple(types),
        operand_shapes=tuple(tuple(sizes[i] for i in r) for r in results),
        indexing_maps=tuple(f"({', '.join(names)}) -> ({', '.join(f'd{i}' for i in r)})"
                            for r in results),
        op_name="linalg.generic",
        name=name,
    )


def _tensor(text: str) -> tuple[tuple[int, ...], str]:
    parts = text.split("x")
    shape = tuple(-1 if p == "?" else int(p) for p in parts[:-1])
    return shape, parts[-1]


def _dag_problem(body: str, name: str) -> Problem | None:
    """The root op of a `cast_compatible_dag_from_root` block (generic contraction or conv)."""
    block = re.search(r"\^bb0\((.*?)\):", body, re.DOTALL)
    if not block:
        return None
    args = [_tensor(t) for t in _TENSOR.findall(block.group(1))]
    if "linalg.conv_2d_nhwc_hwcf" in body:
        (_, in_type), (fshape, f_type), (oshape, o_type) = args
        stride = _ints(re.search(r"strides\s*=\s*dense<(\d+)>", body).group(1))  # type: ignore[union-attr]
        dilation = _ints(re.search(r"dilations\s*=\s*dense<(\d+)>", body).group(1))  # type: ignore[union-attr]
        batch = oshape[0] if oshape[0] > 0 else DYNAMIC_SIZE
        return Problem.conv2d_nhwc_hwcf(
            batch, oshape[1], oshape[2], fshape[2], fshape[3], fshape[0], fshape[1],
            in_type, f_type, o_type, stride=stride[0], dilation=dilation[0],
        )
    named = re.search(r"linalg\.batch_matmul(_transpose_b)?\b", body)
    if named and len(args) == 3:
        # A named batch matmul: [B, M, K] x [B, K, N] (or [B, N, K] transposed) -> [B, M, N].
        (lhs, lhs_type), (_, rhs_type), (out, out_type) = args
        b, m, n, k = (s if s > 0 else DYNAMIC_SIZE for s in (*out, lhs[-1]))
        problem = Problem.batch_matmul(b, m, n, k, lhs_type, rhs_type, out_type,
                                       transpose_b=bool(named.group(1)))
        return dataclasses.replace(problem, name=name)
    # Any other root (a generic contraction or convolution, other named ones): the block is
    # parsed with IREE's bindings and the op classified as IREE does.
    return _parsed_dag_problem(body, name)


def _parsed_dag_problem(body: str, name: str) -> Problem | None:
    """The root op of a DAG matcher parsed as a function: a contraction or a convolution (the
    sizes its operands' static dimensions give; dynamic batch loops `DYNAMIC_SIZE`), else None."""
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    start = body.find("{", body.find("cast_compatible_dag_from_root"))
    region = _braced(body, start)
    block = re.match(r"\s*\^bb0\((.*?)\):(.*)", region, re.DOTALL)
    if block is None:
        return None
    with _context():
        module = ir.Module.parse(
            f"func.func @dag({block.group(1)}) {{\n{block.group(2)}\n  return\n}}")
        ops = list(module.body.operations[0].regions[0].blocks[0].operations)
        root = next((op for op in reversed(ops) if op.name.startswith("linalg.")), None)
        if root is None or not (linalg.isa_contraction_op(root) or linalg.isa_convolution_op(root)):
            return None
        affine = [attr.value for attr in linalg.get_indexing_maps(root)]
        maps = [f"affine_map<{m}>" for m in affine]
        values = [*list(root.operands)[: len(maps) - 1], root.results[0]]
        typed = [_tensor(str(v.type)[len("tensor<"):-1]) for v in values]
        if linalg.isa_contraction_op(root):
            return contraction_problem(maps, [t[0] for t in typed], [t[1] for t in typed], name)
        known = {int(e.position): size for amap, (shape, _) in zip(affine, typed, strict=True)
                 for e, size in zip(amap.results, shape, strict=True)
                 if isinstance(e, ir.AffineDimExpr) and size > 0}
    return convolution_problem(maps, {}, [t[1] for t in typed], name, known)


def _braced(text: str, start: int) -> str:
    """The text inside the `{...}` group opening at `start` (nested braces balanced)."""
    if start < 0:
        raise InputError("no '{' after the DAG matcher")
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1 : i]
    raise InputError("unbalanced '{' in the DAG matcher")


def _matcher_problem(body: str, name: str, helpers: Mapping[str, str]) -> Problem | None:
    """Rebuild the op a matcher names, from whichever matching form it uses."""
    if "online_attention" in body or "iree_linalg_ext.attention" in body:
        return None
    if "transform.iree.match.convolution" in body:
        head, sizes = _match_op(body, "convolution")
        return convolution_problem(_indexing_maps(head)[:3], sizes,
                                   _types(head, ("lhs", "rhs", "output")), name)
    if "transform.iree.match.contraction" in body:
        head, sizes = _match_op(body, "contraction")
        types = _types(head, ("lhs", "rhs", "output"))
        maps = _MAP_TEXT.findall(head)[:3]
        probe = contraction_problem(maps, _unit_shapes(maps), types)
        loop_sizes = [-1] * len(probe.loop_sizes)
        for cls in ("batch", "m", "n", "k"):
            given = sizes.get(cls, ())
            for loop, size in zip(probe.dims[cls], given, strict=False):
                loop_sizes[loop] = size
        shapes = [tuple(loop_sizes[i] for i in _loops(_MAP.search(m).group(2)))  # type: ignore[union-attr]
                  for m in maps]
        return contraction_problem(maps, shapes, types, name)
    if "cast_compatible_dag_from_root" in body:
        return _dag_problem(body, name)
    include = re.search(r"transform\.include\s+@(\w+)", body)
    if include and include.group(1) in helpers:
        helper = _dag_problem(helpers[include.group(1)], name)
        if helper is None:
            return None
        casts = dict(re.findall(r"cast_compatible_type\s+%(\w+)\s*=\s*tensor<([^>]*)>", body))
        operands = dict(re.findall(r"%(\w+)\s*=\s*transform\.get_operand\s+%\w+\[(\d+)\]", body))
        cast_shapes: list[tuple[int, ...]] = [tuple(-1 for _ in s) for s in helper.operand_shapes]
        for value, index in operands.items():
            if value in casts:
                cast_shapes[int(index)] = _tensor(casts[value])[0]
        return contraction_problem(
            [f"affine_map<{m}>" for m in helper.indexing_maps], cast_shapes,
            list(helper.element_types), name,
        )
    return None


#: What each `transform.iree.match.<op>` returns, in order: its dimension lists by class.
_MATCH_RESULTS: dict[str, tuple[str, ...]] = {
    "contraction": ("batch", "m", "n", "k"),
    "convolution": (*DIM_CLASSES["convolution"], "strides", "dilations"),
    "attention": DIM_CLASSES["attention"],
    "online_attention": DIM_CLASSES["attention"],
}


def _match_op(body: str, op: str) -> tuple[str, dict[str, tuple[int, ...]]]:
    """The text after `transform.iree.match.<op>`, and the sizes its results' `dims_equal`
    checks name, by dimension class (a value the op does not name keeps its own name)."""
    head = body.split(f"transform.iree.match.{op}", 1)[1]
    results = re.search(rf"((?:%\w+\s*,\s*)*%\w+)\s*=\s*transform\.iree\.match\.{op}\b", body)
    names = re.findall(r"%(\w+)", results.group(1)) if results else []
    by_value = dict(zip(names, _MATCH_RESULTS[op], strict=False))
    sizes = {
        by_value.get(value, value): _ints(v)
        for value, v in re.findall(r"dims_equal\s+%(\w+),\s*\[([^\]]*)\]", body)
    }
    return head, sizes


def _types(head: str, operands: tuple[str, ...]) -> list[str]:
    """The `<operand>_type = T` element types of a match op, in the order asked."""
    found = [re.search(rf"\b{k}_type\s*=\s*(\w+)", head) for k in operands]
    missing = [k for k, m in zip(operands, found, strict=True) if m is None]
    if missing:
        raise InputError(f"the matcher names no {missing[0]}_type")
    return [m.group(1) for m in found if m is not None]


def _indexing_maps(head: str) -> list[str]:
    """The affine maps of a match op's `indexing_maps = [...]` (aliases already inlined)."""
    listed = re.search(r"indexing_maps\s*=\s*\[(.*?)\]", head, re.DOTALL)
    return _MAP_TEXT.findall(listed.group(1)) if listed else []


def _affine_maps(maps: list[str]) -> list[Any]:
    from iree.compiler import ir

    return [ir.AffineMapAttr(ir.Attribute.parse(m)).value for m in maps]


def _extent(expr: Any, sizes: list[int]) -> int:
    """How many positions an operand dimension indexed by `expr` spans: its largest value over
    the loops, plus one (`d1 * 2 + d4` over 32 and 3 loop steps: 65)."""
    from iree.compiler import ir

    def largest(e: Any) -> int:
        if isinstance(e, ir.AffineDimExpr):
            return sizes[e.position] - 1
        if isinstance(e, ir.AffineConstantExpr):
            return int(e.value)
        if isinstance(e, ir.AffineAddExpr):
            return largest(e.lhs) + largest(e.rhs)
        if isinstance(e, ir.AffineMulExpr):  # a loop times a constant stride or dilation
            return largest(e.lhs) * largest(e.rhs)
        raise InputError(f"unsupported index expression {e}")

    return largest(expr) + 1


def _sized_loops(
    classes: Mapping[str, tuple[int, ...]], sizes: Mapping[str, tuple[int, ...]], n_loops: int,
    name: str, known: Mapping[int, int] | None = None,
) -> list[int]:
    """Each loop's size from the named sizes of its class (then `known`); unnamed batch loops
    are dynamic (`DYNAMIC_SIZE`), any other unnamed loop is an error."""
    loop_sizes = [-1] * n_loops
    for cls, loops in classes.items():
        for loop, size in zip(loops, sizes.get(cls, ()), strict=False):
            loop_sizes[loop] = size
    for loop, size in (known or {}).items():
        if loop_sizes[loop] <= 0 < size:
            loop_sizes[loop] = size
    batch = set(classes.get("batch", ()))
    for loop, size in enumerate(loop_sizes):
        if size <= 0:
            if loop not in batch:
                raise InputError(f"{name}: the matcher names no size for loop d{loop}")
            loop_sizes[loop] = DYNAMIC_SIZE
    return loop_sizes


def convolution_problem(
    maps: list[str], sizes: Mapping[str, tuple[int, ...]], types: list[str], name: str = "",
    known: Mapping[int, int] | None = None,
) -> Problem:
    """A convolution from its indexing maps (MLIR text) and the sizes its matcher names per
    dimension class (`transform.iree.match.convolution` + `dims_equal`) or per loop (`known`);
    strides and dilations come from the maps."""
    from iree.compiler.dialects import linalg

    if len(maps) != 3:
        raise InputError(f"{name}: expected three affine maps, got {len(maps)}")
    with _context():
        affine = _affine_maps(maps)
        inferred = linalg.infer_convolution_dimensions_from_maps(affine)
        if inferred is None:
            raise InputError(f"{name}: the indexing maps are not a convolution's")
        classes = {c: tuple(int(i) for i in getattr(inferred, c)) for c in DIM_CLASSES["convolution"]}
        strides = tuple(int(v) for v in inferred.strides)
        dilations = tuple(int(v) for v in inferred.dilations)
        loop_sizes = _sized_loops(classes, sizes, affine[0].n_dims, name, known)
        shapes = tuple(tuple(_extent(e, loop_sizes) for e in m.results) for m in affine)
        texts = tuple(str(m) for m in affine)
    return Problem(
        kind="convolution", loop_sizes=tuple(loop_sizes), dims=classes,
        element_types=tuple(types), operand_shapes=shapes, indexing_maps=texts,
        strides=strides, dilations=dilations, op_name="linalg.generic", name=name,
    )


def _named_attention_problem(body: str, name: str) -> Problem | None:
    """The attention a matcher names by size (`dims_equal` on the match op's results), in its own
    layout; None when it names no size (a shape-free matcher)."""
    op = _attention_match_op(body)
    if op is None or not any(c in _match_op(body, op)[1] for c in DIM_CLASSES["attention"]):
        return None
    return _matched_attention(body, name)


def _attention_match_op(body: str) -> str | None:
    for op in ("online_attention", "attention"):
        if f"transform.iree.match.{op}" in body:
            return op
    return None


def _matched_attention(
    body: str, name: str, shape: tuple[int, ...] | None = None
) -> Problem:
    """The attention of a `transform.iree.match.(online_)attention` matcher in its own layout
    (indexing maps), sized by its `dims_equal` checks, or by an SDXL `shape` (B, H, M, N, K1, K2)
    class by class when given (a shape-free matcher)."""
    from iree.compiler.dialects import iree_codegen

    op = _attention_match_op(body) or "online_attention"
    head, sizes = _match_op(body, op)
    maps = _indexing_maps(head)
    # attention: Q, K, V, scale, [mask], O; online_attention adds the running max and sum.
    masked = len(maps) == (8 if op == "online_attention" else 6)
    if len(maps) < 5:
        raise InputError(f"{name}: expected the attention's indexing maps, got {len(maps)}")
    q_type, k_type, v_type = _types(head, ("query", "key", "value"))
    # The online form's output is the f32 accumulator; the op it came from writes V's type.
    out_type = v_type if op == "online_attention" else _types(head, ("output",))[0]
    casts = _operand_casts(body)
    if masked and 4 not in casts:
        raise InputError(f"{name}: an attention with a mask, but the matcher names no mask type")
    with _context():
        affine = _affine_maps(maps)
        q, k, v, o = affine[0], affine[1], affine[2], affine[5 if masked else 4]
        detail = iree_codegen.get_attention_op_detail(q, k, v, o)
        classes = {"batch": detail.batch_dims, "m": detail.m_dims, "n": detail.n_dims,
                   "k1": detail.k1_dims, "k2": detail.k2_dims}
        classes = {c: tuple(int(i) for i in loops) for c, loops in classes.items()}
        if shape is not None:
            sizes = _sdxl_class_sizes(shape, classes, name)
        # Static operand dims (`cast_compatible_type`) size the loops no `dims_equal` names.
        known = {int(e.position): size for index, amap in enumerate(affine[:3])
                 for e, size in zip(amap.results, casts.get(index, ((), ""))[0], strict=False)}
        loop_sizes = _sized_loops(classes, sizes, int(detail.domain_rank), name, known)
        operands = (q, k, v, o)
        shapes = tuple(tuple(_extent(e, loop_sizes) for e in m.results) for m in operands)
        texts = tuple(str(m) for m in operands)
        mask_map = str(affine[4]) if masked else ""
    return Problem(
        kind="attention", loop_sizes=tuple(loop_sizes), dims=classes,
        element_types=(q_type, k_type, v_type, out_type), operand_shapes=shapes,
        indexing_maps=texts, mask_map=mask_map, mask_type=casts[4][1] if masked else "",
        op_name="iree_linalg_ext.attention", name=name,
    )


def _sdxl_class_sizes(
    shape: tuple[int, ...], classes: Mapping[str, tuple[int, ...]], name: str
) -> dict[str, tuple[int, ...]]:
    """An SDXL attention shape (B, H, M, N, K1, K2) as sizes per dimension class of a layout
    with one loop per class (two batch loops B, H, or one of B x H)."""
    b, h, m, n, k1, k2 = shape
    batch = {2: (b, h), 1: (b * h,)}.get(len(classes["batch"]))
    if batch is None or any(len(classes[c]) != 1 for c in ("m", "n", "k1", "k2")):
        raise InputError(f"{name}: an attention layout the SDXL shapes do not fit")
    return {"batch": batch, "m": (m,), "n": (n,), "k1": (k1,), "k2": (k2,)}


def _operand_casts(body: str) -> dict[int, tuple[tuple[int, ...], str]]:
    """Operand index -> (shape, element type) of the matcher's `cast_compatible_type` checks."""
    operands = {v: int(i) for v, i in
                re.findall(r"%(\w+)\s*=\s*transform\.get_operand\s+%\w+\[(\d+)\]", body)}
    return {operands[v]: _tensor(t) for v, t in
            re.findall(r"cast_compatible_type\s+%(\w+)\s*=\s*tensor<([^>]*)>", body)
            if v in operands}


def _unit_shapes(maps: list[str]) -> list[tuple[int, ...]]:
    return [tuple(-1 for _ in _loops(_MAP.search(m).group(2))) for m in maps]  # type: ignore[union-attr]


def _dag_attention_layout(body: str) -> tuple[tuple[int, ...], ...] | None:
    """The loops of Q, K, V and O in an `iree_linalg_ext.attention` a DAG matcher spells out
    (maps with named dimensions allowed), or None when the text has no such op."""
    dag = re.search(r"iree_linalg_ext\.attention\s*\{\s*indexing_maps\s*=\s*\[(.*?)\]\s*\}",
                    body, re.DOTALL)
    if dag is None:
        return None
    maps = re.findall(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>", dag.group(1))
    layout = []
    for dims_text, results_text in maps:
        dims = [d.strip() for d in dims_text.split(",")]
        results = [r.strip() for r in results_text.split(",") if r.strip()]
        if results:  # the scale's map has no results
            layout.append(tuple(dims.index(r) if r in dims else -1 for r in results))
    # Q, K, V, [mask], O: the mask's map sits between V and O.
    return (*layout[:3], layout[-1]) if len(layout) >= 4 else ()


def attention_problem(shape: tuple[int, ...], element_type: str, name: str = "") -> Problem:
    """An SDXL-layout attention (`_SDXL_ATTENTION_MAPS`) of sizes (B, H, M, N, K1, K2)."""
    names = [f"d{i}" for i in range(6)]
    return Problem(
        kind="attention",
        loop_sizes=tuple(shape),
        dims={"batch": (0, 1), "m": (2,), "n": (3,), "k1": (4,), "k2": (5,)},
        element_types=(element_type,) * 4,
        operand_shapes=tuple(tuple(shape[i] for i in m) for m in _SDXL_ATTENTION_MAPS),
        indexing_maps=tuple(f"({', '.join(names)}) -> ({', '.join(f'd{i}' for i in m)})"
                            for m in _SDXL_ATTENTION_MAPS),
        op_name="iree_linalg_ext.attention",
        name=name,
    )


def _attention_problems(body: str, name: str) -> list[Problem]:
    """The SDXL attention shapes a shape-free attention matcher accepts (Q, K, V checks)."""
    operands = {v: int(i) for v, i in
                re.findall(r"%(\w+)\s*=\s*transform\.get_operand\s+%\w+\[(\d+)\]", body)}
    casts = _operand_casts(body)
    multiples = [(operands[v], int(d), int(n)) for v, d, n in
                 re.findall(r"dim_is_multiple_of\s+%(\w+)\[(\d+)\],\s*(\d+)", body)
                 if v in operands]
    op = _attention_match_op(body)
    # The matcher's own layout when it states its maps; else the SDXL export's.
    own_layout = op is not None and len(_indexing_maps(_match_op(body, op)[0])) >= 5
    if op is None and _dag_attention_layout(body) not in (None, _SDXL_ATTENTION_MAPS):
        raise InputError(f"{name}: a shape-free attention DAG in a layout other than the SDXL "
                         "export's")
    query = re.search(r"query_type\s*=\s*(\w+)", body)
    dag = re.search(r"\^bb0\(\s*%\w+\s*:\s*tensor<([^>]*)>", body)  # a DAG's first operand: Q
    element = (query.group(1) if query else casts.get(0, ((), ""))[1]
               or (_tensor(dag.group(1))[1] if dag else ""))
    if not element:
        raise InputError(f"{name}: no query element type in the attention matcher")
    found = []
    for shape in SDXL_ATTENTION_SHAPES:
        problem = (_matched_attention(body, name, shape) if own_layout
                   else attention_problem(shape, element, name))
        dims = problem.operand_shapes[:3]
        if any(len(cast) != len(dims[i]) or any(c > 0 and c != d for c, d in zip(cast, dims[i], strict=True))
               for i, (cast, _) in casts.items() if i < 3):
            continue
        if any(i < 3 and dims[i][d] % n for i, d, n in multiples):
            continue
        found.append(problem)
    return found


def _parse_attention(text: str, decomposition: str, problem: Problem) -> ExpertConfig:
    """An attention compilation_info plus its decomposition_config (current syntax)."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    with _context():
        info = iree_codegen.CompilationInfoAttr(ir.Attribute.parse(modernise(text)[0]))
        config = iree_gpu.LoweringConfigAttr(info.lowering_config)
        workgroup = tuple(int(v) for v in config.workgroup_tile_sizes)
        reduction = tuple(int(v) for v in config.reduction_tile_sizes)
        parts = ir.DictAttr(ir.Attribute.parse(modernise(decomposition)[0]))
        qk = iree_gpu.LoweringConfigAttr(parts["qk_attrs"]["lowering_config"])
        pv = iree_gpu.LoweringConfigAttr(parts["pv_attrs"]["lowering_config"])
        intrinsic = re.sub(r".*<(\w+).*", r"\1", str(qk.mma_kind))
        pv_intrinsic = re.sub(r".*<(\w+).*", r"\1", str(pv.mma_kind))
        # A basis is (counts, one count index per loop of its matmul: the op's loops without N
        # for Q x K^T, without K1 for P x V).
        m_loop, n_loop = problem.loops("m")[-1], problem.loops("n")[-1]
        qk_loops = [i for i in range(len(problem.loop_sizes)) if i not in problem.loops("n")]
        pv_loops = [i for i in range(len(problem.loop_sizes)) if i not in problem.loops("k1")]
        counts = (_attention_subgroups(qk, qk_loops, m_loop, "subgroup_m_count"),
                  _attention_subgroups(pv, pv_loops, n_loop, "subgroup_n_count"))
        translation = info.translation_info
        pipeline = re.sub(r".*<(\w+)>.*", r"\1", str(translation.pass_pipeline))
        wg_size = tuple(int(v) for v in translation.workgroup_size)
        sg_size = int(translation.subgroup_size)
        waves = _waves(str(translation.configuration))
    return ExpertConfig(
        pipeline=pipeline, workgroup=workgroup, reduction=reduction, intrinsic=intrinsic,
        mma_shape=_mma_shape(intrinsic), subgroup_counts=counts, workgroup_size=wg_size,
        subgroup_size=sg_size, waves_per_eu=waves, pv_intrinsic=pv_intrinsic,
    )


def _attention_subgroups(config: Any, loops: list[int], loop: int, count_name: str) -> int:
    """Subgroups one attention matmul's config puts along `loop`: from its subgroup basis, or
    from its (M or N) subgroup count in early-2025 decomposition configs."""
    from iree.compiler import ir

    if not config.subgroup_basis or not config.subgroup_basis[0]:
        attrs = config.attributes
        return int(ir.IntegerAttr(attrs[count_name]).value) if count_name in attrs else 1
    counts, mapping = ([int(v) for v in row] for row in config.subgroup_basis)
    return counts[mapping[loops.index(loop)]]


def _attention_entries(file: str, name: str, body: str, config_text: str) -> list[ExpertEntry]:
    """One entry per SDXL attention shape the matcher accepts (or one entry saying why not)."""
    decomposition = re.search(r"transform\.param\.constant\s*(\{.*?\})\s*->\s*!transform",
                              body, re.DOTALL)
    if "TransformDialectCodegen" in body or decomposition is None:
        return [ExpertEntry(file, name, skipped="attention: transform-dialect script, no config")]
    try:
        named = _named_attention_problem(body, name)
        problems = [named] if named is not None else _attention_problems(body, name)
    except Exception as exc:  # any rebuild failure is reported for this matcher alone
        return [ExpertEntry(file, name, skipped=f"cannot rebuild the op: {_reason(exc)}")]
    if not problems:
        return [ExpertEntry(file, name, skipped="attention: matches none of the SDXL shapes")]
    entries = []
    for problem in problems:
        # A shape-free matcher stands for several dispatches: each entry names its shape.
        label = name if named is not None else f"{name}[{'x'.join(map(str, problem.loop_sizes))}]"
        try:
            config = _parse_attention(config_text, decomposition.group(1), problem)
            entry = ExpertEntry(file, label, problem, config)
            expert_columns(entry)
        except Exception as exc:  # any parse failure is reported for this matcher alone
            entries.append(ExpertEntry(file, label, problem,
                                       skipped=f"cannot read config: {_reason(exc)}"))
            continue
        entries.append(entry)
    return entries


# ---- configurations -----------------------------------------------------------------------------
def _config_text(body: str) -> str | None:
    at = body.find("#iree_codegen.compilation_info<")
    return _balanced(body, at) if at >= 0 else None


@functools.lru_cache(maxsize=1)
def _context() -> Any:
    """One MLIR context for every attribute read (creating one registers IREE's dialects: ~10
    ms); parse failures leave it usable."""
    from iree.compiler import ir

    return ir.Context()


_OLD_PIPELINE = re.compile(r"translation_info<\s*(?:pipeline\s*=\s*)?LLVMGPU(\w+)")
_MMA_SCHEDULE = re.compile(r",?\s*mma_schedule\s*=\s*#iree_gpu\.mma_schedule")


def modernise(text: str) -> tuple[str, dict[str, int | str]]:
    """A compilation_info of any syntax generation in IREE 3.13's spelling, and what an older
    `mma_schedule` in its translation config said (intrinsic, subgroup counts), which 3.13
    cannot parse and so is cut out of the text."""

    def pipeline(match: re.Match[str]) -> str:
        name = match.group(1)
        # 2024's PadAndVectorDistribute (unaligned shapes) is VectorDistribute with padding now,
        # and its ConvVectorDistribute (direct convolutions) VectorDistribute too.
        name = "VectorDistribute" if name in ("PadAndVectorDistribute", "ConvVectorDistribute") \
            else name
        return f"translation_info<pipeline = #iree_gpu.pipeline<{name}>"

    # 2025 TileAndFuse specs leave the attribute's dialect out: `translation_info = <pipeline`.
    text = re.sub(r"translation_info\s*=\s*<", "translation_info = #iree_codegen.translation_info<",
                  text)
    text = _OLD_PIPELINE.sub(pipeline, text)
    # Early-2025 virtual intrinsics name their parameter: `virtual_mma_layout<intrinsic = V...>`.
    text = re.sub(r"virtual_mma_layout<\s*intrinsic\s*=\s*", "virtual_mma_layout<", text)
    # Spring-2024 layouts name only the operand, shape and accumulator: `mfma_layout<F16_...>`.
    text = re.sub(r"mfma_layout<(\w+)", lambda m: f"mma_layout<MFMA_{m.group(1)}", text)
    text = re.sub(r"mma_layout<(\w+)", lambda m: f"mma_layout<{current_intrinsic(m.group(1))}", text)
    # IREE 3.13 spells shared-memory prefetching as a stage count.
    text = text.replace("prefetch_shared_memory = true", "prefetch_num_stages = 2")
    text = text.replace("prefetch_shared_memory = false", "prefetch_num_stages = 0")
    schedule: dict[str, int | str] = {}
    found = _MMA_SCHEDULE.search(text)
    if found:
        group = _balanced(text, found.end())
        intrinsic = re.search(r"mma_layout<(\w+)", group)
        counts = {k: int(v) for k, v in re.findall(r"(subgroup_[mn]_count)\s*=\s*(\d+)", group)}
        schedule = {**counts, **({"intrinsic": intrinsic.group(1)} if intrinsic else {})}
        text = text[: found.start()] + text[found.end() + len(group):]
        text = re.sub(r"\{\s*,\s*", "{", text)  # the schedule was the dictionary's first entry
    return text, schedule


def _parse_current(text: str, problem: Problem) -> ExpertConfig:
    """A current-syntax compilation_info (or an older one, `modernise`d), read with IREE's
    bindings."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    original = text
    text, schedule = modernise(text)
    syntax = ("tileandfuse-2025" if "LLVMGPUTileAndFuse" in original
              else "current" if text == original else "modernised")
    with _context():
        info = iree_codegen.CompilationInfoAttr(ir.Attribute.parse(text))
        config = iree_gpu.LoweringConfigAttr(info.lowering_config)
        attrs = config.attributes
        workgroup = tuple(int(v) for v in config.workgroup_tile_sizes)
        reduction = tuple(int(v) for v in config.reduction_tile_sizes)
        kind = config.mma_kind
        intrinsic = (re.sub(r".*<(\w+).*", r"\1", str(kind)) if kind is not None
                     else str(schedule.get("intrinsic", "")))
        subgroup = tuple(int(v) for v in ir.ArrayAttr(attrs["subgroup"])) if "subgroup" in attrs \
            else ()
        basis = config.subgroup_basis
        counts_per_loop = tuple(int(v) for v in basis[0]) if basis is not None else ()
        # Late-2024 lowering configs and mma_schedules name (M, N) subgroup counts directly.
        named = {k: int(ir.IntegerAttr(attrs[k]).value) for k in
                 ("subgroup_m_count", "subgroup_n_count") if k in attrs}
        named = {**{k: int(v) for k, v in schedule.items() if k != "intrinsic"}, **named}
        translation = info.translation_info
        pipeline = re.sub(r".*<(\w+)>.*", r"\1", str(translation.pass_pipeline))
        wg_size = tuple(int(v) for v in translation.workgroup_size)
        sg_size = int(translation.subgroup_size)
        waves = _waves(str(translation.configuration))
    if not intrinsic:
        raise InputError("no intrinsic (mma_kind) in the configuration")
    shape = _mma_shape(intrinsic)
    if pipeline == "TileAndFuse":
        # TileAndFuse states the innermost K loop's reduction tile in intrinsics, not elements
        # (a convolution's filter loops stay in elements).
        classes = _gemm_view(problem, len(reduction))[0]
        # The intrinsic's K runs along a convolution's input channels, else the innermost K loop.
        inner = max(classes.get("channel") or classes["k"], default=-1)
        reduction = tuple(r * shape[2] if i == inner else r for i, r in enumerate(reduction))
    counts = ((named.get("subgroup_m_count", 1), named.get("subgroup_n_count", 1))
              if named and not counts_per_loop else
              _subgroup_counts(problem, pipeline, workgroup, shape, counts_per_loop, subgroup))
    return ExpertConfig(
        pipeline=pipeline, workgroup=workgroup, reduction=reduction, intrinsic=intrinsic,
        mma_shape=shape, subgroup_counts=counts,
        workgroup_size=wg_size, subgroup_size=sg_size, waves_per_eu=waves, syntax=syntax,
    )


def _waves(configuration: str) -> int:
    match = re.search(r'"amdgpu-waves-per-eu"\s*=\s*"(\d+)"', configuration)
    return int(match.group(1)) if match else 0


def _parse_2024(text: str, problem: Problem) -> ExpertConfig:
    """A 2024-syntax compilation_info (tile_sizes + mma_schedule), mapped by meaning."""
    tiles = _ints(re.search(r"tile_sizes\s*=\s*\[\[([^\]]*)\]", text).group(1))  # type: ignore[union-attr]
    reduction_loops = problem.reduction_loops()
    bounds = problem.loop_sizes
    if len(tiles) != len(bounds):
        raise InputError(f"tile_sizes has {len(tiles)} entries for {len(bounds)} loops")
    # A tile at least the loop is the whole loop (IREE clamps it): 0 in the current syntax.
    clamp = [0 if t >= b else t for t, b in zip(tiles, bounds, strict=True)]
    workgroup = tuple(0 if i in reduction_loops else t for i, t in enumerate(clamp))
    reduction = tuple(t if i in reduction_loops else 0 for i, t in enumerate(clamp))
    text, schedule = modernise(text)
    pipeline = re.search(r"pipeline<(\w+)>", text)
    layout = re.search(r"mma_layout<(\w+)", text)
    intrinsic = str(schedule.get("intrinsic") or (layout.group(1) if layout else ""))
    if not intrinsic:
        raise InputError("no intrinsic (mma_schedule or mma_kind) in the configuration")
    sg_m, sg_n = (int(schedule.get(f"subgroup_{c}_count", 1)) for c in "mn")
    wg_size = _ints(re.search(r"workgroup_size\s*=\s*\[([^\]]*)\]", text).group(1))  # type: ignore[union-attr]
    sg_size = int(re.search(r"subgroup_size\s*=\s*(\d+)", text).group(1))  # type: ignore[union-attr]
    name = pipeline.group(1) if pipeline else "VectorDistribute"
    return ExpertConfig(
        pipeline=name,
        workgroup=workgroup, reduction=reduction, intrinsic=intrinsic,
        mma_shape=_mma_shape(intrinsic), subgroup_counts=(sg_m, sg_n), workgroup_size=wg_size,
        subgroup_size=sg_size, waves_per_eu=_waves(text), syntax="2024",
    )


def _subgroup_counts(
    problem: Problem,
    pipeline: str,
    workgroup: tuple[int, ...],
    mma: tuple[int, int, int],
    basis: tuple[int, ...],
    subgroup: tuple[int, ...],
) -> tuple[int, int]:
    """(M, N) subgroups from per-loop data: basis counts, or TileAndFuse subgroup tiles."""
    classes, sizes = _gemm_view(problem, len(workgroup))
    m_loops, n_loops = classes["m"], classes["n"]
    if pipeline == "TileAndFuse" and subgroup:
        # Subgroups along a class = workgroup tile / (subgroup tile in intrinsics * intrinsic).
        tm = _tile(workgroup, m_loops, sizes)
        tn = _tile(workgroup, n_loops, sizes)
        sm = _subgroup_elements(subgroup, m_loops, mma[0])
        sn = _subgroup_elements(subgroup, n_loops, mma[1])
        return max(tm // sm, 1), max(tn // sn, 1)
    if basis:
        return math.prod(basis[i] for i in m_loops), math.prod(basis[i] for i in n_loops)
    return 1, 1


def _subgroup_elements(subgroup: tuple[int, ...], loops: tuple[int, ...], intrinsic: int) -> int:
    """A TileAndFuse subgroup tile in elements: the innermost loop counts in intrinsics."""
    sizes = [subgroup[i] or 1 for i in loops]
    if sizes:
        sizes[-1] *= intrinsic
    return math.prod(sizes)


def _tile(entries: tuple[int, ...], loops: tuple[int, ...], sizes: tuple[int, ...]) -> int:
    return math.prod((entries[i] or sizes[i]) for i in loops)


def _gemm_view(
    problem: Problem, n_entries: int
) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """The loops a configuration's tile lists index, by GEMM-view class, and their sizes.

    The op's own loops, or for a convolution configured as an implicit GEMM IREE's IGEMM loops;
    either without its unit-extent loops when the lists are that much shorter (IREE folds unit
    dimensions, e.g. batch 1, before configuring the op)."""
    views = [(gemm_classes(problem), problem.loop_sizes)]
    if problem.kind == "convolution" and n_entries != len(problem.loop_sizes):
        views.append(_igemm_view(problem.to_mlir(), problem.key))
    for classes, sizes in views:
        if len(sizes) == n_entries or problem.kind == "attention":
            return classes, sizes
        kept = [i for i, size in enumerate(sizes) if size != 1]
        if len(kept) == n_entries:
            renumber = {old: new for new, old in enumerate(kept)}
            folded = {c: tuple(renumber[i] for i in loops if i in renumber)
                      for c, loops in classes.items()}
            return folded, tuple(sizes[i] for i in kept)
    raise InputError(f"{problem.key}: the configuration tiles {n_entries} loops, the op has "
                     f"{len(problem.loop_sizes)}")


@functools.lru_cache(maxsize=64)
def _igemm_view(
    module_text: str, key: str
) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """A convolution's implicit-GEMM loops as IREE numbers them (`key` names it in errors)."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, linalg

    with _context():
        module = ir.Module.parse(module_text)
        found: list[Any] = []

        def visit(op: Any) -> Any:
            if not found and linalg.isa_convolution_op(op.operation):
                found.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
        if not found:
            raise InputError(f"{key}: no convolution to lower as an implicit GEMM")
        details = iree_codegen.get_igemm_generic_conv_details(found[0])
        if details is None:
            raise InputError(f"{key}: IREE has no implicit-GEMM form of this convolution")
        to_igemm = {int(k): int(v) for k, v in dict(details.conv_to_igemm_dim_map).items()}
        conv = linalg.infer_convolution_dimensions(found[0])
        bounds = tuple(int(b) for b in details.igemm_loop_bounds)

    def mapped(*groups: Any) -> tuple[int, ...]:
        return tuple(sorted({to_igemm[int(d)] for g in groups for d in g}))

    # No image loops: the implicit GEMM folds them into M (the candidate table's tile_oh is 0).
    classes = {"b": mapped(conv.depth), "m": mapped(conv.batch, conv.output_image),
               "n": mapped(conv.output_channel), "k": mapped(conv.filter_loop, conv.input_channel),
               "image": ()}
    return classes, bounds


def gemm_classes(problem: Problem) -> dict[str, tuple[int, ...]]:
    """Loops of the GEMM view: convolutions fold batch/image into M and filter/channels into K."""
    if problem.kind == "attention":  # the Q x K^T GEMM view, as `search.gpu`
        return {"b": problem.loops("batch"), "m": problem.loops("m"), "n": problem.loops("k2"),
                "k": problem.loops("k1")}
    if problem.kind == "convolution":  # the output image and input channel loops as well
        return {
            "b": problem.loops("depth"),
            "m": (*problem.loops("batch"), *problem.loops("output_image")),
            "n": problem.loops("output_channel"),
            "k": (*problem.loops("filter_loop"), *problem.loops("input_channel")),
            "image": problem.loops("output_image"),
            "channel": problem.loops("input_channel"),
        }
    return {c[0]: problem.loops(c) for c in ("batch", "m", "n", "k")}


def expert_columns(entry: ExpertEntry) -> dict[str, int | str]:
    """The expert configuration in the candidate-table vocabulary of `search.gpu.gpu_columns`."""
    if entry.problem is None or entry.config is None:
        raise InputError(f"{entry.matcher}: no usable expert configuration ({entry.skipped})")
    problem, config = entry.problem, entry.config
    classes, sizes = _gemm_view(problem, len(config.workgroup))
    columns: dict[str, int | str] = {
        "pipeline": config.pipeline,
        "intrinsic": config.intrinsic,
        "tile_b": _tile(config.workgroup, classes["b"], sizes),
        "tile_m": _tile(config.workgroup, classes["m"], sizes),
        "tile_n": _tile(config.workgroup, classes["n"], sizes),
        "tile_k": _tile(config.reduction, classes["k"], sizes),
        "subgroups_m": config.subgroup_counts[0],
        "subgroups_n": config.subgroup_counts[1],
        "workgroup_threads": math.prod(config.workgroup_size),
    }
    if problem.kind == "attention":
        # The K2 block is a reduction tile; workgroups are counted over batch, M and value N.
        distributed = (*problem.loops("batch"), *problem.loops("m"), *problem.loops("n"))
        columns["tile_n"] = _tile(config.reduction, classes["n"], sizes)
        columns["tile_k"] = math.prod(problem.loop_sizes[i] for i in classes["k"])
        columns["workgroups"] = math.prod(
            -(-problem.loop_sizes[i] // (config.workgroup[i] or problem.loop_sizes[i]))
            for i in distributed)
        if config.pv_intrinsic:
            columns["pv_intrinsic"] = config.pv_intrinsic
    if problem.kind == "convolution":
        # How M splits over the output image and the lowering tell convolutions' rows apart.
        image = classes["image"]
        columns["igemm"] = int(len(image) == 0)
        columns["tile_oh"] = _tile(config.workgroup, image[:1], sizes) if len(image) == 2 else 0
        columns["tile_ow"] = _tile(config.workgroup, image[1:], sizes) if len(image) == 2 else 0
    return columns


def configuration_columns(text: str, problem: Problem) -> dict[str, int | str]:
    """Any current-syntax `compilation_info` of `problem` (e.g. IREE's own default) in the
    candidate-table vocabulary, like `expert_columns`. An attention's config carries its two
    matmuls' configs inside (`decomposition_config`), where a spec passes them beside it."""
    if problem.kind != "attention":
        return expert_columns(ExpertEntry("", "configuration", problem, _parse_current(text, problem)))
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    with _context():
        info = iree_codegen.CompilationInfoAttr(ir.Attribute.parse(modernise(text)[0]))
        lowering = iree_gpu.LoweringConfigAttr(info.lowering_config)
        if "decomposition_config" not in lowering.attributes:
            raise InputError("no decomposition_config in the attention configuration")
        decomposition = str(lowering.attributes["decomposition_config"])
        loops = len(lowering.workgroup_tile_sizes)
    if loops != len(problem.loop_sizes):
        problem = _collapsed_attention(problem, loops)
    config = _parse_attention(text, decomposition, problem)
    return expert_columns(ExpertEntry("", "configuration", problem, config))


def _collapsed_attention(problem: Problem, n_loops: int) -> Problem:
    """The attention IREE configures when it compiles `problem` alone with `n_loops` loops: each
    class's adjacent loops collapsed into one (2x10 batch loops become 20), in the op's class
    order (batch, M, N, K1, K2). A config of it gives the same table columns (tiles, counts and
    workgroups per class) as one of `problem`."""
    classes = ("batch", "m", "n", "k1", "k2")
    order = [loop for cls in classes for loop in problem.loops(cls)]
    if order != list(range(len(problem.loop_sizes))) or n_loops != len(classes):
        raise InputError(f"IREE configures this attention over {n_loops} loops, which do not "
                         f"collapse its {len(problem.loop_sizes)} class by class")
    b, m, n, k1, k2 = (problem.size(cls) for cls in classes)
    return Problem.attention(b, m, n, k1, k2, problem.element_types[0])


# ---- files --------------------------------------------------------------------------------------
def _reason(exc: BaseException) -> str:
    """An exception as one short line (MLIR parse errors quote the whole text: their message
    follows the last `":line:column: `)."""
    message = str(exc)
    located = re.findall(r'":\d+:\d+: ([^\n]*)', message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = located[-1] if located else lines[-1] if lines else ""
    prefix = "" if isinstance(exc, InputError) else f"{type(exc).__name__}: "
    return (prefix + text)[:160]


#: An AMD Instinct product in a spec file's name (`..._mi308.mlir`, `mi300x_...`): digits, then
#: an optional variant letter, not inside a longer word.
_PRODUCT_IN_NAME = re.compile(r"(?<![a-z0-9])mi(\d{3})([a-z]?)(?![a-z0-9])")


def named_product(file: str) -> str | None:
    """The GPU product a spec file's name says it was tuned for, as an IREE target name
    (`iree_testsuite_unet_fp16_mi308.mlir` -> `rocm:mi308x`; no variant letter means the X
    part), or None. Products of one architecture share its space but not its CU count, which
    the features that count waves per CU need."""
    found = _PRODUCT_IN_NAME.search(Path(file).stem.lower().replace("-", "_"))
    return f"rocm:mi{found[1]}{found[2] or 'x'}" if found else None


#: AMD Instinct compute-partition modes: how many GPUs one device is split into (its XCDs shared
#: evenly), so a spec tuned in QPX mode saw a quarter of the product's CUs.
PARTITION_MODES = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}


def named_partitions(file: str) -> int:
    """The compute-partition count a spec file's name states (`..._mi300_qpx.mlir` -> 4), else 1."""
    words = re.split(r"[^a-z0-9]+", Path(file).stem.lower())
    return next((PARTITION_MODES[w] for w in words if w in PARTITION_MODES), 1)


def load_spec_file(path: str | Path) -> list[ExpertEntry]:
    """Every matcher of one spec file, in file order: an entry with its configuration, or one
    saying why it was skipped. Only an unreadable file raises (`InputError`)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read tuning spec {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"tuning spec {path} is not UTF-8 text (byte {exc.start})") from exc
    # Comments go first: a commented-out configuration is not the expert's.
    text = _resolve_aliases(_COMMENT.sub("", raw))
    sequences = list(_sequences(text))
    helpers = {n: b for n, b in sequences if "compilation_info" not in b}
    entries = []
    for name, body in sequences:
        try:
            entries += _sequence_entries(path.name, name, body, helpers)
        except Exception as exc:  # a hostile file: whatever breaks, this matcher alone is skipped
            entries.append(ExpertEntry(path.name, name, skipped=f"unreadable matcher: {_reason(exc)}"))
    return _without_repeats(entries, _application_order(text))


def _application_order(text: str) -> dict[str, int]:
    """Position of each matcher in the file's `foreach_match` lists (`@match -> @apply`): IREE
    gives a dispatch the configuration of the first matcher that matches it."""
    order: dict[str, int] = {}
    for name in re.findall(r"@([\w.$-]+)\s*->\s*@[\w.$-]+", text):
        order.setdefault(name, len(order))
    return order


def _without_repeats(entries: list[ExpertEntry], order: Mapping[str, int]) -> list[ExpertEntry]:
    """One entry per dispatch of a file: the matcher IREE applies to it, the first in `order`
    (then file order). A file may match one op twice: with one configuration (attention in both
    forms, as dispatchtune's own specs do) or with two (a general matcher after specific ones);
    the other matchers are skipped, saying which one wins."""
    def rank(item: tuple[int, ExpertEntry]) -> tuple[int, int]:
        return order.get(item[1].matcher.split("[", 1)[0], len(order)), item[0]

    applied: dict[str, ExpertEntry] = {}
    for _, entry in sorted(enumerate(entries), key=rank):
        if entry.problem is not None and entry.config is not None:
            applied.setdefault(entry.problem.key, entry)
    kept = []
    for entry in entries:
        first = applied.get(entry.problem.key) if entry.problem is not None else None
        if first is not None and first is not entry and entry.config is not None:
            reason = ("same dispatch and configuration as an earlier matcher"
                      if first.config == entry.config else
                      f"shadowed: IREE applies {first.matcher.split('[', 1)[0]} to this dispatch")
            entry = ExpertEntry(entry.file, entry.matcher, entry.problem, skipped=reason)
        kept.append(entry)
    return kept


#: A matcher of an attention op: IREE's match op, the op's name or the op in a DAG (either form).
_ATTENTION_MATCHER = re.compile(
    r"transform\.iree\.match\.(online_)?attention\b|\biree_linalg_ext\.(online_)?attention\b")


def _sequence_entries(
    file: str, name: str, body: str, helpers: Mapping[str, str]
) -> list[ExpertEntry]:
    """The entries of one named sequence: none for helpers (no configuration yielded)."""
    config_text = _config_text(body)
    results = _RESULTS.search(body)
    yields_config = bool(results and "!transform.any_param" in results.group(1))
    # The op may be matched by an included helper (IREE's 2024-2025 default specs match any
    # f16 attention in a helper and check its operand shapes in the matcher).
    include = re.search(r"transform\.include\s+@(\w+)", body)
    helper = helpers.get(include.group(1), "") if include else ""
    attention = _ATTENTION_MATCHER.search(body) or _ATTENTION_MATCHER.search(helper)
    if attention and (config_text is not None or "TransformDialectCodegen" in body):
        return _attention_entries(file, name, f"{body}\n{helper}", config_text or "")
    if config_text is None:
        if yields_config:
            return [ExpertEntry(file, name, skipped="no compilation_info constant in the matcher")]
        return []  # a helper (op matcher, apply/entry sequence): no configuration of its own
    if "TransformDialectCodegen" in config_text:
        return [ExpertEntry(file, name, skipped="transform-dialect script, no config")]
    if "lowering_strategy" in config_text:
        # e.g. `cast_and_call_pingpong_matmul`: the op is replaced by a hand-written kernel.
        return [ExpertEntry(file, name, skipped="custom lowering strategy, not a configuration "
                            "of the space")]
    return [_entry(file, name, body, config_text, helpers)]


def _entry(
    file: str, name: str, body: str, config_text: str, helpers: Mapping[str, str]
) -> ExpertEntry:
    try:
        problem = _matcher_problem(body, name, helpers)
    except Exception as exc:  # any rebuild failure is reported for this matcher alone
        return ExpertEntry(file, name, skipped=f"cannot rebuild the op: {_reason(exc)}")
    if problem is None:
        return ExpertEntry(file, name, skipped=_unsupported(body, helpers))
    try:
        if "tile_sizes" in config_text:
            config = _parse_2024(config_text, problem)
        else:
            config = _parse_current(config_text, problem)
        entry = ExpertEntry(file, name, problem, config)
        expert_columns(entry)  # a usable entry must describe itself in candidate terms
    except Exception as exc:  # any parse failure is reported for this matcher alone
        return ExpertEntry(file, name, problem=problem, skipped=f"cannot read config: {_reason(exc)}")
    if problem.kind == "contraction" and problem.loops("batch"):
        return ExpertEntry(file, name, problem, config, notes=("batch matmul",))
    return entry


def _unsupported(body: str, helpers: Mapping[str, str]) -> str:
    """Why `_matcher_problem` found no op it rebuilds in a matcher (one line)."""
    if "attention" in body:
        return "unsupported matcher form: an attention matcher matching neither form of the op"
    include = re.search(r"transform\.include\s+@(\w+)", body)
    if include and include.group(1) not in helpers:
        return f"unsupported matcher form: includes @{include.group(1)}, not in the file"
    fused = re.search(r"%\w+:(\d+)\s*=\s*linalg\.generic", body)
    if fused:
        # One LHS against several RHS (int8 punet's Q/K/V projections); measured on IREE 3.13:
        # `--iree-codegen-emit-pipeline-constraints` emits no constraints op for such a root.
        return (f"horizontally fused contraction: {fused.group(1)} outputs, no space (IREE 3.13 "
                "emits no constraints for it)")
    ops = re.findall(r"=\s*(linalg\.\w+|iree_linalg_ext\.\w+)", body)
    if ops:
        return f"unsupported matcher form: root op {ops[-1]}"
    return "unsupported matcher form: no contraction, convolution or attention matched"


def skip_reasons(entries: Iterable[ExpertEntry]) -> Counter[str]:
    """Skipped matchers per reason (the reason up to its first ':', details dropped)."""
    return Counter(e.skipped.split(":", 1)[0] for e in entries if not e.usable)


def load_spec_dir(directory: str | Path) -> list[ExpertEntry]:
    """Every expert entry of every `*.mlir` spec file in a directory (sorted by file name); a file
    that cannot be read at all is one skipped entry (matcher `*`), not an error."""
    directory = Path(directory)
    files = sorted(directory.glob("*.mlir"))
    if not files:
        raise InputError(f"no .mlir tuning specs in {directory}")
    entries = []
    for path in files:
        try:
            entries += load_spec_file(path)
        except InputError as exc:
            entries.append(ExpertEntry(path.name, "*", skipped=f"unreadable file: {exc}"))
    return entries
