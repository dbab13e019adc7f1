"""Workers sharing one Optuna study on a real PostgreSQL server (started by `tests/pg.py`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna

from dispatchtune.search.optuna_search import PARAM as CANDIDATE_PARAM

MATMUL = Path(__file__).resolve().parent.parent / "examples" / "matmul_f32_512.mlir"


def _tune(out: Path, budget: int, storage: str, seed: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "dispatchtune", "tune", str(MATMUL), "--target", "host",
               "--order", "online", "--budget", str(budget), "--repetitions", "1",
               "--no-verify", "--confirm-top", "0", "--no-progress", "-j", "1",
               "--storage", storage, "--seed", str(seed), "--output-dir", str(out)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _benchmarked(out: Path) -> list[int]:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    return [r["candidate_id"] for r in rows
            if r["kind"] == "candidate" and r["bench_status"] != "skipped"]


def test_the_private_server_answers(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url.replace("+psycopg", "")) as connection:
        version = connection.execute("SHOW server_version").fetchone()
        address = connection.execute("SELECT inet_server_addr()").fetchone()
    assert version is not None and int(version[0].split(".")[0]) >= 14
    assert address is not None and str(address[0]) == "127.0.0.1"


def test_two_tune_workers_share_one_postgres_study(postgres_url: str, tmp_path: Path) -> None:
    """The README's `--storage postgresql://...`: two workers, none measures a candidate twice."""
    storage = postgres_url.replace("postgresql+psycopg://", "postgresql://")  # as users write it
    budget = 6
    procs = [_tune(tmp_path / f"w{i}", budget, storage, seed=i) for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-2000:]
        assert "Traceback" not in err
    ids = _benchmarked(tmp_path / "w0") + _benchmarked(tmp_path / "w1")
    assert len(ids) == len(set(ids)) == budget  # no candidate measured twice, none lost
    names = optuna.get_all_study_names(postgres_url)
    assert len(names) == 1
    study = optuna.load_study(study_name=names[0], storage=postgres_url)
    done = sorted(int(t.params[CANDIDATE_PARAM]) for t in study.trials
                  if t.state == optuna.trial.TrialState.COMPLETE)
    assert done == sorted(ids)  # every study result is in a worker's results.jsonl
