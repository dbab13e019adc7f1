"""`datasets.spaces.load_spaces`: one loader of measured spaces (logs, caches, shipped data)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.datasets.kerneltuner import KernelTunerGemm
from dispatchtune.datasets.spaces import KERNELTUNER, RESULTS, classify_inputs, load_spaces
from dispatchtune.errors import InputError
from dispatchtune.features import FEATURE_NAMES
from dispatchtune.features.spaces import has_features, space_features
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
GEMM = FIXTURES / "kt_gemm_2080ti_slice.json.gz"
CONV = FIXTURES / "kt_conv_a4000_slice.json.gz"
MATMUL_LOG = FIXTURES / "cpu_results_matmul_256x384x256.jsonl"


def test_a_log_a_cache_and_the_shipped_data() -> None:
    spaces = load_spaces([GEMM, CONV, MATMUL_LOG, "shipped:cpu_host"])
    by_label = {s.label: s for s in spaces}
    assert len(by_label) == len(spaces) == 2 + 1 + 28

    # Caches first, in the order given; their knobs are the header's tune_params_keys.
    gemm, conv = spaces[0], spaces[1]
    assert gemm.label == "NVIDIA GeForce RTX 2080 Ti GEMM 4096x4096x4096"
    assert (gemm.kind, gemm.device, gemm.cpu) == (KERNELTUNER, "NVIDIA GeForce RTX 2080 Ti", "")
    assert gemm.source == "Kernel Tuner kt_gemm_2080ti_slice.json.gz"
    assert gemm.problem == KernelTunerGemm(4096, 4096, 4096, 32)
    assert gemm.n == 200 and list(gemm.knobs.columns)[:5] == ["MWG", "NWG", "KWG", "MDIMC", "NDIMC"]
    assert conv.label == "NVIDIA RTX A4000 convolution_kernel 4096x4096"
    assert conv.problem is None and conv.n == 16  # 4 of its 20 configurations failed
    assert "block_size_x" in conv.knobs.columns

    # A fixture log written before `target_cpu` and `knob_*` existed: its flattened knobs.
    (log,) = [s for s in spaces if "contraction_256x384x256" in s.label]
    assert log.label.startswith("host contraction m=256 n=384 k=256 ")
    assert (log.kind, log.device, log.cpu, log.source) == (RESULTS, "host", "", "results.jsonl")
    assert isinstance(log.problem, Problem) and log.problem.loop_sizes == (256, 384, 256)
    # Its logged knobs that vary within the problem (pipeline, mma_*, ... are constant).
    assert list(log.knobs.columns) == ["tile_k", "tile_m", "tile_n", "vec_m", "vec_n", "workgroups"]

    # The shipped data: 28 dispatches of 150 candidates, the solver's own knobs, its CPU recorded.
    shipped = [s for s in spaces if s.kind == RESULTS and s is not log]
    assert len(shipped) == 28 and {s.n for s in shipped} == {150}
    assert {s.cpu for s in shipped} == {"znver4"}
    host_cpu = get_target("host").cpu_facts().cpu
    assert {s.device for s in shipped} == {"host" if host_cpu == "znver4" else "llvm-cpu:znver4"}
    for space in shipped:
        assert len(space.knobs.columns) >= 3 and all(str(c).startswith("knob_") for c in space.knobs)
        assert len(space.table) == len(space.knobs) == space.n
        assert (space.times > 0).all() and list(space.table.index) == list(range(space.n))

    # Features: one place, for both kinds; none for the non-GEMM cache.
    assert [has_features(s) for s in (gemm, conv, log)] == [True, False, True]
    for space in (gemm, log):
        features = space_features(space)
        assert list(features.columns) == list(FEATURE_NAMES) and len(features) == space.n
    with pytest.raises(InputError, match="no feature mapping"):
        space_features(conv)


def test_a_candidate_measured_in_two_sessions_counts_once(tmp_path: Path) -> None:
    lines = MATMUL_LOG.read_text().splitlines()
    first = json.loads(lines[0])
    again = {**first, "session": "later", "times_ms": [t * 3 for t in first["times_ms"]]}
    log = tmp_path / "results.jsonl"
    log.write_text("\n".join([*lines, json.dumps(again)]) + "\n")
    (before,) = load_spaces([MATMUL_LOG], "median_ms")
    (after,) = load_spaces([tmp_path], "median_ms")  # a tune output directory
    assert after.n == before.n
    row = int(np.flatnonzero(after.table["candidate_id"] == first["candidate_id"])[0])
    assert after.times[row] == pytest.approx(2 * np.median(first["times_ms"]))


def test_logs_of_two_enumerations_are_two_spaces(tmp_path: Path) -> None:
    records = [json.loads(line) for line in MATMUL_LOG.read_text().splitlines()]
    log = tmp_path / "results.jsonl"
    log.write_text("".join(json.dumps({**r, "space_digest": "a" * 16 if i % 2 else "b" * 16})
                           + "\n" for i, r in enumerate(records)))
    spaces = load_spaces([log])
    assert sorted(s.space_digest for s in spaces) == ["a" * 16, "b" * 16]
    assert len({s.label for s in spaces}) == 2 and all("@" in s.label for s in spaces)
    assert sum(s.n for s in spaces) == load_spaces([MATMUL_LOG])[0].n


def test_bad_inputs_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        classify_inputs([tmp_path / "missing.jsonl"])
    with pytest.raises(InputError, match=r"no results\.jsonl"):
        classify_inputs([tmp_path])
    with pytest.raises(InputError, match=r"expected a results\.jsonl"):
        classify_inputs([FIXTURES / "malformed.mlir"])
    with pytest.raises(InputError, match="given twice"):
        load_spaces([GEMM, GEMM])
    with pytest.raises(InputError, match="unknown time column"):
        load_spaces([MATMUL_LOG], "mean_ms")
    with pytest.raises(InputError, match="at least 300 valid"):
        load_spaces([MATMUL_LOG], min_rows=300)
