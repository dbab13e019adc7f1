"""Where do expert-tuned GPU configurations land in a candidate order?

For every matcher of every tuning spec in a directory, or of one spec file (see
`dispatchtune.datasets.expert_specs`), rebuild the dispatch, enumerate its space on the GPU the
file was tuned for (`file_architecture`: gfx942 unless the file's name or intrinsics say another
CDNA or an RDNA GPU), find the expert configuration by meaning (pipeline, intrinsic, workgroup
tiles, K tile, subgroup counts, workgroup threads) and report its position in each order: the
expected position over tie-breaks (1 + candidates scored higher + half the other candidates
scored equal), position / N, or which attribute leaves it out of the space and which of IREE's
constraints exclude it (`search.gpu_space.violated_constraints`). IREE's own default
configuration of each dispatch (what `iree-compile` applies without a spec) is found the same way
and placed in each order, for comparison. Enumerations and defaults are cached (pickled
candidate tables, JSON) in --cache.

`--target` enumerates, featurises and compiles the defaults for one GPU for every file (`gfx950`,
`gfx90a`, ...): how an order trained on gfx942 transfers to an architecture without expert files,
judged by IREE's default for that GPU and by the experts that are valid there.

Usage:
  python benchmarks/expert_order.py /work/shared/data/expert_specs -o out/expert_order \\
      [--orders model,heuristic,random,shipped] [--files punet,flux] [--cache /tmp/expert_order_cache]
      [--no-heuristic-filters] [--target gfx950] [--model FILE]
`--model FILE` ranks the `model` order with that model file instead of the installed prior (a
candidate prior, before it is installed).
Writes report.md (per file and per op kind), positions.csv and positions.png to the output dir.
"""

from __future__ import annotations

import argparse
import functools
import math
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dispatchtune.datasets.expert_specs import (
    ExpertConfig,
    ExpertEntry,
    expert_columns,
    gemm_classes,
    load_spec_dir,
    named_architecture,
    named_partitions,
    named_product,
)
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem
from dispatchtune.search.gpu import iree_default_columns as gpu_default_columns
from dispatchtune.search.gpu_space import GpuSpace, gpu_spaces, violated_constraints
from dispatchtune.targets import Target, get_target

if TYPE_CHECKING:
    from dispatchtune.costmodel.base import CostModel

TARGET = "gfx942"
#: Bump when enumeration changes candidate-table columns or rows: `candidate_table`'s cache is
#: keyed by it (3: attention K2 tiles below the Q x K^T intrinsic's N dropped; loops a dispatch
#: keeps that IREE collapses alone tiled out; 4: implicit-GEMM rows of grouped convolutions,
#: contractions with loops below the intrinsic enumerated; 5: `default_match`).
TABLE_VERSION = 5
#: Attributes checked in this order when an expert configuration is not in the space.
MATCH_COLUMNS = (
    "pipeline", "intrinsic", "tile_b", "tile_m", "tile_n", "tile_k", "subgroups_m", "subgroups_n",
    "workgroup_threads",
)
#: Scores one candidate table; the target is the chip the expert tuned for (its features).
Scorer = Callable[[Problem, pd.DataFrame, Target], np.ndarray]


