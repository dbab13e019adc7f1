"""Progress of one dispatch's tuning: a tqdm bar on a terminal, else one stderr line per result."""

from __future__ import annotations

import sys

from dispatchtune.datasets.timing import estimate, speedup
from dispatchtune.measure.builder import (
    CompileOutcome,
)
from dispatchtune.tuner.dispatch import BenchResult


class Progress:
    """Progress of one dispatch: a tqdm bar on a terminal, else one stderr line per result."""

    def __init__(self, total: int, initial: int, desc: str, mode: str, estimator: str = "min") -> None:
        from tqdm import tqdm

        self.mode = mode  # bar | lines | off
        self.estimator = estimator
        self.total, self.done, self.desc = total, min(initial, total), desc
        self.bar = tqdm(
            total=total, initial=self.done, desc=desc, unit="bench",
            disable=mode != "bar", file=sys.stderr, dynamic_ncols=True, leave=True,
        )
        self.best = 0.0
        self.failures = 0

    def note_compile(self, status: str) -> None:
        if status != "duplicate":
            self.failures += 1
        self._postfix()

    def note_bench(self, bench: BenchResult) -> None:
        took_ms = estimate(bench.times_ms, self.estimator)
        ratio = speedup(estimate(bench.baseline_times_ms, self.estimator), took_ms)
        if bench.verify_status == "mismatch":
            ratio = float("nan")
        elif ratio == ratio:  # not NaN
            self.best = max(self.best, ratio)
        if bench.status != "ok":
            self.failures += 1
        self.done += 1
        self.bar.update(1)
        self._postfix()
        if self.mode == "lines":
            took = f"{took_ms:.3f} ms" if bench.times_ms else bench.status
            print(
                f"[{self.done}/{self.total}] {self.desc} candidate "
                f"{bench.compiled.candidate.candidate_id}: {took} {ratio:.3f}x "
                f"(verify {bench.verify_status}; best {self.best:.3f}x, failed {self.failures})",
                file=sys.stderr, flush=True,
            )

    def note_built(self, compiled: CompileOutcome) -> None:
        self.done += 1
        self.bar.update(1)
        self._postfix()
        if self.mode == "lines":
            print(
                f"[{self.done}/{self.total}] {self.desc} candidate "
                f"{compiled.candidate.candidate_id}: built in {compiled.compile_time_s:.2f} s "
                f"(failed {self.failures})",
                file=sys.stderr, flush=True,
            )

    def _postfix(self) -> None:
        self.bar.set_postfix(best=f"{self.best:.3f}x", failed=self.failures, refresh=False)

    def write(self, text: str) -> None:
        if self.mode != "off":
            self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
