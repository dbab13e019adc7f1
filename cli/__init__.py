"""The `dispatchtune` and `train-costmodel` command lines: one module per command.

Each command module has `register(subparsers)` and a `run(args)` handler; shared option groups are
in `options.py`. Every user-facing error, from argparse or from the library (`DispatchTuneError`),
is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from dispatchtune import logs
from dispatchtune.cli import (
    candidates,
    evaluate,
    inspect_ops,
    rank,
    targets,
    train_costmodel,
    tune,
    tune_model,
)
from dispatchtune.cli.options import OneLineParser, UsageError
from dispatchtune.errors import DispatchTuneError

__all__ = ["build_parser", "main", "run_handler", "train_costmodel_main"]

Handler = Callable[[argparse.Namespace], int]

# Subcommands of `dispatchtune`, in help order.
_COMMANDS = (targets, inspect_ops, candidates, rank, tune, tune_model, evaluate)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="dispatchtune",
        description="ML-guided tuning of IREE dispatches: enumerate, rank, compile, benchmark.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in _COMMANDS:
        command.register(subparsers)
    return parser


def run_handler(handler: Handler, args: argparse.Namespace, prog: str = "dispatchtune") -> int:
    """Run a command handler, turning user-facing errors into one stderr line and exit code 2."""
    try:
        return handler(args)
    except DispatchTuneError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (results so far are saved)", file=sys.stderr)
        return 130


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace | None:
    """The parsed arguments, or None after printing argparse's complaint as one line."""
    try:
        return parser.parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `dispatchtune` console script and of `python -m dispatchtune`."""
    logs.configure()
    args = _parse(build_parser(), argv)
    return 2 if args is None else run_handler(args.handler, args)


def train_costmodel_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `train-costmodel` console script."""
    logs.configure()
    args = _parse(train_costmodel.build_parser(), argv)
    return 2 if args is None else run_handler(train_costmodel.run, args, train_costmodel.PROG)
