"""Candidate lists as JSON lines (`candidates --json`, `rank --json`): one schema, one writer."""

from __future__ import annotations

import json
import math
from typing import Any, TextIO

import pandas as pd


def write_json_lines(cset: Any, ranked: pd.DataFrame, problem_key: str, out: TextIO) -> None:
    """One JSON object per candidate in benchmark order (`candidates --json` schema + score)."""
    import numpy as np

    knob_columns = [c for c in ranked.columns if c not in ("pipeline", "score", "candidate_id")]
    # Column lists zipped into dicts: native Python values, several times faster than to_dict.
    values = [ranked[c].tolist() for c in knob_columns]
    knobs = [dict(zip(knob_columns, row, strict=True)) for row in zip(*values, strict=True)]
    infos = cset.compilation_infos(ranked["candidate_id"].to_numpy())
    scores = ranked["score"].to_numpy(dtype=np.float64).tolist()
    ids = ranked["candidate_id"].to_numpy().tolist()
    pipelines = ranked["pipeline"].astype(str).tolist()
    encode = json.JSONEncoder().encode
    out.writelines(
        encode({"rank": position, "score": scores[position] if math.isfinite(scores[position])
                else None, "problem_key": problem_key, "candidate_id": ids[position],
                "pipeline": pipelines[position], "knobs": knobs[position],
                "compilation_info": infos[position]}) + "\n"
        for position in range(len(ranked))
    )
