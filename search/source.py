"""`CandidateSource`: where the tuning loop gets its candidates and reports their outcomes.

The loop asks for one candidate at a time and reports back what became of each one it was given:
`tell` (benchmarked: a time, or None when it failed or miscompiled; with the record the loop is
about to log, which a source that shares results across workers keeps first), `skip` (not measured and not
to be asked again: its binary duplicates another's, or this output directory already holds it)
or `release` (not measured: the budget ran out while it was being built). `close` ends the run.
`recovered` hands the loop results a shared store holds for this worker that its log lost.

Three implementations: `StaticOrder`, a benchmark order fixed up front (a given list);
`RankedOrder`, a ranking of the enumerated space that moves a family of candidates whose builds
all fail behind the others; and `search.online_source.OnlineSource`, which chooses each
candidate with every result so far.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd

from dispatchtune.candidate import Candidate

if TYPE_CHECKING:
    from collections.abc import Hashable

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
        """The candidate was benchmarked: its time, or None when it failed or miscompiled (or,
        compiling only, was built: its `record` says which); `record` is the result as the loop
        is about to log it."""
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


class _InOrder:
    """What both orders share: released candidates are asked again first; `skip` and `close`
    have nothing to do (nothing is claimed from a shared store); `_next` gives the next one."""

    def __init__(self, space_digest: str) -> None:
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
        return self._next()

    def _next(self) -> Candidate | None:
        raise NotImplementedError

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


class StaticOrder(_InOrder):
    """A benchmark order fixed up front; outcomes do not change it.

    Candidates are drawn lazily from `candidates` (an iterator keeps `compilation_info` from being
    materialised before the loop reaches a candidate). A released candidate is asked again first.
    """

    def __init__(self, candidates: Iterable[Candidate], space_digest: str = "") -> None:
        super().__init__(space_digest)
        self._candidates: Iterator[Candidate] = iter(candidates)

    def _next(self) -> Candidate | None:
        return next(self._candidates, None)


#: Candidate-table columns whose values name a family of configurations IREE lowers the same way:
#: a constraint set (its pipeline and, for a convolution, direct or implicit-GEMM lowering) and,
#: inside it, the MMA intrinsic(s). A family's candidates tend to fail to build together (IREE
#: 3.13: every strided convolution row lowered directly that was tried; for an f16 result on
#: sm_80, every f32-accumulating intrinsic), so one whose builds all failed is tried last.
FAMILY_LEVELS: tuple[tuple[str, ...], ...] = (
    ("pipeline", "space"), ("pipeline", "space", "intrinsic", "pv_intrinsic"),
)
#: Failed builds, with no build of the family succeeding, after which the family's remaining
#: candidates go behind every other one (per level of `FAMILY_LEVELS`): a constraint set pools
#: rows of different intrinsics and tiles, so it takes more evidence than one intrinsic.
DEMOTE_AFTER: tuple[int, ...] = (4, 2)


class RankedOrder(_InOrder):
    """A ranking of the enumerated space, asked in rank order, except that a family of candidates
    (`FAMILY_LEVELS`) whose builds have all failed, `DEMOTE_AFTER` times or more, is asked after
    every other candidate (still in rank order; nothing is dropped, and one build of the family
    that succeeds, even late, brings it back). Builds count from `history` too (this dispatch's
    logged candidates), so a resumed run picks up where it was.

    A released candidate is asked again first; `compilation_info` is materialised only when a
    candidate is asked for.
    """

    def __init__(self, cset: CandidateSet, table: pd.DataFrame,
                 history: Sequence[ResultRecord] = ()) -> None:
        super().__init__(cset.digest())
        self._cset = cset
        self._table = table.reset_index(drop=True)
        self._ids = self._table["candidate_id"].to_numpy()
        self._scores = self._table["score"].to_numpy(dtype=float)
        self._asked = np.zeros(len(self._table), dtype=bool)
        # Per level: each row's family code, the code of each family key, failures and builds.
        self._levels: list[tuple[tuple[str, ...], np.ndarray, dict[Hashable, int]]] = []
        for level in FAMILY_LEVELS:
            columns = tuple(c for c in level if c in self._table.columns)
            keys = list(zip(*(self._table[c].astype(str) for c in columns), strict=True)) \
                if columns else [()] * len(self._table)
            codes, uniques = pd.factorize(pd.Series(keys, dtype=object))
            self._levels.append((columns, codes, {key: i for i, key in enumerate(uniques)}))
        self._failed = [np.zeros(len(m)) for _, _, m in self._levels]
        self._built = [np.zeros(len(m)) for _, _, m in self._levels]
        problem, target = cset.problem.key, cset.target.name
        for record in history:
            if record.is_candidate and record.belongs_to(problem, target):
                self._count(record.knobs, record)

    def demoted(self) -> np.ndarray:
        """Per rank position: whether its family is asked last now."""
        out = np.zeros(len(self._table), dtype=bool)
        for (_, codes, _), failed, built, after in zip(
                self._levels, self._failed, self._built, DEMOTE_AFTER, strict=True):
            out |= ((failed >= after) & (built == 0))[codes]
        return out

    def _next(self) -> Candidate | None:
        free = ~self._asked
        if not free.any():
            return None
        preferred = free & ~self.demoted()
        position = int(np.argmax(preferred if preferred.any() else free))
        self._asked[position] = True
        score = None if np.isnan(self._scores[position]) else float(self._scores[position])
        return table_candidate(self._cset, self._table.iloc[position], int(self._ids[position]),
                               position, score)

    def tell(
        self, candidate: Candidate, time_ms: float | None, record: ResultRecord | None = None
    ) -> None:
        if record is not None:
            self._count(candidate.knobs, record)

    def _count(self, knobs: dict[str, Any], record: ResultRecord) -> None:
        """A build of the family of `knobs` succeeded or failed. A crashed or timed-out compile
        counts as a failure: the retry rule treats both as maybe the machine's load, but a family
        whose builds keep running out of time costs a whole timeout per candidate (seen: 13 of
        16 VectorDistribute builds of a fused 1x1 convolution at 60 s each), and reordering is
        undone by the next build of it that succeeds. A failure of the environment (a full disk)
        says nothing of the family."""
        if record.compile_status in ("ok", "duplicate"):
            counts = self._built
        elif record.compile_status in ("crashed", "timeout") or not record.may_be_transient:
            counts = self._failed
        else:
            return
        for (columns, _, code_of), level_counts in zip(self._levels, counts, strict=True):
            code = code_of.get(tuple(str(knobs.get(c, "")) for c in columns))
            if code is not None:
                level_counts[code] += 1


def ranked_order(
    cset: CandidateSet, order: str | None = None, seed: int = 0, model: CostModel | None = None,
    history: Sequence[ResultRecord] = (),
) -> RankedOrder:
    """The enumerated space in benchmark order (`dispatchtune.rank`: heuristic, random or model),
    families whose builds all fail moved last as results come in (`RankedOrder`).

    Ranking is columnar over the whole space; each candidate's `compilation_info` is materialised
    only when it is asked for.
    """
    from dispatchtune.costmodel.rank import rank

    table = rank(cset, cset.problem, cset.target, order=order, seed=seed, model=model)
    return RankedOrder(cset, table, history)


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
