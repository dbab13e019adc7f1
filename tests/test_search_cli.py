"""`dispatchtune candidates`: JSON lines equal the Python API's table; errors are one line.
`rank` and `inspect` over a model or a dump directory skip the dispatches they cannot handle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_checks import dump_dispatches

from dispatchtune.cli import main
from dispatchtune.problem import Problem
from dispatchtune.search import enumerate_candidates

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: One matmul (ranked), one max pooling (refused by the CPU search), one elementwise add.
MIXED = FIXTURES / "matmul_pool_add_f32.mlir"
MATMUL_KEY = "contraction_64x64x128_f32"
POOL_KEY = "convolution_16x8x8x3x3_f32"


def dispatchtune(*args: str) -> subprocess.CompletedProcess[str]:
    """The command line as a user runs it."""
    return subprocess.run([sys.executable, "-m", "dispatchtune", *args], capture_output=True,
                          text=True, timeout=600)


def test_json_lines_match_the_api(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["candidates", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", "host",
               "--limit", "5", "--json"])
    assert rc == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    api = enumerate_candidates(Problem.matmul(512, 512, 512, "f32"), "host", limit=5)
    assert [line["rank"] for line in lines] == list(range(5))
    for line in lines:
        row = api.table.iloc[line["rank"]]
        assert line["pipeline"] == row["pipeline"] == "DoubleTilingExpert"
        assert line["compilation_info"] == api.compilation_info(line["rank"])
        for column in ("tile_m", "tile_n", "tile_k", "vec_m", "vec_n", "knob_vector_reduction_2"):
            assert line["knobs"][column] == int(row[column])


def test_gpu_table_output(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["candidates", str(EXAMPLES / "matmul_transpose_b_f16.mlir"), "--target", "sm_80",
               "--pipeline", "VectorDistribute", "--limit", "3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "on sm_80: the first 3 candidates (--limit)" in out
    assert out.count("VectorDistribute") == 3


def test_gpu_space_flags(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole valid space by default (and with `--no-heuristic-filters`); IREE's filtered one
    with `--heuristic-filters`; both flags at once is a usage error."""
    source = str(EXAMPLES / "matmul_transpose_b_f16.mlir")

    def count(*flags: str) -> int:
        assert main(["candidates", source, "--target", "gfx942", "--json", *flags]) == 0
        return len(capsys.readouterr().out.splitlines())

    whole = count()
    assert whole == count("--no-heuristic-filters") > count("--heuristic-filters") > 0
    assert main(["candidates", source, "--target", "gfx942", "--heuristic-filters",
                 "--no-heuristic-filters"]) == 2
    assert "not allowed with" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.mlir", "--target", "host"], "missing.mlir"),
        (["{ex}/matmul_f32_512.mlir", "--target", "nope"], "unknown target"),
        (["{ex}/matmul_f32_512.mlir", "--target", "host", "--pipeline", "TileAndFuse"],
         "unknown CPU pipeline"),
        (["{ex}/matmul_f32_512.mlir", "--target", "host", "--op-index", "3"], "out of range"),
        ([str(Path(__file__).parent / "fixtures" / "cpu_maxpool_nchw_f32.mlir"), "--target", "host"],
         "not pooling"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["candidates", *(a.format(ex=EXAMPLES) for a in args)])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and message in err


def test_rank_skips_a_dispatch_it_cannot_rank_and_ranks_the_rest() -> None:
    proc = dispatchtune("rank", str(MIXED), "--target", "host", "--json", "--limit", "3")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["rank"] for line in lines] == [0, 1, 2]
    assert all(line["problem_key"].startswith(MATMUL_KEY) for line in lines)
    # The model that ranks is said once (CPU targets rank with the installed host model).
    said, warning = proc.stderr.splitlines()
    assert said == "ranking with the installed default model host.json"
    assert warning.startswith("dispatchtune: warning: " + POOL_KEY)
    assert ("not ranked: dispatchtune tunes contractions, convolutions and attention, not pooling"
            in warning)

    table = dispatchtune("rank", str(MIXED), "--target", "host", "--limit", "2")
    assert table.returncode == 0, table.stderr
    assert MATMUL_KEY in table.stdout and POOL_KEY not in table.stdout
    assert "not pooling" in table.stderr


