"""Benchmarking on another machine: the remote runner over a command transport (ssh or `cmd:`).

Compiling stays here; the device is elsewhere. A transport is any command whose stdin/stdout reach
a process on the other machine: `ssh://[user@]host[:port]` (the system `ssh`, BatchMode) or
`cmd:PREFIX` (e.g. `cmd:docker exec -i box`, a cluster launcher, or a local shell in tests), with
the agent's command line appended. Through it the runner starts `remote_agent.py` (shipped over
the same stream, so the other side needs only `pip install iree-base-runtime==<ours>`), checks its
runtime version, then sends one request per benchmark or run: the binary and inputs it has not
sent on this connection yet, and the tool's arguments; results stream back.

A dropped connection (transport died, stream cut, no reply in time) is not a candidate's failure:
the runner reconnects and redoes the request in flight, and the loop logs only what the runner
finally returns, so nothing is logged twice. When reconnecting keeps failing, or the other side
cannot run the tools at all, it raises a one-line `RemoteError`.

ssh options, by precedence: the URL query (`?identity=PATH&known_hosts=PATH&python=PATH`), then
`DISPATCHTUNE_SSH_IDENTITY`, `DISPATCHTUNE_SSH_KNOWN_HOSTS`, `DISPATCHTUNE_REMOTE_PYTHON` (also
for `cmd:`), and `DISPATCHTUNE_SSH_OPTIONS` (extra `ssh` arguments, shell-quoted); `~/.ssh/config`
applies as usual.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import select
import shlex
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.measure.process import ProcessResult, classify
from dispatchtune.measure.runner import (
    Artifact,
    BenchOutcome,
    BenchSettings,
    RunOutcome,
    benchmark_args,
    benchmark_outcome,
    check_listed,
    list_devices_args,
    run_args,
)
from dispatchtune.measure.verify import Call, numpy_dtype

logger = logging.getLogger(__name__)

AGENT = Path(__file__).with_name("remote_agent.py")
# Reads the agent's source (length-prefixed) from stdin and runs it as __main__: nothing is
# written on the other machine but the agent's scratch directory, removed when it exits.
BOOTSTRAP = ("import sys;b=sys.stdin.buffer;"
             "exec(compile(b.read(int(b.readline())),'remote_agent.py','exec'))")
_INPUT_FILE = re.compile(r"^(--input=[^@]*@)(.+)$")  # --input=TYPE=@PATH
_SSH_QUERY = ("identity", "known_hosts", "python")


class RemoteError(DispatchTuneError):
    """The other machine cannot be reached, or cannot run the IREE tools (one line)."""


class _Dropped(Exception):
    """The connection went away mid-request (redo it on a new one)."""


@cache
def runtime_version() -> str:
    """Our iree-base-runtime version: the other side must have the same one."""
    from importlib import metadata

    try:
        return metadata.version("iree-base-runtime")
    except metadata.PackageNotFoundError:  # pragma: no cover - a hard dependency
        return ""


# ---- transports -------------------------------------------------------------------------------
@dataclass(frozen=True)
class SshTransport:
    """`ssh [user@]host` with BatchMode and keep-alives; never asks for a password."""

    host: str
    user: str = ""
    port: int | None = None
    identity: str = ""
    known_hosts: str = ""
    python: str = ""
    connect_timeout_s: int = 10

    @property
    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{user}{host}{'' if self.port is None else f':{self.port}'}"

    def command(self, agent: list[str]) -> list[str]:
        command = ["ssh", "-T", "-o", "BatchMode=yes",
                   "-o", f"ConnectTimeout={self.connect_timeout_s}",
                   # A dead peer is noticed in ~15 s instead of the TCP timeout's minutes.
                   "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        if self.port is not None:
            command += ["-p", str(self.port)]
        identity = self.identity or os.environ.get("DISPATCHTUNE_SSH_IDENTITY", "")
        if identity:
            command += ["-i", identity, "-o", "IdentitiesOnly=yes"]
        known_hosts = self.known_hosts or os.environ.get("DISPATCHTUNE_SSH_KNOWN_HOSTS", "")
        if known_hosts:
            command += ["-o", f"UserKnownHostsFile={known_hosts}", "-o", "StrictHostKeyChecking=yes"]
        command += shlex.split(os.environ.get("DISPATCHTUNE_SSH_OPTIONS", ""))
        destination = f"{self.user}@{self.host}" if self.user else self.host
        # The remote side gets one command line for its shell.
        return [*command, destination, "--", shlex.join([self.interpreter, *agent])]

    @property
    def interpreter(self) -> str:
        return self.python or os.environ.get("DISPATCHTUNE_REMOTE_PYTHON", "") or "python3"


@dataclass(frozen=True)
class CommandTransport:
    """`PREFIX python3 -c ...`: the prefix runs its arguments on the other machine."""

    prefix: tuple[str, ...]

    @property
    def label(self) -> str:
        return "cmd:" + shlex.join(self.prefix)

    def command(self, agent: list[str]) -> list[str]:
        python = os.environ.get("DISPATCHTUNE_REMOTE_PYTHON", "") or "python3"
        return [*self.prefix, python, *agent]


Transport = SshTransport | CommandTransport


def parse_transport(spec: str) -> Transport:
    """`ssh://[user@]host[:port][?identity=..&known_hosts=..&python=..]` or `cmd:PREFIX`."""
    if spec.startswith("cmd:"):
        try:
            prefix = tuple(shlex.split(spec[4:]))
        except ValueError as exc:
            raise InputError(f"runner {spec!r}: {exc}") from None
        if not prefix:
            raise InputError("runner 'cmd:' needs a command prefix, e.g. 'cmd:docker exec -i box'")
        return CommandTransport(prefix)
    if not spec.startswith("ssh://"):
        raise InputError(f"unknown runner {spec!r}: use ssh://[user@]host[:port] or 'cmd:PREFIX'")
    parts = urlsplit(spec)
    try:
        port = parts.port
    except ValueError:
        raise InputError(f"runner {spec!r}: bad port") from None
    if not parts.hostname or parts.path not in ("", "/") or parts.password:
        raise InputError(f"runner {spec!r}: use ssh://[user@]host[:port][?identity=PATH]")
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    unknown = sorted(set(query) - set(_SSH_QUERY))
    if unknown:
        raise InputError(f"runner {spec!r}: unknown option {unknown[0]!r} (known: {', '.join(_SSH_QUERY)})")
    return SshTransport(
        host=parts.hostname, user=parts.username or "", port=port,
        identity=query.get("identity", ""), known_hosts=query.get("known_hosts", ""),
        python=query.get("python", ""),
    )


# ---- one connection ---------------------------------------------------------------------------
class _Connection:
    """A started agent: its process, a byte stream each way, and the files it already holds."""

    def __init__(self, command: list[str], expected_runtime: str, deadline_s: float) -> None:
        agent = AGENT.read_bytes()
        # ssh's own messages (e.g. "Connection refused") go to a file: read for the error line.
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by close()
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors,
            bufsize=0, start_new_session=True,
        )
        self.buffer = b""
        self.sent: dict[str, int] = {}  # name there -> size, oldest first
        try:
            self.send(str(len(agent)).encode() + b"\n" + agent)
            deadline = time.monotonic() + deadline_s
            hello = self.read_header(deadline, skip_text=True)
        except _Dropped as exc:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=2)  # its stderr is complete once it has exited
            reason = self.error_line() or str(exc)
            self.close()
            raise _Dropped(reason) from None
        if "error" in hello:
            self.close()
            raise RemoteError(str(hello["error"]))
        if hello.get("runtime") != expected_runtime:  # an agent of another protocol
            self.close()
            raise RemoteError(f"remote agent reports runtime {hello.get('runtime')}, need {expected_runtime}")

    def error_line(self) -> str:
        """The transport's last stderr line (why a connection failed)."""
        self.errors.seek(0)
        lines = [ln.strip() for ln in self.errors.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1] if lines else ""

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(data)
        except (BrokenPipeError, ConnectionResetError, ValueError) as exc:
            raise _Dropped(f"sending: {exc}") from None

    def _fill(self, deadline: float) -> None:
        assert self.proc.stdout is not None
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Dropped("no reply in time")
        ready, _, _ = select.select([self.proc.stdout], [], [], remaining)
        if not ready:
            raise _Dropped("no reply in time")
        chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
        if not chunk:
            raise _Dropped("connection closed")
        self.buffer += chunk

    def read_header(self, deadline: float, skip_text: bool = False) -> dict[str, Any]:
        """The next JSON line; with `skip_text`, lines before it that are not JSON (what a login
        script printed) are passed over."""
        while True:
            while b"\n" not in self.buffer:
                self._fill(deadline)
            line, _, self.buffer = self.buffer.partition(b"\n")
            try:
                header = json.loads(line)
            except ValueError:
                if skip_text:
                    logger.debug("before the agent: %r", line[:200])
                    continue
                raise _Dropped(f"unreadable reply: {line[:200]!r}") from None
            if not isinstance(header, dict):
                raise _Dropped("unreadable reply")
            return header

    def read_bytes(self, size: int, deadline: float) -> bytes:
        while len(self.buffer) < size:
            self._fill(deadline)
        data, self.buffer = self.buffer[:size], self.buffer[size:]
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()  # the agent exits at end of input
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.errors.close()


