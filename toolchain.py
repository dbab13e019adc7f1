"""Locating and running the IREE command-line tools shipped in the pinned pip wheels."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from dispatchtune.errors import DispatchTuneError, InputError

IREE_VERSION = "3.13.0"

logger = logging.getLogger(__name__)


_COMPILER_TOOLS = ("iree-compile", "iree-opt", "iree-link", "iree-lld")


@functools.cache
def tool_path(name: str) -> str:
    """Absolute path of an IREE tool's real executable (`iree-compile`, `iree-benchmark-module`, ...).

    The wheels' console scripts start a Python interpreter that then spawns the binary: measured
    here, 0.3-0.45 s per call against 0.01-0.02 s direct, on each of the ~5 tool runs per candidate,
    so the binary inside the installed wheel is used. Falls back to the console script next to the
    running interpreter (a virtual environment's pinned IREE wins over PATH), then to PATH.
    """
    try:
        if name in _COMPILER_TOOLS:
            from iree.compiler.tools.binaries import find_tool  # type: ignore[import-not-found]

            found = Path(find_tool(name))
        else:
            from iree._runtime import libs  # type: ignore[import-not-found]

            found = Path(libs.library_path) / name  # honours IREE_PY_RUNTIME (e.g. tracy)
        if found.is_file() and os.access(found, os.X_OK):
            return str(found.resolve())
    except (ImportError, OSError, ValueError):
        pass
    beside = Path(sys.executable).parent / name
    if beside.exists() and os.access(beside, os.X_OK):
        return str(beside)
    found_on_path = shutil.which(name)
    if found_on_path:
        return found_on_path
    raise DispatchTuneError(
        f"{name} not found: install iree-base-compiler/iree-base-runtime=={IREE_VERSION}"
    )


@functools.cache
def iree_compiler_version() -> str:
    """The IREE compiler version string reported by the installed wheel."""
    try:
        from iree.compiler.version import VERSION  # type: ignore[import-not-found]

        return str(VERSION)
    except ImportError:  # pragma: no cover - the wheel is a hard dependency
        return "unknown"


#: Disables constant evaluation: IREE 3.13 crashes in const-eval of some exports (BERT's
#: byte-pattern weights), and builds that fail are retried once with it (`retry_without_const_eval`).
NO_CONST_EVAL = "--iree-opt-const-eval=false"

_Result = TypeVar("_Result")


def retry_without_const_eval(
    flags: Sequence[str], build: Callable[[list[str]], _Result],
    failed: Callable[[_Result], bool], what: str,
) -> tuple[_Result, list[str]]:
    """`build(flags)`, once more with `NO_CONST_EVAL` added when it fails: the result and the
    flags that gave it. A retry that succeeds is logged as done, not as advice: nothing asks
    the user for the flag, but their own builds of the input need it too."""
    result = build(list(flags))
    if failed(result) and NO_CONST_EVAL not in flags:
        retry = build([*flags, NO_CONST_EVAL])
        if not failed(retry):
            logger.warning("%s fails to build with the target's flags (IREE's constant evaluation "
                           "crashes on it), so dispatchtune built it with %s; pass that flag too "
                           "when you compile it", what, NO_CONST_EVAL)
            return retry, [*flags, NO_CONST_EVAL]
    return result, list(flags)


def compiler_failure(returncode: int, stderr: str) -> str:
    """One line for a failed IREE tool run: its first `error:` line, or that it crashed."""
    if returncode < 0 or "Please report issues" in stderr:  # LLVM's crash handler says so
        return f"compiler crashed (exit {returncode})"
    return first_error_line(stderr)


def first_error_line(stderr: str) -> str:
    """The most informative line of an IREE tool's stderr (the first `error:` line)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:
        if "error:" in line:
            return line
    return lines[0] if lines else "no message"


def mlir_error_line(exc: Exception) -> str:
    """The diagnostic of an `ir.MLIRError` as one line.

    Its text is a generic header ("Unable to parse module assembly:") followed by the diagnostics;
    the first diagnostic is the one that says what is wrong.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else (lines[0] if lines else "parse error")


def path_arg(path: str | os.PathLike[str]) -> str:
    """A file operand for a tool's command line: absolute, so it can never be read as an option.

    `str(Path("./-o=x"))` is `-o=x`, which every IREE tool takes for "write the output to x".
    """
    return str(Path(path).absolute())


def _checked_args(name: str, args: Sequence[str | os.PathLike[str]]) -> list[str]:
    """`args` as strings: paths made absolute, option-looking names of existing files refused.

    A string that starts with '-' and also names a file here is ambiguous: the tool would take it as
    an option (`-o=victim.txt` overwrites victim.txt). Callers pass paths as `Path` objects or
    through `path_arg`; this refusal is the defence in depth for those that do not.
    """
    checked = []
    for arg in args:
        if isinstance(arg, os.PathLike):
            checked.append(path_arg(arg))
            continue
        if len(arg) > 1 and arg.startswith("-") and os.path.lexists(arg):
            raise InputError(
                f"refusing to pass file name {arg!r} to {name}: it starts with '-', so {name} would "
                "read it as an option; give it as an absolute path"
            )
        checked.append(arg)
    return checked


def run_tool(
    name: str,
    args: Sequence[str | os.PathLike[str]],
    *,
    input_text: str | None = None,
    timeout: float | None = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run an IREE tool and return the completed process (the caller checks the return code).

    Path objects in `args` are passed as absolute paths (`path_arg`).
    """
    command = [tool_path(name), *_checked_args(name, args)]
    try:
        return subprocess.run(
            command,
            input=input_text,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise DispatchTuneError(f"{name} timed out after {timeout:.0f} s") from exc


def compile_to_text(
    args: Sequence[str | os.PathLike[str]], *, input_text: str | None = None, what: str = "input"
) -> str:
    """Run `iree-compile ... -o -` and return stdout; raise a one-line error on failure."""
    proc = run_tool("iree-compile", [*args, "-o", "-"], input_text=input_text)
    if proc.returncode != 0:
        raise DispatchTuneError(f"iree-compile failed on {what}: {first_error_line(proc.stderr)}")
    return proc.stdout