def feature_target(file: str, enumerated: str = TARGET) -> Target:
    """The target whose features describe a spec file's experts on the `enumerated` GPU: the
    product its name states when that is a product of the enumerated architecture
    (`..._mi308.mlir`: MI308X, 80 CUs, not MI300X's 304), else the enumerated target, with its
    CUs split when the name states a compute-partition mode (`_qpx`: a quarter). Products and
    partitions of one architecture share IREE's space, so enumeration stays on the architecture."""
    import dataclasses

    from dispatchtune.errors import TargetError

    base = get_target(enumerated)
    target = base
    product = named_product(file)
    if product is not None:
        try:
            named = get_target(product)
            if named.gpu_facts().arch == base.gpu_facts().arch:
                target = named
        except TargetError:
            pass  # a name IREE does not know: the architecture's flagship
    partitions = named_partitions(file)
    if partitions == 1:
        return target
    # One partition is a GPU of that many CUs (an architecture name gives IREE no CU count of
    # its own, so the fallback is the count).
    compute_units = max(target.gpu_facts().compute_units // partitions, 1)
    return dataclasses.replace(
        base, compute_units_fallback=compute_units,
        description=f"{target.name}, 1 of {partitions} compute partitions ({compute_units} CUs)")


#: Architectures a spec file may be tuned for, in the order `file_architecture` tries them:
#: CDNA (MFMA) first, the Instinct GPUs the shared files were tuned on, then RDNA (WMMA).
ARCHITECTURES = ("gfx942", "gfx950", "gfx90a", "gfx908", "gfx1100", "gfx1201", "gfx1250")


def file_architecture(file: str, entries: Sequence[ExpertEntry]) -> str:
    """The GPU architecture a spec file was tuned for: that of the product its name states
    (`..._mi355x.mlir`: gfx950; `..._rx7900xtx.mlir`: gfx1100), else the architecture it names
    (`..._gfx1201.mlir`), else the first of `ARCHITECTURES` whose IREE intrinsics hold every
    intrinsic its experts use (gfx942 when none does). A gfx950 file enumerated on gfx942 would
    find its double-K intrinsics outside the space, an RDNA file every expert."""
    from dispatchtune.errors import TargetError

    for name in (named_product(file), named_architecture(file)):
        if name is None:
            continue
        try:
            return get_target(name).gpu_facts().arch
        except TargetError:
            pass  # a name IREE does not know: read the intrinsics
    used = {name for entry in entries if entry.file == file and entry.config is not None
            for name in (entry.config.intrinsic, entry.config.pv_intrinsic) if name}
    for arch in ARCHITECTURES:
        if used <= set(get_target(arch).gpu_facts().mma_intrinsics):
            return arch
    return TARGET


def heuristic_scores(problem: Problem, table: pd.DataFrame, target: Target) -> np.ndarray:
    from dispatchtune.costmodel.heuristic import HeuristicModel
    from dispatchtune.features import extract_features

    return HeuristicModel().predict(extract_features(problem, target, table))


def random_scores(problem: Problem, table: pd.DataFrame, target: Target) -> np.ndarray:
    return np.zeros(len(table))  # all tied: the expected position is (N + 1) / 2


@functools.cache
def _installed_model(target_name: str) -> CostModel:
    """The model `rank` and `tune` use by default on a target (loaded once per process, not per
    dispatch)."""
    from dispatchtune.costmodel.defaults import model_for_target

    return model_for_target(target_name)[0]


def _scores_of(model: CostModel, problem: Problem, table: pd.DataFrame,
               target: Target) -> np.ndarray:
    """`model`'s score of every candidate of `table`, featurised for `target`."""
    from dispatchtune.features import extract_features

    features = extract_features(problem, target, table)
    return np.asarray(model.predict_candidates(features, table))


def _installed_scores(model_target: str, problem: Problem, table: pd.DataFrame,
                      target: Target) -> np.ndarray:
    return _scores_of(_installed_model(model_target), problem, table, target)


def model_scores(problem: Problem, table: pd.DataFrame, target: Target) -> np.ndarray:
    """The installed gfx942 default model (the pairwise prior: trained on these very files)."""
    return _installed_scores(TARGET, problem, table, target)


def shipped_scores(problem: Problem, table: pd.DataFrame, target: Target) -> np.ndarray:
    """The order `rank` and `tune` use by default on the file's GPU: its installed model (the
    gfx942 prior on every CDNA GPU, so `model` there), else the heuristic (RDNA, NVIDIA)."""
    return _installed_scores(target.name, problem, table, target)


SCORERS: dict[str, Scorer] = {
    "heuristic": heuristic_scores, "random": random_scores, "model": model_scores,
    "shipped": shipped_scores,
}


def model_file_scorer(path: Path) -> Scorer:
    """A scorer ranking with the model file at `path` (loaded once)."""
    from dispatchtune.costmodel.modelfile import load_cost_model

    return functools.partial(_scores_of, load_cost_model(path))


def cache_stem(problem: Problem, target: str) -> str:
    """A problem's name in the cache: gfx942 files keep the names they always had."""
    return problem.key if target == TARGET else f"{problem.key}.{target}"


def candidate_table(problem: Problem, cache: Path, heuristic_filters: bool = True,
                    waves_per_eu: Sequence[int] = (), target: str = TARGET) -> pd.DataFrame:
    """The candidate table of a problem on a target (gfx942 unless named; cached: enumeration
    compiles and solves), with the `amdgpu-waves-per-eu` knob crossed in when `waves_per_eu`
    lists values."""
    from dispatchtune.search import enumerate_candidates

    # The version names the table's columns: a table cached before a column was added is rebuilt.
    stem = cache_stem(problem, target)
    path = cache / f"{stem}{'' if heuristic_filters else '.whole'}.v{TABLE_VERSION}.pkl"
    if path.exists():
        with path.open("rb") as f:
            table: pd.DataFrame = pickle.load(f)  # our own cache, written below
    else:
        table = enumerate_candidates(problem, get_target(target),
                                     heuristic_filters=heuristic_filters).table
        cache.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            pickle.dump(table, f)
    if waves_per_eu:  # the knob is independent of IREE's: every row once per value
        table = pd.concat([table.assign(waves_per_eu=w) for w in waves_per_eu], ignore_index=True)
    return table


def iree_default_columns(problem: Problem, cache: Path, target: str = TARGET) -> dict[str, object]:
    """IREE's own default configuration of a problem on a target, as candidate-table columns
    (what `iree-compile` applies without a spec; cached per problem and target), or
    `{"error": reason}` when IREE's applied config cannot be read or related to the table."""
    import json
    import tempfile

    from dispatchtune.datasets.expert_specs import configuration_columns
    from dispatchtune.ir.spec import applied_configs

    path = cache / f"{cache_stem(problem, target)}.default.json"
    if not path.exists():
        # Read from the module IREE's constraints come with where it can (no compile).
        columns = gpu_default_columns(problem, get_target(target))
        if columns is None:
            with tempfile.TemporaryDirectory() as tmp:
                source = Path(tmp) / "op.mlir"
                source.write_text(problem.to_mlir())
                try:
                    texts = applied_configs(source, get_target(target), None)
                    columns = (dict(configuration_columns(texts[0], problem))
                               if texts else {"error": "IREE applied no config"})
                except (DispatchTuneError, ValueError, IndexError) as exc:
                    columns = {"error": str(exc) or type(exc).__name__}
        cache.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(columns))
    columns = json.loads(path.read_text())
    return columns if columns else {"error": "IREE applied no config"}


