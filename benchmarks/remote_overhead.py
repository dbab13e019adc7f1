"""What benchmarking through a remote runner costs per candidate, against the local runner.

Usage: python benchmarks/remote_overhead.py [--candidates 6] [--size 512]

Starts its own OpenSSH server on 127.0.0.1 (`local_sshd`, also the tests' fixture), builds
`--candidates` distinct binaries of a size^3 f32 matmul (distinct bytes, so each crosses the
connection like a new candidate's), and for each one, interleaved, times what the loop asks of a
runner per candidate (one benchmark + one verification run) locally, through `cmd:env` (the agent
over pipes: protocol + shipping cost) and through `ssh://127.0.0.1` (plus encryption and sshd).
Prints the median wall time per candidate, its difference to local (on a loaded machine mostly
the benchmarks' own noise), and the remote path's own time per candidate: wall time here minus
the tools' time there (`RemoteRunner.stats`), which that noise does not enter. Loopback, so a real
network adds its transfer time (binaries here are KBs, inputs cross once per connection).
"""

from __future__ import annotations

import argparse
import getpass
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SSHD_PATHS = "/usr/sbin:/sbin:/usr/local/sbin"


@dataclass(frozen=True)
class LocalSshd:
    """A running test sshd: the runner URL and the environment that lets `ssh` log in to it."""

    url: str
    env: dict[str, str]
    process: subprocess.Popen[bytes]


def sshd_path() -> str | None:
    """Absolute path of `sshd` (it must be started by absolute path), None when not installed."""
    return shutil.which("sshd", path=f"{os.environ.get('PATH', '')}:{SSHD_PATHS}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def local_sshd(directory: Path, python: str = sys.executable) -> Iterator[LocalSshd]:
    """An sshd on 127.0.0.1 with its own host key, user key and port, for the current user.

    `python` is the interpreter the agent runs with there (it needs iree-base-runtime).
    """
    sshd = sshd_path()
    if sshd is None:
        raise RuntimeError("sshd is not installed (apt-get install openssh-server)")
    directory.mkdir(parents=True, exist_ok=True)
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / key)],
                       check=True)
    (directory / "authorized_keys").write_text((directory / "user_key.pub").read_text())
    port = _free_port()
    host_key = (directory / "host_key.pub").read_text().split()
    (directory / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
    user = getpass.getuser()
    config = directory / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {directory / 'host_key'}",
        f"PidFile {directory / 'sshd.pid'}", f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        # Keys live in a temporary directory under /tmp, which StrictModes would refuse.
        "UsePAM no", "StrictModes no", "PermitRootLogin prohibit-password", f"AllowUsers {user}",
        "LogLevel ERROR", "",
    ]))
    if os.geteuid() == 0:
        # Privilege separation needs this directory; the package creates it only at service start.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = directory / "sshd.log"
    with log.open("wb") as errors:
        process = subprocess.Popen([sshd, "-D", "-e", "-f", str(config)], stderr=errors)
    try:
        deadline = time.monotonic() + 15
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"sshd exited: {log.read_text().strip()[-300:]}")
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("sshd did not listen within 15 s")
            time.sleep(0.05)
        env = {
            "DISPATCHTUNE_SSH_IDENTITY": str(directory / "user_key"),
            "DISPATCHTUNE_SSH_KNOWN_HOSTS": str(directory / "known_hosts"),
            "DISPATCHTUNE_SSH_OPTIONS": "-F /dev/null",  # the user's ~/.ssh/config stays out
            "DISPATCHTUNE_REMOTE_PYTHON": python,
        }
        yield LocalSshd(f"ssh://{user}@127.0.0.1:{port}", env, process)
    finally:
        process.terminate()
        process.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--size", type=int, default=512)
    args = parser.parse_args()

    from dispatchtune.measure.builder import compile_module
    from dispatchtune.measure.remote import RemoteRunner, TransportStats, parse_transport
    from dispatchtune.measure.runner import Artifact, BenchSettings, LocalRunner, Runner
    from dispatchtune.measure.verify import problem_call
    from dispatchtune.problem import Problem
    from dispatchtune.targets import get_target

    problem = Problem.matmul(args.size, args.size, args.size, "f32")
    with tempfile.TemporaryDirectory(prefix="remote-overhead") as tmp:
        work = Path(tmp)
        call = problem_call(problem, work / "inputs", seed=0)
        assert call is not None
        binaries = []
        for i in range(args.candidates):
            # An unused function makes each binary's bytes differ, as candidates' binaries do.
            source = work / f"c{i}.mlir"
            source.write_text(problem.to_mlir() + f"\nfunc.func @unused_{i}() {{\n  return\n}}\n")
            built = compile_module(source, get_target("host"), None, work / f"c{i}.vmfb", 300)
            assert built.ok, built.error
            binaries.append(work / f"c{i}.vmfb")
        with local_sshd(work / "sshd") as server:
            os.environ.update(server.env)
            runners: dict[str, Runner] = {"local": LocalRunner()}
            connect_s: dict[str, float] = {}
            for name, spec in (("cmd:env", "cmd:env"), ("ssh", server.url)):
                remote = RemoteRunner(parse_transport(spec))
                start = time.perf_counter()
                remote.connect()
                connect_s[name] = time.perf_counter() - start
                runners[name] = remote
            settings = BenchSettings(repetitions=5, min_time_s=0.05, timeout_s=120)
            # Inputs cross once per connection: send them before timing, as after a first candidate.
            for runner in runners.values():
                runner.run(Artifact(binaries[0], "local-sync"), call, 120)
                if isinstance(runner, RemoteRunner):
                    runner.stats = TransportStats()
            walls: dict[str, list[float]] = {name: [] for name in runners}
            for vmfb in binaries[1:]:
                for name, runner in runners.items():
                    start = time.perf_counter()
                    bench = runner.benchmark(Artifact(vmfb, "local-sync"), settings, call)
                    run = runner.run(Artifact(vmfb, "local-sync"), call, 120)
                    walls[name].append(time.perf_counter() - start)
                    assert bench.ok and run.ok, (bench.error, run.error)
            # Per candidate, the remote path's own cost: wall time here minus the tools' time
            # there (both requests), which the benchmark's run-to-run noise does not enter.
            overhead: dict[str, float] = {}
            for name, runner in runners.items():
                if isinstance(runner, RemoteRunner):
                    overhead[name] = runner.stats.overhead_s / runner.stats.requests * 2
                    runner.close()
        size_kb = statistics.median(b.stat().st_size for b in binaries) / 1024
    local = statistics.median(walls["local"])
    print(f"{args.size}^3 f32 matmul, {len(binaries) - 1} candidates, binary {size_kb:.0f} KB, "
          f"load average {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print("| runner | connect | wall per candidate (bench + run), median (min-max) | vs local | "
          "remote path's own time per candidate, mean (wall here - tools there) |")
    print("|---|---:|---:|---:|---:|")
    for name in runners:
        wall = statistics.median(walls[name])
        connect = f"{connect_s[name] * 1e3:.0f} ms" if name in connect_s else "-"
        own = f"{overhead[name] * 1e3:.1f} ms" if name in overhead else "-"
        print(f"| {name} | {connect} | {wall * 1e3:.1f} ms ({min(walls[name]) * 1e3:.1f}-"
              f"{max(walls[name]) * 1e3:.1f}) | {(wall - local) * 1e3:+.1f} ms | {own} |")


if __name__ == "__main__":
    main()
