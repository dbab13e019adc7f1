"""`dispatchtune tune-model MODEL -o DIR`: tune the dispatches that dominate a whole model."""

from __future__ import annotations

import argparse
from typing import Any

from dispatchtune.cli.options import (
    AT_LEAST_1,
    MODEL_TUNE_DEFAULTS,
    POSITIVE,
    SHARE,
    Range,
    absolute_path,
    add_number,
    add_runner,
    add_target,
    add_tuning_common,
    order_of,
    output_dir,
    progress_of,
    shown,
)
from dispatchtune.errors import InputError
from dispatchtune.tuner.model.options import TIMERS

#: What a run writes in its output directory (checked to be writable files before it starts).
OUTPUT_FILES = ("dispatches/results.jsonl", "tuning_spec.mlir", "summary.md", "model_tuning.png")


def register(subparsers: Any) -> None:
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
    defaults = MODEL_TUNE_DEFAULTS
    # Its own dest: `model` would collide with the cost-model file (issue #17).
    parser.add_argument("model_mlir", type=absolute_path, metavar="MODEL",
                        help="model .mlir (func.func/util.func with linalg ops)")
    add_target(parser)
    add_tuning_common(parser, defaults,
                      "candidates to benchmark in all, shared across the tuned dispatches")
    parser.add_argument("--function", default=defaults.function,
                        help="entry function (default: the only public one, or main)")
    add_number(parser, "--coverage", kind=float, valid=SHARE, default=defaults.coverage,
               help="tune the slowest problems until they cover this share of the time "
               "(default %(default)s)")
    add_number(parser, "--max-dispatches", kind=int, valid=AT_LEAST_1, default=defaults.max_dispatches,
               help="tune at most this many problems (default %(default)s)")
    add_number(parser, "--min-share", kind=float, valid=Range(0, 1, high_open=True),
               default=defaults.min_share,
               help="skip problems below this share of the model's time (default %(default)s)")
    add_number(parser, "--top", kind=int, valid=AT_LEAST_1, default=defaults.top,
               help="candidates per problem tried in the whole model (default %(default)s)")
    add_number(parser, "--model-rounds", kind=int, valid=AT_LEAST_1, default=defaults.model_rounds,
               help="interleaved model benchmark rounds per decision (default %(default)s)")
    add_number(parser, "--model-rounds-max", kind=int, valid=AT_LEAST_1,
               default=defaults.model_rounds_max,
               help="a close decision measures --model-rounds more rounds at a time, up to this many "
               "(default %(default)s)")
    add_number(parser, "--keep-alpha", kind=float, valid=Range(0, 1, low_open=True, high_open=True),
               default=defaults.keep_alpha,
               help="a configuration is kept only when a sign test over the paired rounds says it "
               "is faster at this level (default %(default)s)")
    add_number(parser, "--final-rounds", kind=int, valid=AT_LEAST_1, default=defaults.final_rounds,
               help="interleaved rounds of default vs tuned model at the end (default %(default)s)")
    add_number(parser, "--min-model-speedup", kind=float, valid=POSITIVE,
               default=defaults.min_model_speedup,
               help="model speedup a configuration needs to be kept (default %(default)s)")
    parser.add_argument(
        "--timer", choices=TIMERS, default=defaults.timer,
        help="model time: process CPU time or wall clock (default %(default)s: cpu on local-sync, "
        "whose single thread does all the work, so load from other processes does not count)",
    )
    parser.add_argument("--inputs", default=defaults.inputs, metavar="FILE.npz",
                        help="the model's inputs, one array per argument in order (default: "
                        "seeded random ones; integer ids stay below the table they index)")
    parser.add_argument("--device", default=defaults.device,
                        help="device (default: the target's; local-sync for host): an IREE URI, "
                        "on --runner's machine if given, or RUNNER/URI (ssh://gpu1/hip://0)")
    add_runner(parser, defaults.dispatch.runner)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dispatchtune.tuner.loop import TuneOptions
    from dispatchtune.tuner.model import ModelTuneOptions, tune_model

    if not args.model_mlir.is_file():
        raise InputError(f"no such file: {shown(args.model_mlir)}")
    output_dir(args.output_dir, "--output-dir", OUTPUT_FILES)
    progress = progress_of(args)
    options = ModelTuneOptions(
        budget=args.budget,
        coverage=args.coverage,
        max_dispatches=args.max_dispatches,
        min_share=args.min_share,
        top=args.top,
        model_rounds=args.model_rounds,
        model_rounds_max=args.model_rounds_max,
        keep_alpha=args.keep_alpha,
        final_rounds=args.final_rounds,
        min_model_speedup=args.min_model_speedup,
        repetitions=args.repetitions,
        timer=args.timer,
        function=args.function,
        inputs=args.inputs,
        device=args.device,
        verify=not args.no_verify,
        seed=args.seed,
        progress=progress,
        dispatch=TuneOptions(
            order=order_of(args),
            model_path=None if args.cost_model is None else str(args.cost_model),
            devices=(args.device,) if args.device else (),
            runner=args.runner,
            jobs=args.jobs,
            repetitions=args.repetitions,
            verify=not args.no_verify,
            seed=args.seed,
            confirm_rounds=args.confirm_rounds,
            progress=progress,
        ),
    )
    result = tune_model(args.model_mlir, args.target, args.output_dir, options)
    print(result.text)
    return 0
