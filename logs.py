"""The package logger: library code logs under `dispatchtune.*`; the command line shows it on stderr.

Library modules use `logging.getLogger(__name__)` and never print. A program that embeds
dispatchtune configures logging as it likes; the CLI calls `configure` once, so what the library
says (which model orders the candidates, why a search stopped, what was skipped) reaches stderr
as plain lines.
"""

from __future__ import annotations

import logging
import sys

ROOT = "dispatchtune"


def configure(level: int = logging.INFO) -> None:
    """Show the package's log records on stderr as `dispatchtune: message` lines (idempotent)."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(_Formatter())
        logger.addHandler(handler)
    logger.propagate = False


def progress_mode(progress: bool | None) -> str:
    """How a long run shows its progress on stderr: "bar" (tqdm), "lines" (one line per step)
    or "off". `progress` None: a bar on a terminal, else lines, since a bar's carriage returns
    turn a log file or a pipe into one unreadable line; True: a bar; False: nothing."""
    if progress is None:
        return "bar" if sys.stderr.isatty() else "lines"
    return "bar" if progress else "off"


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time (tests and wrappers replace it)."""

    @property  # type: ignore[override]
    def stream(self) -> object:
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        pass


class _Formatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prefix = "dispatchtune: warning: " if record.levelno >= logging.WARNING else ""
        return prefix + record.getMessage()
