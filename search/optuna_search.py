"""The online search inside an Optuna study: ask-and-tell, storage-backed, shared by many workers.

One study per dispatch. Each trial is one candidate (integer parameter `candidate` = row of the
enumerated candidate set); its value is the measured time in ms. `CandidateSampler` proposes rows
with `OnlineSearch` after syncing it with every trial in the storage, so measurements of all
workers (and of earlier, interrupted runs) steer the next proposal.

Several workers may ask at the same moment and be proposed the same row. The claim rule keeps a
candidate from being measured twice without any lock: after a trial's row is stored, the trial
with the lowest number holding that row wins; a trial that loses is closed as a lost claim and the
worker asks again. Trials numbers come from the storage, so every worker sees the same winner.

A claim is a lease. Its first heartbeat is written as soon as the trial exists (before its row is
chosen), and a thread renews it while the candidate is built and measured; a trial whose lease
ran out (`lease_s` without a heartbeat: its worker was killed, or lost the storage) is failed by
whichever worker asks next, so its candidate is proposed again while the others keep running.
The budget counts measured trials only: when measured + live claims reach it, a worker waits for
the claims to end or expire instead of stopping short. A worker restarted on its own output
directory also releases its earlier session's claims at once.

A result goes to the study before it goes to the results log (`tell`, with the whole record as a
trial attribute), so a kill between the two leaves the candidate measured in the study, never
proposed again; the same worker restarted on its output directory writes the missing log line
from the study (`unlogged`). Logging first would leave a window where the log holds the result
but the claim expires and another worker measures it a second time.

Failures that may be transient are closed as `transient` and proposed again, until a candidate
has `MAX_ATTEMPTS` of them (timeouts under a smaller compile timeout than this worker's do not
count); `retry_failed` makes every failure before this worker's start count as unmeasured.

Database calls have connect and statement timeouts (`open_storage`); a storage that fails
mid-run is `StorageLost`: one line, and the study and logs stay resumable.

Trial user attributes: `status` (`ok`, `failed`, `transient`, `duplicate`, `lost`, `released`;
none for an expired lease), `worker`, `session`, `record` (the result's JSON), `timeout_s`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from dispatchtune.datasets.records import MAX_ATTEMPTS
from dispatchtune.errors import DispatchTuneError, InputError, StorageLost
from dispatchtune.search.online import OnlineSearch

logger = logging.getLogger(__name__)

PARAM = "candidate"
# Ask-and-tell with heartbeats works (we beat for our own trials); Optuna's advice and its
# per-trial INFO lines are noise in a tuning run.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# Optuna's own warnings about database errors it retries are noise too: what fails in the end is
# reported once, as `StorageLost`.
optuna.logging.set_verbosity(optuna.logging.ERROR)
#: Default lease of a claim: a trial without a heartbeat for this long is failed by any worker.
LEASE_S = 30
#: Database timeouts: a server that accepts connections but never answers fails the run in
#: seconds instead of hanging it (and with it SIGTERM and Ctrl-C).
CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_S = 60
#: How often a worker that waits for other workers' claims looks at the study again.
POLL_S = 1.0
# Trials closed without a measurement; their candidates may be proposed again.
_UNMEASURED = ("lost", "released")


def default_storage(output_dir: Path) -> str:
    return f"sqlite:///{(output_dir / 'study.db').resolve()}"


def shown_url(url: str) -> str:
    """The URL without its password, for messages."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: say it as given
        return url


def _reason(exc: BaseException) -> str:
    """The driver's own first line: the database error behind Optuna's and SQLAlchemy's wrappers.

    After a lost connection SQLAlchemy's next error is about an unfinished transaction; the
    driver's error it was raised while handling says what happened.
    """
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    driver = [e.orig for e in chain if isinstance(e, DBAPIError) and e.orig is not None]
    inner = driver[-1] if driver else chain[-1]
    text = str(inner).strip().splitlines()
    return text[0] if text else type(inner).__name__


