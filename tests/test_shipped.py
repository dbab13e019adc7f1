"""The shipped CPU dataset and the installed default host model (issue #6, items 2 and 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.costmodel.defaults import default_model_path, model_for_target
from dispatchtune.costmodel.learned import LearnedModel
from dispatchtune.costmodel.train import load_training_data
from dispatchtune.datasets.records import read_records
from dispatchtune.datasets.shipped import SHIPPED, resolve, shipped_path
from dispatchtune.errors import InputError

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"


@pytest.mark.parametrize(("name", "candidates", "cpu"), [
    ("cpu_host", 150, "znver4"),  # AVX-512
    ("cpu_avx2", 100, "znver3"),  # AVX2
])
def test_cpu_dataset_meets_the_collection_spec(name: str, candidates: int, cpu: str) -> None:
    path = shipped_path(name)
    assert path.stat().st_size < 20e6
    assert (path.parent / f"{name}.md").is_file()  # the card
    by_problem: dict[str, dict[str, list[list[float]]]] = {}
    cpus = set()
    for record in read_records(path):
        kinds = by_problem.setdefault(record["problem_key"], {"candidate": [], "baseline": []})
        if record["kind"] in kinds and record.get("bench_status") == "ok":
            kinds[record["kind"]].append(record["times_ms"])
        cpus.add(record.get("target_cpu"))
    assert cpus == {cpu}
    assert len(by_problem) >= 24
    kinds_of_op = {key.split("_")[0] for key in by_problem}
    assert kinds_of_op == {"contraction", "convolution"}
    for key, kinds in by_problem.items():
        assert len(kinds["candidate"]) >= candidates, key
        assert kinds["baseline"], key  # the default config is measured too
        assert min(len(t) for t in kinds["candidate"]) >= 3, key


def test_shipped_names_resolve_and_unknown_ones_are_one_line_errors(tmp_path: Path) -> None:
    assert resolve("shipped:cpu_host") == shipped_path("cpu_host")
    assert resolve(tmp_path) == tmp_path
    assert set(SHIPPED) == {"cpu_host", "cpu_avx2"}
    with pytest.raises(InputError, match="no shipped dataset 'nope'"):
        resolve("shipped:nope")
    data = load_training_data(["shipped:cpu_host"])
    assert len(set(data.groups)) >= 24 and np.isfinite(data.times).all()


def test_installed_host_model_is_the_default_for_the_host_target() -> None:
    path = default_model_path("host")
    assert path is not None and path.stat().st_size < 5e6
    model, where = model_for_target("host")
    assert isinstance(model, LearnedModel) and "installed default" in where
    # A GPU target without a shipped model (gfx942 has one: tests/test_gpu_prior.py) is ranked
    # by the heuristic.
    assert "heuristic" in model_for_target("sm_80")[1]


def test_rank_uses_the_installed_model_by_default() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "rank", str(FIXTURE), "--target", "host",
         "--order", "model", "--limit", "3"],
        capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "host.json" in result.stdout + result.stderr


def test_logged_spaces_carry_their_solver_knobs() -> None:
    from dispatchtune.datasets.spaces import load_spaces
    from dispatchtune.features.spaces import space_features

    spaces = load_spaces([shipped_path("cpu_host")])
    assert len(spaces) >= 24
    for space in spaces:
        label, features, times, knobs = space.label, space_features(space), space.times, space.knobs
        assert len(knobs) == len(features) == len(times), label
        # The solver variables that vary within the problem, not the derived table columns.
        assert len(knobs.columns) >= 3 and all(c.startswith("knob_") for c in knobs.columns), label
        assert (knobs.astype(str).nunique() > 1).all(), label

