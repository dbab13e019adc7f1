"""GPU search spaces from IREE's own SMT constraints (TileAndFuse, VectorDistribute).

`iree-compile --iree-codegen-emit-pipeline-constraints --compile-to=executable-configurations`
attaches one `iree_codegen.smt.constraints` op per candidate pipeline (and, for convolutions, per
lowering: direct and implicit GEMM) to the dispatch. Each op carries a knob template (which
lowering-config entry is which knob) and a body of SMT assertions. We convert the body to
SMT-LIB (`convert_constraints_op_to_smtlib`), enumerate every solution exactly with
`engine.ConstraintSystem`, and turn a row back into a `compilation_info` with IREE's
`materialize_compilation_info` (lazily, per row).

IREE 3.13 crashes (SIGSEGV) emitting constraints for contractions with batch loops (a
`batch_matmul` on any GPU target) and for grouped convolutions (a group loop in input, filter
and output: the `depth` class). For those the constraints come from the same op without those
loops, and every candidate gets a tile of 1 there (`GpuSpace.batch_loops`), the tile IREE's own
default batch configuration uses. A grouped convolution's implicit-GEMM set puts the group
loop among the GEMM loops where it sits among the convolution's parallel loops (IREE's order:
`_with_group_loops`). Contractions with an M, N or K below every intrinsic, for which IREE
emits none, take the constraints of the op with those loops raised (`with_small_loops_raised`),
pinned back to the op's sizes. Loops IREE
collapses when it compiles the op alone but a model's dispatch keeps (an attention's batch x
heads or query groups x sequence, a contraction's image: `_collapsed_loops`) get the same
treatment, so that every configuration names every loop of the op it is applied to.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.candidate import DECOMPOSITION_KEY, with_decomposition
from dispatchtune.errors import DispatchTuneError, UnsupportedProblem
from dispatchtune.problem import Problem
from dispatchtune.search.engine import ConstraintSystem, enumerate_blocking
from dispatchtune.search.space import GPU_PIPELINES, CandidateSet, finish_table
from dispatchtune.targets import Target
from dispatchtune.toolchain import compiler_failure, iree_compiler_version, run_tool

Entry = int | str  # a lowering-config list entry: a literal or a knob name

logger = logging.getLogger(__name__)

#: The op IREE attaches per candidate pipeline (and lowering) when it emits constraints.
CONSTRAINTS_OP = "iree_codegen.smt.constraints"

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
    #: P x V option) 1 when P must change layout between the two matmuls (see `_p_relayout`).
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


_MODULES: dict[tuple[str, str], str] = {}
_SOURCES: dict[tuple[str, str], tuple[Problem, tuple[int, ...]]] = {}


def constraints_module(problem: Problem, target: Target) -> str:
    """The dispatch configured by IREE with the SMT constraints kept in the IR (MLIR text), its
    knob template's attention intrinsics oriented as IREE's own configuration orients them."""
    key = (problem.key, target.name)
    if key not in _MODULES:
        proc = run_tool(
            "iree-compile",
            [
                "-", *target.compile_flags, "--iree-codegen-emit-pipeline-constraints",
                "--compile-to=executable-configurations", "-o", "-",
            ],
            input_text=problem.to_mlir(),
        )
        if proc.returncode != 0:
            reason = compiler_failure(proc.returncode, proc.stderr)
            raise DispatchTuneError(
                f"iree-compile could not emit constraints for {problem.describe()} on "
                f"{target.name}: {reason}"
            )
        _MODULES[key] = _default_orientation(proc.stdout)
    return _MODULES[key]


def constraint_source(problem: Problem, target: Target) -> tuple[Problem, tuple[int, ...]]:
    """The problem whose constraints describe `problem`'s space, and the loops they leave out.

    Usually `problem` itself. A contraction with batch loops or a grouped convolution, on which
    IREE crashes emitting constraints, is described by the same op without those loops; they are
    returned so that every candidate gets a tile of 1 there. A contraction with an M, N or K
    smaller than any intrinsic's, for which IREE emits no constraints, is described by the op
    with those loops raised (`with_small_loops_raised`); `gpu_spaces` pins them back.
    """
    key = (problem.key, target.name)
    if key not in _SOURCES:
        source, left_out = _source_at_own_sizes(problem, target)
        _SOURCES[key] = (_with_constraints(source, target), left_out)
    return _SOURCES[key]


def _with_constraints(problem: Problem, target: Target) -> Problem:
    """`problem`, or, when IREE emits no constraints for it, its `with_small_loops_raised`
    form if IREE emits some for that."""
    if problem.kind != "contraction" or CONSTRAINTS_OP in constraints_module(problem, target):
        return problem
    raised = with_small_loops_raised(problem, target)
    try:
        if raised is None or CONSTRAINTS_OP not in constraints_module(raised, target):
            return problem
    except DispatchTuneError:  # IREE crashing on the raised op: the op keeps its own (none)
        return problem
    logger.info("IREE emits no constraints for %s (its default is not an MMA config); using "
                "those of %s, pinned to the op's own sizes", problem.describe(), raised.describe())
    return raised


def _source_at_own_sizes(problem: Problem, target: Target) -> tuple[Problem, tuple[int, ...]]:
    """`constraint_source` before small loops are raised."""
    source: tuple[Problem, tuple[int, ...]] = (problem, ())
    outer = _collapsed_loops(problem, target)
    if outer:
        # Compiled on its own the op has those loops collapsed (IREE's dispatch formation), so
        # its template has fewer entries than the op in a model's dispatch, where they stay:
        # the constraints come from the op without them, and they get a tile of 1.
        unbatched = without_loops(problem, outer)
        if unbatched is not None:
            constraints_module(unbatched, target)
            return (unbatched, outer)
    # Loops IREE crashes on, each in every operand on its own: contraction batches, conv groups.
    batch = {"contraction": problem.loops("batch"),
             "convolution": problem.loops("depth")}.get(problem.kind, ())
    try:
        text = constraints_module(problem, target)
    except DispatchTuneError as error:
        if "crashed" in str(error) and _matrix_vector(problem):
            raise _no_constraints(
                problem, target, "its constraint generator crashes on a matrix-vector product, "
                "with no M or no N loop larger than 1, which IREE configures as a reduction "
                "without MMA intrinsics") from error
        unbatched = without_loops(problem, batch) if batch else None
        if unbatched is None or "crashed" not in str(error):
            raise
        logger.info("IREE %s crashes emitting constraints for %s on %s, as it does for batch "
                    "loops and convolution groups; using the constraints of %s with a tile of 1 "
                    "on loop(s) %s", iree_compiler_version(), problem.describe(), target.name,
                    unbatched.describe(), ", ".join(f"d{i}" for i in batch))
        constraints_module(unbatched, target)
        source = (unbatched, batch)
    else:
        # A batch matmul IREE configures without MMA (an M of 4) emits none rather than crash;
        # raised to an intrinsic's M it would crash: the batch-less op is raised instead.
        if problem.kind == "contraction" and batch and CONSTRAINTS_OP not in text:
            unbatched = without_loops(problem, batch)
            if unbatched is not None:
                source = (unbatched, batch)
    return source


def _matrix_vector(problem: Problem) -> bool:
    """A contraction whose M or N loops (or all of them) have one iteration: a matrix-vector
    product."""
    sizes = problem.loop_sizes
    return problem.kind == "contraction" and any(
        all(sizes[loop] == 1 for loop in problem.loops(cls)) for cls in ("m", "n"))


#: An intrinsic's name ends with its shape and operand type(s): MFMA_F32_16x16x16_F16 is 16 x 16 x
#: 16 on f16 operands.
_INTRINSIC_NAME = re.compile(r"_(\d+)x(\d+)x(\d+)((?:_[A-Za-z0-9]+)+)$")


def _intrinsic_shapes(target: Target, element_types: Sequence[str]) -> list[tuple[int, int, int]]:
    """M, N and K of the target's MMA intrinsics whose operand types are all among
    `element_types`."""
    wanted = {t.lower() for t in element_types}
    shapes = []
    for name in target.gpu_facts().mma_intrinsics:
        match = _INTRINSIC_NAME.search(name)
        if match and {t.lower() for t in match.group(4).split("_")[1:]} <= wanted:
            shapes.append((int(match.group(1)), int(match.group(2)), int(match.group(3))))
    return shapes


def with_small_loops_raised(problem: Problem, target: Target) -> Problem | None:
    """The same contraction with each M, N or K loop smaller than every intrinsic's side there
    raised to the smallest side; None when no loop is that small (or a map is not plain).

    IREE 3.13 configures a contraction with an M or N of 2-4 without MMA and emits no
    constraints for it, yet pads an MMA config of such an op as it pads any unaligned one
    (IREE's tuner ships them: 16 x 32 tiles of m = 2). Its TileAndFuse constraints state every
    loop rounded up to the intrinsic (`ceil(dim / mma) * mma`), which is the same for any size
    up to the smallest side: the raised op's constraints, pinned back to the op's own sizes
    (`_repin`), are the op's.
    """
    shapes = _intrinsic_shapes(target, problem.input_types)
    if not shapes:
        return None
    sides = {cls: min(shape[i] for shape in shapes) for i, cls in enumerate(("m", "n", "k"))}
    sizes = list(problem.loop_sizes)
    for cls, side in sides.items():
        for loop in problem.loops(cls):
            if 1 < sizes[loop] < side:
                sizes[loop] = side
    if sizes == list(problem.loop_sizes):
        return None
    operand_shapes = []
    for text in problem.indexing_maps:
        plain = [re.fullmatch(r"d(\d+)", e) for e in _map_results(text)]
        if not all(plain):
            return None
        operand_shapes.append(tuple(sizes[int(m.group(1))] for m in plain if m))
    return dataclasses.replace(problem, loop_sizes=tuple(sizes),
                               operand_shapes=tuple(operand_shapes))


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


def _map_results(text: str) -> list[str]:
    """The result expressions of an affine map's text, e.g. ["d0", "d1 * 2 + d4"]."""
    results = text.split("->", 1)[1].strip().strip("()")
    return [e.strip() for e in results.split(",")] if results.strip() else []


def _collapsed_loops(problem: Problem, target: Target) -> tuple[int, ...]:
    """Loops of `problem` that IREE collapses into the next loop of their class when it forms a
    dispatch of the op alone, but that a model's dispatch may keep (`_collapsible_outer`: an
    attention's batch and M loops; a contraction's M and N loops when its template, unit loops
    aside, is shorter than the op).

    SDXL's batch x heads, a grouped-query attention's query groups x sequence, an NCHW 1x1
    convolution's batch x image as a contraction's M: IREE's own configs of such dispatches give
    every loop an entry (a tile of 1 on the outer ones), and configurations of the collapsed
    op tile other loops than they name there (shared memory overflows, compile timeouts).
    """
    if problem.kind == "attention":
        classes: tuple[str, ...] = ("batch", "m")
    elif problem.kind == "contraction" and not problem.loops("batch"):
        classes = ("m", "n")
    else:
        return ()
    outer = tuple(sorted(loop for cls in classes for loop in _collapsible_outer(problem, cls)))
    if not outer or problem.kind == "attention":
        return outer
    entries = _template_entries(constraints_module(_with_constraints(problem, target), target))
    non_unit = sum(1 for size in problem.loop_sizes if size != 1)
    return outer if entries is not None and entries < non_unit else ()


def _collapsible_outer(problem: Problem, cls: str) -> list[int]:
    """Non-unit loops of a class that collapse into the next one of the class: wherever either
    indexes an operand (the mask too), the next one follows it at once (IREE's criterion for
    collapsing dimensions)."""
    maps = [*problem.indexing_maps, *([problem.mask_map] if problem.mask_map else [])]
    results = [_map_results(m) for m in maps]
    loops = [i for i in problem.loops(cls) if problem.loop_sizes[i] != 1]
    outer = []
    for a, b in itertools.pairwise(loops):
        first, second = f"d{a}", f"d{b}"
        if all((first in r) == (second in r) and (first not in r
                                                  or r.index(second) == r.index(first) + 1)
               for r in results):
            outer.append(a)
    return outer


def _template_entries(module: str) -> int | None:
    """Entries of the first knob template's `workgroup` list (the loops its configs tile)."""
    found = re.search(r"knobs = \{.*?\bworkgroup = \[([^\]]*)\]", module, re.DOTALL)
    return None if found is None else len(found.group(1).split(","))


def without_loops(problem: Problem, loops: Sequence[int]) -> Problem | None:
    """The same op without some loops (each indexing an operand dim on its own), or None."""
    dropped = set(loops)
    kept = [i for i in range(len(problem.loop_sizes)) if i not in dropped]
    renamed = {old: new for new, old in enumerate(kept)}
    dims = ", ".join(f"d{i}" for i in range(len(kept)))

    def reduced(text: str, shape: Sequence[int]) -> list[tuple[str, int]] | None:
        """(result, size) of one map's results without the dropped loops (renumbered)."""
        exprs = _map_results(text)
        if len(exprs) != len(shape):
            return None
        keep = []
        for expr, size in zip(exprs, shape, strict=True):
            used = {int(d) for d in re.findall(r"\bd(\d+)\b", expr)}
            if used & dropped:
                if expr != f"d{next(iter(used))}" or len(used) != 1:
                    return None  # a dropped loop inside a compound index: not separable
                continue
            keep.append((re.sub(r"\bd(\d+)\b", lambda m: f"d{renamed[int(m.group(1))]}", expr),
                         size))
        return keep

    maps, shapes = [], []
    for text, shape in zip(problem.indexing_maps, problem.operand_shapes, strict=True):
        keep = reduced(text, shape)
        if keep is None:
            return None
        maps.append(f"({dims}) -> ({', '.join(e for e, _ in keep)})")
        shapes.append(tuple(size for _, size in keep))
    mask_map = ""
    if problem.mask_map:
        mask = reduced(problem.mask_map, problem.mask_shape)
        if mask is None:
            return None
        mask_map = f"({dims}) -> ({', '.join(e for e, _ in mask)})"
    return dataclasses.replace(
        problem,
        loop_sizes=tuple(problem.loop_sizes[i] for i in kept),
        dims={c: tuple(renamed[i] for i in ls if i in renamed) for c, ls in problem.dims.items()},
        operand_shapes=tuple(shapes),
        indexing_maps=tuple(maps),
        mask_map=mask_map,
        op_name=problem.op_name if problem.kind == "attention" else "linalg.generic",
    )


_DEFAULT_MMA = re.compile(
    r"\b(qk|pv)_attrs = \{lowering_config = #iree_gpu\.lowering_config<\{mma_kind = "
    r"#iree_gpu\.(?:virtual_)?mma_layout<\w+(, col_major = true)?>")
_TEMPLATE_MMA = re.compile(
    r"(\b(qk|pv)_attrs = \{lowering_config = #iree_gpu\.lowering_config<\{mma_kind = "
    r"#iree_codegen\.smt\.one_of_knob<\"\w+\", \[)([^\]]*)")


def _default_orientation(module: str) -> str:
    """The constraints module with its attention knob template's intrinsics oriented as IREE's own
    configuration of the op orients them (`col_major`).

    IREE 3.13 configures attention with `col_major = true` intrinsics on gfx942, so that P, the
    Q x K^T result, is held the way P x V reads it, but its knob template lists the intrinsics
    without it. Compiled as listed, the same tiles move P through shared memory and store the
    output 16 bits at a time (gfx942 ISA: 32 `ds_write_b16` + 32 `buffer_store_short` against 8
    `buffer_store_dwordx2`; docs/gpu_order.md, part 10)."""
    oriented = {m.group(1) for m in _DEFAULT_MMA.finditer(module) if m.group(2)}

    def orient(m: re.Match[str]) -> str:
        if m.group(2) not in oriented:
            return m.group(0)
        options = re.sub(r"(mma_layout<\w+)>", r"\1, col_major = true>", m.group(3))
        return m.group(1) + options

    return _TEMPLATE_MMA.sub(orient, module) if oriented else module


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


def _constraint_ops(module: Any) -> list[Any]:
    return _ops_named(module.operation, CONSTRAINTS_OP)


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
        for index, op in enumerate(_constraint_ops(module)):
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
        raise _no_constraints(problem, target, _why_no_constraints(problem, target, source, batch))
    return spaces


def _no_constraints(problem: Problem, target: Target, why: str) -> DispatchTuneError:
    """The error of an op IREE emits no constraints for on `target`, and `why`."""
    return DispatchTuneError(
        f"IREE emits no GPU constraints for {problem.describe()} on {target.name} ({why})")


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


def _why_no_constraints(problem: Problem, target: Target, source: Problem | None = None,
                        tiled_out: Sequence[int] = ()) -> str:
    """What keeps IREE's constraint generator from an op, as far as the op and target say."""
    # The element types first: without an intrinsic for them nothing else could help.
    if not _intrinsic_shapes(target, problem.input_types):
        return (f"no MMA intrinsic of {target.name} takes "
                f"{'/'.join(sorted(set(problem.input_types)))}")
    crashed_on = {*problem.loops("batch"), *problem.loops("depth")}
    if source is not None and tiled_out and (
            problem.kind == "attention" or not set(tiled_out) <= crashed_on):
        loops = ", ".join(f"d{i}" for i in tiled_out)
        return (f"its dispatch keeps loop(s) {loops}, which IREE collapses into the next loop "
                f"only when it compiles the op alone; with a tile of 1 there, IREE emits none "
                f"for the rest: {source.describe()}")
    if problem.kind == "convolution" and problem.loops("depth") and not problem.loops(
            "input_channel"):
        return "a depthwise convolution has no channel reduction for an MMA intrinsic"
    return ("it has MMA intrinsics for these element types; IREE's constraint generator does not "
            "cover this op's shape or layout")


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
        op = _constraint_ops(module)[space.index]
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


def _insert(entries: Sequence[Any], loops: Sequence[int], filler: Any) -> list[Any]:
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
        workgroup=tuple(_insert(space.workgroup, loops, 1)),
        reduction=tuple(_insert(space.reduction, loops, 0)),
        subgroup=tuple(_insert(space.subgroup, loops, 0)) if space.subgroup else (),
        subgroup_counts=(
            tuple(_insert(space.subgroup_counts, loops, 1)) if space.subgroup_counts else ()
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


def with_batch_tiles(info: Any, loops: Sequence[int]) -> Any:
    """A batch-less problem's `compilation_info` for the full problem: batch tile 1 inserted.

    `workgroup` gets 1, `reduction` and TileAndFuse `subgroup` 0, and `subgroup_basis` one
    subgroup along each batch loop (its mapping renumbered), as IREE's default batch configs.
    """
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen, iree_gpu

    info = iree_codegen.CompilationInfoAttr(info)
    config = iree_gpu.LoweringConfigAttr(info.lowering_config).attributes
    entries = {config[i].name: config[i].attr for i in range(len(config))}
    i64 = ir.IntegerType.get_signless(64)

    def ints(values: Sequence[int]) -> Any:
        return ir.ArrayAttr.get([ir.IntegerAttr.get(i64, int(v)) for v in values])

    def values(attr: Any) -> list[int]:
        return [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(attr)]

    for key, filler in (("workgroup", 1), ("reduction", 0), ("subgroup", 0)):
        if key in entries:
            entries[key] = ints(_insert(values(entries[key]), loops, filler))
    if "subgroup_basis" in entries:
        entries["subgroup_basis"] = _basis_with_loops(entries["subgroup_basis"], loops)
    lowering = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
    return iree_codegen.CompilationInfoAttr.get(lowering, info.translation_info)


def _basis_with_loops(basis: Any, loops: Sequence[int]) -> Any:
    """A `subgroup_basis` ([counts, mapping]) with one subgroup along each inserted loop.

    Counts have one entry per loop of the op; the mapping lists, in loop order, the basis entry
    of each loop the config covers (all loops of a contraction; one matmul's loops of an
    attention), so an inserted loop goes after the entries below it.
    """
    from iree.compiler import ir

    i64 = ir.IntegerType.get_signless(64)
    counts_attr, mapping_attr = list(ir.ArrayAttr(basis))
    counts = [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(counts_attr)]
    mapping = [int(ir.IntegerAttr(a).value) for a in ir.ArrayAttr(mapping_attr)]
    for loop in sorted(loops):  # basis entries at or after `loop` move up by one
        counts.insert(loop, 1)
        mapping = [m + (m >= loop) for m in mapping]
        mapping.insert(sum(m < loop for m in mapping), loop)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, v) for v in row])
                             for row in (counts, mapping)])


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
        mma_knob, intrinsics, shapes = _intrinsics(qk["mma_kind"])
        pv_knob, pv_intrinsics, _ = _intrinsics(pv["mma_kind"])
        layouts = [_mma_layouts(option) for option in _options(qk["mma_kind"])]
        pv_layouts = [_mma_layouts(option) for option in _options(pv["mma_kind"])]
        relayout = tuple(tuple(_p_relayout(q, p) for p in pv_layouts) for q in layouts)
        counts = _entries(ir.ArrayAttr(qk["subgroup_basis"])[0])
    elif "mma_kind" in template:
        mma_knob, intrinsics, shapes = _intrinsics(template["mma_kind"])
        layouts = [_mma_layouts(option) for option in _options(template["mma_kind"])]
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


