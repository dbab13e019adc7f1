"""`Problem`: one tunable root op of a dispatch (contraction, convolution or attention).

A problem is described the way IREE's tuner bindings see it: the static trip count of every loop of
the op, which loops belong to which dimension class (M/N/K/batch; conv image/filter/channels;
attention B/M/N/K1/K2), the operand element types and the indexing maps. It can be parsed from real
IREE input (`dispatchtune.ir.frontend.load_problems`) or built in Python and rendered back to a
compilable MLIR function (`Problem.to_mlir`), so datasets of shapes can be generated.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

OpKind = Literal["contraction", "convolution", "attention"]

#: Dimension classes per op kind, in a fixed order (the order is part of the public vocabulary).
DIM_CLASSES: dict[str, tuple[str, ...]] = {
    "contraction": ("batch", "m", "n", "k"),
    "convolution": (
        "batch",
        "output_image",
        "output_channel",
        "filter_loop",
        "input_channel",
        "depth",
    ),
    "attention": ("batch", "m", "n", "k1", "k2"),
}

_TYPE_BYTES = {
    "f64": 8.0,
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "i64": 8.0,
    "i32": 4.0,
    "i16": 2.0,
    "i8": 1.0,
    "f8E4M3FNUZ": 1.0,
    "f8E5M2FNUZ": 1.0,
    "f8E4M3FN": 1.0,
    "f8E5M2": 1.0,
}


def element_bytes(element_type: str) -> float:
    """Size of one element of an MLIR scalar type, in bytes (i4 -> 0.5)."""
    if element_type in _TYPE_BYTES:
        return _TYPE_BYTES[element_type]
    match = re.fullmatch(r"[iuf](\d+)", element_type)
    if match:
        return int(match.group(1)) / 8
    raise ValueError(f"unsupported element type {element_type!r}")


def _is_float(element_type: str) -> bool:
    return element_type.startswith(("f", "bf"))


@dataclass(frozen=True)
class Problem:
    """A tunable root op with static shapes.

    Attributes:
        kind: "contraction" (matmul, batch matmul, transposed operands, generic contractions),
            "convolution" or "attention".
        loop_sizes: static trip count of each loop of the op's iteration space (d0, d1, ...).
        dims: dimension class -> loop indices, classes as in `DIM_CLASSES[kind]`.
        element_types: element type of each operand, inputs first, output last (attention: Q, K,
            V, output; the scale is not an operand here).
        operand_shapes: static shape of each operand, in the same order.
        indexing_maps: each operand's affine map as MLIR text, e.g. "(d0, d1, d2) -> (d0, d2)".
        strides, dilations: convolution only, one per output image dim.
        mask_type, mask_map: attention only: the element type and affine map of its mask operand
            ("" when it has none; IREE gives SDPA's boolean masks as i8 or i1).
        scale_type: attention only: the element type of its scale operand when it is not the
            output's (a torch f16 SDPA reaches the GPU as an online_attention with an f32 output
            and an f16 scale, or the other way round); "" otherwise.
        op_name: the MLIR op name as found (informational).
        name: where it came from (function or dispatch name), informational.
    """

    kind: OpKind
    loop_sizes: tuple[int, ...]
    dims: Mapping[str, tuple[int, ...]]
    element_types: tuple[str, ...]
    operand_shapes: tuple[tuple[int, ...], ...]
    indexing_maps: tuple[str, ...]
    strides: tuple[int, ...] = ()
    dilations: tuple[int, ...] = ()
    mask_type: str = ""
    mask_map: str = ""
    scale_type: str = ""
    op_name: str = "linalg.generic"
    name: str = field(default="", compare=False)

    # ---- derived sizes -------------------------------------------------------------------------
    def loops(self, dim_class: str) -> tuple[int, ...]:
        """Loop indices of one dimension class (empty if the op has none)."""
        return tuple(self.dims.get(dim_class, ()))

    def sizes(self, dim_class: str) -> tuple[int, ...]:
        """Static sizes of the loops of one dimension class, in loop order."""
        return tuple(self.loop_sizes[i] for i in self.loops(dim_class))

    def size(self, dim_class: str) -> int:
        """Product of the sizes of a dimension class (1 when the class is empty)."""
        return math.prod(self.sizes(dim_class))

    @property
    def gemm_shape(self) -> tuple[int, int, int, int]:
        """(B, M, N, K) of the op seen as a (batched) GEMM.

        Convolutions use the implicit-GEMM view: M = batch x output image, N = output channels,
        K = filter loops x input channels, B = depth (groups). Attention reports its first
        product, Q x K^T: M = m, N = k2, K = k1.
        """
        if self.kind == "contraction":
            return (self.size("batch"), self.size("m"), self.size("n"), self.size("k"))
        if self.kind == "convolution":
            return (
                self.size("depth"),
                self.size("batch") * self.size("output_image"),
                self.size("output_channel"),
                self.size("filter_loop") * self.size("input_channel"),
            )
        return (self.size("batch"), self.size("m"), self.size("k2"), self.size("k1"))

    @property
    def flops(self) -> int:
        """Multiply-add work of the op counted as 2 FLOPs per MAC."""
        if self.kind == "attention":
            b, m, n, k1, k2 = (self.size(c) for c in DIM_CLASSES["attention"])
            return 2 * b * m * k2 * (k1 + n)
        b, m, n, k = self.gemm_shape
        return 2 * b * m * n * k

    @property
    def mask_shape(self) -> tuple[int, ...]:
        """Static shape of the attention mask (empty when there is none)."""
        if not self.mask_map:
            return ()
        results = self.mask_map.split("->")[1].strip().strip("()")
        return tuple(self.loop_sizes[int(d.strip()[1:])] for d in results.split(",") if d.strip())

    @property
    def input_types(self) -> tuple[str, ...]:
        return self.element_types[:-1]

    @property
    def output_type(self) -> str:
        return self.element_types[-1]

    @property
    def bytes_moved(self) -> int:
        """Compulsory traffic: every operand read or written once, in bytes."""
        return int(
            sum(
                math.prod(shape) * element_bytes(t)
                for shape, t in zip(self.operand_shapes, self.element_types, strict=True)
            )
        )

    @property
    def attention_scale_type(self) -> str:
        """The element type of an attention's scale operand (the output's unless stated)."""
        return self.scale_type or self.output_type

    @property
    def key(self) -> str:
        """Stable, readable identifier used as the problem id in logs and datasets."""
        # The mask joins the digest only when present, so keys of unmasked problems never change.
        mask = [self.mask_map, self.mask_type] if self.mask_map else []
        scale = [f"scale:{self.scale_type}"] if self.scale_type else []  # likewise
        digest = hashlib.sha1(
            "|".join([*self.indexing_maps, repr(self.strides), repr(self.dilations), *mask,
                      *scale]).encode()
        ).hexdigest()[:8]
        shape = "x".join(str(s) for s in self.loop_sizes)
        return f"{self.kind}_{shape}_{'_'.join(self.element_types)}_{digest}"

    # ---- pooling -------------------------------------------------------------------------------
    @property
    def is_pooling(self) -> bool:
        """A pooling op (max, sum or average over a window; `linalg.pooling_*`, generalised by the
        time tuning specs match). IREE's convolution interface accepts it, but it has no channel
        loop: its channels are batch loops and its "filter" is a window of shape only."""
        return self.kind == "convolution" and not any(
            self.loops(c) for c in ("depth", "output_channel", "input_channel"))

    @property
    def kind_label(self) -> str:
        """The kind as shown to users: `kind`, or "pooling" (whose `kind` stays "convolution": it
        is part of the problem key in logs and datasets)."""
        return "pooling" if self.is_pooling else self.kind

    def class_label(self, dim_class: str) -> str:
        """A dimension class as shown to users: a pooling op's batch loops hold its channels too,
        and its filter loops are the window."""
        if self.is_pooling:
            return {"batch": "batch/channels", "filter_loop": "window"}.get(dim_class, dim_class)
        return dim_class

    def describe(self) -> str:
        """One human-readable line: kind, class sizes, types."""
        parts = []
        for dim_class in DIM_CLASSES[self.kind]:
            sizes = self.sizes(dim_class)
            if sizes:
                parts.append(f"{self.class_label(dim_class)}={'x'.join(map(str, sizes))}")
        if self.kind == "convolution":
            parts.append(f"strides={list(self.strides)} dilations={list(self.dilations)}")
        # A pooling window operand has a shape and no values: only the input's type is read.
        inputs = self.input_types[:1] if self.is_pooling else self.input_types
        types = "x".join(inputs) + "->" + self.output_type
        return f"{self.kind_label} {' '.join(parts)} {types}"

    def to_dict(self) -> dict[str, object]:
        """JSON-ready form (the record format of logs and datasets)."""
        return {
            "kind": self.kind,
            "loop_sizes": list(self.loop_sizes),
            "dims": {k: list(v) for k, v in self.dims.items()},
            "element_types": list(self.element_types),
            "operand_shapes": [list(s) for s in self.operand_shapes],
            "indexing_maps": list(self.indexing_maps),
            "strides": list(self.strides),
            "dilations": list(self.dilations),
            "op_name": self.op_name,
            "name": self.name,
            **({"mask_type": self.mask_type, "mask_map": self.mask_map} if self.mask_map else {}),
            **({"scale_type": self.scale_type} if self.scale_type else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Problem:
        """Inverse of `to_dict`; raises KeyError/TypeError/ValueError on malformed records."""

        def ints(value: object) -> tuple[int, ...]:
            if not isinstance(value, Sequence):
                raise TypeError(f"expected a list, got {value!r}")
            return tuple(int(v) for v in value)

        dims_raw = data["dims"]
        if not isinstance(dims_raw, Mapping):
            raise TypeError("dims must be a mapping")
        kind = str(data["kind"])
        if kind not in DIM_CLASSES:
            raise ValueError(f"unknown problem kind {kind!r}")
        shapes = data["operand_shapes"]
        types = data["element_types"]
        maps = data["indexing_maps"]
        if not (isinstance(shapes, list) and isinstance(types, list) and isinstance(maps, list)):
            raise TypeError("operand_shapes, element_types and indexing_maps must be lists")
        return cls(
            kind=kind,  # type: ignore[arg-type]
            loop_sizes=ints(data["loop_sizes"]),
            dims={str(k): ints(v) for k, v in dims_raw.items()},
            element_types=tuple(str(t) for t in types),
            operand_shapes=tuple(ints(s) for s in shapes),
            indexing_maps=tuple(str(m) for m in maps),
            strides=ints(data.get("strides", [])),
            dilations=ints(data.get("dilations", [])),
            mask_type=str(data.get("mask_type", "")),
            mask_map=str(data.get("mask_map", "")),
            scale_type=str(data.get("scale_type", "")),
            op_name=str(data.get("op_name", "linalg.generic")),
            name=str(data.get("name", "")),
        )

    # ---- unit-batch convolutions ---------------------------------------------------------------
    @property
    def unit_batch_conv(self) -> bool:
        """A 1-D, 2-D or 3-D convolution whose batch is 1: either batch-less (as IREE's spec
        matcher sees it, the unit loop folded away) or with one unit batch loop d0 (as codegen
        re-expands it)."""
        if self.kind != "convolution" or len(self.loops("output_image")) not in (1, 2, 3):
            return False
        if not (self.loops("depth") or (self.loops("input_channel") and self.loops("output_channel"))):
            return False  # pooling: IREE keeps its channels as batch
        batch = self.loops("batch")
        return not batch or (batch == (0,) and self.loop_sizes[0] == 1)

    def with_unit_batch(self) -> Problem:
        """The op llvm-cpu codegen makes of a batch-less convolution
        (`iree-codegen-insert-batch-dim-for-batchless-conv`): a unit loop d0 is prepended, the
        image and output operands get a leading unit dimension, the filter does not."""
        if self.loops("batch"):
            return self
        n = len(self.loop_sizes)
        names = [f"d{i}" for i in range(n + 1)]
        maps = []
        for i, text in enumerate(self.indexing_maps):
            exprs = re.sub(r"\bd(\d+)\b", lambda m: f"d{int(m.group(1)) + 1}", text.split("->")[1])
            exprs = exprs.strip(" ()")
            maps.append(_map_text(names, [exprs] if i == 1 else ["d0", exprs]))
        shapes = tuple(s if i == 1 else (1, *s) for i, s in enumerate(self.operand_shapes))
        return replace(
            self,
            loop_sizes=(1, *self.loop_sizes),
            dims={
                "batch": (0,),
                **{c: tuple(i + 1 for i in v) for c, v in self.dims.items() if c != "batch"},
            },
            operand_shapes=shapes,
            indexing_maps=tuple(maps),
        )

    def without_unit_batch(self) -> Problem:
        """Inverse of `with_unit_batch`: the batch-less op IREE's spec matcher sees."""
        if not self.loops("batch"):
            return self
        n = len(self.loop_sizes)
        names = [f"d{i}" for i in range(n - 1)]
        maps = []
        for text in self.indexing_maps:
            exprs = [e.strip() for e in text.split("->")[1].strip(" ()").split(",")]
            exprs = [e for e in exprs if e != "d0"]
            exprs = [re.sub(r"\bd(\d+)\b", lambda m: f"d{int(m.group(1)) - 1}", e) for e in exprs]
            maps.append(_map_text(names, exprs))
        shapes = tuple(s if i == 1 else s[1:] for i, s in enumerate(self.operand_shapes))
        return replace(
            self,
            loop_sizes=self.loop_sizes[1:],
            dims={
                "batch": (),
                **{c: tuple(i - 1 for i in v) for c, v in self.dims.items() if c != "batch"},
            },
            operand_shapes=shapes,
            indexing_maps=tuple(maps),
        )

    # ---- constructors --------------------------------------------------------------------------
    @classmethod
    def matmul(
        cls,
        m: int,
        n: int,
        k: int,
        lhs_type: str = "f32",
        rhs_type: str | None = None,
        out_type: str | None = None,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
    ) -> Problem:
        """C[m, n] += A[m, k] * B[k, n].

        `transpose_a` stores A as [k, m]; `transpose_b` stores B as [n, k].
        """
        return cls.batch_matmul(
            0,
            m,
            n,
            k,
            lhs_type,
            rhs_type,
            out_type,
            transpose_a=transpose_a,
            transpose_b=transpose_b,
        )

    @classmethod
    def batch_matmul(
        cls,
        batch: int,
        m: int,
        n: int,
        k: int,
        lhs_type: str = "f32",
        rhs_type: str | None = None,
        out_type: str | None = None,
        *,
        transpose_a: bool = False,
        transpose_b: bool = False,
    ) -> Problem:
        """Batched C[b, m, n] += A[b, m, k] * B[b, k, n]; `batch=0` means an unbatched matmul."""
        rhs_type = rhs_type or lhs_type
        out_type = out_type or _default_accumulator(lhs_type)
        for size in (m, n, k):
            _check_size(size)
        if batch:
            _check_size(batch)
        b = ["d0"] if batch else []
        off = 1 if batch else 0
        dm, dn, dk = (f"d{off}", f"d{off + 1}", f"d{off + 2}")
        loop_names = [*b, dm, dn, dk]
        lhs = [*b, dk, dm] if transpose_a else [*b, dm, dk]
        rhs = [*b, dn, dk] if transpose_b else [*b, dk, dn]
        out = [*b, dm, dn]
        size_of = dict(zip(loop_names, [batch, m, n, k][0 if batch else 1 :], strict=True))
        maps = tuple(_map_text(loop_names, exprs) for exprs in (lhs, rhs, out))
        shapes = tuple(tuple(size_of[d] for d in exprs) for exprs in (lhs, rhs, out))
        return cls(
            kind="contraction",
            loop_sizes=tuple(size_of[d] for d in loop_names),
            dims={"batch": (0,) if batch else (), "m": (off,), "n": (off + 1,), "k": (off + 2,)},
            element_types=(lhs_type, rhs_type, out_type),
            operand_shapes=shapes,
            indexing_maps=maps,
            op_name="linalg.batch_matmul" if batch else "linalg.matmul",
        )

    @classmethod
    def conv2d_nhwc_hwcf(
        cls,
        batch: int,
        out_h: int,
        out_w: int,
        in_channels: int,
        out_channels: int,
        kernel_h: int,
        kernel_w: int,
        input_type: str = "f32",
        filter_type: str | None = None,
        out_type: str | None = None,
        *,
        stride: int = 1,
        dilation: int = 1,
    ) -> Problem:
        """2-D convolution, NHWC input, HWCF filter, no padding (the input is sized to fit)."""
        filter_type = filter_type or input_type
        out_type = out_type or _default_accumulator(input_type)
        for size in (batch, out_h, out_w, in_channels, out_channels, kernel_h, kernel_w):
            _check_size(size)
        names = [f"d{i}" for i in range(7)]  # n, oh, ow, oc, kh, kw, ic
        in_h = (out_h - 1) * stride + (kernel_h - 1) * dilation + 1
        in_w = (out_w - 1) * stride + (kernel_w - 1) * dilation + 1
        lhs = [
            "d0",
            _conv_expr("d1", "d4", stride, dilation),
            _conv_expr("d2", "d5", stride, dilation),
            "d6",
        ]
        rhs = ["d4", "d5", "d6", "d3"]
        out = ["d0", "d1", "d2", "d3"]
        return cls(
            kind="convolution",
            loop_sizes=(batch, out_h, out_w, out_channels, kernel_h, kernel_w, in_channels),
            dims={
                "batch": (0,),
                "output_image": (1, 2),
                "output_channel": (3,),
                "filter_loop": (4, 5),
                "input_channel": (6,),
                "depth": (),
            },
            element_types=(input_type, filter_type, out_type),
            operand_shapes=(
                (batch, in_h, in_w, in_channels),
                (kernel_h, kernel_w, in_channels, out_channels),
                (batch, out_h, out_w, out_channels),
            ),
            indexing_maps=tuple(_map_text(names, e) for e in (lhs, rhs, out)),
            strides=(stride, stride),
            dilations=(dilation, dilation),
            op_name="linalg.conv_2d_nhwc_hwcf",
        )

    @classmethod
    def attention(
        cls,
        batch: int,
        m: int,
        n: int,
        k1: int,
        k2: int,
        element_type: str = "f16",
        *,
        mask_type: str = "",
    ) -> Problem:
        """softmax(Q K^T * scale) V with Q [b, m, k1], K [b, k2, k1], V [b, k2, n], O [b, m, n].

        `mask_type` (e.g. "i1", as SDPA's boolean masks) adds a mask [b, m, k2].
        """
        for size in (batch, m, n, k1, k2):
            _check_size(size)
        names = ["d0", "d1", "d2", "d3", "d4"]  # b, m, n, k1, k2
        exprs = (["d0", "d1", "d3"], ["d0", "d4", "d3"], ["d0", "d4", "d2"], ["d0", "d1", "d2"])
        return cls(
            kind="attention",
            loop_sizes=(batch, m, n, k1, k2),
            dims={"batch": (0,), "m": (1,), "n": (2,), "k1": (3,), "k2": (4,)},
            element_types=(element_type,) * 4,
            operand_shapes=((batch, m, k1), (batch, k2, k1), (batch, k2, n), (batch, m, n)),
            indexing_maps=tuple(_map_text(names, e) for e in exprs),
            mask_type=mask_type,
            mask_map=_map_text(names, ["d0", "d1", "d4"]) if mask_type else "",
            op_name="iree_linalg_ext.attention",
        )

    # ---- rendering -----------------------------------------------------------------------------
    def to_mlir(self, func_name: str = "main") -> str:
        """A compilable MLIR function computing this op on its inputs (zero-initialised output)."""
        tensor = [
            _tensor_type(s, t) for s, t in zip(self.operand_shapes, self.element_types, strict=True)
        ]
        args = ", ".join(f"%arg{i}: {tensor[i]}" for i in range(len(tensor) - 1))
        mask_t = _tensor_type(self.mask_shape, self.mask_type) if self.mask_map else ""
        if mask_t:
            args += f", %mask: {mask_t}"
        out_t = tensor[-1]
        maps = ", ".join(f"affine_map<{m}>" for m in self.indexing_maps)
        lines = [f"func.func @{func_name}({args}) -> {out_t} {{"]
        out_elem = self.output_type
        if self.kind == "attention":
            scale = 1.0 / math.sqrt(self.size("k1"))
            q, k, v, o = self.indexing_maps
            loop_dims = o.split("->")[0].strip()
            lines += [
                f"  %scale = arith.constant {scale:.6e} : {self.attention_scale_type}",
                f"  %empty = tensor.empty() : {out_t}",
                "  %out = iree_linalg_ext.attention <{indexing_maps = ["
                f"affine_map<{q}>, affine_map<{k}>, affine_map<{v}>, "
                f"affine_map<{loop_dims} -> ()>, "
                + (f"affine_map<{self.mask_map}>, " if mask_t else "")
                + f"affine_map<{o}>]}}>",
                f"      ins(%arg0, %arg1, %arg2, %scale{', %mask' if mask_t else ''} : "
                f"{tensor[0]}, {tensor[1]}, {tensor[2]}, {self.attention_scale_type}"
                f"{', ' + mask_t if mask_t else ''}) "
                f"outs(%empty : {out_t}) {{",
                "    ^bb0(%score: f32):",
                "      iree_linalg_ext.yield %score : f32",
                f"  }} -> {out_t}",
            ]
        else:
            zero = "0.0" if _is_float(out_elem) else "0"
            n_loops = len(self.loop_sizes)
            iterators = ", ".join(
                '"reduction"' if i in self.reduction_loops() else '"parallel"'
                for i in range(n_loops)
            )
            ins = ", ".join(f"%arg{i}" for i in range(len(tensor) - 1))
            in_types = ", ".join(tensor[:-1])
            lines += [
                f"  %zero = arith.constant {zero} : {out_elem}",
                f"  %empty = tensor.empty() : {out_t}",
                f"  %acc = linalg.fill ins(%zero : {out_elem}) outs(%empty : {out_t}) -> {out_t}",
                f"  %out = linalg.generic {{indexing_maps = [{maps}], iterator_types = [{iterators}]}}",
                f"      ins({ins} : {in_types}) outs(%acc : {out_t}) {{",
                f"  ^bb0(%a: {self.element_types[0]}, %b: {self.element_types[1]}, %c: {out_elem}):",
                *_mul_add_body(self.element_types[0], self.element_types[1], out_elem),
                f"  }} -> {out_t}",
            ]
        lines += [f"  return %out : {out_t}", "}", ""]
        return "\n".join(lines)

    def reduction_loops(self) -> set[int]:
        """Indices of the op's reduction loops (the others are parallel)."""
        reduction_classes = {
            "contraction": ("k",),
            "convolution": ("filter_loop", "input_channel"),
            "attention": ("k1", "k2"),
        }[self.kind]
        return {i for c in reduction_classes for i in self.loops(c)}


