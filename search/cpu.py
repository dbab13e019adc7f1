"""CPU (llvm-cpu) search spaces: our own Z3 model, solved by the same columnar engine as GPU.

IREE emits no SMT constraints for llvm-cpu, and its CPU pipelines accept almost anything (tiles
that do not divide, vectors larger than the distribution tile, ... compile and run, 5-8x slower;
see docs/search_space.md). The model therefore defines the *sane* space: configurations that
compile and that a tuner could plausibly want, slow ones included so a cost model learns them.

Knobs (the lists of `#iree_cpu.lowering_config`, one entry per loop of the op):
- DoubleTilingExpert (contractions: matmul, transposed operands, batch matmul):
  distribution [b, m, n, 0], vector_common_parallel [1, m, n, 0], vector_reduction [0, 0, 0, k];
  with several loops of a class (1x1 convolutions: 2-3 M loops) every loop has its own tiles.
- ConvTileAndDecomposeExpert (2-D NHWC/HWCF convolutions, loops n, oh, ow, oc, kh, kw, ic):
  distribution [n, oh, ow, oc, 0, 0, 0], vector_common_parallel [1, 1, ow, oc, 0, 0, 0],
  vector_reduction [0, 0, 0, 0, 1, 1, ic]; also NCHW/FCHW and depthwise NHWC/HWC. IREE lowers
  every other convolution layout with DoubleTilingExpert and the same kind of lists
  (`DECOMPOSED_LAYOUTS`), so the space does too.

Constraints, with the reason for each (W = native vector bytes, R = vector registers, A = bytes
of an accumulator element, from `Target.cpu_facts()` and the problem):
- C1 every distribution tile divides its loop: partial tiles take a peeled, masked path (a
  distribution of 100 on 512 ran 7x slower than 64).
- C2 every vector tile divides its distribution tile, so the vector loop has no remainder (a
  vector tile larger than the distribution tile ran 8x slower).
- C3 the reduction tile divides the reduction loop (same reason as C1).
- C4 the vectorised op is under IREE's size limit of 512 native vectors: vec_m * vec_n * red_k * A
  < 512 * W; IREE's LLVMCPU vector-size verifier rejects larger ones ("large vector sizes (32768
  bytes)" with AVX-512, 16384 with AVX2; measured: on AVX-512 8128 f32 elements compile, 8192
  fail; on AVX2 4064 compile, 4096 fail; `CpuFacts.max_vector_bytes`).
- C5 the innermost (contiguous) vector dimension fills whole native vectors: vec_n * A is a
  multiple of W, unless vec_n is the whole N loop (narrow problems). When N * A itself is not a
  multiple of W, vectors of W/2, W/4, ... (at least 16 bytes) are allowed too; otherwise a
  2520-wide problem would have no candidate at all on AVX-512.
- C6 the accumulator tile fits the register file: vec_m * vec_n * A <= R * W; larger tiles
  spill every reduction step.
- C7 enough workgroups for every core: B/tile_b * M/tile_m * N/tile_n >= cores (one workgroup
  leaves the other cores idle; measured 2.6 vs 1.5 ms on 2 cores). A problem too small to give
  every core a workgroup under C1-C6 (a classifier's 1x10 output) asks for as many as it can
  have: the count is halved until the space is not empty (IREE's own default for such a problem
  is one workgroup).
- Partial tiles, only where the space is otherwise empty: a contraction loop whose size is not a
  multiple of the native vector (a language model's vocabulary, N = 50257 = 29 x 1733) may have
  no divisor that C2, C5 and C6 accept. Its distribution tile may then also be a power of two
  below the size, the last tile partial, as IREE's own default does (distribution 64 on N =
  50257 and on N = 30522); C2-C7 hold as before (C7 counts whole tiles). The same for a regular,
  depthwise or grouped convolution's output width and channel loops (an audio front end's 799
  outputs; a 1-D depthwise conv with a channel multiplier over 994).
- 1-D convolutions (NWC/WCF, depthwise NWC/WC) under DoubleTilingExpert, IREE 3.13's own choice:
  the 2-D conv's knobs and constraints less the output height (C4 measured for them too). 3-D
  convolutions (video and volume models) likewise, plus a distribution tile of the output depth;
  several batch loops (a Conv3d whose unit filter loops IREE folds away) get one tile each.
- Conv: the output-height vector tile and the filter-window reduction tiles are 1, because
  ConvTileAndDecomposeExpert only decomposes the 2-D conv into 1-D convs under those tiles (IREE's
  own configs always use them).

- LinalgExtTileAndVectorize (attention, as online_attention): distribution/vector tiles on the
  innermost M loop and N, a K2 reduction tile; C4 holds for both Q x K^T and P x V. NCHW convs use
  the conv knobs with C5 on the output width; depthwise convs put the channel knobs on the depth
  loop (docs/search_space.md has the measurements).
- DoubleTilingExpert also for grouped convolutions (IREE 3.13's own choice): distribution on every
  parallel loop, vectors on output width and output channels, reduction tiles on the input
  channels and the filter width; no C4 (IREE leaves the op scalar, so its vector limit never
  applies).

Unit-batch convolutions reach the spec matcher batch-less; llvm-cpu codegen re-expands them with a
unit batch loop (`configured_problem`), so their lists have one entry more than the problem's
loops and the spec configures the re-expanded op (`ir.spec`); grouped ones too. Pooling raises
`UnsupportedProblem` before anything compiles.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from dispatchtune.errors import DispatchTuneError, UnsupportedProblem
from dispatchtune.problem import Problem, element_bytes
from dispatchtune.search.engine import ConstraintSystem
from dispatchtune.search.space import CPU_PIPELINES, CandidateSet, finish_table
from dispatchtune.targets import CpuFacts, Target

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuModel:
    """The Z3 model of one problem's CPU space: assertions, variables, and how to read them."""

    pipeline: str
    assertions: tuple[Any, ...]
    variables: tuple[str, ...]  # enumerated knob variables, in column order
    reasons: tuple[str, ...]  # one reason per assertion (same order)
    # per loop of the op: (distribution, vector_common_parallel, vector_reduction) entries,
    # each a variable name or a literal
    loops: tuple[tuple[int | str, int | str, int | str], ...]


