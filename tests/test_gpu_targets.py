"""A GPU the registry does not list, named as IREE knows it, through `tune --compile-only`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
