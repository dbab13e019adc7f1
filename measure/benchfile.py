"""Dispatch benchmark files: dump them from a model, strip their configs, fill their buffers.

A dumped benchmark (`--iree-hal-dump-executable-benchmarks-to`) holds one dispatch, already
configured by the compiler, plus a `util.initializer` that allocates the binding buffer and a
`util.func` that dispatches it (`iree.benchmark = "dispatch"`). Two fixes make it usable for tuning:

* strip the compiler's `lowering_config`/`translation_info` (a tuning spec does not override them);
* fill the allocated buffer: the initializer never writes it, and on CPU the untouched pages made
  the dispatch measure about 2.2x slower than in the real model, ranking candidates wrongly.

The fill is inserted with IREE's IR bindings (the ops are parsed from a small template function
whose arguments are then rewired to the initializer's values), and the result is verified.

A dispatch of a model whose weights are `dense_resource` blobs may inline a small constant (a
bias) as `dense_resource<name>`, but the dump does not carry the model's blob section, so the file
fails to parse ("resource does not exist"). `dump_dispatch_benchmarks` synthesises each missing
blob: seeded values of the constant's type and size, never a splat, so the dispatch compiles to
the same code as in the model (a splat could be folded into it) without re-reading the model.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.measure.process import run_process
from dispatchtune.problem import Problem
from dispatchtune.targets import Target
from dispatchtune.toolchain import mlir_error_line, retry_without_const_eval, tool_path

logger = logging.getLogger(__name__)

BENCHMARK_MARKER = 'iree.benchmark = "dispatch"'
_RESOURCE_USE = re.compile(r"dense_resource<([\w.$-]+)>\s*:\s*tensor<([^>]+)>")
_RESOURCES_SECTION = re.compile(r"\{-#\s*dialect_resources:\s*\{\s*builtin:\s*\{")

# Template of the ops inserted after the buffer is stored to its global. The arguments stand for
# the initializer's device, queue affinity, buffer and size; they are replaced by those values.
_FILL_TEMPLATE = """
util.func private @__dispatchtune_fill(%device: !hal.device, %affinity: i64,
                                       %buffer: !hal.buffer, %size: index) {
  %cmd = hal.command_buffer.create device(%device : !hal.device)
      mode("OneShot|AllowInlineExecution") categories("Transfer|Dispatch")
      affinity(%affinity) : !hal.command_buffer
  %zero = arith.constant 0 : index
  %pattern = arith.constant PATTERN : i32
  hal.command_buffer.fill_buffer<%cmd : !hal.command_buffer>
      target(%buffer : !hal.buffer)[%zero, %size] pattern(%pattern : i32) flags("None")
  hal.command_buffer.finalize<%cmd : !hal.command_buffer>
  %no_fence = util.null : !hal.fence
  %fence = hal.fence.create device(%device : !hal.device) flags("None") : !hal.fence
  hal.device.queue.execute<%device : !hal.device> affinity(%affinity) wait(%no_fence)
      signal(%fence) commands(%cmd) flags("None")
  %forever = arith.constant -1 : i32
  %status = hal.fence.await until([%fence]) timeout_millis(%forever) flags("None") : i32
  util.status.check_ok %status, "dispatchtune: failed to fill the benchmark buffer"
  util.return
}
"""

# 32-bit fill patterns that read as a small, finite value (1.0 where the type has it) in the
# element type: no NaN/denormal slow paths, no all-zero pages.
_PATTERNS = {
    "f32": 0x3F800000,
    "f16": 0x3C003C00,
    "bf16": 0x3F803F80,
    "f64": 0x00000000,  # unused in practice; 0 words still touch every page
}


def fill_pattern(element_type: str) -> int:
    """The i32 fill pattern for a buffer whose inputs are `element_type` (ints: 0x01 bytes)."""
    return _PATTERNS.get(element_type, 0x01010101)


def is_dispatch_benchmark(text: str) -> bool:
    """Whether MLIR text is a dumped dispatch benchmark (as opposed to a model/function)."""
    return BENCHMARK_MARKER in text


class DumpedBenchmarks(NamedTuple):
    """The benchmark files dumped from a model, and the compile flags that dumped them."""

    files: list[Path]
    #: The target's flags, plus `NO_CONST_EVAL` when the model fails to build without it (then
    #: every build of the model with the tuned spec needs it too: the run's summary says so).
    compile_flags: tuple[str, ...]


def dump_dispatch_benchmarks(input_path: Path, target: Target, out_dir: Path) -> DumpedBenchmarks:
    """Compile a model/function and dump one benchmark file per dispatch into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)

    def dump(flags: list[str]) -> Any:
        return run_process(
            [tool_path("iree-compile"), str(input_path), *flags,
             f"--iree-hal-dump-executable-benchmarks-to={out_dir}",
             "--iree-codegen-add-tuner-attributes", "-o", "/dev/null"],
            600,
        )

    proc, flags = retry_without_const_eval(target.compile_flags, dump, lambda p: not p.ok,
                                           str(input_path))
    if not proc.ok:
        raise InputError(f"iree-compile {proc.status} on {input_path}: {proc.error}")
    files = sorted(out_dir.glob("*_benchmark.mlir"))
    if not files:
        from dispatchtune.ir.frontend import dynamic_shape_note

        cause = dynamic_shape_note(input_path)
        raise InputError(f"{input_path}: iree-compile dumped no dispatch benchmarks"
                         + (f": {cause}" if cause else ""))
    for file in files:
        text = file.read_text()
        if "dense_resource<" not in text:
            continue
        completed, added = synthesise_missing_resources(text)
        if added:
            file.write_text(completed)
            logger.info("%s: synthesised the blobs it references but does not carry: %s",
                        file.name, ", ".join(added))
    return DumpedBenchmarks(files, tuple(flags))


