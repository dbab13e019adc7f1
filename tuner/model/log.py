"""`model_log.jsonl`: every model-level measurement and decision, appended as soon as it is known.

A re-run with the same output directory finds its earlier records here (`find`) and reuses them
instead of measuring again. Lines are written by the shared durable writer (`datasets.jsonl`).
"""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path
from typing import Any

from dispatchtune.datasets.jsonl import JsonlWriter
from dispatchtune.errors import DispatchTuneError

MODEL_SCHEMA = "dispatchtune.model/1"


class ModelLog:
    """The profile, model-level steps and final measurement of one tune-model output directory."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    warnings.warn(f"{path}:{number}: corrupt record skipped", stacklevel=2)
                    continue
                if not isinstance(record, dict) or record.get("schema") != MODEL_SCHEMA:
                    raise DispatchTuneError(
                        f"{path}:{number}: not a tune-model record (expected {MODEL_SCHEMA})"
                    )
                self.records.append(record)
        self._writer = JsonlWriter(path)

    def find(self, kind: str, **match: Any) -> dict[str, Any] | None:
        """The latest record of `kind` whose fields equal `match`."""
        for record in reversed(self.records):
            if record.get("kind") == kind and all(record.get(k) == v for k, v in match.items()):
                return record
        return None


    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write one record durably; return it."""
        record = {"schema": MODEL_SCHEMA, "kind": kind, "timestamp": time.time(), **fields}
        self._writer.append(json.dumps(record, sort_keys=True))
        self.records.append(record)
        return record