def _divisible(z3: Any, size: int, var: Any) -> Any:
    return z3.And(var >= 1, var <= size, size % var == 0)


def _distribution_tile(
    z3: Any, size: int, tile: Any, label: str, partial: bool, acc: int, width: int
) -> tuple[Any, str]:
    """C1 on one loop (and its reason): the tile divides the loop or, with `partial` and a loop
    that is not a whole number of native vectors (`acc`-byte elements, `width`-byte vectors),
    is also a power of two below it, the last tile partial (the module docstring's "Partial
    tiles")."""
    if not partial or (size * acc) % width == 0:
        return _divisible(z3, size, tile), f"C1 distribution tile divides {label}"
    # The bounds stand outside the disjunction: the engine reads bounds from top-level conjuncts.
    choice = z3.Or(size % tile == 0, *(tile == p for p in _powers_of_two(size)))
    return (z3.And(tile >= 1, tile <= size, choice),
            f"C1 distribution tile divides {label} or is a power of two (partial)")


def _powers_of_two(size: int) -> list[int]:
    """Powers of two from 2 up to, not including, `size`."""
    return [1 << e for e in range(1, max(size - 1, 1).bit_length()) if 1 << e < size]


def _native_width(z3: Any, vec: Any, size: int, acc: int, width: int) -> Any:
    """C5: whole native vectors; fractions of one only when the dimension forces them."""
    if (size * acc) % width == 0:
        return z3.Or((vec * acc) % width == 0, vec == size)
    # N is not a multiple of the native width: half/quarter vectors (at least 16 bytes, the
    # narrowest SIMD register) or the whole dimension are the sane choices.
    return z3.Or(
        (vec * acc) % width == 0,
        z3.And(vec * acc >= min(16, width), width % (vec * acc) == 0),
        vec == size,
    )


def cpu_model(
    problem: Problem, facts: CpuFacts, workgroups: int | None = None, partial_tiles: bool = False
) -> CpuModel:
    """Build the Z3 model (see the module docstring for the constraints and their reasons).

    `workgroups` is C7's minimum (default: one per core); `partial_tiles` admits power-of-two
    distribution tiles on contraction loops, and on a convolution's output width and channel
    loops, that are not a multiple of the native vector.
    """
    import z3

    acc = max(int(element_bytes(problem.output_type)), 1)
    width, registers = facts.native_vector_bytes, facts.vector_registers
    cores = facts.cores if workgroups is None else workgroups
    max_vector = facts.max_vector_bytes
    asserts: list[tuple[Any, str]] = []

    def add(expr: Any, reason: str) -> None:
        asserts.append((expr, reason))

    configured = configured_problem(problem)
    if problem.kind == "contraction":
        pipeline = "DoubleTilingExpert"
        loop_of, variables = _contraction(
            z3, problem, add, acc, width, registers, cores, max_vector, partial_tiles
        )
    elif problem.kind == "convolution" and _grouped(problem):
        # IREE 3.13 lowers grouped convolutions with DoubleTilingExpert, not the conv pipeline.
        pipeline = "DoubleTilingExpert"
        loop_of, variables = _grouped_convolution(
            z3, configured, add, acc, width, registers, cores, partial_tiles
        )
    elif problem.kind == "convolution":
        pipeline = ("ConvTileAndDecomposeExpert" if operand_layout(configured) in DECOMPOSED_LAYOUTS
                    else "DoubleTilingExpert")
        loop_of, variables = _convolution(
            z3, configured, add, acc, width, registers, cores, max_vector, partial_tiles
        )
    else:
        pipeline = "LinalgExtTileAndVectorize"
        loop_of, variables = _attention(z3, problem, add, acc, width, registers, cores, max_vector)
    loops = tuple(loop_of[i] for i in range(len(configured.loop_sizes)))

    return CpuModel(
        pipeline=pipeline,
        assertions=tuple(a for a, _ in asserts),
        variables=variables,
        reasons=tuple(r for _, r in asserts),
        loops=loops,
    )


