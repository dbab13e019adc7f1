"""1-D convolutions on llvm-cpu (NWC/WCF and depthwise NWC/WC, batch 1 and 2): enumerated under
DoubleTilingExpert (IREE 3.13's own pipeline for them), unit-batch ones configured through the
spec's batch-restoring step like 2-D ones; sampled candidates apply exactly, compile and compute
the default build's outputs, and the space is exactly its documented constraints."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dispatchtune import load_problems, rank
from dispatchtune.ir.spec import applied_configs, config_applied, tuning_spec, write_spec
from dispatchtune.measure.verify import TensorType, compare, read_outputs, write_random_inputs
from dispatchtune.search import enumerate_candidates
from dispatchtune.search.cpu import configured_problem
from dispatchtune.targets import get_target
from dispatchtune.toolchain import run_tool

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")
CONV1D = FIXTURES / "cpu_conv1d_nwc_f32.mlir"
DEPTHWISE1D = FIXTURES / "cpu_depthwise_conv1d_nwc_f32.mlir"


def _at_batch(path: Path, batch: int, tmp_path: Path) -> Path:
    out = tmp_path / f"{path.stem}_b{batch}.mlir"
    # Image and output tensors only: `tensor<1xi64>` (strides, dilations) stays.
    out.write_text(re.sub(r"tensor<1x(\d)", rf"tensor<{batch}x\1", path.read_text()))
    return out


def _build_and_run(path: Path, spec: Path | None, name: str, inputs: tuple[str, ...],
                   result: TensorType, tmp_path: Path) -> np.ndarray:
    vmfb = tmp_path / f"{name}.vmfb"
    flags = [f"{HOST.tuning_spec_flag}={spec}"] if spec else []
    proc = run_tool("iree-compile", [str(path), *HOST.compile_flags, *flags, "-o", str(vmfb)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / f"{name}.bin"
    proc = run_tool("iree-run-module", [f"--module={vmfb}", "--device=local-sync", *inputs,
                                        f"--output=@{out}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    outputs = read_outputs([out], [result])
    assert outputs is not None
    return outputs[0]


@pytest.mark.parametrize(
    ("fixture", "batch"), [(CONV1D, 1), (CONV1D, 2), (DEPTHWISE1D, 1), (DEPTHWISE1D, 2)]
)
def test_conv1d_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """Heuristic first and last candidates: applied exactly, compiled, outputs = default build's."""
    path = _at_batch(fixture, batch, tmp_path)
    (problem,) = load_problems(path, HOST)
    assert len(problem.loops("output_image")) == 1 and problem.unit_batch_conv == (batch == 1)
    candidates = enumerate_candidates(problem, HOST)
    assert set(candidates.table["pipeline"].astype(str)) == {"DoubleTilingExpert"}
    assert (candidates.table["tile_oh"] == 1).all()
    ordered = rank(candidates, order="heuristic")
    configured = configured_problem(problem)  # batch 1: the unit batch loop IREE restores
    tensors = [TensorType(s, t) for s, t in
               zip(configured.operand_shapes, configured.element_types, strict=True)]
    inputs = write_random_inputs(tensors[:-1], tmp_path / "inputs", seed=0)
    assert inputs is not None
    want = _build_and_run(path, None, "default", inputs, tensors[-1], tmp_path)
    for i in (0, len(ordered) - 1):
        info = candidates.compilation_info(int(ordered.candidate_id.iloc[i]))
        assert info.count("distribution = [") == 1 and "DoubleTilingExpert" in info
        spec = write_spec(tuning_spec([(problem, info)]), tmp_path / f"spec{i}.mlir")
        applied = applied_configs(path, HOST, spec)
        assert any(config_applied(info, got) for got in applied), (info, applied)
        got = _build_and_run(path, spec, f"candidate{i}", inputs, tensors[-1], tmp_path)
        assert compare([got], [want], ["f32"])[0] == "ok"


def test_conv1d_space_equals_a_brute_force() -> None:
    """C1-C7 on (N, OW, OC) and IC (the filter width reduces one at a time), nothing else."""
    (problem,) = load_problems(CONV1D, HOST)
    facts = HOST.cpu_facts()
    width, acc, cores = facts.native_vector_bytes, 4, facts.cores
    (ow,), oc, ic = problem.sizes("output_image"), problem.size("output_channel"), problem.size(
        "input_channel")

    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    def c5(v: int) -> bool:  # NWC: the output channels are contiguous; 64 f32 fill whole vectors
        return (v * acc) % width == 0 or v == oc

    want = set()
    for dow, doc, ric in itertools.product(divisors(ow), divisors(oc), divisors(ic)):
        if dow * doc * cores > ow * oc:
            continue
        for vow, voc in itertools.product(divisors(dow), divisors(doc)):
            if (c5(voc) and vow * voc * acc <= facts.vector_registers * width
                    and vow * voc * ric * acc < facts.max_vector_bytes):
                want.add((1, dow, doc, vow, voc, ric))
    table = enumerate_candidates(problem, HOST).table
    cols = ["knob_distribution_0", "tile_ow", "tile_n", "vec_ow", "vec_n", "tile_k"]
    got = list(table[cols].itertuples(index=False, name=None))
    assert len(got) == len(set(got)) and set(got) == want
    assert (table["tile_m"] == table["tile_ow"]).all()


def test_conv1d_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune FILE --target host --budget 2 -o DIR`, as a user runs it: both
    candidates build, are applied and verify, and a spec is written."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(CONV1D), "--target", "host",
         "--budget", "2", "-o", str(out), "--no-progress"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tried = [r for r in records if r["kind"] == "candidate"]
    assert len(tried) == 2
    assert all(r["compile_status"] == "ok" and r["verify_status"] == "ok" for r in tried), tried
    assert (out / "tuning_spec.mlir").exists()
