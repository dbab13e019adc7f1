"""Kernel Tuner's own search strategies replayed on its caches, as peers of dispatchtune's orders.

Kernel Tuner (a benchmark-only dependency: the `bench` extra) runs its strategies in simulation
mode: every "benchmark" is a look-up in a fully measured cache, so a run costs seconds and its
counts are exactly those a real tuning session on that GPU would have spent. Counting follows
/work/shared/reference/kerneltuner_replay.md:

- the cache is decompressed into a temporary file ending in `.json` (Kernel Tuner appends `.json`
  to any other name and reads only that);
- the only restriction is "the configuration is in the cache": the caches do not store the kernels'
  restriction lists, and a configuration that passes the restrictions but is missing from the cache
  aborts the replay;
- Python's `random` and numpy's global generator are seeded before each run (Kernel Tuner's `seed=`
  reaches only the pymoo strategies); `bayes_opt` also draws its initial Latin hypercube sample from
  a fresh, unseeded scipy generator, so that generator is seeded from the run's seed too (measured:
  without it the same seed gave different runs);
- the returned results are read in order, keeping the first occurrence of each configuration; a
  failed configuration (compile or runtime failure, recorded as such in the cache) costs a benchmark
  like any other.

`kernel_tuner_rows` returns one row per (strategy, seed) in the evaluation harness's columns
(`dispatchtune.evaluation.harness`). `kernel_tuner` is imported inside the functions so that this
module, and the package, import without it.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import tempfile
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tqdm import tqdm

from dispatchtune.costmodel.metrics import near_optimal, random_expected_benchmarks
from dispatchtune.datasets.kerneltuner import load_kerneltuner, objective_direction
from dispatchtune.errors import DispatchTuneError, InputError

#: Kernel Tuner's names (`kernel_tuner.interface.strategy_map`) of the strategies compared.
STRATEGIES = ("genetic_algorithm", "dual_annealing", "pso", "bayes_opt")

#: The harness's row columns, in order.
COLUMNS = (
    "problem", "device", "order", "seed", "n_candidates", "n_good", "benchmarks_to_threshold",
    "random_expected", "invalid_proposals", "evaluated", "best_so_far",
)

#: Longest best-so-far curve stored per row.
CURVE_LIMIT = 1000


def _import_kernel_tuner() -> Any:
    try:
        import kernel_tuner
    except ImportError as exc:
        raise DispatchTuneError(
            "kernel_tuner is not installed; install the benchmark extra: pip install 'dispatchtune[bench]'"
        ) from exc
    return kernel_tuner


def _check_strategies(strategies: Sequence[str]) -> None:
    from kernel_tuner.interface import strategy_map

    unknown = [s for s in strategies if s not in strategy_map]
    if unknown:
        raise InputError(f"unknown Kernel Tuner strategy {unknown[0]!r}; known: {', '.join(strategy_map)}")


def _config_key(values: Sequence[object]) -> str:
    # Kernel Tuner's own cache key: the parameter values str()-joined by commas, in key order.
    return ",".join(str(v) for v in values)


def _cost(result: dict[str, Any], objective: str = "time", higher_is_better: bool = False) -> float:
    """What the replay minimises for one result, as `datasets.kerneltuner` defines `cost` (the
    objective, or its reciprocal where higher is better); inf for a failed configuration."""
    time, value = result.get("time"), result.get(objective)
    if "__error__" in result or not isinstance(time, (int, float)) or not np.isfinite(time):
        return float("inf")
    if not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
        return float("inf")
    return 1.0 / float(value) if higher_is_better else float(value)


class _StopAtHit:
    """A user-defined Kernel Tuner strategy: the named one, ended once it evaluates a good config.

    The wrapped strategy draws the same random numbers and proposes the same configurations up to
    the hit (nothing here draws or reorders), so the benchmarks to the threshold are those of the
    full run; only the evaluations after the hit are skipped. Worth it for `bayes_opt`, whose
    Gaussian-process step over the whole space costs about 0.1 s per benchmark here.
    """

    def __init__(self, strategy: str, is_good: Callable[[dict[str, Any]], bool]) -> None:
        from kernel_tuner.interface import strategy_map

        self.module = strategy_map[strategy]
        self.is_good = is_good

    def tune(self, searchspace: Any, runner: Any, tuning_options: Any) -> Any:
        run = runner.run

        def run_until_hit(parameter_space: Any, options: Any) -> Any:
            results = run(parameter_space, options)
            if any(r is not None and self.is_good(r) for r in results):
                # Exhausting the budget makes every strategy stop the way it does at max_fevals.
                options.budget.max_fevals = options.budget.num_fevals
            return results

        runner.run = run_until_hit
        try:
            return self.module.tune(searchspace, runner, tuning_options)
        finally:
            runner.run = run


@contextmanager
def _seeded_latin_hypercube(seed: int) -> Iterator[None]:
    """Make `bayes_opt`'s initial sample reproducible: its scipy `LatinHypercube` gets a seeded rng."""
    import kernel_tuner.strategies.bayes_opt as bayes_opt

    original = bayes_opt.LatinHypercube
    bayes_opt.LatinHypercube = functools.partial(original, rng=np.random.default_rng(seed))
    try:
        yield
    finally:
        bayes_opt.LatinHypercube = original


