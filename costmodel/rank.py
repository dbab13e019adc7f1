"""`rank`: put candidates in benchmark order (handwritten heuristic or seeded random baseline)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from dispatchtune.costmodel.base import CostModel
from dispatchtune.costmodel.heuristic import HeuristicModel
from dispatchtune.costmodel.order import order_by_score
from dispatchtune.errors import InputError

if TYPE_CHECKING:
    from dispatchtune.problem import Problem
    from dispatchtune.targets import Target

Order = Literal["heuristic", "random", "model"]
#: The static orders `rank` produces (the tuner adds `online`: `tuner.loop.TUNE_ORDERS`).
STATIC_ORDERS: tuple[str, ...] = ("heuristic", "random", "model")
ORDERS = STATIC_ORDERS  # the name the package exports (`dispatchtune.costmodel.ORDERS`)


def rank(
    candidates: Any,
    problem: Problem | None = None,
    target: Target | str | None = None,
    order: str | None = None,
    seed: int = 0,
    model: CostModel | None = None,
) -> pd.DataFrame:
    """The candidate table reordered for benchmarking, with a `score` column (higher first).

    `candidates` is a `CandidateSet` (its `.problem`, `.target`, `.table` are used) or a DataFrame
    with `problem` and `target` given. The result keeps every column, adds `candidate_id` (the
    row's position in the input, unless the table already has one) and `score`, and has a fresh
    0..n-1 index. `order="random"` is the seeded baseline (a uniform random permutation); the
    heuristic breaks score ties with the same seeded draw. `order="model"` ranks with `model`, or
    when that is None with the target's installed default model (the heuristic where none ships);
    `model` given with `order="heuristic"` replaces the heuristic too. Without `order`: the
    target's default (`costmodel.defaults.default_order`).
    """
    table = getattr(candidates, "table", candidates)
    problem = problem if problem is not None else getattr(candidates, "problem", None)
    target = target if target is not None else getattr(candidates, "target", None)
    if order is None:
        from dispatchtune.costmodel.defaults import default_order

        order = "heuristic" if target is None else default_order(
            target if isinstance(target, str) else target.name)
    if order not in STATIC_ORDERS:
        raise InputError(f"unknown order {order!r}; choose one of: {', '.join(STATIC_ORDERS)}")
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"expected a CandidateSet or DataFrame, got {type(candidates).__name__}")

    table = table.reset_index(drop=True)
    if "candidate_id" not in table:
        table.insert(0, "candidate_id", np.arange(len(table), dtype=np.int64))
    if order == "random":
        # A random score, not just a shuffle, so that `score` still says "higher goes first".
        scores = np.random.default_rng(seed).random(len(table))
        positions = order_by_score(scores)
    else:
        if problem is None or target is None:
            raise InputError("heuristic ranking needs the problem and the target of the candidates")
        if isinstance(target, str):
            from dispatchtune.targets import get_target

            target = get_target(target)
        from dispatchtune.features.extract import extract_features

        features = extract_features(problem, target, table)
        if model is not None:
            chosen: CostModel = model
        elif order == "model":
            from dispatchtune.costmodel.defaults import model_for_target

            chosen = model_for_target(target.name)[0]
        else:
            chosen = HeuristicModel()
        # An empty space (IREE's constraints admit no configuration) has nothing to score: a
        # model's feature basis is not even defined on zero rows.
        scores = np.asarray(chosen.predict_candidates(features, table) if len(table)
                            else np.zeros(0), dtype=np.float64)
        positions = order_by_score(scores, seed)
    ranked = table.iloc[positions].copy()
    ranked["score"] = scores[positions]
    return ranked.reset_index(drop=True)
