"""The inputs users bring to `tune-model`: torch exports, dense_resource weights, token ids; and
the decisions made before any budget is spent (what can be configured, compile timeouts)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.ir.frontend import load_problems
from dispatchtune.ir.lowering import lower_torch_to_function
from dispatchtune.measure.benchfile import dump_dispatch_benchmarks, synthesise_missing_resources
from dispatchtune.measure.builder import compile_module
from dispatchtune.measure.runner import Artifact, LocalRunner
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target
from dispatchtune.tuner.model import DispatchShare, ModelTuneOptions, find_entry, model_call
from dispatchtune.tuner.model.entry import FALLBACK_INT_RANGE
from dispatchtune.tuner.model.flow import _select
from dispatchtune.tuner.model.profile import configurable_reason
from dispatchtune.tuner.model.steps import adaptive_timeout

FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
HOST = get_target("host")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCHTUNE_CACHE", str(tmp_path / "cache"))


def test_token_ids_stay_inside_the_embedding_table(tmp_path: Path) -> None:
    entry = find_entry(FIXTURES / "embedding_gather.mlir")
    # ids index a 50-row table; the flag indexes nothing, so it gets 0/1.
    assert entry.int_ranges == ((0, 50), FALLBACK_INT_RANGE)
    call = model_call(entry, tmp_path / "inputs", seed=0)
    ids = np.fromfile(tmp_path / "inputs" / "input0.bin", dtype=np.int64)
    flag = np.fromfile(tmp_path / "inputs" / "input1.bin", dtype=np.int32)
    assert ids.min() >= 0 and ids.max() < 50 and len(set(ids.tolist())) > 1
    assert set(flag.tolist()) <= {0, 1}
    vmfb = tmp_path / "model.vmfb"
    assert compile_module(FIXTURES / "embedding_gather.mlir", HOST, None, vmfb, 300).ok
    outputs = LocalRunner().run(Artifact(vmfb, "local-sync"), call, 120).outputs
    assert outputs is not None and np.allclose(outputs[0], 0.5 * 0.25 * 16)


def test_boolean_arguments_get_random_bits_iree_reads_as_bytes(tmp_path: Path) -> None:
    """A torch export's key-padding mask is an i1 argument: tune-model refused such models ("no
    random inputs for i1"). Half the bits are set, and IREE reads them as numpy writes them."""
    model = FIXTURES / "masked_matmul_i1.mlir"
    entry = find_entry(model)
    call = model_call(entry, tmp_path / "inputs", seed=0)
    assert call.inputs[2].startswith("--input=32x32xi1=@")
    a, b = (np.fromfile(tmp_path / "inputs" / f"input{i}.bin", dtype=np.float32).reshape(32, 32)
            for i in (0, 1))
    mask = np.fromfile(tmp_path / "inputs" / "input2.bin", dtype=np.uint8)
    assert mask.size == 32 * 32 and set(mask.tolist()) == {0, 1} and 0.4 < mask.mean() < 0.6
    vmfb = tmp_path / "model.vmfb"
    assert compile_module(model, HOST, None, vmfb, 300).ok
    outputs = LocalRunner().run(Artifact(vmfb, "local-sync"), call, 120).outputs
    assert outputs is not None
    expected = np.where(mask.reshape(32, 32) == 1, a @ b, 0.0)
    assert np.allclose(outputs[0], expected, atol=1e-5)


def test_real_exports_get_ids_below_their_vocabulary() -> None:
    for name in ("bert_l1_s128", "llama_l1_s128"):
        entry = find_entry(EXAMPLES / "models" / f"{name}.mlir")
        assert entry.int_ranges == ((0, 1000),), name  # random-init vocabulary of 1000


def test_torch_export_with_sdpa_lowers_to_a_plain_tensor_function() -> None:
    source = FIXTURES / "torch_sdpa_f32.mlir"
    lowered = lower_torch_to_function(source)
    assert lowered != source and lower_torch_to_function(source) == lowered  # cached
    text = lowered.read_text()
    assert "!torch" not in text and "hal.buffer_view" not in text
    assert "iree_linalg_ext.attention" in text
    entry = find_entry(lowered)
    assert entry.name == "main" and [t.shape for t in entry.inputs] == [(1, 4, 64, 32)] * 3 + [
        (32, 32)
    ]
    kinds = sorted({p.kind for p in load_problems(lowered, HOST)})
    assert kinds == ["attention", "contraction"]
    # A linalg file is used as it is.
    plain = FIXTURES / "embedding_gather.mlir"
    assert lower_torch_to_function(plain) == plain