def _default_accumulator(input_type: str) -> str:
    if _is_float(input_type):
        return "f32"
    return "i32"


def _check_size(size: int) -> None:
    if not isinstance(size, int) or size <= 0:
        raise ValueError(f"dimension sizes must be positive integers, got {size!r}")


def _conv_expr(out_dim: str, filter_dim: str, stride: int, dilation: int) -> str:
    lhs = out_dim if stride == 1 else f"{out_dim} * {stride}"
    rhs = filter_dim if dilation == 1 else f"{filter_dim} * {dilation}"
    return f"{lhs} + {rhs}"


def _map_text(loop_names: Sequence[str], exprs: Sequence[str]) -> str:
    return f"({', '.join(loop_names)}) -> ({', '.join(exprs)})"


def _tensor_type(shape: Sequence[int], element_type: str) -> str:
    return f"tensor<{'x'.join(str(s) for s in shape)}x{element_type}>"


def _mul_add_body(lhs: str, rhs: str, out: str) -> list[str]:
    """Body of a generic contraction: extend both inputs to the accumulator type, multiply-add."""
    lines = []
    names = []
    for name, t in (("a", lhs), ("b", rhs)):
        if t == out:
            names.append(f"%{name}")
            continue
        if _is_float(out):
            op = "arith.extf" if element_bytes(t) < element_bytes(out) else "arith.truncf"
        else:
            op = "arith.extsi" if element_bytes(t) < element_bytes(out) else "arith.trunci"
        lines.append(f"    %{name}x = {op} %{name} : {t} to {out}")
        names.append(f"%{name}x")
    mul, add = ("arith.mulf", "arith.addf") if _is_float(out) else ("arith.muli", "arith.addi")
    lines += [
        f"    %p = {mul} {names[0]}, {names[1]} : {out}",
        f"    %s = {add} %c, %p : {out}",
        f"    linalg.yield %s : {out}",
    ]
    return lines
