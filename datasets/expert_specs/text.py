"""Text helpers of the spec reader: named sequences, balanced brackets, aliases, affine maps,
intrinsic names, and the one MLIR context attribute reads share."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from dispatchtune.errors import InputError
from dispatchtune.targets import intrinsic_shape

_SEQUENCE = re.compile(r"transform\.named_sequence\s+@(\w+)\s*\(")


#: `#attr = ...` and `!type = ...` aliases (specs name the tensor types of their matchers too).
_ALIAS = re.compile(r"^([#!]\w+)\s*=\s*(.*)$", re.MULTILINE)


_MAP = re.compile(r"affine_map<\(([^)]*)\)\s*->\s*\(([^)]*)\)>")


_MAP_TEXT = re.compile(r"affine_map<\([^)]*\)\s*->\s*\([^)]*\)>")


_TENSOR = re.compile(r"tensor<([^>]*)>")


_OLD_INTRINSIC = re.compile(r"^(MFMA|WMMA)_([A-Z0-9]+)_(\d+x\d+x\d+)_([A-Z0-9]+)$")


_COMMENT = re.compile(r"//[^\n]*")


#: A sequence's result types (a matcher yields (op, configuration): a transform param).
_RESULTS = re.compile(r"\)\s*->\s*\(([^)]*)\)\s*\{")


#: Aliases may expand a file at most this many times its size (a hostile file could nest them).
_ALIAS_GROWTH = 16


def _balanced(text: str, start: int) -> str:
    """The `<...>` group opening at or after `start` (arrows `->` are not brackets)."""
    begin = text.find("<", start)
    if begin < 0:
        raise InputError("no '<' after a tuning spec attribute name")
    depth = 0
    i = begin
    while i < len(text):
        ch = text[i]
        if ch == "<":
            depth += 1
        elif ch == ">" and text[i - 1] != "-":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
        i += 1
    raise InputError("unbalanced '<' in a tuning spec attribute")


def _sequences(text: str) -> Iterator[tuple[str, str]]:
    """(name, body) of every named sequence, body up to the next sequence."""
    starts = list(_SEQUENCE.finditer(text))
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        yield match.group(1), text[match.start() : end]


def _resolve_aliases(text: str) -> str:
    """Inline `#name = attr` aliases (IREE's printer uses them for compilation_info) and
    `!name = type` ones."""
    aliases = dict(_ALIAS.findall(text))
    body = _ALIAS.sub("", text)
    if not aliases:
        return body
    pattern = re.compile("|".join(re.escape(n) for n in sorted(aliases, key=len, reverse=True))
                         + r"(?![\w])")

    limit = _ALIAS_GROWTH * max(len(text), 1024)
    grown = [0]

    def expand(match: re.Match[str]) -> str:
        value = aliases[match.group(0)]
        grown[0] += len(value)  # checked as it grows: nested aliases could exhaust memory
        if grown[0] > limit:
            raise InputError(f"attribute aliases expand the spec beyond {_ALIAS_GROWTH}x its size")
        return value

    for _ in range(4):  # aliases refer to aliases (compilation -> translation)
        body = pattern.sub(expand, body)
    return body


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in re.findall(r"-?\d+", text))


def _loops(expr_list: str) -> tuple[int, ...]:
    return tuple(int(d) for d in re.findall(r"d(\d+)", expr_list))


def current_intrinsic(name: str) -> str:
    """Map an older intrinsic name to IREE 3.13's: 2024's input-type-first order
    (`MFMA_F16_16x16x16_F32`), and RDNA3's WMMA before it was renamed `WMMAR3`."""
    match = _OLD_INTRINSIC.match(name)
    if not match:
        return name
    family, first, shape, last = match.groups()
    # Old names put the input type first; current ones put the accumulator first.
    if not (first in {"F32", "I32"} and last not in {"F32", "I32"}):
        first, last = last, first
    # `WMMA_*_16x16x16_*` was RDNA3's until RDNA4's arrived as `WMMAR4` (early 2025); 3.13's
    # `WMMA_` names are gfx1250's, none of them 16x16x16.
    if family == "WMMA" and shape == "16x16x16":
        family = "WMMAR3"
    return f"{family}_{first}_{shape}_{last}"


def _mma_shape(intrinsic: str) -> tuple[int, int, int]:
    shape = intrinsic_shape(intrinsic)
    if shape is None:
        raise InputError(f"cannot read the shape of intrinsic {intrinsic!r}")
    return shape


def _config_text(body: str) -> str | None:
    at = body.find("#iree_codegen.compilation_info<")
    return _balanced(body, at) if at >= 0 else None


@functools.lru_cache(maxsize=1)
def _context() -> Any:
    """One MLIR context for every attribute read (creating one registers IREE's dialects: ~10
    ms); parse failures leave it usable."""
    from iree.compiler import ir

    return ir.Context()
