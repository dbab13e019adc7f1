"""The versioned results.jsonl format: durable appends, typed reads, corrupt lines, foreign schemas,
frames."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from dispatchtune.datasets.records import (
    BASELINE_ID,
    SCHEMA,
    CorruptRecordWarning,
    RecordKind,
    ResultRecord,
    ResultsLog,
    load_results,
    read_records,
    read_results,
    record_from_dict,
    records_frame,
)
from dispatchtune.errors import DispatchTuneError
from dispatchtune.problem import Problem

PROBLEM = Problem.matmul(64, 32, 16)


def _candidate(cid: int, times: list[float], **extra: object) -> ResultRecord:
    return ResultRecord(
        problem=PROBLEM.to_dict(), problem_key=PROBLEM.key, target="host", device="local-sync",
        candidate_id=cid, pipeline="DoubleTilingExpert",
        knobs={"pipeline": "DoubleTilingExpert", "tile_m": 32, "tile_n": 16 * cid},
        compilation_info=f"cfg{cid}", bench_status="ok" if times else "skipped",
        times_ms=times, baseline_times_ms=[2.0, 2.0, 2.2], **extra,  # type: ignore[arg-type]
    )


def test_roundtrip_keeps_every_field(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    first = _candidate(3, [1.0, 1.1, 0.9], verify_status="ok", max_abs_error=1e-6)
    log.append(first)
    log.append(ResultRecord(problem=PROBLEM.to_dict(), problem_key=PROBLEM.key, target="host",
                            device="local-sync", candidate_id=BASELINE_ID,
                            kind=RecordKind.BASELINE, times_ms=[2.0]))
    back = list(read_records(tmp_path / "results.jsonl"))
    assert [r["kind"] for r in back] == ["candidate", "baseline"]
    assert back[0]["schema"] == SCHEMA
    assert record_from_dict(back[0]) == first
    assert Problem.from_dict(back[0]["problem"]) == PROBLEM


def test_typed_records_read_back_as_written(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    written = [
        _candidate(3, [1.0, 1.1, 0.9], verify_status="ok", max_abs_error=1e-6, score=0.25,
                   duplicate_of=None, space_digest="0123456789abcdef"),
        ResultRecord(problem=PROBLEM.to_dict(), problem_key=PROBLEM.key, target="host",
                     device="local-sync", candidate_id=BASELINE_ID, kind=RecordKind.BASELINE,
                     times_ms=[2.0]),
    ]
    for record in written:
        log.append(record)
    back = list(read_results(tmp_path / "results.jsonl"))
    assert back == written
    assert back[0].is_candidate and back[1].is_baseline and not back[1].is_confirm
    assert back[0].space_digest == "0123456789abcdef"
    assert back[0].learned_time() == pytest.approx(0.9)
    assert back[0].learned_time("median") == pytest.approx(1.0)


def test_older_logs_take_defaults_and_wrong_types_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    old = {"schema": SCHEMA, "kind": "candidate", "problem_key": PROBLEM.key, "target": "host",
           "candidate_id": 4, "compile_status": "ok", "times_ms": [1.5], "bench_status": "ok"}
    wrong_times = {**old, "candidate_id": 5, "times_ms": "fast"}
    wrong_id = {**old, "candidate_id": "6"}
    wrong_kind = {**old, "candidate_id": 7, "kind": "guess"}
    path.write_text("\n".join(json.dumps(r) for r in (old, wrong_times, wrong_id, wrong_kind)) + "\n")
    with pytest.warns(CorruptRecordWarning) as caught:
        back = list(read_results(path))
    (record,) = back
    # Fields the old log lacks: their defaults (no digest: the enumeration is unknown).
    assert record.candidate_id == 4 and record.space_digest == "" and record.device == ""
    assert record.verify_status == "skipped" and record.learned_time() == 1.5
    messages = [str(w.message) for w in caught]
    assert len(messages) == 3
    assert f"{path}:2: corrupt record skipped (times_ms is str" in messages[0]
    assert f"{path}:3:" in messages[1] and "candidate_id" in messages[1]
    assert f"{path}:4:" in messages[2] and "kind" in messages[2]
    with pytest.raises(DispatchTuneError, match="times_ms"):
        record_from_dict(wrong_times)


def test_torn_last_line_is_reported_and_next_append_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    ResultsLog(path).append(_candidate(0, [1.0]))
    with path.open("a") as handle:  # what a kill in the middle of a write leaves behind
        handle.write('{"schema": "dispatchtune.result/1", "kind": "cand')
    ResultsLog(path).append(_candidate(1, [1.0]))
    with pytest.warns(CorruptRecordWarning, match=r"results\.jsonl:2: corrupt record skipped"):
        back = list(read_records(path))
    assert [r["candidate_id"] for r in back] == [0, 1]


def test_corrupt_lines_are_skipped_with_file_and_line_number(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    good = _candidate(0, [1.0]).to_json()
    path.write_text("\n".join([good, "not json at all", "[1, 2]",
                               json.dumps({"schema": SCHEMA, "kind": "candidate"}), good]) + "\n")
    with pytest.warns(CorruptRecordWarning) as caught:
        back = list(read_records(path))
    assert len(back) == 2
    messages = [str(w.message) for w in caught]
    assert any(f"{path}:2:" in m for m in messages)
    assert any(f"{path}:3:" in m and "not a JSON object" in m for m in messages)
    assert any(f"{path}:4:" in m and "missing" in m for m in messages)


def test_foreign_and_newer_schemas_are_refused_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"schema": "sharktuner/7", "kind": "candidate"}) + "\n")
    with pytest.raises(DispatchTuneError, match="not a dispatchtune result record") as info:
        list(read_records(path))
    assert "\n" not in str(info.value)
    path.write_text(json.dumps({"schema": "dispatchtune.result/99"}) + "\n")
    with pytest.raises(DispatchTuneError, match="newer"):
        list(read_records(path))


def test_frame_flattens_knobs_and_normalises_by_the_baseline(tmp_path: Path) -> None:
    log = ResultsLog(tmp_path / "results.jsonl")
    log.append(_candidate(1, [1.0, 1.2, 1.0]))
    log.append(_candidate(2, [4.0, 4.0, 4.0]))
    log.append(_candidate(3, [], compile_status="failed", compile_error="error: boom"))
    frame = load_results(tmp_path)  # a directory means its results.jsonl
    assert list(frame["candidate_id"]) == [1, 2, 3]
    assert list(frame["tile_n"]) == [16, 32, 48]
    assert frame["median_ms"].iloc[0] == pytest.approx(1.0)
    assert frame["speedup"].iloc[0] == pytest.approx(2.0)
    assert frame["speedup"].iloc[1] == pytest.approx(0.5)
    assert math.isnan(frame["speedup"].iloc[2])
    assert "problem" in frame.columns and "knobs" not in frame.columns
    baseline = _candidate(BASELINE_ID, [2.0], kind=RecordKind.BASELINE)
    with_base = records_frame([baseline, _candidate(1, [1.0])], include_baselines=True)
    assert len(with_base) == 2


def test_missing_results_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DispatchTuneError, match="no results file"):
        load_results(tmp_path / "nowhere")
    assert list(read_records(tmp_path / "absent.jsonl")) == []
