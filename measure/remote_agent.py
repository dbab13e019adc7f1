"""The benchmark agent a remote runner starts on the machine that has the device.

Self-contained on purpose: dispatchtune is not installed there, so this file is shipped as it is
(read from stdin by a one-line bootstrap, never written to disk) and needs only the standard
library and the IREE runtime tools of `pip install iree-base-runtime==<our version>`.

Protocol (binary, over the transport's stdin/stdout; all headers are one JSON line):

- on start the agent writes `{"agent": 1, "runtime": VERSION}` or `{"error": ONE_LINE}` and exits
  when the runtime is missing or its version differs from `--expect-runtime`;
- a request is a header `{"id", "tool", "args", "timeout", "files": [[name, size], ...],
  "outputs": [name, ...], "drop": [name, ...]}` followed by the files' bytes; names are relative
  to the agent's scratch directory, which is also the tool's working directory, so `args` refer
  to them as is; `drop` names files to delete first (the runner bounds what is kept there);
- the reply is a header `{"id", "returncode", "timed_out", "stdout", "stderr", "elapsed_s",
  "outputs": [size or -1, ...]}` followed by the outputs' bytes (read, then deleted).

The agent exits at end of input (the connection closed) and removes its scratch directory.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO

PROTOCOL = 1
TOOLS = ("iree-benchmark-module", "iree-run-module")
STDERR_TAIL = 4000  # characters of a tool's stderr sent back: enough for its error line


def runtime_version() -> str | None:
    """The installed iree-base-runtime version (None when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("iree-base-runtime")
    except metadata.PackageNotFoundError:
        return None


def find_tool(name: str) -> str | None:
    """The tool's binary inside the runtime wheel (no console-script start-up), else beside the
    interpreter, else on PATH."""
    try:
        from iree._runtime import libs  # type: ignore[import-not-found]

        inside = Path(libs.library_path) / name
        if inside.is_file() and os.access(inside, os.X_OK):
            return str(inside)
    except (ImportError, OSError, AttributeError):
        pass
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def _safe_name(scratch: Path, name: str) -> Path:
    """A request's file name as a path inside the scratch directory (never outside it)."""
    path = (scratch / name).resolve()
    if scratch not in path.parents:
        raise ValueError(f"file name outside the scratch directory: {name!r}")
    return path


def _read_exact(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError("input ended inside a file")
    return data


def _write(stream: BinaryIO, header: dict[str, Any], payload: bytes = b"") -> None:
    stream.write(json.dumps(header).encode() + b"\n" + payload)
    stream.flush()


def _run_tool(path: str, args: list[str], timeout: float, cwd: Path) -> dict[str, Any]:
    start = time.perf_counter()
    proc = subprocess.Popen(
        [path, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return {
        "returncode": None if timed_out else proc.returncode,
        "timed_out": timed_out,
        "stdout": stdout.decode(errors="replace"),
        "stderr": stderr.decode(errors="replace")[-STDERR_TAIL:],
        "elapsed_s": time.perf_counter() - start,
    }


def _serve_one(header: dict[str, Any], stdin: BinaryIO, scratch: Path, tools: dict[str, str]) -> tuple[
        dict[str, Any], bytes]:
    for name in header.get("drop", []):  # the runner's cache limit: files it will not reuse
        _safe_name(scratch, str(name)).unlink(missing_ok=True)
    # Files come first and are always consumed, so a refused request leaves the stream in step.
    for name, size in header.get("files", []):
        data = _read_exact(stdin, int(size))
        path = _safe_name(scratch, str(name))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    tool = str(header.get("tool", ""))
    if tool not in tools:
        return {"id": header.get("id"), "error": f"no {tool or 'tool'} on the remote side"}, b""
    outputs = [_safe_name(scratch, str(n)) for n in header.get("outputs", [])]
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    reply = _run_tool(tools[tool], [str(a) for a in header["args"]], float(header["timeout"]), scratch)
    sizes: list[int] = []
    payload = b""
    for path in outputs:
        if path.exists():
            data = path.read_bytes()
            path.unlink()
            sizes.append(len(data))
            payload += data
        else:
            sizes.append(-1)
    return {"id": header.get("id"), **reply, "outputs": sizes}, payload


def serve(stdin: BinaryIO, stdout: BinaryIO, expected_runtime: str) -> int:
    """Answer requests until the input ends; 3 when this side cannot run the tools."""
    version = runtime_version()
    if version is None or (expected_runtime and version != expected_runtime):
        have = f"iree-base-runtime {version}" if version else "no iree-base-runtime"
        _write(stdout, {"error": f"{have} for {sys.executable} on the remote side, need "
                                 f"{expected_runtime}: pip install iree-base-runtime=={expected_runtime}"})
        return 3
    tools = {name: path for name in TOOLS if (path := find_tool(name)) is not None}
    scratch = Path(tempfile.mkdtemp(prefix="dispatchtune-agent-")).resolve()
    try:
        _write(stdout, {"agent": PROTOCOL, "runtime": version})
        while line := stdin.readline():
            header = json.loads(line)
            try:
                reply, payload = _serve_one(header, stdin, scratch, tools)
            except (OSError, ValueError, KeyError) as exc:
                reply, payload = {"id": header.get("id"), "error": f"agent: {exc}"}, b""
            _write(stdout, reply, payload)
    except (EOFError, BrokenPipeError):
        pass  # the connection went away: the runner redoes what was in flight
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    expected = ""
    if len(argv) >= 2 and argv[0] == "--expect-runtime":
        expected = argv[1]
    # A hang-up or termination still removes the scratch directory (finally in serve()).
    for sig in (signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, lambda signum, frame: sys.exit(0))
    return serve(sys.stdin.buffer, sys.stdout.buffer, expected)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