Loop = tuple[int | str, int | str, int | str]

_B, _I, _C, _F, _K, _D = ("batch", "output_image", "input_channel", "output_channel",
                          "filter_loop", "depth")
#: The convolution layouts (input, filter, output; an image dimension reads an output image loop
#: and a filter loop) IREE 3.13 llvm-cpu lowers with its conv pipeline, ConvTileAndDecomposeExpert:
#: 2-D NHWC/HWCF, NCHW/FCHW and depthwise NHWC/HWC with one batch loop. It lowers every other
#: convolution with DoubleTilingExpert (1-D and 3-D ones, NHWC/FHWC, depthwise NCHW/CHW as PyTorch
#: exports it, a batch loop that is not the outermost, several batch loops): measured by
#: tests/test_cpu_conv3d.py::test_the_pipeline_is_iree_own_for_each_conv_layout.
DECOMPOSED_LAYOUTS = frozenset({
    ((_B, _I, _I, _C), (_K, _K, _C, _F), (_B, _I, _I, _F)),
    ((_B, _C, _I, _I), (_F, _C, _K, _K), (_B, _F, _I, _I)),
    ((_B, _I, _I, _D), (_K, _K, _D), (_B, _I, _I, _D)),
})


def operand_layout(problem: Problem) -> tuple[tuple[str, ...], ...]:
    """Per operand, the loop class each of its dimensions reads (`Problem.dims` names; an image
    dimension, which reads an output image loop and a filter loop, is `output_image`)."""
    class_of = {loop: name for name, loops in problem.dims.items() for loop in loops}
    layout = []
    for text in problem.indexing_maps:
        results = text.split("->")[1].strip(" ()").split(",")
        dims = []
        for expression in results:
            classes = {class_of.get(int(d), "") for d in re.findall(r"\bd(\d+)\b", expression)}
            dims.append(_I if _I in classes else classes.pop() if len(classes) == 1 else "")
        layout.append(tuple(dims))
    return tuple(layout)


def configured_problem(problem: Problem) -> Problem:
    """The op llvm-cpu codegen configures: a batch-less convolution gets its unit batch loop back
    (`Problem.with_unit_batch`), so its configuration lists have one entry more than the problem."""
    return problem.with_unit_batch() if problem.unit_batch_conv else problem


def _knob_names(problem: Problem, cls: str, prefix: str) -> list[str]:
    """One knob per loop of a class: the innermost loop takes the plain name (`dist_m`), outer
    loops an index (`dist_m0`, `dist_m1`, ...), so one-loop problems keep their historic names."""
    count = len(problem.loops(cls))
    return [f"{prefix}{j}" for j in range(count - 1)] + [prefix]


def _product(z3: Any, names: Sequence[str]) -> Any:
    result: Any = 1
    for name in names:
        result = result * z3.Int(name)
    return result