# ---- the runner -------------------------------------------------------------------------------
@dataclass
class TransportStats:
    """What the remote path cost: requests answered, their wall time here, the tools' own time
    there, and the bytes shipped; `overhead_s` is the difference (transport, agent, shipping)."""

    requests: int = 0
    wall_s: float = 0.0
    tool_s: float = 0.0
    sent_bytes: int = 0

    @property
    def overhead_s(self) -> float:
        return self.wall_s - self.tool_s


@dataclass(frozen=True)
class _Reply:
    result: ProcessResult
    outputs: list[bytes | None]


class RemoteRunner:
    """A `Runner` whose tools run on another machine, reached through `transport`.

    One connection per runner (one runner per device: one benchmark stream each), opened on first
    use or by `connect()`; a dropped one is reopened up to `retries` times per request.
    """

    def __init__(self, transport: Transport, retries: int = 3, connect_timeout_s: float = 60.0,
                 keep_bytes: int = 512 << 20) -> None:
        self.transport = transport
        self.keep_bytes = keep_bytes  # of shipped files the other side keeps for reuse
        self.retries = retries
        self.connect_timeout_s = connect_timeout_s
        self.reconnects = 0  # connections lost and reopened (for tests and reports)
        self.stats = TransportStats()
        self._connection: _Connection | None = None
        self._lock = threading.Lock()
        self._ids = 0
        self._digests: dict[tuple[str, int, int], str] = {}

    @property
    def label(self) -> str:
        return self.transport.label

    @property
    def pid(self) -> int | None:
        """The transport process of the open connection (the `ssh` client), if any."""
        return None if self._connection is None else self._connection.proc.pid

    def connect(self) -> None:
        """Open the connection now (raises `RemoteError` with the reason when it cannot)."""
        with self._lock:
            try:
                self._open()
            except _Dropped as exc:
                raise RemoteError(f"{self.label}: cannot start the agent: {exc}") from None

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _open(self) -> _Connection:
        if self._connection is None:
            command = self.transport.command(["-c", BOOTSTRAP, "--expect-runtime", runtime_version()])
            try:
                self._connection = _Connection(command, runtime_version(), self.connect_timeout_s)
            except RemoteError as exc:
                raise RemoteError(f"{self.label}: {exc}") from None
        return self._connection

    def _drop(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # -- requests -------------------------------------------------------------------------------
    def _request(self, tool: str, args: list[str], files: dict[str, Path], outputs: list[str],
                 timeout_s: float) -> _Reply:
        """Run `tool args` there, shipping `files` (name there -> path here) it lacks; redo the
        request on a new connection when the old one drops."""
        size = sum(path.stat().st_size for path in files.values())
        # The tool's own timeout runs there; this one notices a connection that went silent.
        deadline_s = timeout_s + 30.0 + size / 1e6
        last = ""
        start = time.perf_counter()
        with self._lock:
            for attempt in range(self.retries + 1):
                try:
                    connection = self._open()
                    self._ids += 1
                    missing = [(n, p.read_bytes()) for n, p in files.items() if n not in connection.sent]
                    header = {"id": self._ids, "tool": tool, "args": args, "timeout": timeout_s,
                              "files": [[n, len(d)] for n, d in missing], "outputs": outputs,
                              "drop": self._evict(connection, files, sum(len(d) for _, d in missing))}
                    connection.send(json.dumps(header).encode() + b"\n"
                                    + b"".join(d for _, d in missing))
                    connection.sent.update((n, len(d)) for n, d in missing)
                    self.stats.sent_bytes += sum(len(d) for _, d in missing)
                    deadline = time.monotonic() + deadline_s
                    reply = connection.read_header(deadline)
                    datas = [None if n < 0 else connection.read_bytes(int(n), deadline)
                             for n in reply.get("outputs", [])]
                except _Dropped as exc:
                    self._drop()
                    last = str(exc)
                    if attempt < self.retries:
                        self.reconnects += 1
                        logger.warning("%s: connection lost (%s); reconnecting and redoing the "
                                       "request (%d of %d)", self.label, last, attempt + 1, self.retries)
                        time.sleep(min(2.0 ** attempt, 10.0))
                    continue
                if "error" in reply:
                    raise RemoteError(f"{self.label}: {reply['error']}")
                result = _process_result(reply, timeout_s)
                self.stats.requests += 1
                self.stats.wall_s += time.perf_counter() - start
                self.stats.tool_s += result.elapsed_s
                return _Reply(result, datas)
        raise RemoteError(f"{self.label}: connection lost {self.retries + 1} times, last: {last}")

    def _evict(self, connection: _Connection, keep: dict[str, Path], incoming: int) -> list[str]:
        """Files the agent should delete so that it holds at most `self.keep_bytes`: the oldest
        ones first (a run ships every candidate's binary once; the baseline's and the inputs are
        sent again if they ever go)."""
        held = sum(connection.sent.values()) + incoming
        dropped = []
        for name in list(connection.sent):
            if held <= self.keep_bytes:
                break
            if name not in keep:
                held -= connection.sent.pop(name)
                dropped.append(name)
        return dropped

    def _ship(self, paths: dict[str, Path], path: Path) -> str:
        """The name there of a file here (content-addressed: each file crosses once)."""
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key not in self._digests:  # the same inputs go with every verification run
            self._digests[key] = hashlib.sha256(path.read_bytes()).hexdigest()[:32]
        name = f"f/{self._digests[key]}{path.suffix}"
        paths[name] = path
        return name

    def _inputs(self, call: Call, files: dict[str, Path]) -> Call:
        """`call` with its input files replaced by their names there."""
        flags = []
        for flag in call.inputs:
            found = _INPUT_FILE.match(flag)
            flags.append(flag if found is None else found[1] + self._ship(files, Path(found[2])))
        return Call(call.function, tuple(flags), call.results)

    def benchmark(
        self, artifact: Artifact, settings: BenchSettings, call: Call | None = None, *,
        dispatch_statistics: bool = False,
    ) -> BenchOutcome:
        if not artifact.vmfb.exists():
            return BenchOutcome("failed", f"no such module: {artifact.vmfb}")
        files: dict[str, Path] = {}
        module = self._ship(files, artifact.vmfb)
        there = None if call is None else self._inputs(call, files)
        args = benchmark_args(module, artifact.device, settings, there, dispatch_statistics)
        reply = self._request("iree-benchmark-module", args, files, [], settings.timeout_s)
        return benchmark_outcome(reply.result, settings, artifact.device, dispatch_statistics)

    def check_device(self, uri: str, remedy: str = "") -> None:
        args = list_devices_args(uri)
        if args is not None:
            reply = self._request("iree-run-module", args, {}, [], 60.0)
            check_listed(reply.result, uri, f"on {self.label}", remedy)

    def run(self, artifact: Artifact, call: Call, timeout_s: float) -> RunOutcome:
        if not artifact.vmfb.exists():  # as the local runner reports it, without a round trip
            return RunOutcome("failed", f"no such module: {artifact.vmfb}")
        files: dict[str, Path] = {}
        module = self._ship(files, artifact.vmfb)
        there = self._inputs(call, files)
        outputs = [f"out/output{i}.bin" for i in range(len(call.results))]
        reply = self._request("iree-run-module", run_args(module, artifact.device, there, outputs),
                              files, outputs, timeout_s)
        if not reply.result.ok:
            return RunOutcome(reply.result.status, reply.result.error)
        arrays = []
        for data, tensor in zip(reply.outputs, call.results, strict=True):
            dtype = numpy_dtype(tensor.element_type)
            if data is None or dtype is None or len(data) != int(np.prod(tensor.shape)) * dtype.itemsize:
                return RunOutcome("failed", "no output")
            arrays.append(np.frombuffer(data, dtype=dtype).reshape(tensor.shape).copy())
        return RunOutcome("ok", "", arrays)


def _process_result(reply: dict[str, Any], timeout_s: float) -> ProcessResult:
    """The agent's report of a tool run, as a local run would have been classified."""
    stdout, stderr = str(reply.get("stdout", "")), str(reply.get("stderr", ""))
    elapsed = float(reply.get("elapsed_s", 0.0))
    if reply.get("timed_out"):
        return ProcessResult("timeout", None, stdout, stderr, elapsed, f"timed out after {timeout_s:g} s")
    returncode = int(reply.get("returncode", 1))
    status, reason = classify(returncode, stderr)
    return ProcessResult(status, returncode, stdout, stderr, elapsed, reason)
