"""Which devices a run benchmarks on, and through which runner: the one place `--devices` and
`--runner` are read.

An entry is an IREE device URI on this machine (`local-sync`, `hip://0`) or `RUNNER/URI` for a
device on another machine (`ssh://gpu1/hip://0`, `ssh://me@host:2222/local-sync`,
`cmd:docker exec -i box/local-task`); `--runner` is the runner of bare URIs. Each device is named
by its runner and URI in the results log, so the baselines and the candidates of two machines'
`hip://0` never mix.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from dispatchtune.errors import InputError
from dispatchtune.measure.remote import RemoteRunner, parse_transport
from dispatchtune.measure.runner import LocalRunner, unavailable_remedy
from dispatchtune.targets import Target

# local-sync, local-task, hip://0, cuda://1, vulkan, ...
_DEVICE_URI = re.compile(r"^[a-z][a-z0-9_-]*(://[A-Za-z0-9_.:-]*)?$")
_RUNNER_PREFIXES = ("ssh://", "cmd:")


@dataclass(frozen=True)
class DeviceSpec:
    """A device (IREE URI where it is) and its runner spec ("": this machine)."""

    uri: str
    runner: str = ""

    @property
    def name(self) -> str:
        """What the results log calls it: the URI, prefixed by the runner for a remote device."""
        return self.uri if not self.runner else f"{parse_transport(self.runner).label}/{self.uri}"


def split_entry(entry: str) -> tuple[str, str]:
    """`RUNNER/URI` -> (runner, uri); a bare URI -> ("", uri).

    The device is the shortest tail after a `/` that is a device URI, so runner specs may hold
    slashes themselves (`?identity=/keys/id`, `cmd:/usr/bin/docker exec -i box`).
    """
    if not entry.startswith(_RUNNER_PREFIXES):
        return "", entry
    for cut in (i for i in range(len(entry) - 1, -1, -1) if entry[i] == "/"):
        runner, uri = entry[:cut], entry[cut + 1:]
        if _DEVICE_URI.match(uri) and runner not in ("ssh:", "ssh:/"):
            return runner, uri
    raise InputError(
        f"device {entry!r}: a remote device is RUNNER/URI, e.g. ssh://gpu1/hip://0 or "
        "'cmd:docker exec -i box/local-sync'"
    )


def parse_devices(entries: Sequence[str], default_runner: str, default_uri: str) -> list[DeviceSpec]:
    """The run's devices: `entries` (default: the target's device) on their runners (default:
    `default_runner`, "" for this machine). Every runner spec is checked here."""
    specs: list[DeviceSpec] = []
    for entry in entries or (default_uri,):
        runner, uri = split_entry(entry.strip())
        if not uri:
            raise InputError("an empty device in --devices")
        spec = DeviceSpec(uri, runner or default_runner)
        if spec.runner:
            parse_transport(spec.runner)  # raises a one-line InputError for a bad spec
        if spec in specs:
            raise InputError(f"device {spec.name} is listed twice")
        specs.append(spec)
    return specs


def check_devices_here(
    specs: Sequence[DeviceSpec], target: Target, suggest_compile_only: bool = True
) -> None:
    """Refuse in one line, before anything is built, a run whose devices on this machine cannot
    run `target`'s code: a CPU that lacks the target's features, a GPU whose driver does not load
    (devices elsewhere are checked when `remote_runners` connects). `suggest_compile_only`: the
    command has `--compile-only` to suggest (`tune` does, `tune-model` does not)."""
    local = [spec for spec in specs if not spec.runner]
    if not local:
        return
    target.check_runs_here("use --target host" + (" or --compile-only" if suggest_compile_only else ""))
    for spec in local:
        LocalRunner().check_device(spec.uri, unavailable_remedy(suggest_compile_only))


@contextmanager
def remote_runners(
    specs: Sequence[DeviceSpec], connect: bool = True, suggest_compile_only: bool = True
) -> Iterator[Mapping[str, RemoteRunner]]:
    """One runner (one connection, one benchmark stream) per remote device, by device name;
    connected up front when `connect` (an unreachable host, a wrong runtime version or a device
    whose driver does not load there is one error before anything is compiled), closed at the
    end. `suggest_compile_only` as for `check_devices_here`."""
    runners = {s.name: RemoteRunner(parse_transport(s.runner)) for s in specs if s.runner}
    try:
        if connect:
            for spec in specs:
                if spec.runner:
                    runners[spec.name].connect()
                    runners[spec.name].check_device(spec.uri,
                                                    unavailable_remedy(suggest_compile_only))
        yield runners
    finally:
        for runner in runners.values():
            runner.close()
