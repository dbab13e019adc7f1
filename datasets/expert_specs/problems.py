"""The op a matcher names, rebuilt as a `Problem`: from IREE 3.13's matcher ops (`dims_equal`
per dimension class), DAG matchers, 2024 named-op matchers, and attention matchers that name no
size (one problem per SDXL attention shape they match)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from dispatchtune.datasets.expert_specs.text import _MAP, _MAP_TEXT, _TENSOR, _context, _ints, _loops
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
