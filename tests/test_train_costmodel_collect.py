"""`datasets/collect_cpu.py`: the CPU dataset's shapes are real, distinct and tunable on CPU."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from dispatchtune.datasets.collect_cpu import SHAPES, main, select, tune_command
from dispatchtune.errors import InputError


def test_at_least_24_distinct_shapes_and_no_unit_batch_convolutions() -> None:
    assert len(SHAPES) >= 24
    assert len({s.name for s in SHAPES}) == len(SHAPES)
    assert len({s.problem.key for s in SHAPES}) == len(SHAPES)
    kinds = {s.problem.kind for s in SHAPES}
    assert kinds == {"contraction", "convolution"}
    for shape in SHAPES:
        if shape.problem.kind == "convolution":
            assert shape.problem.size("batch") >= 2, shape.name
        # Scaled so a benchmark takes milliseconds on a 2-core CPU, not seconds.
        assert 5e6 <= shape.problem.flops <= 5e8, shape.name
    with pytest.raises(InputError, match="unknown shape"):
        select(["no_such_shape"])


def test_written_shapes_are_read_back_by_the_front_end(tmp_path: Path) -> None:
    from dispatchtune.ir.frontend import load_problems

    names = ["bert_attn_scores", "resnet_s4_3x3"]
    assert main(["-o", str(tmp_path), "--only", *names, "--write-only"]) == 0
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    # The manifest lists the whole set, also when --only (re)collects a few shapes of it.
    assert [m["name"] for m in manifest] == [s.name for s in SHAPES]
    assert not (tmp_path / "bert_qkv_proj").exists()  # but only the named shapes are written
    for shape in select(names):
        problems = load_problems(tmp_path / shape.name / f"{shape.name}.mlir", "host")
        assert [p.gemm_shape for p in problems] == [shape.problem.gemm_shape]
    command = tune_command(tmp_path / "x.mlir", tmp_path / "x", 150, 7, 3, None)
    assert command[3:] == ["tune", str(tmp_path / "x.mlir"), "--target", "host", "--order",
                           "random", "--seed", "7", "--budget", "150", "--repetitions", "3",
                           "--output-dir", str(tmp_path / "x"), "--no-progress",
                           "--confirm-top", "0", "--no-verify"]
    assert "--no-verify" not in tune_command(tmp_path / "x.mlir", tmp_path / "x", 150, 7, 3, None,
                                             verify=True)


def test_pack_and_stats_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatchtune.datasets.shipped import shipped_path

    # Two shapes' logs, cut from the shipped dataset, packed and read back by the noise table.
    with gzip.open(shipped_path("cpu_host"), "rt") as handle:
        records = handle.read().splitlines()
    for name, key in (("bert_qkv_proj", "128x768x768"), ("resnet_fc", "8x1000x2048")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "results.jsonl").write_text(
            "\n".join(r for r in records if f"contraction_{key}_" in r) + "\n")
    packed = tmp_path / "packed.jsonl.gz"
    assert main(["-o", str(tmp_path), "--only", "bert_qkv_proj", "resnet_fc", "--pack", str(packed)]) == 0
    assert main(["--stats", str(packed)]) == 0
    table = capsys.readouterr().out
    assert table.count("| contraction_") == 2 and "| 150 | 0 | 3 |" in table
    assert main(["-o", str(tmp_path), "--only", "llama_q_proj", "--pack", str(packed)]) == 2
