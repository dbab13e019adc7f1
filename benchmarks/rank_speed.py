"""Wall time of `dispatchtune rank FILE --target gfx942 --json` on a large space, per model file.

Usage: python benchmarks/rank_speed.py [MODEL.json ...] [--repeats 3] [--keep-filters]
           [--conv 2,128,128,640,640,3,3,f16]
Writes one convolution (batch, output height and width, input and output channels, kernel height
and width, operand type; by default 2x128x128x640 -> 640, 3x3, f16: 39,724 gfx942 candidates with
`--no-heuristic-filters`; 32,64,64,1280,1280,3,3,i8 has 59,616) and times the CLI end to end
as a user runs it (enumeration, features, the model's order, every candidate as a JSON line to
/dev/null), alternating between the model files given (default: the shipped gfx942 prior) so
that machine noise falls on all alike. Prints the space size and each model's fastest and median
run (goal: seconds, not minutes, for a 59,000-candidate space).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dispatchtune.costmodel.defaults import default_model_path
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem, element_bytes

DEFAULT_CONV = "2,128,128,640,640,3,3,f16"


def conv(spec: str) -> Problem:
    """The `--conv` problem: seven sizes and an operand type, comma-separated."""
    *text, element = spec.split(",")
    try:
        batch, out_h, out_w, channels, filters, kernel_h, kernel_w = (int(size) for size in text)
        element_bytes(element)  # an unknown type fails here, not inside the first run
        return Problem.conv2d_nhwc_hwcf(batch, out_h, out_w, channels, filters, kernel_h,
                                        kernel_w, element)
    except (ValueError, DispatchTuneError) as exc:
        raise argparse.ArgumentTypeError(f"expected seven sizes and a type ({exc})") from exc


def run(source: Path, model: Path | None, filters: bool) -> tuple[float, int]:
    """Seconds of one `rank --json` run and the number of JSON lines it printed."""
    command = [sys.executable, "-m", "dispatchtune", "rank", str(source), "--target", "gfx942",
               "--json", "--heuristic-filters" if filters else "--no-heuristic-filters",
               *(["--cost-model", str(model)] if model else [])]
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, proc.stdout.count("\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep-filters", action="store_true",
                        help="IREE's filtered space instead of the whole one")
    parser.add_argument("--conv", type=conv, default=DEFAULT_CONV, help="the convolution to rank")
    args = parser.parse_args(argv)
    problem: Problem = args.conv
    models: list[Path | None] = list(args.models) or [None]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "conv.mlir"
        source.write_text(problem.to_mlir())
        _, rows = run(source, models[0], args.keep_filters)  # warm-up: caches and imports
        times: dict[int, list[float]] = {i: [] for i in range(len(models))}
        for _ in range(args.repeats):
            for i, model in enumerate(models):
                seconds, printed = run(source, model, args.keep_filters)
                assert printed == rows, "every model prints every candidate"
                times[i].append(seconds)
    print(f"rank --json on {problem.key}: {rows:,} candidates, {args.repeats} runs per model, "
          "alternating")
    print("| model | fastest | median |\n|---|---:|---:|")
    for i, model in enumerate(models):
        name = model or f"{default_model_path('gfx942')} (shipped)"
        print(f"| {name} | {min(times[i]):.2f} s | {statistics.median(times[i]):.2f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