def test_rank_with_nothing_it_can_rank_is_one_line_and_exit_2() -> None:
    proc = dispatchtune("rank", str(FIXTURES / "cpu_maxpool_nchw_f32.mlir"), "--target", "host")
    assert proc.returncode == 2 and proc.stdout == ""
    (error,) = proc.stderr.splitlines()
    assert error.startswith("dispatchtune: error: ") and "no dispatch could be ranked" in error
    assert POOL_KEY in error and "not pooling" in error


def test_a_dump_directory_is_inspected_and_ranked(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    assert len(dump_dispatches(MIXED, dumps)) == 3  # matmul, pooling, elementwise add
    summary = f"{dumps}: skipped 1 of 3 dispatch(es) without a tunable root op"

    inspected = dispatchtune("inspect", str(dumps), "--json")
    assert inspected.returncode == 0, inspected.stderr
    matmul_op, pool_op = [json.loads(line)["key"] for line in inspected.stdout.splitlines()]
    assert matmul_op.startswith(MATMUL_KEY) and pool_op.startswith(POOL_KEY)
    assert inspected.stderr.splitlines() == [f"{summary} (elementwise and other ops dispatchtune "
                                             "does not tune)"]

    ranked = dispatchtune("rank", str(dumps), "--target", "host", "--json", "--limit", "2")
    assert ranked.returncode == 0, ranked.stderr
    keys = [json.loads(line)["problem_key"] for line in ranked.stdout.splitlines()]
    assert keys == [matmul_op] * 2
    notes = ranked.stderr.splitlines()
    assert len(notes) == 3 and notes[0].startswith(summary) and "host.json" in notes[1]
    assert POOL_KEY in notes[2] and "not pooling" in notes[2]

    # The same candidates as the dumped dispatch file alone gives.
    (matmul,) = [f for f in dumps.iterdir() if "dispatch_0_" in f.name]
    alone = dispatchtune("candidates", str(matmul), "--target", "host", "--json", "--limit", "2")
    listed = dispatchtune("candidates", str(dumps), "--target", "host", "--op-index", "0",
                          "--json", "--limit", "2")
    assert alone.returncode == listed.returncode == 0, listed.stderr
    assert alone.stdout == listed.stdout != ""


def test_a_dump_directory_without_a_tunable_op_is_one_line_and_exit_2(tmp_path: Path) -> None:
    dumps = tmp_path / "dumps"
    assert dump_dispatches(FIXTURES / "elementwise_only.mlir", dumps)
    for command in (["inspect", str(dumps)], ["rank", str(dumps), "--target", "host"]):
        proc = dispatchtune(*command)
        assert proc.returncode == 2
        (error,) = proc.stderr.splitlines()
        assert error.startswith(f"dispatchtune: error: {dumps}: none of its 1 dispatch(es) has a "
                                "tunable root op")


@pytest.mark.parametrize("target", ["sm_90", "gfx1030"])
def test_a_gpu_target_iree_cannot_describe_is_blamed_not_the_file(target: str) -> None:
    """`sm_90` and `gfx1030` are valid NVIDIA / AMD names IREE 3.13 has no GPU description of (it
    says so in two wordings): one line naming the target and exit 2 (it used to read as the input
    file being rejected)."""
    proc = dispatchtune("rank", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", target)
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert f"no GPU description of target '{target}'" in line and "rejected" not in line


def test_a_target_iree_crashes_on_is_blamed_not_the_file() -> None:
    """IREE 3.13 crashes (SIGSEGV) compiling for `cuda:h100` rather than saying it has no such
    target: the target probe then names the target, not the input."""
    proc = dispatchtune("rank", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", "cuda:h100")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "cuda:h100" in line and "Unknown CUDA target 'h100'" in line
    assert "rejected" not in line and "matmul_f32_512" not in line


def test_a_cpu_name_iree_does_not_know_is_blamed_not_the_file() -> None:
    """`llvm-cpu:<name>` with a name LLVM does not know: one line naming the target (it used to
    read as IREE rejecting the input file)."""
    proc = dispatchtune("rank", str(EXAMPLES / "matmul_f32_512.mlir"), "--target",
                        "llvm-cpu:nosuchcpu")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "does not know the CPU of target 'llvm-cpu:nosuchcpu'" in line
    assert "rejected" not in line


def test_a_matrix_vector_product_on_a_gpu_is_named_as_such(tmp_path: Path) -> None:
    """IREE 3.13 crashes emitting constraints for a matmul with an M of 1 (it configures a
    matrix-vector product as a reduction, without MMA): the line says so, not only that the
    compiler crashed."""
    source = tmp_path / "gemv.mlir"
    source.write_text(Problem.matmul(1, 256, 256, "f16", out_type="f32").to_mlir())
    proc = dispatchtune("rank", str(source), "--target", "gfx942")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()[-1:]
    # IREE drops the unit M loop before its tuning-spec matcher sees the op.
    assert "contraction n=256 k=256" in line and "matrix-vector product" in line
    assert "Traceback" not in proc.stderr


def test_rank_says_the_heuristic_ranks_where_no_model_ships() -> None:
    """`--order model` on a target without a shipped model ranks with the heuristic, and the
    header says so (it used to say "model order")."""
    proc = dispatchtune("rank", str(EXAMPLES / "matmul_transpose_b_f16.mlir"), "--target",
                        "gfx1201", "--order", "model", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    assert "heuristic (no model for this target)" in proc.stderr
    assert "candidates, heuristic order" in proc.stdout and "model order" not in proc.stdout


def test_pooling_is_shown_as_pooling_and_refused_as_pooling_on_every_target() -> None:
    """A max pooling is convolution-shaped to IREE (its channels a batch loop, its window a
    filter): `inspect` used to show it as a convolution with batch=16; on a GPU the refusal
    blamed the element types ("no MMA intrinsic fits these element types?")."""
    pool = FIXTURES / "cpu_maxpool_nchw_f32.mlir"
    inspected = dispatchtune("inspect", str(pool))
    assert inspected.returncode == 0, inspected.stderr
    assert "kind:    pooling (" in inspected.stdout and "convolution" not in inspected.stdout.split(
        "key:")[0]
    assert "batch/channels=16, output_image=8x8, window=3x3" in inspected.stdout
    assert "types:   f32 -> f32" in inspected.stdout and "tuned:   no" in inspected.stdout
    for target in ("host", "gfx942"):
        ranked = dispatchtune("rank", str(pool), "--target", target)
        assert ranked.returncode == 2
        error = ranked.stderr.splitlines()[-1]  # after "ranking with the ... model" on gfx942
        assert error.startswith("dispatchtune: error: ")
        assert "tunes contractions, convolutions and attention, not pooling" in error
        assert "MMA" not in error
    # A real convolution of the same file shape is still a convolution, and still ranked.
    conv = dispatchtune("rank", str(FIXTURES / "cpu_conv_nchw_f32.mlir"), "--limit", "1")
    assert conv.returncode == 0 and ": convolution " in conv.stdout, conv.stderr


def test_inspect_and_rank_say_iree_demotes_f64_to_f32() -> None:
    """IREE's input pipeline demotes f64 to f32 by default: the f64 matmul is shown as the f32
    one IREE compiles, and one warning says why."""
    for command in ("inspect", "rank"):
        proc = dispatchtune(command, str(FIXTURES / "matmul_f64.mlir"))
        assert proc.returncode == 0, proc.stderr
        (warning,) = [line for line in proc.stderr.splitlines()
                      if not line.startswith("ranking with the ")]
        assert warning.startswith("dispatchtune: warning: ") and "matmul_f64.mlir" in warning
        assert "compute in f64 (linalg.matmul); IREE demotes f64 to f32 by default" in warning
    plain = dispatchtune("inspect", str(EXAMPLES / "matmul_f32_512.mlir"))
    assert plain.returncode == 0 and "f64" not in plain.stderr


def test_an_op_whose_gpu_space_is_empty_is_skipped_with_the_reason() -> None:
    """ViT-tiny on 64x64 images attends over 17 tokens: IREE 3.13's f32 attention constraints on
    gfx942 admit no configuration. `rank` says so in one line and ranks the rest (it used to
    crash in the model on the empty table); the API ranks an empty table as empty."""
    from dispatchtune.costmodel.rank import rank
    from dispatchtune.errors import UnsupportedProblem
    from dispatchtune.ir.frontend import load_problems
    from dispatchtune.targets import get_target

    source = FIXTURES / "torch_sdpa_17_tokens_f32.mlir"
    proc = dispatchtune("rank", str(source), "--target", "gfx942", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "not ranked" in x]
    assert "attention" in line and "admit no configuration" in line
    assert "contraction_51x64x64" in proc.stdout and "candidates, model order" in proc.stdout

    gpu = get_target("gfx942")
    attention = next(p for p in load_problems(source, gpu) if p.kind == "attention")
    with pytest.raises(UnsupportedProblem, match="admit no configuration"):
        enumerate_candidates(attention, gpu)
    matmul = next(p for p in load_problems(source, gpu) if p.kind == "contraction")
    empty = enumerate_candidates(matmul, gpu, limit=0)
    assert len(rank(empty, order="model")) == 0


def test_a_depthwise_convolution_on_a_gpu_is_refused_for_its_own_reason() -> None:
    """IREE has no GPU constraints for depthwise convolutions (MobileNet's); the one line says
    why instead of guessing at the element types."""
    proc = dispatchtune("rank", str(FIXTURES / "cpu_depthwise_nhwc_f32.mlir"), "--target", "gfx942")
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert "depthwise convolution has no channel reduction" in line
    assert "element types" not in line


def test_no_gpu_constraints_names_the_cause_the_target_supports() -> None:
    """Where IREE emits no constraints, the reason says what the target shows: no intrinsic for
    the element types (f32 on sm_80), or intrinsics that exist but a shape IREE's generator does
    not cover (the hint used to blame the element types for both)."""
    proc = dispatchtune("rank", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", "sm_80")
    assert proc.returncode == 2 and "no MMA intrinsic of sm_80 takes f32" in proc.stderr
    from dispatchtune.errors import DispatchTuneError
    from dispatchtune.targets import get_target

    # A 3x3 convolution to a 4x4 image (ResNet-18's last stage at 64 px) has f32 intrinsics on
    # gfx942. (A 4-row matmul was the example until its space came from the op raised to an
    # intrinsic's M: search.gpu_source.with_small_loops_raised.)
    with pytest.raises(DispatchTuneError, match="does not cover this op's shape"):
        enumerate_candidates(Problem.conv2d_nhwc_hwcf(2, 4, 4, 256, 256, 3, 3, "f32"),
                             get_target("gfx942"))
    assert len(enumerate_candidates(Problem.matmul(4, 100, 320, "f32"), get_target("gfx942")))


def test_rank_ranks_a_repeated_problem_once(tmp_path: Path) -> None:
    """A model with the same matmul in two dispatches (every layer's projections repeat): `rank`
    ranks it once and says how many dispatches share it, as `tune` tunes it once (it used to print
    the same table, or the same JSON lines, twice)."""
    one = Problem.matmul(64, 64, 128).to_mlir()
    body = one[one.index("{") + 1:one.rindex("return")]
    # The second on other operands and fused with a consumer (an add), so that IREE keeps two
    # dispatches (identical ones it merges).
    again = body.replace("%", "%again_").replace("%again_arg0", "%arg2").replace(
        "%again_arg1", "%arg3")
    add = (
        "  %sum = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, "
        "affine_map<(i, j) -> (i, j)>], iterator_types = [\"parallel\", \"parallel\"]}\n"
        "      ins(%again_out : tensor<64x64xf32>) outs(%again_empty : tensor<64x64xf32>) {\n"
        "  ^bb0(%x: f32, %y: f32):\n    %d = arith.addf %x, %x : f32\n    linalg.yield %d : f32\n"
        "  } -> tensor<64x64xf32>\n")
    source = tmp_path / "twice.mlir"
    source.write_text(
        "func.func @main(%arg0: tensor<64x128xf32>, %arg1: tensor<128x64xf32>,\n"
        "                %arg2: tensor<64x128xf32>, %arg3: tensor<128x64xf32>)\n"
        "    -> (tensor<64x64xf32>, tensor<64x64xf32>) {\n" + body + again + add
        + "  return %out, %sum : tensor<64x64xf32>, tensor<64x64xf32>\n}\n")
    proc = dispatchtune("rank", str(source), "--target", "host", "--limit", "1")
    assert proc.returncode == 0, proc.stderr
    headers = [line for line in proc.stdout.splitlines() if line.startswith("contraction_")]
    assert len(headers) == 1 and headers[0].endswith("(2 dispatches of this problem)")
    lines = dispatchtune("rank", str(source), "--target", "host", "--json", "--limit", "2")
    assert [json.loads(line)["rank"] for line in lines.stdout.splitlines()] == [0, 1]
