"""`OnlineSource`: a `CandidateSource` whose candidates an Optuna study chooses during the run.

Each `ask` claims one candidate from the dispatch's study (`search.optuna_search.OnlineStudy`), and
every outcome the loop reports (`tell` / `skip` / `release`) goes back to it, so the next candidate
is chosen with all results so far, of this worker and of every other worker sharing the storage.
The prior is a cost model's scores of the enumerated space.

Results already logged (`history`: an interrupted run, or an earlier run with another order) enter
the study as if measured in it, but only those of the same enumeration (`space_digest`): a
`candidate_id` of another IREE, Z3 model or CPU names another configuration. Failures that may be
transient are not imported (the study counts their attempts), nor any failure with
`retry_failed`.

The loop reports a benchmarked candidate with `tell` and its record (the whole record goes to the
study before the loop logs it, see `search.optuna_search`); `recovered` holds the records of this
worker's results that reached the study but not its log (a kill between the two), for the loop to
log.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from dispatchtune.candidate import Candidate
from dispatchtune.datasets.records import ResultRecord, record_from_dict
from dispatchtune.search.online import OnlineSearch
from dispatchtune.search.optuna_search import LEASE_S, OnlineStudy
from dispatchtune.search.source import table_candidate

if TYPE_CHECKING:
    from dispatchtune.costmodel.base import CostModel
    from dispatchtune.search.space import CandidateSet

logger = logging.getLogger(__name__)


class OnlineSource:
    """Candidates of `cset` chosen online, starting from `model`'s order (see the module docstring).

    `storage` is an Optuna storage URL shared by every worker of the study; `worker` names this
    worker across restarts (its stale trials are released when it starts again). The study stops
    at `budget` measurements (all workers), after `time_limit_s` (0: none), or when the last
    `patience` results (0: never) did not beat the best by `margin`.
    """

    def __init__(
        self,
        cset: CandidateSet,
        model: CostModel,
        *,
        storage: str,
        budget: int,
        worker: str,
        seed: int = 0,
        time_limit_s: float = 0.0,
        margin: float = 0.01,
        patience: int = 0,
        estimator: str = "min",
        history: Iterable[ResultRecord] = (),
        lease_s: int = LEASE_S,
        retry_failed: bool = False,
        compile_timeout_s: float = 0.0,
    ) -> None:
        from dispatchtune.features.extract import extract_features

        problem, target = cset.problem, cset.target
        self.cset = cset
        self.table = cset.table.reset_index(drop=True)
        self.space_digest = cset.digest()
        features = extract_features(problem, target, self.table)
        self.prior = np.asarray(model.predict_candidates(features, self.table), dtype=np.float64)
        knobs = self.table[[c for c in self.table.columns if c != "candidate_id"]]
        search = OnlineSearch(features, self.prior, seed=seed, knobs=knobs)
        self.study = OnlineStudy(
            storage,
            study_name=f"{problem.key}@{target.name}",
            search=search,
            set_digest=self.space_digest,
            budget=budget,
            worker=worker,
            session=f"{time.time_ns():x}",
            deadline=time.monotonic() + time_limit_s if time_limit_s > 0 else None,
            margin=margin,
            patience=patience,
            lease_s=lease_s,
            retry_failed=retry_failed,
            compile_timeout_s=compile_timeout_s,
        )
        history = list(history)
        self.retry_failed = retry_failed
        self.imported = self.study.record_known(self._known(history, estimator))
        logged = {r.compilation_info for r in history
                  if r.is_candidate and r.belongs_to(problem.key, target.name)}
        self.recovered = [record_from_dict(json.loads(text)) for text in self.study.unlogged(logged)]
        self._trial_of: dict[int, int] = {}  # candidate_id -> trial number

    def _known(self, history: Iterable[ResultRecord], estimator: str) -> dict[int, float | None]:
        """Logged results of this enumeration, by row: their time, or None when they failed."""
        problem, target = self.cset.problem, self.cset.target
        known: dict[int, float | None] = {}
        foreign = 0
        for record in history:
            if not record.is_candidate or not record.belongs_to(problem.key, target.name):
                continue
            # Logs written before the digest was recorded are taken as they always were.
            if record.space_digest and record.space_digest != self.space_digest:
                foreign += 1
                continue
            row = record.candidate_id
            # A duplicate's binary was measured under another candidate; it teaches nothing.
            # Failures to be tried again are left to the study's attempt count.
            retry = record.failed and (self.retry_failed or record.may_be_transient)
            if 0 <= row < len(self.table) and record.compile_status != "duplicate" and not retry:
                known[row] = record.learned_time(estimator)
        if foreign:
            logger.warning(
                "%s: %d logged result(s) of another enumeration (another IREE, Z3 model or CPU) "
                "not imported into the online search", problem.key[:40], foreign,
            )
        return known

    @property
    def stop_reason(self) -> str:
        return self.study.stop_reason

    def ask(self) -> Candidate | None:
        claimed = self.study.ask()
        if claimed is None:
            return None
        number, row = claimed
        self._trial_of[row] = number
        return table_candidate(self.cset, self.table.iloc[row], row, self.study.search.n_told,
                               float(self.prior[row]))

    def tell(
        self, candidate: Candidate, time_ms: float | None, record: ResultRecord | None = None
    ) -> None:
        number = self._trial_of.pop(candidate.candidate_id, None)
        if number is None:
            return
        if record is None:
            self.study.tell(number, time_ms)
            return
        # The whole record goes to the study before the loop logs it (see the module docstring).
        timed_out = record.compile_status == "timeout" and record.compile_timeout_s
        self.study.tell(number, time_ms, transient=record.may_be_transient, record=record.to_json(),
                        timeout_s=float(record.compile_timeout_s or 0.0) if timed_out else 0.0)

    def skip(self, candidate: Candidate) -> None:
        number = self._trial_of.pop(candidate.candidate_id, None)
        if number is not None:
            self.study.skip(number)

    def release(self, candidate: Candidate) -> None:
        number = self._trial_of.pop(candidate.candidate_id, None)
        if number is not None:
            self.study.release(number)

    def close(self) -> None:
        self.study.close()
