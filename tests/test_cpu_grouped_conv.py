"""Grouped 2-D convolutions on llvm-cpu (NHWGC/GFHWC and NGCHW/GFCHW, batch 1 and 2): the search
enumerates them under DoubleTilingExpert (IREE 3.13's own pipeline for them), the spec applies
sampled candidates exactly, they compile, and their outputs equal the default build's."""

from __future__ import annotations

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
NHWGC = FIXTURES / "cpu_grouped_conv_nhwgc_f32.mlir"
NGCHW = FIXTURES / "cpu_grouped_conv_ngchw_f32.mlir"


def _at_batch(path: Path, batch: int, tmp_path: Path) -> Path:
    """The fixture with its image and output batch set to `batch` (the filter has none)."""
    out = tmp_path / f"{path.stem}_b{batch}.mlir"
    out.write_text(path.read_text().replace("tensor<1x", f"tensor<{batch}x"))
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


@pytest.mark.parametrize(("fixture", "batch"), [(NHWGC, 1), (NHWGC, 2), (NGCHW, 1), (NGCHW, 2)])
def test_grouped_conv_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """Heuristic first and last candidates: applied exactly, compiled, outputs = default build's."""
    path = _at_batch(fixture, batch, tmp_path)
    (problem,) = load_problems(path, HOST)
    assert len(problem.loops("depth")) == 1 and problem.unit_batch_conv == (batch == 1)
    candidates = enumerate_candidates(problem, HOST)
    assert set(candidates.table["pipeline"].astype(str)) == {"DoubleTilingExpert"}
    ordered = rank(candidates, order="heuristic")
    assert np.isfinite(ordered["score"].to_numpy(dtype=float)).all()
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


def test_grouped_conv_space_follows_the_constraints() -> None:
    """C1-C3, C5 on the contiguous output loop, C6, C7; the group loop is the GEMM view's batch."""
    facts = HOST.cpu_facts()
    for path, contiguous in ((NHWGC, "vec_n"), (NGCHW, "vec_m")):
        (problem,) = load_problems(path, HOST)
        table = enumerate_candidates(problem, HOST).table
        groups, m, n, k = problem.gemm_shape
        assert (groups % table["tile_b"] == 0).all() and (m % table["tile_m"] == 0).all()
        assert (n % table["tile_n"] == 0).all() and (k % table["tile_k"] == 0).all()
        assert (table["tile_n"] % table["vec_n"] == 0).all()
        assert (table["vec_m"] * table["vec_n"] * 4 <= facts.vector_registers
                * facts.native_vector_bytes).all()
        assert (table["workgroups"] >= facts.cores).all()
        assert table["tile_b"].nunique() > 1  # the group loop is tiled
        size = n if contiguous == "vec_n" else problem.sizes("output_image")[1]
        full = (table[contiguous] * 4) % facts.native_vector_bytes == 0
        assert (full | (table[contiguous] == size)).all()


def test_grouped_conv_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune --budget 2` on the batch-1 NHWGC fixture: candidates build, verify and
    run, and a spec is written."""
    import json

    from dispatchtune.cli import main as cli_main

    out = tmp_path / "out"
    assert cli_main(["tune", str(NHWGC), "--target", "host", "--budget", "2", "-o", str(out)]) == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    tried = [r for r in records if r["kind"] == "candidate"]
    assert len(tried) == 2
    assert all(r["compile_status"] == "ok" and r["verify_status"] == "ok" for r in tried), tried
    assert (out / "tuning_spec.mlir").exists()


def test_grouped_conv_space_equals_a_brute_force() -> None:
    """Every knob combination satisfying the documented constraints, and nothing else."""
    import itertools

    (problem,) = load_problems(NGCHW, HOST)  # batch 1, NGCHW: C5 on the output width
    facts = HOST.cpu_facts()
    width, acc = facts.native_vector_bytes, 4
    groups, oc, ic = (problem.size(c) for c in ("depth", "output_channel", "input_channel"))
    oh, ow = problem.sizes("output_image")
    kw = problem.sizes("filter_loop")[1]

    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    def c5(v: int) -> bool:
        if (ow * acc) % width == 0:
            return (v * acc) % width == 0 or v == ow
        return (v * acc) % width == 0 or v == ow or (
            v * acc >= min(16, width) and width % (v * acc) == 0)

    want = set()
    for dg, doh, dow, doc, ric in itertools.product(
        divisors(groups), divisors(oh), divisors(ow), divisors(oc), divisors(ic)
    ):
        if dg * doh * dow * doc * facts.cores > groups * oh * ow * oc:
            continue
        for vow, voc, rkw in itertools.product(divisors(dow), divisors(doc), sorted({1, kw})):
            if c5(vow) and vow * voc * acc <= facts.vector_registers * width:
                want.add((1, dg, doh, dow, doc, vow, voc, ric, rkw))
    table = enumerate_candidates(problem, HOST).table
    # Re-expanded loops [n, g, oc, oh, ow, ic, kh, kw]: knob columns by loop index.
    dist = [f"knob_distribution_{i}" for i in (0, 1, 3, 4, 2)]
    vec = [f"knob_vector_common_parallel_{i}" for i in (4, 2)]
    red = [f"knob_vector_reduction_{i}" for i in (5, 7)]
    got = {tuple(int(v) for v in row) for row in table[dist + vec + red].to_numpy()}
    assert got == want and len(table) == len(want)
