"""A private PostgreSQL server for the tests: started from a pip-installed wheel, on 127.0.0.1 only.

The `pgserver` wheel (test extra) ships PostgreSQL's binaries; only those are used (`initdb`,
`postgres`), not its server manager, which keeps one shared server per user. Each call of
`private_postgres` makes a fresh cluster in a temporary directory, starts it on a free port bound to
127.0.0.1 with trust authentication (nothing else can reach it), yields a SQLAlchemy URL and
removes everything when done. PostgreSQL refuses to run as root, so as root it runs as `nobody`.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Seconds allowed for initdb, and for the server to accept connections (about 1.5 s here).
STARTUP_SECONDS = 60.0


def missing_reason() -> str | None:
    """Why no private server can run here (a missing package or user), or None."""
    for module, extra in (("pgserver", "pgserver (Python < 3.13)"), ("psycopg", "psycopg[binary]")):
        if importlib.util.find_spec(module) is None:
            return f"{extra} is not installed (pip install -e '.[test]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("nobody")
        except KeyError:
            return "running as root and there is no 'nobody' user to run PostgreSQL as"
    return None


def _bin_dir() -> Path:
    spec = importlib.util.find_spec("pgserver")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_as() -> dict[str, Any]:
    """subprocess arguments that drop root to `nobody` (PostgreSQL will not run as root)."""
    if os.geteuid() != 0:
        return {}
    user = pwd.getpwnam("nobody")
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def _own(path: Path, run_as: dict[str, Any]) -> None:
    if run_as:
        os.chown(path, run_as["user"], run_as["group"])


def _wait_until_ready(url: str, server: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            with psycopg.connect(url, connect_timeout=2) as connection:
                connection.execute("SELECT 1")
            return
        except psycopg.OperationalError:
            if server.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"PostgreSQL did not start (exit {server.poll()}):\n{tail}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def private_postgres() -> Iterator[str]:
    """Start a throwaway PostgreSQL server; yield its `postgresql+psycopg://` URL; stop and delete it.

    Raises RuntimeError if it cannot start (`missing_reason()` says when it cannot even try).
    """
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    bin_dir, run_as = _bin_dir(), _run_as()
    # Not pytest's tmp_path: root's is private (0700), and the server may run as another user.
    root = Path(tempfile.mkdtemp(prefix="dispatchtune-pg-"))
    server: subprocess.Popen[bytes] | None = None
    try:
        root.chmod(0o755)
        _own(root, run_as)
        data, log = root / "data", root / "server.log"
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
             "--encoding=UTF8", "--no-sync"],
            cwd=root, capture_output=True, check=True, timeout=STARTUP_SECONDS, **run_as,
        )
        port = _free_port()
        with log.open("wb") as log_file:
            _own(log, run_as)
            server = subprocess.Popen(
                # -h: TCP on loopback only; -k: the Unix socket in our own directory; -F: no
                # fsync (a test database need not survive a power cut).
                [str(bin_dir / "postgres"), "-D", str(data), "-h", "127.0.0.1", "-p", str(port),
                 "-k", str(root), "-F", "-c", "max_connections=200"],
                cwd=root, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, **run_as,
            )
        address = f"postgres@127.0.0.1:{port}/postgres"
        _wait_until_ready(f"postgresql://{address}", server, log)  # libpq's form for psycopg
        yield f"postgresql+psycopg://{address}"
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)  # "fast" shutdown: disconnects clients, no waiting
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(root, ignore_errors=True)
