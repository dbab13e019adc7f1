"""Remote runners for real: an OpenSSH server on 127.0.0.1 started here, the `cmd:` transport, the
agent's version check, a connection killed mid-batch, and the tuning loop through all of them."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatchtune.benchmarks.remote_overhead import LocalSshd, local_sshd, sshd_path
from dispatchtune.cli import main as cli_main
from dispatchtune.datasets.records import read_results
from dispatchtune.errors import InputError
from dispatchtune.measure import remote_agent
from dispatchtune.measure.builder import compile_module
from dispatchtune.measure.devices import DeviceSpec, parse_devices, split_entry
from dispatchtune.measure.remote import (
    CommandTransport,
    RemoteError,
    RemoteRunner,
    SshTransport,
    parse_transport,
)
from dispatchtune.measure.runner import Artifact, BenchSettings, LocalRunner, Runner
from dispatchtune.measure.verify import Call, compare, problem_call
from dispatchtune.problem import Problem
from dispatchtune.targets import get_target
from dispatchtune.tuner.loop import TuneOptions, tune

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "matmul_f32_512.mlir"
SMALL = ROOT / "tests" / "fixtures" / "tuner_matmul_f32_128.mlir"
PROBLEM = Problem.matmul(32, 16, 8, "f32")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSshd]:
    if sshd_path() is None:
        pytest.skip("sshd is not installed: `apt-get install openssh-server` (make test installs it "
                    "when run as root)")
    with local_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture
def remote_env(sshd: LocalSshd, monkeypatch: pytest.MonkeyPatch) -> LocalSshd:
    for key, value in sshd.env.items():
        monkeypatch.setenv(key, value)
    return sshd


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Artifact, Call]:
    directory = tmp_path_factory.mktemp("remote")
    source = directory / "f.mlir"
    source.write_text(PROBLEM.to_mlir())
    result = compile_module(source, get_target("host"), None, directory / "f.vmfb", 120)
    assert result.ok, result.error
    call = problem_call(PROBLEM, directory / "inputs", seed=1)
    assert call is not None
    return Artifact(directory / "f.vmfb", "local-sync"), call


# ---- parsing ----------------------------------------------------------------------------------
def test_device_entries_name_their_runner_and_their_device() -> None:
    assert split_entry("hip://0") == ("", "hip://0")
    assert split_entry("ssh://gpu1/hip://0") == ("ssh://gpu1", "hip://0")
    assert split_entry("ssh://me@host:2222/local-sync") == ("ssh://me@host:2222", "local-sync")
    assert split_entry("ssh://h?identity=/keys/id/cuda://1") == ("ssh://h?identity=/keys/id", "cuda://1")
    assert split_entry("cmd:/usr/bin/docker exec -i box/local-task") == (
        "cmd:/usr/bin/docker exec -i box", "local-task")
    for bad in ("ssh://gpu1", "cmd:env"):
        with pytest.raises(InputError, match="RUNNER/URI"):
            split_entry(bad)
    specs = parse_devices(["ssh://gpu1/hip://0", "ssh://gpu1/hip://1", "ssh://me@gpu2/cuda://0",
                           "hip://2"], "ssh://gpu3:2200", "hip://0")
    assert [s.name for s in specs] == ["ssh://gpu1/hip://0", "ssh://gpu1/hip://1",
                                       "ssh://me@gpu2/cuda://0", "ssh://gpu3:2200/hip://2"]
    assert parse_devices([], "", "local-sync") == [DeviceSpec("local-sync")]
    assert parse_devices([], "cmd:env", "local-sync") == [DeviceSpec("local-sync", "cmd:env")]
    with pytest.raises(InputError, match="twice"):
        parse_devices(["ssh://a/hip://0", "ssh://a/hip://0"], "", "hip://0")


def test_runner_specs_and_the_ssh_command() -> None:
    ssh = parse_transport("ssh://me@gpu-box:2222?identity=/k/id&known_hosts=/k/kh&python=/v/bin/python")
    assert ssh == SshTransport("gpu-box", "me", 2222, "/k/id", "/k/kh", "/v/bin/python")
    command = ssh.command(["-c", "pass"])
    joined = " ".join(command)
    for option in ("BatchMode=yes", "ConnectTimeout=", "ServerAliveInterval=", "-p 2222", "-i /k/id",
                   "UserKnownHostsFile=/k/kh", "StrictHostKeyChecking=yes"):
        assert option in joined
    assert command[-3:] == ["me@gpu-box", "--", "/v/bin/python -c pass"]
    assert parse_transport("cmd:docker exec -i box") == CommandTransport(("docker", "exec", "-i", "box"))
    for bad, reason in (("ftp://x", "unknown runner"), ("ssh://", "ssh://"), ("cmd:", "prefix"),
                        ("ssh://h?colour=1", "unknown option"), ("ssh://h:99999", "port")):
        with pytest.raises(InputError, match=reason):
            parse_transport(bad)


def test_the_agent_is_one_self_contained_file() -> None:
    """It is shipped as source: only the standard library and the IREE runtime wheel."""
    tree = ast.parse(Path(remote_agent.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {(node.module or "").split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert imported - {"__future__", "iree"} <= set(sys.stdlib_module_names)


def test_the_agent_refuses_another_runtime_version_in_one_line() -> None:
    done = subprocess.run([sys.executable, remote_agent.__file__, "--expect-runtime", "0.0.1"],
                          input=b"", capture_output=True, timeout=60)
    assert done.returncode == 3
    (line,) = done.stdout.decode().splitlines()
    error = json.loads(line)["error"]
    assert "pip install iree-base-runtime==0.0.1" in error and "3.13.0" in error


# ---- the runner contract over real transports -------------------------------------------------
@pytest.mark.parametrize("transport", ["cmd", "ssh"])
def test_remote_runners_keep_the_runner_contract(
    transport: str, built: tuple[Artifact, Call], request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    artifact, call = built
    if transport == "ssh":
        spec = request.getfixturevalue("remote_env").url
    else:
        monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
        spec = "cmd:env"
    remote = RemoteRunner(parse_transport(spec))
    runner: Runner = remote
    try:
        for timer in ("real", "cpu"):
            bench = runner.benchmark(artifact, BenchSettings(2, 0.01, 60, timer), call)
            assert bench.ok and len(bench.times_ms) == 2 and all(t > 0 for t in bench.times_ms)
        run = runner.run(artifact, call, 60)
        local = LocalRunner().run(artifact, call, 60)
        assert run.ok and run.outputs is not None and local.outputs is not None
        assert compare(run.outputs, local.outputs, ["f32"]) == ("ok", 0.0)
        settings = BenchSettings(2, 0.01, 60)
        missing = runner.benchmark(artifact, settings, Call("nope", call.inputs, call.results))
        assert missing.status == "failed" and "nope" in missing.error
        slow = runner.benchmark(artifact, BenchSettings(1000, 30.0, 0.5), call)
        assert slow.status == "timeout" and not slow.times_ms
        absent = runner.run(Artifact(artifact.vmfb.parent / "absent.vmfb", "local-sync"), call, 60)
        assert absent.status == "failed" and absent.outputs is None
        assert remote.reconnects == 0
        stats = remote.stats  # the remote path's own cost is measured, not guessed
        assert stats.requests == 5 and 0 < stats.tool_s < stats.wall_s and stats.sent_bytes > 0
    finally:
        remote.close()


def test_a_dropped_connection_is_redone_inside_the_runner(
    built: tuple[Artifact, Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transport process is killed between requests and during one: both come back ok."""
    artifact, call = built
    monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
    runner = RemoteRunner(parse_transport("cmd:env"))
    settings = BenchSettings(3, 0.2, 60)
    try:
        assert runner.benchmark(artifact, settings, call).ok
        assert runner.pid is not None
        os.kill(runner.pid, 9)
        assert runner.benchmark(artifact, settings, call).ok
        assert runner.reconnects == 1
        results: list[bool] = []
        worker = threading.Thread(target=lambda: results.append(runner.benchmark(artifact, settings,
                                                                                  call).ok))
        worker.start()
        time.sleep(0.3)  # inside the ~0.6 s benchmark
        assert runner.pid is not None
        os.kill(runner.pid, 9)
        worker.join(60)
        assert results == [True] and runner.reconnects == 2
    finally:
        runner.close()


