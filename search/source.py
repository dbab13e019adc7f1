"""`CandidateSource`: where the tuning loop gets its candidates and reports their outcomes.

The loop asks for one candidate at a time and reports back what became of each one it was given:
`tell` (benchmarked: a time, or None when it failed or miscompiled; with the record the loop is
about to log, which a source that shares results across workers keeps first), `skip` (not measured and not
to be asked again: its binary duplicates another's, or this output directory already holds it)
or `release` (not measured: the budget ran out while it was being built). `close` ends the run.
`recovered` hands the loop results a shared store holds for this worker that its log lost.

Two implementations: `StaticOrder`, a benchmark order fixed up front (a ranking of the enumerated
space, or a given list), and `search.online_source.OnlineSource`, which chooses each candidate
with every result so far.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from dispatchtune.candidate import Candidate

if TYPE_CHECKING:
    from dispatchtune.costmodel.base import CostModel
    from dispatchtune.datasets.records import ResultRecord
    from dispatchtune.search.space import CandidateSet


class CandidateSource(Protocol):
    """What the tuning loop needs from a candidate order (see the module docstring)."""

    @property
    def space_digest(self) -> str:
        """`CandidateSet.digest` of the enumeration the candidates' ids are rows of ("": none)."""
        ...

    @property
    def stop_reason(self) -> str:
        """Why `ask` returned None ("" when the source just ran out of candidates)."""
        ...

    @property
    def recovered(self) -> Sequence[ResultRecord]:
        """Results held for this worker that its log lacks (a kill between the two writes)."""
        ...

    def ask(self) -> Candidate | None:
        """The next candidate to try, or None when there is none."""
        ...

    def tell(
        self, candidate: Candidate, time_ms: float | None, record: ResultRecord | None = None
    ) -> None:
        """The candidate was benchmarked: its time, or None when it failed or miscompiled;
        `record` is the result as the loop is about to log it."""
        ...

    def skip(self, candidate: Candidate) -> None:
        """The candidate will not be measured and must not be asked again."""
        ...

    def release(self, candidate: Candidate) -> None:
        """The candidate was not measured; it may be asked again."""
        ...

    def close(self) -> None:
        """End of the run: hand back whatever is still claimed."""
        ...


class StaticOrder:
    """A benchmark order fixed up front; outcomes do not change it.

    Candidates are drawn lazily from `candidates` (an iterator keeps `compilation_info` from being
    materialised before the loop reaches a candidate). A released candidate is asked again first.
    """

    def __init__(self, candidates: Iterable[Candidate], space_digest: str = "") -> None:
        self._next: Iterator[Candidate] = iter(candidates)
        self._released: deque[Candidate] = deque()
        self.space_digest = space_digest
        self.stop_reason = ""
        self.recovered: Sequence[ResultRecord] = ()

    def __iter__(self) -> Iterator[Candidate]:
        while (candidate := self.ask()) is not None:
            yield candidate

    def ask(self) -> Candidate | None:
        if self._released:
            return self._released.popleft()
        return next(self._next, None)

    def tell(
        self, candidate: Candidate, time_ms: float | None, record: ResultRecord | None = None
    ) -> None:
        pass

    def skip(self, candidate: Candidate) -> None:
        pass

    def release(self, candidate: Candidate) -> None:
        self._released.append(candidate)

    def close(self) -> None:
        pass


def ranked_order(
    cset: CandidateSet, order: str | None = None, seed: int = 0, model: CostModel | None = None
) -> StaticOrder:
    """The enumerated space in benchmark order (`dispatchtune.rank`: heuristic, random or model).

    Ranking is columnar over the whole space; each candidate's `compilation_info` is materialised
    only when it is asked for.
    """
    from dispatchtune.costmodel.rank import rank

    table = rank(cset, cset.problem, cset.target, order=order, seed=seed, model=model)

    def candidates() -> Iterator[Candidate]:
        ids = table["candidate_id"].to_numpy()
        scores = table["score"].to_numpy(dtype=float)
        for position in range(len(table)):
            score = None if np.isnan(scores[position]) else float(scores[position])
            yield table_candidate(cset, table.iloc[position], int(ids[position]), position, score)

    return StaticOrder(candidates(), cset.digest())


def table_candidate(
    cset: CandidateSet, row: pd.Series, candidate_id: int, rank: int, score: float | None
) -> Candidate:
    """The `Candidate` of one row of a (ranked) candidate table; its knobs are the row's columns."""
    return Candidate(
        candidate_id=candidate_id,
        compilation_info=cset.compilation_info(candidate_id),
        pipeline=str(row.get("pipeline", "")),
        knobs={c: _plain(row[c]) for c in row.index if c not in ("score", "candidate_id")},
        rank=rank,
        score=score,
    )


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
