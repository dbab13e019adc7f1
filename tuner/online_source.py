"""`--order online`: the loop's candidates come from an Optuna study that learns during the run.

`OnlineCandidates` is what the loop iterates: each `next()` claims one candidate from the
dispatch's study (`search.optuna_search.OnlineStudy`), and the loop reports every outcome back
(`tell` / `skip` / `release`), so the next candidate is chosen with all results so far, of this
worker and of every other worker sharing the storage. The prior is the target's cost model
(`--model FILE`, else the installed default, else the heuristic).
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from dispatchtune.candidate import Candidate
from dispatchtune.problem import Problem
from dispatchtune.search.online import OnlineSearch
from dispatchtune.search.optuna_search import OnlineStudy, default_storage
from dispatchtune.targets import Target

if TYPE_CHECKING:
    from dispatchtune.tuner.loop import TuneOptions


def table_digest(problem: Problem, target: Target, table: pd.DataFrame) -> str:
    """Identity of an enumerated candidate set (cheap: hashes the table, not the MLIR strings)."""
    import hashlib

    hashed = pd.util.hash_pandas_object(table.reset_index(drop=True), index=True).to_numpy()
    digest = hashlib.sha256(f"{problem.key}@{target.name}:{len(table)}".encode())
    digest.update(hashed.tobytes())
    return digest.hexdigest()[:16]


class OnlineCandidates:
    """Iterable of `Candidate`s chosen online; the loop calls `tell`/`skip`/`release` on outcomes."""

    def __init__(
        self,
        problem: Problem,
        target: Target,
        options: TuneOptions,
        output_dir: Path,
        history: Sequence[dict[str, Any]] = (),
    ) -> None:
        from dispatchtune.costmodel.defaults import model_for_target
        from dispatchtune.features.extract import extract_features
        from dispatchtune.search import enumerate_candidates
        from dispatchtune.tuner.report import estimate

        self.problem, self.target = problem, target
        self.cset = enumerate_candidates(problem, target)
        table = self.cset.table.reset_index(drop=True)
        self.table = table
        model, self.prior_source = model_for_target(target.name, options.model_path)
        if options.progress is not False:
            print(f"{problem.key[:40]}: online search, prior from the {self.prior_source}",
                  file=sys.stderr)
        features = extract_features(problem, target, table)
        prior = np.asarray(model.predict(features), dtype=np.float64)
        self.prior = prior
        knobs = table[[c for c in table.columns if c != "candidate_id"]]
        search = OnlineSearch(features, prior, seed=options.seed, knobs=knobs)
        deadline = time.monotonic() + options.time_limit_s if options.time_limit_s > 0 else None
        storage = options.storage or default_storage(output_dir)
        self.study = OnlineStudy(
            storage,
            study_name=f"{problem.key}@{target.name}",
            search=search,
            set_digest=table_digest(problem, target, table),
            budget=options.budget,
            worker=f"{socket.gethostname()}:{output_dir.resolve()}",
            session=f"{time.time_ns():x}",
            deadline=deadline,
            margin=options.stop_margin,
            patience=options.stop_patience,
        )
        # Results this output directory already holds (an interrupted run, or an earlier run with
        # another order) enter the study: they are not measured again and they teach the model.
        known: dict[int, float | None] = {}
        for record in history:
            if (record.get("kind") != "candidate" or record.get("problem_key") != problem.key
                    or record.get("target") != target.name):
                continue
            row = int(record.get("candidate_id", -1))
            if not 0 <= row < len(table):
                continue
            if record.get("compile_status") == "duplicate":
                continue
            if record.get("compile_status") != "ok" or record.get("bench_status") not in ("ok", None):
                known[row] = None
            elif record.get("times_ms") and record.get("verify_status") != "mismatch":
                known[row] = estimate(record["times_ms"], options.estimator)
        self.imported = self.study.record_known(known)
        self._trial_of: dict[int, int] = {}  # candidate_id -> trial number

    def __iter__(self) -> Iterator[Candidate]:
        while True:
            claimed = self.study.ask()
            if claimed is None:
                return
            number, row = claimed
            self._trial_of[row] = number
            yield self.candidate(row)

    def candidate(self, row: int) -> Candidate:
        from dispatchtune.tuner.loop import table_candidate

        return table_candidate(self.cset, self.table.iloc[row], row, self.study.search.n_told,
                               float(self.prior[row]))

    # -- outcomes, reported by the loop ---------------------------------------------------------------
    def tell(self, candidate: Candidate, time_ms: float | None) -> None:
        number = self._trial_of.pop(candidate.candidate_id, None)
        if number is not None:
            self.study.tell(number, time_ms)

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

    @property
    def stop_reason(self) -> str:
        return self.study.stop_reason
