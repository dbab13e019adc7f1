"""`dispatchtune candidates`: JSON lines equal the Python API's table; errors are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatchtune.cli import main
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_json_lines_match_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["candidates", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", "host",
               "--limit", "5", "--json"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    api = enumerate_candidates(Problem.matmul(512, 512, 512, "f32"), "host", limit=5)
    assert [line["rank"] for line in lines] == list(range(5))
    for line in lines:
        row = api.table.iloc[line["rank"]]
        assert line["pipeline"] == row["pipeline"] == "DoubleTilingExpert"
        assert line["compilation_info"] == api.compilation_info(line["rank"])
        for column in ("tile_m", "tile_n", "tile_k", "vec_m", "vec_n", "knob_vector_reduction_2"):
            assert line["knobs"][column] == int(row[column])


def test_gpu_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["candidates", str(EXAMPLES / "matmul_transpose_b_f16.mlir"), "--target", "sm_80",
               "--pipeline", "VectorDistribute", "--limit", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "on sm_80: 3 candidates" in out
    assert out.count("VectorDistribute") == 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.mlir", "--target", "host"], "missing.mlir"),
        (["{ex}/matmul_f32_512.mlir", "--target", "nope"], "unknown target"),
        (["{ex}/matmul_f32_512.mlir", "--target", "host", "--pipeline", "TileAndFuse"],
         "unknown CPU pipeline"),
        (["{ex}/matmul_f32_512.mlir", "--target", "host", "--op-index", "3"], "out of range"),
        ([str(Path(__file__).parent / "fixtures" / "cpu_maxpool_nchw_f32.mlir"), "--target", "host"],
         "not pooling"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["candidates", *(a.format(ex=EXAMPLES) for a in args)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err