def iree_default_mask(problem: Problem, table: pd.DataFrame, cache: Path,
                      target: str = TARGET) -> tuple[np.ndarray, str]:
    """Rows equal to IREE's default configuration of the problem, and (if none) why."""
    columns = iree_default_columns(problem, cache, target)
    if "error" in columns:
        return np.zeros(len(table), dtype=bool), str(columns["error"])
    return expert_mask(table, columns)  # type: ignore[arg-type]  # JSON of table values


def expert_mask(table: pd.DataFrame, expert: dict[str, int | str]) -> tuple[np.ndarray, str]:
    """Rows equal to the expert configuration, and (if none) the first attribute that fails."""
    mask = np.ones(len(table), dtype=bool)
    # Attention also names its value-head (N) workgroup tile, seen only through the workgroups,
    # and its P x V intrinsic; convolutions their lowering (direct or implicit GEMM) and how M
    # splits over the image; waves-per-eu counts when the space enumerates it (`measure` then
    # names it).
    optional = [c for c in ("workgroups", "pv_intrinsic", "igemm", "tile_oh", "tile_ow",
                            "waves_per_eu") if c in expert and c in table]
    for column in (*MATCH_COLUMNS, *optional):
        narrowed = mask & (table[column].to_numpy() == expert[column])
        if not narrowed.any():
            near = sorted({v for v in table.loc[mask, column].tolist()}, key=str)[:8]
            return narrowed, f"{column}={expert[column]} (space has {near})"
        mask = narrowed
    return mask, ""


