"""Option groups shared by several commands, each written once.

Defaults of the tuning flags are read from `TuneOptions` / `ModelTuneOptions`, so the CLI and the
Python API cannot disagree. Every numeric flag checks its range while parsing (`add_number`), every
path is made absolute while parsing (`absolute_path`: no file name can reach a tool as an option),
output locations are checked before any work starts (`output_dir`, `output_file`), and every parse
error is one line (`OneLineParser`), exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from dispatchtune.errors import InputError
from dispatchtune.search import HEURISTIC_FILTERS
from dispatchtune.targets import Target
from dispatchtune.tuner.model.options import ModelTuneOptions
from dispatchtune.tuner.options import TUNE_ORDERS, TuneOptions, check_waves_per_eu

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


# ---- paths -------------------------------------------------------------------------------------
def absolute_path(text: str) -> Path:
    """argparse type of every file and directory argument: the path made absolute.

    `Path("./-o=x")` prints as `-o=x`, which IREE's tools read as "write to x"; an absolute path
    can only be a file (issue #18).
    """
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    return Path(text).absolute()


def path_or_dataset(text: str) -> str:
    """A path made absolute, or a `shipped:NAME` dataset kept as it is."""
    from dispatchtune.datasets.shipped import PREFIX

    return text if text.startswith(PREFIX) else str(absolute_path(text))


def shown(path: Path) -> str:
    """A path as the user typed it, for messages: relative to the working directory when inside it."""
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return str(path)


def _probe_writable(directory: Path, what: str) -> None:
    """Create, fill and delete a small file in `directory`: a read-only, full or missing location
    fails here, before any work, instead of after it."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".dispatchtune-probe-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        raise InputError(f"{what} {directory} is not writable: {exc.strerror or exc}") from None


def output_dir(path: Path, flag: str, files: Sequence[str] = ()) -> Path:
    """Create the output directory `path` if needed and check that the run can write there.

    `files` are the names (relative to `path`) the command writes; one that is a directory is
    refused now rather than failing after the work.
    """
    if path.exists() and not path.is_dir():
        raise InputError(f"{flag} {path} is a file, not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create {flag} {path}: {exc.strerror or exc}") from None
    for name in files:
        if (path / name).is_dir():
            raise InputError(f"{path / name} is a directory; the run writes a file there")
    _probe_writable(path, flag)
    return path


def output_file(path: Path, flag: str, example: str, companions: Sequence[Path] = ()) -> Path:
    """Check, before the work, that the file `path` (and `companions` beside it) can be written.

    `example` is a file name of the kind `flag` writes (`ranked.csv`), for the message when
    `path` is a directory.
    """
    for target in (path, *companions):
        if target.is_dir():
            raise InputError(f"{flag} {target} is a directory; give a file path such as {example}")
    if path.parent.exists() and not path.parent.is_dir():
        raise InputError(f"{flag} {path}: {path.parent} is a file, not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the directory of {flag} {path}: {exc.strerror or exc}") from None
    _probe_writable(path.parent, f"the directory of {flag}")
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError(f"{flag} {path} is not writable")
    return path


# ---- study storage -----------------------------------------------------------------------------
def storage_url(url: str, order: str) -> str:
    """The `--storage` URL to open: checked against the order, then as `open_storage` maps it."""
    from dispatchtune.search.optuna_search import resolve_storage_url

    if order != "online":
        raise InputError(f"--storage holds the online search's study; it needs --order online, "
                         f"not --order {order}")
    return resolve_storage_url(url)


# ---- groups ------------------------------------------------------------------------------------
def add_target(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """`--target NAME` (default host unless `required`)."""
    if required:
        parser.add_argument("--target", required=True,
                            help="target name: host, llvm-cpu:<cpu>, gfx942, mi300x, gfx1100, sm_80, "
                            "or any GPU IREE knows: gfx<N>, rocm:<product>, sm_<N> "
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
    parser.add_argument(
        "--order", choices=tuple(orders), default=None,
        help=f"{order_help}; default: model on a target that ships a model (the CPU: trained on "
        "measured AVX-512 and AVX2 spaces; gfx942 and the other CDNA GPUs: a prior learned from "
        "expert-tuned specs), else heuristic",
    )
    parser.add_argument(
        "--cost-model", type=absolute_path, metavar="FILE", dest="cost_model",
        help="learned cost-model file (from train-costmodel) for --order model/online; "
        "alone it implies --order model (default: the target's installed model)",
    )
    # Kept so that older command lines still run; hidden from --help.
    parser.add_argument("--model", type=absolute_path, dest="cost_model", action=_DeprecatedModelFlag,
                        help=argparse.SUPPRESS)


def order_of(args: argparse.Namespace) -> str:
    """The order the flags ask for (without `--order`: `costmodel.defaults.default_order`)."""
    from dispatchtune.costmodel.defaults import default_order

    return str(args.order) if args.order is not None else default_order(args.target, args.cost_model)


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
    parser.add_argument("--output-dir", "-o", type=absolute_path, required=True,
                        help="output directory (re-running with it resumes)")
    add_cost_model(
        parser, TUNE_ORDERS,
        "candidate order: heuristic, model (learned: --cost-model FILE, else the "
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


# ---- the GPU space ---------------------------------------------------------------------------
def add_heuristic_filters_flag(parser: argparse.ArgumentParser) -> None:
    """`--heuristic-filters` / `--no-heuristic-filters`: IREE's narrower GPU space or the whole
    valid one, the default (`candidates`, `rank`, `tune`)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--heuristic-filters", dest="heuristic_filters", action="store_true",
        help="GPU: keep the constraints IREE marks as heuristic filters (threads <= the larger "
        "workgroup tile, K tile a multiple of the intrinsic's M): IREE's own, narrower space. "
        "By default they are dropped and IREE's validity constraints kept: on 14 GEMMs "
        "measured on an MI300X the fastest candidate is outside the filters in 13 "
        "(docs/gpu_order.md, part 35), at the price of more candidates that fail to compile "
        "(tune records them and moves on; they cost no budget)",
    )
    group.add_argument(
        "--no-heuristic-filters", dest="heuristic_filters", action="store_false",
        help="GPU: the whole valid space, without IREE's heuristic filters (the default)",
    )
    parser.set_defaults(heuristic_filters=HEURISTIC_FILTERS)


def _waves_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(v) for v in text.split(",")))
    except ValueError:
        values = ()
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return values


def add_waves_per_eu_flag(parser: argparse.ArgumentParser) -> None:
    """`--waves-per-eu 0,1,2,4`: the AMD occupancy hint as a knob (`candidates`, `rank`, `tune`)."""
    parser.add_argument(
        "--waves-per-eu", type=_waves_list, default=None, metavar="N[,N...]",
        help="AMD GPUs: also enumerate LLVM's amdgpu-waves-per-eu hint (translation_info "
        "llvm_func_attrs; 0 = compiler default) over these values; multiplies the space by "
        "their count (expert specs use 0, 1, 2 and 4)",
    )


def extra_knobs(args: argparse.Namespace, target: Target) -> dict[str, tuple[int, ...]] | None:
    """The extra GPU knobs the command line asks for (None: IREE's space as is); a flag that does
    not apply to `target` is refused by its name."""
    waves = getattr(args, "waves_per_eu", None)
    check_waves_per_eu(waves or (), target)
    return {"waves_per_eu": waves} if waves else None


def add_runner(parser: argparse.ArgumentParser, default: str) -> None:
    """`--runner SPEC`: where the bare device URIs are (tune and tune-model)."""
    parser.add_argument(
        "--runner", default=default, metavar="SPEC",
        help="benchmark the bare device URIs on another machine: ssh://[user@]host[:port] or "
        "'cmd:PREFIX' (a command that runs its arguments there, e.g. 'cmd:docker exec -i box'); "
        "it needs only `pip install iree-base-runtime` of our version (docs/remote.md)",
    )
