"""`dispatchtune tune FILE -o DIR`: order, compile, benchmark and verify one file's dispatches."""

from __future__ import annotations

import argparse
import logging
from typing import Any

from dispatchtune.cli.options import (
    AT_LEAST_0,
    AT_LEAST_1,
    POSITIVE,
    TUNE_DEFAULTS,
    absolute_path,
    add_heuristic_filters_flag,
    add_number,
    add_runner,
    add_target,
    add_tuning_common,
    add_waves_per_eu_flag,
    order_of,
    output_dir,
    progress_of,
    shown,
    storage_url,
)
from dispatchtune.errors import InputError

logger = logging.getLogger(__name__)

#: What a run writes in its output directory (checked to be writable files before it starts).
OUTPUT_FILES = ("results.jsonl", "tuning_spec.mlir", "summary.md", "progress.png")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "tune",
        help="compile and benchmark candidates of every dispatch; write the best tuning spec",
        description=(
            "Tune the dispatches of FILE (a model/function .mlir, a dumped dispatch benchmark or a "
            "directory of them): "
            "order the Z3-enumerated candidates, compile them in parallel, benchmark them against "
            "the compiler default, verify their outputs, and write DIR/tuning_spec.mlir, "
            "DIR/results.jsonl and DIR/summary.md. Re-running with the same DIR resumes."
        ),
    )
    defaults = TUNE_DEFAULTS
    parser.add_argument("file", type=absolute_path,
                        help="model/function .mlir, *_benchmark.mlir, or a directory of them")
    add_target(parser)
    add_tuning_common(parser, defaults, "candidates to benchmark per dispatch")
    add_heuristic_filters_flag(parser)
    add_waves_per_eu_flag(parser)
    parser.add_argument(
        "--storage", metavar="URL",
        help="Optuna storage of the online search (--order online only; default: sqlite study.db "
        "in the output dir); workers given the same URL share one study and never measure a "
        "candidate twice. postgresql://user@host/db needs the postgres extra "
        "(pip install 'dispatchtune[postgres]')",
    )
    add_number(parser, "--time-limit", kind=float, valid=AT_LEAST_0, default=defaults.time_limit_s,
               metavar="S", help="online search: stop a dispatch after S seconds (default %(default)s: "
               "no limit)")
    add_number(parser, "--stop-patience", kind=int, valid=AT_LEAST_0, default=defaults.stop_patience,
               metavar="N", help="online search: stop when the last N results did not beat the best "
               "by --stop-margin (default %(default)s: off)")
    add_number(parser, "--stop-margin", kind=float, valid=AT_LEAST_0, default=defaults.stop_margin,
               help="improvement that counts for --stop-patience (default %(default)s)")
    parser.add_argument(
        "--devices", nargs="+", action="extend", default=[], metavar="DEVICE",
        help="devices, one benchmark stream each (space- or comma-separated; default: the "
        "target's, local-sync for host): an IREE URI (hip://0) or RUNNER/URI on another machine "
        "(ssh://gpu1/hip://0 ssh://gpu2/cuda://0)",
    )
    add_runner(parser, defaults.runner)
    add_number(parser, "--baseline-every", kind=int, valid=AT_LEAST_1, default=defaults.baseline_every,
               help="re-measure the compiler default after this many benchmarks per device "
               "(default %(default)s)")
    add_number(parser, "--compile-timeout", kind=float, valid=POSITIVE,
               default=defaults.compile_timeout_s, help="seconds per compile (default %(default)s)")
    add_number(parser, "--benchmark-timeout", kind=float, valid=POSITIVE,
               default=defaults.benchmark_timeout_s,
               help="seconds per benchmark run (default %(default)s)")
    add_number(parser, "--min-speedup", kind=float, valid=POSITIVE, default=defaults.min_speedup,
               help="speedup over the default a candidate needs to enter the spec (default "
               "%(default)s: above the ~2%% run-to-run noise of local-sync)")
    add_number(parser, "--confirm-top", kind=int, valid=AT_LEAST_0, default=defaults.confirm_top,
               help="re-measure this many best candidates at the end, interleaved with the "
               "default (default %(default)s; 0 = off)")
    parser.add_argument(
        "--compile-only", action="store_true",
        help="build and check candidates without running them (e.g. a GPU target on a machine "
        "without that GPU); the budget counts candidates built",
    )
    parser.add_argument(
        "--estimator", choices=("min", "median"), default=defaults.estimator,
        help="time of a measurement from its repetitions (default %(default)s: outside load only "
        "slows runs down)",
    )
    parser.add_argument(
        "--retry-failed", action="store_true",
        help="try again every candidate that failed in an earlier run on this output directory "
        "(without it, only failures that may be transient: timeouts, crashes, a full disk; at "
        "most 3 tries each)",
    )
    add_number(parser, "--lease", kind=int, valid=AT_LEAST_1, default=defaults.lease_s, metavar="S",
               help="online search: a worker's claim on a candidate is taken back after S seconds "
               "without its heartbeat (default %(default)s)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dispatchtune.tuner.loop import TuneOptions, tune

    if not args.file.exists():
        raise InputError(f"no such file: {shown(args.file)}")
    order = order_of(args)
    storage = None if args.storage is None else storage_url(args.storage, order)
    output_dir(args.output_dir, "--output-dir", OUTPUT_FILES)
    options = TuneOptions(
        budget=args.budget,
        order=order,
        model_path=None if args.cost_model is None else str(args.cost_model),
        storage=storage,
        time_limit_s=args.time_limit,
        stop_patience=args.stop_patience,
        stop_margin=args.stop_margin,
        devices=tuple(d.strip() for entry in args.devices for d in entry.split(",") if d.strip()),
        runner=args.runner,
        jobs=args.jobs,
        repetitions=args.repetitions,
        baseline_every=args.baseline_every,
        compile_timeout_s=args.compile_timeout,
        benchmark_timeout_s=args.benchmark_timeout,
        verify=not args.no_verify,
        seed=args.seed,
        min_speedup=args.min_speedup,
        compile_only=args.compile_only,
        estimator=args.estimator,
        confirm_top=args.confirm_top,
        confirm_rounds=args.confirm_rounds,
        progress=progress_of(args),
        retry_failed=args.retry_failed,
        lease_s=args.lease,
        heuristic_filters=args.heuristic_filters,
        waves_per_eu=args.waves_per_eu or (),
    )
    result = tune(args.file, args.target, args.output_dir, options)
    if result.other_dispatches:
        # Said by the command, not the loop: tune-model tunes its dispatches one by one into
        # one directory on purpose.
        logger.warning("%s holds results of %d dispatch(es) that %s does not have; they stay in "
                       "results.jsonl, but tuning_spec.mlir is rewritten for this input only",
                       args.output_dir, len(result.other_dispatches), args.file)
    print(result.text)
    return 0