def expert_knob_values(
    space: GpuSpace, problem: Problem, config: ExpertConfig
) -> dict[str, int] | str | None:
    """The knob values of one of IREE's constraint sets that an expert configuration states
    (knobs it does not state stay free); a reason when its intrinsic is not among the set's
    options; None when the set is another pipeline or its loops cannot be related to the
    expert's.

    IREE may collapse adjacent loops of a class (a [2, 1024] M becomes 2048) before it states
    its constraints; the expert's tiles over such a class map to the collapsed loop when they
    are contiguous (outer tiles 1, inner tiles whole). An implicit-GEMM convolution config
    states the GEMM loops of IREE's implicit-GEMM set itself, one entry per loop.
    """
    if space.pipeline != config.pipeline:
        return None
    sizes: tuple[int, ...] = tuple(problem.loop_sizes)
    per_gemm_loop = space.igemm and _implicit_gemm_form(problem, config)
    if per_gemm_loop and len(config.workgroup) == len(space.loop_bounds):
        sizes = tuple(space.loop_bounds)
        loops: dict[int, tuple[int, ...]] | None = {i: (i,) for i in range(len(sizes))}
    else:
        loops = _loop_map(space, problem, len(config.workgroup))
    if loops is None:
        return None
    values: dict[str, int] = {}
    inner = space.classes["k"][-1] if space.classes.get("k") else -1
    for template, tiles in ((space.workgroup, config.workgroup),
                            (space.reduction, config.reduction)):
        for loop, entry in enumerate(template):
            value = _collapsed_tile(tiles, loops.get(loop, ()), sizes)
            if not isinstance(entry, str) or value is None:
                continue
            # TileAndFuse knobs count the innermost K loop in intrinsics (the config: elements).
            scaled = template is space.reduction and space.pipeline == "TileAndFuse" and loop == inner
            values[entry] = value // config.mma_shape[2] if scaled else value
    for cls, count in zip(("m", "n"), config.subgroup_counts, strict=True):
        named = {e for i, e in enumerate(space.subgroup_counts)
                 if isinstance(e, str) and i in space.classes.get(cls, ())}
        if len(named) == 1:  # one count knob along the class: the expert's count
            values[named.pop()] = count
    if space.intrinsics:
        if config.intrinsic not in space.intrinsics:
            return f"intrinsic {config.intrinsic} is not among IREE's options {list(space.intrinsics)}"
        values[space.mma_knob] = space.intrinsics.index(config.intrinsic)
    # Threads by meaning, as the candidate match counts them: one dimension (some experts
    # write [128, 4, 1] for 512 threads, which IREE's constraints state as [512, 1, 1]).
    sizes = (math.prod(config.workgroup_size), 1, 1)
    for axis, size in zip(("x", "y", "z"), sizes, strict=True):
        if f"wg_size_{axis}" in space.knobs:
            values[f"wg_size_{axis}"] = size
    if "sg_size" in space.knobs:
        values["sg_size"] = config.subgroup_size
    return values


def _implicit_gemm_form(problem: Problem, config: ExpertConfig) -> bool:
    """Whether a convolution's config is written per loop of IREE's implicit-GEMM form (batch,
    output image, output channels, K) rather than per loop of the convolution."""
    return problem.kind == "convolution" and len(config.workgroup) != len(problem.loop_sizes)