def _contraction(
    z3: Any, problem: Problem, add: Any, acc: int, width: int, registers: int, cores: int,
    max_vector: int, partial_tiles: bool = False,
) -> tuple[dict[int, Loop], tuple[str, ...]]:
    """Contractions with any number of batch, M, N and K loops (ResNet's 1x1 convolutions arrive
    with 2-3 M loops, broadcast batch matmuls with several batch loops).

    Every loop gets its own tiles (batch: distribution; M, N: distribution and vector; K:
    reduction), so C1-C3 hold per loop and C4, C6 and C7 on the products; C5 applies to the loop
    that is contiguous in the output (an M loop when the output is transposed, as in NCHW 1x1
    convolutions). With one loop per class this is exactly the historic matmul model.
    """
    if not problem.loops("k"):
        raise UnsupportedProblem("CPU search supports contractions with a K loop")
    if not (problem.loops("m") or problem.loops("n")):
        raise UnsupportedProblem("CPU search supports contractions with an M or N loop")
    dist = {c: _knob_names(problem, c, f"dist_{c[0]}") for c in ("batch", "m", "n")}
    if not problem.loops("batch"):
        dist["batch"] = ["dist_b"]  # a unit batch, as the historic model
    vec = {c: _knob_names(problem, c, f"vec_{c}") for c in ("m", "n")}
    red = _knob_names(problem, "k", "red_k")
    Int = z3.Int
    for cls, label in (("batch", "B"), ("m", "M"), ("n", "N")):
        sizes = problem.sizes(cls) or (1,)
        for j, (name, size) in enumerate(zip(dist[cls], sizes, strict=True)):
            suffix = "" if j == len(sizes) - 1 else str(j)
            tile = Int(name)
            partial = partial_tiles and cls != "batch"
            add(*_distribution_tile(z3, size, tile, f"{label}{suffix}", partial, acc, width))
    for cls in ("m", "n"):
        for d, v in zip(dist[cls], vec[cls], strict=True):
            add(z3.And(Int(v) >= 1, Int(d) % Int(v) == 0), f"C2 {v} divides {d}")
    for j, (name, size) in enumerate(zip(red, problem.sizes("k"), strict=True)):
        suffix = "" if j == len(red) - 1 else str(j)
        add(_divisible(z3, size, Int(name)), f"C3 reduction tile divides K{suffix}")
    vec_all = vec["m"] + vec["n"]
    add(_product(z3, vec_all + red) * acc < max_vector, "C4 vector op under IREE's size limit")
    (out_last,) = _last_output_loop(problem)
    for cls in ("m", "n"):
        if out_last in problem.loops(cls):
            v = vec[cls][problem.loops(cls).index(out_last)]
            size = problem.loop_sizes[out_last]
            add(_native_width(z3, Int(v), size, acc, width), f"C5 {v} fills native vectors")
    add(_product(z3, vec_all) * acc <= registers * width, "C6 accumulator tile fits the registers")
    b, m, n, _ = problem.gemm_shape
    add(
        _product(z3, dist["batch"] + dist["m"] + dist["n"]) * cores <= b * m * n,
        "C7 at least one workgroup per core",
    )
    loop_of: dict[int, Loop] = {}
    for i, name in zip(problem.loops("batch"), dist["batch"], strict=False):
        loop_of[i] = (name, 1, 0)
    for cls in ("m", "n"):
        # A matrix-vector product has no M (or N) loop: its knobs stay at a unit tile, listed
        # nowhere, as the batch knob of a problem without batch loops.
        for i, d, v in zip(problem.loops(cls), dist[cls], vec[cls], strict=False):
            loop_of[i] = (d, v, 0)
    for i, name in zip(problem.loops("k"), red, strict=True):
        loop_of[i] = (0, 0, name)
    variables = (*dist["batch"], *dist["m"], *dist["n"], *vec["m"], *vec["n"], *red)
    return loop_of, variables


