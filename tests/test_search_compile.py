"""Sampled candidates compile with iree-compile and the applied config is the requested one.

A spec that does not match, or a config IREE drops, falls back to the default silently, so the
applied configuration is read back (`--compile-to=executable-configurations`); CUDA gets the spec
through `Target.tuning_spec_flag` (the transform-dialect library).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dispatchtune import load_problems
from dispatchtune.ir.spec import applied_configs, config_applied, tuning_spec, write_spec
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import Target, get_target
from dispatchtune.toolchain import first_error_line, run_tool

CONV_F16 = Problem.conv2d_nhwc_hwcf(2, 16, 16, 32, 32, 3, 3, "f16")

CASES = [
    ("gfx942", "TileAndFuse", Problem.matmul(256, 256, 256, "f16")),
    ("gfx942", "VectorDistribute", Problem.matmul(256, 256, 256, "f16")),
    ("gfx1100", "TileAndFuse", Problem.matmul(256, 128, 256, "f16")),
    ("gfx1100", "VectorDistribute", Problem.matmul(256, 128, 256, "f16")),
    ("sm_80", "TileAndFuse", Problem.matmul(256, 256, 128, "f16", transpose_b=True)),
    ("sm_80", "VectorDistribute", Problem.matmul(256, 256, 128, "f16", transpose_b=True)),
    ("gfx942", "TileAndFuse", CONV_F16),  # direct lowering; IGEMM: see the test below
    ("host", "DoubleTilingExpert", Problem.batch_matmul(2, 64, 128, 64, "f32")),
    ("host", "ConvTileAndDecomposeExpert", Problem.conv2d_nhwc_hwcf(2, 14, 14, 32, 32, 3, 3)),
]


def _check(
    source: Path, seen: Problem, target: Target, requested: str, out: Path, full: bool
) -> None:
    """The spec applies exactly `requested`; with `full`, the whole compile succeeds too."""
    spec = write_spec(tuning_spec([(seen, requested)]), out.with_suffix(".spec.mlir"))
    applied = applied_configs(source, target, spec)
    assert len(applied) == 1
    assert config_applied(requested, applied[0]), (requested, applied[0])
    if full:
        proc = run_tool(
            "iree-compile",
            [str(source), *target.compile_flags, *target.tuning_spec_flags(spec),
             "-o", str(out)],
        )
        assert proc.returncode == 0, first_error_line(proc.stderr)
        assert out.stat().st_size > 0


def _seen(problem: Problem, target: Target, tmp_path: Path) -> tuple[Path, Problem]:
    source = tmp_path / "input.mlir"
    source.write_text(problem.to_mlir())
    if problem.kind == "contraction":
        return source, problem
    # A conv as IREE's spec matcher sees the file (e.g. unit dims dropped): ask the front end.
    (seen,) = load_problems(source, target)
    return source, seen


@pytest.mark.parametrize(
    ("target_name", "pipeline", "problem"),
    CASES,
    ids=[f"{t}-{p}-{pr.kind}{len(pr.loop_sizes)}" for t, p, pr in CASES],
)
def test_sampled_candidates_compile_and_apply(
    target_name: str, pipeline: str, problem: Problem, tmp_path: Path
) -> None:
    target = get_target(target_name)
    source, seen = _seen(problem, target, tmp_path)
    cands = enumerate_candidates(seen, target, pipeline=pipeline)
    table = cands.table
    if problem.kind == "convolution" and target.is_gpu:
        table = table[table["igemm"] == 0]
    rng = np.random.default_rng(7)
    picks = sorted(rng.choice(table.index.to_numpy(), size=min(2, len(table)), replace=False))
    assert picks
    # Two samples, both read back; the first also compiled to a vmfb (2 cores: in parallel).
    with ThreadPoolExecutor(2) as pool:
        jobs = [
            pool.submit(_check, source, seen, target, cands.compilation_info(int(i)),
                        tmp_path / f"c{i}.vmfb", n == 0)
            for n, i in enumerate(picks)
        ]
        for job in jobs:
            job.result()


def test_igemm_conv_with_a_partial_k_tile_compiles_once_padded(tmp_path: Path) -> None:
    """IREE 3.13's constraints admit IGEMM convs whose K tile does not divide K (here with
    MFMA_F32_32x32x8_F16); without `padding` they fail in codegen (`tensor.expand_shape ...
    expected dimension 3`; this was taken for an IREE gap), padded as IREE pads its own configs
    they compile (`search.gpu._with_padding`)."""
    import re

    target = get_target("gfx942")
    source, seen = _seen(CONV_F16, target, tmp_path)
    cands = enumerate_candidates(seen, target, pipeline="TileAndFuse")
    table = cands.table
    igemm = table[(table["igemm"] == 1) & (table["tile_k"] == 32) & (table["tile_n"] == 32)]
    row = int(igemm.index[igemm["intrinsic"] == "MFMA_F32_32x32x8_F16"][0])
    padded = cands.compilation_info(row)
    assert "padding = [" in padded
    unpadded = re.sub(r"padding(_conv)? = \[[^\]]*\], ", "", padded)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(
            lambda job: _compile_rc(source, seen, target, job[1], tmp_path, job[0]),
            [(0, unpadded), (1, padded)],
        ))
    (unpadded_rc, unpadded_err), (padded_rc, padded_err) = results
    assert unpadded_rc != 0 and "expand_shape" in unpadded_err
    assert padded_rc == 0, padded_err


def _compile_rc(
    source: Path, seen: Problem, target: Target, requested: str, tmp_path: Path, i: int
) -> tuple[int, str]:
    spec = write_spec(tuning_spec([(seen, requested)]), tmp_path / f"gap_{i}.spec.mlir")
    proc = run_tool(
        "iree-compile",
        [str(source), *target.compile_flags, *target.tuning_spec_flags(spec),
         "-o", "/dev/null"],
    )
    return proc.returncode, first_error_line(proc.stderr)


def test_waves_per_eu_extra_knob_applies_on_gfx942(tmp_path: Path) -> None:
    target = get_target("gfx942")
    source, seen = _seen(Problem.matmul(256, 256, 256, "f16"), target, tmp_path)
    cands = enumerate_candidates(seen, target, limit=2, extra_knobs={"waves_per_eu": (0, 2)})
    _check(source, seen, target, cands.compilation_info(1), tmp_path / "w.vmfb", full=False)
