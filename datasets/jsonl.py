"""The one durable JSON-lines writer: every log dispatchtune appends to goes through it.

A line is written, flushed and fsynced before `append` returns, so a run killed at any moment
loses at most the line being written. Such a kill can leave a torn last line without its newline;
the writer starts the file on a fresh line when it opens it, so the next record is never glued
onto the torn one (readers then skip the torn line alone).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


class JsonlWriter:
    """Append-only writer of one JSON-lines file; safe to share between threads."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        with self._lock:
            if self._torn():
                self._write("\n")

    def _torn(self) -> bool:
        """Whether the file ends in a line without its newline (a killed write)."""
        if not self.path.exists() or self.path.stat().st_size == 0:
            return False
        with self.path.open("rb") as handle:
            handle.seek(-1, os.SEEK_END)
            return handle.read(1) != b"\n"

    def _write(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())

    def append(self, line: str) -> None:
        """Write one JSON document (already serialised, on one line) and make it durable."""
        if "\n" in line:
            raise ValueError("a JSON-lines record must fit on one line")
        with self._lock:
            self._write(line + "\n")
