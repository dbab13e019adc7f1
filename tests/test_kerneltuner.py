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
from dispatchtune.features.extract import TargetScalars
from dispatchtune.features.kerneltuner import (
    USER_DEVICES,
    device_facts,
    gemm_candidate_columns,
    kerneltuner_features,
    problem_scalars,
    register_device,
    target_scalars,
)

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = FIXTURES / "kt_gemm_2080ti_slice.json.gz"
CONV = FIXTURES / "kt_conv_a4000_slice.json.gz"
PNPOLY = FIXTURES / "kt_pnpoly_titan_slice.json.gz"


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
    assert facts is not None and facts.is_gpu and facts.compute_units == 68 and facts.subgroup_size == 32
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


def test_device_table_and_user_facts() -> None:
    assert device_facts("Some Future GPU") is None and device_facts("") is None
    assert device_facts("NVIDIA RTX A6000").compute_units == 84  # type: ignore[union-attr]
    mi50 = device_facts("AMD Instinct MI50/MI60")
    assert mi50 is not None and mi50.subgroup_size == 64 and mi50.compute_units == 60
    # Whole model numbers: "a4000" is not an A40, "rtx 4090" not a T4.
    assert device_facts("NVIDIA RTX A4000").compute_units == 48  # type: ignore[union-attr]
    assert device_facts("NVIDIA GeForce RTX 4090").compute_units == 128  # type: ignore[union-attr]
    # One HIP device per MI250X die; RDNA cards run 32-wide waves; "L4" is not an L40 or L40S.
    expected = {"AMD Instinct MI250X": (110, 64), "AMD Radeon PRO W6600": (28, 32),
                "AMD Radeon PRO W7700": (48, 32), "NVIDIA L4": (58, 32), "NVIDIA L40S": (142, 32),
                "NVIDIA A100-SXM4-80GB": (108, 32), "NVIDIA A10": (72, 32)}
    for name, (units, width) in expected.items():
        found = device_facts(name)
        assert found is not None and (found.compute_units, found.subgroup_size) == (units, width), name
    facts = TargetScalars(is_gpu=True, compute_units=10, simds_per_cu=4,
                          max_workgroup_memory_bytes=32768, registers_per_simd=256, subgroup_size=32)
    register_device("future gpu", facts)
    try:
        assert device_facts("Some Future GPU") == facts
    finally:
        USER_DEVICES.clear()


@pytest.mark.parametrize("device", ["Some Future GPU", ""])
def test_unknown_device_loads_with_device_free_features(
    tmp_path: Path, device: str, caplog: pytest.LogCaptureFixture
) -> None:
    data = json.loads(gzip.decompress(GEMM.read_bytes()))
    data["device_name"] = device
    path = tmp_path / "unknown.json"
    path.write_text(json.dumps(data))
    space = load_kerneltuner(path)
    assert target_scalars(space) is None
    known = kerneltuner_features(load_kerneltuner(GEMM))
    with caplog.at_level("WARNING"):
        features = kerneltuner_features(space)
    assert list(features.columns) == list(FEATURE_NAMES) and len(features) == 200
    missing = [c for c in features.columns if features[c].isna().all()]
    # Only the features that need device facts are missing; the rest equal a known device's.
    assert "occupancy" in missing and "shared_memory_bytes" not in missing
    assert not features.drop(columns=missing).isna().any().any()
    np.testing.assert_allclose(features.drop(columns=missing), known.drop(columns=missing))
    if device:
        assert "no hardware facts" in caplog.text
    assert "unknown device (unknown.json)" in space.label() or device in space.label()


def test_scalar_problem_size_and_string_parameters(tmp_path: Path) -> None:
    space = load_kerneltuner(PNPOLY)  # pnpoly: "problem_size": 20000000
    assert space.problem_size == (20000000,) and not space.is_gemm
    assert space.label() == "NVIDIA TITAN RTX cn_pnpoly 20000000"
    assert len(space.table) == 30 and len(space.valid) == 28
    data = json.loads(gzip.decompress(PNPOLY.read_bytes()))
    for entry in data["cache"].values():
        entry["use_method"] = ["none", "bisect", "linear"][entry["use_method"]]
    path = tmp_path / "strings.json"
    path.write_text(json.dumps(data))
    table = load_kerneltuner(path).table
    assert set(table["use_method"]) <= {"none", "bisect", "linear"}
    assert table["block_size_x"].dtype.kind == "i"


