"""Running built modules: the `Runner` interface and the local runner (this machine's devices).

A runner benchmarks a binary (`iree-benchmark-module`) and runs a function of it once to read its
outputs (`iree-run-module`). Dispatch tuning and whole-model tuning only see the `Runner`
interface, so a runner that measures on another machine can stand in for the local one.

Error policy: a runner never raises for the binary's failures; every call returns an outcome with
a status (`ok` | `failed` | `timeout` | `crashed`) and a one-line error. Callers for whom a failure
must abort (the compiler default, a whole model) raise from the outcome themselves.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from dispatchtune.errors import InputError
from dispatchtune.measure.builder import CpuSlots
from dispatchtune.measure.process import ProcessResult, run_process
from dispatchtune.measure.verify import Call, read_outputs
from dispatchtune.toolchain import tool_path

_UNIT_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}


@dataclass(frozen=True)
class Artifact:
    """A built module and the device (IREE URI) it runs on."""

    vmfb: Path
    device: str


@dataclass(frozen=True)
class BenchSettings:
    """How long and how often to benchmark; `timer`: wall clock (`real`) or process CPU time."""

    repetitions: int = 5
    min_time_s: float = 0.05
    timeout_s: float = 120.0
    timer: str = "real"


@dataclass(frozen=True)
class DispatchRow:
    """One dispatch function's time in one call of a benchmarked function (`--dispatch_statistics`)."""

    name: str
    time_ms: float
    calls: int


class BenchmarkReport(NamedTuple):
    """What `iree-benchmark-module --benchmark_format=json` reported."""

    times_ms: list[float]  # each repetition's time of one call
    dispatches: list[DispatchRow]  # per-dispatch rows, when asked for


@dataclass(frozen=True)
class BenchOutcome:
    """A benchmark's status and, when `ok`, each repetition's time (ms)."""

    status: str  # ok | failed | timeout | crashed
    error: str = ""
    times_ms: list[float] = field(default_factory=list)
    dispatches: list[DispatchRow] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class RunOutcome:
    """A single run's status and, when `ok`, the function's outputs."""

    status: str  # ok | failed | timeout | crashed
    error: str = ""
    outputs: list[np.ndarray] | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Runner(Protocol):
    """Benchmarks and runs built modules; never raises for a module's own failures."""

    def benchmark(
        self, artifact: Artifact, settings: BenchSettings, call: Call | None = None, *,
        dispatch_statistics: bool = False,
    ) -> BenchOutcome:
        """Time `call` (None: a dispatch benchmark module's own benchmark functions)."""
        ...

    def run(self, artifact: Artifact, call: Call, timeout_s: float) -> RunOutcome:
        """Run `call` once and read back its results."""
        ...

    def check_device(self, uri: str, remedy: str = "") -> None:
        """Raise a one-line `InputError` if the device's driver does not load where this runner
        runs (a GPU URI without its runtime library): checked before anything is built.
        `remedy` is what the command suggests instead (default: `unavailable_remedy()`)."""
        ...


#: Drivers every IREE runtime has on any machine: nothing to check.
_ALWAYS_THERE = ("local-sync", "local-task")


def list_devices_args(uri: str) -> list[str] | None:
    """`iree-run-module` arguments that load the driver of `uri` (None: nothing to check)."""
    driver = uri.split("://", 1)[0]
    return None if driver in _ALWAYS_THERE else [f"--list_devices={driver}"]


def unavailable_remedy(suggest_compile_only: bool = True) -> str:
    """What to do when a device here cannot run the target's code: benchmark on another machine,
    or (`suggest_compile_only`: a command that has `--compile-only`, `tune`) only build here.
    `tune-model` has no `--compile-only` (it needs the model measured): `tune` on the same model
    builds and checks its dispatches' candidates here."""
    elsewhere = "--runner ssh://HOST to benchmark on a machine that has it"
    if suggest_compile_only:
        return f"use --compile-only to build and check candidates here, or {elsewhere}"
    return (f"use {elsewhere}, or `dispatchtune tune` on the same model with --compile-only to "
            "build and check its dispatches' candidates here")


def check_listed(result: ProcessResult, uri: str, where: str, remedy: str = "") -> None:
    """Turn a failed `list_devices_args` run into the one-line refusal of `check_device`."""
    if result.ok:
        return
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines()]
    # IREE's status lines ("...: UNAVAILABLE; HIP runtime library ... not available") say why.
    reason = next((line.split("; ", 1)[-1].rstrip(": ") for code in ("UNAVAILABLE", "NOT_FOUND")
                   for line in lines if f"{code};" in line), result.error or "the driver did not load")
    raise InputError(f"device {uri} is not available {where} ({reason[:200]}); "
                     f"{remedy or unavailable_remedy()}")