def _convolution(
    z3: Any, problem: Problem, add: Any, acc: int, width: int, registers: int, cores: int,
    max_vector: int, partial_tiles: bool = False,
) -> tuple[dict[int, Loop], tuple[str, ...]]:
    """1-D, 2-D and 3-D convolutions in any layout (NHWC/HWCF, NCHW/FCHW, NWC/WCF, NCDHW/FCDHW,
    NDHWC/DHWCF), depthwise ones and ones with a single input channel (folded away by IREE).

    The channel loop is the output channel, or the depth (group) loop of a depthwise conv; C5
    applies to whichever output loop is contiguous (channels in NHWC, output width in NCHW). A
    1-D convolution has the same knobs less the output height (IREE 3.13 lowers it with
    DoubleTilingExpert; C4 measured as for 2-D: 8192 f32 elements of vec_ow x vec_oc x red_ic
    fail on AVX-512, 6144 compile); a 3-D one (a video or volume model's) the same plus a
    distribution tile of the output depth (DoubleTilingExpert too), its outer image loops'
    vector tiles and outer filter loops' reduction tiles 1, as IREE's own 3-D configs have them.
    """
    shape = {c: len(problem.loops(c)) for c in problem.dims}
    depthwise = shape.get("depth", 0) == 1 and not shape.get("output_channel") and not shape.get(
        "input_channel"
    )
    regular = shape.get("depth", 0) == 0 and shape.get("output_channel") == 1 and shape.get(
        "input_channel", 0) in (0, 1)
    # One input channel (a waveform's or a grayscale image's first conv), folded away by IREE:
    # codegen configures the op as it is, without re-expanding a unit batch around it.
    single_input_channel = regular and not shape.get("input_channel")
    images = shape.get("output_image", 0)
    loops = ", ".join(f"{n} {c}" for c, n in shape.items() if n)
    # Without a batch loop only when IREE configures the op batch-less (see above); other
    # batch-less convs have their unit batch back here (`configured_problem`).
    batch_ok = bool(shape.get("batch")) or single_input_channel
    if not batch_ok or images not in (1, 2, 3) or shape.get("filter_loop") != images:
        raise UnsupportedProblem(
            "CPU search supports 1-D, 2-D and 3-D convolutions with batch loops and input "
            f"channels (or depthwise); this one has {loops} loop(s)"
        )
    if problem.is_pooling:  # refused before this by `enumerate_candidates`, for every target
        raise UnsupportedProblem(
            "CPU search supports convolutions, not pooling (no channel loops to tile)"
        )
    if not (regular or depthwise):
        raise UnsupportedProblem(
            f"CPU search supports regular, depthwise and grouped convolutions; this one has {loops} "
            "loop(s)"
        )
    channel_class = "depth" if depthwise else "output_channel"
    nb = problem.size("batch")  # 1 without batch loops
    od, oh, ow = (1, 1, *problem.sizes("output_image"))[-3:]
    oc = problem.size(channel_class)
    kw = problem.sizes("filter_loop")[-1]
    ic = problem.size("input_channel")
    # Several batch loops (a (1, 3, 3) 3-D conv whose unit filter depth IREE folds away keeps the
    # output depth as a second batch loop) get a distribution tile each.
    batch_knobs = _knob_names(problem, "batch", "dist_n") if problem.loops("batch") else []
    dod, doh, dow, doc, vow, voc, ric, rkw = z3.Ints(
        "dist_od dist_oh dist_ow dist_oc vec_ow vec_oc red_ic red_kw"
    )
    dnb = _product(z3, batch_knobs)
    tiled: tuple[tuple[int, Any, str], ...] = (
        *((size, z3.Int(name), "N" + name[len("dist_n"):])
          for size, name in zip(problem.sizes("batch"), batch_knobs, strict=True)),
        (od, dod, "OD"), (oh, doh, "OH"), (ow, dow, "OW"), (oc, doc, "OC"),
    )
    # Image loops the conv lacks (output depth below 3-D, height below 2-D) count as one below.
    absent = {"OD"} if images == 2 else {"OD", "OH"} if images == 1 else set()
    tiled = tuple(t for t in tiled if t[2] not in absent)
    dod = 1 if "OD" in absent else dod
    doh = 1 if "OH" in absent else doh
    for size, var, name in tiled:
        partial = partial_tiles and name in ("OW", "OC")
        add(*_distribution_tile(z3, size, var, name, partial, acc, width))
    add(z3.And(vow >= 1, dow % vow == 0), "C2 vec_ow divides dist_ow")
    add(z3.And(voc >= 1, doc % voc == 0), "C2 vec_oc divides dist_oc")
    no_input_channel = depthwise or single_input_channel
    if no_input_channel:
        # IREE's own depthwise configs reduce the whole filter row at once; 1 compiles too.
        add(z3.And(rkw >= 1, rkw <= kw, z3.Or(rkw == 1, rkw == kw)), "conv KW tile is 1 or KW")
        add(ric == 1, "conv has no input-channel loop")
        reduction = rkw
    else:
        add(_divisible(z3, ic, ric), "C3 reduction tile divides IC")
        reduction = ric
    add(vow * voc * reduction * acc < max_vector, "C4 vector op under IREE's size limit")
    (out_last,) = _last_output_loop(problem)
    if out_last in problem.loops(channel_class):
        add(_native_width(z3, voc, oc, acc, width), "C5 vec_oc fills native vectors")
    else:
        add(_native_width(z3, vow, ow, acc, width), "C5 vec_ow fills native vectors")
    add(vow * voc * acc <= registers * width, "C6 accumulator tile fits the registers")
    add(dnb * dod * doh * dow * doc * cores <= nb * od * oh * ow * oc,
        "C7 at least one workgroup per core")
    outer_images = ("dist_od", "dist_oh")[3 - images:]  # the image loops outside the width
    variables: tuple[str, ...] = (
        *batch_knobs, *outer_images, "dist_ow", "dist_oc", "vec_ow", "vec_oc", "red_ic"
    )
    variables += ("red_kw",) if no_input_channel else ()
    low = problem.loops("output_image")[-1]
    (loc,) = problem.loops(channel_class)
    lkw = problem.loops("filter_loop")[-1]
    loop_of: dict[int, Loop] = {
        i: (name, 1, 0) for i, name in zip(problem.loops("batch"), batch_knobs, strict=True)
    }
    loop_of |= {
        low: ("dist_ow", "vec_ow", 0), loc: ("dist_oc", "vec_oc", 0),
        lkw: (0, 0, "red_kw" if no_input_channel else 1),
    }
    loop_of |= {i: (name, 1, 0)
                for i, name in zip(problem.loops("output_image")[:-1], outer_images, strict=True)}
    loop_of |= {i: (0, 0, 1) for i in problem.loops("filter_loop")[:-1]}
    loop_of |= {i: (0, 0, "red_ic") for i in problem.loops("input_channel")}
    return loop_of, variables


def _grouped(problem: Problem) -> bool:
    """A grouped convolution: one group (depth) loop and both channel loops, or the output
    channel loop alone (one input channel per group, folded away by IREE: a depthwise
    convolution with a channel multiplier)."""
    return (all(len(problem.loops(c)) == 1 for c in ("depth", "output_channel"))
            and len(problem.loops("input_channel")) <= 1)