def _options(kind: Any) -> list[Any]:
    """The `mma_kind` attributes a template entry allows (one unless it is a one-of knob)."""
    from iree.compiler.dialects import iree_codegen

    return list(kind.options) if isinstance(kind, iree_codegen.OneOfKnobAttr) else [kind]


def _intrinsic_name(option: Any) -> str:
    """`MFMA_F32_16x16x16_F16` of `#iree_gpu.mma_layout<MFMA_F32_16x16x16_F16, col_major = true>`."""
    return re.sub(r".*<(\w+).*", r"\1", str(option))


def _intrinsics(kind: Any) -> tuple[str, tuple[str, ...], tuple[tuple[int, int, int], ...]]:
    """The knob choosing an `mma_kind` (or "" when fixed), its options' names and M/N/K shapes."""
    from iree.compiler.dialects import iree_codegen, iree_gpu

    one_of = isinstance(kind, iree_codegen.OneOfKnobAttr)
    options = _options(kind)
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


def _mma_layouts(option: Any) -> MmaLayouts | None:
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


def _p_relayout(qk: MmaLayouts | None, pv: MmaLayouts | None) -> int:
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


# ---- enumeration --------------------------------------------------------------------------------
def enumerate_space(space: GpuSpace, limit: int | None = None) -> pd.DataFrame:
    """Every solution of one constraint set as a candidate table (deduplicated on the knobs)."""
    system = space.system()
    names = list(system.variables)
    parts: list[pd.DataFrame] = []
    kept = 0
    for chunk in system.solve():
        part = pd.DataFrame({n: chunk[n] for n in names})
        parts.append(part)
        kept += len(part)
        if limit is not None and kept >= limit:
            # Auxiliary SMT variables could repeat a knob assignment: count distinct ones.
            merged = pd.concat(parts, ignore_index=True)
            kept = int((~merged[list(space.knobs)].duplicated()).sum()) if len(space.knobs) else 0
            parts = [merged]
            if kept >= limit:
                break
    if parts:
        solutions = pd.concat(parts, ignore_index=True)
    else:
        solutions = pd.DataFrame({n: np.zeros(0, dtype=np.int64) for n in names})
    solutions = solutions[~solutions[list(space.knobs)].duplicated()]
    cols = {n: solutions[n].to_numpy(dtype=np.int64) for n in names}
    table = gpu_columns(space, cols)
    if limit is not None:
        table = table.iloc[:limit].reset_index(drop=True)
    return table