def parse_benchmark_json(text: str, timer: str = "real") -> BenchmarkReport:
    """Repetition times (ms) and per-dispatch rows of `iree-benchmark-module` JSON output.

    A row with `calls` is a dispatch row (`--dispatch_statistics`): that dispatch function's
    device time per call of the benchmarked function; aggregates (mean, stddev) are skipped.
    """
    times: list[float] = []
    dispatches: list[DispatchRow] = []
    for row in json.loads(text).get("benchmarks", []):
        if row.get("run_type", "iteration") != "iteration":
            continue
        unit = _UNIT_MS[row.get("time_unit", "ns")]
        if "calls" in row:
            name = str(row["name"]).split("/", 1)[-1]
            dispatches.append(DispatchRow(name, float(row["real_time"]) * unit, int(row["calls"])))
        else:
            times.append(float(row["cpu_time" if timer == "cpu" else "real_time"]) * unit)
    return BenchmarkReport(times, dispatches)


def slots_for_device(device: str, slots: CpuSlots) -> int:
    """CPU slots a benchmark on `device` holds.

    A CPU benchmark holds them all: measured here, a compile running beside a `local-sync`
    benchmark on the other core made it 2x slower and the ranking noisy, so compiles pause for
    the ~0.5 s a CPU benchmark takes. A GPU benchmark needs one host thread; compiles go on.
    """
    return slots.total if device.startswith("local") else 1


def benchmark_args(
    vmfb: str, device: str, settings: BenchSettings, call: Call | None, dispatch_statistics: bool
) -> list[str]:
    """`iree-benchmark-module` arguments (after the tool) that time `call` on `device`."""
    args = [
        f"--module={vmfb}",
        f"--device={device}",
        f"--benchmark_repetitions={settings.repetitions}",
        f"--benchmark_min_time={settings.min_time_s:g}s",
        "--benchmark_format=json",
    ]
    # A dispatch benchmark function takes its batch size as an argument; one is one dispatch.
    args += ["--batch_size=1"] if call is None else [f"--function={call.function}", *call.inputs]
    if dispatch_statistics:
        args.append("--dispatch_statistics=true")
    return args


def run_args(vmfb: str, device: str, call: Call, outputs: Sequence[str]) -> list[str]:
    """`iree-run-module` arguments (after the tool) that run `call` once, results to `outputs`."""
    return [f"--module={vmfb}", f"--device={device}", f"--function={call.function}",
            *call.inputs, *(f"--output=@{p}" for p in outputs)]


def benchmark_outcome(
    result: ProcessResult, settings: BenchSettings, device: str, dispatch_statistics: bool
) -> BenchOutcome:
    """What a finished `iree-benchmark-module` run (here or on another machine) measured."""
    if not result.ok:
        return BenchOutcome(result.status, result.error)
    try:
        report = parse_benchmark_json(result.stdout, settings.timer)
    except (ValueError, KeyError) as exc:
        return BenchOutcome("failed", f"unreadable benchmark output: {exc}")
    if not report.times_ms:
        return BenchOutcome("failed", "benchmark reported no repetitions")
    if dispatch_statistics and not report.dispatches:
        return BenchOutcome(
            "failed",
            f"iree-benchmark-module gave no per-dispatch rows on {device}; "
            "--dispatch_statistics needs a backend with lightweight HAL profiling",
        )
    return BenchOutcome("ok", "", report.times_ms, report.dispatches)


class LocalRunner:
    """`iree-benchmark-module` / `iree-run-module` on this machine.

    `slots`, when given, are the cores shared with the compile workers (`builder.CpuSlots`).
    """

    def __init__(self, slots: CpuSlots | None = None) -> None:
        self.slots = slots

    def benchmark(
        self, artifact: Artifact, settings: BenchSettings, call: Call | None = None, *,
        dispatch_statistics: bool = False,
    ) -> BenchOutcome:
        command = [
            tool_path("iree-benchmark-module"),
            *benchmark_args(str(artifact.vmfb), artifact.device, settings, call, dispatch_statistics),
        ]
        held = (self.slots.hold(slots_for_device(artifact.device, self.slots))
                if self.slots is not None else contextlib.nullcontext())
        with held:
            result = run_process(command, settings.timeout_s)
        return benchmark_outcome(result, settings, artifact.device, dispatch_statistics)

    def check_device(self, uri: str, remedy: str = "") -> None:
        args = list_devices_args(uri)
        if args is not None:
            check_listed(run_process([tool_path("iree-run-module"), *args], 60.0), uri,
                         "on this machine", remedy)

    def run(self, artifact: Artifact, call: Call, timeout_s: float) -> RunOutcome:
        # Outputs go to raw files next to the binary and are gone once read.
        with tempfile.TemporaryDirectory(dir=artifact.vmfb.parent, prefix="outputs") as tmp:
            paths = [Path(tmp) / f"output{i}.bin" for i in range(len(call.results))]
            result = run_process(
                [tool_path("iree-run-module"),
                 *run_args(str(artifact.vmfb), artifact.device, call, [str(p) for p in paths])],
                timeout_s,
            )
            if not result.ok:
                return RunOutcome(result.status, result.error)
            outputs = read_outputs(paths, call.results)
        if outputs is None:
            return RunOutcome("failed", "no output")
        return RunOutcome("ok", "", outputs)