def _loop_map(space: GpuSpace, problem: Problem, n_entries: int) -> dict[int, tuple[int, ...]] | None:
    """Each loop of the constraint set -> the problem loops it stands for (class by class)."""
    if n_entries != len(problem.loop_sizes):
        return None  # an implicit-GEMM or unit-folded config: not related loop by loop here
    if problem.kind == "convolution":  # IREE states direct convolutions in the GEMM view
        ours = gemm_classes(problem)
        if len(space.loop_bounds) != len(problem.loop_sizes):
            return None
    else:
        ours = {("b" if c == "batch" else c): problem.loops(c) for c in problem.dims}
    mapped: dict[int, tuple[int, ...]] = {}
    for cls, theirs in space.classes.items():
        mine = ours.get(cls, ())
        if len(theirs) == len(mine):
            mapped.update({t: (m,) for t, m in zip(theirs, mine, strict=True)})
        elif len(theirs) == 1:
            mapped[theirs[0]] = tuple(mine)
        else:
            return None
    return mapped


def _collapsed_tile(tiles: tuple[int, ...], loops: tuple[int, ...], loop_sizes: Sequence[int]
                    ) -> int | None:
    """The tile of one loop standing for `loops` (indices into `loop_sizes`, the loops the
    config's entries follow), in elements (a config's 0 is the whole loop): their product when
    contiguous, else None."""
    if not loops:
        return None
    sizes = [loop_sizes[i] for i in loops]
    whole = [tiles[i] or size for i, size in zip(loops, sizes, strict=True)]  # 0: whole loop
    partial = [k for k, (t, size) in enumerate(zip(whole, sizes, strict=True)) if t != size]
    if partial and any(whole[k] != 1 for k in range(partial[-1])):
        return None  # a non-contiguous tile of the collapsed loop
    return math.prod(whole)


def iree_exclusion(problem: Problem, config: ExpertConfig, heuristic_filters: bool = True,
                   target_name: str = TARGET) -> str:
    """Which of IREE's constraints keep an expert configuration out of the space, in IREE's
    words (one set per constraint op of its pipeline), or "" when that cannot be said."""
    target = get_target(target_name)
    try:
        spaces = gpu_spaces(problem, target, heuristic_filters)
    except DispatchTuneError:
        return ""
    left_out = _left_out_tiles(problem, config, spaces)
    if left_out:
        return left_out  # the knobs of the loops left in cannot say more: they skip that tile
    found = []
    for space in spaces:
        values = expert_knob_values(space, problem, config)
        if isinstance(values, str):
            found.append(values)
        elif values is not None:
            found.append("; ".join(violated_constraints(problem, target, space, values,
                                                        heuristic_filters)))
    if not found:
        if _implicit_gemm_form(problem, config) and not any(space.igemm for space in spaces):
            return "no implicit-GEMM constraint set for this convolution (its space is direct only)"
        return f"IREE emits no {config.pipeline} constraints over these loops"
    return " | ".join(f for f in found if f)


def _left_out_tiles(problem: Problem, config: ExpertConfig, spaces: Sequence[GpuSpace]) -> str:
    """Which loops the expert tiles that every candidate of its pipeline tiles by 1: loops
    IREE's constraints leave out (`GpuSpace.batch_loops`), or ""."""
    own = [space for space in spaces if space.pipeline == config.pipeline]
    if not own or len(config.workgroup) != len(problem.loop_sizes):
        return ""
    left_out = set.intersection(*(set(space.batch_loops) for space in own))
    whole = [tile or size for tile, size in zip(config.workgroup, problem.loop_sizes, strict=True)]
    tiled = [(loop, whole[loop]) for loop in sorted(left_out) if whole[loop] != 1]
    if not tiled:
        return ""
    crashing = {*problem.loops("batch"), *problem.loops("depth")}
    why = ("IREE crashes emitting constraints with it" if {loop for loop, _ in tiled} <= crashing
           else "IREE collapses it into the next loop when it compiles the op alone")
    tiles = ", ".join(f"{tile} on d{loop}" for loop, tile in tiled)
    return f"tile {tiles}, a loop candidates tile by 1 ({why})"


