"""The measure layer's seams: the runner interface on real IREE tools, the durable JSONL writer."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.datasets.jsonl import JsonlWriter
from dispatchtune.errors import DispatchTuneError
from dispatchtune.measure.builder import compile_module, sha256_file
from dispatchtune.measure.runner import (
    Artifact,
    BenchSettings,
    LocalRunner,
    Runner,
    parse_benchmark_json,
)
from dispatchtune.measure.verify import Call, compare, problem_call
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target
from dispatchtune.tuner.model.log import MODEL_SCHEMA, ModelLog

HOST = get_target("host")
PROBLEM = Problem.matmul(32, 16, 8, "f32")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, Call]:
    """A function-level build of a small matmul and its seeded inputs."""
    directory = tmp_path_factory.mktemp("measure")
    source = directory / "f.mlir"
    source.write_text(PROBLEM.to_mlir())
    result = compile_module(source, HOST, None, directory / "f.vmfb", 120)
    assert result.ok, result.error
    call = problem_call(PROBLEM, directory / "inputs", seed=1)
    assert call is not None
    return Artifact(directory / "f.vmfb", "local-sync"), call


def test_the_local_runner_benchmarks_and_runs_through_the_interface(
    built: tuple[Artifact, Call],
) -> None:
    artifact, call = built
    runner: Runner = LocalRunner()  # the loop and tune-model only see this interface
    settings = BenchSettings(repetitions=2, min_time_s=0.01, timeout_s=60)
    for timer in ("real", "cpu"):
        bench = runner.benchmark(artifact, BenchSettings(2, 0.01, 60, timer), call)
        assert bench.ok and len(bench.times_ms) == 2 and all(t > 0 for t in bench.times_ms)
    run = runner.run(artifact, call, 60)
    assert run.ok and run.outputs is not None
    (output,) = run.outputs
    a = np.fromfile(call.inputs[0].split("@", 1)[1], np.float32).reshape(32, 8)
    b = np.fromfile(call.inputs[1].split("@", 1)[1], np.float32).reshape(8, 16)
    assert compare([output], [a @ b], ["f32"])[0] == "ok"
    assert not list(artifact.vmfb.parent.glob("outputs*"))  # raw outputs are removed once read
    # Failures are outcomes with a status and a reason, never exceptions.
    missing = runner.benchmark(artifact, settings, Call("nope", call.inputs, call.results))
    assert missing.status == "failed" and "nope" in missing.error and not missing.times_ms
    slow = runner.benchmark(artifact, BenchSettings(1000, 30.0, 0.5), call)
    assert slow.status == "timeout" and not slow.times_ms
    broken = runner.run(Artifact(Path(artifact.vmfb.parent / "absent.vmfb"), "local-sync"),
                        call, 60)
    assert broken.status == "failed" and broken.outputs is None
    # A dispatch profile needs per-dispatch rows; without them the outcome says why.
    profile = runner.benchmark(artifact, settings, call, dispatch_statistics=True)
    assert profile.ok == bool(profile.dispatches)
    assert profile.ok or "per-dispatch rows" in profile.error


def test_one_benchmark_parser_for_dispatch_and_model_rows() -> None:
    text = json.dumps({"benchmarks": [
        {"name": "BM_main/process_time/real_time", "run_type": "iteration",
         "real_time": 2.0, "cpu_time": 1.5, "time_unit": "ms"},
        {"name": "BM_main/process_time/real_time_mean", "run_type": "aggregate",
         "real_time": 9.0, "cpu_time": 9.0, "time_unit": "ms"},
        {"name": "BM_dispatch/main_dispatch_3_matmul", "run_type": "iteration",
         "real_time": 400.0, "cpu_time": 1.0, "time_unit": "us", "calls": 2},
    ]})
    real = parse_benchmark_json(text)
    assert real.times_ms == [2.0]
    (row,) = real.dispatches
    assert (row.name, row.time_ms, row.calls) == ("main_dispatch_3_matmul", 0.4, 2)
    assert parse_benchmark_json(text, timer="cpu").times_ms == [1.5]


def test_builds_are_compared_by_sha256(built: tuple[Artifact, Call], tmp_path: Path) -> None:
    artifact, _ = built
    copy = tmp_path / "copy.vmfb"
    copy.write_bytes(artifact.vmfb.read_bytes())
    assert sha256_file(copy) == sha256_file(artifact.vmfb)
    failed = compile_module(tmp_path / "absent.mlir", HOST, None, tmp_path / "x.vmfb", 60)
    assert not failed.ok and failed.error and not (tmp_path / "x.vmfb").exists()


def test_the_writer_repairs_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"a": 1}\n{"b": ')  # a run killed in the middle of a write
    writer = JsonlWriter(path)
    writer.append(json.dumps({"c": 3}))
    lines = path.read_text().splitlines()
    assert lines == ['{"a": 1}', '{"b": ', '{"c": 3}']
    JsonlWriter(path)  # a whole last line is left alone
    assert path.read_text().splitlines() == lines
    with pytest.raises(ValueError):
        writer.append('{"d":\n4}')


def test_the_writer_keeps_lines_whole_across_threads(tmp_path: Path) -> None:
    writer = JsonlWriter(tmp_path / "sub" / "log.jsonl")
    payload = "x" * 5000

    def write(thread: int) -> None:
        for i in range(50):
            writer.append(json.dumps({"thread": thread, "i": i, "payload": payload}))

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = [json.loads(line) for line in writer.path.read_text().splitlines()]
    assert len(records) == 200 and {(r["thread"], r["i"]) for r in records} == {
        (t, i) for t in range(4) for i in range(50)
    }


def test_the_model_log_resumes_after_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "model_log.jsonl"
    log = ModelLog(path)
    log.append("profile", model="m", times_ms=[1.0])
    with path.open("a") as handle:
        handle.write('{"schema": "dispatchtune.model/1", "kind": "st')
    with pytest.warns(UserWarning, match="corrupt record skipped"):
        again = ModelLog(path)
    assert again.find("profile", model="m") is not None and again.find("step") is None
    again.append("step", key="k", kept=None)
    with pytest.warns(UserWarning):
        third = ModelLog(path)
    assert [r["kind"] for r in third.records] == ["profile", "step"]
    path.write_text('{"schema": "dispatchtune.result/1"}\n')
    with pytest.raises(DispatchTuneError, match="not a tune-model record"):
        ModelLog(path)


def test_a_malformed_model_log_record_is_skipped_not_a_traceback(tmp_path: Path) -> None:
    """model_log.jsonl is read back on resume: a record whose fields have the wrong types (a
    hand-edited build time, a dispatch row with a string time) is skipped and measured again."""
    path = tmp_path / "model_log.jsonl"
    log = ModelLog(path)
    good = log.append("profile", model="m", times_ms=[1.0], default_build_s=0.9,
                      dispatches=[{"name": "d0", "time_ms": 0.5, "calls": 1}])
    log.append("final", default_times_ms=[[1.0]], tuned_times_ms=[[0.9]], verify_status="ok")
    bad_profile = {**good, "default_build_s": "abc", "dispatches": [{"name": 5, "time_ms": "x"}]}
    bad_final = {"schema": MODEL_SCHEMA, "kind": "final", "default_times_ms": "1",
                 "tuned_times_ms": [[True]], "verify_status": "ok"}
    bad_step = {"schema": MODEL_SCHEMA, "kind": "step", "key": "k", "kept": "7"}
    with path.open("a") as handle:
        for record in (bad_profile, bad_final, bad_step, {"schema": MODEL_SCHEMA, "kind": 3}):
            handle.write(json.dumps(record) + "\n")
    with pytest.warns(UserWarning, match="malformed") as seen:
        again = ModelLog(path)
    assert len(seen) == 4
    assert [r["kind"] for r in again.records] == ["profile", "final"]
    profile = again.find("profile")
    assert profile is not None and profile["default_build_s"] == 0.9


def test_a_masked_attention_is_called_with_its_mask(tmp_path: Path) -> None:
    """GPT-2's causal SDPA carries an additive f32 mask: the verification call fed Q, K and V
    only, so `main` refused it ("expected 4 arguments but passed 3") and every candidate of a
    masked attention went unchecked. The call now feeds the mask too, and the build runs."""
    problem = Problem.attention(2, 16, 8, 8, 16, "f32", mask_type="f32")
    source = tmp_path / "a.mlir"
    source.write_text(problem.to_mlir())
    result = compile_module(source, HOST, None, tmp_path / "a.vmfb", 120)
    assert result.ok, result.error
    call = problem_call(problem, tmp_path / "inputs", seed=1)
    assert call is not None and len(call.inputs) == 4
    run = LocalRunner().run(Artifact(tmp_path / "a.vmfb", "local-sync"), call, 60)
    assert run.ok and run.outputs is not None and run.outputs[0].shape == (2, 16, 8)


def test_a_spec_is_applied_with_one_compiler_thread(tmp_path: Path) -> None:
    """IREE 3.13 hangs now and then configuring several executables in parallel with a spec
    (the tune-with-const-eval test timed out in CI on a 1 KB two-dispatch model; 1 in 100-150
    compiles here, none of 400 with one thread): every compile given a spec runs on one thread,
    and CUDA keeps its own spec flag."""
    spec = tmp_path / "spec.mlir"
    assert HOST.tuning_spec_flags(spec) == (
        f"--iree-codegen-tuning-spec-path={spec}", "--mlir-disable-threading")
    assert get_target("sm_80").tuning_spec_flags(spec)[0] == (
        f"--iree-codegen-transform-dialect-library={spec}")