def engine_kwargs(url: str) -> dict[str, Any]:
    """SQLAlchemy engine arguments that bound every database call in time."""
    if url.startswith("sqlite:"):
        # Several processes on one SQLite file wait for each other's writes instead of failing.
        return {"connect_args": {"timeout": STATEMENT_TIMEOUT_S}}
    kwargs: dict[str, Any] = {"pool_timeout": CONNECT_TIMEOUT_S, "pool_pre_ping": True}
    if url.startswith("postgresql"):
        # libpq's parameters (psycopg 3 and psycopg2 alike).
        kwargs["connect_args"] = {
            "connect_timeout": CONNECT_TIMEOUT_S,
            "options": f"-c statement_timeout={STATEMENT_TIMEOUT_S * 1000}",
        }
    return kwargs


#: The PostgreSQL driver the `postgres` extra installs (psycopg 3) and its SQLAlchemy dialect name.
POSTGRES_DRIVER = "postgresql+psycopg"
_POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def resolve_storage_url(url: str) -> str:
    """A storage URL as SQLAlchemy should open it, with its driver checked.

    `postgresql://` and `postgres://` mean psycopg 3 (the `postgres` extra) whatever SQLAlchemy's
    default driver for them is (psycopg2 before 2.1), so one URL works on every host.
    """
    if not url.strip():
        raise InputError("--storage is empty")
    for scheme in _POSTGRES_SCHEMES:
        if url.startswith(scheme):
            url = f"{POSTGRES_DRIVER}://{url[len(scheme):]}"
    if url.startswith(f"{POSTGRES_DRIVER}://"):
        import importlib.util

        if importlib.util.find_spec("psycopg") is None:
            raise InputError("--storage postgresql://... needs the PostgreSQL driver psycopg 3: "
                             "pip install 'dispatchtune[postgres]'")
    return url


