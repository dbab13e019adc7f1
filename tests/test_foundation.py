"""Foundation: package layout, Problem model on real IREE input, targets, specs, CLI and bad input."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import dispatchtune
from dispatchtune import Problem, get_target, list_targets, load_problems
from dispatchtune.errors import DispatchTuneError, InputError, TargetError
from dispatchtune.ir import spec

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CPU_CONFIG = (
    "#iree_codegen.compilation_info<lowering_config = #iree_cpu.lowering_config<"
    "distribution = [128, 128, 0], vector_common_parallel = [4, 32, 0], vector_reduction = [0, 0, 4]>, "
    "translation_info = #iree_codegen.translation_info<pipeline = #iree_cpu.pipeline<DoubleTilingExpert>>>"
)


def test_namespace_does_not_shadow_top_level_packages() -> None:
    for name in ("datasets", "search", "features", "costmodel", "tuner"):
        spec_ = importlib.util.find_spec(name)
        assert spec_ is None or not str(spec_.origin or "").startswith(str(ROOT)), name
    for sub in ("costmodel", "search", "features", "datasets", "tuner"):
        assert importlib.import_module(f"dispatchtune.{sub}")


@pytest.mark.parametrize(
    ("example", "kind", "sizes"),
    [
        ("matmul_f32_512.mlir", "contraction", {"m": (512,), "n": (512,), "k": (512,), "batch": ()}),
        ("matmul_transpose_b_f16.mlir", "contraction", {"m": (256,), "n": (384,), "k": (512,)}),
        ("batch_matmul_f32.mlir", "contraction", {"batch": (8,), "m": (128,), "n": (128,), "k": (256,)}),
        (
            "conv_nhwc_f32.mlir",
            "convolution",
            {"batch": (2,), "output_image": (28, 28), "output_channel": (64,), "filter_loop": (3, 3)},
        ),
        (
            "attention_f16.mlir",
            "attention",
            {"batch": (4,), "m": (256,), "n": (64,), "k1": (64,), "k2": (256,)},
        ),
        ("dispatch_matmul_512_f32_znver4_benchmark.mlir", "contraction", {"m": (512,), "k": (512,)}),
    ],
)
def test_load_problems_from_real_iree_input(
    example: str, kind: str, sizes: dict[str, tuple[int, ...]]
) -> None:
    (problem,) = load_problems(EXAMPLES / example)
    assert problem.kind == kind
    for dim_class, expected in sizes.items():
        assert problem.sizes(dim_class) == expected, dim_class
    assert problem.name  # the dispatch function it came from


def test_transposed_operand_maps_and_types_are_kept() -> None:
    (problem,) = load_problems(EXAMPLES / "matmul_transpose_b_f16.mlir")
    assert problem.element_types == ("f16", "f16", "f32")
    assert problem.indexing_maps[1] == "(d0, d1, d2) -> (d1, d2)"  # B is [n, k]
    assert problem.operand_shapes[1] == (384, 512)


def test_model_with_several_dispatches_in_dispatch_order() -> None:
    problems = load_problems(FIXTURES / "mlp_two_matmuls.mlir")
    assert [p.gemm_shape for p in problems] == [(1, 64, 256, 128), (1, 64, 64, 256)]


@pytest.mark.parametrize(
    "problem",
    [
        Problem.matmul(256, 384, 512, "f16", transpose_b=True),
        Problem.matmul(128, 256, 64, "f32", transpose_a=True),
        Problem.batch_matmul(4, 64, 96, 128, "f32"),
        Problem.conv2d_nhwc_hwcf(2, 14, 14, 32, 64, 3, 3, stride=2),
        Problem.matmul(64, 64, 64, "i8"),
    ],
    ids=["mm_tb_f16", "mm_ta_f32", "bmm", "conv_s2", "mm_i8"],
)
def test_built_problem_renders_to_mlir_that_parses_back_identically(problem: Problem, tmp_path: Path) -> None:
    path = tmp_path / "p.mlir"
    path.write_text(problem.to_mlir("f"))
    (parsed,) = load_problems(path)
    assert parsed.key == problem.key
    assert parsed.gemm_shape == problem.gemm_shape
    assert Problem.from_dict(problem.to_dict()) == problem


def test_problem_derived_sizes() -> None:
    conv = Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 32, 3, 3)
    assert conv.gemm_shape == (1, 2 * 28 * 28, 32, 3 * 3 * 64)
    assert conv.flops == 2 * 2 * 28 * 28 * 32 * 3 * 3 * 64
    attention = Problem.attention(2, 128, 64, 64, 256)
    assert attention.flops == 2 * 2 * 128 * 256 * (64 + 64)
    with pytest.raises(ValueError):
        Problem.matmul(0, 4, 4)


def test_targets_registry_and_facts() -> None:
    names = {t.name for t in list_targets()}
    assert {"host", "gfx942", "mi300x", "gfx1100", "sm_80"} <= names
    gfx942 = get_target("gfx942").gpu_facts()
    assert gfx942.max_workgroup_memory_bytes == 64 * 1024
    assert gfx942.subgroup_sizes == (64,)
    assert any(i.startswith("MFMA_F32_16x16x16_F16") for i in gfx942.mma_intrinsics)
    assert get_target("mi300x").gpu_facts().compute_units == 304  # IREE knows the product's CUs
    assert "--iree-rocm-target=gfx942" in get_target("gfx942").compile_flags
    assert get_target("sm_80").tuning_spec_flag == "--iree-codegen-transform-dialect-library"
    host = get_target("host").cpu_facts()
    assert host.native_vector_bytes in (16, 32, 64)
    assert host.cores >= 1 and host.l1d_bytes > 0
    with pytest.raises(TargetError, match="unknown target"):
        get_target("radeon-9000")


def test_intrinsic_names_read_as_shape_and_operand_types() -> None:
    """Every intrinsic IREE lists for gfx942, gfx950, gfx1201 and sm_86 has a shape in its name;
    operand types are read only from names that end with them (a target's intrinsics are
    filtered by them)."""
    from dispatchtune.targets import intrinsic_operand_types, intrinsic_shape

    assert intrinsic_shape("MFMA_F32_16x16x16_F16") == (16, 16, 16)
    assert intrinsic_operand_types("MFMA_I32_16x16x32_I8") == ("i8",)
    assert intrinsic_operand_types("MFMA_F32_16x16x32_F8E4M3FNUZ_F8E5M2FNUZ") == (
        "f8e4m3fnuz", "f8e5m2fnuz")
    assert intrinsic_shape("VMFMA_F32_32x32x16_F16") == (32, 32, 16)
    assert intrinsic_shape("MFMA_F32_16x16x4F32") == (16, 16, 4)  # an older spelling
    assert intrinsic_operand_types("MFMA_F32_16x16x4F32") == ()
    assert intrinsic_shape("WMMA") is None and intrinsic_operand_types("WMMA") == ()
    for name in ("gfx942", "gfx950", "gfx1201", "sm_86"):
        for intrinsic in get_target(name).gpu_facts().mma_intrinsics:
            shape = intrinsic_shape(intrinsic)
            assert shape is not None and min(shape) >= 1, intrinsic
    assert intrinsic_operand_types("VDMFMA_F32_8x16x64x2_BF16") == ()  # gfx950's, not that form


def test_a_gpu_without_a_known_cu_count_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """gfx1250: IREE 3.13 gives no CU count and no product of it is known, so its per-CU
    features are neutral; `rank` and `tune` say so in one warning rather than pretend a count."""
    import logging

    from dispatchtune import targets

    targets._probe_gpu.cache_clear()  # the warning comes with the (cached) probe
    with caplog.at_level(logging.WARNING, logger="dispatchtune.targets"):
        facts = get_target("gfx1250").gpu_facts()
    assert facts.compute_units == 0 and facts.mma_intrinsics
    (record,) = [r for r in caplog.records if "gfx1250" in r.getMessage()]
    assert "no compute-unit count" in record.getMessage() and "neutral" in record.getMessage()


@pytest.mark.parametrize("name", ["sm_90", "gfx1030"])
def test_the_probe_of_a_gpu_iree_cannot_describe_says_so(name: str) -> None:
    """The target probe words it as the file path does (`rank` reaches either first, depending on
    whether the file built): IREE has no description of the target, named with its flag."""
    with pytest.raises(TargetError) as caught:
        get_target(name).gpu_facts()
    assert str(caught.value).startswith("IREE ") and f"no GPU description of target '{name}'" in str(
        caught.value)


def test_any_gpu_iree_knows_is_a_target_with_its_facts() -> None:
    """Architecture and product names IREE 3.13 knows: facts from IREE's target table, CU counts
    of the flagship product where IREE has none for an architecture name."""
    gfx90a = get_target("gfx90a")
    assert gfx90a.backend == "rocm" and gfx90a.device_uri == "hip://0"
    facts = gfx90a.gpu_facts()
    assert facts.arch == "gfx90a" and facts.subgroup_sizes == (64,) and facts.compute_units == 104
    assert get_target("rocm:mi250x").gpu_facts().compute_units == 220  # IREE's own product count
    assert get_target("ROCM:gfx942") is get_target("gfx942")
    sm86 = get_target("sm_86")
    assert sm86.backend == "cuda" and sm86.gpu_facts().subgroup_sizes == (32,)
    assert get_target("cuda:sm_86") is sm86
    wmma = get_target("gfx1201").gpu_facts()
    assert any(i.startswith("WMMA") for i in wmma.mma_intrinsics)
    with pytest.raises(TargetError, match="Unknown ROCM target 'gfx9000'"):
        get_target("gfx9000").gpu_facts()
    # Bare product names are asked of IREE (ROCm first): what it knows is a target, the rest not.
    mi325x = get_target("MI325X")
    assert mi325x.name == "rocm:mi325x" and mi325x.gpu_facts().arch == "gfx942"
    assert mi325x.gpu_facts().compute_units == 304
    assert get_target("rtx4090").gpu_facts().arch == "sm_89"
    with pytest.raises(TargetError, match=r"unknown target 'h100'.*product name IREE knows"):
        get_target("h100")  # IREE 3.13 has no sm_90 description


def test_named_cpu_targets_follow_that_cpu_and_refuse_to_benchmark_what_cannot_run() -> None:
    avx2, avx512 = get_target("llvm-cpu:x86-64-v3"), get_target("llvm-cpu:X86-64-v4")
    assert (avx2.cpu_facts().native_vector_bytes, avx2.cpu_facts().vector_registers) == (32, 16)
    assert (avx512.cpu_facts().native_vector_bytes, avx512.cpu_facts().vector_registers) == (64, 32)
    assert avx512.cpu_facts().max_vector_bytes == 32768 == 2 * avx2.cpu_facts().max_vector_bytes
    assert "--iree-llvmcpu-target-cpu=x86-64-v4" in avx512.compile_flags
    assert get_target("host").cpu_facts().native_vector_bytes in (16, 32, 64)
    get_target("host").check_runs_here()
    get_target("llvm-cpu:x86-64").check_runs_here()  # every x86-64 machine has the baseline
    if "avx512f" not in get_target("host").cpu_facts().features:
        with pytest.raises(TargetError, match="lacks avx512"):
            avx512.check_runs_here()
    with pytest.raises(DispatchTuneError, match="Unknown CPU"):
        get_target("llvm-cpu:nosuchcpu").cpu_facts()
    with pytest.raises(TargetError, match="unknown target"):
        get_target("llvm-cpu:bad name")
    from dispatchtune.costmodel.defaults import default_model_path

    # The installed CPU model ranks named CPUs too (its features carry the vector facts).
    assert default_model_path("llvm-cpu:znver4") == default_model_path("host") is not None


def test_spec_applies_and_is_verified_by_reading_back(tmp_path: Path) -> None:
    host = get_target("host")
    source = EXAMPLES / "matmul_f32_512.mlir"
    (problem,) = load_problems(source)
    spec_path = spec.write_spec(spec.tuning_spec([(problem, CPU_CONFIG)]), tmp_path / "spec.mlir")
    spec.check_spec(spec_path.read_text())
    (applied,) = spec.applied_configs(source, host, spec_path)
    assert spec.config_applied(CPU_CONFIG, applied)
    # A spec for another shape compiles fine but silently falls back: the read-back catches it.
    other = spec.write_spec(
        spec.tuning_spec([(Problem.matmul(256, 512, 512), CPU_CONFIG)]), tmp_path / "other.mlir"
    )
    (fallback,) = spec.applied_configs(source, host, other)
    assert not spec.config_applied(CPU_CONFIG, fallback)


def test_merged_spec_keeps_every_matcher(tmp_path: Path) -> None:
    host = get_target("host")
    problems = load_problems(FIXTURES / "mlp_two_matmuls.mlir")
    config = CPU_CONFIG.replace("[128, 128, 0]", "[32, 32, 0]")
    merged = spec.merge_specs([spec.tuning_spec([(p, config)]) for p in problems])
    path = spec.write_spec(merged, tmp_path / "merged.mlir")
    applied = spec.applied_configs(FIXTURES / "mlp_two_matmuls.mlir", host, path)
    assert len(applied) == 2 and all(spec.config_applied(config, a) for a in applied)


def test_invalid_compilation_info_is_a_clear_error() -> None:
    with pytest.raises(DispatchTuneError, match="invalid compilation_info"):
        spec.tuning_spec([(Problem.matmul(64, 64, 64), "#iree_codegen.compilation_info<nonsense")])


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("does_not_exist.mlir", "no such file"),
        (str(FIXTURES / "malformed.mlir"), "malformed MLIR"),
        (str(FIXTURES / "elementwise_only.mlir"), "no tunable root op"),
        (str(FIXTURES / "dynamic_matmul.mlir"), "dynamic shape"),
    ],
)
def test_bad_input_raises_input_error(path: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        load_problems(path)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dispatchtune", *args], capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "does_not_exist.mlir"],
        ["inspect", str(FIXTURES / "malformed.mlir")],
        ["inspect", str(FIXTURES / "elementwise_only.mlir")],
        ["inspect", str(FIXTURES / "dynamic_matmul.mlir")],
        ["inspect", str(EXAMPLES / "matmul_f32_512.mlir"), "--target", "gfx9000"],
    ],
)
def test_cli_bad_input_is_one_line_and_nonzero(args: list[str]) -> None:
    proc = _cli(*args)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dispatchtune: error:")


def test_cli_inspect_and_targets() -> None:
    proc = _cli("inspect", str(EXAMPLES / "matmul_transpose_b_f16.mlir"))
    assert proc.returncode == 0, proc.stderr
    assert "contraction" in proc.stdout and "m=256, n=384, k=512" in proc.stdout
    assert "mk,nk->mn" in proc.stdout
    proc = _cli("targets")
    assert proc.returncode == 0, proc.stderr
    for name in ("host", "gfx942", "mi300x", "gfx1100", "sm_80"):
        assert name in proc.stdout
    assert dispatchtune.__version__
