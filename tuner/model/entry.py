"""The model's entry function: which function is benchmarked, its signature, its random inputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatchtune.errors import InputError
from dispatchtune.measure.verify import Call, TensorType, numpy_dtype, write_random_inputs
from dispatchtune.toolchain import mlir_error_line


@dataclass(frozen=True)
class EntryFunction:
    name: str
    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]


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
    if not results:
        raise InputError(f"{path}: @{name} returns nothing to compare")
    return EntryFunction(name, inputs, results)



def model_call(entry: EntryFunction, directory: Path, seed: int) -> Call:
    """The entry function with seeded random inputs written to `directory` as raw files.

    Floats are normal(0, 0.1): weight-sized values keep softmax and layer-norm inputs in a range
    where f32 rounding differences between configurations stay far below the comparison tolerance.
    """
    for i, tensor in enumerate(entry.inputs):
        if numpy_dtype(tensor.element_type) is None:
            raise InputError(
                f"argument {i} of @{entry.name}: no random inputs for {tensor.element_type}"
            )
    flags = write_random_inputs(entry.inputs, directory, seed, scale=0.1)
    assert flags is not None  # every input type was checked above
    return Call(entry.name, flags, entry.results)