def _blob(type_text: str, seed: int) -> str:
    """Hex blob (MLIR's format: 4-byte alignment, then the raw data) for `AxBx...xT` values."""
    from dispatchtune.measure.verify import numpy_dtype

    *dims, element = type_text.split("x")
    shape = tuple(int(d) for d in dims)
    if element == "i1":
        dtype = np.dtype(np.bool_)
    else:
        found = numpy_dtype(element)
        if found is None:
            raise InputError(f"cannot synthesise a dense_resource of type tensor<{type_text}>")
        dtype = found
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.floating) or dtype.kind == "V":  # ml_dtypes floats are kind V
        values = (0.1 * rng.standard_normal(shape)).astype(np.float32).astype(dtype)
    else:
        values = rng.integers(0, 2, size=shape).astype(dtype)
    alignment = max(dtype.itemsize, 1).to_bytes(4, "little")
    return "0x" + (alignment + values.tobytes()).hex().upper()


def synthesise_missing_resources(text: str) -> tuple[str, list[str]]:
    """`text` with a blob for every `dense_resource<name>` it uses but does not define."""
    match = _RESOURCES_SECTION.search(text)
    defined = text[match.end():] if match else ""
    missing: dict[str, str] = {}
    for name, type_text in _RESOURCE_USE.findall(text):
        if name not in missing and not re.search(rf"(^|[\s,{{]){re.escape(name)}\s*:", defined):
            missing[name] = type_text.strip()
    if not missing:
        return text, []
    entries = ",\n".join(
        f'      {name}: "{_blob(type_text, seed)}"'
        for seed, (name, type_text) in enumerate(missing.items())
    )
    if match:
        text = f"{text[:match.end()]}\n{entries},{text[match.end():]}"
    else:
        section = f"{{-#\n  dialect_resources: {{\n    builtin: {{\n{entries}\n    }}\n  }}\n#-}}\n"
        text = f"{text.rstrip()}\n\n{section}"
    return text, list(missing)


def strip_compilation_info(path: Path, out_path: Path) -> Path:
    """Remove the compiler's configs so a tuning spec decides the configuration."""
    proc = run_process(
        [tool_path("iree-opt"), str(path), "--iree-codegen-strip-compilation-info",
         "-o", str(out_path)],
        300,
    )
    if not proc.ok:
        raise InputError(f"iree-opt could not strip {path}: {proc.error}")
    return out_path


