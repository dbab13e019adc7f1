"""Pieces of the tuning loop on real IREE: benchmark-file fill, process outcomes, verification."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.errors import InputError
from dispatchtune.measure.benchfile import (
    add_buffer_fill,
    dump_dispatch_benchmarks,
    fill_pattern,
    is_dispatch_benchmark,
    strip_compilation_info,
)
from dispatchtune.measure.builder import BinaryRegistry
from dispatchtune.measure.process import classify, run_process
from dispatchtune.measure.runner import Artifact, LocalRunner, parse_benchmark_json
from dispatchtune.measure.verify import compare, problem_call, tolerance
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target
from dispatchtune.toolchain import tool_path

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"
HOST = get_target("host")


@pytest.fixture(scope="module")
def dumped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    files = dump_dispatch_benchmarks(FIXTURE, HOST, tmp_path_factory.mktemp("dump")).files
    assert len(files) == 1
    return files[0]


def test_fill_is_inserted_after_the_buffer_store_and_the_file_still_compiles(
    dumped: Path, tmp_path: Path
) -> None:
    text = dumped.read_text()
    assert is_dispatch_benchmark(text)
    stripped = strip_compilation_info(dumped, tmp_path / "stripped.mlir").read_text()
    assert "lowering_config" not in stripped and "root_op" in stripped
    filled = add_buffer_fill(stripped, fill_pattern("f32"))
    assert "hal.command_buffer.fill_buffer" not in stripped
    assert filled.count("hal.command_buffer.fill_buffer") == 1
    # The fill must come after the global store inside the initializer, not in the dispatch fn.
    init = filled[filled.index("util.initializer") :]
    init = init[: init.index("util.return")]
    assert init.index("util.global.store %buffer") < init.index("fill_buffer")
    assert f"arith.constant {0x3F800000} : i32" in init
    (tmp_path / "filled.mlir").write_text(filled)
    proc = run_process(
        [tool_path("iree-compile"), str(tmp_path / "filled.mlir"), "-o", str(tmp_path / "f.vmfb")],
        120,
    )
    assert proc.ok, proc.stderr
    bench = run_process(
        [tool_path("iree-benchmark-module"), f"--module={tmp_path / 'f.vmfb'}",
         "--device=local-sync", "--benchmark_repetitions=2", "--benchmark_min_time=0.01s",
         "--benchmark_format=json"],
        120,
    )
    assert bench.ok, bench.stderr
    times = parse_benchmark_json(bench.stdout).times_ms
    assert len(times) == 2 and all(t > 0 for t in times)


def test_fill_refuses_a_file_without_a_buffer_initializer() -> None:
    with pytest.raises(InputError, match=r"no util\.initializer allocating a buffer"):
        add_buffer_fill(FIXTURE.read_text())


def test_fill_patterns_are_one_point_zero_in_their_type() -> None:
    assert np.frombuffer(np.uint32(fill_pattern("f32")).tobytes(), np.float32)[0] == 1.0
    assert set(np.frombuffer(np.uint32(fill_pattern("f16")).tobytes(), np.float16)) == {1.0}


def test_exit_statuses_are_classified() -> None:
    assert classify(0, "")[0] == "ok"
    assert classify(1, "x.mlir:3:4: error: large vector sizes\n")[0] == "failed"
    status, reason = classify(-11, "Stack dump:\n")
    assert status == "crashed" and "SIGSEGV" in reason
    assert classify(248, "PLEASE submit a bug report")[0] == "crashed"


def test_real_processes_time_out_and_crash() -> None:
    slow = run_process([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    assert slow.status == "timeout" and slow.elapsed_s < 10
    crash = run_process([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), 11)"], 30)
    assert crash.status == "crashed" and "SIGSEGV" in crash.error


def test_benchmark_json_units() -> None:
    text = json.dumps({"benchmarks": [
        {"run_type": "iteration", "real_time": 1500.0, "time_unit": "us"},
        {"run_type": "aggregate", "real_time": 1.0, "time_unit": "us"},
        {"run_type": "iteration", "real_time": 2.0, "time_unit": "ms"},
    ]})
    assert parse_benchmark_json(text).times_ms == [1.5, 2.0]


def test_verification_runs_the_function_and_compares_per_element_type(tmp_path: Path) -> None:
    problem = Problem.matmul(32, 16, 8, "f16", out_type="f32")
    call = problem_call(problem, tmp_path / "in", seed=3)
    assert call is not None and len(call.inputs) == 2
    (tmp_path / "f.mlir").write_text(problem.to_mlir())
    built = run_process(
        [tool_path("iree-compile"), str(tmp_path / "f.mlir"), *HOST.compile_flags,
         "-o", str(tmp_path / "f.vmfb")],
        120,
    )
    assert built.ok, built.stderr
    run = LocalRunner().run(Artifact(tmp_path / "f.vmfb", "local-sync"), call, 60)
    assert run.ok and run.outputs is not None
    (out,) = run.outputs
    assert out.shape == (32, 16)
    a = np.fromfile(tmp_path / "in" / "input0.bin", np.float16).reshape(32, 8).astype(np.float64)
    b = np.fromfile(tmp_path / "in" / "input1.bin", np.float16).reshape(8, 16).astype(np.float64)
    assert compare([out], [a @ b], ["f32"])[0] == "ok"
    wrong = out.copy()
    wrong[5, 7] += 0.5
    status, err = compare([wrong], [out], ["f32"])
    assert status == "mismatch" and err == pytest.approx(0.5, rel=1e-3)
    nan = out.copy()
    nan[0, 0] = np.nan
    assert compare([nan], [out], ["f32"])[0] == "mismatch"
    assert tolerance("f16") > tolerance("f32") > tolerance("i32") == 0.0


def test_a_candidate_built_again_is_not_its_own_duplicate() -> None:
    """A candidate released unmeasured (budget spent) and built again keeps its binary; another
    candidate with the same bytes is the duplicate."""
    registry = BinaryRegistry()
    assert registry.claim("aa", 7) is None
    assert registry.claim("aa", 7) is None
    assert registry.claim("aa", 9) == 7
    assert registry.claim("bb", 9) is None


def test_failure_reasons_keep_the_message_and_drop_the_location(tmp_path: Path) -> None:
    """Reasons used to be cut at 120 characters of the raw line: the path of the run's own
    benchmark.mlir ate the width, so "exceeded the limit of" lost its limit and "killed by
    SIGABRT: /tmp/.../benchmark.mlir:29:17: e" lost the whole message."""
    from types import SimpleNamespace

    from dispatchtune.datasets.records import ResultRecord
    from dispatchtune.tuner.report import write_outputs

    problem = Problem.matmul(128, 128, 128, "f16")
    where = f"{tmp_path}/work dir/{problem.key}/benchmark.mlir"  # a path with a space, too
    shared = (f"{where}:23:9: error: function 'main_dispatch_12_attention_4x2x128x64x64x128' uses "
              "90112 bytes of shared memory; exceeded the limit of 65536 bytes")
    abort = (f"killed by SIGABRT: {where}:29:17: error: contraction like operation missing "
             "critical dimension")
    records = [
        ResultRecord(problem=problem.to_dict(), problem_key=problem.key, target="gfx942",
                     device="hip://0", candidate_id=i, compile_status=status, compile_error=error)
        for i, (status, error) in enumerate([("failed", shared), ("crashed", abort),
                                             ("crashed", abort), ("failed", "x " * 150)])
    ]
    options = SimpleNamespace(min_speedup=1.02, estimator="min", compile_only=True)
    result = write_outputs(records, [problem], get_target("gfx942"), tmp_path, options)
    summary = (tmp_path / "summary.md").read_text()
    for text in (result.text, summary):
        assert ("function 'main_dispatch_12_attention_4x2x128x64x64x128' uses 90112 bytes of "
                "shared memory; exceeded the limit of 65536 bytes") in text
        assert "killed by SIGABRT: contraction like operation missing critical dimension" in text
        assert "benchmark.mlir" not in text and "error:" not in text
    assert "    2 x killed by SIGABRT: contraction like" in result.text
    # A message longer than the width is cut between words, and says it was cut.
    (long,) = [line for line in result.text.splitlines() if "x x x" in line]
    assert long.endswith("x ...") and len(long) < 220
