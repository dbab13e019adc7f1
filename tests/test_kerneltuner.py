"""Kernel Tuner caches: the loader (validity, corrupt files) and the mapping onto the common
vocabulary (`features.kerneltuner`)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.datasets.kerneltuner import load_kerneltuner
from dispatchtune.errors import DispatchTuneError
from dispatchtune.features import FEATURE_NAMES
from dispatchtune.features.kerneltuner import (
    device_facts,
    gemm_candidate_columns,
    kerneltuner_features,
    problem_scalars,
    target_scalars,
)

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = FIXTURES / "kt_gemm_2080ti_slice.json.gz"
CONV = FIXTURES / "kt_conv_a4000_slice.json.gz"


def test_gemm_cache_maps_onto_candidate_columns() -> None:
    space = load_kerneltuner(GEMM)
    table = gemm_candidate_columns(space.table)
    assert space.is_gemm and len(table) == 200 and table["valid"].all()
    assert space.device_name == "NVIDIA GeForce RTX 2080 Ti"
    assert table["candidate_id"].tolist() == list(range(200))
    np.testing.assert_array_equal(table["tile_m"], table["MWG"])
    np.testing.assert_array_equal(table["tile_n"], table["NWG"])
    np.testing.assert_array_equal(table["tile_k"], table["KWG"])
    np.testing.assert_array_equal(table["workgroup_threads"], table["MDIMC"] * table["NDIMC"])
    np.testing.assert_array_equal(table["shared_lhs"], table["SA"])
    np.testing.assert_array_equal(table["load_vec_n"], table["VWN"])
    # Warps: 32 threads, M fastest; MDIMC=16, NDIMC=8 -> a warp is 16 x 2 threads, 1 x 4 warps.
    row = table[(table["MDIMC"] == 16) & (table["NDIMC"] == 8) & (table["MWG"] == 128)].iloc[0]
    assert (row["subgroups_m"], row["subgroups_n"]) == (1, 4)
    assert (row["vec_m"], row["vec_n"]) == (128, row["NWG"] / 4)
    assert (table["subgroups_m"] * table["subgroups_n"] * 32 == table["workgroup_threads"]).all()
    assert table["time_ms"].min() == pytest.approx(11.482779)


def test_gemm_problem_and_device_facts() -> None:
    space = load_kerneltuner(GEMM)
    problem = problem_scalars(space)
    assert (problem.m, problem.n, problem.k) == (4096, 4096, 4096)  # K recovered from GFLOP/s
    assert problem.lhs_bytes == 4
    facts = target_scalars(space)
    assert facts.is_gpu and facts.compute_units == 68 and facts.subgroup_size == 32
    features = kerneltuner_features(space)
    assert list(features.columns) == list(FEATURE_NAMES) and len(features) == 200
    expected_smem = 32 * 4 * (space.table["SA"] * space.table["MWG"]
                              + space.table["SB"] * space.table["NWG"])
    np.testing.assert_allclose(features["shared_memory_bytes"], expected_smem)
    widest = 16  # bytes: 128-bit loads
    expected_load = 0.5 * ((4 * space.table["VWM"]).clip(upper=widest)
                           + (4 * space.table["VWN"]).clip(upper=widest))
    np.testing.assert_allclose(features["load_vector_bytes"], expected_load)


def test_invalid_configurations_and_non_gemm_kernels() -> None:
    space = load_kerneltuner(CONV)
    table = space.table
    assert not space.is_gemm and "tile_m" not in table
    bad = table[~table["valid"]]
    assert len(bad) == 4 and bad["time_ms"].isna().all()
    assert set(bad["status"]) <= {"RuntimeFailedConfig", "CompilationFailedConfig"}
    assert (table.loc[table["valid"], "status"] == "ok").all()
    assert len(space.valid) == 16
    with pytest.raises(DispatchTuneError, match="not a GEMM"):
        problem_scalars(space)


def test_unknown_device_is_a_one_line_error() -> None:
    with pytest.raises(DispatchTuneError, match="no hardware facts"):
        device_facts("Some Future GPU")


@pytest.mark.parametrize(
    "content",
    [
        GEMM.read_bytes()[:500],  # truncated gzip
        b"not json at all",
        json.dumps({"cache": {}}).encode(),  # no header
        json.dumps({"tune_params_keys": ["A"], "cache": {}}).encode(),  # empty cache
        json.dumps({"tune_params_keys": ["A"], "cache": {"1": {"time": 1.0}}}).encode(),
        json.dumps([1, 2]).encode(),
    ],
)
def test_corrupt_files_name_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "broken.json.gz"
    path.write_bytes(content)
    with pytest.raises(DispatchTuneError, match=r"broken\.json\.gz") as info:
        load_kerneltuner(path)
    assert "\n" not in str(info.value)


def test_missing_file_and_plain_json(tmp_path: Path) -> None:
    with pytest.raises(DispatchTuneError, match="not found"):
        load_kerneltuner(tmp_path / "absent.json")
    plain = tmp_path / "plain.json"
    plain.write_bytes(gzip.decompress(CONV.read_bytes()))
    assert len(load_kerneltuner(plain).table) == 20


def test_mixed_precision_caches_are_refused(tmp_path: Path) -> None:
    data = json.loads(gzip.decompress(GEMM.read_bytes()))
    first = next(iter(data["cache"].values()))
    first["PRECISION"] = 16
    path = tmp_path / "mixed.json"
    path.write_text(json.dumps(data))
    with pytest.raises(DispatchTuneError, match="several precisions"):
        problem_scalars(load_kerneltuner(path))
