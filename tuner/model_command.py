"""`dispatchtune tune-model`: tune a whole model end to end (registered by `tuner/commands.py`)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

from dispatchtune.errors import DispatchTuneError
from dispatchtune.tuner.tune_command import add_order_flags, order_of


def register_tune_model(subparsers: Any) -> argparse.ArgumentParser:
    """Add the `tune-model` subcommand to a `dispatchtune` subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "tune-model",
        help="tune the dispatches that dominate a model; keep only what makes the model faster",
        description=(
            "Compile MODEL with the target's flags, profile it per dispatch, tune the dispatches "
            "that cover most of its time (sharing --budget by their time), then build the whole "
            "model with each dispatch's top candidates and keep a configuration only if the model "
            "gets faster and its outputs match the default build's. Writes DIR/tuning_spec.mlir, "
            "DIR/summary.md, DIR/model_tuning.png and DIR/dispatches/results.jsonl. Re-running "
            "with the same DIR resumes without re-measuring."
        ),
    )
    parser.add_argument("model", type=Path, help="model .mlir (func.func/util.func with linalg ops)")
    parser.add_argument("--target", default="host", help="target name (default: host)")
    parser.add_argument(
        "--budget", type=int, default=30,
        help="candidates to benchmark in all, shared across the tuned dispatches (default 30)",
    )
    parser.add_argument(
        "--output-dir", "-o", type=Path, required=True, help="output directory (resumable)"
    )
    parser.add_argument("--function", default="", help="entry function (default: the only "
                        "public one, or main)")
    parser.add_argument(
        "--coverage", type=float, default=0.9,
        help="tune the slowest problems until they cover this share of the time (default 0.9)",
    )
    parser.add_argument(
        "--max-dispatches", type=int, default=6, help="tune at most this many problems (default 6)"
    )
    parser.add_argument(
        "--min-share", type=float, default=0.02,
        help="skip problems below this share of the model's time (default 0.02)",
    )
    parser.add_argument(
        "--top", type=int, default=3,
        help="candidates per problem tried in the whole model (default 3)",
    )
    parser.add_argument(
        "--model-rounds", type=int, default=5,
        help="interleaved model benchmark rounds per decision (default 5)",
    )
    parser.add_argument(
        "--final-rounds", type=int, default=7,
        help="interleaved rounds of default vs tuned model at the end (default 7)",
    )
    parser.add_argument(
        "--min-model-speedup", type=float, default=1.01,
        help="model speedup a configuration needs to be kept (default 1.01)",
    )
    add_order_flags(parser)
    parser.add_argument(
        "--timer", choices=("auto", "cpu", "real"), default="auto",
        help="model time: process CPU time or wall clock (default auto: cpu on local-sync, whose "
        "single thread does all the work, so load from other processes does not count)",
    )
    parser.add_argument("--device", default="", help="device (default: the target's; "
                        "local-sync for host)")
    parser.add_argument(
        "--jobs", "-j", type=int, default=0, help="parallel compile workers (default: all cores)"
    )
    parser.add_argument(
        "--repetitions", type=int, default=5, help="benchmark repetitions (default 5)"
    )
    parser.add_argument(
        "--confirm-rounds", type=int, default=3,
        help="dispatch-level re-measurement rounds of the top candidates (default 3)",
    )
    parser.add_argument(
        "--no-verify", action="store_true",
        help="do not compare outputs with the default build (dispatch and model level)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for random order and inputs")
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress output (default: on a terminal)"
    )
    parser.set_defaults(handler=run_tune_model)
    return parser


def run_tune_model(args: argparse.Namespace) -> int:
    """Handler of `dispatchtune tune-model`."""
    from dispatchtune.datasets.records import CorruptRecordWarning
    from dispatchtune.tuner.loop import TuneOptions
    from dispatchtune.tuner.model_tuning import ModelTuneOptions, tune_model

    if not args.model.is_file():
        raise DispatchTuneError(f"no such file: {args.model}")
    progress = False if args.no_progress else None
    options = ModelTuneOptions(
        budget=args.budget,
        coverage=args.coverage,
        max_dispatches=args.max_dispatches,
        min_share=args.min_share,
        top=args.top,
        model_rounds=args.model_rounds,
        final_rounds=args.final_rounds,
        min_model_speedup=args.min_model_speedup,
        repetitions=args.repetitions,
        timer=args.timer,
        function=args.function,
        device=args.device,
        verify=not args.no_verify,
        seed=args.seed,
        progress=progress,
        dispatch=TuneOptions(
            order=order_of(args),
            model_path=args.model,
            devices=(args.device,) if args.device else (),
            jobs=max(0, args.jobs),
            repetitions=args.repetitions,
            baseline_every=4,
            verify=not args.no_verify,
            seed=args.seed,
            confirm_rounds=max(0, args.confirm_rounds),
            progress=progress,
        ),
    )

    def show(message: Any, category: Any, *rest: Any, **kwargs: Any) -> None:
        label = "warning" if issubclass(category, CorruptRecordWarning) else category.__name__
        print(f"dispatchtune: {label}: {message}", file=sys.stderr)

    previous = warnings.showwarning
    warnings.showwarning = show
    try:
        result = tune_model(args.model, args.target, args.output_dir, options)
    finally:
        warnings.showwarning = previous
    print(result.text)
    return 0