@pytest.mark.parametrize(
    "content",
    [
        GEMM.read_bytes()[:500],  # truncated gzip
        b"not json at all",
        json.dumps({"cache": {}}).encode(),  # no header
        json.dumps({"tune_params_keys": ["A"], "cache": {}}).encode(),  # empty cache
        # no parameter in the entry, and a key of another shape than `tune_params_keys`
        json.dumps({"tune_params_keys": ["A"], "cache": {"1,2": {"time": 1.0}}}).encode(),
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


def _rate_cache(tmp_path: Path, header: dict[str, object]) -> Path:
    # A hotspot-like cache: the temporal tiling factor multiplies the work of one launch, so the
    # slowest launch (tf=4) has the best rate; tf=3 ran but its rate is recorded as 0 (a failure).
    entries = {
        "1": {"tf": 1, "time": 1.0, "GFLOP/s": 10.0},
        "2": {"tf": 2, "time": 1.5, "GFLOP/s": 13.3},
        "3": {"tf": 3, "time": 1.2, "GFLOP/s": 0},
        "4": {"tf": 4, "time": 2.0, "GFLOP/s": 20.0},
        "5": {"tf": 5, "time": "RuntimeFailedConfig", "GFLOP/s": "RuntimeFailedConfig"},
    }
    data = {"device_name": "AMD Instinct MI250X", "kernel_name": "calculate_temp",
            "problem_size": [4096, 4096], "tune_params_keys": ["tf"],
            "tune_params": {"tf": [1, 2, 3, 4, 5]}, "cache": entries, **header}
    path = tmp_path / "hotspot.json"
    path.write_text(json.dumps(data))
    return path


def test_a_rate_objective_ranks_by_rate_not_by_launch_time(tmp_path: Path) -> None:
    space = load_kerneltuner(_rate_cache(tmp_path, {"objective": "GFLOP/s"}))
    assert space.objective == "GFLOP/s" and space.higher_is_better
    valid = space.valid
    assert valid["tf"].tolist() == [1, 2, 4]
    np.testing.assert_allclose(valid["cost"], [1 / 10.0, 1 / 13.3, 1 / 20.0])
    assert valid["time_ms"].tolist() == [1.0, 1.5, 2.0]
    assert space.table.set_index("tf").loc[3, "status"] == "no GFLOP/s"
    from dispatchtune.datasets.spaces import load_spaces

    (measured,) = load_spaces([tmp_path / "hotspot.json"])
    assert measured.knobs["tf"].iloc[int(np.argmin(measured.times))] == 4


@pytest.mark.parametrize(("header", "best_tf"), [
    ({}, 1),  # no objective: time, Kernel Tuner's default
    ({"objective": "time"}, 1),
    ({"objective": "GFLOP/s", "objective_higher_is_better": False}, 1),  # as the header says
    ({"objective": "GB/s"}, 1),  # a rate no entry carries: time, with a warning
])
def test_objective_direction_and_fallback(tmp_path: Path, header: dict[str, object], best_tf: int,
                                          caplog: pytest.LogCaptureFixture) -> None:
    valid = load_kerneltuner(_rate_cache(tmp_path, header)).valid
    assert int(valid["tf"].iloc[int(np.argmin(valid["cost"]))]) == best_tf
    assert ("ranking by time" in caplog.text) == (header.get("objective") == "GB/s")


def test_evaluate_a_rate_tuned_cache_through_the_cli(tmp_path: Path) -> None:
    import subprocess
    import sys

    cache = _rate_cache(tmp_path, {"objective": "GFLOP/s"})
    done = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "evaluate", "--dataset", str(cache),
         "--orders", "random,online", "--seeds", "2", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    import pandas as pd

    runs = pd.read_csv(tmp_path / "out" / "runs.csv")
    assert set(runs["n_candidates"]) == {3} and set(runs["n_good"]) == {1}
    curves = [json.loads(c) for c in runs["best_so_far"]]
    # Best so far over the best rate: the single-step launch (tf=1, 10 GFLOP/s) is half of tf=4's
    # 20 GFLOP/s, although its launch is the fastest.
    assert all(c[-1] == 1.0 for c in curves) and any(c[0] == 0.5 for c in curves)


@pytest.mark.parametrize("tail", [",\n", "\n", ""])
def test_a_cache_left_open_by_an_interrupted_run_loads(tmp_path: Path, tail: str,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    # Kernel Tuner appends one entry per benchmark and closes the object at the end of the run.
    data = json.loads(gzip.decompress(PNPOLY.read_bytes()))
    text = json.dumps(data, indent=0)
    body = text[: text.rindex("}", 0, text.rindex("}"))].rstrip()  # without the closing braces
    assert body.endswith("}")  # the last entry
    path = tmp_path / "open.json"
    path.write_text(body + tail)
    space = load_kerneltuner(path)
    assert len(space.table) == len(data["cache"]) and "open Kernel Tuner cache" in caplog.text


def test_every_device_in_the_table_has_a_generation() -> None:
    from dispatchtune.features.kerneltuner import KT_DEVICES, KT_GENERATIONS, device_generation

    assert set(KT_GENERATIONS) == set(KT_DEVICES)
    assert device_generation("NVIDIA GeForce RTX 2080 Ti") == "nvidia turing"
    assert device_generation("AMD Radeon PRO W7700") == "amd rdna3"
    assert device_generation("Some Future GPU") is None


def test_entries_without_parameters_take_them_from_the_cache_key(tmp_path: Path) -> None:
    # Older caches keep only results in each entry; the key holds the values ("16,1", "32,2").
    cache: dict[str, dict[str, object]] = {
        "16,none": {"time": 2.0}, "32,bisect": {"time": 1.0},
        "32,none": {"block_size_x": 32, "use_method": "none", "time": 3.0}}
    data = {"device_name": "NVIDIA RTX A4000", "kernel_name": "k", "problem_size": 64,
            "tune_params_keys": ["block_size_x", "use_method"],
            "tune_params": {"block_size_x": [16, 32], "use_method": ["none", "bisect"]},
            "cache": cache}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    table = load_kerneltuner(path).table
    assert table["block_size_x"].tolist() == [16, 32, 32] and table["block_size_x"].dtype.kind == "i"
    assert table["use_method"].tolist() == ["none", "bisect", "none"]
    cache["64"] = {"time": 1.0}  # neither in the entry nor in a key of the right shape
    path.write_text(json.dumps(data))
    with pytest.raises(DispatchTuneError, match="corrupt Kernel Tuner cache"):
        load_kerneltuner(path)
