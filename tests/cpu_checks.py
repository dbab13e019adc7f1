"""Checks the CPU op-kind tests share: an op at another batch, a build run on seeded inputs, the
heuristic's first and last candidates applied and computing the default build's outputs, a
`dispatchtune tune` run through the CLI, and a model's dispatches dumped as a user dumps them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dispatchtune import load_problems, rank
from dispatchtune.ir.spec import applied_configs, config_applied, tuning_spec, write_spec
from dispatchtune.measure.verify import TensorType, compare, read_outputs, write_random_inputs
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates
from dispatchtune.search.cpu import configured_problem
from dispatchtune.targets import get_target
from dispatchtune.toolchain import run_tool

HOST = get_target("host")


def at_batch(path: Path, batch: int, tmp_path: Path) -> Path:
    """The fixture with its image and output batch set to `batch` (filters have none; the
    `tensor<1xi64>` of strides and dilations stays)."""
    out = tmp_path / f"{path.stem}_b{batch}.mlir"
    out.write_text(re.sub(r"tensor<1x(\d)", rf"tensor<{batch}x\1", path.read_text()))
    return out


def build_and_run(path: Path, spec: Path | None, name: str, inputs: tuple[str, ...],
                  result: TensorType, tmp_path: Path) -> np.ndarray:
    """Compile `path` (with `spec`), run it on local-sync and return its one output."""
    vmfb = tmp_path / f"{name}.vmfb"
    flags = list(HOST.tuning_spec_flags(spec)) if spec else []
    proc = run_tool("iree-compile", [str(path), *HOST.compile_flags, *flags, "-o", str(vmfb)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / f"{name}.bin"
    proc = run_tool("iree-run-module", [f"--module={vmfb}", "--device=local-sync", *inputs,
                                        f"--output=@{out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = read_outputs([out], [result])
    assert outputs is not None
    return outputs[0]


def first_and_last_apply_and_compute_the_same(path: Path, pipeline: str, tmp_path: Path) -> Problem:
    """The heuristic's first and last candidates of the one op in `path`: each applied exactly,
    compiled, and computing the default build's outputs (f32 tolerance). Returns the problem."""
    (problem,) = load_problems(path, HOST)
    candidates = enumerate_candidates(problem, HOST)
    assert set(candidates.table["pipeline"].astype(str)) == {pipeline}
    ordered = rank(candidates, order="heuristic")
    assert np.isfinite(ordered["score"].to_numpy(dtype=float)).all()
    configured = configured_problem(problem)  # batch 1: the unit batch loop IREE restores
    tensors = [TensorType(s, t) for s, t in
               zip(configured.operand_shapes, configured.element_types, strict=True)]
    inputs = write_random_inputs(tensors[:-1], tmp_path / "inputs", seed=0)
    assert inputs is not None
    want = build_and_run(path, None, "default", inputs, tensors[-1], tmp_path)
    for i in (0, len(ordered) - 1):
        info = candidates.compilation_info(int(ordered.candidate_id.iloc[i]))
        assert info.count("distribution = [") == 1 and pipeline in info
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec{i}.mlir")
        applied = applied_configs(path, HOST, spec)
        assert any(config_applied(info, got) for got in applied), (info, applied)
        got = build_and_run(path, spec, f"candidate{i}", inputs, tensors[-1], tmp_path)
        assert compare([got], [want], ["f32"])[0] == "ok"
    return problem


def tune_through_the_cli(path: Path, budget: int, out: Path) -> list[dict[str, Any]]:
    """`dispatchtune tune PATH --target host --budget N -o OUT`, as a user runs it; every candidate
    record must have built and verified. Returns the candidate records."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(path), "--target", "host",
         "--budget", str(budget), "--no-progress", "-o", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tried = [r for r in records if r["kind"] == "candidate"]
    assert len(tried) == budget
    assert all(r["compile_status"] == "ok" and r["verify_status"] == "ok" for r in tried), tried
    assert (out / "tuning_spec.mlir").exists()
    return tried


def dump_dispatches(model: Path, directory: Path) -> list[Path]:
    """The dispatch benchmarks of `model`, dumped into `directory` as the README says users do
    (`iree-compile --iree-hal-dump-executable-benchmarks-to=DIR`, the host target's flags)."""
    from dispatchtune.targets import get_target
    from dispatchtune.toolchain import tool_path

    proc = subprocess.run(
        [tool_path("iree-compile"), str(model), *get_target("host").compile_flags,
         f"--iree-hal-dump-executable-benchmarks-to={directory}", "-o", os.devnull],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return sorted(directory.glob("*_benchmark.mlir"))
