"""The columnar engine enumerates exactly the solution set Z3 defines (no IREE needed here)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import z3

from dispatchtune.errors import DispatchTuneError
from dispatchtune.search.engine import ConstraintSystem, enumerate_blocking

FIXTURES = Path(__file__).parent / "fixtures"
TF_KNOBS = (
    "wg_0", "wg_1", "sg_0", "sg_1", "red_2", "sg_size", "wg_size_x", "wg_size_y", "wg_size_z",
    "prefetch_num_stages", "mma_idx",
)


def _rows(system: ConstraintSystem, names: tuple[str, ...], **kw: int) -> list[tuple[int, ...]]:
    rows: list[tuple[int, ...]] = []
    for chunk in system.solve(names, **kw):
        rows.extend(zip(*(chunk[n].tolist() for n in names), strict=True))
    return rows


def _satisfied(assertions: list[z3.BoolRef], values: dict[str, int]) -> bool:
    """Z3's own verdict on one assignment (other variables existentially quantified)."""
    solver = z3.Solver()
    solver.add(*assertions)
    return solver.check(*[z3.Int(k) == v for k, v in values.items()]) == z3.sat


def test_matches_brute_force_on_mixed_arithmetic() -> None:
    x, y, w = z3.Ints("x y w")
    assertions = [
        x >= -6, x <= 9, y >= -3, y <= 7, w >= 0, w <= 5,
        z3.Or(x % 3 == 1, y / 2 == -1),  # Euclidean div / mod with negative operands
        z3.If(x > 0, y * w, x - w) <= 8,
        z3.Distinct(x, y, w),
        z3.Implies(w == 2, x + y >= 1),
    ]
    system = ConstraintSystem.from_z3(assertions)
    got = _rows(system, ("x", "y", "w"))

    def euclid_mod(a: int, b: int) -> int:
        return a % abs(b)

    def euclid_div(a: int, b: int) -> int:
        return (a - euclid_mod(a, b)) // b

    want = [
        (a, b, c)
        for a, b, c in itertools.product(range(-6, 10), range(-3, 8), range(6))
        if (euclid_mod(a, 3) == 1 or euclid_div(b, 2) == -1)
        and ((b * c) if a > 0 else (a - c)) <= 8
        and len({a, b, c}) == 3
        and (c != 2 or a + b >= 1)
    ]
    assert sorted(got) == sorted(want)
    assert len(got) == len(set(got))
    assert set(got) == set(enumerate_blocking(assertions, ("x", "y", "w")))


def test_division_by_zero_follows_z3_semantics() -> None:
    # Z3 leaves `x mod 0` unspecified, so (x, 0) satisfies `x mod y == 1` for every x.
    x, y = z3.Ints("x y")
    assertions = [x >= 0, x <= 4, y >= 0, y <= 3, x % y == 1]
    system = ConstraintSystem.from_z3(assertions)
    assert not system.exact
    got = set(_rows(system, ("x", "y")))
    assert got == set(enumerate_blocking(assertions, ("x", "y")))
    assert {(v, 0) for v in range(5)} <= got


def test_definitions_and_order_are_deterministic() -> None:
    a, b, c = z3.Ints("a b c")
    assertions = [a >= 1, a <= 20, b >= 1, b <= 20, c == a * b, c % 7 == 0]
    system = ConstraintSystem.from_z3(assertions)
    plan = dict(system.plan())
    assert plan["c"] is not None  # c is computed from a and b, never enumerated
    first = _rows(system, ("a", "b", "c"))
    again = _rows(ConstraintSystem.from_z3(assertions), ("a", "b", "c"))
    assert first == again
    assert sorted(first) == sorted(
        (i, j, i * j) for i in range(1, 21) for j in range(1, 21) if (i * j) % 7 == 0
    )


def test_unbounded_variable_is_a_clear_error() -> None:
    x, y = z3.Ints("x y")
    system = ConstraintSystem.from_z3([x >= 0, x <= 3, y >= x])
    with pytest.raises(DispatchTuneError, match=r"not finite.*y"):
        list(system.solve())


def test_chunks_bound_memory_on_a_space_of_100k_plus() -> None:
    names = ("a", "b", "c", "d", "e")
    v = z3.Ints(" ".join(names))
    assertions = [z3.And(x >= 1, x <= 12) for x in v] + [v[0] + v[1] + v[2] + v[3] + v[4] <= 40]
    system = ConstraintSystem.from_z3(assertions)
    sizes = []
    total = 0
    for chunk in system.solve(names, chunk_rows=4096):
        rows = len(chunk["a"])
        sizes.append(rows)
        total += rows
        assert int(np.count_nonzero(np.sum([chunk[n] for n in names], axis=0) > 40)) == 0
    want = sum(1 for t in itertools.product(range(1, 13), repeat=5) if sum(t) <= 40)
    assert total == want > 100_000
    assert max(sizes) <= 4096 * 12  # a chunk never exceeds chunk_rows x the widest range


def test_gfx942_tileandfuse_fixture_has_1369_valid_solutions() -> None:
    """IREE's SMT-LIB for a 512^3 f16 matmul on gfx942 (the reference tool's 1,369).

    Completeness against blocking clauses is checked on smaller spaces in test_search_gpu.py
    (and on this one by benchmarks/enumeration_speed.py: the blocking run takes 7-40 s).
    """
    text = (FIXTURES / "search_gfx942_tileandfuse_512x512x512_f16.smt2").read_text()
    assertions = list(z3.parse_smt2_string(text))
    system = ConstraintSystem.from_smtlib(text)
    rows = _rows(system, TF_KNOBS)
    assert len(rows) == len(set(rows)) == 1369
    rng = np.random.default_rng(0)
    for i in rng.choice(len(rows), size=60, replace=False):
        assert _satisfied(assertions, dict(zip(TF_KNOBS, rows[int(i)], strict=True)))
