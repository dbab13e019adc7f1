"""The configuration a matcher gives, by meaning (`ExpertConfig`): current syntax read with
IREE's bindings, older generations mapped to it first (`modernise`) or read by meaning (2024);
and both in the candidate-table vocabulary (`expert_columns`, `configuration_columns`)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from dispatchtune.datasets.expert_specs.entries import ExpertConfig, ExpertEntry
from dispatchtune.datasets.expert_specs.text import (
    _balanced,
    _context,
    _ints,
    _mma_shape,
    current_intrinsic,
)
from dispatchtune.errors import InputError
from dispatchtune.problem import Problem


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
