"""Front end: find the tunable root ops in real IREE input and describe each as a `Problem`.

Two inputs are accepted (iree-turbine's torch-dialect exports are first lowered to (b) with IREE's
own torch pipeline, `dispatchtune.ir.lowering`):
  (a) a dispatch benchmark dumped by `iree-compile --iree-hal-dump-executable-benchmarks-to=DIR
      --iree-codegen-add-tuner-attributes`, or a directory of them;
  (b) a model or function in MLIR with linalg ops, compiled with the target's flags.
Either way, root ops are read from the IR exactly as IREE's tuning-spec matcher sees it (see
`_ir_seen_by_tuning_specs`), with IREE's Python bindings (`infer_contraction_dimensions`,
`infer_convolution_dimensions`, `get_attention_op_detail`), never with regular expressions.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchtune.errors import InputError, NoTunableOp, TargetError
from dispatchtune.ir.lowering import lower_if_torch
from dispatchtune.problem import OpKind, Problem
from dispatchtune.targets import Target, get_target, undescribed_target_error
from dispatchtune.toolchain import (
    compiler_failure,
    first_error_line,
    iree_compiler_version,
    mlir_error_line,
    retry_without_const_eval,
    run_tool,
)

if TYPE_CHECKING:
    from iree.compiler import ir

logger = logging.getLogger(__name__)

_ATTENTION_OPS = ("iree_linalg_ext.attention", "iree_linalg_ext.online_attention")


def load_problems(
    path: str | Path, target: Target | str = "host", *, function_file: bool = False
) -> list[Problem]:
    """Every tunable root op (contraction, convolution, attention) in `path`, in file order.

    `target` is used only to form dispatches from a model/function file (input b).
    `function_file=True` says the caller has already parsed `path` as such a file (tune-model
    does, to find its entry function), so it is not read and parsed here a second time: a
    100 MB export is read into Python once.
    A directory of dumped benchmarks gives the root ops of those that have any, skipping the
    others (`load_dispatch_files`).
    Raises `InputError` with a one-line message for a missing file, malformed MLIR, dynamic
    shapes, or no tunable op (`NoTunableOp`).
    """
    from iree.compiler import ir

    path = Path(path)
    if isinstance(target, str):
        target = get_target(target)
    if path.is_dir():
        loaded = load_dispatch_files(dispatch_files(path), target, path)
        return [p for _, problems in loaded for p in problems]
    path = lower_if_torch(path)
    has_executables = False
    if not function_file:
        text = read_input(path)
        with ir.Context():
            module = _parse(text, path)
            has_executables = _has_executables(module)
            if not has_executables and "f64" in text:  # dumps were demoted when they were made
                _warn_f64_demoted(module, path)
            del module
        del text
    matched_ir = _ir_seen_by_tuning_specs(path, None if has_executables else target)
    problems: list[Problem] = []
    unsupported: list[str] = []
    with ir.Context():
        for chunk in matched_ir:
            chunk_module = _parse(chunk, path)  # must outlive the op handles taken from it
            for op in _candidate_root_ops(chunk_module):
                problem = _describe(op, path)
                if problem is None:
                    unsupported.append(op.name)
                else:
                    problems.append(problem)
    # Dispatch dumps come in compile order; present them in dispatch-index order instead.
    problems.sort(key=_dispatch_index)
    if not problems:
        if unsupported:
            names = ", ".join(sorted(set(unsupported)))
            raise NoTunableOp(
                f"{path}: no tunable root op (found only unsupported ops: {names}); "
                "dispatchtune tunes contractions, convolutions and attention"
            )
        raise NoTunableOp(
            f"{path}: no tunable root op found (no linalg contraction, conv or attention)"
        )
    return problems


def dispatch_files(directory: Path) -> list[Path]:
    """The dispatch benchmarks of a dump directory: its `*_benchmark.mlir` files, else every
    `.mlir` file (renamed dumps), in name order."""
    files = sorted(directory.glob("*_benchmark.mlir")) or sorted(directory.glob("*.mlir"))
    if not files:
        raise InputError(f"no .mlir files in directory {directory}")
    return files


def load_dispatch_files(
    files: Sequence[Path], target: Target, where: Path
) -> list[tuple[Path, list[Problem]]]:
    """Each dispatch benchmark's root ops, for the files that have any.

    A dump holds every dispatch of a model, most of them elementwise: files without a tunable
    root op are skipped with one summary line, and a file that cannot be read with a warning
    each, so one odd dispatch never stops the rest. When no file has a tunable root op, one
    `InputError` line says why (`where` names the input: the directory, or the dumped model).
    """
    loaded: list[tuple[Path, list[Problem]]] = []
    untunable = 0
    bad: list[InputError] = []
    for file in files:
        try:
            loaded.append((file, load_problems(file, target)))
        except NoTunableOp:
            untunable += 1
        except InputError as exc:
            bad.append(exc)
    if not loaded:
        if bad:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            raise InputError(f"{where}: no usable dispatch benchmark: {bad[0]}{more}")
        raise NoTunableOp(f"{where}: none of its {len(files)} dispatch(es) has a tunable root op "
                          "(dispatchtune tunes contractions, convolutions and attention)")
    for error in bad:
        logger.warning("skipped a dispatch: %s", error)
    if untunable:
        logger.info("%s: skipped %d of %d dispatch(es) without a tunable root op (elementwise "
                    "and other ops dispatchtune does not tune)", where, untunable, len(files))
    return loaded


def warn_if_f64_demoted(text: str, path: Path) -> None:
    """Say (a warning) when a model/function's root ops compute in f64: IREE demotes every f64
    op to f32 before codegen by default (`--iree-input-demote-f64-to-f32`), so those ops are
    shown and tuned as the f32 ops IREE compiles, and nothing else would say why."""
    from iree.compiler import ir

    if "f64" not in text:  # most inputs: no second parse of a large export
        return
    with ir.Context():
        try:
            module = _parse(text, path)
        except InputError:
            return  # not for this note to report: the build reports malformed input
        _warn_f64_demoted(module, path)


def _warn_f64_demoted(module: Any, path: Path) -> None:
    from iree.compiler import ir
    from iree.compiler.dialects import linalg

    def f64(value: Any) -> bool:
        return isinstance(value.type, ir.ShapedType) and str(
            ir.ShapedType(value.type).element_type) == "f64"

    names = [
        op.name for op in _candidate_root_ops(module)
        if (op.name in _ATTENTION_OPS or linalg.isa_contraction_op(op)
            or linalg.isa_convolution_op(op))
        and any(f64(v) for v in [*op.operands, *op.results])
    ]
    if names:
        logger.warning("%s: %d root op(s) compute in f64 (%s); IREE demotes f64 to f32 by default "
                       "(--iree-input-demote-f64-to-f32), so they are compiled, shown and tuned as "
                       "f32", path, len(names), ", ".join(sorted(set(names))))


def read_input(path: Path) -> str:
    """The text of an input file; a missing or unreadable file is a one-line `InputError`."""
    if not path.is_file():
        raise InputError(f"no such file: {path}")
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None


def _parse(text: str, path: Path) -> ir.Module:
    from iree.compiler import ir

    try:
        return ir.Module.parse(text)
    except ir.MLIRError as exc:
        detail = mlir_error_line(exc).replace('"-"', str(path))
        raise InputError(f"malformed MLIR in {path}: {detail}") from None


_DUMP_HEADER = re.compile(r"^// -----// IR Dump Before [^\n]*//----- //$", re.MULTILINE)


def _has_executables(module: Any) -> bool:
    return any(op.name == "hal.executable" for op in module.body.operations)


def _ir_seen_by_tuning_specs(path: Path, target: Target | None) -> list[str]:
    """The dispatch functions exactly as IREE's tuning-spec matcher sees them.

    Specs are applied by `iree-codegen-materialize-user-configs`, after codegen has already
    rewritten the dispatch (e.g. unit batch dims of a convolution are dropped), so a spec built from
    any earlier or later form silently fails to match. Existing configurations are stripped first
    so the configuration pipeline runs. `target` is None for dumped benchmarks (they embed theirs).
    """
    stripped = run_tool("iree-opt", [str(path), "--iree-codegen-strip-compilation-info"])
    if stripped.returncode != 0:
        raise InputError(f"iree-opt rejected {path}: {first_error_line(stripped.stderr)}")
    def configure(flags: list[str]) -> Any:
        return run_tool(
            "iree-compile",
            ["-", *flags, "--compile-to=executable-configurations",
             "--mlir-print-ir-before=iree-codegen-materialize-user-configs", "-o", os.devnull],
            input_text=stripped.stdout,
        )

    flags = [] if target is None else list(target.compile_flags)
    proc, _ = retry_without_const_eval(flags, configure, lambda p: p.returncode != 0, str(path))
    if proc.returncode != 0:
        # stderr also holds the IR dumps: only an error line or the crash says what went wrong.
        reason = compiler_failure(proc.returncode, proc.stderr)
        undescribed = None if target is None else undescribed_target_error(target, reason)
        if undescribed is not None:  # the target, not the file
            raise undescribed
        if target is not None and "Unknown CPU" in reason:
            raise TargetError(f"IREE {iree_compiler_version()} does not know the CPU of target "
                              f"{target.name!r}: {reason}")
        if target is not None and target.is_gpu:
            # IREE crashes on some targets it cannot describe (cuda:h100 in 3.13) instead of
            # saying so: its target probe, a known-good matmul, tells the target from the file.
            target.gpu_facts()
        raise InputError(f"iree-compile rejected {path}: {reason}")
    return [chunk for chunk in _DUMP_HEADER.split(proc.stderr)[1:] if chunk.strip()]


def _candidate_root_ops(module: Any) -> list[Any]:
    """Ops a tuning spec can target: linalg contractions, convolutions and attention, in IR order.

    Other linalg ops (elementwise generics, fills) are returned too when they are structured ops
    with indexing maps, so the caller can report them as unsupported.
    """
    from iree.compiler import ir

    found: list[Any] = []

    def visit(op: Any) -> Any:
        operation = op.operation
        name = operation.name
        if name in _ATTENTION_OPS or (
            name.startswith("linalg.")
            and name not in ("linalg.fill", "linalg.yield", "linalg.index")
        ):
            found.append(operation)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def dynamic_shape_note(path: Path) -> str:
    """The first value of dynamic shape in `path` as a one-line cause, or "" when all are static.

    `iree-compile --iree-hal-dump-executable-benchmarks-to` dumps benchmarks of static-shape
    dispatches only, so an input with dynamic shapes yields an empty dump; this names the cause
    (read only on that failure path: the file is parsed once more).
    """
    from iree.compiler import ir

    found: list[str] = []

    def dynamic(value: Any) -> bool:
        return isinstance(value.type, ir.ShapedType) and not ir.ShapedType(
            value.type).has_static_shape

    def visit(op: Any) -> Any:
        operation = op.operation
        if operation.name in ("func.func", "util.func") and operation.regions[0].blocks:
            name = str(operation.attributes["sym_name"]).strip('"')
            for i, argument in enumerate(operation.regions[0].blocks[0].arguments):
                if dynamic(argument):
                    found.append(f"argument {i} of @{name} has dynamic shape {argument.type}")
                    return ir.WalkResult.INTERRUPT
        for value in operation.results:
            if dynamic(value):
                found.append(f"{operation.name} has dynamic shape {value.type}")
                return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    try:
        text = read_input(path)
    except InputError:
        return ""
    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError:
            return ""
        module.operation.walk(visit, ir.WalkOrder.PRE_ORDER)
    return f"{found[0]}; dispatchtune needs static shapes" if found else ""


def _static_shape(value: Any, op_name: str, path: Path) -> tuple[tuple[int, ...], str]:
    """(shape, element type) of a ranked tensor/memref value, or the element type of a scalar."""
    from iree.compiler import ir

    value_type = value.type
    if not isinstance(value_type, ir.ShapedType):
        return (), str(value_type)
    shaped = ir.ShapedType(value_type)
    if not shaped.has_static_shape:
        raise InputError(
            f"{path}: {op_name} has dynamic shape {value_type}; dispatchtune tunes static shapes only"
        )
    return tuple(int(d) for d in shaped.shape), str(shaped.element_type)


def _loop_sizes(maps: list[Any], shapes: list[tuple[int, ...]], n_loops: int) -> tuple[int, ...]:
    """Each loop's trip count: the size of an operand dimension indexed by that loop alone."""
    from iree.compiler import ir

    sizes = [0] * n_loops
    for amap, shape in zip(maps, shapes, strict=True):
        for position, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr) and sizes[expr.position] == 0:
                sizes[expr.position] = shape[position]
    return tuple(sizes)


