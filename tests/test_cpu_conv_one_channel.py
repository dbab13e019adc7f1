"""Convolutions with one input channel on llvm-cpu (a grayscale image's or a waveform's first
layer, NCHW/FCHW and NCW/FCW as PyTorch exports them): IREE folds the unit input channel away and
configures the op as it is under DoubleTilingExpert; the space takes it at batch 1 (no batch loop
either) and batch 2. The heuristic's first and last candidates apply exactly, compile and compute
the default build's outputs; `tune` runs through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from cpu_checks import first_and_last_apply_and_compute_the_same, tune_through_the_cli

from dispatchtune.search import enumerate_candidates
from dispatchtune.targets import get_target

FIXTURES = Path(__file__).parent / "fixtures"
HOST = get_target("host")
CONV2D = FIXTURES / "cpu_conv_one_input_channel_f32.mlir"
CONV2D_B2 = FIXTURES / "cpu_conv_one_input_channel_b2_f32.mlir"
CONV1D = FIXTURES / "cpu_conv1d_one_input_channel_f32.mlir"


@pytest.mark.parametrize(("fixture", "batch"), [(CONV2D, 1), (CONV2D_B2, 2), (CONV1D, 1)])
def test_one_input_channel_candidates_apply_compile_and_compute_the_same(
    fixture: Path, batch: int, tmp_path: Path
) -> None:
    """The fixtures are the ops as IREE's dispatches hold them (unit loops folded away)."""
    problem = first_and_last_apply_and_compute_the_same(fixture, "DoubleTilingExpert", tmp_path)
    assert not problem.loops("input_channel") and bool(problem.loops("batch")) == (batch > 1)
    assert not problem.unit_batch_conv  # configured as it is: no unit batch re-expanded
    table = enumerate_candidates(problem, HOST).table
    assert (table["tile_k"] == 1).all()  # no input-channel loop to reduce over
    # The filter width is reduced one step at a time or whole, as for depthwise convs.
    kw = problem.sizes("filter_loop")[-1]
    assert set(table["knob_vector_reduction_" + str(problem.loops("filter_loop")[-1])]) <= {1, kw}


def test_one_input_channel_conv_tunes_through_the_cli(tmp_path: Path) -> None:
    """`dispatchtune tune FILE --target host --budget 2 -o DIR`, as a user runs it."""
    tune_through_the_cli(CONV2D, 2, tmp_path / "out")
