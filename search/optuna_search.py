"""The online search inside an Optuna study: ask-and-tell, storage-backed, shared by many workers.

One study per dispatch. Each trial is one candidate (integer parameter `candidate` = row of the
enumerated candidate set); its value is the measured time in ms. `CandidateSampler` proposes rows
with `OnlineSearch` after syncing it with every trial in the storage, so measurements of all
workers (and of earlier, interrupted runs) steer the next proposal.

Several workers may ask at the same moment and be proposed the same row. The claim rule keeps a
candidate from being measured twice without any lock: after a trial's row is stored, the trial
with the lowest number holding that row wins; a trial that loses is closed as a lost claim and the
worker asks again. Trials numbers come from the storage, so every worker sees the same winner.

Trials left RUNNING by a killed worker are recovered two ways: the same worker (same output
directory and host) closes its own stale trials when it starts again, and heartbeats let any
worker fail another worker's trials once they go silent (Optuna's stale-trial handling).
Trial user attributes: `status` (`ok`, `failed`, `duplicate`, `lost`, `released`), `worker`,
`session`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.search.online import OnlineSearch

PARAM = "candidate"
# Ask-and-tell with heartbeats works (we beat for our own trials); Optuna's advice and its
# per-trial INFO lines are noise in a tuning run.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
optuna.logging.set_verbosity(optuna.logging.WARNING)
HEARTBEAT_S = 10
GRACE_S = 60
# Trials closed without a measurement; their candidates may be proposed again.
_UNMEASURED = ("lost", "released")


def default_storage(output_dir: Path) -> str:
    return f"sqlite:///{(output_dir / 'study.db').resolve()}"


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats; a bad URL is a one-line error."""
    kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        # Several processes on one SQLite file wait for each other's writes instead of failing.
        kwargs["connect_args"] = {"timeout": 120}
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S
            )
        except Exception as exc:  # sqlalchemy raises many types for bad URLs / missing drivers
            # Workers starting together race to create the schema; the loser retries once the
            # winner is done.
            racing = "UNIQUE constraint" in str(exc) or "already exists" in str(exc)
            if racing and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            raise InputError(f"cannot open study storage {url!r}: {str(exc).splitlines()[0]}") from exc
    raise AssertionError("unreachable")


def _row(trial: FrozenTrial) -> int | None:
    value = trial.params.get(PARAM)
    return None if value is None else int(value)


def _is_measured(trial: FrozenTrial) -> bool:
    """The trial holds (or will hold) a real result for its candidate."""
    if trial.state in (TrialState.RUNNING, TrialState.COMPLETE):
        return True
    return trial.state == TrialState.FAIL and trial.user_attrs.get("status") in ("failed", "duplicate")


class CandidateSampler(optuna.samplers.BaseSampler):
    """Proposes the `candidate` parameter from an `OnlineSearch` synced with the whole study."""

    def __init__(self, search: OnlineSearch) -> None:
        self.search = search

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        if param_name != PARAM:
            raise DispatchTuneError(f"CandidateSampler samples only {PARAM!r}, not {param_name!r}")
        self.sync(study.get_trials(deepcopy=False))
        rows = self.search.ask(1)
        if not rows:
            raise _Exhausted
        return rows[0]

    def sync(self, trials: Iterable[FrozenTrial]) -> None:
        """Tell the search every finished result; in-flight candidates become pending."""
        pending: set[int] = set()
        for trial in trials:
            row = _row(trial)
            if row is None:
                continue
            if trial.state == TrialState.COMPLETE:
                self.search.tell(row, trial.value)
            elif trial.state == TrialState.FAIL and trial.user_attrs.get("status") == "failed":
                self.search.tell(row, None)
            elif trial.state == TrialState.FAIL and trial.user_attrs.get("status") == "duplicate":
                self.search.skip(row)
            elif trial.state == TrialState.RUNNING:
                pending.add(row)
        self.search.pending = pending


class _Exhausted(Exception):
    """Every candidate is measured or in flight."""


