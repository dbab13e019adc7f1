"""3-D convolutions on llvm-cpu (NDHWC/DHWCF and NCDHW/FCDHW, batch 1 and 2), and the
convolutions PyTorch video and mobile models bring that IREE 3.13 lowers with DoubleTilingExpert
rather than its conv pipeline (a (1, 3, 3) or (3, 1, 1) Conv3d with its unit filter loops folded
away, depthwise NCHW/CHW, NHWC/FHWC): each space uses IREE's own pipeline for the op, sampled
candidates apply exactly, compile and compute the default build's outputs, and the 3-D space is
exactly its documented constraints."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_checks import at_batch, first_and_last_apply_and_compute_the_same, tune_through_the_cli

from dispatchtune import load_problems
from dispatchtune.ir.spec import applied_configs
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
EXAMPLES = Path(__file__).parents[1] / "examples"
HOST = get_target("host")
NDHWC = FIXTURES / "cpu_conv3d_ndhwc_f32.mlir"
NCDHW = FIXTURES / "cpu_conv3d_ncdhw_f32.mlir"
DEPTH_BATCH = FIXTURES / "cpu_conv2d_depth_batch_f32.mlir"
TWO_BATCH_LOOPS = FIXTURES / "cpu_conv1d_two_batch_loops_f32.mlir"
DEPTHWISE_NCHW = FIXTURES / "cpu_depthwise_nchw_f32.mlir"
NHWC_FHWC = FIXTURES / "cpu_conv_nhwc_fhwc_f32.mlir"


@pytest.mark.parametrize(("fixture", "batch"), [(NDHWC, 1), (NDHWC, 2), (NCDHW, 1), (NCDHW, 2)])
def test_conv3d_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """Heuristic first and last candidates: applied exactly, compiled, outputs = default build's;
    a unit-batch 3-D conv is configured through the spec's batch-restoring step like 2-D ones."""
    path = at_batch(fixture, batch, tmp_path)
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert len(problem.loops("output_image")) == 3 and problem.unit_batch_conv == (batch == 1)


@pytest.mark.parametrize("fixture", [DEPTH_BATCH, TWO_BATCH_LOOPS, DEPTHWISE_NCHW, NHWC_FHWC])
def test_double_tiled_convs_apply_compile_and_compute_the_same(fixture: Path, tmp_path: Path) -> None:
    """The layouts IREE lowers with DoubleTilingExpert: candidates under that pipeline apply and
    compute the default build's outputs (several batch loops each get a distribution tile)."""
    problem = first_and_last_apply_and_compute_the_same(fixture, "DoubleTilingExpert", tmp_path)
    table = enumerate_candidates(problem, HOST).table
    batch_tiles = [f"knob_distribution_{i}" for i in problem.loops("batch")]
    tile_b = table[batch_tiles].prod(axis=1) if batch_tiles else 1
    assert (table["tile_m"] % tile_b == 0).all()
    if fixture == TWO_BATCH_LOOPS:
        assert len(problem.loops("batch")) == 2 and (table[batch_tiles] > 1).any().all()


@pytest.mark.parametrize("fixture", [
    EXAMPLES / "conv_nhwc_f32.mlir", FIXTURES / "cpu_conv_nchw_f32.mlir",
    FIXTURES / "cpu_depthwise_nhwc_f32.mlir", FIXTURES / "cpu_conv1d_nwc_f32.mlir",
    NDHWC, NCDHW, DEPTH_BATCH, TWO_BATCH_LOOPS, DEPTHWISE_NCHW, NHWC_FHWC,
])
def test_the_pipeline_is_iree_own_for_each_conv_layout(fixture: Path) -> None:
    """The space's pipeline is the one IREE 3.13 configures the op with when no spec is given
    (read back from `iree-compile`): the conv pipeline only for its 2-D layouts."""
    (problem,) = load_problems(fixture, HOST)
    (pipeline,) = set(enumerate_candidates(problem, HOST).table["pipeline"].astype(str))
    defaults = applied_configs(fixture, HOST, None)
    assert defaults and all(f"#iree_cpu.pipeline<{pipeline}>" in text for text in defaults), (
        pipeline, defaults)


def test_conv3d_space_equals_a_brute_force(tmp_path: Path) -> None:
    """C1-C7 on (N, OD, OH, OW, OC) and IC, the output depth and height and the filter loops
    tiled to 1 within a workgroup, nothing else (NDHWC: the output channels are contiguous)."""
    (problem,) = load_problems(at_batch(NDHWC, 2, tmp_path), HOST)
    facts = HOST.cpu_facts()
    width, acc, cores = facts.native_vector_bytes, 4, facts.cores
    nb = problem.size("batch")
    od, oh, ow = problem.sizes("output_image")
    oc, ic = problem.size("output_channel"), problem.size("input_channel")

    def divisors(n: int) -> list[int]:
        return [d for d in range(1, n + 1) if n % d == 0]

    def c5(v: int) -> bool:
        return (v * acc) % width == 0 or v == oc

    want = set()
    for dn, dd, dh, dw, dc, ric in itertools.product(
        divisors(nb), divisors(od), divisors(oh), divisors(ow), divisors(oc), divisors(ic)
    ):
        if dn * dd * dh * dw * dc * cores > nb * od * oh * ow * oc:
            continue
        for vw, vc in itertools.product(divisors(dw), divisors(dc)):
            if (c5(vc) and vw * vc * acc <= facts.vector_registers * width
                    and vw * vc * ric * acc < facts.max_vector_bytes):
                want.add((dn, dd, dh, dw, dc, vw, vc, ric))
    table = enumerate_candidates(problem, HOST).table
    lists = {name: [f"knob_{name}_{i}" for i in range(9)]
             for name in ("distribution", "vector_common_parallel", "vector_reduction")}
    got = [(*row[:5], row[5 + 3], row[5 + 4], row[10 + 8])
           for row in table[[*lists["distribution"][:5], *lists["vector_common_parallel"][:5],
                             *lists["vector_reduction"]]].itertuples(index=False, name=None)]
    assert len(got) == len(set(got)) and set(got) == want
    vectors = table[lists["vector_common_parallel"][:3]].to_numpy()
    assert (vectors == 1).all()  # batch, output depth and height: one row at a time
    reductions = table[lists["vector_reduction"][5:8]].to_numpy()
    assert (reductions == 1).all()  # the filter loops: one step at a time
    assert (table["tile_m"] == table[lists["distribution"][:4]].prod(axis=1)).all()


def test_conv3d_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune FILE --target host --budget 2 -o DIR`, as a user runs it on a 3-D
    convolution: both candidates build, are applied and verify, and a spec is written."""
    tune_through_the_cli(NCDHW, 2, tmp_path / "out")


def test_an_exported_video_model_ranks_its_conv3d() -> None:
    """`dispatchtune rank MODEL --target host --limit 1` on an iree-turbine export (torch dialect)
    whose Conv3d was refused before: its 3-D convolution is ranked, nothing is left unranked."""
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "rank", str(FIXTURES / "torch_video_conv3d_f32.mlir"),
         "--target", "host", "--limit", "1"],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "not ranked" not in proc.stderr
    assert re.search(r"output_image=8x16x16 .* filter_loop=3x3x3 .*: \d+ candidates", proc.stdout)
    assert "DoubleTilingExpert" in proc.stdout
