"""A GPU the registry does not list, named as IREE knows it, through `tune --compile-only`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtune.datasets.records import read_results

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "matmul_transpose_b_f16.mlir"


def test_tune_compile_only_on_an_unlisted_gpu(tmp_path: Path) -> None:
    out = tmp_path / "gfx90a"
    done = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(EXAMPLE), "--target", "gfx90a",
         "--compile-only", "--budget", "1", "--no-progress", "-o", str(out)],
        capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    built = [r for r in read_results(out / "results.jsonl") if r.is_candidate]
    assert built and built[0].target == "gfx90a" and built[0].compile_status == "ok"
    assert "MFMA" in built[0].compilation_info  # CDNA2's intrinsics, from IREE's target table


@pytest.mark.parametrize(("command", "suggested", "not_suggested", "log"), [
    ("tune", "--compile-only", "", "results.jsonl"),
    # tune-model has no --compile-only (it used to compile and profile the model first, then
    # fail with the HIP runtime's raw error): it names `tune`'s.
    ("tune-model", "`dispatchtune tune` on the same model with --compile-only",
     "use --compile-only", "model_log.jsonl"),
])
def test_benchmarking_on_a_gpu_this_machine_lacks_is_one_line_before_any_build(
    tmp_path: Path, command: str, suggested: str, not_suggested: str, log: str
) -> None:
    """Both commands check the device up front: one line suggesting what the command offers
    instead, exit 2, nothing built or logged."""
    from dispatchtune.measure.process import run_process
    from dispatchtune.toolchain import tool_path

    if run_process([tool_path("iree-run-module"), "--list_devices=hip"], 60.0).ok:
        pytest.skip("this machine has a HIP runtime: the refusal cannot be shown")
    out = tmp_path / "gfx942"
    done = subprocess.run(
        [sys.executable, "-m", "dispatchtune", command, str(EXAMPLE), "--target", "gfx942",
         "--budget", "1", "--no-progress", "-o", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "device hip://0 is not available on this machine" in lines[0]
    assert suggested in lines[0] and (not not_suggested or not_suggested not in lines[0])
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not (out / log).exists()  # nothing built, nothing logged
