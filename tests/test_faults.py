"""Fault suite: workers killed with SIGKILL at random points, on SQLite and on PostgreSQL.

Three `dispatchtune tune --order online` workers share one study (a tiny matmul on the host, so
compiles take seconds); one is killed with SIGKILL at a random moment after its first claim
(while it builds, measures or logs). The survivors must take back its claims (leases) and reach
the budget; the killed worker, started again on its own output directory, writes any result that
reached the study but not its log. Then, from the study and
the three results logs: no candidate lost (every measurement of the study is in a log, no claim
left open, the budget reached), none measured twice.

Also: one output directory refuses a second worker; a database that accepts connections and
never answers fails within its timeout, in one line.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from dispatchtune.datasets.records import read_results
from dispatchtune.errors import InputError
from dispatchtune.search.optuna_search import PARAM as CANDIDATE_PARAM
from dispatchtune.tuner.loop import locked_output_dir

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"
BUDGET = 6
# Above the heartbeat stalls of three workers compiling on 2 loaded cores around SQLite's
# write lock: a live worker's claim expired in CI at 4 s once, and at 8 s once (2026-11-28,
# 4 claims expired for 2 kills), and its late result was measured twice (the documented stall
# case, not a kill's). Half the product's default lease (30 s).
LEASE_S = 15


def _worker(out: Path, storage: str, seed: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
               "--order", "online", "--budget", str(BUDGET), "--repetitions", "1",
               "--no-verify", "--confirm-top", "0", "--no-progress", "-j", "1",
               "--lease", str(LEASE_S), "--storage", storage, "--seed", str(seed),
               "--output-dir", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


#: What a worker says when its heartbeats stalled past the lease while it measured (search/
#: optuna_search.py): the one documented way a candidate is measured twice.
STALLED = "expired while it was measured"


def _finish(proc: subprocess.Popen[str]) -> int:
    """Wait for a worker; the number of its claims that expired while it measured them."""
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    return err.count(STALLED)


def kill_one_of_three(tmp_path: Path, storage: str, seed: int) -> dict[str, int]:
    """One run of the fault: three workers, one SIGKILLed at a random point; the figures."""
    rng = random.Random(seed)
    outs = [tmp_path / f"w{i}" for i in range(3)]
    procs = [_worker(out, storage, seed * 10 + i) for i, out in enumerate(outs)]
    victim = rng.randrange(3)
    # At a random moment after the victim's first claim: while it builds, measures or logs.
    _wait_for_claim(storage, outs[victim], procs[victim])
    time.sleep(rng.uniform(0.0, 6.0))
    killed = procs[victim].poll() is None
    if killed:
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait()
    stalled = sum(_finish(proc) for i, proc in enumerate(procs) if i != victim)
    # The killed worker started again on its own directory: it logs what only the study holds.
    stalled += _finish(_worker(outs[victim], storage, seed * 10 + victim))

    logged = Counter(r.candidate_id for out in outs for r in read_results(out / "results.jsonl")
                     if r.is_candidate and r.bench_status == "ok")
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).trials
    measured = {int(t.params[CANDIDATE_PARAM]) for t in trials
                if t.state == optuna.trial.TrialState.COMPLETE}
    running = [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    return {
        "kills": int(killed),
        # Claims taken back by lease (failed without a status): the kill left work to recover.
        "expired": sum(t.state == optuna.trial.TrialState.FAIL and "status" not in t.user_attrs
                       for t in trials),
        "measured": len(measured),
        "lost": len(measured - set(logged)) + len(running) + max(0, BUDGET - len(measured)),
        "twice": sum(n - 1 for n in logged.values()),
        # Live workers' stalls past the lease, each said on stderr (for the failure message).
        "stalled": stalled,
    }


def _wait_for_claim(storage: str, out: Path, proc: subprocess.Popen[str]) -> None:
    """Until the worker writing to `out` holds a claim (a running trial) in the study."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            names = optuna.get_all_study_names(storage)
        except Exception:  # the workers are creating the schema right now
            names = []
        if names:
            trials = optuna.load_study(study_name=names[0], storage=storage).get_trials(
                deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
            if any(str(t.user_attrs.get("worker", "")).endswith(str(out.resolve()))
                   for t in trials):
                return
        time.sleep(0.2)


def _run_suite(tmp_path: Path, storage_of: Iterator[str], runs: int, label: str) -> None:
    figures = Counter[str]()
    for run in range(runs):
        figures.update(kill_one_of_three(tmp_path / f"run{run}", next(storage_of), seed=run))
    print(f"{label}: runs {runs}, kills {figures['kills']}, claims expired "
          f"{figures['expired']}, measured {figures['measured']}, lost {figures['lost']}, "
          f"twice {figures['twice']}, stalled {figures['stalled']}")
    # No kill loses or doubles a measurement. `stalled` (a live worker said its claim expired
    # while it measured, docs/reliability.md) is in the message to tell a stall from a race.
    assert figures["lost"] == 0 and figures["twice"] == 0, dict(figures)
    assert figures["measured"] == runs * BUDGET


def test_kill_one_of_three_workers_on_sqlite(tmp_path: Path) -> None:
    def storages() -> Iterator[str]:
        for run in range(100):
            yield f"sqlite:///{tmp_path / f'study{run}.db'}"

    _run_suite(tmp_path, storages(), runs=2, label="sqlite")


def test_kill_one_of_three_workers_on_postgres(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    try:
        url = request.getfixturevalue("postgres_url")
    except pytest.FixtureLookupError:
        pytest.skip("no postgres_url fixture yet (tests/conftest.py, tests/pg.py: branch hostile)")

    def storages() -> Iterator[str]:
        import psycopg

        admin = url.replace("postgresql+psycopg://", "postgresql://")
        for run in range(100):
            with psycopg.connect(admin, autocommit=True) as connection:
                connection.execute(f"CREATE DATABASE faults_{run}")
            yield url.rsplit("/", 1)[0] + f"/faults_{run}"

    _run_suite(tmp_path, storages(), runs=1, label="postgres")


# ---- one output directory, one worker ------------------------------------------------------------
_HOLDER = """
import time
from pathlib import Path
from dispatchtune.tuner.loop import locked_output_dir
with locked_output_dir(Path({out!r})):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_an_output_directory_is_locked_to_one_worker(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER.format(out=str(out))],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(InputError) as refused, locked_output_dir(out):
            pass
        message = str(refused.value)
        assert message == (f"output directory {out} is in use by pid {holder.pid} on host "
                           f"{socket.gethostname()}")
        # Through the CLI: one line, exit 2, before any work.
        cli = subprocess.run([sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE),
                              "--target", "host", "--budget", "1", "-o", str(out)],
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 2 and cli.stderr.strip().count("\n") == 0, cli.stderr
        assert f"in use by pid {holder.pid}" in cli.stderr
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with locked_output_dir(out):  # a dead holder's lock is taken over
        assert (out / ".dispatchtune.lock").read_text().split()[0] == str(os.getpid())


# ---- a database that never answers ----------------------------------------------------------------
def _silent_server() -> tuple[socket.socket, int, list[socket.socket]]:
    """A TCP server on 127.0.0.1 that accepts connections and never sends a byte; the third
    value lists the connections accepted so far."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            accepted.append(connection)  # kept open, never answered

    threading.Thread(target=accept, daemon=True).start()
    return server, int(server.getsockname()[1]), accepted


def test_a_database_that_never_answers_fails_in_one_line_within_the_timeout(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed in this venv")
    from dispatchtune.search.optuna_search import CONNECT_TIMEOUT_S

    server, port, _ = _silent_server()
    try:
        start = time.monotonic()
        cli = subprocess.run(
            [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
             "--order", "online", "--budget", "1", "--no-progress",
             "--storage", f"postgresql+psycopg://u@127.0.0.1:{port}/db", "-o", str(tmp_path / "o")],
            capture_output=True, text=True, timeout=300)
        elapsed = time.monotonic() - start
    finally:
        server.close()
    lines = [line for line in cli.stderr.splitlines() if line.startswith("dispatchtune: error")]
    assert cli.returncode == 2 and len(lines) == 1, cli.stderr
    assert "Traceback" not in cli.stderr and f"127.0.0.1:{port}" in lines[0]
    assert elapsed < CONNECT_TIMEOUT_S * 3 + 60  # the connect timeout, plus start-up and enumeration


def test_sigterm_ends_a_run_blocked_on_a_silent_database(tmp_path: Path) -> None:
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed in this venv")
    server, port, accepted = _silent_server()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
             "--order", "online", "--budget", "1", "--no-progress",
             "--storage", f"postgresql+psycopg://u@127.0.0.1:{port}/db", "-o", str(tmp_path / "o")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        # SIGTERM once the worker waits for the database's first answer.
        while time.monotonic() < deadline and proc.poll() is None and not accepted:
            time.sleep(0.05)
        assert accepted and proc.poll() is None
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        server.close()
    assert time.monotonic() - sent < 5, "SIGTERM waited for the database"
    assert proc.returncode in (2, 130) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_postgres_stopped_mid_run_is_one_line_and_resumable(tmp_path: Path) -> None:
    pg = pytest.importorskip("pg", reason="tests/pg.py (the private PostgreSQL) is not here")
    if (reason := pg.missing_reason()) is not None:
        pytest.skip(reason)
    out = tmp_path / "w"
    with pg.private_postgres() as url:
        proc = _worker(out, url, seed=0)
        results = out / "results.jsonl"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if results.exists() and '"bench_status": "ok"' in results.read_text():
                break
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before the database could be stopped"
    # The server is stopped (and deleted) here, mid-run.
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    (line,) = lines
    print(line)
    assert line.startswith("dispatchtune: error: lost the study storage at postgresql+psycopg://")
    assert list(read_results(results))  # the log is intact: the run resumes from it