def _decompress(cache: Path, directory: Path) -> Path:
    try:
        raw = cache.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"Kernel Tuner cache not found: {cache}") from exc
    text = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    stem = cache.name.removesuffix(".gz").removesuffix(".json")
    path = directory / f"{stem}.json"  # Kernel Tuner reads only files ending in .json
    path.write_bytes(text)
    return path


class CacheReplay:
    """One cache made ready for Kernel Tuner's simulation mode; `run` replays one strategy and seed.

    Use as a context manager: the decompressed copy lives in a temporary directory until `close`.
    """

    def __init__(self, cache: Path) -> None:
        _import_kernel_tuner()
        from kernel_tuner.util import read_cache

        self._tmp = tempfile.TemporaryDirectory(prefix="kt_replay_")
        try:
            self.path = _decompress(Path(cache), Path(self._tmp.name))
            try:
                header = read_cache(str(self.path), open_cache=False)
                self.keys = [str(k) for k in header["tune_params_keys"]]
                self.tune_params = {k: list(header["tune_params"][k]) for k in self.keys}
            except (ValueError, KeyError, TypeError) as exc:
                raise InputError(f"corrupt Kernel Tuner cache {cache}: {exc}") from exc
            self.kernel_name = str(header["kernel_name"])
            self.objective = str(header.get("objective") or "time")
            self.higher_is_better = objective_direction(
                self.objective, header.get("objective_higher_is_better"))
            size = header["problem_size"]  # a list, or one int (pnpoly)
            self.problem_size = tuple(size) if isinstance(size, (list, tuple)) else (size,)
            self.present = frozenset(header["cache"])
        except BaseException:
            self._tmp.cleanup()
            raise

    def __enter__(self) -> CacheReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._tmp.cleanup()

    def cost(self, result: dict[str, Any]) -> float:
        """The cost of one of Kernel Tuner's results (`_cost` with this cache's objective)."""
        return _cost(result, self.objective, self.higher_is_better)

    def run(
        self, strategy: str, seed: int, max_fevals: int,
        stop_when: Callable[[dict[str, Any]], bool] | None = None,
    ) -> list[tuple[str, float]]:
        """Replay `strategy` seeded with `seed`: the unique configurations it benchmarked, in order.

        Each entry is (Kernel Tuner's cache key, its cost (`cost`) or inf for a failed configuration), at
        most `max_fevals` long. With `stop_when`, the run ends at the first result it accepts.
        """
        from constraint import FunctionConstraint
        from kernel_tuner import tune_kernel

        present = self.present

        def in_cache(*values: object) -> bool:
            return _config_key(values) in present

        random.seed(seed)
        np.random.seed(seed)
        chosen: Any = strategy if stop_when is None else _StopAtHit(strategy, stop_when)
        with warnings.catch_warnings(), _seeded_latin_hypercube(seed):
            # "None of the tunable parameters specify thread block dimensions" (true, and irrelevant
            # when replaying), and bayes_opt's overflows: it feeds failed configurations to its
            # Gaussian process as cost sys.float_info.max.
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            results, _env = tune_kernel(
                self.kernel_name, "", self.problem_size, [], self.tune_params,
                restrictions=[FunctionConstraint(in_cache)], cache=str(self.path), simulation_mode=True,
                strategy=chosen, strategy_options={"max_fevals": max_fevals}, quiet=True,
                objective=self.objective, objective_higher_is_better=self.higher_is_better,
            )
        seen: set[str] = set()
        trace: list[tuple[str, float]] = []
        for result in results:
            key = _config_key([result[k] for k in self.keys])
            if key in seen:
                continue  # served again from Kernel Tuner's cache: no benchmark
            seen.add(key)
            trace.append((key, self.cost(result)))
            if len(trace) == max_fevals:
                break
        return trace


def replay_evaluations(
    cache: Path, strategy: str, seed: int, max_fevals: int = 1000
) -> list[tuple[str, float]]:
    """The unique configurations one seeded run of `strategy` benchmarks on `cache` (`CacheReplay.run`)."""
    _import_kernel_tuner()
    _check_strategies([strategy])
    with CacheReplay(cache) as replay:
        return replay.run(strategy, seed, max_fevals)