def _grouped_convolution(
    z3: Any, problem: Problem, add: Any, acc: int, width: int, registers: int, cores: int,
    partial_tiles: bool = False,
) -> tuple[dict[int, Loop], tuple[str, ...]]:
    """1-D and 2-D grouped convolutions (NHWGC/GFHWC, NGCHW/GFCHW, NGCW/GFCW: wav2vec2's
    positional convolution) under DoubleTilingExpert.

    Every parallel loop is distributed (batch, group, output image, output channels per group);
    the output width and the output channels per group take vector tiles (group, batch and output
    height vectors are 1, as IREE's own configs); the input channels per group are the reduction
    tile and the filter width reduces 1 or KW at a time (filter height 1). IREE 3.13 leaves the
    op a scalar `linalg.generic` after vectorisation (its maps are not projected permutations),
    so IREE's vector-size limit (C4) never fires: 14x32x32 f32 vectors (57,344 bytes) compile.
    """
    shape = [len(problem.loops(c)) for c in ("batch", "output_image", "filter_loop")]
    if shape not in ([1, 2, 2], [1, 1, 1]):
        raise UnsupportedProblem(
            "CPU search supports 1-D and 2-D grouped convolutions with one batch loop (not 3-D)"
        )
    two_d = shape[1] == 2
    nb, groups = problem.size("batch"), problem.size("depth")
    oh, ow = (1, *problem.sizes("output_image"))[-2:]
    oc, ic = problem.size("output_channel"), problem.size("input_channel")
    kw = problem.sizes("filter_loop")[-1]
    dnb, dg, dist_oh, dow, doc, vow, voc, ric, rkw = z3.Ints(
        "dist_n dist_g dist_oh dist_ow dist_oc vec_ow vec_oc red_ic red_kw"
    )
    doh = dist_oh if two_d else 1  # a 1-D conv has no output height to tile
    tiled = [(nb, dnb, "N"), (groups, dg, "G"), *([(oh, dist_oh, "OH")] if two_d else []),
             (ow, dow, "OW"), (oc, doc, "OC")]
    for size, var, name in tiled:
        partial = partial_tiles and name in ("OW", "OC")
        add(*_distribution_tile(z3, size, var, name, partial, acc, width))
    add(z3.And(vow >= 1, dow % vow == 0), "C2 vec_ow divides dist_ow")
    add(z3.And(voc >= 1, doc % voc == 0), "C2 vec_oc divides dist_oc")
    add(_divisible(z3, ic, ric), "C3 reduction tile divides IC per group")
    add(z3.And(rkw >= 1, rkw <= kw, z3.Or(rkw == 1, rkw == kw)), "conv KW reduction tile is 1 or KW")
    (out_last,) = _last_output_loop(problem)
    if out_last in problem.loops("output_channel"):
        add(_native_width(z3, voc, oc, acc, width), "C5 vec_oc fills native vectors")
    else:
        add(_native_width(z3, vow, ow, acc, width), "C5 vec_ow fills native vectors")
    add(vow * voc * acc <= registers * width, "C6 accumulator tile fits the registers")
    add(
        dnb * dg * doh * dow * doc * cores <= nb * groups * oh * ow * oc,
        "C7 at least one workgroup per core",
    )
    (lg,), (loc,) = (problem.loops(c) for c in ("depth", "output_channel"))
    low, lkw = problem.loops("output_image")[-1], problem.loops("filter_loop")[-1]
    loop_of: dict[int, Loop] = {i: ("dist_n", 1, 0) for i in problem.loops("batch")}
    loop_of |= {
        lg: ("dist_g", 1, 0), low: ("dist_ow", "vec_ow", 0), loc: ("dist_oc", "vec_oc", 0),
        lkw: (0, 0, "red_kw"),
    }
    if two_d:
        loop_of |= {problem.loops("output_image")[0]: ("dist_oh", 1, 0),
                    problem.loops("filter_loop")[0]: (0, 0, 1)}
    loop_of |= {i: (0, 0, "red_ic") for i in problem.loops("input_channel")}  # none: 1 per group
    variables = ("dist_n", "dist_g", *(("dist_oh",) if two_d else ()), "dist_ow", "dist_oc",
                 "vec_ow", "vec_oc", "red_ic", "red_kw")
    return loop_of, variables


def _last_output_loop(problem: Problem) -> tuple[int]:
    """The loop indexing the innermost (contiguous) dimension of the output."""
    last = problem.indexing_maps[-1].split("->")[1].strip(" ()").split(",")[-1].strip()
    return (int(last[1:]),)