def expected_position(scores: np.ndarray, mask: np.ndarray) -> float:
    """Expected 1-based position of the best-scored expert-equivalent row over tie-breaks."""
    best = scores[mask].max()
    higher = int((scores > best).sum())
    tied_others = int((scores == best).sum()) - 1
    return 1.0 + higher + tied_others / 2.0


def measure(
    entries: Sequence[ExpertEntry], orders: Sequence[str], cache: Path, heuristic_filters: bool = True,
    waves_per_eu: Sequence[int] = (), target: str | None = None,
    scorers: Mapping[str, Scorer] = SCORERS,
) -> pd.DataFrame:
    """One row per matcher. Each file's dispatches are enumerated on `target`, or on the
    architecture the file was tuned for (`file_architecture`) when it is None."""
    rows = []
    # Which GPU each file was tuned for matters only when no one target is given.
    architectures = {} if target else {file: file_architecture(file, entries)
                                       for file in {e.file for e in entries}}
    for entry in entries:
        row: dict[str, object] = {"file": entry.file, "matcher": entry.matcher}
        if not entry.usable or entry.problem is None or entry.config is None:
            rows.append({**row, "status": f"skipped: {entry.skipped}"})
            continue
        problem = entry.problem
        row.update(kind=problem.kind, problem=problem.describe(), syntax=entry.config.syntax)
        if entry.notes:
            row["notes"] = "; ".join(entry.notes)
        expert = expert_columns(entry)
        if waves_per_eu:
            expert["waves_per_eu"] = entry.config.waves_per_eu
        row.update({f"expert_{k}": v for k, v in expert.items()})
        row["expert_waves_per_eu"] = entry.config.waves_per_eu
        enumerated = target or architectures[entry.file]
        try:
            table = candidate_table(problem, cache, heuristic_filters, waves_per_eu, enumerated)
        except DispatchTuneError as exc:
            rows.append({**row, "status": f"no space: {exc}"})
            continue
        mask, excluded_by = expert_mask(table, expert)
        default, default_missing = iree_default_mask(problem, table, cache, enumerated)
        row["n"] = len(table)
        features_for = feature_target(entry.file, enumerated)
        row["features_for"] = f"{features_for.name} ({features_for.gpu_facts().compute_units} CUs)"
        row["default_status"] = "in space" if default.any() else f"not in space: {default_missing}"
        row["status"] = "in space" if mask.any() else "not in space"
        if not mask.any():
            row["excluded_by"] = excluded_by
            row["iree_constraints"] = iree_exclusion(problem, entry.config, heuristic_filters,
                                                     enumerated)
        for order in orders if mask.any() or default.any() else ():
            scores = scorers[order](problem, table, features_for)
            for name, rows_of in (("", mask), ("default_", default)):
                if rows_of.any():
                    position = expected_position(scores, rows_of)
                    row[f"{order}_{name}position"] = position
                    row[f"{order}_{name}fraction"] = position / len(table)
        rows.append(row)
        print(f"{entry.file[:28]:28s} {entry.matcher[:44]:44s} N={len(table):6d} "
              + " ".join(f"{o}={row.get(f'{o}_fraction', float('nan')):.3f}" for o in orders),
              file=sys.stderr)
    return pd.DataFrame(rows)


