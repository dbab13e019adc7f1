"""Leave-one-spec-file-out evaluation of GPU orders learned or chosen from expert configurations.

Two candidates for a better gfx942 order, each judged only on spec files it never saw:
- `grid`: a reworked handwritten heuristic (padding, tile intensity, spill, plus register reuse,
  K step, subgroup, occupancy and wave-quantization terms whose constants are chosen from a small
  grid by the median expert position on the *other* files);
- `pairwise`: a logistic pairwise prior on standardised log-features (expert above each other
  candidate of its dispatch), trained on the other files;
- `prior`: the shipped model class (`costmodel.pairwise.PairwiseModel`), with IREE's default
  configuration as a weaker positive (`prior_nodefault`: without it; `prior_kind`: without it,
  with per-kind basis terms so attention gets weights of its own, `--kind-terms` saves that one;
  `prior_pipeline`: without it, with TileAndFuse-only basis terms, `--pipeline-terms` saves it;
  `prior_interleaved`: without it, with a ranker per pipeline, each fit on the dispatches whose
  expert used that pipeline, and the pipelines' orders taken in turn; `--pipeline-rankers` saves
  it; with `--tree-weight W` each ranker's linear score is blended with LambdaRank trees).
`--priors` picks the variants to fit. An expert another file repeats (same dispatch, same
configuration) is held out together with the file being held out. `--folds K` holds the files
out K groups at a time instead (fewer fits when there are many files). `--train-also DIR` adds
spec files to every fit (and to `--save`'s) without holding them out or reporting them: whether
more training files help the held-out ones (docs/gpu_order.md, part 31). `--train-measured DIR`
adds GEMMs measured on an MI300X (`benchmarks/data/measured/`) the same way, each one dispatch
whose fastest `--measured-top` candidates are its positives and its other measured candidates
its negatives; a fit leaves out the measured GEMMs of the dispatches it holds out
(docs/gpu_order.md, part 36).
Only expert configurations inside the enumerated space count (see benchmarks/expert_order.py).
`--save FILE` then trains the prior on every file and writes it as a model file (the shipped
`costmodel/models/gfx942.json`), recording this command and the held-out figures.

Usage: python benchmarks/expert_order_lofo.py /work/shared/data/expert_specs [--cache DIR]
           [--no-heuristic-filters] [--hard-negatives N] [--listwise L2] [--grid]
           [--priors prior_nodefault,prior,prior_interleaved] [--pipeline-rankers]
           [--tree-weight W] [--diversity NAME=W,...] [--collapse-repeats] [--folds K]
           [--per-expert CSV] [--train-also DIR] [--seed N] [--spare-neighbours N]
           [--train-measured DIR] [--measured-top K]
           [--save costmodel/models/gfx942.json]
The shipped prior's command (parts 17-18 of docs/gpu_order.md: SPECS31 holds the six shared files and
25 public ones, listed with their commits in benchmarks/data/specs31_sources.tsv; 27 min, 19 GB of
memory at peak): SPECS31 --cache DIR --no-heuristic-filters
--hard-negatives 50 --listwise 0.1 --priors prior_interleaved --pipeline-rankers --tree-weight 0.1
--diversity threads=0.05,workgroup_split=0.1 --default-closeness convolution=0.1
--spare-neighbours 1 --folds 4 --save costmodel/models/gfx942.json (`--diversity` since part 25
and `--default-closeness` since part 28: prediction settings; `--spare-neighbours` since part 33).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, get_args

import numpy as np
import pandas as pd

from dispatchtune.benchmarks.expert_order import (
    TARGET,
    candidate_table,
    expected_position,
    expert_mask,
    feature_target,
    iree_default_mask,
    markdown,
)
from dispatchtune.cli.options import output_file
from dispatchtune.costmodel.heuristic import HeuristicModel, _log
from dispatchtune.costmodel.pairwise import (
    DIVERSITY_FAMILIES,
    PIPELINES,
    POSITIVE,
    WEAK_POSITIVE,
    PairwiseModel,
    checked_default_closeness,
    checked_diversity,
)
from dispatchtune.datasets.expert_specs import expert_columns, load_spec_dir
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.features import extract_features
from dispatchtune.problem import OpKind

LOG_FEATURES = (
    "threads", "acc_registers", "tile_k", "k_trips", "workgroups_per_cu", "wg_intensity",
    "occupancy", "subgroups", "shared_memory_fraction", "mma_m", "mma_k", "tile_mn_ratio",
    "vec_m", "vec_n", "padding_waste", "wave_quantization", "tile_m", "tile_n",
)
#: The prior variants evaluated (see the module docstring), as `fit_prior` settings.
PRIOR_SETTINGS: dict[str, dict[str, bool]] = {
    "prior_nodefault": {"weak": False}, "prior": {"weak": True},
    "prior_kind": {"weak": False, "kind_terms": True},
    "prior_pipeline": {"weak": False, "pipeline_terms": True},
    "prior_interleaved": {"weak": False, "pipeline_rankers": True},
}
PRIORS = tuple(PRIOR_SETTINGS)
GRID = list(itertools.product([16, 32, 64, 128], [0, 32, 64, 128], [0, 2, 4, 8],
                              [0.0, 0.125, 0.25], [0, 1]))


#: The identity of a GEMM measured on a GPU (`load_measured`) is this and its problem key.
MEASURED = "measured "


class Expert(NamedTuple):
    """One expert configuration (or one measured GEMM) inside its dispatch's space."""

    file: str
    kind: str  # the op kind: contraction, convolution, attention
    table: pd.DataFrame  # the dispatch's candidates
    features: pd.DataFrame  # their features
    positives: np.ndarray  # rows of the expert configuration (a measured GEMM: its fastest)
    iree_default: np.ndarray  # rows of IREE's default configuration
    identity: str  # dispatch and configuration: equal in files that repeat an expert
    problem_key: str  # the dispatch


