"""Spec files and directories read as a hostile reader would: every matcher becomes an
`ExpertEntry` or is skipped with a reason; the product and partition mode a file's name states."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from dispatchtune.datasets.expert_specs.configs import (
    _parse_2024,
    _parse_attention,
    _parse_current,
    expert_columns,
)
from dispatchtune.datasets.expert_specs.entries import ExpertEntry
from dispatchtune.datasets.expert_specs.problems import (
    _attention_problems,
    _matcher_problem,
    _named_attention_problem,
)
from dispatchtune.datasets.expert_specs.text import (
    _COMMENT,
    _RESULTS,
    _config_text,
    _resolve_aliases,
    _sequences,
)
from dispatchtune.errors import InputError


def _reason(exc: BaseException) -> str:
    """An exception as one short line (MLIR parse errors quote the whole text: their message
    follows the last `":line:column: `)."""
    message = str(exc)
    located = re.findall(r'":\d+:\d+: ([^\n]*)', message)
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = located[-1] if located else lines[-1] if lines else ""
    prefix = "" if isinstance(exc, InputError) else f"{type(exc).__name__}: "
    return (prefix + text)[:160]


#: An AMD GPU product in a spec file's name, not inside a longer word: Instinct (`_mi308`,
#: `mi300x_`: digits, then an optional variant letter) or Radeon (`_rx7900xtx`, `_w7900`,
#: `_r9700`).
_PRODUCT_IN_NAME = re.compile(
    r"(?<![a-z0-9])(?:mi(\d{3})([a-z]?)|((?:rx|w|r)\d{4}(?:xtx|xt|gre)?))(?![a-z0-9])")


#: An AMD GPU architecture in a spec file's name (`_gfx942_qpx`, `gfx1100_`).
_ARCHITECTURE_IN_NAME = re.compile(r"(?<![a-z0-9])(gfx\d{2,4}[a-z]?)(?![a-z0-9])")


def _name_words(file: str) -> str:
    return Path(file).stem.lower().replace("-", "_")


def named_product(file: str) -> str | None:
    """The GPU product a spec file's name says it was tuned for, as an IREE target name
    (`iree_testsuite_unet_fp16_mi308.mlir` -> `rocm:mi308x`; no variant letter means the X
    part; `sdxl_rx7900xtx.mlir` -> `rocm:rx7900xtx`), or None. Products of one architecture
    share its space but not its CU count, which the features that count waves per CU need."""
    found = _PRODUCT_IN_NAME.search(_name_words(file))
    if found is None:
        return None
    return f"rocm:mi{found[1]}{found[2] or 'x'}" if found[1] else f"rocm:{found[3]}"


def named_architecture(file: str) -> str | None:
    """The GPU architecture a spec file's name states (`..._gfx942_qpx_MI325.mlir` -> `gfx942`),
    or None."""
    found = _ARCHITECTURE_IN_NAME.search(_name_words(file))
    return found[1] if found else None


#: AMD Instinct compute-partition modes: how many GPUs one device is split into (its XCDs shared
#: evenly), so a spec tuned in QPX mode saw a quarter of the product's CUs.
PARTITION_MODES = {"spx": 1, "dpx": 2, "qpx": 4, "cpx": 8}


def named_partitions(file: str) -> int:
    """The compute-partition count a spec file's name states (`..._mi300_qpx.mlir` -> 4), else 1."""
    words = re.split(r"[^a-z0-9]+", _name_words(file))
    return next((PARTITION_MODES[w] for w in words if w in PARTITION_MODES), 1)