def open_storage(url: str, lease_s: int = LEASE_S) -> optuna.storages.RDBStorage:
    """An RDB storage with heartbeats (lease `lease_s`) and timeouts; a bad URL is one line."""
    url = resolve_storage_url(url)
    beat = max(1, lease_s // 5)
    for attempt in range(5):
        try:
            return optuna.storages.RDBStorage(
                url, engine_kwargs=engine_kwargs(url), heartbeat_interval=beat, grace_period=lease_s
            )
        except Exception as exc:  # sqlalchemy raises many types for bad URLs / missing drivers
            # Workers starting together race to create the schema; the loser retries once the
            # winner is done.
            racing = "UNIQUE constraint" in str(exc) or "already exists" in str(exc)
            if racing and attempt < 4:
                time.sleep(0.5 * (attempt + 1))
                continue
            # StorageLost, not InputError: no dispatch of the run can go on without its study.
            raise StorageLost(f"cannot open study storage {shown_url(url)!r}: {_reason(exc)}") from None
    raise AssertionError("unreachable")


def _row(trial: FrozenTrial) -> int | None:
    value = trial.params.get(PARAM)
    return None if value is None else int(value)


@dataclass(frozen=True)
class RetryRules:
    """Which failed trials still hold their candidate (see the module docstring)."""

    retry_below: int = 0  # failures of trials numbered below this are retried (--retry-failed)
    compile_timeout_s: float = 0.0  # timeouts under a smaller compile timeout are not counted

    def counts(self, trial: FrozenTrial) -> bool:
        """Whether a transient failure counts towards `MAX_ATTEMPTS`."""
        timeout = trial.user_attrs.get("timeout_s")
        return not (isinstance(timeout, (int, float)) and 0 < timeout < self.compile_timeout_s)


def settled(trials: Iterable[FrozenTrial], rules: RetryRules) -> dict[int, tuple[str, FrozenTrial]]:
    """Each held row's outcome and the trial that holds it (the lowest-numbered one).

    `ok` (measured), `failed` (for good, or out of attempts), `duplicate`, `running` (a live
    claim); rows of lost, released, expired or retriable trials are free.
    """
    held: dict[int, tuple[str, FrozenTrial]] = {}
    transient: Counter[int] = Counter()
    for trial in sorted(trials, key=lambda t: t.number):
        row = _row(trial)
        if row is None or row in held:
            continue
        status = trial.user_attrs.get("status")
        if trial.state == TrialState.RUNNING:
            held[row] = ("running", trial)
        elif trial.state == TrialState.COMPLETE:
            held[row] = ("ok", trial)
        elif trial.state != TrialState.FAIL:
            continue
        elif status == "duplicate":
            held[row] = ("duplicate", trial)
        elif status in ("failed", "transient") and trial.number >= rules.retry_below:
            transient[row] += status == "transient" and rules.counts(trial)
            if status == "failed" or transient[row] >= MAX_ATTEMPTS:
                held[row] = ("failed", trial)
    return held


class CandidateSampler(optuna.samplers.BaseSampler):
    """Proposes the `candidate` parameter from an `OnlineSearch` synced with the whole study."""

    def __init__(self, search: OnlineSearch, rules: RetryRules | None = None) -> None:
        self.search = search
        self.rules = rules or RetryRules()

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
        """Tell the search every settled result; live claims become pending."""
        pending: set[int] = set()
        for row, (outcome, trial) in settled(trials, self.rules).items():
            if outcome == "ok":
                self.search.tell(row, trial.value)
            elif outcome == "failed":
                self.search.tell(row, None)
            elif outcome == "duplicate":
                self.search.skip(row)
            else:
                pending.add(row)
        self.search.pending = pending


class _Exhausted(Exception):
    """Every candidate is measured or in flight."""


class OnlineStudy:
    """One dispatch's online search in an Optuna study: `ask` claims a row, `tell` records it.

    Stops (ask returns None with a `stop_reason`) when the study holds `budget` measurements,
    when `deadline` (time.monotonic) passes, or when the last `patience` results did not beat the
    best by `margin`. When measurements plus live claims fill the budget, `ask` waits for those
    claims, or returns None with an empty `stop_reason` while this worker holds some of them
    itself (they end only when it reports them; ask again after that).
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
        lease_s: int = LEASE_S,
        retry_failed: bool = False,
        compile_timeout_s: float = 0.0,
    ) -> None:
        self.url = storage
        self.search = search
        self.lease_s = lease_s
        self.storage = open_storage(storage, lease_s)
        self.sampler = CandidateSampler(search)
        self.budget, self.deadline = budget, deadline
        self.margin, self.patience = margin, patience
        self.worker, self.session = worker, session
        self.open: dict[int, optuna.Trial] = {}  # trial number -> our claimed trial
        self.stop_reason = ""
        self._lock = threading.Lock()
        self._beating: set[int] = set()  # trial ids whose lease this worker renews
        self._beat_stop = threading.Event()
        with self._guard():
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
            retry_below = 0
            if retry_failed:
                retry_below = len(self.study.get_trials(deepcopy=False))
            self.sampler.rules = RetryRules(retry_below, compile_timeout_s)
            self.distribution = IntDistribution(0, search.n_candidates - 1)
            self._close_own_stale_trials()
        self._beat = threading.Thread(target=self._heartbeats, daemon=True, name="dt-heartbeat")
        self._beat.start()

    @property
    def rules(self) -> RetryRules:
        return self.sampler.rules

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        """Storage failures become one `StorageLost` line (no chain of driver tracebacks)."""
        try:
            yield
        except (optuna.exceptions.StorageInternalError, SQLAlchemyError) as exc:
            raise StorageLost(f"lost the study storage at {shown_url(self.url)}: {_reason(exc)}") from None

    # -- leases -----------------------------------------------------------------------------------
    def _close_own_stale_trials(self) -> None:
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            attrs = trial.user_attrs
            if attrs.get("worker") == self.worker and attrs.get("session") != self.session:
                self._set_state(trial._trial_id, "released")
        self._expire()

    def _expire(self) -> None:
        """Fail every trial whose lease ran out, whichever worker holds it."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(self.study)
        # A worker killed between creating its trial and its first heartbeat leaves a trial that
        # no heartbeat will ever mark stale; its start time (the worker's clock) ends it instead.
        too_old = datetime.now() - timedelta(seconds=2 * self.lease_s)
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            if ("worker" not in trial.user_attrs and trial.datetime_start is not None
                    and trial.datetime_start < too_old):
                with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                    self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)

    def _heartbeats(self) -> None:
        interval = max(1, self.lease_s // 5)
        while not self._beat_stop.wait(interval):
            with self._lock:
                ids = list(self._beating)
            for trial_id in ids:
                # A trial finished since the snapshot refuses its heartbeat, and a lost storage
                # is reported by the main thread's next call; nothing to do here either way.
                with contextlib.suppress(Exception):
                    self.storage.record_heartbeat(trial_id)

    def _set_state(self, trial_id: int, status: str, value: float | None = None,
                   attrs: dict[str, Any] | None = None) -> None:
        for key, attr in (attrs or {}).items():
            self.storage.set_trial_user_attr(trial_id, key, attr)
        self.storage.set_trial_user_attr(trial_id, "status", status)
        if value is None:
            self.storage.set_trial_state_values(trial_id, TrialState.FAIL)
        else:
            self.storage.set_trial_state_values(trial_id, TrialState.COMPLETE, [value])

    # -- results known before the study (earlier logs) ----------------------------------------------
    def record_known(self, rows_times: dict[int, float | None]) -> int:
        """Add results measured outside the study (e.g. an earlier run's log); returns how many."""
        with self._guard():
            have = settled(self.study.get_trials(deepcopy=False), self.rules)
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

    def unlogged(self, logged: set[str]) -> list[str]:
        """Records (JSON) of this worker's results that reached the study but not its log.

        `logged`: the `compilation_info` of every candidate in the worker's log. Only a kill
        between telling the study and writing the log leaves such a result.
        """
        with self._guard():
            trials = self.study.get_trials(
                deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        found: list[str] = []
        for trial in trials:
            record = trial.user_attrs.get("record")
            if trial.user_attrs.get("worker") != self.worker or not isinstance(record, str):
                continue
            info = json.loads(record).get("compilation_info")
            if info not in logged:
                found.append(record)
        return found

    # -- ask / tell -------------------------------------------------------------------------------
    def ask(self) -> tuple[int, int] | None:
        """Claim the next candidate: (trial number, row), or None (see the class docstring)."""
        with self._guard():
            return self._ask()

    def _ask(self) -> tuple[int, int] | None:
        self.stop_reason = ""
        while True:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                self.stop_reason = "time limit"
                return None
            self._expire()
            held = settled(self.study.get_trials(deepcopy=False), self.rules)
            done = sum(1 for outcome, _ in held.values() if outcome == "ok")
            live = sum(1 for outcome, _ in held.values() if outcome == "running")
            if done >= self.budget:
                self.stop_reason = "budget"
                return None
            if self.patience and self.search.stalled(self.margin, self.patience):
                self.stop_reason = (f"no gain over {self.margin:.0%} in the last "
                                    f"{self.patience} results")
                return None
            if done + live >= self.budget:
                if self.open:
                    return None  # our own claims end when we report them: ask again then
                time.sleep(POLL_S)  # other workers' claims: they end, or their leases run out
                continue
            trial = self.study.ask()
            self.storage.record_heartbeat(trial._trial_id)  # the lease starts with the claim
            with self._lock:
                self._beating.add(trial._trial_id)
            trial.set_user_attr("worker", self.worker)
            trial.set_user_attr("session", self.session)
            try:
                row = int(trial.suggest_int(PARAM, 0, self.search.n_candidates - 1))
            except _Exhausted:
                self._drop(trial, "released")
                if self.open or live:
                    if self.open:
                        return None
                    time.sleep(POLL_S)
                    continue
                self.stop_reason = "space exhausted"
                return None
            verdict = self._claim(trial.number, row)
            if verdict == "won":
                with self._lock:
                    self.open[trial.number] = trial
                return trial.number, row
            # Lost to an earlier claim, or the budget is taken by earlier trials: look again.
            self._drop(trial, "lost" if verdict == "lost" else "released")

    def _drop(self, trial: optuna.Trial, status: str) -> None:
        with self._lock:
            self._beating.discard(trial._trial_id)
        with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
            self._set_state(trial._trial_id, status)

    def _claim(self, number: int, row: int) -> str:
        """`won`, `lost` (an earlier trial holds `row`) or `over` (the budget is taken by earlier trials).

        Decided on trial numbers alone, so every worker reaches the same verdict; waits while an
        earlier trial has not stored its row yet. Its worker stores the row after the search's
        `ask` (a model refit: seconds, more on a loaded machine), so a shorter wait could let
        both trials win the same row; a worker that died before storing it loses the trial to
        its lease (`_expire`), which bounds the wait.
        """
        give_up = time.monotonic() + 2 * self.lease_s + 10.0
        next_expiry = time.monotonic() + self.lease_s / 5
        while True:
            earlier = [t for t in self.study.get_trials(deepcopy=False) if t.number < number]
            undecided = any(_row(t) is None and t.state == TrialState.RUNNING for t in earlier)
            if undecided and time.monotonic() < give_up:
                if time.monotonic() >= next_expiry:
                    self._expire()
                    next_expiry = time.monotonic() + self.lease_s / 5
                time.sleep(0.05)
                continue
            held = settled(earlier, self.rules)
            if row in held:
                return "lost"
            counted = sum(1 for outcome, _ in held.values() if outcome in ("ok", "running"))
            return "over" if counted >= self.budget else "won"

    def _finish(self, number: int, status: str, time_ms: float | None = None,
                attrs: dict[str, Any] | None = None) -> int | None:
        """Close one of our open trials with `status`; returns its row (None if not open)."""
        with self._lock:
            trial = self.open.pop(number, None)
            if trial is not None:
                self._beating.discard(trial._trial_id)
        if trial is None:
            return None
        row = int(trial.params[PARAM])
        with self._guard():
            try:
                self._set_state(trial._trial_id, status, time_ms, attrs)
            except optuna.exceptions.UpdateFinishedTrialError:
                if status in _UNMEASURED:
                    return row
                # Our heartbeats stalled past the lease and another worker failed the claim;
                # the result is real, so it goes in as a trial of its own.
                logger.warning(
                    "the claim on candidate %d expired while it was measured (no heartbeat for "
                    "%d s); its result is kept, another worker may have measured it too",
                    row, self.lease_s)
                self.study.add_trial(optuna.trial.create_trial(
                    params={PARAM: row}, distributions={PARAM: self.distribution},
                    value=time_ms, state=TrialState.FAIL if time_ms is None else TrialState.COMPLETE,
                    user_attrs={**(attrs or {}), "status": status, "worker": self.worker,
                                "session": self.session},
                ))
        return row

    def tell(self, number: int, time_ms: float | None, *, transient: bool = False,
             record: str = "", timeout_s: float = 0.0) -> None:
        """Record a measured time (or None for a failed candidate) of an asked trial.

        `transient`: the failure may not recur (the candidate is proposed again, see
        `RetryRules`); `record`: the result's JSON, kept for `unlogged`; `timeout_s`: the
        compile timeout of a timed-out build.
        """
        status = "ok" if time_ms is not None else "transient" if transient else "failed"
        attrs: dict[str, Any] = {"record": record} if record else {}
        if timeout_s:
            attrs["timeout_s"] = timeout_s
        row = self._finish(number, status, time_ms, attrs)
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
        """Release every trial still open and stop the heartbeats (best effort: the storage may
        be gone, and then the leases expire)."""
        self._beat_stop.set()
        try:
            for number in list(self.open):
                self.release(number)
        except StorageLost as exc:
            # The run is ending on this very error (reported once, by the caller); the open
            # claims expire with their leases.
            logger.debug("%s", exc)
        self._beat.join(timeout=1)