def _attention(
    z3: Any, problem: Problem, add: Any, acc: int, width: int, registers: int, cores: int,
    max_vector: int,
) -> tuple[dict[int, Loop], tuple[str, ...]]:
    """IREE's CPU attention (online_attention under LinalgExtTileAndVectorize).

    Knobs as IREE's own config: distribution and vector tiles on the innermost M loop and on N
    (the value head dim), a K2 (key sequence) reduction tile; batch and outer M loops are
    distributed one at a time and K1 (the query/key head dim) is never tiled.
    """
    for cls in ("n", "k2"):
        if len(problem.loops(cls)) != 1:
            raise UnsupportedProblem(
                f"CPU search supports attention with one {cls.upper()} loop; "
                f"this one has {len(problem.loops(cls))}"
            )
    if not problem.loops("m"):
        raise UnsupportedProblem("CPU search supports attention with at least one M loop")
    m_last = problem.loops("m")[-1]
    m, n = problem.loop_sizes[m_last], problem.size("n")
    k1, k2 = problem.size("k1"), problem.size("k2")
    outer = problem.size("batch") * problem.size("m") // m
    dm, dn, vm, vn, rk2 = z3.Ints("dist_m dist_n vec_m vec_n red_k2")
    add(_divisible(z3, m, dm), "C1 distribution tile divides M")
    add(_divisible(z3, n, dn), "C1 distribution tile divides N")
    add(z3.And(vm >= 1, dm % vm == 0), "C2 vec_m divides dist_m")
    add(z3.And(vn >= 1, dn % vn == 0), "C2 vec_n divides dist_n")
    add(_divisible(z3, k2, rk2), "C3 reduction tile divides K2")
    add(vm * rk2 * k1 * acc < max_vector, "C4 Q x K^T vector op under IREE's size limit")
    add(vm * vn * rk2 * acc < max_vector, "C4 P x V vector op under IREE's size limit")
    add(_native_width(z3, vn, n, acc, width), "C5 vec_n fills native vectors")
    add(vm * vn * acc <= registers * width, "C6 accumulator tile fits the registers")
    add(dm * dn * cores <= outer * m * n, "C7 at least one workgroup per core")
    loop_of: dict[int, Loop] = {i: (1, 1, 0) for i in problem.loops("batch")}
    loop_of |= {i: (1, 1, 0) for i in problem.loops("m")}
    loop_of[m_last] = ("dist_m", "vec_m", 0)
    loop_of[problem.loops("n")[0]] = ("dist_n", "vec_n", 0)
    loop_of |= {i: (0, 0, 0) for i in problem.loops("k1")}
    loop_of[problem.loops("k2")[0]] = (0, 0, "red_k2")
    return loop_of, ("dist_m", "dist_n", "vec_m", "vec_n", "red_k2")


_LISTS = ("distribution", "vector_common_parallel", "vector_reduction")


