"""Feature extractor: schema, hand-computed values, CPU/GPU paths, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dispatchtune.features.extract as extract_module
from dispatchtune.errors import DispatchTuneError
from dispatchtune.features import (
    FEATURE_NAMES,
    FEATURE_SCHEMA_VERSION,
    FEATURES,
    FeatureExtractor,
    GemmFeatureExtractor,
    ProblemScalars,
    TargetScalars,
    check_feature_schema,
    compute_features,
    extract_features,
    feature_table_markdown,
    features_frame,
)
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target

GFX942_LIKE = TargetScalars(
    is_gpu=True, compute_units=304, simds_per_cu=4, max_workgroup_memory_bytes=65536,
    registers_per_simd=512, subgroup_size=64,
)
HOST_LIKE = TargetScalars(
    is_gpu=False, compute_units=2, native_vector_bytes=64, vector_registers=32,
    l1_bytes=32768, l2_bytes=1 << 20,
)


def gpu_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "pipeline": "TileAndFuse", "tile_b": 1, "tile_m": 128, "tile_n": 128, "tile_k": 64,
        "vec_m": 64, "vec_n": 64, "intrinsic": "MFMA_F32_16x16x16_F16", "mma_m": 16,
        "mma_n": 16, "mma_k": 16, "subgroups_m": 2, "subgroups_n": 2, "subgroup_size": 64,
        "workgroup_threads": 256, "prefetch_stages": 2,
    }
    row.update(overrides)
    return row


def cpu_row(**overrides: object) -> dict[str, object]:
    row: dict[str, object] = {
        "pipeline": "DoubleTilingExpert", "tile_b": 0, "tile_m": 64, "tile_n": 64, "tile_k": 16,
        "vec_m": 8, "vec_n": 16, "intrinsic": "", "mma_m": 0, "mma_n": 0, "mma_k": 0,
        "subgroups_m": 0, "subgroups_n": 0, "subgroup_size": 0, "workgroup_threads": 0,
        "prefetch_stages": 0,
    }
    row.update(overrides)
    return row


def test_schema_is_ordered_unique_and_documented() -> None:
    assert isinstance(FEATURE_SCHEMA_VERSION, int)
    assert len(set(FEATURE_NAMES)) == len(FEATURE_NAMES) == len(FEATURES)
    doc = extract_module.__doc__ or ""
    markdown = feature_table_markdown()
    for spec in FEATURES:
        assert spec.unit and spec.formula
        assert f"``{spec.name}``" in doc
        assert f"`{spec.name}`" in markdown


def test_docs_features_md_lists_every_feature() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "features.md").read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.MULTILINE))
    assert documented == set(FEATURE_NAMES)


def test_gpu_features_by_hand() -> None:
    problem = ProblemScalars.from_problem(Problem.matmul(4096, 4096, 4096, "f16", transpose_b=True))
    frame = features_frame(pd.DataFrame([gpu_row()]), problem, GFX942_LIKE)
    assert list(frame.columns) == list(FEATURE_NAMES)
    row = frame.iloc[0]
    assert row["wg_intensity"] == pytest.approx(2 * 128 * 128 / (128 * 2 + 128 * 2))
    assert row["workgroups"] == 1024
    assert row["wave_quantization"] == pytest.approx((4 - 1024 / 304) / 4)
    assert row["padding_waste"] == 0 and row["tile_divides_problem"] == 1
    assert row["k_trips"] == 64 and row["tile_k_pow2"] == 1
    assert row["acc_registers"] == pytest.approx(128 * 128 * 4 / 4 / 256)
    assert row["shared_memory_bytes"] == 64 * (128 * 2 + 128 * 2)
    assert row["shared_memory_fraction"] == pytest.approx(0.5)
    assert row["mma_area_to_volume"] == pytest.approx((16 * 16 + 16 * 16) / 16**3)
    assert row["subgroups"] == 4 and row["subgroups_simd_multiple"] == 1
    # Registers allow 5 waves/SIMD, shared memory 2 workgroups of 4 subgroups: 8 of 32 slots.
    assert row["occupancy"] == pytest.approx(0.25)
    assert row["cpu_vector_utilization"] == 0 and row["cpu_register_tile_fraction"] == 0
    assert row["log2_flops"] == pytest.approx(np.log2(2 * 4096.0**3))
    assert row["lhs_bytes"] == 2 and row["out_bytes"] == 4


def test_padding_and_quantization_when_tiles_do_not_divide() -> None:
    problem = ProblemScalars.from_problem(Problem.matmul(100, 64, 64, "f16"))
    frame = features_frame(pd.DataFrame([gpu_row(tile_m=64, tile_n=64, tile_k=64)]), problem,
                           GFX942_LIKE)
    assert frame["padding_waste"].iloc[0] == pytest.approx(1 - 100 / 128)
    assert frame["tile_divides_problem"].iloc[0] == 0
    assert frame["workgroups"].iloc[0] == 2
    assert frame["wave_quantization"].iloc[0] == pytest.approx((1 - 2 / 304) / 1)


def test_cpu_features_by_hand() -> None:
    problem = ProblemScalars.from_problem(Problem.matmul(512, 512, 512, "f32"))
    table = pd.DataFrame([cpu_row(), cpu_row(vec_n=8), cpu_row(vec_n=24, tile_n=48),
                          cpu_row(vec_m=6, tile_m=128)])
    frame = features_frame(table, problem, HOST_LIKE)
    assert frame["cpu_vector_utilization"].tolist() == pytest.approx([1.0, 0.5, 0.75, 1.0])
    assert frame["cpu_register_tile_fraction"].iloc[0] == pytest.approx(8 / 32)
    assert frame["cpu_l1_footprint_fraction"].iloc[0] == pytest.approx(
        (8 * 16 * 4 + 16 * 16 * 4 + 8 * 16 * 4) / 32768
    )
    assert frame["cpu_l2_footprint_fraction"].iloc[0] == pytest.approx(
        (64 * 512 * 4 * 2 + 64 * 64 * 4) / (1 << 20)
    )
    assert frame["workgroups_per_cu"].iloc[0] == 64 / 2
    assert frame["vec_divides_tile"].tolist() == [1, 1, 1, 0]
    assert frame["tile_b"].iloc[0] == 1  # 0 = "not tiled" reads as a tile of one
    assert (frame["occupancy"] == 0).all() and (frame["is_gpu"] == 0).all()


def test_extract_features_with_real_targets() -> None:
    problem = Problem.conv2d_nhwc_hwcf(2, 28, 28, 64, 128, 3, 3)
    gpu = extract_features(problem, get_target("gfx942"), pd.DataFrame([gpu_row()] * 3))
    assert gpu.shape == (3, len(FEATURE_NAMES))
    assert gpu["problem_m"].iloc[0] == 2 * 28 * 28 and gpu["problem_k"].iloc[0] == 9 * 64
    assert gpu["kind_convolution"].iloc[0] == 1
    cpu = extract_features(problem, get_target("host"), pd.DataFrame([cpu_row()]))
    assert cpu["is_gpu"].iloc[0] == 0 and cpu["cpu_vector_utilization"].iloc[0] > 0
    attention = Problem.attention(2, 1024, 64, 64, 1024)
    att = extract_features(attention, get_target("gfx942"), pd.DataFrame([gpu_row()]))
    assert att["kind_attention"].iloc[0] == 1 and att["problem_n"].iloc[0] == 1024


def test_extractor_interface_matches_function() -> None:
    extractor: FeatureExtractor = GemmFeatureExtractor()
    assert extractor.schema_version == FEATURE_SCHEMA_VERSION
    assert extractor.feature_names == FEATURE_NAMES
    problem = Problem.matmul(256, 256, 256, "f32")
    table = pd.DataFrame([cpu_row()])
    pd.testing.assert_frame_equal(
        extractor.extract(problem, get_target("host"), table),
        extract_features(problem, get_target("host"), table),
    )


def test_core_accepts_plain_numpy_columns_and_missing_columns() -> None:
    problem = ProblemScalars.from_problem(Problem.matmul(256, 256, 256, "f32"))
    values = compute_features({"tile_m": np.array([32.0, 64.0])}, problem, HOST_LIKE)
    assert list(values) == list(FEATURE_NAMES)
    assert values["tile_n"].tolist() == [256, 256]  # untiled dims default to the whole problem
    assert values["workgroups"].tolist() == [8, 4]


def test_bad_tables_raise_one_line_errors() -> None:
    problem = ProblemScalars.from_problem(Problem.matmul(256, 256, 256, "f32"))
    with pytest.raises(DispatchTuneError, match="non-numeric"):
        features_frame(pd.DataFrame([cpu_row(tile_m="big")]), problem, HOST_LIKE)
    with pytest.raises(DispatchTuneError, match="DataFrame"):
        features_frame([cpu_row()], problem, HOST_LIKE)  # type: ignore[arg-type]
    with pytest.raises(DispatchTuneError, match="tile_m"):
        compute_features({}, problem, HOST_LIKE)


def test_schema_check_for_stored_models() -> None:
    check_feature_schema(FEATURE_SCHEMA_VERSION, list(FEATURE_NAMES))
    with pytest.raises(DispatchTuneError, match="retrain"):
        check_feature_schema(FEATURE_SCHEMA_VERSION - 1, list(FEATURE_NAMES))
    with pytest.raises(DispatchTuneError, match="retrain"):
        check_feature_schema(FEATURE_SCHEMA_VERSION, list(FEATURE_NAMES)[:-1])


def _real_row(problem: Problem, **knobs: int | str) -> tuple[pd.Series, pd.Series]:
    """One candidate of a real gfx942 space (chosen by IREE knobs) and its features."""
    from dispatchtune.search import enumerate_candidates

    table = enumerate_candidates(problem, "gfx942").table
    mask = np.ones(len(table), dtype=bool)
    for name, value in knobs.items():
        mask &= (table[name] == value).to_numpy()
    assert mask.any(), knobs
    row = table[mask].iloc[[0]]
    return row.iloc[0], extract_features(problem, get_target("gfx942"), row).iloc[0]


def test_tileandfuse_matmul_features_on_a_known_config() -> None:
    """workgroup [128, 64, 0], subgroup [2, 2, 0] (in 16x16 intrinsics), reduction [0, 0, 2]."""
    row, f = _real_row(Problem.matmul(256, 256, 512, "f16"), pipeline="TileAndFuse",
                       knob_wg_0=128, knob_wg_1=64, knob_sg_0=2, knob_sg_1=2, knob_red_2=2,
                       knob_mma_idx=0)
    assert (row["mma_m"], row["mma_n"], row["mma_k"]) == (16, 16, 16)
    assert (f["tile_m"], f["tile_n"], f["tile_k"], f["k_trips"]) == (128, 64, 32, 16)
    assert (f["vec_m"], f["vec_n"]) == (32, 32)  # per-subgroup tiles, not the workgroup tile
    assert (row["subgroups_m"], row["subgroups_n"]) == (4, 2)
    assert (f["threads"], f["subgroups"]) == (512, 8)
    assert f["acc_registers"] == 128 * 64 * 4 / 4 / 512
    assert f["shared_memory_bytes"] == 32 * (128 * 2 + 64 * 2)
    assert f["workgroups"] == 2 * 4
    assert f["workgroups_per_cu"] == pytest.approx(8 / 304)


def test_convolution_tileandfuse_features_direct_and_igemm() -> None:
    """Direct (7 loops) and IGEMM (5 loops) TileAndFuse rows of one conv follow IREE's knobs."""
    from dispatchtune.search import enumerate_candidates

    problem = Problem.conv2d_nhwc_hwcf(2, 16, 16, 64, 64, 3, 3, "f16")
    table = enumerate_candidates(problem, "gfx942").table
    t = table[table["pipeline"] == "TileAndFuse"]
    f = extract_features(problem, get_target("gfx942"), t)
    for igemm in (0, 1):
        rows = (t["igemm"] == igemm).to_numpy()
        assert rows.any()
        r, fr = t[rows], f[rows]
        # M loops: image batch, output height, output width (wg_0..wg_2); N: output channels.
        tile_m = r["knob_wg_0"] * r["knob_wg_1"] * r["knob_wg_2"]
        vec_m = r["knob_sg_0"] * r["knob_sg_1"] * r["knob_sg_2"] * r["mma_m"]
        assert (fr["tile_m"] == tile_m).all() and (fr["vec_m"] == vec_m).all()
        assert (fr["vec_n"] == r["knob_sg_3"] * r["mma_n"]).all()
        assert (r["subgroups_m"] == tile_m // vec_m).all()
        assert (fr["threads"] == r["subgroups_m"] * r["subgroups_n"] * 64).all()
        # K: the input-channel tile in intrinsics (filter loops tiled by 1 when direct).
        assert (fr["tile_k"] == r["knob_red_6"] * r["mma_k"]).all()
        assert (fr["k_trips"] == np.ceil(3 * 3 * 64 / fr["tile_k"])).all()
        assert (fr["workgroups"] == 2 * 16 * 16 * 64 / (tile_m * fr["tile_n"])).all()


def test_attention_features_count_what_iree_distributes() -> None:
    """m_tile 64, value tile 16, K2 block 16, 4 subgroups: W over B, M and the value dim."""
    problem = Problem.attention(2, 256, 64, 64, 256, "f16")
    row, f = _real_row(problem, knob_m_tile=64, knob_n_tile=16, knob_red_k2=16,
                       knob_qk_mma_idx=0, knob_pv_mma_idx=0)
    assert row["tile_v"] == 16 and f["threads"] == 256
    assert f["workgroups"] == 2 * (256 // 64) * (64 // 16)  # not the K2 blocks
    assert f["shared_memory_bytes"] == 64 * 64 * 2 + 16 * 64 * 2 + 16 * 16 * 2  # Q, K, V
    assert f["acc_registers"] == 64 * (16 + 16) / 256  # f32 S block and output per thread