def summary(frame: pd.DataFrame, orders: Sequence[str], by: str, of: str = "") -> pd.DataFrame:
    """Per group: matchers, in space, and per order the median position/N, share in 1% / 5% of
    the expert configurations (`of` "") or of IREE's defaults (`of` "default_"; each dispatch
    once, with the features of the first file that tunes it)."""
    if of:
        frame = frame.drop_duplicates("problem") if "problem" in frame else frame.iloc[:0]
    status = f"{of}status"
    out = []
    # Skipped matchers have no op kind: they form a group of their own, named as such.
    for key, group in frame.fillna({by: "not read"}).groupby(by):
        placed = group[group[status] == "in space"] if status in group else group.iloc[:0]
        row: dict[str, object] = {
            by: key, "dispatches" if of else "matchers": len(group),
            "enumerated": int(group["n"].notna().sum()) if "n" in group else 0,
            "in_space": len(placed),
        }
        for order in orders:
            col = f"{order}_{of}fraction"
            if len(placed) and col in placed:
                row[f"{order} median pos/N"] = float(placed[col].median())
                row[f"{order} in 1%"] = float((placed[col] <= 0.01).mean())
                row[f"{order} in 5%"] = float((placed[col] <= 0.05).mean())
        out.append(row)
    return pd.DataFrame(out)


def markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in table.iterrows():
        cells = []
        for c in cols:
            v = row[c]
            cells.append(f"{v:.3f}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(frame: pd.DataFrame, orders: Sequence[str], out: Path, command: str,
                 target: str | None = None) -> str:
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "positions.csv", index=False)
    frame = frame.copy()
    frame["all"] = "all"
    parts = [
        "# Expert configurations in the candidate order"
        + (f" of {target}" if target else " of the GPU each file was tuned for"), "",
        f"    {command}", "",
        "Position = expected 1-based position over tie-breaks of the expert configuration; "
        "pos/N = position / space size.", "",
        "## All files", "", markdown(summary(frame, orders, "all")), "",
        "## Per file", "", markdown(summary(frame, orders, "file")), "",
        "## Per op kind", "", markdown(summary(frame[frame["status"].ne("")], orders, "kind")), "",
        "## IREE's default configuration", "",
        "Where the configuration `iree-compile` applies without a spec lands in the same orders "
        "(each dispatch once).", "",
        markdown(summary(frame, orders, "all", of="default_")), "",
        markdown(summary(frame[frame["status"].ne("")], orders, "kind", of="default_")), "",
        "## Not in the space", "",
        "First attribute no candidate shares; then the IREE constraints that exclude the "
        "expert's knob values (a smallest conflicting set, IREE's messages), or the loop the "
        "expert tiles that IREE's constraints leave out (candidates tile it by 1).", "",
    ]
    missing = frame[frame["status"] == "not in space"]
    for r in missing.itertuples():
        iree = getattr(r, "iree_constraints", "")
        iree = iree if isinstance(iree, str) and iree else "not identified"
        parts.append(f"- {r.file} `{r.matcher}`: {r.excluded_by}; IREE: {iree}")
    parts.append("")
    if "expert_waves_per_eu" in frame:
        waves = frame["expert_waves_per_eu"].dropna().astype(int).value_counts().sort_index()
        parts += ["## amdgpu-waves-per-eu set by the experts (0 = not set)", "",
                  ", ".join(f"{w}: {n}" for w, n in waves.items()), ""]
    skipped = frame[frame["status"].astype(str).str.startswith(("skipped", "no space"))]
    parts += ["", "## Not measured", ""]
    # Every matcher is measured or skipped with a reason: the reasons, counted, then each one.
    reasons = skipped["status"].astype(str).str.split(":").str[:2].str.join(":").value_counts()
    parts += [f"- {count} x {reason}" for reason, count in reasons.items()] + [""]
    parts += [f"- {r.file} `{r.matcher}`: {r.status}" for r in skipped.itertuples()]
    text = "\n".join(parts) + "\n"
    (out / "report.md").write_text(text)
    _plot(frame, orders, out / "positions.png")
    return text


