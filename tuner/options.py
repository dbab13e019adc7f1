"""`TuneOptions`: the knobs of the dispatch tuning loop (the flags of `dispatchtune tune`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from dispatchtune.costmodel.rank import STATIC_ORDERS
from dispatchtune.datasets.timing import ESTIMATORS
from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.measure.devices import parse_devices
from dispatchtune.search import HEURISTIC_FILTERS
from dispatchtune.targets import Target

#: `--order` choices: the static orders of `rank`, and the online search.
TUNE_ORDERS: tuple[str, ...] = (*STATIC_ORDERS, "online")


def check_waves_per_eu(values: Sequence[int], target: Target) -> None:
    """Refuse `--waves-per-eu` on a target that is not an AMD GPU, naming the flag (`tune`,
    `rank`, `candidates`): the search below it only knows its `extra_knobs` argument."""
    if values and target.backend != "rocm":
        raise InputError(f"--waves-per-eu is an AMD GPU hint; {target.name} is not an AMD target")


@dataclass
class TuneOptions:
    """Knobs of the loop (the CLI flags of `dispatchtune tune`)."""

    budget: int = 20  # candidates benchmarked per dispatch (failures and duplicates are free)
    # heuristic | random | model (learned) | online (learns during the run); "": the target's
    # default (`costmodel.defaults.default_order`: model on a target that ships one)
    order: str = ""
    model_path: str | None = None  # learned model file for model/online (default: installed one)
    # Online search: Optuna storage URL (default: sqlite file study.db in the output directory),
    # a wall-clock limit per dispatch, and the no-improvement stop (0 = off).
    storage: str | None = None
    time_limit_s: float = 0.0
    stop_margin: float = 0.01
    stop_patience: int = 0
    # Devices to benchmark on, one stream each: IREE URIs here, or RUNNER/URI on another machine
    # (`measure.devices`); default: the target's device (local-sync for host).
    devices: tuple[str, ...] = ()
    runner: str = ""  # runner of bare device URIs: "" (this machine), ssh://host or cmd:PREFIX
    jobs: int = 0  # compile workers; 0 = one per core
    repetitions: int = 5
    min_time_s: float = 0.05
    baseline_every: int = 5  # re-measure the default config after this many benchmarks/device
    compile_timeout_s: float = 60.0
    benchmark_timeout_s: float = 120.0
    verify: bool = True
    check_applied: bool = True
    seed: int = 0
    max_attempts: int = 0  # candidates tried per dispatch; 0 = 4 x budget + 8
    # The best candidate enters the spec only above this speedup over the default: 2% is about
    # the run-to-run variation of a local-sync benchmark here, so smaller gains are not real.
    min_speedup: float = 1.02
    # At the end of a run that measured anything, the `confirm_top` best candidates are
    # re-measured in `confirm_rounds` rounds, each round benchmarking the default and then them
    # back to back; their speedups come from these paired measurements.
    confirm_top: int = 3
    confirm_rounds: int = 3
    keep_binaries: bool = False
    # Build and check candidates without running them (GPU targets on a machine without the GPU):
    # the budget then counts candidates built; no baseline runs, no verification, no spec.
    compile_only: bool = False
    estimator: str = "min"  # time of one measurement from its repetitions: min | median
    # Failed candidates are tried again by later runs when the failure may be transient (a
    # timeout, a crash, a full disk), up to datasets.records.MAX_ATTEMPTS; this retries all.
    retry_failed: bool = False
    # Online search: seconds without a heartbeat after which a worker's claim is taken back.
    lease_s: int = 30
    # The GPU space: True keeps the constraints IREE marks as heuristic filters, which the
    # default drops (its validity constraints stay); `waves_per_eu` values add LLVM's
    # amdgpu-waves-per-eu hint as a knob.
    heuristic_filters: bool = HEURISTIC_FILTERS
    waves_per_eu: tuple[int, ...] = ()
    progress: bool | None = None  # None: a bar on a terminal, else one line per result

    def for_target(self, target_name: str) -> TuneOptions:
        """These options with the order resolved for `target_name` (see `order`)."""
        from dispatchtune.costmodel.defaults import default_order

        return self if self.order else replace(self, order=default_order(target_name, self.model_path))

    def validate(self) -> None:
        if self.budget < 1:
            raise DispatchTuneError("--budget must be at least 1")
        if self.order and self.order not in TUNE_ORDERS:
            raise DispatchTuneError(f"--order must be one of {', '.join(TUNE_ORDERS)}")
        if self.repetitions < 1:
            raise DispatchTuneError("--repetitions must be at least 1")
        if self.baseline_every < 1:
            raise DispatchTuneError("--baseline-every must be at least 1")
        if self.estimator not in ESTIMATORS:
            raise DispatchTuneError(f"--estimator must be one of {', '.join(ESTIMATORS)}")
        if self.order == "online" and self.compile_only:
            raise DispatchTuneError("--order online learns from benchmarks; it cannot run --compile-only")
        if self.lease_s < 2:
            raise DispatchTuneError("--lease must be at least 2 seconds")
        parse_devices(self.devices, self.runner, "local-sync")  # one-line error for a bad entry
        if self.stop_patience < 0 or self.time_limit_s < 0:
            raise DispatchTuneError("--stop-patience and --time-limit must be >= 0")
