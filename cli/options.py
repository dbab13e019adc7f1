"""Option groups shared by several commands, each written once.

Defaults of the tuning flags are read from `TuneOptions` / `ModelTuneOptions`, so the CLI and the
Python API cannot disagree. Every numeric flag checks its range while parsing (`add_number`), and
every parse error is one line (`OneLineParser`), exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dispatchtune.errors import InputError
from dispatchtune.tuner.loop import TuneOptions
from dispatchtune.tuner.model import ModelTuneOptions
from dispatchtune.tuner.options import TUNE_ORDERS

#: Defaults of the dispatch loop and of whole-model tuning (the dataclasses are the one source).
TUNE_DEFAULTS = TuneOptions()
MODEL_TUNE_DEFAULTS = ModelTuneOptions()


class UsageError(InputError):
    """A command line argparse rejected (unknown flag, missing argument, value out of range)."""


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line: raised, so `main` prints them and returns 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see {self.prog} --help)")


# ---- numeric ranges ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Range:
    """An interval of valid values; `None` is unbounded on that side."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.high is None:
            return f"> {self.low:g}" if self.low_open else f"at least {self.low:g}"
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        return f"in {left}{self.low:g}, {self.high:g}{right}"


AT_LEAST_0 = Range(0)
AT_LEAST_1 = Range(1)
POSITIVE = Range(0, low_open=True)
FRACTION = Range(0, 1, low_open=True, high_open=True)  # thresholds: (0, 1)
SHARE = Range(0, 1, low_open=True)  # coverage: (0, 1]


class _InRange(argparse.Action):
    """Store a number after checking it against `valid` (a parse error otherwise)."""

    def __init__(self, option_strings: Sequence[str], dest: str, valid: Range, **kwargs: Any):
        super().__init__(option_strings, dest, **kwargs)
        self.valid = valid

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if values not in self.valid:
            name = max(self.option_strings, key=len)  # the long name, also for `-j -5`
            parser.error(f"{name} must be {self.valid}, got {values}")
        setattr(namespace, self.dest, values)


def add_number(parser: argparse.ArgumentParser, *flags: str, kind: type[int] | type[float],
               valid: Range, **kwargs: Any) -> None:
    """Add a numeric flag whose value must lie in `valid`."""
    parser.add_argument(*flags, type=kind, action=_InRange, valid=valid, **kwargs)


# ---- groups ------------------------------------------------------------------------------------
def add_target(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """`--target NAME` (default host unless `required`)."""
    if required:
        parser.add_argument("--target", required=True,
                            help="target name: host, llvm-cpu:<cpu>, gfx942, mi300x, gfx1100, sm_80 "
                            "(see `dispatchtune targets`)")
    else:
        parser.add_argument("--target", default="host",
                            help="target name (default %(default)s; see `dispatchtune targets`)")


def add_seed(parser: argparse.ArgumentParser, default: int, help: str) -> None:
    add_number(parser, "--seed", kind=int, valid=AT_LEAST_0, default=default, help=help)


class _DeprecatedModelFlag(argparse.Action):
    """`--model FILE`, the old name of `--cost-model FILE`: still accepted, with a note."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: note: --model FILE is now --cost-model FILE", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_cost_model(parser: argparse.ArgumentParser, orders: Sequence[str], order_help: str) -> None:
    """`--order` and `--cost-model FILE` (a model file implies `--order model`)."""
    parser.add_argument("--order", choices=tuple(orders), default="heuristic", help=order_help)
    parser.add_argument(
        "--cost-model", type=Path, metavar="FILE", dest="cost_model",
        help="learned cost-model file (from train-costmodel) for --order model/online; "
        "alone it implies --order model (default: the target's installed model)",
    )
    # Kept so that older command lines still run; hidden from --help.
    parser.add_argument("--model", type=Path, dest="cost_model", action=_DeprecatedModelFlag,
                        help=argparse.SUPPRESS)


def order_of(args: argparse.Namespace) -> str:
    """The order the flags ask for: a cost-model file alone means `--order model`."""
    return "model" if args.cost_model is not None and args.order == "heuristic" else str(args.order)


def progress_of(args: argparse.Namespace) -> bool | None:
    """`--no-progress` -> off; otherwise None (a bar on a terminal, else one line per step)."""
    return False if args.no_progress else None


def add_tuning_common(parser: argparse.ArgumentParser, defaults: TuneOptions | ModelTuneOptions,
                      budget_help: str) -> None:
    """Flags of both tuning commands: budget, output, order and cost model, workers, checks.

    `defaults` is the command's options dataclass (budget, repetitions and seed differ in meaning
    between the two commands); the dispatch-loop flags default to `TuneOptions`.
    """
    add_number(parser, "--budget", kind=int, valid=AT_LEAST_1, default=defaults.budget,
               help=f"{budget_help} (default %(default)s)")
    parser.add_argument("--output-dir", "-o", type=Path, required=True,
                        help="output directory (re-running with it resumes)")
    add_cost_model(
        parser, TUNE_ORDERS,
        "candidate order: heuristic (default), model (learned: --cost-model FILE, else the "
        "target's installed model), online (Optuna search from the model's order that refits on "
        "this run's measurements), random",
    )
    add_number(parser, "--jobs", "-j", kind=int, valid=AT_LEAST_0, default=TUNE_DEFAULTS.jobs,
               help="parallel compile workers (default %(default)s: one per core)")
    add_number(parser, "--repetitions", kind=int, valid=AT_LEAST_1, default=defaults.repetitions,
               help="benchmark repetitions (default %(default)s)")
    add_number(parser, "--confirm-rounds", kind=int, valid=AT_LEAST_0,
               default=TUNE_DEFAULTS.confirm_rounds,
               help="rounds re-measuring the best candidates interleaved with the default "
               "(default %(default)s)")
    parser.add_argument("--no-verify", action="store_true",
                        help="do not compare outputs with the default build")
    add_seed(parser, defaults.seed, "seed of the random order and of the inputs (default %(default)s)")
    parser.add_argument("--no-progress", action="store_true",
                        help="one line per step instead of a progress bar (default: bar on a terminal)")