def load(specs: Path, cache: Path, heuristic_filters: bool = True) -> list[Expert]:
    """The `Expert` of every expert configuration inside its space."""
    out: list[Expert] = []
    for entry in load_spec_dir(specs):
        if entry.problem is None or entry.config is None:
            continue
        try:
            table = candidate_table(entry.problem, cache, heuristic_filters)
        except DispatchTuneError:
            continue
        columns = expert_columns(entry)
        mask, _ = expert_mask(table, columns)
        if mask.any():
            features = extract_features(entry.problem, feature_target(entry.file), table)
            default = iree_default_mask(entry.problem, table, cache)[0]
            identity = f"{entry.problem.key} {sorted(columns.items())}"
            out.append(Expert(entry.file, entry.problem.kind, table, features, mask, default,
                              identity, entry.problem.key))
    return out


def load_measured(directory: Path, cache: Path, heuristic_filters: bool, top: int) -> list[Expert]:
    """An `Expert` per GEMM measured on an MI300X (`benchmarks/measured_order.py` reads them):
    its table is the candidates that built, ran and are in the space (the others say nothing of
    speed), its positives the `top` fastest of them. Its identity is `measured <problem key>`."""
    from dispatchtune.benchmarks.measured_order import measured_rows, problem_of, rows_in

    out: list[Expert] = []
    for path in sorted(directory.glob("*.csv")):
        problem = problem_of(path)
        table = candidate_table(problem, cache, heuristic_filters)
        measured = measured_rows(path)
        rows = rows_in(table, measured)
        ran = (rows >= 0) & measured["relative"].notna().to_numpy()
        if not ran.any():
            continue
        # One row per configuration: a candidate the tuner measured twice keeps its faster time.
        times = (pd.Series(measured["relative"].to_numpy()[ran], index=rows[ran])
                 .groupby(level=0).min())
        sub = table.iloc[times.index.to_numpy()].reset_index(drop=True)
        mask = np.zeros(len(sub), dtype=bool)
        mask[np.argsort(times.to_numpy(), kind="stable")[:top]] = True
        features = extract_features(problem, feature_target(path.name), sub)
        out.append(Expert(path.name, problem.kind, sub, features, mask, np.zeros(len(sub), bool),
                          MEASURED + problem.key, problem.key))
    return out


def training_mask(data: Sequence[Expert], tested: np.ndarray) -> np.ndarray:
    """What a fit may train on while the `tested` experts are held out: not them, not an expert
    another file repeats (same identity: dispatch and configuration), and not a measured GEMM of
    a held-out dispatch (`load_measured`: it would tell the fit what is fast there)."""
    identities = np.array([d.identity for d in data])
    keys = np.array([d.problem_key for d in data])
    measured = np.array([d.identity.startswith(MEASURED) for d in data])
    return (~tested & ~np.isin(identities, identities[tested])
            & ~(measured & np.isin(keys, keys[tested])))


