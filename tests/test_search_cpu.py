"""The llvm-cpu Z3 model: exact against a brute force, sane, and tied to what IREE compiles."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import z3

from dispatchtune.errors import DispatchTuneError, UnsupportedProblem
from dispatchtune.problem import Problem
from dispatchtune.search import cpu as cpu_search
from dispatchtune.search import enumerate_candidates
from dispatchtune.search.cpu import cpu_model
from dispatchtune.targets import Target, get_target
from dispatchtune.toolchain import run_tool

HOST = get_target("host")
FIXTURES = Path(__file__).parent / "fixtures"
FACTS = HOST.cpu_facts()
# Fixed CPUs, so that what a test expects does not depend on the machine it runs on (the space
# follows the vector width and register count). Compiling for them works on any x86 machine.
AVX2 = get_target("llvm-cpu:x86-64-v3")
AVX512 = get_target("llvm-cpu:x86-64-v4")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _c5(vec: int, size: int, acc: int, w: int) -> bool:
    if (vec * acc) % w == 0 or vec == size:
        return True
    return (size * acc) % w != 0 and vec * acc >= min(16, w) and w % (vec * acc) == 0


def _brute_force_contraction(b: int, m: int, n: int, k: int, acc: int) -> set[tuple[int, ...]]:
    """C1-C7 restated independently of the Z3 model, by plain enumeration of divisors."""
    w, r, cores = FACTS.native_vector_bytes, FACTS.vector_registers, FACTS.cores
    out: set[tuple[int, ...]] = set()
    for db, dm, dn, rk in itertools.product(_divisors(b), _divisors(m), _divisors(n), _divisors(k)):
        for vm, vn in itertools.product(_divisors(dm), _divisors(dn)):
            if (
                vm * vn * rk * acc < FACTS.max_vector_bytes
                and _c5(vn, n, acc, w)
                and vm * vn * acc <= r * w
                and (b // db) * (m // dm) * (n // dn) >= cores
            ):
                out.add((db, dm, dn, vm, vn, rk))
    return out


@pytest.mark.parametrize(
    "problem",
    [
        Problem.matmul(64, 48, 32, "f32"),
        Problem.matmul(32, 96, 24, "f16", transpose_b=True),
        Problem.batch_matmul(3, 32, 32, 16, "f32"),
        Problem.matmul(40, 24, 30, "f32"),  # N not a multiple of the native width
    ],
    ids=["matmul", "matmul_t_f16", "batch_matmul", "narrow"],
)
def test_contraction_space_equals_brute_force(problem: Problem) -> None:
    t = enumerate_candidates(problem, HOST).table
    columns = ["tile_b", "tile_m", "tile_n", "vec_m", "vec_n", "tile_k"]
    got = list(t[columns].itertuples(index=False, name=None))
    b, m, n, k = problem.gemm_shape
    assert len(got) == len(set(got)) > 0
    assert set(got) == _brute_force_contraction(b, m, n, k, 4)


def _two_m_loop_contraction(m1: int, m2: int, n: int, k: int) -> Problem:
    """out[n, m1, m2] = sum_k w[n, k] * x[k, m1, m2]: a 1x1 NCHW convolution at batch 1."""
    maps = (
        "(d0, d1, d2, d3) -> (d3, d1, d2)",
        "(d0, d1, d2, d3) -> (d0, d3)",
        "(d0, d1, d2, d3) -> (d0, d1, d2)",
    )
    return Problem(
        kind="contraction", loop_sizes=(n, m1, m2, k),
        dims={"batch": (), "m": (1, 2), "n": (0,), "k": (3,)},
        element_types=("f32", "f32", "f32"),
        operand_shapes=((k, m1, m2), (n, k), (n, m1, m2)), indexing_maps=maps,
    )


def test_multi_loop_contraction_space_equals_brute_force() -> None:
    """Per-loop tiles; C4/C6/C7 on products; C5 on the contiguous output loop (the inner M)."""
    m1, m2, n, k = 6, 8, 24, 8
    w, r, cores = FACTS.native_vector_bytes, FACTS.vector_registers, FACTS.cores
    expected = set()
    for dn, d1, d2, rk in itertools.product(
        _divisors(n), _divisors(m1), _divisors(m2), _divisors(k)
    ):
        for vn, v1, v2 in itertools.product(_divisors(dn), _divisors(d1), _divisors(d2)):
            if (
                v1 * v2 * vn * rk * 4 < FACTS.max_vector_bytes
                and _c5(v2, m2, 4, w)
                and v1 * v2 * vn * 4 <= r * w
                and (n // dn) * (m1 // d1) * (m2 // d2) >= cores
            ):
                expected.add((dn, d1, d2, vn, v1, v2, rk))
    t = enumerate_candidates(_two_m_loop_contraction(m1, m2, n, k), HOST).table
    cols = [f"knob_distribution_{i}" for i in range(3)]
    cols += [f"knob_vector_common_parallel_{i}" for i in range(3)] + ["knob_vector_reduction_3"]
    got = {tuple(int(v) for v in row) for row in t[cols].itertuples(index=False)}
    assert got == expected and len(t) == len(expected)
    assert (t["tile_m"] == t["knob_distribution_1"] * t["knob_distribution_2"]).all()
    assert (t["vec_m"] == t["knob_vector_common_parallel_1"] * t["knob_vector_common_parallel_2"]).all()


def test_conv_space_equals_brute_force() -> None:
    problem = Problem.conv2d_nhwc_hwcf(2, 6, 8, 8, 32, 3, 3)
    t = enumerate_candidates(problem, HOST).table
    w, r, cores = FACTS.native_vector_bytes, FACTS.vector_registers, FACTS.cores
    want = set()
    for dn, doh, dow, doc, ric in itertools.product(
        _divisors(2), _divisors(6), _divisors(8), _divisors(32), _divisors(8)
    ):
        for vow, voc in itertools.product(_divisors(dow), _divisors(doc)):
            if (
                vow * voc * ric * 4 < FACTS.max_vector_bytes
                and _c5(voc, 32, 4, w)
                and vow * voc * 4 <= r * w
                and (2 // dn) * (6 // doh) * (8 // dow) * (32 // doc) >= cores
            ):
                want.add((dn, doh, dow, doc, vow, voc, ric))
    cols = [
        "knob_distribution_0", "tile_oh", "tile_ow", "tile_n", "vec_ow", "vec_n", "tile_k",
    ]
    got = list(t[cols].itertuples(index=False, name=None))
    assert len(got) == len(set(got)) and set(got) == want
    assert (t["tile_m"] == t["knob_distribution_0"] * t["tile_oh"] * t["tile_ow"]).all()


def test_every_candidate_satisfies_the_z3_model() -> None:
    problem = Problem.matmul(64, 64, 48, "f32")
    model = cpu_model(problem, FACTS)
    t = enumerate_candidates(problem, HOST).table
    solver = z3.Solver()
    solver.add(*model.assertions)
    names = {"dist_b": "tile_b", "dist_m": "tile_m", "dist_n": "tile_n", "vec_m": "vec_m",
             "vec_n": "vec_n", "red_k": "tile_k"}
    for row in t.itertuples(index=False):
        fixed = [z3.Int(v) == int(getattr(row, c)) for v, c in names.items()]
        assert solver.check(*fixed) == z3.sat
    assert len(model.reasons) == len(model.assertions)
    assert all(reason[:2] in {"C1", "C2", "C3", "C4", "C5", "C6", "C7"} for reason in model.reasons)


def test_matmul_512_space_is_sized_and_holds_default_and_slow_configs() -> None:
    cands = enumerate_candidates(Problem.matmul(512, 512, 512, "f32"), AVX512)
    t = cands.table
    assert 300 <= len(t) <= 5000
    key = ["tile_m", "tile_n", "vec_m", "vec_n", "tile_k"]
    configs = set(t[key].itertuples(index=False, name=None))
    assert (64, 64, 8, 16, 16) in configs  # IREE's own default
    assert (64, 128, 1, 16, 1) in configs  # measured 6.8x slower than the best: must stay
    assert (64, 64, 64, 64, 64) not in configs  # IREE rejects it (vector size)
    assert set(t["pipeline"]) == {"DoubleTilingExpert"}
    assert (t["intrinsic"] == "").all() and (t["mma_m"] == 0).all()
    assert (t["workgroups"] == (512 // t["tile_m"]) * (512 // t["tile_n"])).all()
    text = cands.compilation_info(0)
    row = t.iloc[0]
    assert text == (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        f"distribution = [{row.tile_m}, {row.tile_n}, 0], "
        f"vector_common_parallel = [{row.vec_m}, {row.vec_n}, 0], "
        f"vector_reduction = [0, 0, {row.tile_k}]>, translation_info = "
        "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )
    again = enumerate_candidates(Problem.matmul(512, 512, 512, "f32"), AVX512, limit=10)
    pd.testing.assert_frame_equal(again.table, t.iloc[:10].reset_index(drop=True))


def test_batch_matmul_lists_have_one_entry_per_loop() -> None:
    cands = enumerate_candidates(Problem.batch_matmul(4, 64, 64, 32), HOST)
    text = cands.compilation_info(len(cands) - 1)
    for name in ("distribution", "vector_common_parallel", "vector_reduction"):
        values = text.split(f"{name} = [")[1].split("]")[0].split(", ")
        assert len(values) == 4
    assert (cands.table["knob_vector_common_parallel_0"] == 1).all()
    assert set(cands.table["tile_b"]) == {1, 2, 4}


def _compile_matmul(target: Target, vec: tuple[int, int], red: int) -> int:
    """Compile a 256^3 f32 matmul carrying a config (on the op) for a CPU; return the rc."""
    ci = (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        f"distribution = [128, 128, 0], vector_common_parallel = [{vec[0]}, {vec[1]}, 0], "
        f"vector_reduction = [0, 0, {red}]>, translation_info = "
        "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )
    source = Problem.matmul(256, 256, 256).to_mlir().replace(
        "linalg.generic {", f"linalg.generic {{compilation_info = {ci}, ", 1
    )
    args = ["-", *target.compile_flags, "-o", "/dev/null"]
    return run_tool("iree-compile", args, input_text=source).returncode


@pytest.mark.parametrize(
    ("target", "fits", "too_big"),
    [(AVX512, ((8, 8), 127), ((4, 16), 128)), (AVX2, ((8, 8), 63), ((8, 8), 64))],
    ids=["avx512", "avx2"],
)
def test_vector_size_constraint_is_the_compiler_limit(
    target: Target, fits: tuple[tuple[int, int], int], too_big: tuple[tuple[int, int], int]
) -> None:
    """C4's bound is where IREE starts rejecting: 512 native vectors (8192 f32 on AVX-512)."""
    facts = target.cpu_facts()
    limit = facts.max_vector_bytes // 4
    assert limit == 512 * facts.native_vector_bytes // 4
    assert math.prod(fits[0]) * fits[1] < limit == math.prod(too_big[0]) * too_big[1]
    assert _compile_matmul(target, *fits) == 0
    assert _compile_matmul(target, *too_big) != 0
    configs = enumerate_candidates(Problem.matmul(256, 256, 256), target).table
    assert int((configs["vec_m"] * configs["vec_n"] * configs["tile_k"]).max()) < limit