def reference_solutions(space: GpuSpace) -> set[tuple[int, ...]]:
    """The same solution set by blocking clauses (slow; for tests and benchmarks)."""
    import z3

    return set(enumerate_blocking(list(z3.parse_smt2_string(space.smtlib)), space.knobs))


def gpu_columns(space: GpuSpace, cols: Mapping[str, np.ndarray]) -> pd.DataFrame:
    """Standard candidate columns (elements, counts) from IREE's raw knob values."""
    rows = len(next(iter(cols.values()))) if cols else 0

    def value(entry: Entry) -> np.ndarray:
        if isinstance(entry, str):
            return np.asarray(cols[entry], dtype=np.int64)
        return np.full(rows, entry, dtype=np.int64)

    def option(values: Sequence[Any], index: np.ndarray, default: Any, dtype: Any) -> np.ndarray:
        """Per row, the option `index` picks (`default` when the template offers none)."""
        table = np.array(values or [default], dtype=dtype)
        return table[np.clip(index, 0, len(table) - 1)]

    knob = space.mma_knob
    mma_idx = value(knob) if knob in cols else np.zeros(rows, dtype=np.int64)
    mma = option(space.mma_shapes, mma_idx, (0, 0, 0), np.int64)
    bounds = space.loop_bounds

    def tile(
        entries: tuple[Entry, ...], loops: tuple[int, ...], scale_knobs: np.ndarray | None
    ) -> np.ndarray:
        out = np.ones(rows, dtype=np.int64)
        for loop in loops:
            size = value(entries[loop])
            size = np.where(size == 0, bounds[loop], size)  # 0 = not tiled: the whole loop
            if scale_knobs is not None and isinstance(entries[loop], str):
                size = size * scale_knobs
            out *= size
        return out

    extra: dict[str, np.ndarray] = {}
    if space.kind == "attention":
        gemm_view, value_head = _attention_tiles(space, value, rows)
        tile_b, tile_m, tile_n, tile_k, vec_m, vec_n, sub_m, sub_n, workgroups = gemm_view
        extra.update(value_head)
        pv_idx = value(space.pv_knob) if space.pv_knob in cols else np.zeros(rows, np.int64)
        extra["pv_intrinsic"] = option(space.pv_intrinsics, pv_idx, "", object)
        relayout = np.array(space.p_relayout or [[1]], dtype=np.int64)
        extra["p_relayout"] = relayout[np.clip(mma_idx, 0, len(relayout) - 1),
                                       np.clip(pv_idx, 0, relayout.shape[1] - 1)]
    else:
        k_scale = mma[:, 2] if space.pipeline == "TileAndFuse" else None
        tile_b = tile(space.workgroup, space.classes["b"], None)
        tile_m = tile(space.workgroup, space.classes["m"], None)
        tile_n = tile(space.workgroup, space.classes["n"], None)
        tile_k = tile(space.reduction, space.classes["k"], k_scale)
        if space.subgroup:
            # TileAndFuse states per-subgroup tiles; the innermost M/N loop counts in intrinsics.
            vec_m = _subgroup_tile(space.subgroup, space.classes["m"], mma[:, 0], value, rows)
            vec_n = _subgroup_tile(space.subgroup, space.classes["n"], mma[:, 1], value, rows)
            sub_m = np.maximum(tile_m // np.maximum(vec_m, 1), 1)
            sub_n = np.maximum(tile_n // np.maximum(vec_n, 1), 1)
        else:
            sub_m = value("sg_m_cnt") if "sg_m_cnt" in cols else np.ones(rows, dtype=np.int64)
            sub_n = value("sg_n_cnt") if "sg_n_cnt" in cols else np.ones(rows, dtype=np.int64)
            vec_m = tile_m // np.maximum(sub_m, 1)
            vec_n = tile_n // np.maximum(sub_n, 1)
        size_b = math.prod(bounds[i] for i in space.classes["b"])
        size_m = math.prod(bounds[i] for i in space.classes["m"])
        size_n = math.prod(bounds[i] for i in space.classes["n"])
        workgroups = (size_b // np.maximum(tile_b, 1)) * -(-size_m // tile_m) * -(-size_n // tile_n)
    threads = np.ones(rows, dtype=np.int64)
    for name in ("wg_size_x", "wg_size_y", "wg_size_z"):
        if name in cols:
            threads = threads * value(name)
    stages = (
        value("prefetch_num_stages") if "prefetch_num_stages" in cols
        else np.full(rows, space.fixed.get("prefetch_num_stages", 0), dtype=np.int64)
    )
    intrinsic = option(space.intrinsics, mma_idx, "", object)
    image = space.image_loops
    zeros = np.zeros(rows, dtype=np.int64)
    columns: dict[str, Any] = {
        "pipeline": np.full(rows, space.pipeline, dtype=object),
        "space": np.full(rows, space.index, dtype=np.int64),
        "tile_b": tile_b, "tile_m": tile_m, "tile_n": tile_n, "tile_k": tile_k,
        "vec_m": vec_m, "vec_n": vec_n,
        "workgroups": workgroups,
        "intrinsic": intrinsic, "mma_m": mma[:, 0], "mma_n": mma[:, 1], "mma_k": mma[:, 2],
        "operand_bits": option(space.operand_bits, mma_idx, 0, np.int64),
        "subgroups_m": sub_m, "subgroups_n": sub_n,
        "subgroup_size": value("sg_size") if "sg_size" in cols else np.zeros(rows, np.int64),
        "workgroup_threads": threads, "prefetch_stages": stages,
        "igemm": np.full(rows, int(space.igemm), dtype=np.int64),
        "tile_oh": tile(space.workgroup, image[:1], None) if len(image) == 2 else zeros,
        "tile_ow": tile(space.workgroup, image[1:], None) if len(image) == 2 else zeros,
    }
    columns.update(extra)
    for knob in space.knobs:
        columns[f"knob_{knob}"] = value(knob)
    return finish_table(columns, rows)


def _attention_tiles(
    space: GpuSpace, value: Any, rows: int
) -> tuple[tuple[np.ndarray, ...], dict[str, np.ndarray]]:
    """Tiles of an attention row in its Q x K^T GEMM view (M = m, N = K2, K = K1, as the features),
    and the value head dim columns outside that view (`tile_v`, `qk_recompute`).

    A workgroup owns `m_tile` query rows and `n_tile` value columns; each reduction step reads a
    K2 block of `red_k2` keys (the Q x K^T tile's N) against all of K1 (never tiled). Workgroups
    are counted over batch, M and the value head dim N, the loops IREE distributes.
    """
    bounds = space.loop_bounds

    def tile(entries: tuple[Entry, ...], loops: tuple[int, ...]) -> np.ndarray:
        out = np.ones(rows, dtype=np.int64)
        for loop in loops:
            size = value(entries[loop])
            out *= np.where(size == 0, bounds[loop], size)  # 0 = not tiled: the whole loop
        return out

    classes = space.classes
    tile_b = tile(space.workgroup, classes["b"])
    tile_m = tile(space.workgroup, classes["m"])
    tile_v = tile(space.workgroup, classes["n"])
    tile_n = tile(space.reduction, classes["k2"])
    tile_k = np.full(rows, math.prod(bounds[i] for i in classes["k1"]), dtype=np.int64)
    # Subgroups split M (and the value head dim N, `sg_n_cnt`, which IREE fixes to 1).
    # Counts are per loop of the op (IREE's basis for attention has one entry per loop).
    counts = space.subgroup_counts
    sub_m = value(counts[classes["m"][-1]] if counts else 1)
    sub_n = value(counts[classes["n"][-1]] if counts else 1)
    size = {c: math.prod(bounds[i] for i in classes[c]) for c in ("b", "m", "n")}
    # Workgroups that split the value head dim each compute the same Q x K^T block and its
    # softmax again: that work is done this many times over.
    qk_recompute = -(-size["n"] // np.maximum(tile_v, 1))
    workgroups = -(-size["b"] // tile_b) * -(-size["m"] // tile_m) * qk_recompute
    vec_m = tile_m // np.maximum(sub_m, 1)
    vec_n = tile_n // np.maximum(sub_n, 1)
    gemm_view = (tile_b, tile_m, tile_n, tile_k, vec_m, vec_n, sub_m, sub_n, workgroups)
    return gemm_view, {"tile_v": tile_v, "qk_recompute": qk_recompute}


def _subgroup_tile(
    entries: tuple[Entry, ...],
    loops: tuple[int, ...],
    intrinsic: np.ndarray,
    value: Any,
    rows: int,
) -> np.ndarray:
    """Elements of one subgroup's tile over a class of loops (TileAndFuse `subgroup` entries)."""
    out = np.ones(rows, dtype=np.int64)
    for position, loop in enumerate(loops):
        size = np.maximum(value(entries[loop]), 1)
        if position == len(loops) - 1:
            size = size * intrinsic  # the innermost loop is distributed in intrinsic tiles
        out *= size
    return out


WAVES_PER_EU = "waves_per_eu"
#: Rows of one constraint op and intrinsic from which `compilation_infos` uses a template.
_TEMPLATE_MIN_ROWS = 16
#: Knobs with at most this many values among the rows are fixed per template group.
_FIXED_MAX_VALUES = 3


def _with_waves_per_eu(info: Any, waves: int) -> Any:
    """The same compilation_info with `llvm_func_attrs = {"amdgpu-waves-per-eu" = "N"}` added."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    info = iree_codegen.CompilationInfoAttr(info)
    old = info.translation_info
    entries = {}
    if old.configuration is not None:
        config = ir.DictAttr(old.configuration)
        entries = {config[i].name: config[i].attr for i in range(len(config))}
    entries["llvm_func_attrs"] = ir.DictAttr.get(
        {"amdgpu-waves-per-eu": ir.StringAttr.get(str(waves))}
    )
    translation = iree_codegen.TranslationInfoAttr.get(
        old.pass_pipeline, old.codegen_spec, list(old.workgroup_size), old.subgroup_size,
        ir.DictAttr.get(entries),
    )
    return iree_codegen.CompilationInfoAttr.get(info.lowering_config, translation)


def materialize(op: Any, assignments: Mapping[str, int], batch_loops: Sequence[int] = ()) -> Any:
    """IREE's `compilation_info` for one knob assignment of a constraints op.

    Attention also needs a `decomposition_config` (the intrinsics and subgroup bases of its two
    matmuls), an attribute of the op beside `compilation_info`. So that a candidate stays one
    attribute (one string in tables, logs and specs), it rides inside the lowering_config
    dictionary under `decomposition_config`; `ir.spec` moves it back to the op's attribute.
    `batch_loops`: the space's `GpuSpace.batch_loops` (a batch tile of 1 is inserted there).
    """
    from iree.compiler.dialects import iree_codegen

    info = iree_codegen.materialize_compilation_info(op, dict(assignments))
    if batch_loops:
        info = with_batch_tiles(info, batch_loops)
    if DECOMPOSITION_KEY not in op.attributes["knobs"]:
        return info
    decomposition = iree_codegen.materialize_configuration_attr(
        op, DECOMPOSITION_KEY, dict(assignments))
    if batch_loops:
        decomposition = _decomposition_with_batch_loops(decomposition, batch_loops)
    return with_decomposition(info, decomposition)


def _decomposition_with_batch_loops(decomposition: Any, loops: Sequence[int]) -> Any:
    """An attention `decomposition_config` for the op with `loops` inserted: each matmul's
    subgroup basis (Q x K^T leaves out N, P x V leaves out K1; every inserted loop is in both)
    gets one subgroup along them."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_gpu

    parts = ir.DictAttr(decomposition)
    out = {parts[i].name: parts[i].attr for i in range(len(parts))}
    for name in ("qk_attrs", "pv_attrs"):
        attrs = ir.DictAttr(out[name])
        fields = {attrs[i].name: attrs[i].attr for i in range(len(attrs))}
        config = iree_gpu.LoweringConfigAttr(fields["lowering_config"]).attributes
        entries = {config[i].name: config[i].attr for i in range(len(config))}
        if "subgroup_basis" in entries:
            entries["subgroup_basis"] = _basis_with_loops(entries["subgroup_basis"], loops)
        fields["lowering_config"] = iree_gpu.LoweringConfigAttr.get(ir.DictAttr.get(entries))
        out[name] = ir.DictAttr.get(fields)
    return ir.DictAttr.get(out)


class GpuMaterializer:
    """Materialises `compilation_info` for GPU rows with IREE (keeps one parsed module)."""

    def __init__(self, module_text: str, spaces: Sequence[GpuSpace]) -> None:
        self.module_text = module_text
        self.knobs = {s.index: s.knobs for s in spaces}
        self.batch_loops = {s.index: s.batch_loops for s in spaces}
        # Loop bounds (and convolution loops) of the TileAndFuse spaces whose rows may need
        # `padding` (`_with_padding`): contractions and implicit-GEMM convolutions. Direct
        # convolutions are left as IREE's template has them (padding them broke candidates).
        self.padded = {s.index: (s.loop_bounds, s.conv_loops) for s in spaces
                       if s.pipeline == "TileAndFuse"
                       and (s.kind == "contraction" or (s.kind == "convolution" and s.conv_loops))}
        self._state: tuple[Any, Any, list[Any]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"module_text": self.module_text, "knobs": self.knobs,
                "batch_loops": self.batch_loops, "padded": self.padded, "_state": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Pickles from before batch loops or padding.
        self.__dict__.update({"batch_loops": {}, "padded": {}, **state})

    def _ops(self) -> tuple[Any, list[Any]]:
        from iree.compiler import ir

        if self._state is None:
            context = ir.Context()
            with context:
                module = ir.Module.parse(self.module_text)
            self._state = (context, module, _constraint_ops(module))
        return self._state[0], self._state[2]

    def compilation_info(self, row: pd.Series) -> str:
        return self.compilation_infos(row.to_frame().T)[0]

    def compilation_infos(self, rows: pd.DataFrame) -> list[str]:
        """`compilation_info` text of many rows (e.g. a whole ranked space), in their order.

        IREE's materialisation substitutes knob values into the constraint op's template, so the
        text of every row sharing a constraint op and an intrinsic is one format string: it is
        built once from distinctive sentinel values, checked against IREE's own text on three real
        rows of the group, and filled per row (about 100x faster than materialising each row).
        A group whose check fails, or with `waves_per_eu`, is materialised row by row.
        """
        context, ops = self._ops()
        spaces = rows["space"].to_numpy(dtype=np.int64)
        waves_column = f"knob_{WAVES_PER_EU}"
        waves = (rows[waves_column].to_numpy(dtype=np.int64) if waves_column in rows
                 else np.zeros(len(rows), dtype=np.int64))
        knobs = {name: rows[f"knob_{name}"].to_numpy(dtype=np.int64)
                 for names in self.knobs.values() for name in names if f"knob_{name}" in rows}
        # One-of knobs (`mma_idx`, `use_igemm_idx`, ...) pick whole attributes, and a scalar equal
        # to its default is not printed (`prefetch_num_stages = 0`): knobs of one-of kind or with
        # at most 3 values in these rows are fixed per group, the others are template fields.
        choices = sorted(k for k in knobs
                         if k.endswith("_idx") or len(np.unique(knobs[k])) <= _FIXED_MAX_VALUES)
        keys = np.stack([spaces, waves > 0, *(knobs[k] for k in choices)], axis=1)
        out = [""] * len(rows)
        with context:
            # One pass groups the rows (not a scan of every row per group).
            unique, group = np.unique(keys, axis=0, return_inverse=True)
            by_group = np.argsort(group.ravel(), kind="stable")
            bounds = np.searchsorted(group.ravel()[by_group], np.arange(len(unique) + 1))
            for index, key in enumerate(unique):
                members = by_group[bounds[index]:bounds[index + 1]]
                space, names = int(key[0]), self.knobs[int(key[0])]
                fixed = {k: int(v) for k, v in zip(choices, key[2:], strict=True) if k in names}
                values = [knobs[k][members] for k in names]
                # Small groups (single rows) are cheaper materialised than templated and checked.
                templated = not key[1] and len(members) >= _TEMPLATE_MIN_ROWS
                batch = self.batch_loops.get(space, ())
                template = self._template(ops[space], names, fixed, batch) if templated else None
                if template is not None:
                    texts = [template.format(*row) for row in zip(*(v.tolist() for v in values),
                                                                 strict=True)]
                    checked = (0, len(members) // 2, len(members) - 1)
                    if all(texts[e] == self._materialize(ops[space], names, values, e, 0, batch)
                           for e in checked):
                        for i, text in zip(members.tolist(), texts, strict=True):
                            out[i] = text
                        continue
                for j, i in enumerate(members.tolist()):
                    out[i] = self._materialize(ops[space], names, values, j, int(waves[i]),
                                               batch)
            if self.padded:
                mma_k = rows["mma_k"].to_numpy(dtype=np.int64)
                for i in np.flatnonzero(np.isin(spaces, list(self.padded))).tolist():
                    loop_bounds, conv_loops = self.padded[int(spaces[i])]
                    out[i] = _with_padding(out[i], loop_bounds, int(mma_k[i]), conv_loops)
        return out

    @staticmethod
    def _materialize(op: Any, names: Sequence[str], values: Sequence[np.ndarray], j: int,
                     waves: int, batch_loops: Sequence[int] = ()) -> str:
        info = materialize(op, {k: int(v[j]) for k, v in zip(names, values, strict=True)},
                           batch_loops)
        return str(_with_waves_per_eu(info, waves) if waves > 0 else info)

    @staticmethod
    def _template(op: Any, names: Sequence[str], fixed: Mapping[str, int],
                  batch_loops: Sequence[int] = ()) -> str | None:
        """A `str.format` template of one constraint op's text (knobs in `names` order; the
        one-of knobs in `fixed` given), or None."""
        sentinels = [fixed.get(k, 7_300_001 + 2 * n) for n, k in enumerate(names)]
        try:
            text = str(materialize(op, dict(zip(names, sentinels, strict=True)), batch_loops))
        except Exception:  # IREE refusing the sentinels: materialise row by row
            return None
        text = text.replace("{", "{{").replace("}", "}}")
        for n, (k, sentinel) in enumerate(zip(names, sentinels, strict=True)):
            if k in fixed:
                continue  # chosen by the group: already spelled out in the text
            text = re.sub(rf"(?<![0-9]){sentinel}(?![0-9])", f"{{{n}}}", text)
        return text


def _with_padding(info: str, bounds: Sequence[int], mma_k: int,
                  conv_loops: Sequence[int] = ()) -> str:
    """A TileAndFuse `compilation_info` with IREE's `padding` when a loop is not a multiple of
    its tile, else unchanged.

    IREE's own TileAndFuse configs of unaligned problems pad every loop to its tile (workgroup
    tile; reduction tile in elements, counted in intrinsic K units by the config), and for an
    implicit-GEMM convolution also state `padding_conv` over the convolution's own loops (the
    tile of the implicit-GEMM loop a parallel loop maps to, 0 for reduction loops:
    `conv_loops`). Its knob template leaves both out, and without them every such candidate
    fails to compile (77 x 131 x 999 f16 -> f32: "write affecting operations on shared resources are
    restricted to lane or thread"; a stride-2 3x3 convolution to 28 x 28: "'tensor.expand_shape'
    op expected dimension ..."). Aligned problems keep IREE's own text (no `padding`)."""
    from iree.compiler import ir

    found = re.search(r"\bworkgroup = \[([^\]]*)\]", info)
    reduced = re.search(r"\breduction = \[([^\]]*)\]", info)
    if found is None or reduced is None:
        return info
    workgroup = [int(v) for v in found.group(1).split(",")]
    reduction = [int(v) for v in reduced.group(1).split(",")]
    if len(workgroup) != len(bounds) or len(reduction) != len(bounds):
        return info
    padding = [w or r * mma_k for w, r in zip(workgroup, reduction, strict=True)]
    if all(p == 0 or b % p == 0 for p, b in zip(padding, bounds, strict=True)):
        return info
    entries = f"padding = {padding}, "
    if conv_loops:
        entries += f"padding_conv = {[padding[i] if i >= 0 else 0 for i in conv_loops]}, "
    text = info.replace("lowering_config<{", f"lowering_config<{{{entries}", 1)
    return str(ir.Attribute.parse(text))  # in IREE's own key order, as applied configs print


def enumerate_gpu(
    problem: Problem,
    target: Target,
    pipeline: str | None = None,
    limit: int | None = None,
    extra_knobs: Mapping[str, Sequence[int]] | None = None,
    heuristic_filters: bool = True,
) -> CandidateSet:
    """Candidates of every (or one) GPU pipeline, in IREE's constraint-op order.

    `heuristic_filters=False`: the whole valid space, without IREE's heuristic filters.
    """
    if pipeline is not None and pipeline not in GPU_PIPELINES:
        raise DispatchTuneError(
            f"unknown GPU pipeline {pipeline!r}; choose one of {', '.join(GPU_PIPELINES)}"
        )
    spaces = gpu_spaces(problem, target, heuristic_filters)
    chosen = [s for s in spaces if pipeline is None or s.pipeline == pipeline]
    if not chosen:
        raise DispatchTuneError(f"IREE emits no {pipeline} constraints for this problem")
    materializer = GpuMaterializer(constraints_module(constraint_source(problem, target)[0], target),
                                   spaces)
    tables: list[pd.DataFrame] = []
    remaining = limit
    for space in chosen:
        if remaining is not None and remaining <= 0 and tables:  # limit=0: one empty table
            break
        table = enumerate_space(space, remaining)
        if extra_knobs:
            table = _cross_extra(table, space, extra_knobs)
            if remaining is not None:
                table = table.iloc[:remaining]
        tables.append(table)
        if remaining is not None:
            remaining -= len(table)
    sets = [
        CandidateSet(problem, target, t, {s.pipeline: materializer for s in chosen}) for t in tables
    ]
    result = CandidateSet.concat(sets)
    if not len(result) and limit != 0:
        # Said here, once for rank, candidates and tune: an empty table would read as "0
        # candidates" and a tuning run would have nothing to try.
        raise UnsupportedProblem(
            f"IREE's {'/'.join(s.pipeline for s in chosen)} constraints admit no configuration of "
            f"{problem.describe()} on {target.name}: nothing to tune (IREE's default config stays)"
        )
    # The columns depend on the chosen pipelines only, not on where `limit` cut the rows.
    table = result.table
    for space in chosen:
        for knob in space.knobs:
            if f"knob_{knob}" not in table.columns:
                table[f"knob_{knob}"] = np.full(len(table), -1, dtype=np.int64)
    table["default_match"] = default_match(table, iree_default_columns(problem, target))
    result.table = table
    return result


#: The knobs `default_match` compares with IREE's own configuration (docs/gpu_order.md, part 24:
#: expert configurations keep IREE's value of each more often than the space does).
DEFAULT_KNOBS = ("tile_m", "tile_n", "tile_k", "workgroup_threads", "subgroups_m", "subgroups_n",
                 "intrinsic", "pipeline")


def iree_default_columns(problem: Problem, target: Target) -> dict[str, object] | None:
    """IREE's own configuration of `problem` on `target` in the candidate-table vocabulary, read
    from the configured module its constraints come with (no extra compile); None where the
    constraints are another op's (a batch matmul's batch-less equivalent, raised small loops) or
    the configuration cannot be read (no MMA intrinsic, an attention IREE configures collapsed)."""
    from dispatchtune.candidate import configured_compilation_infos
    from dispatchtune.datasets.expert_specs import configuration_columns

    try:
        source, left_out = constraint_source(problem, target)
        if source.key != problem.key or left_out:
            return None
        infos = configured_compilation_infos(constraints_module(problem, target))
        return dict(configuration_columns(infos[0], problem)) if infos and infos[0] else None
    except (DispatchTuneError, ValueError, IndexError, KeyError) as exc:
        logger.debug("IREE's default configuration of %s is not read: %s", problem.key, exc)
        return None


def default_match(table: pd.DataFrame, default: Mapping[str, object] | None) -> np.ndarray:
    """Per row of a GPU candidate table, how many of `DEFAULT_KNOBS` equal IREE's own
    configuration `default` (0-8), or -1 throughout when it is unknown or has no intrinsic."""
    if not default or not default.get("intrinsic"):
        return np.full(len(table), -1, dtype=np.int64)
    match = np.zeros(len(table), dtype=np.int64)
    for knob in DEFAULT_KNOBS:
        if knob in table and knob in default:
            column = table[knob].to_numpy()
            value = default[knob]
            match += (column.astype(str) == str(value)) if column.dtype == object else (
                column == value)
    return match


def _cross_extra(
    table: pd.DataFrame, space: GpuSpace, extra: Mapping[str, Sequence[int]]
) -> pd.DataFrame:
    """Replace knobs IREE fixes (e.g. prefetch_num_stages) by explicit extra dimensions.

    `waves_per_eu` (AMD only) is not an IREE knob: it becomes the LLVM function attribute
    `amdgpu-waves-per-eu` in the translation_info configuration (0 = compiler default).
    """
    for knob, values in extra.items():
        if knob == WAVES_PER_EU:
            amd = any(i.startswith(("MFMA", "WMMA")) for i in space.intrinsics)
            if not amd:
                raise DispatchTuneError("waves_per_eu applies to AMD targets only")
        elif knob not in space.knobs:
            raise DispatchTuneError(f"{space.pipeline} has no knob {knob!r} to vary")
        if not values or any(int(v) < 0 for v in values):
            raise DispatchTuneError(f"extra knob {knob!r} needs non-negative values")
        parts = []
        for v in values:
            part = table.copy()
            part[f"knob_{knob}"] = int(v)
            if knob == "prefetch_num_stages":
                part["prefetch_stages"] = int(v)
            if knob == WAVES_PER_EU:
                part["waves_per_eu"] = int(v)
            parts.append(part)
        # Row-major: each configuration with every extra value in turn (stable, deterministic).
        order = np.arange(len(table) * len(parts)).reshape(len(parts), len(table)).T.ravel()
        table = pd.concat(parts, ignore_index=True).iloc[order].reset_index(drop=True)
    return table
