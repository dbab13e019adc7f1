"""Running IREE tools for the measure layer: timeouts, crash classification, clean interruption.

Every compile and benchmark runs as a child process in its own session, so a compiler crash, a
hung benchmark or a terminal Ctrl-C (which signals the foreground process group) never takes a
child's failure for a candidate's: the loop decides when children die and discards their results.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from dispatchtune.toolchain import first_error_line

_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


@dataclass(frozen=True)
class ProcessResult:
    """Outcome of one tool run. `status`: ok | failed | timeout | crashed."""

    status: str
    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def classify(returncode: int, stderr: str) -> tuple[str, str]:
    """Map an exit status to (status, reason).

    Tools exit 1 on an ordinary error; a negative status is a signal, and other codes (e.g. 248
    from LLVM's crash handler, 134 from abort) are crashes too.
    """
    if returncode == 0:
        return "ok", ""
    if returncode < 0:
        return "crashed", f"killed by {_signal_name(-returncode)}: {first_error_line(stderr)}"
    if returncode == 1:
        return "failed", first_error_line(stderr)
    return "crashed", f"exit status {returncode}: {first_error_line(stderr)}"


def run_process(command: list[str], timeout: float) -> ProcessResult:
    """Run a command with a wall-clock timeout; never raises for the child's failures."""
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        return ProcessResult("failed", None, "", str(exc), 0.0, f"cannot start {command[0]}: {exc}")
    with _LIVE_LOCK:
        _LIVE.add(proc)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        stdout, stderr = proc.communicate()
        elapsed = time.perf_counter() - start
        return ProcessResult(
            "timeout", None, stdout, stderr, elapsed, f"timed out after {timeout:g} s"
        )
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(proc)
    elapsed = time.perf_counter() - start
    status, reason = classify(proc.returncode, stderr)
    return ProcessResult(status, proc.returncode, stdout, stderr, elapsed, reason)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_children() -> None:
    """Kill every tool this module started that is still running (used on interruption)."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    for proc in live:
        _kill(proc)
