"""`amdgpu-waves-per-eu` as an opt-in knob of the GPU space: CLI flag, JSON lines, expert match."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatchtune.cli import main
from dispatchtune.problem import Problem

MATMUL = Problem.matmul(256, 256, 256, "f16")


def test_candidates_json_crosses_waves_per_eu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "mm.mlir"
    source.write_text(MATMUL.to_mlir())
    assert main(["candidates", str(source), "--target", "gfx942", "--json"]) == 0
    plain = capsys.readouterr().out.splitlines()
    assert main(["candidates", str(source), "--target", "gfx942", "--json",
                 "--waves-per-eu", "0,2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(lines) == 2 * len(plain)  # the flag multiplies the space by its value count
    by_waves = {w: [x for x in lines if x["knobs"]["waves_per_eu"] == w] for w in (0, 2)}
    assert len(by_waves[0]) == len(by_waves[2]) == len(plain)
    assert not any("amdgpu-waves-per-eu" in x["compilation_info"] for x in by_waves[0])
    assert all('llvm_func_attrs = {"amdgpu-waves-per-eu" = "2"}' in x["compilation_info"]
               for x in by_waves[2])


@pytest.mark.parametrize(("target", "value", "message"), [
    ("gfx942", "0,x", "expected comma-separated integers >= 0"),
    ("gfx942", "-1", "expected comma-separated integers >= 0"),
    ("sm_86", "2", "--waves-per-eu is an AMD GPU hint; sm_86 is not an AMD target"),
])
def test_bad_waves_per_eu_is_one_line_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, value: str, message: str
) -> None:
    source = tmp_path / "mm.mlir"
    source.write_text(MATMUL.to_mlir())
    with pytest.raises(SystemExit) as exit_info:  # argparse errors exit; ours return 2
        raise SystemExit(main(["candidates", str(source), "--target", target,
                               f"--waves-per-eu={value}"]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_expert_order_matches_waves_per_eu_when_enumerated(tmp_path: Path) -> None:
    """With the knob crossed in, the expert's row is the one with its waves-per-eu value."""
    from dispatchtune.benchmarks.expert_order import candidate_table, expert_mask

    table = candidate_table(MATMUL, tmp_path, waves_per_eu=(0, 1, 2))
    base = candidate_table(MATMUL, tmp_path)
    assert len(table) == 3 * len(base)
    columns = ("pipeline", "intrinsic", "tile_b", "tile_m", "tile_n", "tile_k", "subgroups_m",
               "subgroups_n", "workgroup_threads")
    expert: dict[str, int | str] = {c: base.iloc[0][c] for c in columns}
    assert set(base["waves_per_eu"]) == {0}  # IREE's space: the compiler default only
    assert expert_mask(base, expert)[0].any()
    mask, _ = expert_mask(table, {**expert, "waves_per_eu": 2})
    assert mask.any() and set(table.loc[mask, "waves_per_eu"]) == {2}
    missing, why = expert_mask(table, {**expert, "waves_per_eu": 8})
    assert not missing.any() and why.startswith("waves_per_eu=8")


def test_tune_builds_waves_per_eu_candidates_with_the_hint_applied(tmp_path: Path) -> None:
    """`tune --waves-per-eu` (with the whole valid space): the hint reaches the applied config."""
    import subprocess
    import sys

    from dispatchtune.datasets.records import read_results

    source = tmp_path / "mm.mlir"
    source.write_text(MATMUL.to_mlir())
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(source), "--target", "gfx942",
         "--compile-only", "--budget", "2", "--waves-per-eu", "2", "--no-heuristic-filters",
         "--no-progress", "-o", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    built = [r for r in read_results(out / "results.jsonl") if r.is_candidate
             and r.compile_status == "ok"]
    assert built and all('"amdgpu-waves-per-eu" = "2"' in r.compilation_info for r in built)
    refused = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(source), "--target", "host",
         "--budget", "1", "--waves-per-eu", "2", "-o", str(tmp_path / "cpu")],
        capture_output=True, text=True, timeout=300,
    )
    assert refused.returncode == 2 and "not an AMD target" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
