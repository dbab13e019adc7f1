"""The `dispatchtune` and `train-costmodel` command lines: one module per command.

Each command module has `register(subparsers)` and a `run(args)` handler; shared option groups are
in `options.py`. Every user-facing error, from argparse or from the library (`DispatchTuneError`),
is one line on stderr and exit status 2, never a traceback; an I/O failure during the run (disk
full, a file removed or made read-only under the run) is one line naming the path and exit status 1.
"""

from __future__ import annotations

import argparse
import os
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
from dispatchtune.cli.stderr import one_line_warnings
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


def os_error_of(exc: BaseException) -> OSError | None:
    """The OSError behind `exc`: itself, or one it was raised from (libraries wrap them)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def describe_os_error(error: OSError, args: argparse.Namespace) -> str:
    """One line: the path and the system's reason (`No space left on device`)."""
    reason = error.strerror or str(error) or type(error).__name__
    if error.filename is not None:
        return f"{error.filename}: {reason}"
    # Writes to an open file carry no name: the output location is the best pointer there is.
    where = getattr(args, "output_dir", None) or getattr(args, "output", None)
    return f"{reason} (writing to {where})" if where is not None else reason


def run_handler(handler: Handler, args: argparse.Namespace, prog: str = "dispatchtune") -> int:
    """Run a command handler, turning every expected failure into one stderr line.

    Exit status 2 for bad input (`DispatchTuneError`, checked before work starts), 1 for an I/O
    failure during the run, 130 for Ctrl-C; a closed stdout pipe ends the command quietly.
    """
    try:
        # Every command's warnings (a corrupt log line, a model for another target) are one
        # line each, whichever command raised them.
        with one_line_warnings(prog):
            return handler(args)
    except DispatchTuneError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (results so far are saved)", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `dispatchtune rank ... | head`: the reader is gone; nothing left to say to it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as exc:
        error = os_error_of(exc)
        if error is None:
            raise
        print(f"{prog}: error: {describe_os_error(error, args)}", file=sys.stderr)
        return 1


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
