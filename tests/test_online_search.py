"""Online search: ask/tell semantics, learning beats a wrong prior, and workers sharing one study.

The last tests run the real tuning loop (`dispatchtune tune --order online`) on the CPU: two
worker processes on one SQLite study, and an interrupted-then-resumed run.
"""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import pytest

from dispatchtune.datasets.records import read_results
from dispatchtune.errors import InputError
from dispatchtune.search.online import STEPS, OnlineSearch, OnlineSettings, pair_sizes, replay
from dispatchtune.search.optuna_search import PARAM as CANDIDATE_PARAM
from dispatchtune.search.optuna_search import OnlineStudy

FIXTURE = Path(__file__).parent / "fixtures" / "tuner_matmul_f32_128.mlir"


def synthetic_space(n: int = 600, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    """A smooth 2-knob space: time is lowest near (tile=48, vec=6), plus a little noise."""
    rng = np.random.default_rng(seed)
    tile = rng.integers(1, 65, n).astype(float)
    vec = rng.integers(1, 17, n).astype(float)
    times = 1.0 + ((tile - 48) / 16) ** 2 + ((vec - 6) / 4) ** 2 + 0.01 * rng.random(n)
    return pd.DataFrame({"tile": tile, "vec": vec}), times


def first_hit(order: np.ndarray, times: np.ndarray, threshold: float = 0.05) -> int:
    hits = times[order] <= times.min() * (1 + threshold)
    return int(np.argmax(hits)) + 1 if hits.any() else len(times) + 1


def test_ask_never_repeats_and_follows_the_prior_first() -> None:
    features, times = synthetic_space(50)
    prior = -times  # a perfect prior
    search = OnlineSearch(features, prior, seed=1)
    first = search.ask(3)
    assert first == list(np.argsort(times)[:3])  # prior order until min_fit results
    assert search.ask(50 - 3) and search.ask(1) == []  # everything pending: nothing left to ask
    for row in range(50):
        search.tell(row, float(times[row]))
    assert search.n_told == 50 and search.best == pytest.approx(times.min())
    with pytest.raises(InputError):
        search.tell(50, 1.0)


def test_learning_overcomes_a_wrong_prior() -> None:
    features, times = synthetic_space()
    wrong = times.copy()  # prior ranks the slowest candidates first
    static = first_hit(np.argsort(-wrong, kind="stable"), times)
    online = [first_hit(replay(OnlineSearch(features, wrong, seed=s), times, 200), times)
              for s in range(5)]
    good = int((times <= times.min() * 1.05).sum())
    random_expected = (len(times) + 1) / (good + 1)
    assert static > 300
    # The run's own measurements override the prior: better than even a random order, and
    # several times better than following the prior.
    assert np.median(online) < random_expected, (online, random_expected)
    assert np.median(online) < static / 4, (online, static)


def deceptive_space() -> tuple[pd.DataFrame, np.ndarray]:
    """Shaped like the Kernel Tuner convolution space: shared memory on (`shmem=1`) is faster on
    average, but the only near-best candidates have it off, with one tile shape and a power-of-two
    block width."""
    grid = pd.MultiIndex.from_product(
        [range(16, 257, 16), [1, 2, 4, 8, 16], [1, 2, 3, 4], [0, 1]],
        names=["block_x", "block_y", "tile_y", "shmem"]).to_frame(index=False)
    rng = np.random.default_rng(3)
    pow2 = (grid["block_x"] & (grid["block_x"] - 1)) == 0
    times = np.where(grid["shmem"] == 1, 2.0, 3.0) + 0.3 * rng.random(len(grid))
    times += 0.2 * np.log2(grid["block_y"]) + 0.3 * (grid["tile_y"] != 4) + 0.5 * ~pow2
    best = (grid["shmem"] == 0) & (grid["tile_y"] == 4) & (grid["block_y"] == 1) & pow2
    times = np.where(best, 1.0 + 0.04 * rng.random(len(grid)), times)
    return grid, times


def test_local_steps_escape_a_deceptive_average() -> None:
    knobs, times = deceptive_space()
    flat = np.zeros(len(times))
    no_features = pd.DataFrame(index=knobs.index)

    def median_hits(settings: OnlineSettings) -> float:
        return float(np.median([
            first_hit(replay(OnlineSearch(no_features, flat, seed=s, settings=settings, knobs=knobs),
                             times, 300), times) for s in range(6)]))

    good = int((times <= times.min() * 1.05).sum())
    random_expected = (len(times) + 1) / (good + 1)
    with_local = median_hits(OnlineSettings())
    without = median_hits(OnlineSettings(local_every=0))
    assert with_local < without, (with_local, without)
    assert with_local < random_expected / 2, (with_local, random_expected)


def test_failures_are_learnt_and_skips_are_never_asked() -> None:
    features, times = synthetic_space(200)
    times[features["tile"] > 56] = np.inf  # a region that fails to compile
    search = OnlineSearch(features, np.zeros(200), seed=0,
                          settings=OnlineSettings(random_fraction=0.0))
    search.skip(5)
    order = replay(search, times, 200)
    assert 5 not in set(order.tolist())
    assert len(set(order.tolist())) == len(order)


def test_stalled_rule() -> None:
    features, times = synthetic_space(100)
    search = OnlineSearch(features, -times, seed=0)
    replay(search, times, 60)
    # The perfect prior found the best at once; nothing after it improved.
    assert search.stalled(margin=0.01, patience=30)
    assert not search.stalled(margin=0.01, patience=0)


def _worker(storage: str, worker: str, budget: int, out: str) -> None:
    features, times = synthetic_space(300)
    search = OnlineSearch(features, -features["tile"].to_numpy(), seed=hash(worker) % 1000)
    study = OnlineStudy(storage, "shared", search, "digest", budget, worker, session=worker)
    measured = []
    while (claim := study.ask()) is not None:
        number, row = claim
        study.tell(number, float(times[row]))
        measured.append(row)
    study.close()
    Path(out).write_text(json.dumps(measured))


def test_two_processes_share_one_study_without_repeats_or_losses(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    budget = 40
    ctx = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"w{i}.json" for i in range(2)]
    procs = [ctx.Process(target=_worker, args=(storage, f"w{i}", budget, str(outs[i])))
             for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    measured = [json.loads(o.read_text()) for o in outs]
    rows = measured[0] + measured[1]
    assert len(rows) == len(set(rows)) == budget  # none twice, none lost
    assert measured[0] and measured[1]  # both workers did work
    study = optuna.load_study(study_name="shared", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert sorted(int(t.params[CANDIDATE_PARAM]) for t in done) == sorted(rows)


def test_a_study_refuses_another_candidate_set(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    features, times = synthetic_space(20)
    OnlineStudy(storage, "s", OnlineSearch(features, -times), "one", 5, "w", "a").close()
    with pytest.raises(Exception, match="another candidate set"):
        OnlineStudy(storage, "s", OnlineSearch(features, -times), "two", 5, "w", "b")


# ---- the real loop ---------------------------------------------------------------------------
def _tune(out: Path, budget: int, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "dispatchtune", "tune", str(FIXTURE), "--target", "host",
               "--order", "online", "--budget", str(budget), "--repetitions", "1",
               "--no-verify", "--confirm-top", "0", "--no-progress", "-j", "1",
               "--output-dir", str(out), *extra]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _benchmarked(out: Path) -> list[int]:
    return [r.candidate_id for r in read_results(out / "results.jsonl")
            if r.is_candidate and r.bench_status != "skipped"]


def test_two_tune_workers_on_one_storage(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    budget = 6
    procs = [_tune(tmp_path / f"w{i}", budget, "--storage", storage, "--seed", str(i))
             for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    ids = _benchmarked(tmp_path / "w0") + _benchmarked(tmp_path / "w1")
    assert len(ids) == len(set(ids)) == budget  # no candidate measured twice, none lost
    names = optuna.get_all_study_names(storage)
    assert len(names) == 1
    study = optuna.load_study(study_name=names[0], storage=storage)
    done = sorted(int(t.params[CANDIDATE_PARAM]) for t in study.trials
                  if t.state == optuna.trial.TrialState.COMPLETE)
    assert done == sorted(ids)  # every study result is in a worker's results.jsonl


def test_online_run_resumes_without_remeasuring(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = _tune(out, 3)
    _, err = first.communicate(timeout=600)
    assert first.returncode == 0, err[-2000:]
    before = _benchmarked(out)
    assert len(before) == 3 and (out / "study.db").exists()
    second = _tune(out, 5)
    _, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-2000:]
    after = _benchmarked(out)
    assert after[:3] == before and len(after) == len(set(after)) == 5
    # Both runs logged the same enumeration, so the second imported the first's results.
    (digest,) = {r.space_digest for r in read_results(out / "results.jsonl")}
    assert len(digest) == 16


# ---- leases, budget, retries ---------------------------------------------------------------------
def _study(storage: str, worker: str, budget: int, **kwargs: Any) -> tuple[OnlineStudy, np.ndarray]:
    features, times = synthetic_space(40)
    search = OnlineSearch(features, -times, seed=0)  # a perfect prior: the same order for all
    return OnlineStudy(storage, "s", search, "digest", budget, worker, session=worker,
                       **kwargs), times


def test_a_dead_workers_fresh_claim_expires_while_the_other_runs_to_the_budget(
    tmp_path: Path,
) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    dead, _ = _study(storage, "dead", budget=3, lease_s=2)
    claim = dead.ask()
    assert claim is not None
    dead._beat_stop.set()  # killed at once: no heartbeat after the one written at the claim
    survivor, times = _study(storage, "survivor", budget=3, lease_s=2)
    start = time.monotonic()
    measured = []
    while (asked := survivor.ask()) is not None:
        number, row = asked
        survivor.tell(number, float(times[row]))
        measured.append(row)
    survivor.close()
    # The dead claim held a budget slot until its lease ran out; then its candidate (the best
    # by the prior) was measured by the survivor, which reached the full budget.
    assert survivor.stop_reason == "budget" and len(measured) == 3 and claim[1] in measured
    assert time.monotonic() - start >= 2
    trials = optuna.load_study(study_name="s", storage=storage).trials
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in trials) == 3
    assert not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]


def test_a_transient_failure_is_proposed_again_up_to_three_tries(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    tries = []
    for attempt in range(4):
        study, _ = _study(storage, f"w{attempt}", budget=1)
        number, row = study.ask() or (-1, -1)
        tries.append(row)
        study.tell(number, None, transient=True)
        study.close()
    # Three tries of the best candidate, then it counts as failed and the next one is asked.
    assert tries[:3] == [tries[0]] * 3 and tries[3] != tries[0]
    # A permanent failure is never asked again, unless a worker retries failures.
    study, _ = _study(storage, "perm", budget=1)
    number, row = study.ask() or (-1, -1)
    study.tell(number, None)
    study.close()
    again, _ = _study(storage, "again", budget=1)
    assert (again.ask() or (-1, -1))[1] not in (row, tries[0])
    again.close()
    forced, _ = _study(storage, "forced", budget=1, retry_failed=True)
    assert (forced.ask() or (-1, -1))[1] == tries[0]  # the best-prior candidate, failed before
    forced.close()


def test_a_result_that_missed_the_log_is_restored_from_the_study(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study, _ = _study(storage, "w", budget=2)
    number, _ = study.ask() or (-1, -1)
    study.tell(number, 1.5, record='{"compilation_info": "config-a", "candidate_id": 7}')
    study.close()  # killed before the log line: the study holds the record
    again, _ = _study(storage, "w", budget=2)
    assert again.unlogged(set()) == ['{"compilation_info": "config-a", "candidate_id": 7}']
    assert again.unlogged({"config-a"}) == []
    again.close()


def test_the_prior_that_predicts_the_run_gains_the_weight() -> None:
    # The given prior is wrong (slowest first); another opinion is right: the search measures
    # both, trusts the one that agrees with its own results and finds the best region early.
    features, times = synthetic_space()
    wrong, right = times.copy(), -times
    alone = [first_hit(replay(OnlineSearch(features, wrong, seed=s), times, 200), times)
             for s in range(4)]
    searches = [OnlineSearch(features, wrong, seed=s, priors={"right": right}) for s in range(4)]
    both = [first_hit(replay(search, times, 200), times) for search in searches]
    assert searches[0].prior_names == ["prior", "right"]
    weights = np.array([search.weights for search in searches])
    assert (weights[:, 1] > 0.5).all() and (weights[:, 0] < 0.1).all(), weights
    assert np.median(both) <= 4 < np.median(alone), (both, alone)


def test_a_confident_right_prior_keeps_the_initial_asks_a_wrong_one_is_challenged() -> None:
    # Before the first refit a confident given prior (one top candidate) asks its top three,
    # then another opinion challenges it; a challenger that loses gives the remaining initial
    # asks back, one that wins keeps its turns.
    features, times = synthetic_space()
    right, wrong = -times, times.copy()
    n = OnlineSettings().min_fit
    kept = OnlineSearch(features, right, seed=0, priors={"other": wrong})
    replay(kept, times, n)
    assert kept.steps[:n] == ["initial:prior"] * 3 + ["initial:other"] + ["initial:prior"] * 2
    challenged = OnlineSearch(features, wrong, seed=0, priors={"other": right})
    replay(challenged, times, n)
    assert challenged.steps[:n].count("initial:prior") == 4, challenged.steps[:n]
    # A prior whose top is a tie among many is not confident: challenged from the third ask.
    flat = OnlineSearch(features, np.round(-times / 4), seed=0, priors={"other": wrong})
    replay(flat, times, n)
    assert flat.steps[2] == "initial:other", flat.steps[:n]
    # The plain interleaving remains a setting.
    plain = OnlineSearch(features, right, seed=0, priors={"other": wrong},
                         settings=OnlineSettings(challenges=False))
    replay(plain, times, n)
    assert plain.steps[2:5] == ["initial:other", "initial:prior", "initial:random"]


def test_a_coarse_challengers_tie_is_broken_by_the_given_prior() -> None:
    # The challenger is a coarse opinion: it ties the right half of the space (the best and
    # hundreds of mediocre candidates). Its challenge is the member of that tie the given prior
    # ranks highest, not an arbitrary one; without the tie-break it is a draw from the tie.
    features, times = synthetic_space()
    given = -times + 0.5 * np.random.default_rng(1).standard_normal(times.size)
    coarse = (features["tile"] >= 32).to_numpy(dtype=float)
    tied = np.flatnonzero(coarse == 1)
    picks: list[int] = []
    drawn: list[int] = []
    expected: list[int] = []
    for seed in range(5):
        for settings, out in ((OnlineSettings(), picks), (OnlineSettings(tie_by_given=False), drawn)):
            search = OnlineSearch(features, given, seed=seed, priors={"coarse": coarse},
                                  settings=settings)
            order = replay(search, times, 4)
            turn = search.steps.index("initial:coarse")
            out.append(int(order[turn]))
        free = np.setdiff1d(tied, order[:turn])  # the given prior's own asks came first
        expected.append(int(free[np.argmax(given[free])]))
    assert picks == expected, (picks, expected)
    assert len(set(drawn)) > 1 and set(drawn) <= set(tied), drawn
    assert np.median(times[picks]) < np.median(times[drawn])


def test_evolutionary_steps_breed_near_the_best() -> None:
    knobs, times = deceptive_space()
    search = OnlineSearch(pd.DataFrame(index=knobs.index), np.zeros(len(times)), seed=0,
                          knobs=knobs,
                          settings=OnlineSettings(evolve_every=1, local_every=0, bandit=False))
    replay(search, times, 40)
    values = search.knob_values
    told = np.asarray(search._told)
    measured = told[np.isfinite(search.times[told])]
    # After the first refit every ask is a child: at most two knobs from one of its parents.
    for row in told[search.settings.min_fit + 5:]:
        before = measured[: int(np.flatnonzero(told == row)[0])]
        assert ((values[before] != values[row]).sum(axis=1) <= 3).any()


def test_every_step_after_the_first_refit_is_credited() -> None:
    # Each ask after the first refit is drawn from a step's record, and each result is credited
    # to the step that asked it (wins and losses fade, so their sum is below the asks).
    features, times = synthetic_space()
    search = OnlineSearch(features, times, seed=0)  # a prior ranking the slowest first
    replay(search, times, 80)
    later = search.steps[search.settings.min_fit:]
    assert set(search.steps[: search.settings.min_fit]) == {"initial:prior"}
    assert set(later) <= set(STEPS) and {"prior", "global"} <= set(later), later
    record = search._wins + search._losses
    assert 0 < record.sum() < len(later) and not search._asked_by


def test_bandit_and_fixed_cycle_both_escape_a_deceptive_average() -> None:
    knobs, times = deceptive_space()
    good = int((times <= times.min() * 1.05).sum())
    random_expected = (len(times) + 1) / (good + 1)
    for settings in (OnlineSettings(), OnlineSettings(bandit=False)):
        hits = [first_hit(replay(OnlineSearch(pd.DataFrame(index=knobs.index), np.zeros(len(times)),
                                              seed=s, settings=settings, knobs=knobs), times, 300),
                          times) for s in range(4)]
        assert np.median(hits) < random_expected / 2, (settings.bandit, hits, random_expected)


def test_pair_sizes_are_log2_products_of_size_knobs() -> None:
    knobs = pd.DataFrame({"bx": [16, 32, 64], "by": [1, 2, 8], "flag": [0, 1, 0]})
    pairs = pair_sizes(knobs)  # flags are not sizes: one pair, bx x by
    assert pairs.shape == (3, 1)
    np.testing.assert_allclose(pairs[:, 0], np.log2([16, 64, 512]))
    assert pair_sizes(knobs[["flag"]]).shape == (3, 0)
