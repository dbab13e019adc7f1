"""Matrix-vector products on llvm-cpu (linalg.matvec: no N loop; linalg.vecmat: no M loop, as a
torch Linear on a 1-D input lowers): enumerated under DoubleTilingExpert, IREE 3.13's own pipeline
for them, the missing loop's knobs held at a unit tile; the heuristic's first and last candidates
apply exactly, compile and compute the default build's outputs, and `tune` runs through the CLI."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from cpu_checks import first_and_last_apply_and_compute_the_same, tune_through_the_cli

from dispatchtune import load_problems
from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")
MATVEC = FIXTURES / "cpu_matvec_f32.mlir"
VECMAT = FIXTURES / "cpu_vecmat_f32.mlir"


@pytest.mark.parametrize("fixture", [MATVEC, VECMAT])
def test_matvec_candidates_apply_compile_and_compute_the_same(fixture: Path, tmp_path: Path) -> None:
    problem = first_and_last_apply_and_compute_the_same(fixture, "DoubleTilingExpert", tmp_path)
    assert len(problem.loop_sizes) == 2 and len(problem.loops("k")) == 1
    table = enumerate_candidates(problem, HOST).table
    missing = "n" if fixture == MATVEC else "m"
    assert (table[f"tile_{missing}"] == 1).all() and (table[f"vec_{missing}"] == 1).all()


def test_vecmat_space_equals_a_brute_force() -> None:
    """C1-C7 on (N, K) alone: the contraction model with M a unit loop, nothing else."""
    (problem,) = load_problems(VECMAT, HOST)
    facts = HOST.cpu_facts()
    width, acc, cores = facts.native_vector_bytes, 4, facts.cores
    n, k = problem.size("n"), problem.size("k")

    def divisors(size: int) -> list[int]:
        return [d for d in range(1, size + 1) if size % d == 0]

    want = set()
    for dn, rk in itertools.product(divisors(n), divisors(k)):
        if dn * cores > n:
            continue
        for vn in divisors(dn):
            if (((vn * acc) % width == 0 or vn == n) and vn * acc <= facts.vector_registers * width
                    and vn * rk * acc < facts.max_vector_bytes):
                want.add((dn, vn, rk))
    table = enumerate_candidates(problem, HOST).table
    got = list(table[["tile_n", "vec_n", "tile_k"]].itertuples(index=False, name=None))
    assert len(got) == len(set(got)) and set(got) == want
    assert (table["knob_distribution_0"] == table["tile_n"]).all()


def test_vecmat_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune FILE --target host --budget 2 -o DIR`, as a user runs it."""
    tune_through_the_cli(VECMAT, 2, tmp_path / "out")