def test_dumped_benchmark_carries_the_blobs_it_references(tmp_path: Path) -> None:
    model = FIXTURES / "mm_dense_resource_f32.mlir"
    dumped = dump_dispatch_benchmarks(model, HOST, tmp_path / "dumped").files
    texts = [f.read_text() for f in dumped]
    assert any("dense_resource<bias>" in t for t in texts)
    for file in dumped:  # every dumped dispatch parses and compiles on its own
        assert compile_module(file, HOST, None, tmp_path / f"{file.stem}.vmfb", 300,
                              with_target_flags=False).ok, file.name
    # Defined blobs are left alone; synthesised ones are never a splat.
    text = "%c = arith.constant dense_resource<b> : tensor<8xf32>\n"
    completed, added = synthesise_missing_resources(text)
    assert added == ["b"] and synthesise_missing_resources(completed) == (completed, [])
    blob = completed.split('b: "0x')[1].split('"')[0]
    assert len(blob) == 2 * (4 + 8 * 4)
    values = np.frombuffer(bytes.fromhex(blob[8:]), dtype=np.float32)
    assert len(set(values.tolist())) == 8


def test_only_configurable_problems_get_budget() -> None:
    matmul = replace(Problem.matmul(128, 256, 256, "f32"), name="main_dispatch_1_matmul")
    refused = [p for p in load_problems(FIXTURES / "cpu_maxpool_nchw_f32.mlir", HOST)]
    assert configurable_reason(matmul, HOST) == ""
    reason = configurable_reason(refused[0], HOST)
    assert "pooling" in reason and len(reason.splitlines()) == 1
    shares = [
        DispatchShare(refused[0], ["main_dispatch_0"], 1, 6.0, 0.6, "main_dispatch_0"),
        DispatchShare(matmul, ["main_dispatch_1"], 1, 3.0, 0.3, "main_dispatch_1"),
        DispatchShare(replace(matmul, name="x"), ["main_dispatch_2"], 1, 0.1, 0.01,
                      "main_dispatch_2"),
    ]
    selected = _select(shares, HOST, ModelTuneOptions(budget=6))
    assert selected == [shares[1]] and shares[1].budget == 6 and not shares[1].skip_reason
    assert shares[0].budget == 0 and shares[0].skip_reason.startswith("cannot be configured")
    assert shares[2].skip_reason.startswith("below --min-share")


def test_compile_timeouts_follow_the_default_build() -> None:
    assert adaptive_timeout(0.5, 600) == 10.0
    assert adaptive_timeout(8.0, 600) == 40.0
    assert adaptive_timeout(200.0, 600) == 600.0