def held_out_groups(names: Sequence[str], folds: int) -> list[list[str]]:
    """The files held out together in each fit: one at a time (`folds` 0), else `folds` groups
    dealt in turn from the sorted names (so every group mixes sources and eras alike)."""
    if folds == 0 or folds >= len(names):
        return [[name] for name in names]
    return [list(names[i::folds]) for i in range(folds)]


def grid_score(f: pd.DataFrame, acc: float, k_bytes: float, sg: float, occ: float, wq: int) -> np.ndarray:
    s = _log(1 - f["padding_waste"]) + _log(f["wg_intensity"] / 32.0)
    s = s + 2 * _log(256.0 / (f["acc_registers"] + 32.0)) + 0.5 * _log(f["acc_registers"] / acc)
    if k_bytes:
        s = s + _log(f["tile_k"] * f["lhs_bytes"] / k_bytes)
    if sg:
        s = s + 0.5 * _log(f["subgroups"] / sg)
    if occ:
        s = s + _log(f["occupancy"] / occ)
    if wq:
        s = s + _log(1 - f["wave_quantization"])
    return np.round(s, 9)


def design(table: pd.DataFrame, f: pd.DataFrame) -> np.ndarray:
    x = np.log2(np.maximum(f[list(LOG_FEATURES)].to_numpy(float), 1e-3))
    vd = (table["pipeline"].astype(str).to_numpy() == "VectorDistribute").astype(float)[:, None]
    terms = HeuristicModel().term_scores(f).to_numpy()
    z = np.hstack([x, x**2 / 10, vd, terms])
    return (z - z.mean(0)) / (z.std(0) + 1e-9)


def pairwise_weights(designs: Sequence[np.ndarray], masks: Sequence[np.ndarray], c: float) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    xs, ys = [], []
    for z, mask in zip(designs, masks, strict=True):
        others = np.flatnonzero(~mask)
        pick = rng.choice(others, min(400, len(others)), replace=False)
        diff = z[mask][0] - z[pick]
        xs += [diff, -diff]
        ys += [np.ones(len(diff)), np.zeros(len(diff))]
    model = LogisticRegression(C=c, fit_intercept=False, max_iter=2000)
    return model.fit(np.vstack(xs), np.concatenate(ys)).coef_[0]


