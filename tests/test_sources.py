"""`CandidateSource`: the static order and the online search on a real CPU space, the one
scores-to-order rule, and the enumeration digest that keeps foreign log rows out of a search."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from dispatchtune.candidate import Candidate
from dispatchtune.costmodel.heuristic import HeuristicModel
from dispatchtune.costmodel.order import order_by_score
from dispatchtune.datasets.records import RecordKind, ResultRecord
from dispatchtune.datasets.timing import estimate, speedup
from dispatchtune.ir.frontend import load_problems
from dispatchtune.search import enumerate_candidates
from dispatchtune.search.online_source import OnlineSource
from dispatchtune.search.source import (
    DEMOTE_AFTER,
    FAMILY_LEVELS,
    CandidateSource,
    StaticOrder,
    ranked_order,
)
from dispatchtune.search.space import CandidateSet
from dispatchtune.targets import get_target

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"
HOST = get_target("host")


@pytest.fixture(scope="module")
def cset() -> CandidateSet:
    problem = load_problems(FIXTURE, HOST)[0]
    return enumerate_candidates(problem, HOST)


def online(cset: CandidateSet, tmp_path: Path, history: list[ResultRecord] | None = None) -> OnlineSource:
    return OnlineSource(cset, HeuristicModel(), storage=f"sqlite:///{tmp_path / 'study.db'}",
                        budget=10, worker="test", history=history or [])


def exercise(source: CandidateSource, cset: CandidateSet) -> tuple[list[Candidate], Candidate]:
    """Three candidates asked and answered each way the loop answers; then one more asked."""
    asked = [source.ask() for _ in range(3)]
    assert all(c is not None for c in asked)
    first, second, third = (c for c in asked if c is not None)
    source.tell(first, 1.0)
    source.skip(second)
    source.release(third)
    again = source.ask()
    assert again is not None
    source.close()
    assert source.space_digest == cset.digest() and source.stop_reason == ""
    for candidate in [first, second, third, again]:
        # Ids are rows of the enumeration the digest names.
        assert candidate.compilation_info == cset.compilation_info(candidate.candidate_id)
    return [first, second, third], again


def test_static_order_implements_the_protocol(cset: CandidateSet) -> None:
    asked, again = exercise(ranked_order(cset, "heuristic", seed=0), cset)
    ranks = [c.rank for c in asked]
    assert ranks == [0, 1, 2]  # benchmark order, `compilation_info` built on demand
    assert again == asked[2]  # a released candidate is asked again first


def test_online_source_implements_the_protocol(cset: CandidateSet, tmp_path: Path) -> None:
    asked, again = exercise(online(cset, tmp_path), cset)
    assert len({c.candidate_id for c in asked}) == 3
    # Told and skipped candidates are never asked again.
    assert again.candidate_id not in {asked[0].candidate_id, asked[1].candidate_id}


def test_a_fixed_list_is_a_static_order_without_an_enumeration() -> None:
    candidates = [Candidate(7, "a"), Candidate(3, "b")]
    source: CandidateSource = StaticOrder(candidates)
    assert source.space_digest == ""
    assert [source.ask(), source.ask(), source.ask()] == [*candidates, None]


def _logged(cset: CandidateSet, row: int, digest: str, time_ms: float) -> ResultRecord:
    return ResultRecord(
        problem=cset.problem.to_dict(), problem_key=cset.problem.key, target=HOST.name,
        device="local-sync", candidate_id=row, kind=RecordKind.CANDIDATE,
        compilation_info=cset.compilation_info(row), bench_status="ok", times_ms=[time_ms],
        space_digest=digest,
    )


def test_history_of_another_enumeration_is_not_imported(
    cset: CandidateSet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    history = [
        _logged(cset, 0, cset.digest(), 1.0),  # this enumeration
        _logged(cset, 1, "", 2.0),  # written before records carried a digest: accepted
        _logged(cset, 2, "feedfacefeedface", 0.5),  # another IREE / Z3 model / CPU: row 2 is
    ]
    with caplog.at_level(logging.WARNING, logger="dispatchtune.search.online_source"):
        source = online(cset, tmp_path, history)
    try:
        assert source.imported == 2
        assert "1 logged result(s) of another enumeration" in caplog.text
        told = {int(t.params["candidate"]) for t in source.study.study.get_trials(deepcopy=False)}
        assert told == {0, 1}
    finally:
        source.close()


def test_one_order_rule_nan_last_ties_seeded() -> None:
    scores = np.array([1.0, np.nan, 3.0, 1.0, 1.0, 3.0])
    order = order_by_score(scores, seed=0)
    assert set(order[:2]) == {2, 5} and set(order[2:5]) == {0, 3, 4} and order[-1] == 1
    assert (order_by_score(scores, seed=0) == order).all()
    assert list(order_by_score(scores)) == [2, 5, 0, 3, 4, 1]  # no seed: ties in input order
    tied = np.zeros(50)
    assert list(order_by_score(tied, seed=1)) != list(order_by_score(tied, seed=2))


def test_one_speedup_definition() -> None:
    assert speedup(2.0, 1.0) == 2.0
    assert np.isnan(speedup(estimate([], "min"), 1.0))
    assert list(speedup(np.array([2.0, 3.0]), np.array([4.0, 1.0]))) == [0.5, 3.0]
    assert estimate([3.0, 1.0, 2.0]) == 1.0 and estimate([3.0, 1.0, 2.0], "median") == 2.0


def _build(candidate: Candidate, status: str, cset: CandidateSet) -> ResultRecord:
    """The record of a build of `candidate` that ended with `status`."""
    return ResultRecord(
        problem=cset.problem.to_dict(), problem_key=cset.problem.key, target=cset.target.name,
        device="", candidate_id=candidate.candidate_id, kind=RecordKind.CANDIDATE,
        compilation_info=candidate.compilation_info, compile_status=status,
        compile_error="error: failed to legalize" if status == "failed" else "",
        knobs=candidate.knobs, pipeline=candidate.pipeline,
    )


@pytest.fixture(scope="module")
def conv_gfx942() -> CandidateSet:
    """A real gfx942 space with two families: direct and implicit-GEMM lowering."""
    gpu = get_target("gfx942")
    problem = load_problems(Path(__file__).parent / "fixtures" / "conv_stride2_f32.mlir", gpu)[0]
    return enumerate_candidates(problem, gpu)


def family(candidate: Candidate) -> tuple[object, ...]:
    return tuple(candidate.knobs.get(c) for c in FAMILY_LEVELS[-1])


def test_a_family_whose_builds_all_fail_is_asked_last(conv_gfx942: CandidateSet) -> None:
    source = ranked_order(conv_gfx942, "heuristic")
    plain = [c.candidate_id for c in ranked_order(conv_gfx942, "heuristic")]
    first = source.ask()
    assert first is not None and first.candidate_id == plain[0]
    asked = [first.candidate_id]
    doomed = family(first)
    # A failure of the environment says nothing of the family; failed builds do, DEMOTE_AFTER
    # of them (a timed-out one too).
    full_disk = _build(first, "failed", conv_gfx942)
    full_disk.compile_error = "error: No space left on device"
    assert full_disk.may_be_transient
    source.tell(first, None, full_disk)
    failures = 0
    while failures < DEMOTE_AFTER[-1]:
        candidate = source.ask()
        assert candidate is not None
        asked.append(candidate.candidate_id)
        if family(candidate) == doomed:
            status = "timeout" if failures == 0 else "failed"
            source.tell(candidate, None, _build(candidate, status, conv_gfx942))
            failures += 1
            if failures == 1:  # the full disk did not count
                assert not source.demoted().any()
    assert asked == plain[: len(asked)]  # rank order until then
    later = [source.ask() for _ in range(20)]
    assert all(c is not None and family(c) != doomed for c in later)
    ids = [c.candidate_id for c in later if c is not None]
    # The others keep their rank order.
    assert ids == sorted(ids, key=plain.index)
    jumped = [i for i in plain[: plain.index(ids[-1])] if i not in {*asked, *ids}]
    assert jumped  # the demoted family's rows ranked among them wait
    # One build of the family that succeeds brings the rest of it back in rank order.
    source.tell(first, None, _build(first, "ok", conv_gfx942))
    nxt = source.ask()
    assert nxt is not None
    unasked = [i for i in plain if i not in {*asked, *ids}]
    assert nxt.candidate_id == unasked[0]


def test_failed_builds_logged_earlier_reorder_a_resumed_run(conv_gfx942: CandidateSet) -> None:
    fresh = ranked_order(conv_gfx942, "heuristic")
    asked = [fresh.ask() for _ in range(40)]
    doomed = family(asked[0])  # type: ignore[arg-type]
    history = [_build(c, "failed", conv_gfx942) for c in asked
               if c is not None and family(c) == doomed][:DEMOTE_AFTER[-1]]
    assert len(history) == DEMOTE_AFTER[-1]
    resumed = ranked_order(conv_gfx942, "heuristic", history=history)
    assert resumed.demoted().any() and not resumed.demoted().all()
    candidate = resumed.ask()
    assert candidate is not None and family(candidate) != doomed