def test_user_inputs_from_npz(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dispatchtune.cli import main as cli_main
    from dispatchtune.errors import InputError

    model = FIXTURES / "embedding_gather.mlir"
    entry = find_entry(model)
    ids = np.arange(8, dtype=np.int64).reshape(1, 8)
    np.savez(tmp_path / "ok.npz", ids, np.ones(1, np.int32))
    call = model_call(entry, tmp_path / "inputs", 0, tmp_path / "ok.npz")
    assert call.inputs[0] == f"--input=1x8xi64=@{tmp_path / 'inputs' / 'input0.bin'}"
    assert np.array_equal(np.fromfile(tmp_path / "inputs" / "input0.bin", np.int64), ids.ravel())
    np.savez(tmp_path / "short.npz", ids)
    np.savez(tmp_path / "shape.npz", ids.reshape(8, 1), np.ones(1, np.int32))
    for name, message in (("short", "holds 1 arrays"),
                          ("shape", r"array 0 is int64\[8, 1\]; argument 0 of @main is 1x8xi64"),
                          ("missing", "cannot read --inputs")):
        with pytest.raises(InputError, match=message):
            model_call(entry, tmp_path / "inputs", 0, tmp_path / f"{name}.npz")
    code = cli_main(["tune-model", str(model), "-o", str(tmp_path / "out"), "--no-progress",
                     "--inputs", str(tmp_path / "short.npz")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "holds 1 arrays" in err, err


def test_tune_model_takes_the_torch_export_directly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dispatchtune.cli import main as cli_main

    out = tmp_path / "out"
    code = cli_main(["tune-model", str(FIXTURES / "torch_mm_f32.mlir"), "--budget", "2",
                     "--model-rounds", "1", "--final-rounds", "1", "--repetitions", "2",
                     "-o", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "is torch dialect: lowered to a tensor function" in captured.err
    summary = (out / "summary.md").read_text()
    assert "Lowered from the torch-dialect export" in summary and "contraction_64x48x32" in summary


def test_tune_model_takes_a_turbine_export_whose_weights_are_globals(tmp_path: Path) -> None:
    """iree-turbine writes each weight as a `util.global` (dense_resource) that torch-mlir's
    backend pipeline rejects ("found an op that was marked as backend illegal"), so tune-model
    refused every real export with weights; IREE's own torch pipeline takes them. Run as the
    README shows."""
    import subprocess
    import sys

    source = FIXTURES / "torch_linear_globals_f32.mlir"
    lowered = lower_torch_to_function(source)
    text = lowered.read_text()
    assert "!torch" not in text and "hal.buffer_view" not in text
    entry = find_entry(lowered)
    assert entry.name == "main" and [t.shape for t in entry.inputs] == [(8, 32)]
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "tune-model", str(source), "--budget", "1",
         "--model-rounds", "1", "--final-rounds", "1", "--repetitions", "2", "-o", str(out)],
        capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    summary = (out / "summary.md").read_text()
    assert "contraction_8x32x32" in summary and "outputs vs default build: ok" in proc.stdout


def test_dynamic_shapes_are_named_as_the_cause_of_an_empty_dump(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """IREE dumps no benchmark of a dynamic-shape dispatch; `tune` says why, in one line."""
    from dispatchtune.cli import main as cli_main
    from dispatchtune.ir.frontend import dynamic_shape_note

    assert dynamic_shape_note(FIXTURES / "mlp_two_matmuls.mlir") == ""
    assert dynamic_shape_note(FIXTURES / "malformed.mlir") == ""
    assert cli_main(["tune", str(FIXTURES / "dynamic_matmul.mlir"), "--target", "host",
                     "--budget", "1", "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert ("dumped no dispatch benchmarks: argument 0 of @matmul has dynamic shape "
            "tensor<?x256xf32>; dispatchtune needs static shapes") in err


def test_a_budget_short_of_the_coverage_says_which_budget_reaches_it() -> None:
    """ResNet-18 b1 at --budget 12 tuned 6 of the 9 problems its 0.9 coverage selects."""
    shares = [
        DispatchShare(replace(Problem.matmul(128, n, 256, "f32"), name=f"main_dispatch_{i}_mm"),
                      [f"main_dispatch_{i}"], 1, 3.0, 0.32, f"main_dispatch_{i}")
        for i, n in enumerate((256, 512, 1024))
    ]
    selected = _select(shares, HOST, ModelTuneOptions(budget=4))
    assert selected == shares and [s.budget for s in shares] == [2, 2, 0]
    assert shares[2].skip_reason == ("no budget left (--budget 4, at least 2 per problem; "
                                     "--budget 6 reaches all 3 problems of --coverage 0.9)")


def test_iree_applies_a_spec_to_a_grouped_convolution(tmp_path: Path) -> None:
    """IREE 3.13 llvm-cpu takes a spec's tiles for a unit-batch NGCHW grouped conv
    (DoubleTilingExpert, loops [batch, group, out channel, oh, ow, in channel, kh, kw]) and the
    model compiles with it; the search enumerates it under that pipeline."""
    from dispatchtune.ir.spec import applied_configs, config_applied
    from dispatchtune.measure.builder import write_spec_file
    from dispatchtune.search import enumerate_candidates

    model = FIXTURES / "cpu_grouped_conv_ngchw_f32.mlir"
    problem = load_problems(model, HOST)[0]
    first = enumerate_candidates(problem, HOST, limit=1)
    assert list(first.table["pipeline"].astype(str)) == ["DoubleTilingExpert"]
    default = applied_configs(model, HOST, None)[0]
    assert "DoubleTilingExpert" in default
    tiles = ("distribution = [0, 1, 32, 2, 14, 0, 0, 0], "
             "vector_common_parallel = [0, 1, 4, 1, 4, 0, 0, 0], "
             "vector_reduction = [0, 0, 0, 0, 0, 1, 1, 16]>,")
    requested = default.split("distribution")[0] + tiles + default.split(">,", 1)[1]
    assert requested != default and requested.count("translation_info") == 1
    spec = write_spec_file([(problem, requested)], tmp_path / "spec.mlir")
    assert any(config_applied(requested, a) for a in applied_configs(model, HOST, spec))
    assert compile_module(model, HOST, spec, tmp_path / "model.vmfb", 300.0).ok


def _shares(values: list[float]) -> list[DispatchShare]:
    matmul = Problem.matmul(128, 256, 256, "f32")
    return [DispatchShare(replace(matmul, name=f"main_dispatch_{i}_mm"), [f"main_dispatch_{i}"],
                          1, 10.0 * v, v, f"main_dispatch_{i}") for i, v in enumerate(values)]


def test_a_selection_short_of_the_coverage_names_the_knob_that_stopped_it() -> None:
    """Coverage is the goal; --max-dispatches and --min-share only cap it, and say so when they do."""
    met = _shares([0.6, 0.32, 0.05])
    _select(met, HOST, ModelTuneOptions())
    assert met[2].skip_reason == "outside --coverage 0.9 (the 2 slower problems cover 92.0%)"

    capped = _shares([0.24, 0.24, 0.24, 0.24])
    assert len(_select(capped, HOST, ModelTuneOptions(max_dispatches=2))) == 2
    assert capped[3].skip_reason == ("beyond --max-dispatches 2 (coverage stops at 48.0%; "
                                     "--max-dispatches 4 reach 0.9)")

    flat = _shares([0.6, 0.25, 0.016, 0.016, 0.016, 0.016, 0.016])
    assert len(_select(flat, HOST, ModelTuneOptions(budget=8))) == 2
    assert flat[2].skip_reason == ("below --min-share 0.02 (coverage stops at 85.0%; "
                                   "--min-share 0.016 --budget 12 reach 0.9)")

    unreachable = _shares([0.5, 0.3])
    _select(unreachable, HOST, ModelTuneOptions(max_dispatches=1))
    assert unreachable[1].skip_reason == ("beyond --max-dispatches 1 (coverage stops at 50.0%; "
                                          "the configurable problems cover only 80.0%)")