def cpu_columns(problem: Problem, model: CpuModel, cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """Standard candidate columns plus the per-loop knob lists of each row."""
    rows = len(cols[model.variables[0]]) if model.variables else 0

    def value(entry: int | str) -> np.ndarray:
        if isinstance(entry, str):
            return np.asarray(cols[entry], dtype=np.int64)
        return np.full(rows, entry, dtype=np.int64)

    columns: dict[str, Any] = {"pipeline": np.full(rows, model.pipeline, dtype=object)}
    b, m, n, _ = problem.gemm_shape
    if problem.kind == "contraction":
        # Several loops of a class: the GEMM-view tile is the product of the per-loop tiles.
        def product(cls: str, position: int) -> np.ndarray:
            result = np.ones(rows, dtype=np.int64)
            for i in problem.loops(cls):
                result = result * value(model.loops[i][position])
            return result

        tile_b = product("batch", 0)
        tile_m, tile_n = product("m", 0), product("n", 0)
        columns.update(
            tile_b=tile_b, tile_m=tile_m, tile_n=tile_n, tile_k=product("k", 2),
            vec_m=product("m", 1), vec_n=product("n", 1),
        )
    elif problem.kind == "attention":
        # GEMM view of attention is Q x K^T (M = m, N = k2, K = k1): a workgroup owns whole
        # rows of it, the K2 reduction tile is its register tile's width.
        tile_b = np.ones(rows, dtype=np.int64)
        tile_m, tile_n = value("dist_m"), np.full(rows, n, dtype=np.int64)
        columns.update(
            tile_b=tile_b, tile_m=tile_m, tile_n=tile_n,
            tile_k=np.full(rows, problem.size("k1"), dtype=np.int64),
            vec_m=value("vec_m"), vec_n=value("red_k2"),
        )
        m_last = problem.loop_sizes[problem.loops("m")[-1]]
        columns["workgroups"] = (b * m // m_last) * (m_last // tile_m) * (
            problem.size("n") // value("dist_n")
        )
    else:
        # Grouped convolutions: the group loop is the GEMM view's batch (B = groups).
        grouped = "dist_g" in model.variables
        tile_b = value("dist_g") if grouped else np.ones(rows, dtype=np.int64)
        tile_oh = value("dist_oh") if "dist_oh" in model.variables else np.ones(rows, np.int64)
        tile_od = value("dist_od") if "dist_od" in model.variables else np.ones(rows, np.int64)
        tile_batch = np.ones(rows, dtype=np.int64)
        for name in model.variables:
            if name.startswith("dist_n"):  # the convolution's batch loops (`_knob_names`)
                tile_batch = tile_batch * value(name)
        tile_m = tile_batch * tile_od * tile_oh * value("dist_ow")
        tile_n = value("dist_oc")
        columns.update(
            tile_b=tile_b, tile_m=tile_m, tile_n=tile_n, tile_k=value("red_ic"),
            vec_m=value("vec_ow"), vec_n=value("vec_oc"), tile_oh=tile_oh,
            tile_ow=value("dist_ow"), vec_ow=value("vec_ow"),
        )
    if "workgroups" not in columns:
        # Ceiling division: a partial last tile (see the module docstring) is a workgroup too.
        columns["workgroups"] = (
            -(-max(b, 1) // tile_b) * -(-m // tile_m) * -(-n // tile_n)
        )
    for list_index, list_name in enumerate(_LISTS):
        for loop, entries in enumerate(model.loops):
            columns[f"knob_{list_name}_{loop}"] = value(entries[list_index])
    return finish_table(columns, rows)


class CpuMaterializer:
    """Formats the `compilation_info` of a CPU row from its per-loop knob columns."""

    def __init__(self, pipeline: str, n_loops: int) -> None:  # n_loops: entries per list
        self.pipeline = pipeline
        self.n_loops = n_loops

    def compilation_info(self, row: pd.Series) -> str:
        return self.compilation_infos(row.to_frame().T)[0]

    def compilation_infos(self, rows: pd.DataFrame) -> list[str]:
        """`compilation_info` text of many rows, in their order (columnar: no per-row pandas)."""
        lists = []
        for name in _LISTS:
            columns = [f"knob_{name}_{i}" for i in range(self.n_loops)]
            values = rows[columns].to_numpy(dtype=np.int64).tolist()
            lists.append([f"{name} = [{', '.join(map(str, v))}]" for v in values])
        head = "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        tail = (">, translation_info = #iree_codegen.translation_info<pipeline = "
                f"#iree_cpu.pipeline<{self.pipeline}>>>")
        return [head + ", ".join(entries) + tail for entries in zip(*lists, strict=True)]


def cpu_system(model: CpuModel) -> ConstraintSystem:
    return ConstraintSystem.from_z3(list(model.assertions))


def enumerate_cpu(
    problem: Problem, target: Target, pipeline: str | None = None, limit: int | None = None
) -> CandidateSet:
    """Every configuration of the CPU model, in the engine's deterministic order."""
    model, chunks = _solve_least_relaxed(problem, target.cpu_facts(), limit)
    if pipeline is not None and pipeline != model.pipeline:
        if pipeline not in CPU_PIPELINES:
            raise DispatchTuneError(
                f"unknown CPU pipeline {pipeline!r}; choose one of {', '.join(CPU_PIPELINES)}"
            )
        raise DispatchTuneError(f"{problem.kind} problems use {model.pipeline} on llvm-cpu")
    cols = {
        v: np.concatenate([c[v] for c in chunks]) if chunks else np.zeros(0, np.int64)
        for v in model.variables
    }
    if limit is not None:
        cols = {k: v[:limit] for k, v in cols.items()}
    table = cpu_columns(problem, model, cols)
    materializer = CpuMaterializer(model.pipeline, len(model.loops))
    return CandidateSet(problem, target, table, {model.pipeline: materializer})


def _solve_least_relaxed(
    problem: Problem, facts: CpuFacts, limit: int | None
) -> tuple[CpuModel, Sequence[dict[str, np.ndarray]]]:
    """Solve the sane space; where it is empty, relax as little as makes it not empty.

    First C7 (a workgroup per core, halved down to one), then partial distribution tiles with
    C7 asking again from one per core (contractions, and convolutions on their output width and
    channels). Empty even then: `UnsupportedProblem` (unless `limit` is 0).
    """
    relaxations = (False, True) if problem.kind in ("contraction", "convolution") else (False,)
    for partial_tiles in relaxations:
        workgroups = facts.cores
        while True:
            model = cpu_model(problem, facts, workgroups, partial_tiles)
            chunks = _solve(model, limit)
            if any(len(c[model.variables[0]]) for c in chunks):
                if workgroups < facts.cores or partial_tiles:
                    logger.info("%s: no candidate in the strict CPU space; C7 asks for %d "
                                "workgroup(s) (%d cores)%s", problem.key, workgroups, facts.cores,
                                ", partial distribution tiles admitted" if partial_tiles else "")
                return model, chunks
            if workgroups <= 1:
                break
            workgroups = max(1, workgroups // 2)
    if limit != 0:
        # Said as on GPUs: a dispatch with nothing to tune is skipped with the reason, not ranked
        # as an empty list.
        raise UnsupportedProblem(
            f"the CPU space of {problem.describe()} is empty: no configuration meets its "
            "constraints, relaxed as far as they go: nothing to tune (IREE's default stays)"
        )
    return model, chunks


def _solve(model: CpuModel, limit: int | None) -> Sequence[dict[str, np.ndarray]]:
    chunks = []
    total = 0
    for chunk in cpu_system(model).solve(model.variables):
        chunks.append(chunk)
        total += len(chunk[model.variables[0]])
        if limit is not None and total >= limit:
            break
    return chunks