def _trace_counts(
    times: Sequence[float], best: float, threshold: float
) -> tuple[float, int, list[float]]:
    """(benchmarks to threshold or NaN, failed before the hit or the end, best-so-far curve)."""
    trace = np.asarray(times, dtype=np.float64)
    good = trace <= best * (1.0 + threshold)
    hit = float(np.argmax(good) + 1) if good.any() else float("nan")
    counted = trace[: int(hit)] if good.any() else trace
    invalid = int(np.isinf(counted).sum())
    # The harness's convention: best time / best so far, in (0, 1]; 0 while only failed
    # configurations were benchmarked (best / inf).
    running = best / np.minimum.accumulate(trace[:CURVE_LIMIT]) if trace.size else trace
    return hit, invalid, [round(float(v), 4) for v in running]


def kernel_tuner_rows(
    cache: Path,
    strategies: Sequence[str],
    seeds: Sequence[int],
    threshold: float = 0.05,
    max_fevals: int = 1000,
    progress: bool = True,
    stop_at_hit: Collection[str] = (),
    on_row: Callable[[dict[str, object]], None] | None = None,
) -> pd.DataFrame:
    """Replay each strategy once per seed on one Kernel Tuner cache; one row per (strategy, seed).

    Columns are `COLUMNS` (see the module doc for the counting). `order` is `kt_<strategy>`;
    `benchmarks_to_threshold` is NaN when the run never reached `threshold` of the best valid time;
    `best_so_far` is a JSON list of the best valid time over the best so far, one entry per
    benchmark (0 while only failed configurations were evaluated), as in the harness.

    Strategies in `stop_at_hit` end at their first good configuration (see `_StopAtHit`): their
    `benchmarks_to_threshold` and `invalid_proposals` are those of the full run, while `evaluated`
    and `best_so_far` end at the hit. `on_row` sees each row as soon as its run ends (checkpoints).
    """
    if not strategies:
        raise InputError("no Kernel Tuner strategy given")
    if not seeds:
        raise InputError("no seed given")
    if not threshold >= 0:
        raise InputError(f"threshold must be >= 0, got {threshold}")
    if max_fevals < 1:
        raise InputError(f"max_fevals must be >= 1, got {max_fevals}")
    _import_kernel_tuner()
    _check_strategies([*strategies, *stop_at_hit])

    cache = Path(cache)
    space = load_kerneltuner(cache)
    valid_times = space.valid["cost"].to_numpy(dtype=np.float64)
    if valid_times.size == 0:
        raise InputError(f"{cache}: no configuration in the cache ran")
    best = float(valid_times.min())
    n_candidates = int(valid_times.size)
    n_good = int(near_optimal(valid_times, threshold).sum())
    base = {
        "problem": space.label(),  # the evaluation harness's label, so rows line up
        "device": space.device_name,
        "n_candidates": n_candidates,
        "n_good": n_good,
        "random_expected": random_expected_benchmarks(n_candidates, n_good),
    }

    def is_good(result: dict[str, Any]) -> bool:
        return _cost(result, space.objective, space.higher_is_better) <= best * (1.0 + threshold)

    rows: list[dict[str, object]] = []
    runs = [(s, int(seed)) for s in strategies for seed in seeds]
    with CacheReplay(cache) as replay:
        bar = tqdm(runs, desc=f"kernel tuner {base['problem']}", unit="run", disable=not progress)
        for strategy, seed in bar:
            bar.set_postfix_str(f"{strategy} seed {seed}")
            trace = replay.run(strategy, seed, max_fevals, is_good if strategy in stop_at_hit else None)
            hit, invalid, curve = _trace_counts([t for _, t in trace], best, threshold)
            rows.append({
                **base, "order": f"kt_{strategy}", "seed": seed, "benchmarks_to_threshold": hit,
                "invalid_proposals": invalid, "evaluated": len(trace), "best_so_far": json.dumps(curve),
            })
            if on_row is not None:
                on_row(rows[-1])
    return typed_rows(pd.DataFrame(rows, columns=list(COLUMNS)))


def typed_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """The row columns with their dtypes (ints as int64, counts that may be NaN as float64)."""
    return frame[list(COLUMNS)].astype({
        "problem": str, "device": str, "order": str, "best_so_far": str,
        "seed": np.int64, "n_candidates": np.int64, "n_good": np.int64, "invalid_proposals": np.int64,
        "evaluated": np.int64, "benchmarks_to_threshold": np.float64, "random_expected": np.float64,
    })