def load_spec_file(path: str | Path) -> list[ExpertEntry]:
    """Every matcher of one spec file, in file order: an entry with its configuration, or one
    saying why it was skipped; a file with no matcher at all is one skipped entry (matcher `*`),
    so that it is reported rather than missing. Only an unreadable file raises (`InputError`)."""
    path = Path(path)
    try:
        raw = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read tuning spec {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise InputError(f"tuning spec {path} is not UTF-8 text (byte {exc.start})") from exc
    # Comments go first: a commented-out configuration is not the expert's.
    text = _resolve_aliases(_COMMENT.sub("", raw))
    sequences = list(_sequences(text))
    helpers = {n: b for n, b in sequences if "compilation_info" not in b}
    entries = []
    for name, body in sequences:
        try:
            entries += _sequence_entries(path.name, name, body, helpers)
        except Exception as exc:  # a hostile file: whatever breaks, this matcher alone is skipped
            entries.append(ExpertEntry(path.name, name, skipped=f"unreadable matcher: {_reason(exc)}"))
    if not entries:
        # Not MLIR, a transform library without matchers, or a form no sequence of which yields
        # a configuration: said once for the file.
        what = ("no transform.named_sequence" if not sequences
                else "no named sequence yields a configuration")
        return [ExpertEntry(path.name, "*", skipped=f"no tuning matcher: {what}")]
    return _without_repeats(entries, _application_order(text))


def _application_order(text: str) -> dict[str, int]:
    """Position of each matcher in the file's `foreach_match` lists (`@match -> @apply`): IREE
    gives a dispatch the configuration of the first matcher that matches it."""
    order: dict[str, int] = {}
    for name in re.findall(r"@([\w.$-]+)\s*->\s*@[\w.$-]+", text):
        order.setdefault(name, len(order))
    return order


def _without_repeats(entries: list[ExpertEntry], order: Mapping[str, int]) -> list[ExpertEntry]:
    """One entry per dispatch of a file: the matcher IREE applies to it, the first in `order`
    (then file order). A file may match one op twice: with one configuration (attention in both
    forms, as dispatchtune's own specs do) or with two (a general matcher after specific ones);
    the other matchers are skipped, saying which one wins."""
    def rank(item: tuple[int, ExpertEntry]) -> tuple[int, int]:
        return order.get(item[1].matcher.split("[", 1)[0], len(order)), item[0]

    applied: dict[str, ExpertEntry] = {}
    for _, entry in sorted(enumerate(entries), key=rank):
        if entry.problem is not None and entry.config is not None:
            applied.setdefault(entry.problem.key, entry)
    kept = []
    for entry in entries:
        first = applied.get(entry.problem.key) if entry.problem is not None else None
        if first is not None and first is not entry and entry.config is not None:
            reason = ("same dispatch and configuration as an earlier matcher"
                      if first.config == entry.config else
                      f"shadowed: IREE applies {first.matcher.split('[', 1)[0]} to this dispatch")
            entry = ExpertEntry(entry.file, entry.matcher, entry.problem, skipped=reason)
        kept.append(entry)
    return kept


#: A matcher of an attention op: IREE's match op, the op's name or the op in a DAG (either form).
_ATTENTION_MATCHER = re.compile(
    r"transform\.iree\.match\.(online_)?attention\b|\biree_linalg_ext\.(online_)?attention\b")


def _sequence_entries(
    file: str, name: str, body: str, helpers: Mapping[str, str]
) -> list[ExpertEntry]:
    """The entries of one named sequence: none for helpers (no configuration yielded)."""
    config_text = _config_text(body)
    results = _RESULTS.search(body)
    yields_config = bool(results and "!transform.any_param" in results.group(1))
    # The op may be matched by an included helper (IREE's 2024-2025 default specs match any
    # f16 attention in a helper and check its operand shapes in the matcher).
    include = re.search(r"transform\.include\s+@(\w+)", body)
    helper = helpers.get(include.group(1), "") if include else ""
    attention = _ATTENTION_MATCHER.search(body) or _ATTENTION_MATCHER.search(helper)
    if attention and (config_text is not None or "TransformDialectCodegen" in body):
        return _attention_entries(file, name, f"{body}\n{helper}", config_text or "")
    if config_text is None:
        if yields_config:
            return [ExpertEntry(file, name, skipped="no compilation_info constant in the matcher")]
        return []  # a helper (op matcher, apply/entry sequence): no configuration of its own
    if "TransformDialectCodegen" in config_text:
        return [ExpertEntry(file, name, skipped="transform-dialect script, no config")]
    if "lowering_strategy" in config_text:
        # e.g. `cast_and_call_pingpong_matmul`: the op is replaced by a hand-written kernel.
        return [ExpertEntry(file, name, skipped="custom lowering strategy, not a configuration "
                            "of the space")]
    return [_entry(file, name, body, config_text, helpers)]


def _attention_entries(file: str, name: str, body: str, config_text: str) -> list[ExpertEntry]:
    """One entry per SDXL attention shape the matcher accepts (or one entry saying why not)."""
    decomposition = re.search(r"transform\.param\.constant\s*(\{.*?\})\s*->\s*!transform",
                              body, re.DOTALL)
    if "TransformDialectCodegen" in body or decomposition is None:
        return [ExpertEntry(file, name, skipped="attention: transform-dialect script, no config")]
    try:
        named = _named_attention_problem(body, name)
        problems = [named] if named is not None else _attention_problems(body, name)
    except Exception as exc:  # any rebuild failure is reported for this matcher alone
        return [ExpertEntry(file, name, skipped=f"cannot rebuild the op: {_reason(exc)}")]
    if not problems:
        return [ExpertEntry(file, name, skipped="attention: matches none of the SDXL shapes")]
    entries = []
    for problem in problems:
        # A shape-free matcher stands for several dispatches: each entry names its shape.
        label = name if named is not None else f"{name}[{'x'.join(map(str, problem.loop_sizes))}]"
        try:
            config = _parse_attention(config_text, decomposition.group(1), problem)
            entry = ExpertEntry(file, label, problem, config)
            expert_columns(entry)
        except Exception as exc:  # any parse failure is reported for this matcher alone
            entries.append(ExpertEntry(file, label, problem,
                                       skipped=f"cannot read config: {_reason(exc)}"))
            continue
        entries.append(entry)
    return entries


def _entry(
    file: str, name: str, body: str, config_text: str, helpers: Mapping[str, str]
) -> ExpertEntry:
    try:
        problem = _matcher_problem(body, name, helpers)
    except Exception as exc:  # any rebuild failure is reported for this matcher alone
        return ExpertEntry(file, name, skipped=f"cannot rebuild the op: {_reason(exc)}")
    if problem is None:
        return ExpertEntry(file, name, skipped=_unsupported(body, helpers))
    try:
        if "tile_sizes" in config_text:
            config = _parse_2024(config_text, problem)
        else:
            config = _parse_current(config_text, problem)
        entry = ExpertEntry(file, name, problem, config)
        expert_columns(entry)  # a usable entry must describe itself in candidate terms
    except Exception as exc:  # any parse failure is reported for this matcher alone
        return ExpertEntry(file, name, problem=problem, skipped=f"cannot read config: {_reason(exc)}")
    if problem.kind == "contraction" and problem.loops("batch"):
        return ExpertEntry(file, name, problem, config, notes=("batch matmul",))
    return entry


def _unsupported(body: str, helpers: Mapping[str, str]) -> str:
    """Why `_matcher_problem` found no op it rebuilds in a matcher (one line)."""
    if "attention" in body:
        return "unsupported matcher form: an attention matcher matching neither form of the op"
    include = re.search(r"transform\.include\s+@(\w+)", body)
    if include and include.group(1) not in helpers:
        return f"unsupported matcher form: includes @{include.group(1)}, not in the file"
    fused = re.search(r"%\w+:(\d+)\s*=\s*linalg\.generic", body)
    if fused:
        # One LHS against several RHS (int8 punet's Q/K/V projections); measured on IREE 3.13:
        # `--iree-codegen-emit-pipeline-constraints` emits no constraints op for such a root.
        return (f"horizontally fused contraction: {fused.group(1)} outputs, no space (IREE 3.13 "
                "emits no constraints for it)")
    ops = re.findall(r"=\s*(linalg\.\w+|iree_linalg_ext\.\w+)", body)
    if ops:
        return f"unsupported matcher form: root op {ops[-1]}"
    return "unsupported matcher form: no contraction, convolution or attention matched"


def skip_reasons(entries: Iterable[ExpertEntry]) -> Counter[str]:
    """Skipped matchers per reason (the reason up to its first ':', details dropped)."""
    return Counter(e.skipped.split(":", 1)[0] for e in entries if not e.usable)


def load_spec_dir(directory: str | Path) -> list[ExpertEntry]:
    """Every expert entry of every `*.mlir` spec file in a directory (sorted by file name), or of
    one spec file; a file that cannot be read at all is one skipped entry (matcher `*`), not an
    error."""
    directory = Path(directory)
    files = [directory] if directory.is_file() else sorted(directory.glob("*.mlir"))
    if not files:
        raise InputError(f"no .mlir tuning specs in {directory}")
    entries = []
    for path in files:
        try:
            entries += load_spec_file(path)
        except InputError as exc:
            entries.append(ExpertEntry(path.name, "*", skipped=f"unreadable file: {exc}"))
    return entries