def _dispatch_index(problem: Problem) -> int:
    match = re.search(r"_dispatch_(\d+)", problem.name)
    return int(match.group(1)) if match else 0


def _function_name(op: Any) -> str:
    parent = op.parent
    while parent is not None and parent.name not in ("func.func", "util.func"):
        parent = parent.parent
    if parent is None:
        return ""
    return str(parent.attributes["sym_name"]).strip('"')


def _describe(op: Any, path: Path) -> Problem | None:
    """The Problem of one root op, or None when its kind is not tunable."""
    from iree.compiler.dialects import iree_codegen, linalg

    name = op.name
    kind: OpKind
    scale_type = ""
    if name in _ATTENTION_OPS:
        kind = "attention"
        maps = [attr.value for attr in op.attributes["indexing_maps"]]
        # ins are Q, K, V, scale and an optional mask; the output's map follows the ins' maps
        # (online_attention adds its max and sum outputs after it).
        n_ins = len(op.operands) - len(op.results)
        q, k, v, o = maps[0], maps[1], maps[2], maps[n_ins]
        mask = (str(maps[4]), _static_shape(op.operands[4], name, path)[1]) if n_ins == 5 else None
        detail = iree_codegen.get_attention_op_detail(q, k, v, o)
        dims = {
            "batch": detail.batch_dims,
            "m": detail.m_dims,
            "n": detail.n_dims,
            "k1": detail.k1_dims,
            "k2": detail.k2_dims,
        }
        values = [op.operands[0], op.operands[1], op.operands[2], op.results[0]]
        operand_maps = [q, k, v, o]
        scale_type = str(op.operands[3].type)
        n_loops = int(detail.domain_rank)
        extra: dict[str, tuple[int, ...]] = {}
    elif linalg.isa_contraction_op(op):
        kind = "contraction"
        cdims = linalg.infer_contraction_dimensions(op)
        dims = {"batch": cdims.batch, "m": cdims.m, "n": cdims.n, "k": cdims.k}
        operand_maps = [attr.value for attr in linalg.get_indexing_maps(op)]
        values = [*list(op.operands)[: len(operand_maps) - 1], op.results[0]]
        n_loops = operand_maps[0].n_dims
        extra = {}
        mask = None
    elif linalg.isa_convolution_op(op):
        kind = "convolution"
        cdims = linalg.infer_convolution_dimensions(op)
        dims = {
            "batch": cdims.batch,
            "output_image": cdims.output_image,
            "output_channel": cdims.output_channel,
            "filter_loop": cdims.filter_loop,
            "input_channel": cdims.input_channel,
            "depth": cdims.depth,
        }
        operand_maps = [attr.value for attr in linalg.get_indexing_maps(op)]
        values = [*list(op.operands)[: len(operand_maps) - 1], op.results[0]]
        n_loops = operand_maps[0].n_dims
        extra = {"strides": tuple(cdims.strides), "dilations": tuple(cdims.dilations)}
        mask = None
    else:
        return None

    shapes_types = [_static_shape(v, name, path) for v in values]
    shapes = [s for s, _ in shapes_types]
    return Problem(
        kind=kind,
        loop_sizes=_loop_sizes(operand_maps, shapes, n_loops),
        dims={cls: tuple(int(i) for i in loops) for cls, loops in dims.items()},
        element_types=tuple(t for _, t in shapes_types),
        operand_shapes=tuple(shapes),
        indexing_maps=tuple(str(m) for m in operand_maps),
        strides=extra.get("strides", ()),
        dilations=extra.get("dilations", ()),
        mask_map=mask[0] if mask else "",
        mask_type=mask[1] if mask else "",
        # Stated only when it is not the output's, so that other problems keep their keys.
        scale_type=scale_type if scale_type != shapes_types[-1][1] else "",
        op_name=name,
        name=_function_name(op),
    )
