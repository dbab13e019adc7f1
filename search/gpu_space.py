"""IREE's constraint ops described in plain Python (`GpuSpace`), one per candidate pipeline
and lowering: the knob template (which lowering-config entry is which knob), the SMT-LIB body,
loop classes and intrinsic options; restated over the loops IREE's constraints leave out (batch
and group loops, unit loops). Also: dropping IREE's heuristic filters (`--no-heuristic-filters`)
and which of IREE's assertions exclude a configuration (`violated_constraints`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dispatchtune.candidate import DECOMPOSITION_KEY
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem
from dispatchtune.search.engine import ConstraintSystem
from dispatchtune.search.gpu_intrinsics import (
    MmaLayouts,
    intrinsic_options,
    mma_layouts,
    mma_options,
    p_relayout,
)
from dispatchtune.search.gpu_source import (
    CONSTRAINTS_OP,
    constraint_source,
    constraints_module,
    no_constraints,
    why_no_constraints,
)
from dispatchtune.targets import Target

Entry = int | str  # a lowering-config list entry: a literal or a knob name

logger = logging.getLogger(__name__)


#: Assertions IREE emits under "Additional heuristic filters to narrow the search space"
#: (LLVMGPUConstraintGenerator.cpp, VectorDistribute constraint 9), matched on their message. They
#: exclude most expert configurations, which compile, but also some candidates that do not
#: (measured in docs/gpu_order.md); the validity constraints 0-8 are always kept.
HEURISTIC_FILTERS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^wg_size_x <= wg_m OR wg_size_x <= wg_n$"),
    re.compile(r"^red_\d+ must be divisible by mma_m\b"),
)


#: IREE's K-alignment assertion of a TileAndFuse set. For an implicit-GEMM convolution IREE 3.13
#: writes it over the raw K (filter window x input channels, 27 for an RGB 3x3 stem), which no
#: intrinsic K divides, so the set admits nothing, while IREE's own default config of the same
#: op pads K (`padding`): dropped there (`_padded_k`), and the materializer pads as IREE does.
K_ALIGNMENT: tuple[re.Pattern[str], ...] = (
    re.compile(r"^aligned inner k dim \w+ must be divisible by red_\d+ \* mma_k\b"),
)


@dataclass(frozen=True)
class GpuSpace:
    """One `iree_codegen.smt.constraints` op, described in plain Python."""

    index: int  # position of the op in the dispatch (walk order)
    pipeline: str
    smtlib: str
    knobs: tuple[str, ...]  # knob names, in the op's declaration order
    workgroup: tuple[Entry, ...]  # per loop of the op's loop space
    reduction: tuple[Entry, ...]
    subgroup_counts: tuple[Entry, ...]  # VectorDistribute subgroup_basis counts (else empty)
    subgroup: tuple[Entry, ...]  # TileAndFuse per-subgroup tiles (innermost M/N in intrinsics)
    classes: Mapping[str, tuple[int, ...]]  # "b"/"m"/"n"/"k" -> loop positions
    loop_bounds: tuple[int, ...]
    intrinsics: tuple[str, ...]  # options of the mma_idx knob, e.g. "MFMA_F32_16x16x16_F16"
    mma_shapes: tuple[tuple[int, int, int], ...]
    igemm: bool
    image_loops: tuple[int, ...]  # conv output-image loops (direct lowering), else ()
    fixed: Mapping[str, int]  # template literals worth a column (e.g. prefetch_num_stages)
    kind: str = "contraction"  # the root op kind: contraction, convolution or attention
    mma_knob: str = "mma_idx"  # the knob picking the intrinsic (attention: the Q x K^T one)
    #: Per intrinsic option: bits a lane reads contiguously per element vector of operand A.
    operand_bits: tuple[int, ...] = ()
    #: Attention: the knob picking the P x V intrinsic, its options, and per (Q x K^T option,
    #: P x V option) 1 when P must change layout between the two matmuls (see `p_relayout`).
    pv_knob: str = ""
    pv_intrinsics: tuple[str, ...] = ()
    p_relayout: tuple[tuple[int, ...], ...] = ()
    #: Implicit-GEMM convolutions: per loop of the convolution, the implicit-GEMM loop it maps
    #: to if it is a parallel loop, else -1 (where IREE's `padding_conv` repeats `padding`).
    conv_loops: tuple[int, ...] = ()
    #: IREE's `K_ALIGNMENT` assertion was dropped from this set (`_padded_k`): its K tiles may be
    #: partial and are padded.
    padded_k: bool = False
    #: Loops of the template that IREE's constraints do not cover (batch loops of a contraction
    #: whose constraints come from its batch-less equivalent, group loops of a convolution; the
    #: problem's loops, or an implicit GEMM's): workgroup tile 1, not reduced.
    batch_loops: tuple[int, ...] = ()

    def system(self) -> ConstraintSystem:
        return ConstraintSystem.from_smtlib(self.smtlib)


def gpu_spaces(
    problem: Problem, target: Target, heuristic_filters: bool = True
) -> list[GpuSpace]:
    """Every constraint set IREE emits for this problem on this GPU target.

    `heuristic_filters=False` drops the assertions IREE marks as heuristic filters
    (`HEURISTIC_FILTERS`) and keeps every validity constraint.
    """
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    source, batch = constraint_source(problem, target)
    text = constraints_module(source, target)
    spaces = []
    with ir.Context():
        module = ir.Module.parse(text)
        roots = list(iree_codegen.get_tuner_root_ops(module))
        for index, op in enumerate(constraint_ops(module)):
            if not heuristic_filters:
                drop_heuristic_filters(op)
            own_bounds = _unraised_bounds(problem, source, batch, op)
            pins = _repin(op, own_bounds) if own_bounds else ""
            space = _with_k2_floor(_describe(index, op, roots))
            if _padded_k(space, op):
                space = dataclasses.replace(_describe(index, op, roots), padded_k=True)
            if own_bounds:
                space = dataclasses.replace(space, smtlib=space.smtlib + pins,
                                            loop_bounds=own_bounds)
            if batch and len(space.loop_bounds) != len(source.loop_sizes):
                grouped = _with_group_loops(space, problem, source, batch)
                if grouped is None:
                    continue  # implicit-GEMM loops in another order than the conv's: no place
                space = grouped
            elif batch:
                space = _with_batch_loops(space, batch, problem.loop_sizes, _space_classes(
                    problem, batch))
            space = _with_unit_loops(space, problem)
            if space.kind != "convolution" and len(space.loop_bounds) != len(problem.loop_sizes):
                # Its configurations would tile other loops than the ones they name. (A
                # convolution's unit batch loop is folded in its dispatch too, and a contraction's
                # unit loops are restated above.)
                logger.info("%s: IREE's %s template covers %d of the op's %d loops; left out",
                            problem.describe(), space.pipeline, len(space.loop_bounds),
                            len(problem.loop_sizes))
                continue
            spaces.append(space)
    if not spaces:
        raise no_constraints(problem, target, why_no_constraints(problem, target, source, batch))
    return spaces


def _repin(op: Any, sizes: Sequence[int]) -> str:
    """Erase the constraint op's assertions pinning its loop sizes where `sizes` differ (the
    op was raised by `with_small_loops_raised`), and return SMT-LIB asserting `sizes` there."""
    pins = []
    for i, (bound, size) in enumerate(zip(_dims_operands(op), sizes, strict=True)):
        if bound != size:
            _drop_assertions(op, [re.compile(rf"^dim_{i} \(\{{\}}\) == {bound}$")])
            pins.append(f"(assert (= problem_dim_{i} {size}))\n")
    return "".join(pins)


def _unraised_bounds(problem: Problem, source: Problem, left_out: Sequence[int],
                     op: Any) -> tuple[int, ...] | None:
    """The constraint op's loop sizes for `problem` itself when `source` is raised, else None.

    The op's `dims` list the source's loops without the ones left out, or without its unit
    loops too (IREE folds those when it compiles the op alone)."""
    kept = [size for i, size in enumerate(problem.loop_sizes) if i not in set(left_out)]
    raised = list(source.loop_sizes)
    if kept == raised:
        return None
    loops = len(_dims_operands(op))
    if loops != len(kept):
        kept = [size for size, r in zip(kept, raised, strict=True) if r != 1]
    return tuple(kept) if len(kept) == loops else None


def _ops_named(root: Any, name: str) -> list[Any]:
    """Every op called `name` inside `root` (an operation), in walk order."""
    from iree.compiler import ir

    found: list[Any] = []

    def visit(op: Any) -> Any:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def constraint_ops(module: Any) -> list[Any]:
    return _ops_named(module.operation, CONSTRAINTS_OP)


def _with_k2_floor(space: GpuSpace) -> GpuSpace:
    """An attention space without K2 tiles smaller than the Q x K^T intrinsic's N.

    IREE 3.13's attention constraints admit them, but none compiles ("'linalg.pack' op tile
    size analysis did not determine a valid tile size"): measured on gfx942, 60 of 60 such rows
    of three attentions (f16, f16 masked, f32 grouped-query masked) failed and all 291 others
    built. Stated as one more SMT assertion, so every enumeration of the set honours it.
    """
    if space.kind != "attention" or "red_k2" not in space.knobs or not space.mma_shapes:
        return space
    knob = space.mma_knob
    floor = "".join(
        f"(assert (=> (= {knob} {i}) (>= red_k2 {shape[1]})))\n" if knob in space.knobs
        else f"(assert (>= red_k2 {shape[1]}))\n"
        for i, shape in enumerate(space.mma_shapes))
    return dataclasses.replace(space, smtlib=space.smtlib + floor)


def violated_constraints(
    problem: Problem, target: Target, space: GpuSpace, values: Mapping[str, int],
    heuristic_filters: bool = True,
) -> list[str]:
    """IREE's messages of the assertions of `space` that exclude every configuration with these
    knob values (knobs not given are free): a smallest conflicting set Z3 finds, in IREE's
    order; empty when some configuration satisfies them all.

    Says *which constraint* keeps a configuration (e.g. an expert's) out of the space. Each
    `iree_codegen.smt.assert` is converted on its own (the others erased), so every formula keeps
    the message IREE wrote beside it.
    """
    import z3
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen
    from z3.z3util import get_vars

    source, left_out = constraint_source(problem, target)
    with ir.Context():
        module = ir.Module.parse(constraints_module(source, target))  # held: its ops die with it
        op = constraint_ops(module)[space.index]
        if not heuristic_filters:
            drop_heuristic_filters(op)
        if space.padded_k:  # the space's own rows have partial, padded K tiles
            _drop_assertions(op, K_ALIGNMENT)
        own_bounds = _unraised_bounds(problem, source, left_out, op)
        pins = _repin(op, own_bounds) if own_bounds else ""
        messages = [ir.StringAttr(a.attributes["msg"]).value for a in _assert_ops(op)]

        def converted(keep: int | None) -> str:
            """SMT-LIB of the op with only assertion `keep` (None: none), from a copy."""
            copy = op.clone(ip=ir.InsertionPoint(op))
            for i, assertion in enumerate(_assert_ops(copy)):
                if i != keep:
                    assertion.erase()
            text = iree_codegen.convert_constraints_op_to_smtlib(copy)
            copy.erase()
            return text

        base_text = converted(None)
        texts = [converted(i) for i in range(len(messages))]
    base = list(z3.parse_smt2_string(base_text + pins))
    known = {str(f.sexpr()) for f in base}
    solver = z3.Solver()
    solver.set("core.minimize", True)
    solver.add(*base)
    for name, value in values.items():
        solver.add(z3.Int(name) == value)
    for i, text in enumerate(texts):
        extra = [f for f in z3.parse_smt2_string(text) if str(f.sexpr()) not in known]
        if not extra:
            continue
        if all(str(v).startswith("problem_dim_") for f in extra for v in get_vars(f)):
            solver.add(*extra)  # the problem's own sizes: facts, not constraints on a config
        else:
            solver.assert_and_track(z3.And(*extra), f"iree_assert_{i}")
    if solver.check() != z3.unsat:
        return []
    core = sorted(int(str(label).rsplit("_", 1)[1]) for label in solver.unsat_core())
    # IREE's messages carry "{}" placeholders for the values it prints at run time.
    return [re.sub(r"\s*\([^()]*\{\}[^()]*\)", "", messages[i]) for i in core]


def _assert_ops(constraints_op: Any) -> list[Any]:
    return _ops_named(constraints_op, "iree_codegen.smt.assert")


def _with_unit_loops(space: GpuSpace, problem: Problem) -> GpuSpace:
    """A contraction's space stated over all of its loops when IREE folded its unit loops.

    Compiled on its own, `problem.to_mlir()` loses its unit loops (1 x 128 x 768 becomes 128 x
    768), but inside a model's dispatch the same op may keep them, and a configuration with fewer
    entries than the op has loops fails to compile ("failed to distribute", shared memory
    overflow: measured on BERT's f32 dispatches on gfx942). Those loops get a tile of 1.
    """
    if problem.kind != "contraction" or len(space.loop_bounds) >= len(problem.loop_sizes):
        return space
    unit = tuple(i for i, size in enumerate(problem.loop_sizes) if size == 1)
    if len(problem.loop_sizes) - len(unit) != len(space.loop_bounds):
        return space
    return _with_batch_loops(space, unit, problem.loop_sizes)


def insert_at(entries: Sequence[Any], loops: Sequence[int], filler: Any) -> list[Any]:
    """`entries` (one per covered loop) with `filler` at each of `loops` (the full loop list)."""
    out = list(entries)
    for loop in sorted(loops):
        out.insert(loop, filler)
    return out


def _space_classes(problem: Problem, loops: Sequence[int]) -> dict[int, str]:
    """The space's class (`b`, `m`, ...) of each of `loops`, from the problem's classes."""
    names = {"batch": "b", "depth": "b"}
    return {loop: names.get(cls, cls) for cls, members in problem.dims.items()
            for loop in members if loop in set(loops)}


def _with_batch_loops(space: GpuSpace, loops: tuple[int, ...], bounds: tuple[int, ...],
                      classes_of: Mapping[int, str] | None = None) -> GpuSpace:
    """A space of the problem without `loops`, stated over the full problem's loops (tile 1
    there). Each loop joins its class in `classes_of` (default: the batch class `b`)."""
    kept = [i for i in range(len(bounds)) if i not in set(loops)]

    def remap(classes: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(kept[i] for i in classes)

    classes = {c: remap(ls) for c, ls in space.classes.items()}
    for loop in loops:
        cls = (classes_of or {}).get(loop, "b")
        classes[cls] = tuple(sorted((*classes.get(cls, ()), loop)))
    return dataclasses.replace(
        space,
        workgroup=tuple(insert_at(space.workgroup, loops, 1)),
        reduction=tuple(insert_at(space.reduction, loops, 0)),
        subgroup=tuple(insert_at(space.subgroup, loops, 0)) if space.subgroup else (),
        subgroup_counts=(
            tuple(insert_at(space.subgroup_counts, loops, 1)) if space.subgroup_counts else ()
        ),
        classes=classes,
        loop_bounds=bounds,
        image_loops=remap(space.image_loops),
        batch_loops=loops,
    )


def _with_group_loops(space: GpuSpace, problem: Problem, source: Problem,
                      groups: Sequence[int]) -> GpuSpace | None:
    """The implicit-GEMM set of a group-less convolution stated for the grouped one: its group
    loops, tile 1, among the implicit-GEMM loops where they sit among the convolution's parallel
    loops; None unless the set's GEMM loops follow the source's parallel loops in order.

    IREE forms an implicit GEMM from the convolution's parallel loops in order, then K (the
    tuner's grouped configs read `workgroup = [oh, ow, group, oc, K]`, and IREE 3.13 applies and
    builds them), so the group-less set plus a group loop is the grouped op's.
    """
    if not space.igemm or not space.conv_loops:
        return None
    source_parallel = [d for d in range(len(source.loop_sizes))
                       if d not in source.reduction_loops()]
    if [space.conv_loops[d] for d in source_parallel] != list(range(len(source_parallel))):
        return None
    parallel = [d for d in range(len(problem.loop_sizes)) if d not in problem.reduction_loops()]
    positions = tuple(parallel.index(d) for d in groups)  # in order: `groups` is sorted
    bounds = list(space.loop_bounds)
    for position, group in zip(positions, groups, strict=True):
        bounds.insert(position, problem.loop_sizes[group])
    grouped = _with_batch_loops(space, positions, tuple(bounds), {p: "b" for p in positions})
    return dataclasses.replace(grouped, conv_loops=tuple(
        parallel.index(d) if d in parallel else -1 for d in range(len(problem.loop_sizes))))


def drop_heuristic_filters(constraints_op: Any) -> list[str]:
    """Erase the heuristic-filter assertions of one constraints op; returns their messages."""
    return _drop_assertions(constraints_op, HEURISTIC_FILTERS)


def _drop_assertions(constraints_op: Any, patterns: Sequence[re.Pattern[str]]) -> list[str]:
    """Erase the assertions of one constraints op whose message matches; returns the messages."""
    from iree.compiler import ir

    dropped = []
    for op in _assert_ops(constraints_op):
        message = ir.StringAttr(op.attributes["msg"]).value
        if any(p.search(message) for p in patterns):
            dropped.append(message)
            op.erase()
    return dropped


def _padded_k(space: GpuSpace, constraints_op: Any) -> bool:
    """Drop `K_ALIGNMENT` from an implicit-GEMM set whose K no intrinsic's K divides, when that
    leaves the set empty (then every row it adds has a partial K tile, padded as IREE's own
    default config pads it); whether it did."""
    if not space.igemm or not space.mma_shapes:
        return False
    k = math.prod(space.loop_bounds[i] for i in space.classes.get("k", ()))
    if any(k % shape[2] == 0 for shape in space.mma_shapes):
        return False
    if any(len(chunk[next(iter(chunk))]) for chunk in space.system().solve() if chunk):
        return False
    if not _drop_assertions(constraints_op, K_ALIGNMENT):
        return False
    logger.info("implicit-GEMM K %d is a multiple of no intrinsic K: K tiles padded, as IREE's "
                "default config pads them", k)
    return True


def _entries(attr: Any) -> tuple[Entry, ...]:
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    out: list[Entry] = []
    for item in attr:
        if isinstance(item, iree_codegen.IntKnobAttr):
            out.append(str(item.name))
        elif isinstance(item, (ir.IntegerAttr, ir.BoolAttr)):
            out.append(int(item.value))
        else:
            raise DispatchTuneError(f"unexpected entry {item} in an IREE knob template")
    return tuple(out)


def _describe(index: int, op: Any, roots: list[Any]) -> GpuSpace:
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu, linalg

    template = op.attributes["knobs"]
    pipeline = re.sub(r".*<(\w+)>.*", r"\1", str(op.attributes["pipeline"]))
    smtlib = iree_codegen.convert_constraints_op_to_smtlib(op)
    knobs = [str(ir.StringAttr(knob.attributes["name"]).value)
             for knob in _ops_named(op, "iree_codegen.smt.knob")]
    workgroup = _entries(template["workgroup"])
    reduction = _entries(template["reduction"])
    counts: tuple[Entry, ...] = ()
    subgroup: tuple[Entry, ...] = ()
    if "subgroup" in template:
        subgroup = _entries(template["subgroup"])
    if "subgroup_basis" in template:
        counts = _entries(ir.ArrayAttr(template["subgroup_basis"])[0])
    decomposition = None  # DictAttr.get is a constructor, not dict.get
    if DECOMPOSITION_KEY in template:
        decomposition = template[DECOMPOSITION_KEY]
    mma_knob = "mma_idx"
    intrinsics: tuple[str, ...] = ()
    shapes: tuple[tuple[int, int, int], ...] = ()
    layouts: list[MmaLayouts | None] = []
    pv_knob = ""
    pv_intrinsics: tuple[str, ...] = ()
    relayout: tuple[tuple[int, ...], ...] = ()
    if decomposition is not None:
        # Attention: intrinsics and subgroup counts live in the decomposition config of its
        # Q x K^T (`qk_attrs`) and P x V (`pv_attrs`) matmuls; IREE asserts both share M/N.
        qk = iree_gpu.LoweringConfigAttr(decomposition["qk_attrs"]["lowering_config"]).attributes
        pv = iree_gpu.LoweringConfigAttr(decomposition["pv_attrs"]["lowering_config"]).attributes
        mma_knob, intrinsics, shapes = intrinsic_options(qk["mma_kind"])
        pv_knob, pv_intrinsics, _ = intrinsic_options(pv["mma_kind"])
        layouts = [mma_layouts(option) for option in mma_options(qk["mma_kind"])]
        pv_layouts = [mma_layouts(option) for option in mma_options(pv["mma_kind"])]
        relayout = tuple(tuple(p_relayout(q, p) for p in pv_layouts) for q in layouts)
        counts = _entries(ir.ArrayAttr(qk["subgroup_basis"])[0])
    elif "mma_kind" in template:
        mma_knob, intrinsics, shapes = intrinsic_options(template["mma_kind"])
        layouts = [mma_layouts(option) for option in mma_options(template["mma_kind"])]
    operand_bits = tuple(layout.operand_bits if layout else 0 for layout in layouts)
    fixed: dict[str, int] = {}
    options_attr = None  # DictAttr.get is a constructor, not dict.get
    if "gpu_pipeline_options" in template:
        options_attr = template["gpu_pipeline_options"]
    igemm_fixed = False
    if options_attr is not None:
        stages = options_attr["prefetch_num_stages"]
        if isinstance(stages, ir.IntegerAttr):
            fixed["prefetch_num_stages"] = int(stages.value)
        igemm_attr = options_attr["use_igemm_convolution"]
        if isinstance(igemm_attr, ir.BoolAttr):
            igemm_fixed = bool(igemm_attr.value)

    root = _root_for(op, roots)
    n_loops = len(workgroup)
    dims_count = len(list(op.operands))
    igemm = False
    image_loops: tuple[int, ...] = ()
    conv_loops: tuple[int, ...] = ()
    kind = "contraction"
    if "attention" in root.name:
        kind = "attention"
        maps = [m.value for m in root.attributes["indexing_maps"]]
        n_ins = len(root.operands) - len(root.results)
        detail = iree_codegen.get_attention_op_detail(maps[0], maps[1], maps[2], maps[n_ins])
        classes = {
            "b": tuple(detail.batch_dims), "m": tuple(detail.m_dims), "n": tuple(detail.n_dims),
            "k1": tuple(detail.k1_dims), "k2": tuple(detail.k2_dims),
        }
        bounds = _dims_operands(op)
    elif linalg.isa_contraction_op(root):
        cd = linalg.infer_contraction_dimensions(root)
        classes = {"b": tuple(cd.batch), "m": tuple(cd.m), "n": tuple(cd.n), "k": tuple(cd.k)}
        bounds = _dims_operands(op)
    elif linalg.isa_convolution_op(root):
        kind = "convolution"
        cv = linalg.infer_convolution_dimensions(root)
        if n_loops == dims_count:
            classes = {
                "b": tuple(cv.depth), "m": (*cv.batch, *cv.output_image),
                "n": tuple(cv.output_channel), "k": (*cv.filter_loop, *cv.input_channel),
            }
            bounds = _dims_operands(op)
            image_loops = tuple(cv.output_image)
        else:
            details = iree_codegen.get_igemm_generic_conv_details(root)
            to_igemm = {int(k): int(v) for k, v in dict(details.conv_to_igemm_dim_map).items()}

            def mapped(loops: Any) -> tuple[int, ...]:
                return tuple(sorted({to_igemm[int(d)] for d in loops}))

            classes = {
                "b": mapped(cv.depth), "m": mapped([*cv.batch, *cv.output_image]),
                "n": mapped(cv.output_channel), "k": mapped([*cv.filter_loop, *cv.input_channel]),
            }
            bounds = tuple(int(b) for b in details.igemm_loop_bounds)
            igemm = True
            parallel = {int(d) for d in (*cv.depth, *cv.batch, *cv.output_image,
                                         *cv.output_channel)}
            conv_loops = tuple(to_igemm[d] if d in parallel else -1
                               for d in range(len(root.attributes["iterator_types"])))
    else:
        raise DispatchTuneError(
            f"GPU search supports contractions, convolutions and attention, not {root.name}"
        )
    if len(bounds) != n_loops:
        raise DispatchTuneError(
            f"{pipeline} knob template has {n_loops} loops but the root op has {len(bounds)}"
        )
    return GpuSpace(
        index=index, pipeline=pipeline, smtlib=smtlib, knobs=tuple(knobs), workgroup=workgroup,
        reduction=reduction, subgroup_counts=counts, subgroup=subgroup, classes=classes, loop_bounds=bounds,
        intrinsics=intrinsics, mma_shapes=shapes, igemm=igemm or igemm_fixed,
        image_loops=image_loops, fixed=fixed, kind=kind, mma_knob=mma_knob,
        operand_bits=operand_bits, pv_knob=pv_knob, pv_intrinsics=pv_intrinsics,
        p_relayout=relayout, conv_loops=conv_loops,
    )


def _root_for(op: Any, roots: list[Any]) -> Any:
    if not roots:
        raise DispatchTuneError("IREE found no tunable root op in this dispatch")
    wanted = str(op.attributes["target"]) if "target" in op.attributes else ""
    for root in roots:
        if "root_op" in root.attributes and str(root.attributes["root_op"]).endswith(
            wanted.split("<", 1)[-1]
        ):
            return root
    return roots[0]


def _dims_operands(op: Any) -> tuple[int, ...]:
    """Static sizes of the op's `dims(...)` operands: the root op's loop trip counts."""
    from iree.compiler import ir

    sizes = []
    for operand in op.operands:
        owner = operand.owner
        if not hasattr(owner, "attributes") or "value" not in owner.attributes:
            raise DispatchTuneError("GPU search needs static shapes (a dims operand is dynamic)")
        sizes.append(int(ir.IntegerAttr(owner.attributes["value"]).value))
    return tuple(sizes)
