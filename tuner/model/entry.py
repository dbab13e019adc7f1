"""The model's entry function: which function is benchmarked, its signature, its random inputs.

Integer arguments are usually token ids or indices: random values outside the gathered dimension
make the model read out of bounds (an embedding lookup with negative ids did, issue #21). Their
valid range is read from the IR: a value that reaches a `tensor.extract` index (through casts,
reshapes and `linalg.generic` bodies) must stay below that dimension of the extracted tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatchtune.errors import InputError
from dispatchtune.measure.verify import Call, TensorType, numpy_dtype, write_random_inputs
from dispatchtune.toolchain import mlir_error_line

# Integer arguments whose use the IR does not reveal get 0 or 1: valid for any index and any
# boolean or mask input.
FALLBACK_INT_RANGE = (0, 2)
# Ops that pass an integer value (or a tensor of them) through unchanged as far as ranges go.
_PASS_THROUGH = frozenset({
    "arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci",
    "tensor.expand_shape", "tensor.collapse_shape", "tensor.extract_slice", "tensor.cast",
    "tensor.reshape", "linalg.transpose", "linalg.broadcast",
})


@dataclass(frozen=True)
class EntryFunction:
    name: str
    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]
    # [low, high) for each integer argument (None for floats): see the module docstring.
    int_ranges: tuple[tuple[int, int] | None, ...] = ()


def _index_bound(value: Any, depth: int = 0) -> int | None:
    """The smallest dimension `value` indexes through `tensor.extract` (None: not an index)."""
    from iree.compiler import ir

    if depth > 8:
        return None
    bounds: list[int] = []
    for use in value.uses:
        owner = use.owner
        owner = owner.operation if hasattr(owner, "operation") else owner
        name = owner.name
        found: int | None = None
        if name == "tensor.extract" and use.operand_number >= 1:
            shaped = ir.RankedTensorType(owner.operands[0].type)
            size = shaped.shape[use.operand_number - 1]
            found = int(size) if size > 0 else None
        elif name in _PASS_THROUGH and len(owner.results) == 1:
            found = _index_bound(owner.results[0], depth + 1)
        elif name == "linalg.generic" and owner.regions and owner.regions[0].blocks:
            arguments = owner.regions[0].blocks[0].arguments
            if use.operand_number < len(arguments):
                found = _index_bound(arguments[use.operand_number], depth + 1)
        if found is not None:
            bounds.append(found)
    return min(bounds) if bounds else None


def _int_ranges(function: Any, inputs: tuple[TensorType, ...]) -> tuple[tuple[int, int] | None, ...]:
    block = function.regions[0].blocks[0]
    ranges: list[tuple[int, int] | None] = []
    for tensor, argument in zip(inputs, block.arguments, strict=True):
        if not tensor.element_type.startswith("i"):
            ranges.append(None)
            continue
        bound = _index_bound(argument)
        ranges.append((0, bound) if bound else FALLBACK_INT_RANGE)
    return tuple(ranges)


def _tensor_type(value_type: Any, what: str) -> TensorType:
    from iree.compiler import ir

    if not isinstance(value_type, ir.RankedTensorType):
        raise InputError(f"{what} is {value_type}; tune-model needs ranked tensor arguments/results")
    shaped = ir.RankedTensorType(value_type)
    if not shaped.has_static_shape:
        raise InputError(f"{what} has dynamic shape {value_type}; tune-model needs static shapes")
    return TensorType(tuple(int(d) for d in shaped.shape), str(shaped.element_type))


def find_entry(path: Path, function: str = "") -> EntryFunction:
    """The function to benchmark: `function`, else the only public one, else `main`."""
    from iree.compiler import ir

    from dispatchtune.ir.frontend import read_input

    text = read_input(path)
    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except ir.MLIRError as exc:
            raise InputError(f"malformed MLIR in {path}: {mlir_error_line(exc)}") from None
        public: dict[str, Any] = {}
        for op in module.body.operations:
            operation = op.operation
            if operation.name not in ("func.func", "util.func"):
                continue
            attrs = operation.attributes
            visibility = str(attrs["sym_visibility"]).strip('"') if "sym_visibility" in attrs else ""
            if visibility == "private" or not operation.regions[0].blocks:
                continue
            public[str(attrs["sym_name"]).strip('"')] = operation
        if not public:
            raise InputError(f"{path}: no public function to benchmark")
        if function:
            if function not in public:
                raise InputError(
                    f"{path}: no public function @{function} (found: {', '.join(sorted(public))})"
                )
            name = function
        elif len(public) == 1:
            name = next(iter(public))
        elif "main" in public:
            name = "main"
        else:
            raise InputError(
                f"{path}: several public functions ({', '.join(sorted(public))}); "
                "choose one with --function"
            )
        ftype = ir.FunctionType(ir.TypeAttr(public[name].attributes["function_type"]).value)
        inputs = tuple(
            _tensor_type(t, f"argument {i} of @{name}") for i, t in enumerate(ftype.inputs)
        )
        results = tuple(
            _tensor_type(t, f"result {i} of @{name}") for i, t in enumerate(ftype.results)
        )
        int_ranges = _int_ranges(public[name], inputs)
    if not results:
        raise InputError(f"{path}: @{name} returns nothing to compare")
    return EntryFunction(name, inputs, results, int_ranges)


def model_call(
    entry: EntryFunction, directory: Path, seed: int, inputs: Path | None = None
) -> Call:
    """The entry function with its inputs written to `directory` as raw files.

    `inputs`: a `.npz` file with one array per argument, in argument order (the user's own
    inputs). Otherwise seeded random ones: floats normal(0, 0.1), since weight-sized values keep
    softmax and layer-norm inputs in a range where f32 rounding differences between
    configurations stay far below the comparison tolerance; integers within `int_ranges`.
    """
    if inputs is not None:
        return Call(entry.name, _user_inputs(entry, inputs, directory), entry.results)
    for i, tensor in enumerate(entry.inputs):
        if numpy_dtype(tensor.element_type) is None:
            raise InputError(
                f"argument {i} of @{entry.name}: no random inputs for {tensor.element_type}"
            )
    flags = write_random_inputs(entry.inputs, directory, seed, scale=0.1,
                                int_ranges=entry.int_ranges)
    assert flags is not None  # every input type was checked above
    return Call(entry.name, flags, entry.results)


def _user_inputs(entry: EntryFunction, path: Path, directory: Path) -> tuple[str, ...]:
    """`--input=` flags for the arrays of a `.npz` file, checked against the signature."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = [archive[name] for name in archive.files]
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read --inputs {path}: {exc}".splitlines()[0]) from None
    if len(arrays) != len(entry.inputs):
        raise InputError(f"--inputs {path} holds {len(arrays)} arrays; @{entry.name} takes "
                         f"{len(entry.inputs)} arguments")
    directory.mkdir(parents=True, exist_ok=True)
    flags = []
    for i, (array, tensor) in enumerate(zip(arrays, entry.inputs, strict=True)):
        dtype = numpy_dtype(tensor.element_type)
        if tuple(array.shape) != tensor.shape or dtype is None or array.dtype.kind != dtype.kind:
            raise InputError(
                f"--inputs {path}: array {i} is {array.dtype}{list(array.shape)}; argument {i} "
                f"of @{entry.name} is {tensor.flag}"
            )
        target = directory / f"input{i}.bin"
        np.ascontiguousarray(array.astype(dtype)).tofile(target)
        flags.append(f"--input={tensor.flag}=@{target}")
    return tuple(flags)
