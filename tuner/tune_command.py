"""`dispatchtune tune`: the command users run (registered by `tuner/commands.py`)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from dispatchtune.errors import DispatchTuneError


def register_tune(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `tune` subcommand to a `dispatchtune` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="compile and benchmark candidates of every dispatch; write the best tuning spec",
        description=(
            "Tune the dispatches of FILE (a model/function .mlir or a dumped dispatch benchmark): "
            "order the Z3-enumerated candidates, compile them in parallel, benchmark them against "
            "the compiler default, verify their outputs, and write DIR/tuning_spec.mlir, "
            "DIR/results.jsonl and DIR/summary.md. Re-running with the same DIR resumes."
        ),
    )
    parser.add_argument("file", type=Path, help="model/function .mlir or *_benchmark.mlir")
    parser.add_argument("--target", default="host", help="target name (default: host)")
    parser.add_argument(
        "--budget", type=int, default=20, help="candidates to benchmark per dispatch (default 20)"
    )
    parser.add_argument(
        "--output-dir", "-o", type=Path, required=True, help="output directory (resumable)"
    )
    add_order_flags(parser)
    parser.add_argument(
        "--storage", metavar="URL",
        help="Optuna storage of the online search (default: sqlite study.db in the output dir); "
        "workers given the same URL share one study and never measure a candidate twice",
    )
    parser.add_argument(
        "--time-limit", type=float, default=0.0, metavar="S",
        help="online search: stop a dispatch after S seconds (default 0: no limit)",
    )
    parser.add_argument(
        "--stop-patience", type=int, default=0, metavar="N",
        help="online search: stop when the last N results did not beat the best by "
        "--stop-margin (default 0: off)",
    )
    parser.add_argument(
        "--stop-margin", type=float, default=0.01,
        help="improvement that counts for --stop-patience (default 0.01 = 1%%)",
    )
    parser.add_argument(
        "--devices", default="",
        help="comma-separated devices, one benchmark worker each (default: the target's, "
        "local-sync for host; e.g. hip://0,hip://1)",
    )
    parser.add_argument(
        "--jobs", "-j", type=int, default=0, help="parallel compile workers (default: all cores)"
    )
    parser.add_argument(
        "--repetitions", type=int, default=5, help="benchmark repetitions (default 5)"
    )
    parser.add_argument(
        "--baseline-every", type=int, default=4,
        help="re-measure the compiler default after this many benchmarks per device (default 4)",
    )
    parser.add_argument(
        "--compile-timeout", type=float, default=60.0, help="seconds per compile (default 60)"
    )
    parser.add_argument(
        "--benchmark-timeout", type=float, default=120.0,
        help="seconds per benchmark run (default 120)",
    )
    parser.add_argument(
        "--no-verify", action="store_true", help="do not compare outputs with the default build"
    )
    parser.add_argument(
        "--min-speedup", type=float, default=1.02,
        help="speedup over the default a candidate needs to enter the spec (default 1.02: above "
        "the ~2%% run-to-run noise of local-sync)",
    )
    parser.add_argument(
        "--confirm-top", type=int, default=3,
        help="re-measure this many best candidates at the end, interleaved with the default "
        "(default 3; 0 = off)",
    )
    parser.add_argument(
        "--confirm-rounds", type=int, default=3, help="rounds of that re-measurement (default 3)"
    )
    parser.add_argument(
        "--compile-only", action="store_true",
        help="build and check candidates without running them (e.g. a GPU target on a machine "
        "without that GPU); the budget counts candidates built",
    )
    parser.add_argument(
        "--estimator", choices=("min", "median"), default="min",
        help="time of a measurement from its repetitions (default min: outside load only "
        "slows runs down)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random order and inputs")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (default: on a terminal)"
    )
    parser.set_defaults(handler=run_tune)
    return parser


def add_order_flags(parser: argparse.ArgumentParser) -> None:
    """`--order` and `--model` of the dispatch loop (shared by `tune` and `tune-model`)."""
    parser.add_argument(
        "--order", choices=("heuristic", "random", "model", "online"), default="heuristic",
        help="candidate order: heuristic (default), model (learned: --model FILE, else the "
        "target's installed default model), online (Optuna search from the model's order that "
        "refits on this run's measurements), random",
    )
    parser.add_argument(
        "--model", metavar="FILE",
        help="learned model file (train-costmodel) for --order model/online; implies model",
    )


def order_of(args: argparse.Namespace) -> str:
    """The loop's order from the flags: a model file alone means `--order model`."""
    return "model" if args.model and args.order == "heuristic" else str(args.order)


def run_tune(args: argparse.Namespace) -> int:
    """Handler of `dispatchtune tune`."""
    from dispatchtune.datasets.records import CorruptRecordWarning
    from dispatchtune.tuner.loop import TuneOptions, tune

    devices = tuple(d.strip() for d in str(args.devices).split(",") if d.strip())
    options = TuneOptions(
        budget=args.budget,
        order=order_of(args),
        model_path=args.model,
        storage=args.storage,
        time_limit_s=args.time_limit,
        stop_patience=args.stop_patience,
        stop_margin=args.stop_margin,
        devices=devices,
        jobs=max(0, args.jobs),
        repetitions=args.repetitions,
        baseline_every=args.baseline_every,
        compile_timeout_s=args.compile_timeout,
        benchmark_timeout_s=args.benchmark_timeout,
        verify=not args.no_verify,
        seed=args.seed,
        min_speedup=args.min_speedup,
        compile_only=args.compile_only,
        estimator=args.estimator,
        confirm_top=max(0, args.confirm_top),
        confirm_rounds=max(0, args.confirm_rounds),
        progress=False if args.no_progress else None,
    )
    if not args.file.exists():
        raise DispatchTuneError(f"no such file: {args.file}")

    def show(message: Any, category: Any, *rest: Any, **kwargs: Any) -> None:
        label = "warning" if issubclass(category, CorruptRecordWarning) else category.__name__
        print(f"dispatchtune: {label}: {message}", file=sys.stderr)

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        result = tune(args.file, args.target, args.output_dir, options)
    finally:
        warnings.showwarning = previous
    print(result.text)
    return 0