def test_unsupported_cpu_inputs_are_one_line_errors() -> None:
    with pytest.raises(UnsupportedProblem, match="not pooling"):
        pooling = Problem.conv2d_nhwc_hwcf(2, 8, 8, 16, 16, 3, 3)
        enumerate_candidates(
            replace(pooling, dims={"batch": (0,), "output_image": (1, 2), "filter_loop": (4, 5)}),
            HOST,
        )
    with pytest.raises(DispatchTuneError, match="use DoubleTilingExpert"):
        enumerate_candidates(
            Problem.matmul(64, 64, 64), HOST, pipeline="ConvTileAndDecomposeExpert"
        )
    with pytest.raises(DispatchTuneError, match="unknown CPU pipeline"):
        enumerate_candidates(Problem.matmul(64, 64, 64), HOST, pipeline="TileAndFuse")
    with pytest.raises(DispatchTuneError, match="GPU targets only"):
        enumerate_candidates(Problem.matmul(64, 64, 64), HOST, extra_knobs={"x": (1,)})


def test_an_empty_cpu_space_is_a_reason_not_an_empty_ranking(tmp_path: Path) -> None:
    """An attention over 4093 (prime) keys and values: no tile meets C5/C6 however relaxed. It
    used to rank as "0 candidates"; now, as on GPUs, the dispatch is skipped with the reason
    (one line, exit 2 when it is the only one)."""
    problem = Problem.attention(1, 4093, 4093, 64, 4093, "f32")
    with pytest.raises(UnsupportedProblem, match=r"CPU space of attention .* is empty"):
        enumerate_candidates(problem, HOST)
    source = tmp_path / "attention.mlir"
    source.write_text(problem.to_mlir())
    done = subprocess.run([sys.executable, "-m", "dispatchtune", "rank", str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "no dispatch could be ranked" in line and "is empty" in line


@pytest.mark.parametrize("cores", [2, 8])
def test_a_problem_too_small_for_every_core_asks_for_the_workgroups_it_can_have(cores: int) -> None:
    """A classifier's 1x10 output cannot give 2+ cores a workgroup under C1-C6: C7 relaxes to as
    many as the problem allows (one here) instead of leaving the space empty; IREE's default
    (one workgroup, the whole N as vector) is in it, and the config compiles."""
    problem = Problem.matmul(1, 10, 57600, "f32")
    facts = replace(AVX512.cpu_facts(), cores=cores)
    strict_chunks = cpu_search._solve(cpu_model(problem, facts), None)
    assert sum(len(c["dist_n"]) for c in strict_chunks) == 0  # the strict C7 leaves nothing
    model, chunks = cpu_search._solve_least_relaxed(problem, facts, None)
    rows = pd.DataFrame({v: np.concatenate([c[v] for c in chunks]) for v in model.variables})
    assert len(rows) > 0
    assert ((rows["dist_n"] == 10) & (rows["vec_n"] == 10) & (rows["red_k"] == 16)).any()
    # A problem with room for every core keeps the strict C7.
    big, _ = cpu_search._solve_least_relaxed(Problem.matmul(512, 512, 512, "f32"), facts, 10)
    strict = cpu_model(Problem.matmul(512, 512, 512, "f32"), facts)
    assert [str(a) for a in big.assertions] == [str(a) for a in strict.assertions]
    table = enumerate_candidates(problem, AVX512).table
    assert len(table) > 0 and (table["workgroups"] >= 1).all()


def test_a_vocabulary_wide_contraction_admits_partial_tiles_only_when_nothing_else_fits() -> None:
    """N = 50257 (GPT-2's vocabulary, 29 x 1733) has no divisor C2/C5/C6 accept: the strict space
    is empty. Power-of-two distribution tiles with a partial last tile are admitted there, as
    IREE's own default does (distribution 64, vector 16), and such a config compiles."""
    problem = Problem.matmul(32, 50257, 128, "f32")
    facts = AVX512.cpu_facts()
    strict = cpu_search._solve(cpu_model(problem, facts, workgroups=1), None)
    assert sum(len(c["dist_n"]) for c in strict) == 0
    table = enumerate_candidates(problem, AVX512).table
    assert len(table) > 0
    pow2 = (table["tile_n"] & (table["tile_n"] - 1)) == 0
    assert (pow2 | (50257 % table["tile_n"] == 0)).all()
    assert ((table["tile_n"] == 64) & (table["vec_n"] == 16)).any()
    assert (table["workgroups"] == (32 // table["tile_m"]) * -(-50257 // table["tile_n"])).all()
    # M = 32 fills whole vectors of its own: its tiles still divide it.
    assert (32 % table["tile_m"] == 0).all()
    row = table[(table["tile_n"] == 64) & (table["vec_n"] == 16)].iloc[0]
    ci = (
        "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
        f"distribution = [{row.tile_m}, 64, 0], vector_common_parallel = [{row.vec_m}, 16, 0], "
        f"vector_reduction = [0, 0, {row.tile_k}]>, translation_info = "
        "#iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
    )
    source = problem.to_mlir().replace(
        "linalg.generic {", f"linalg.generic {{compilation_info = {ci}, ", 1
    )
    args = ["-", *AVX512.compile_flags, "-o", "/dev/null"]
    assert run_tool("iree-compile", args, input_text=source).returncode == 0
    # A size that leaves a strict space keeps dividing tiles (512: C1 as before).
    assert (512 % enumerate_candidates(Problem.matmul(512, 512, 512), AVX512).table["tile_n"] == 0).all()


def test_an_audio_conv_with_an_odd_output_width_admits_partial_tiles(tmp_path: Path) -> None:
    """A wav2vec-style strided 1-D convolution to 799 = 17 x 47 outputs (NCW, the contiguous loop)
    had an empty CPU space: no divisor of 799 fills native vectors. Power-of-two distribution
    tiles on the output width and channels, the last one partial, are admitted there as for
    contractions; tuned as the README shows, a candidate builds and matches the default's output."""
    import json
    import subprocess
    import sys

    from dispatchtune.ir.frontend import load_problems

    source = FIXTURES / "conv1d_ncw_799_f32.mlir"
    (problem,) = load_problems(source, HOST)
    facts = HOST.cpu_facts()
    strict = cpu_search._solve(cpu_model(problem, facts, workgroups=1), None)
    assert sum(len(c["dist_ow"]) for c in strict) == 0
    table = enumerate_candidates(problem, HOST).table
    assert len(table) > 0
    ow = table["tile_ow"]
    assert (((ow & (ow - 1)) == 0) | (799 % ow == 0)).all()
    assert (799 % ow != 0).any()

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune", str(source), "--target", "host",
         "--budget", "1", "-o", str(out), "--repetitions", "2", "--confirm-top", "0"],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    (measured,) = [r for r in records if r["kind"] == "candidate"]
    assert 799 % measured["knobs"]["tile_ow"] != 0  # a partial last tile
    assert measured["compile_status"] == "ok" and measured["verify_status"] == "ok"
