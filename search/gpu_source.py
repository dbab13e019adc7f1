"""The op IREE's GPU constraints come from, and the configured module that carries them.

`constraints_module` compiles an op with `--iree-codegen-emit-pipeline-constraints` (cached per
op and target); `constraint_source` says which op to ask. IREE 3.13 crashes (SIGSEGV) emitting
constraints for contractions with batch loops (a `batch_matmul` on any GPU target) and for
grouped convolutions (a group loop in input, filter and output: the `depth` class). For those
the constraints come from the same op without those loops (`without_loops`), and every candidate
gets a tile of 1 there, the tile IREE's own default batch configuration uses. Contractions with
an M, N or K below every intrinsic, for which IREE emits none, take the constraints of the op
with those loops raised (`with_small_loops_raised`), pinned back to the op's sizes. Loops IREE
collapses when it compiles the op alone but a model's dispatch keeps (an attention's batch x
heads or query groups x sequence, a contraction's image: `collapsed_loops`) get the same
treatment, so that every configuration names every loop of the op it is applied to.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import re
from collections.abc import Sequence

from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem
from dispatchtune.targets import Target, intrinsic_operand_types, intrinsic_shape
from dispatchtune.toolchain import compiler_failure, iree_compiler_version, run_tool

logger = logging.getLogger(__name__)


#: The op IREE attaches per candidate pipeline (and lowering) when it emits constraints.
CONSTRAINTS_OP = "iree_codegen.smt.constraints"


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
    outer = collapsed_loops(problem, target)
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
            raise no_constraints(
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


def _intrinsic_shapes(target: Target, element_types: Sequence[str]) -> list[tuple[int, int, int]]:
    """M, N and K of the target's MMA intrinsics whose operand types are all among
    `element_types`."""
    wanted = {t.lower() for t in element_types}
    shapes = []
    for name in target.gpu_facts().mma_intrinsics:
        shape, types = intrinsic_shape(name), intrinsic_operand_types(name)
        if shape and types and set(types) <= wanted:
            shapes.append(shape)
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


def _map_results(text: str) -> list[str]:
    """The result expressions of an affine map's text, e.g. ["d0", "d1 * 2 + d4"]."""
    results = text.split("->", 1)[1].strip().strip("()")
    return [e.strip() for e in results.split(",")] if results.strip() else []


def collapsed_loops(problem: Problem, target: Target) -> tuple[int, ...]:
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


def no_constraints(problem: Problem, target: Target, why: str) -> DispatchTuneError:
    """The error of an op IREE emits no constraints for on `target`, and `why`."""
    return DispatchTuneError(
        f"IREE emits no GPU constraints for {problem.describe()} on {target.name} ({why})")


def why_no_constraints(problem: Problem, target: Target, source: Problem | None = None,
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
