"""1-D convolutions on llvm-cpu (NWC/WCF and depthwise NWC/WC, batch 1 and 2): enumerated under
DoubleTilingExpert (IREE 3.13's own pipeline for them), unit-batch ones configured through the
spec's batch-restoring step like 2-D ones; sampled candidates apply exactly, compile and compute
the default build's outputs, and the space is exactly its documented constraints."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from cpu_checks import at_batch, first_and_last_apply_and_compute_the_same, tune_through_the_cli

from dispatchtune import load_problems
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")
CONV1D = FIXTURES / "cpu_conv1d_nwc_f32.mlir"
DEPTHWISE1D = FIXTURES / "cpu_depthwise_conv1d_nwc_f32.mlir"


@pytest.mark.parametrize(
    ("fixture", "batch"), [(CONV1D, 1), (CONV1D, 2), (DEPTHWISE1D, 1), (DEPTHWISE1D, 2)]
)
def test_conv1d_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """Heuristic first and last candidates: applied exactly, compiled, outputs = default build's."""
    path = at_batch(fixture, batch, tmp_path)
    problem = first_and_last_apply_and_compute_the_same(path, "DoubleTilingExpert", tmp_path)
    assert len(problem.loops("output_image")) == 1 and problem.unit_batch_conv == (batch == 1)
    assert (enumerate_candidates(problem, HOST).table["tile_oh"] == 1).all()


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
    tune_through_the_cli(CONV1D, 2, tmp_path / "out")