def _plot(frame: pd.DataFrame, orders: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed = frame[frame["status"] == "in space"]
    fig, ax = plt.subplots(figsize=(7, 4))
    lowest = 1e-3
    for order in orders:
        if f"{order}_fraction" not in placed:
            continue  # no expert in any space: nothing to plot
        values = np.sort(placed[f"{order}_fraction"].to_numpy())
        if len(values):
            # The share of experts at or before each position, from 0 before the first to 1 at
            # the end of the order (a single expert is then a visible step too).
            shares = np.arange(len(values) + 2) / len(values)
            ax.step(np.concatenate([values[:1], values, [1.0]]), np.minimum(shares, 1.0),
                    where="post", label=order)
            lowest = min(lowest, float(values[0]))
    ax.set_xscale("log")
    ax.set_xlim(lowest / 2, 1.0)  # one expert alone would give matplotlib an empty range
    ax.set_ylim(0, 1.02)
    ax.axvline(0.01, color="grey", lw=0.5)
    ax.axvline(0.05, color="grey", lw=0.5)
    ax.set_xlabel("expert position / N (log)")
    ax.set_ylabel("share of expert configurations")
    if ax.get_legend_handles_labels()[1]:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no expert configuration in its space", transform=ax.transAxes,
                ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("specs", type=Path,
                        help="directory of tuning spec .mlir files, or one spec file")
    parser.add_argument("--output-dir", "-o", type=Path, required=True)
    parser.add_argument("--orders", default="model,heuristic,random",
                        help="comma-separated: " + ", ".join(SCORERS) + "; `model` is the "
                        "installed gfx942 prior (the order `tune` uses on gfx942), `shipped` the "
                        "order `tune` uses on each file's GPU (`model` on CDNA GPUs, the "
                        "heuristic on others)")
    parser.add_argument("--files", default="", help="comma-separated substrings of file names")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/expert_order_cache"))
    parser.add_argument("--no-heuristic-filters", dest="heuristic_filters", action="store_false",
                        help="enumerate the whole valid space (without IREE's heuristic filters)")
    parser.add_argument("--target", default=None,
                        help="GPU to enumerate, featurise and take IREE's defaults for (default: "
                        "the architecture each file was tuned for: the product or architecture "
                        "its name states, else the first of " + ", ".join(ARCHITECTURES)
                        + " that has its intrinsics); `model` stays the gfx942 prior")
    parser.add_argument("--waves-per-eu", type=lambda t: tuple(int(v) for v in t.split(",")),
                        default=(), help="also enumerate amdgpu-waves-per-eu (e.g. 0,1,2,4) and "
                        "match the expert's value (0 = not set)")
    parser.add_argument("--model", type=Path, metavar="FILE",
                        help="rank the `model` order with this model file (default: the "
                        "installed gfx942 prior)")
    args = parser.parse_args(argv)
    orders = [o for o in args.orders.split(",") if o]
    unknown = set(orders) - set(SCORERS)
    if unknown:
        print(f"error: unknown order(s) {sorted(unknown)}; choose from {sorted(SCORERS)}",
              file=sys.stderr)
        return 2
    scorers = dict(SCORERS)
    try:
        if args.model is not None:
            scorers["model"] = model_file_scorer(args.model)
        entries = load_spec_dir(args.specs)
    except DispatchTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.files:
        keys = args.files.split(",")
        entries = [e for e in entries if any(k in e.file for k in keys)]
    target = None
    if args.target is not None:
        try:
            named = get_target(args.target)
            if not named.is_gpu:
                raise DispatchTuneError(f"{args.target} is not a GPU target")
            named.gpu_facts()  # a name IREE does not know: its one line now, not per dispatch
        except DispatchTuneError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        target = named.name
    frame = measure(entries, orders, args.cache, args.heuristic_filters, args.waves_per_eu, target,
                    scorers)
    command = "python benchmarks/expert_order.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(write_report(frame, orders, args.output_dir, command, target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
