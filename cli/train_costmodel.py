"""`train-costmodel INPUTS... --model KIND -o FILE`: train, cross-validate and save a cost model.

The training itself is `dispatchtune.costmodel.train`; this module reads the command line, prints
the report and writes the model file, its report and plot.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dispatchtune.cli.options import (
    AT_LEAST_1,
    FRACTION,
    OneLineParser,
    Range,
    absolute_path,
    add_number,
    add_seed,
    output_file,
    path_or_dataset,
)
from dispatchtune.costmodel.learned import MODELS
from dispatchtune.errors import DispatchTuneError

if TYPE_CHECKING:
    from dispatchtune.costmodel.learned import LearnedModel

PROG = "train-costmodel"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Train a learned cost model on measured spaces, cross-validate it with whole "
        "problems held out, and save it (safe JSON model file) with a report.",
    )
    parser.add_argument("inputs", nargs="+", metavar="LOGS_OR_DATASETS", type=path_or_dataset,
                        help="results.jsonl(.gz) files, tune output dirs (or dirs of them), "
                        "Kernel Tuner caches (.json/.json.gz), shipped:NAME (the shipped CPU "
                        "datasets: cpu_host, AVX-512; cpu_avx2)")
    # The model *kind*; the file written is --output.
    parser.add_argument("--model", dest="model_kind", metavar="KIND", choices=tuple(MODELS),
                        default="gbm", help=f"one of {', '.join(MODELS)} (default %(default)s)")
    parser.add_argument("--output", "-o", type=absolute_path, required=True,
                        help="cost-model file to write (JSON); the report goes next to it")
    # 0 (the default) is leave one problem out; one group would hold every problem out at once.
    add_number(parser, "--folds", kind=int, valid=Range(2), default=0,
               help="held-out groups of whole problems (default: leave one problem out)")
    add_number(parser, "--threshold", kind=float, valid=FRACTION, default=0.05,
               help="near-optimal threshold (default %(default)s = within 5%% of the best)")
    parser.add_argument("--time", choices=("min", "median"), default="min",
                        help="time of a logged candidate from its repetitions (default %(default)s, "
                        "the tuning loop's estimator)")
    add_seed(parser, 0, "model seed and tie-break seed (default %(default)s)")
    add_number(parser, "--n-jobs", kind=int, valid=AT_LEAST_1, default=1,
               help="threads for training (default %(default)s; at most 2 on a shared machine)")
    parser.add_argument("--no-cv", action="store_true", help="train only, skip cross-validation")
    parser.add_argument("--no-plot", action="store_true", help="do not write the PNG plot")
    return parser


def _save_or_rescue(model: LearnedModel, output: Path, metadata: dict[str, Any]) -> None:
    """Save the trained model to `output`; if that fails now (disk full, permissions changed
    during training), save it in the temporary directory and say where, so the training is not lost."""
    from dispatchtune.costmodel.modelfile import save_model

    try:
        save_model(model, output, metadata)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        fd, rescue = tempfile.mkstemp(prefix=f"{output.stem}-", suffix=".json")
        os.close(fd)
        try:
            save_model(model, rescue, metadata)
        except OSError:
            Path(rescue).unlink(missing_ok=True)
            raise DispatchTuneError(f"cannot write --output {output}: {reason}; the model is lost") from None
        raise DispatchTuneError(f"cannot write --output {output}: {reason}; the model was saved to "
                                f"{rescue} instead") from None


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from dispatchtune.costmodel.learned import labels_from_times, make_model
    from dispatchtune.costmodel.train import (
        cross_validate,
        load_training_data,
        report_markdown,
        report_paths,
        report_plot,
        summarise,
    )

    output: Path = args.output
    # Checked before training: an unwritable output would otherwise lose minutes of work.
    output_file(output, "--output", "model.json", report_paths(output))
    progress = sys.stderr.isatty()
    data = load_training_data(args.inputs, f"{args.time}_ms", progress)
    print(f"training data: {len(data.times)} rows, {len(data.problems)} problems", file=sys.stderr)

    scheme = ("leave one problem out" if args.folds <= 0 or args.folds >= len(data.problems)
              else f"{args.folds} folds of whole problems")
    if len(set(data.workloads.values())) < len(data.workloads):
        scheme += ", a workload measured on several devices held out on all of them"
    cv = pd.DataFrame()
    if not args.no_cv and len(data.problems) >= 2:
        cv = cross_validate(data, args.model_kind, args.folds, args.threshold, args.seed, args.n_jobs,
                            progress)
    elif not args.no_cv:
        print("warning: one problem only: cross-validation needs at least 2; skipped",
              file=sys.stderr)
    summary = summarise(cv)

    model = make_model(args.model_kind, seed=args.seed, n_jobs=args.n_jobs)
    start = time.perf_counter()
    model.fit(data.features, labels_from_times(data.times), data.groups)
    train_seconds = time.perf_counter() - start

    command = f"{PROG} " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    metadata = {
        "training_data": data.summary(),
        "cross_validation": {
            "scheme": scheme if not cv.empty else "none",
            "threshold": args.threshold,
            **summary,
            "per_problem": cv.to_dict(orient="records"),
        },
        "training_seconds": round(train_seconds, 3),
        "time_estimator": args.time,
        "command": command,
    }
    _save_or_rescue(model, output, metadata)
    size = output.stat().st_size
    importances = model.feature_importances()
    text = report_markdown(args.model_kind, data, cv, summary, importances, train_seconds, size,
                           args.threshold, command, scheme)
    report, plot = report_paths(output)
    report.write_text(text, encoding="utf-8")
    print(text)
    print(f"model written to {output} ({size / 1e6:.2f} MB); report {report}", file=sys.stderr)
    if not args.no_plot:
        report_plot(cv, importances, args.model_kind, args.threshold, plot)
        print(f"plot written to {plot}", file=sys.stderr)
    return 0