class OnlineStudy:
    """One dispatch's online search in an Optuna study: `ask` claims a row, `tell` records it.

    Stops (ask returns None) when the study holds `budget` measurements, when `deadline`
    (time.monotonic) passes, or when the last `patience` results did not beat the best by `margin`.
    """

    def __init__(
        self,
        storage: str,
        study_name: str,
        search: OnlineSearch,
        set_digest: str,
        budget: int,
        worker: str,
        session: str,
        *,
        deadline: float | None = None,
        margin: float = 0.01,
        patience: int = 0,
    ) -> None:
        self.search = search
        self.sampler = CandidateSampler(search)
        self.storage = open_storage(storage)
        self.study = optuna.create_study(
            storage=self.storage, study_name=study_name, direction="minimize",
            sampler=self.sampler, load_if_exists=True,
        )
        known = self.study.user_attrs.get("candidate_set")
        if known is None:
            self.study.set_user_attr("candidate_set", set_digest)
            self.study.set_user_attr("n_candidates", search.n_candidates)
        elif known != set_digest:
            raise DispatchTuneError(
                f"study {study_name!r} was made for another candidate set ({known}, here "
                f"{set_digest}): workers must run the same dispatchtune/IREE versions and target"
            )
        self.distribution = IntDistribution(0, search.n_candidates - 1)
        self.budget, self.deadline = budget, deadline
        self.margin, self.patience = margin, patience
        self.worker, self.session = worker, session
        self.open: dict[int, optuna.Trial] = {}  # trial number -> our in-flight trial
        self.stop_reason = ""
        self._lock = threading.Lock()
        self._beat_stop = threading.Event()
        self._close_own_stale_trials()
        self._beat = threading.Thread(target=self._heartbeats, daemon=True, name="dt-heartbeat")
        self._beat.start()

    # -- recovery ---------------------------------------------------------------------------------
    def _close_own_stale_trials(self) -> None:
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            attrs = trial.user_attrs
            if attrs.get("worker") == self.worker and attrs.get("session") != self.session:
                self._close(trial._trial_id, "released")
        optuna.storages.fail_stale_trials(self.study)

    def _close(self, trial_id: int, status: str, value: float | None = None) -> None:
        self.storage.set_trial_user_attr(trial_id, "status", status)
        if value is None:
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        else:
            self.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [value])

    def _heartbeats(self) -> None:
        while not self._beat_stop.wait(HEARTBEAT_S / 2):
            with self._lock:
                ids = [t._trial_id for t in self.open.values()]
            for trial_id in ids:
                # A trial finished since the snapshot refuses its heartbeat; nothing to do then.
                with contextlib.suppress(Exception):
                    self.storage.record_heartbeat(trial_id)

    # -- results known before the study (earlier logs) ----------------------------------------------
    def record_known(self, rows_times: dict[int, float | None]) -> int:
        """Add results measured outside the study (e.g. an earlier run's log); returns how many."""
        trials = self.study.get_trials(deepcopy=False)
        have = {_row(t) for t in trials if _is_measured(t)}
        added = 0
        for row, value in rows_times.items():
            if row in have:
                continue
            ok = value is not None
            self.study.add_trial(optuna.trial.create_trial(
                params={PARAM: row}, distributions={PARAM: self.distribution},
                value=value if ok else None,
                state=TrialState.COMPLETE if ok else TrialState.FAIL,
                user_attrs={"status": "ok" if ok else "failed", "worker": self.worker,
                            "session": "imported"},
            ))
            added += 1
        return added

    # -- ask / tell -------------------------------------------------------------------------------
    def measured(self) -> int:
        """Benchmarked results in the study plus candidates in flight (all workers)."""
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING))
        return sum(1 for t in trials if _row(t) is not None)

    def ask(self) -> tuple[int, int] | None:
        """Claim the next candidate: (trial number, row), or None when the search should stop."""
        while True:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.stop_reason = "time limit"
                return None
            if self.measured() >= self.budget:
                self.stop_reason = "budget"
                return None
            if self.patience and self.search.stalled(self.margin, self.patience):
                self.stop_reason = (f"no gain over {self.margin:.0%} in the last "
                                    f"{self.patience} results")
                return None
            trial = self.study.ask()
            trial.set_user_attr("worker", self.worker)
            trial.set_user_attr("session", self.session)
            try:
                row = int(trial.suggest_int(PARAM, 0, self.search.n_candidates - 1))
            except _Exhausted:
                self._close(trial._trial_id, "released")
                self.stop_reason = "space exhausted"
                return None
            verdict = self._claim(trial.number, row)
            if verdict == "won":
                with self._lock:
                    self.open[trial.number] = trial
                return trial.number, row
            self._close(trial._trial_id, verdict if verdict == "lost" else "released")
            if verdict == "over":
                self.stop_reason = "budget"
                return None

    def _claim(self, number: int, row: int, wait_s: float = 10.0) -> str:
        """`won`, `lost` (an earlier trial holds `row`) or `over` (the budget is taken by earlier trials).

        Decided on trial numbers alone, so every worker reaches the same verdict; waits briefly
        while an earlier trial has not stored its row yet.
        """
        give_up = time.monotonic() + wait_s
        while True:
            earlier = sorted((t for t in self.study.get_trials(deepcopy=False) if t.number < number),
                             key=lambda t: t.number)
            undecided = any(_row(t) is None and t.state == TrialState.RUNNING for t in earlier)
            if undecided and time.monotonic() < give_up:
                time.sleep(0.05)
                continue
            held: set[int] = set()
            counted = 0  # benchmarks (done or in flight) that earlier trials hold
            for other in earlier:
                other_row = _row(other)
                # Only the first trial holding a row counts; later ones lose their claim.
                if other_row is not None and _is_measured(other) and other_row not in held:
                    held.add(other_row)
                    counted += other.state in (TrialState.RUNNING, TrialState.COMPLETE)
            if row in held:
                return "lost"
            return "over" if counted >= self.budget else "won"

    def _finish(self, number: int, status: str, time_ms: float | None = None) -> int | None:
        """Close one of our open trials with `status`; returns its row (None if not open)."""
        with self._lock:
            trial = self.open.pop(number, None)
        if trial is None:
            return None
        self._close(trial._trial_id, status, time_ms)
        return int(trial.params[PARAM])

    def tell(self, number: int, time_ms: float | None) -> None:
        """Record a measured time (or None for a failed candidate) of an asked trial."""
        row = self._finish(number, "ok" if time_ms is not None else "failed", time_ms)
        if row is not None:
            self.search.tell(row, time_ms)

    def skip(self, number: int) -> None:
        """Close an asked candidate whose binary duplicates another's: not measured, not retried."""
        row = self._finish(number, "duplicate")
        if row is not None:
            self.search.skip(row)

    def release(self, number: int) -> None:
        """Give an asked candidate back unmeasured (its build was cancelled)."""
        row = self._finish(number, "released")
        if row is not None:
            self.search.release(row)

    def close(self) -> None:
        """Release every trial still open and stop the heartbeats."""
        for number in list(self.open):
            self.release(number)
        self._beat_stop.set()
        self._beat.join(timeout=1)
