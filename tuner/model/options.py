"""The knobs of whole-model tuning (`dispatchtune tune-model` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatchtune.errors import DispatchTuneError
from dispatchtune.tuner.options import TuneOptions

TIMERS = ("auto", "cpu", "real")


@dataclass
class ModelTuneOptions:
    """Knobs of `tune-model` (its CLI flags); `dispatch` holds the dispatch loop's own knobs."""

    budget: int = 30  # candidates benchmarked in all, shared across the selected dispatches
    coverage: float = 0.9  # tune the slowest problems until they cover this share of the model
    # A cap on the problems tuned; high enough that coverage decides on CNNs, whose time spreads
    # over ~10 convolution shapes (ResNet-18 at batch 1: 10 keys for 96%).
    max_dispatches: int = 12
    # Below this share of the model a dispatch cannot pay back its tuning time: 2% of the model
    # at a typical 1.2x dispatch speedup is 0.3%, below the model's run-to-run noise here.
    min_share: float = 0.02
    min_per_dispatch: int = 2  # a dispatch gets at least this many benchmarks, or none
    top: int = 3  # candidates per dispatch tried in the whole model
    model_rounds: int = 5  # interleaved rounds per model-level decision
    # A close decision (`decide.judge` undecided) measures the best candidate `model_rounds` more
    # rounds at a time, up to this many in all; clear decisions cost `model_rounds` only.
    model_rounds_max: int = 15
    # Interleaved rounds of default vs tuned at the end: as many as reproduce_model.py pairs by
    # default, so the reported speedup is as precise as its check (7 read 1.001x on a spec the
    # 12-pair check put at 1.046x; a round of a 40 ms model costs well under a second).
    final_rounds: int = 12
    # A candidate is kept when its median paired model speedup beats this and a one-sided sign
    # test over the paired rounds says it is faster at `keep_alpha` (`decide.judge`).
    min_model_speedup: float = 1.01
    keep_alpha: float = 0.05
    repetitions: int = 5
    min_time_s: float = 0.05
    # Model time: `cpu` (process CPU time) or `real` (wall clock); `auto` = cpu on local-sync. A
    # local-sync run is one thread doing all the work, so its CPU time is the model's time minus
    # the time other processes held the core: measured here under load, the wall time of one
    # binary ranged 3.9-31.8 ms while its CPU time stayed within 2.9-4.0 ms.
    timer: str = "auto"
    function: str = ""  # entry function; default: the only public one (or `main`)
    inputs: str = ""  # .npz with one array per argument; default: seeded random inputs
    device: str = ""  # default: the target's (local-sync for host)
    verify: bool = True
    seed: int = 0
    compile_timeout_s: float = 600.0
    benchmark_timeout_s: float = 300.0
    keep_binaries: bool = False
    progress: bool | None = None  # None: bars on a terminal, else one line per step
    dispatch: TuneOptions = field(default_factory=TuneOptions)

    def validate(self) -> None:
        if self.budget < 1:
            raise DispatchTuneError("--budget must be at least 1")
        if not 0.0 < self.coverage <= 1.0:
            raise DispatchTuneError("--coverage must be in (0, 1]")
        if self.max_dispatches < 1:
            raise DispatchTuneError("--max-dispatches must be at least 1")
        if self.top < 1:
            raise DispatchTuneError("--top must be at least 1")
        if self.model_rounds < 1 or self.final_rounds < 1:
            raise DispatchTuneError("--model-rounds and --final-rounds must be at least 1")
        if not 0.0 < self.keep_alpha < 1.0:
            raise DispatchTuneError("keep_alpha must be in (0, 1)")
        if self.repetitions < 1:
            raise DispatchTuneError("--repetitions must be at least 1")
        if self.min_per_dispatch < 1:
            raise DispatchTuneError("--min-per-dispatch must be at least 1")
        if self.timer not in TIMERS:
            raise DispatchTuneError(f"--timer must be one of {', '.join(TIMERS)}")
        self.dispatch.validate()