def test_an_unreachable_host_is_one_line_before_anything_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCHTUNE_SSH_OPTIONS", "-F /dev/null")
    port = 1  # nothing listens there: refused at once
    code = cli_main(["tune", str(SMALL), "--runner", f"ssh://127.0.0.1:{port}", "-o", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and f"ssh://127.0.0.1:{port}" in err and "refused" in err
    assert not (tmp_path / "work").exists()
    for bad in (["--runner", "ftp://x"], ["--devices", "ssh://gpu1"]):
        assert cli_main(["tune", str(SMALL), *bad, "-o", str(tmp_path)]) == 2
        assert "\n" not in capsys.readouterr().err.strip()


# ---- the tuning loop through remote runners ---------------------------------------------------
def _tune_command(out: Path, runner: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dispatchtune", "tune", str(EXAMPLE), "--target", "host",
            "--budget", "3", "--runner", runner, "--no-progress", "-o", str(out), *extra]


def test_tune_through_ssh_end_to_end(tmp_path: Path, sshd: LocalSshd) -> None:
    out = tmp_path / "ssh"
    done = subprocess.run(_tune_command(out, sshd.url, "--confirm-top", "1"),
                          env={**os.environ, **sshd.env}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    device = sshd.url + "/local-sync"
    records = list(read_results(out / "results.jsonl"))
    candidates = [r for r in records if r.is_candidate]
    assert len(candidates) == 3
    assert all(r.device == device and r.bench_status == "ok" and r.verify_status == "ok"
               for r in candidates)
    assert {r.device for r in records if r.kind != "candidate"} == {device}
    assert "speedup" in done.stdout and (out / "tuning_spec.mlir").exists()


def test_tune_model_through_ssh_end_to_end(tmp_path: Path, sshd: LocalSshd) -> None:
    """`dispatchtune tune-model MODEL --runner ssh://... -o DIR`: the profile, the dispatch loop,
    the model steps and the final rounds all benchmark over ssh; the log names the remote device,
    and a rerun here on the same directory is refused (another device)."""
    model = ROOT / "examples" / "models" / "transformer_block_f32.mlir"
    out = tmp_path / "model"
    command = [sys.executable, "-m", "dispatchtune", "tune-model", str(model), "--target", "host",
               "--budget", "2", "--final-rounds", "3", "--runner", sshd.url, "--no-progress",
               "-o", str(out)]
    done = subprocess.run(command, env={**os.environ, **sshd.env}, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    device = sshd.url + "/local-sync"
    model_log = [json.loads(line) for line in (out / "model_log.jsonl").read_text().splitlines()]
    kinds = {r["kind"]: r for r in model_log}
    assert kinds["profile"]["device"] == device and kinds["profile"]["dispatches"]
    assert len(kinds["final"]["default_times_ms"]) == 3
    records = list(read_results(out / "dispatches" / "results.jsonl"))
    assert records and {r.device for r in records} == {device}
    assert any(r.is_candidate and r.bench_status == "ok" for r in records)
    assert "speedup" in done.stdout and (out / "tuning_spec.mlir").exists()
    here = subprocess.run([*command[:command.index("--runner")], "-o", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert here.returncode != 0 and "another device" in here.stderr, here.stderr[-2000:]
    assert here.stderr.count("\n") == 1


def test_tune_through_cmd_on_two_devices_each_with_its_own_baseline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
    devices = ("cmd:env/local-sync", "cmd:env/local-task")
    options = TuneOptions(budget=4, devices=devices, repetitions=2, baseline_every=2, confirm_top=0,
                          progress=False)
    tune(SMALL, "host", tmp_path, options)
    records = list(read_results(tmp_path / "results.jsonl"))
    baselines = {d: [r.times_ms for r in records if r.kind == "baseline" and r.device == d]
                 for d in devices}
    assert all(baselines.values())
    candidates = [r for r in records if r.is_candidate]
    assert len(candidates) == 4 and {r.device for r in candidates} <= set(devices)
    for record in candidates:
        # normalised by a baseline of its own device, never by the other device's
        other = next(d for d in devices if d != record.device)
        assert record.baseline_times_ms in baselines[record.device]
        assert record.baseline_times_ms not in baselines[other]


def _children(pid: int, name: str) -> list[int]:
    """Processes called `name` whose parent is `pid` (from /proc/PID/stat: "pid (comm) state ppid")."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text.split("(", 1)[1].rsplit(")", 1)[0]
        if comm == name and int(text.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _remote_benchmark_running() -> bool:
    """An iree-benchmark-module that the agent started (its working directory is the agent's)."""
    for cwd in Path("/proc").glob("[0-9]*/cwd"):
        try:
            comm = (cwd.parent / "comm").read_text().strip()
            if comm.startswith("iree-benchmark") and "dispatchtune-agent-" in os.readlink(cwd):
                return True
        except OSError:
            continue
    return False


def test_killing_the_connection_mid_batch_logs_nothing_twice(tmp_path: Path, sshd: LocalSshd) -> None:
    out = tmp_path / "killed"
    proc = subprocess.Popen(_tune_command(out, sshd.url, "--confirm-top", "0"),
                            env={**os.environ, **sshd.env}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    killed = 0
    deadline = time.monotonic() + 400
    results = out / "results.jsonl"
    while proc.poll() is None and time.monotonic() < deadline and not killed:
        logged = results.read_text().count('"kind": "candidate"') if results.exists() else 0
        if logged >= 1 and _remote_benchmark_running():
            for pid in _children(proc.pid, "ssh"):  # the runner's ssh client, mid-benchmark
                os.kill(pid, 9)
                killed += 1
        time.sleep(0.02)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    assert killed == 1, "the run ended before its connection could be killed"
    assert "connection lost" in stderr and "redoing" in stderr
    candidates = [r for r in read_results(results) if r.is_candidate]
    counts = Counter(r.compilation_info for r in candidates)
    assert len(candidates) == 3 and max(counts.values()) == 1
    assert all(r.bench_status == "ok" for r in candidates)
    assert "benchmarked 3" in stdout


def _has_runtime(python: str) -> bool:
    probe = "import importlib.metadata as m; m.version('iree-base-runtime')"
    try:
        return subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode == 0
    except OSError:
        return True  # no such interpreter: nothing to show either


def test_a_remote_side_that_cannot_run_the_tools_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python there without our iree-base-runtime, or no such Python: refused at connect."""
    for python, reason in ((sys.executable, ""), ("/usr/bin/python3", "pip install iree-base-runtime=="),
                           ("/nonexistent/python3", "No such file")):
        monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", python)
        runner = RemoteRunner(parse_transport("cmd:env"))
        try:
            if not reason:
                runner.connect()  # ours has it
                continue
            if python == "/usr/bin/python3" and _has_runtime(python):
                continue  # a system Python that has it cannot show the refusal
            with pytest.raises(RemoteError, match=reason) as raised:
                runner.connect()
            assert "\n" not in str(raised.value) and str(raised.value).startswith("cmd:env: ")
        finally:
            runner.close()


def test_the_other_side_keeps_a_bounded_set_of_files(
    built: tuple[Artifact, Call], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beyond `keep_bytes` the oldest files are deleted there; one needed again is sent again."""
    artifact, call = built
    other = tmp_path / "g.vmfb"
    (tmp_path / "g.mlir").write_text(PROBLEM.to_mlir() + "\nfunc.func @unused() {\n  return\n}\n")
    assert compile_module(tmp_path / "g.mlir", get_target("host"), None, other, 120).ok
    monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
    runner = RemoteRunner(parse_transport("cmd:env"), keep_bytes=1)
    settings = BenchSettings(1, 0.01, 60)
    try:
        for vmfb in (artifact.vmfb, other, artifact.vmfb):
            assert runner.benchmark(Artifact(vmfb, "local-sync"), settings, call).ok
            connection = runner._connection
            assert connection is not None
            # only what the last request used is held there: its binary and its inputs
            assert len(connection.sent) == 1 + len(call.inputs)
            assert any(name.endswith(".vmfb") for name in connection.sent)
        assert runner.reconnects == 0
    finally:
        runner.close()


def test_what_a_login_script_prints_before_the_agent_is_passed_over(
    built: tuple[Artifact, Call], monkeypatch: pytest.MonkeyPatch
) -> None:
    artifact, call = built
    monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
    runner = RemoteRunner(parse_transport("""cmd:sh -c 'echo Welcome to the cluster; exec "$0" "$@"'"""))
    try:
        assert runner.benchmark(artifact, BenchSettings(1, 0.01, 60), call).ok
    finally:
        runner.close()


def test_a_device_whose_driver_does_not_load_there_is_refused_at_connect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A GPU URI on a remote side without its runtime library: one line before anything is built,
    not a failed baseline per dispatch."""
    from dispatchtune.measure.process import run_process
    from dispatchtune.toolchain import tool_path

    if run_process([tool_path("iree-run-module"), "--list_devices=hip"], 60.0).ok:
        pytest.skip("this machine has a HIP runtime: the refusal cannot be shown")
    monkeypatch.setenv("DISPATCHTUNE_REMOTE_PYTHON", sys.executable)
    runner = RemoteRunner(parse_transport("cmd:env"))
    try:
        runner.connect()
        runner.check_device("local-sync")  # always there
        with pytest.raises(InputError, match=r"device hip://0 is not available on cmd:env \(HIP"):
            runner.check_device("hip://0")
    finally:
        runner.close()
