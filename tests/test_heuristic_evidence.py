"""The evidence script's plumbing: Kernel Tuner caches and results.jsonl logs in, table + plot out.

The results log here is written with made-up times to test reading and grouping only; the
evidence itself comes from real measurements (docs/heuristic.md).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from types import ModuleType

import pytest

from dispatchtune.datasets.records import ResultRecord, ResultsLog
from dispatchtune.problem import Problem

ROOT = Path(__file__).resolve().parents[1]
KT_FIXTURE = ROOT / "tests" / "fixtures" / "kt_gemm_2080ti_slice.json.gz"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "heuristic_vs_random", ROOT / "benchmarks" / "heuristic_vs_random.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_log(path: Path, order: str) -> None:
    problem = Problem.matmul(256, 256, 256, "f32")
    log = ResultsLog(path)
    tiles = itertools.product([32, 64, 128], [32, 64], [1, 8, 16])
    for cid, (tile, vec_m, vec_n) in enumerate(tiles):
        knobs = {"pipeline": "DoubleTilingExpert", "tile_m": tile, "tile_n": tile, "tile_k": 4,
                 "vec_m": vec_m, "vec_n": vec_n}
        log.append(ResultRecord(
            problem=problem.to_dict(), problem_key=problem.key, target="host", device="local-sync",
            candidate_id=cid, order=order, knobs=knobs, compile_status="ok", bench_status="ok",
            times_ms=[1.0 + cid % 5, 1.0 + cid % 5],
        ))
    log.append(ResultRecord(
        problem=problem.to_dict(), problem_key=problem.key, target="host", device="local-sync",
        candidate_id=99, order=order, knobs={"tile_m": 8}, compile_status="failed",
    ))


def test_script_on_kernel_tuner_and_results(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "run" / "results.jsonl"
    write_log(log, order="random")
    md, png = tmp_path / "table.md", tmp_path / "plot.png"
    code = script.main(["--kerneltuner", str(KT_FIXTURE), "--results", str(log.parent),
                        "--markdown", str(md), "--plot", str(png)])
    assert code == 0
    text = md.read_text()
    assert "NVIDIA GeForce RTX 2080 Ti GEMM 4096x4096x4096 | 200 |" in text
    assert "| IREE results.jsonl | host contraction 256x256x256 f32xf32 |" in text
    assert "| 18 |" in text  # 18 valid candidates: the failed compile is not counted
    assert png.stat().st_size > 10_000
    assert "heuristic-ordered" not in capsys.readouterr().err


def test_heuristic_ordered_logs_are_flagged(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "results.jsonl"
    write_log(log, order="heuristic")
    assert script.main(["--results", str(log)]) == 0
    captured = capsys.readouterr()
    assert "[heuristic-ordered log]" in captured.out and "--order random" in captured.err


def test_script_errors_are_one_line(
    script: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    broken = tmp_path / "broken.json.gz"
    broken.write_bytes(b"garbage")
    assert script.main(["--kerneltuner", str(broken)]) == 2
    err = capsys.readouterr().err.strip()
    assert "broken.json.gz" in err and "\n" not in err
