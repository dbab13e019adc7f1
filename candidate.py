"""`Candidate`: one configuration of one problem, as search produces it and measure consumes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Candidate:
    """One configuration to try: its row in the enumeration table and its `compilation_info`."""

    candidate_id: int
    compilation_info: str
    pipeline: str = ""
    knobs: dict[str, Any] = field(default_factory=dict)
    rank: int = -1
    score: float | None = None