def prior_training_set(data: Sequence[Expert], weak: bool) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Features, labels (expert 1, IREE default 0.5 when `weak`, else 0) and groups of experts."""
    labels = []
    for i, d in enumerate(data):
        y = np.where(d.positives, POSITIVE, 0.0)
        if weak:
            y = np.where(d.iree_default & ~d.positives, WEAK_POSITIVE, y)
        labels.append((y, np.full(len(y), i)))
    features = pd.concat([d.features for d in data], ignore_index=True)
    return (features, np.concatenate([y for y, _ in labels]),
            np.concatenate([g for _, g in labels]))


def one_per_repeat(data: Sequence[Expert]) -> list[Expert]:
    """`data` with only the first copy of each repeated expert (same dispatch, same
    configuration in several files). Measured in docs/gpu_order.md part 23: no better held out
    and worse on the outside files, so the shipped prior trains on every copy."""
    first: dict[str, Expert] = {}
    for expert in data:
        first.setdefault(expert.identity, expert)
    return list(first.values())


def fit_prior(data: Sequence[Expert], weak: bool, c: float, kind_terms: bool = False,
              hard_negatives: int = 0, listwise: float = 0.0,
              pipeline_terms: bool = False, pipeline_rankers: bool = False,
              tree_weight: float = 0.0, collapse_repeats: bool = False,
              diversity: dict[str, float] | None = None,
              default_closeness: dict[str, float] | None = None, seed: int = 0,
              spare_neighbours: int = 0) -> PairwiseModel:
    """The prior fit on `data` (`seed`: its pair and tree-row draws); `pipeline_rankers`: with a
    ranker of its own per pipeline; `tree_weight`: each ranker blended with LambdaRank trees;
    `collapse_repeats`: on one copy of each repeated expert (`one_per_repeat`); `diversity`: each
    ranker's order spread over candidate families (`pairwise.diversified`); `default_closeness`:
    rows that share knobs with IREE's default moved up, per op kind (`pairwise.towards_default`);
    `spare_neighbours`: rows that many knobs from an expert are not its negatives
    (`pairwise.near_copies`)."""
    if collapse_repeats:
        data = one_per_repeat(data)
    features, labels, groups = prior_training_set(data, weak)
    table = pd.concat([d.table for d in data], ignore_index=True)
    model = PairwiseModel(c=c, kind_terms=kind_terms, hard_negatives=hard_negatives,
                          listwise=listwise, pipeline_terms=pipeline_terms,
                          pipeline_rankers=PIPELINES if pipeline_rankers else (),
                          tree_weight=tree_weight if pipeline_rankers else 0.0,
                          diversity=diversity if pipeline_rankers else None,
                          default_closeness=default_closeness if pipeline_rankers else None,
                          seed=seed, spare_neighbours=spare_neighbours)
    return model.fit(features, labels, groups, table)


def _weights(text: str, checked: Callable[[Any], dict[str, float]], names: Sequence[str]
             ) -> dict[str, float]:
    """`NAME=W,...` as weights, checked by `checked` (names of `names`, weights >= 0)."""
    weights = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        try:
            weights[name.strip()] = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{item!r} is not NAME=WEIGHT") from None
    try:
        return checked(weights)
    except InputError:
        raise argparse.ArgumentTypeError(
            f"takes NAME=WEIGHT (weight >= 0) for names of {', '.join(names)}") from None


def diversity_weights(text: str) -> dict[str, float]:
    """`--diversity` as weights: `threads=0.05,workgroup_split=0.1`."""
    return _weights(text, checked_diversity, list(DIVERSITY_FAMILIES))


def default_closeness_weights(text: str) -> dict[str, float]:
    """`--default-closeness` as weights: `convolution=0.1`."""
    return _weights(text, checked_default_closeness, get_args(OpKind))


def summary_row(label: str, fractions: dict[str, np.ndarray]) -> dict[str, object]:
    """One report row: median position fraction and shares within 1% and 5% of each order."""
    row: dict[str, object] = {"group": label, "experts": len(next(iter(fractions.values())))}
    for name, v in fractions.items():
        row[f"{name} median"] = round(float(np.median(v)), 4)
        row[f"{name} <=1%"] = round(float((v <= 0.01).mean()), 2)
        row[f"{name} <=5%"] = round(float((v <= 0.05).mean()), 2)
    return row


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("specs", type=Path)
    parser.add_argument("--train-also", type=Path, action="append", default=[], metavar="DIR",
                        help="spec files always in training, never held out or reported (and in "
                        "--save's fit); repeatable")
    parser.add_argument("--train-measured", type=Path, metavar="DIR",
                        help="GEMMs measured on a GPU (benchmarks/data/measured/) always in "
                        "training but for the dispatches held out (and in --save's fit)")
    parser.add_argument("--measured-top", type=int, default=5, metavar="K",
                        help="--train-measured: the K fastest candidates of a GEMM are positives")
    parser.add_argument("--cache", type=Path, default=Path("/tmp/expert_order_cache"))
    parser.add_argument("--c", type=float, default=0.01, help="pairwise L2 strength (1/C)")
    parser.add_argument("--no-heuristic-filters", dest="heuristic_filters", action="store_false",
                        help="the whole valid space (without IREE's heuristic filters)")
    parser.add_argument("--grid", action="store_true", help="also the grid-tuned heuristic")
    parser.add_argument("--save", type=Path, help="train the prior on every file, write it here")
    parser.add_argument("--hard-negatives", type=int, default=0,
                        help="prior: also pair each expert with the N candidates a first fit "
                        "scores highest (a second fit)")
    parser.add_argument("--listwise", type=float, default=0.0, metavar="L2",
                        help="prior: average its weights with a listwise (softmax per dispatch) "
                        "fit of this L2 strength (0: off)")
    parser.add_argument("--kind-terms", action="store_true",
                        help="--save the prior with per-kind (attention) basis terms")
    parser.add_argument("--pipeline-terms", action="store_true",
                        help="--save the prior with TileAndFuse-only basis terms")
    parser.add_argument("--pipeline-rankers", action="store_true",
                        help="--save the prior with a ranker per pipeline, pipelines interleaved")
    parser.add_argument("--tree-weight", type=float, default=0.0, metavar="W",
                        help="prior_interleaved: blend each pipeline ranker with LambdaRank "
                        "trees, W to the trees (0: off; attention keeps the linear score)")
    parser.add_argument("--diversity", type=diversity_weights, default={}, metavar="NAME=W,...",
                        help="prior_interleaved: spread each ranker's order over candidate "
                        f"families ({', '.join(DIVERSITY_FAMILIES)}), W per family")
    parser.add_argument("--default-closeness", type=default_closeness_weights, default={},
                        metavar="KIND=W,...",
                        help="prior_interleaved: move rows that share knobs with IREE's default "
                        "configuration up, W per op kind (docs/gpu_order.md part 28)")
    parser.add_argument("--collapse-repeats", action="store_true",
                        help="prior: train on one copy of an expert other files repeat (same "
                        "dispatch, same configuration)")
    parser.add_argument("--folds", type=int, default=0, metavar="K",
                        help="hold the files out K groups at a time (sorted names dealt in turn) "
                        "instead of one at a time (0); fewer fits on many files")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the prior's random pair and tree-row draws (runs with other "
                        "seeds show how much of a difference between two recipes is chance)")
    parser.add_argument("--spare-neighbours", type=int, default=0, metavar="N",
                        help="prior: rows N or fewer configuration knobs from an expert are not "
                        "its negatives (docs/gpu_order.md part 33)")
    parser.add_argument("--per-expert", type=Path, metavar="CSV",
                        help="also write each expert's held-out position / N per order here")
    parser.add_argument("--priors", default=",".join(PRIORS),
                        help=f"comma-separated priors to evaluate (of {','.join(PRIORS)})")
    args = parser.parse_args(argv)
    if args.folds == 1 or args.folds < 0:
        parser.error("--folds takes 0 (one file at a time) or at least 2")
    if args.measured_top < 1:
        parser.error("--measured-top takes a count of candidates >= 1")
    if args.spare_neighbours < 0:
        parser.error("--spare-neighbours takes a count of knobs >= 0")
    priors = [p for p in args.priors.split(",") if p]
    if not set(priors) <= set(PRIORS):
        parser.error(f"--priors takes names of {', '.join(PRIORS)}")
    # Outputs are checked before the fits, which take minutes to hours, not after them.
    for option, path, example in (("--per-expert", args.per_expert, "experts.csv"),
                                  ("--save", args.save, "gfx942.json")):
        try:
            if path is not None:
                output_file(path, option, example)
        except DispatchTuneError as exc:
            parser.error(f"{option} {path}: cannot write there ({exc})")
    try:
        return evaluate(args, priors, argv)
    except DispatchTuneError as exc:  # e.g. no file left to teach one pipeline's ranker
        print(f"error: {exc}", file=sys.stderr)
        return 1


def evaluate(args: argparse.Namespace, priors: Sequence[str], argv: Sequence[str] | None) -> int:
    """The held-out fits of `priors` and the report for `main`'s parsed `args` (then `--save`'s
    fit)."""
    data = load(args.specs, args.cache, args.heuristic_filters)
    if not data:
        raise InputError(f"no expert configuration of {args.specs} is inside its space "
                         "(benchmarks/expert_order.py says why each is not)")
    reported = len(data)
    data += [d for directory in args.train_also
             for d in load(directory, args.cache, args.heuristic_filters)]
    if args.train_measured:
        data += load_measured(args.train_measured, args.cache, args.heuristic_filters,
                              args.measured_top)
    files = np.array([d.file for d in data])
    kinds = np.array([d.kind for d in data])
    identities = np.array([d.identity for d in data])
    names = ["heuristic", "pairwise", *priors] + (["grid"] if args.grid else [])
    fraction = {name: np.zeros(len(data)) for name in names}
    for i, d in enumerate(data):
        fraction["heuristic"][i] = (expected_position(HeuristicModel().predict(d.features),
                                                      d.positives) / len(d.features))
    grid = np.array([[expected_position(grid_score(d.features, *g), d.positives) / len(d.features)
                      for d in data] for g in GRID]) if args.grid else np.zeros((0, len(data)))
    designs = [design(d.table, d.features) for d in data]
    held_out_sets = held_out_groups(sorted(set(files[:reported].tolist())), args.folds)
    for held in held_out_sets:
        tested = np.isin(files, held) & (np.arange(len(data)) < reported)
        train = training_mask(data, tested)
        if not train.any():
            raise InputError(f"holding out {', '.join(held)} leaves no expert configuration to "
                             "train on (the other files' experts, if any, are copies of its own)")
        training = [d for d, t in zip(data, train, strict=True) if t]
        if args.grid:
            chosen = int(np.argmin(np.median(grid[:, train], axis=1)))
            fraction["grid"][tested] = grid[chosen, tested]
        w = pairwise_weights([z for z, t in zip(designs, train, strict=True) if t],
                             [d.positives for d in training], args.c)
        hard, lw = args.hard_negatives, args.listwise
        models = {name: fit_prior(training, c=args.c, hard_negatives=hard, listwise=lw,
                                  tree_weight=args.tree_weight, diversity=args.diversity,
                                  default_closeness=args.default_closeness,
                                  collapse_repeats=args.collapse_repeats, seed=args.seed,
                                  spare_neighbours=args.spare_neighbours,
                                  **PRIOR_SETTINGS[name])
                  for name in priors}
        for j in np.flatnonzero(tested).tolist():
            scores = np.round(designs[j] @ w, 9)
            fraction["pairwise"][j] = expected_position(scores, data[j].positives) / len(designs[j])
            for name, model in models.items():
                scores = model.predict_candidates(data[j].features, data[j].table)
                fraction[name][j] = expected_position(scores, data[j].positives) / len(data[j].features)
        print(f"held out {', '.join(held)}", file=sys.stderr)
    # The reports cover the held-out files; `--save`'s fit and its record cover every file.
    trained, trained_files = data, files
    data, files, kinds, identities = (data[:reported], files[:reported], kinds[:reported],
                                      identities[:reported])
    fraction = {name: v[:reported] for name, v in fraction.items()}
    rows = []
    groups: list[tuple[str, np.ndarray]] = [("all", np.ones(len(data), bool))]
    groups += [("contraction+convolution", kinds != "attention")]  # part 2's set, comparable
    groups += [(k, kinds == k) for k in sorted(set(kinds))]
    groups += [(f, files == f) for f in sorted(set(files))]
    for label, select in groups:
        rows.append(summary_row(label, {name: v[select] for name, v in fraction.items()}))
    # A configuration many files copy counts once here (the median of its positions).
    distinct = pd.DataFrame(fraction).groupby(identities, sort=False).median()
    rows.insert(1, summary_row("all, each repeated expert once",
                               {name: distinct[name].to_numpy() for name in fraction}))
    report = pd.DataFrame(rows)
    print(markdown(report))
    if args.per_expert:
        pipelines = [str(d.table["pipeline"].astype(str).to_numpy()[d.positives][0]) for d in data]
        pd.DataFrame({"file": files, "kind": kinds, "pipeline": pipelines,
                      "expert": identities, **fraction}).to_csv(args.per_expert, index=False)
    defaults = sum(int(d.iree_default.any()) for d in data)
    print(f"\n{len(data)} experts in space; IREE's default found in {defaults} of their spaces",
          file=sys.stderr)
    if args.save:
        from dispatchtune.costmodel.modelfile import save_model

        # IREE's default as a weak positive is kept only if it helps held out.
        weak = ("prior" in fraction and "prior_nodefault" in fraction
                and float(np.median(fraction["prior"]))
                <= float(np.median(fraction["prior_nodefault"])))
        model = fit_prior(trained, weak, args.c, args.kind_terms, args.hard_negatives, args.listwise,
                          args.pipeline_terms, args.pipeline_rankers, args.tree_weight,
                          args.collapse_repeats, args.diversity, args.default_closeness, args.seed,
                          args.spare_neighbours)
        command = "python benchmarks/expert_order_lofo.py " + " ".join(
            sys.argv[1:] if argv is None else argv)
        held_out = {name: {"median_position_fraction": float(np.median(v)),
                           "within_1pct": float((v <= 0.01).mean()),
                           "within_5pct": float((v <= 0.05).mean())}
                    for name, v in fraction.items()
                    if name in ("heuristic", "prior_kind" if args.kind_terms
                                else "prior_pipeline" if args.pipeline_terms
                                else "prior_interleaved" if args.pipeline_rankers
                                else "prior" if weak else "prior_nodefault")}
        save_model(model, args.save, {
            "target_kinds": ["gpu"], "target": TARGET, "command": command,
            "training_data": {"spec_files": sorted(set(trained_files.tolist())),
                              "measured_top": args.measured_top if args.train_measured else 0,
                              "problems": len(trained),
                              "hard_negatives": args.hard_negatives,
                              "listwise_l2": args.listwise,
                              "tree_weight": args.tree_weight,
                              "diversity": args.diversity,
                              "default_closeness": args.default_closeness,
                              "collapse_repeats": args.collapse_repeats,
                              "seed": args.seed,
                              "spare_neighbours": args.spare_neighbours,
                              "iree_default_weak_positives":
                                  sum(int(d.iree_default.any()) for d in trained) if weak else 0,
                              "heuristic_filters": args.heuristic_filters},
            "leave_one_file_out" if all(len(g) == 1 for g in held_out_sets)
            else f"held_out_in_{len(held_out_sets)}_file_folds": held_out,
        })
        print(f"model written to {args.save}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
