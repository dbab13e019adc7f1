"""The `dispatchtune` and `train-costmodel` command lines.

Each subpackage registers its own subcommands (`<pkg>/commands.py: register(subparsers)`), so a
command lives next to the code it drives. Every user-facing error is a `DispatchTuneError`: it is
printed as one line on stderr and the process exits with status 2, never with a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from dispatchtune.errors import DispatchTuneError

# Packages whose `commands.register(subparsers)` adds subcommands, in help order.
_COMMAND_MODULES = (
    "dispatchtune.tuner.commands",
    "dispatchtune.search.commands",
    "dispatchtune.costmodel.commands",
    "dispatchtune.datasets.commands",
    "dispatchtune.benchmarks.commands",
)

Handler = Callable[[argparse.Namespace], int]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dispatchtune",
        description="ML-guided tuning of IREE dispatches: enumerate, rank, compile, benchmark.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        module.register(subparsers)
    return parser


def run_handler(handler: Handler, args: argparse.Namespace) -> int:
    """Run a command handler, turning user-facing errors into one stderr line and exit code 2."""
    try:
        return handler(args)
    except DispatchTuneError as exc:
        print(f"dispatchtune: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dispatchtune: interrupted (results so far are saved)", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run_handler(args.handler, args)


def train_costmodel_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `train-costmodel` console script."""
    try:
        module = importlib.import_module("dispatchtune.costmodel.train")
    except ModuleNotFoundError:
        print("train-costmodel: not implemented yet", file=sys.stderr)
        return 2
    parser = module.build_parser()
    args = parser.parse_args(argv)
    return run_handler(module.run, args)


if __name__ == "__main__":
    sys.exit(main())
