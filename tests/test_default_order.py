"""The order used when none is asked for, the same from the CLI, `tune()` and `rank()`: the
installed model on a target that ships one (the CPU, gfx942), the heuristic elsewhere."""

from __future__ import annotations

from pathlib import Path

from dispatchtune.costmodel.defaults import default_order
from dispatchtune.costmodel.rank import rank
from dispatchtune.datasets.records import read_results
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target
from dispatchtune.tuner.loop import tune
from dispatchtune.tuner.options import TuneOptions

SMALL = Problem.matmul(256, 256, 512, "f16")


def test_the_default_order_follows_the_target() -> None:
    assert default_order("gfx942") == default_order("mi300x") == "model"  # mi300x is a gfx942
    assert default_order("host") == default_order("llvm-cpu:znver4") == "model"
    assert default_order("gfx1100") == "heuristic"  # a GPU without a shipped model
    assert default_order("gfx1100", "my_model.json") == "model"
    assert TuneOptions().for_target("gfx942").order == "model"
    assert TuneOptions().for_target("host").order == "model"
    assert TuneOptions().for_target("gfx1100").order == "heuristic"
    assert TuneOptions(order="random").for_target("gfx942").order == "random"


def test_rank_without_an_order_uses_the_targets_default() -> None:
    cset = enumerate_candidates(SMALL, get_target("gfx942"))
    default = rank(cset)["candidate_id"].tolist()
    assert default == rank(cset, order="model")["candidate_id"].tolist()
    assert default != rank(cset, order="heuristic")["candidate_id"].tolist()


def test_tune_from_python_uses_the_gfx942_model(tmp_path: Path) -> None:
    source = tmp_path / "mm.mlir"
    source.write_text(SMALL.to_mlir())
    tune(source, "gfx942", tmp_path / "out",
         TuneOptions(budget=1, compile_only=True, jobs=1, progress=False))
    records = [r for r in read_results(tmp_path / "out" / "results.jsonl") if r.is_candidate]
    assert records and {r.order for r in records} == {"model"}