def _drop_root_markers(module: Any) -> None:
    """Remove the `root_op` markers a dump made with `--iree-codegen-add-tuner-attributes` carries.

    The spec matcher of an op that reaches it already converted (CPU attention arrives as
    `online_attention`) compares the op's attributes with its pattern's, and the marker made
    the dumped op differ from the model's own, so no candidate applied (measured: 20 of 20
    attention candidates "not applied" in a dumped benchmark, all applied once the marker is
    gone). IREE puts the marker back itself when it compiles with that flag.
    """
    from iree.compiler import ir

    def visit(op: Any) -> Any:
        if "root_op" in op.operation.attributes:
            del op.operation.attributes["root_op"]
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)


def _ops(block: Any) -> list[Any]:
    return [op.operation for op in block.operations]


def add_buffer_fill(
    text: str, pattern: int = _PATTERNS["f32"], *, drop_root_markers: bool = False
) -> str:
    """Insert a fill of every benchmark buffer right after the initializer allocates it; with
    `drop_root_markers`, also remove the dump's `root_op` markers in the same parse
    (`_drop_root_markers`).

    Raises `InputError` when the file has no `util.initializer` allocating a buffer (the dumped
    layout changed): silently benchmarking unfilled buffers would rank candidates wrongly.
    """
    from iree.compiler import ir

    pattern &= 0xFFFFFFFF
    signed = pattern - 2**32 if pattern >= 2**31 else pattern  # i32 constants are signed
    template = _FILL_TEMPLATE.replace("PATTERN", str(signed))
    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise InputError(f"cannot parse benchmark file: {mlir_error_line(exc)}") from None
        if drop_root_markers:
            _drop_root_markers(module)
        filled = 0
        for top in _ops(module.body):
            if top.name != "util.initializer":
                continue
            for op in _ops(top.regions[0].blocks[0]):
                if op.name != "hal.allocator.allocate":
                    continue
                allocator, affinity, size = op.operands[0], op.operands[1], op.operands[-1]
                producer = allocator.owner
                if getattr(producer, "name", "") != "hal.device.allocator":
                    raise InputError(
                        "benchmark buffer allocator does not come from hal.device.allocator"
                    )
                device = producer.operands[0]
                buffer = op.results[0]
                stores = [u.owner for u in buffer.uses if u.owner.name == "util.global.store"]
                if len(stores) != 1:
                    raise InputError("benchmark buffer is not stored to exactly one global")
                body = ir.Module.parse(template).body
                func = _ops(body)[0]
                block = func.regions[0].blocks[0]
                for argument, value in zip(
                    block.arguments, (device, affinity, buffer, size), strict=True
                ):
                    argument.replace_all_uses_with(value)
                anchor = stores[0]
                for inserted in _ops(block)[:-1]:  # all but util.return
                    inserted.move_after(anchor)
                    anchor = inserted
                filled += 1
        if filled == 0:
            raise InputError(
                "benchmark file has no util.initializer allocating a buffer; "
                "cannot fill it (IREE's dump format changed?)"
            )
        try:
            module.operation.verify()
        except ir.MLIRError as exc:  # pragma: no cover - would be a bug in the template
            raise DispatchTuneError(f"filled benchmark does not verify: {exc}") from None
        return str(module)


@dataclass(frozen=True)
class PreparedDispatch:
    """One dispatch ready to tune: its problem and the stripped + filled benchmark file."""

    problem: Problem
    source: Path
    benchmark: Path


def prepare_dispatch(source: Path, problem: Problem, out_path: Path) -> PreparedDispatch:
    """Strip and fill one dumped benchmark into `out_path` (written atomically)."""
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        stripped = strip_compilation_info(source, Path(tmp) / "stripped.mlir")
        filled = add_buffer_fill(stripped.read_text(), fill_pattern(problem.element_types[0]),
                                 drop_root_markers=True)
        staging = Path(tmp) / out_path.name
        staging.write_text(filled)
        shutil.move(str(staging), out_path)
    return PreparedDispatch(problem=problem, source=source, benchmark=out_path)
