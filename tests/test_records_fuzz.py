"""Fuzzing results logs: thousands of mutated `results.jsonl` lines read back in this process.

A log is untrusted input (`train-costmodel` and `evaluate` read other people's logs, `tune` resumes
from whatever the directory holds). The only allowed outcomes of reading one are records (a
mutated line that is still a well-typed record, or skipped with a `CorruptRecordWarning` naming
file:line) or a one-line `DispatchTuneError` (a foreign schema). Mutations: byte flips,
truncations, inserted tokens, deleted fields, fields replaced by hostile values of every type,
and knobs/problem dicts broken inside. Each mutated log also goes through `records_frame` and the
measured-space loader that training and evaluation use; a few go through the CLI.

DISPATCHTUNE_FUZZ_CASES sets the number of mutated lines (default 2000, ~20 s).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dispatchtune.datasets.records import read_results, records_frame
from dispatchtune.datasets.spaces import load_spaces
from dispatchtune.errors import DispatchTuneError

FIXTURE = Path(__file__).parent / "fixtures" / "cpu_results_matmul_256x384x256.jsonl"
CASES = int(os.environ.get("DISPATCHTUNE_FUZZ_CASES", "2000"))
TOKENS = ["NaN", "-Infinity", "Infinity", "1e999", "-1", "null", "true", '"', "\\", ",", ":", "{",
          "}", "[", "]", "9" * 40, "[" * 3000, '{"a":' * 200, "\udcff", "\x00"]
HOSTILE: list[Any] = [None, True, False, -1, 0, 2**63, 10**40, 1e308, -1e308, float("nan"),
                      float("inf"), "", "x", "candidate", "baseline", "confirm", [], {}, [None],
                      ["x"], [[1.0]], [float("nan")], {"a": 1}, [0] * 500,
                      "dispatchtune.result/999", "other.schema/1"]


def _mutate_value(record: dict[str, Any], rng: np.random.Generator) -> dict[str, Any]:
    record = json.loads(json.dumps(record))
    holder: dict[str, Any] = record
    if rng.random() < 0.3:  # reach inside the nested dicts
        inner = [k for k in ("knobs", "problem") if isinstance(record.get(k), dict)]
        if inner:
            holder = record[inner[int(rng.integers(len(inner)))]]
    if not holder:
        return record
    key = list(holder)[int(rng.integers(len(holder)))]
    if rng.random() < 0.2:
        del holder[key]
    else:
        holder[key] = HOSTILE[int(rng.integers(len(HOSTILE)))]
    return record


def _mutated_line(line: str, rng: np.random.Generator) -> str:
    kind = int(rng.integers(4))
    if kind == 0:  # a field replaced or deleted: stays valid JSON
        return json.dumps(_mutate_value(json.loads(line), rng))
    if kind == 1:  # truncated
        return line[: int(rng.integers(len(line)))]
    if kind == 2:  # a token inserted
        at = int(rng.integers(len(line)))
        return line[:at] + TOKENS[int(rng.integers(len(TOKENS)))] + line[at:]
    chars = list(line)  # characters flipped
    for _ in range(int(rng.integers(1, 6))):
        chars[int(rng.integers(len(chars)))] = chr(int(rng.integers(0, 0x3000)))
    return "".join(chars)


def _read_everything(path: Path) -> str:
    """Read a log the ways the commands do; the outcome's name, or raise what is not allowed."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records = list(read_results(path))
            records_frame(records)
            load_spaces([path])
    except DispatchTuneError as exc:
        assert "\n" not in str(exc)
        return "refused"
    return "read"


def test_mutated_log_lines_are_read_skipped_or_refused_in_one_line(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    rng = np.random.default_rng(0)
    outcomes: Counter[str] = Counter()
    for case in range(CASES):
        good = [lines[int(i)] for i in rng.choice(len(lines), size=6, replace=False)]
        bad = _mutated_line(good[0], rng)
        path = tmp_path / f"log{case % 8}.jsonl"
        path.write_text("\n".join([bad, *good[1:]]) + "\n", encoding="utf-8",
                        errors="surrogateescape")
        try:
            outcomes[_read_everything(path)] += 1
        except Exception as exc:  # pragma: no cover - the failure message is the point
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}\nline: {bad[:300]!r}")
    assert sum(outcomes.values()) == CASES and outcomes["read"] > CASES // 2, outcomes


def test_commands_read_a_hostile_log_in_one_line_or_succeed(tmp_path: Path) -> None:
    lines = FIXTURE.read_text().splitlines()
    rng = np.random.default_rng(1)
    mutated = [_mutated_line(line, rng) if rng.random() < 0.3 else line for line in lines]
    log = tmp_path / "results.jsonl"
    log.write_text("\n".join(mutated) + "\n", encoding="utf-8", errors="surrogateescape")
    commands = [
        [sys.executable, "-c", "import sys; from dispatchtune.cli import train_costmodel_main; "
         "sys.exit(train_costmodel_main(sys.argv[1:]))", str(log), "--model", "rf",
         "-o", str(tmp_path / "model.json")],
        [sys.executable, "-m", "dispatchtune", "evaluate", "--dataset", str(log),
         "--orders", "random,heuristic", "--seeds", "1", "-o", str(tmp_path / "eval")],
    ]
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        assert "Traceback" not in done.stderr, done.stderr[-2000:]
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error:" in line]
            assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
