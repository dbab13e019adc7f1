"""Hostile but realistic input at the command line (issue #18, items 7-9), each run as a subprocess.

Every case must end with exactly one line on stderr and a non-zero exit status, never a traceback,
and must not touch files it was not asked to write.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dispatchtune.errors import InputError
from dispatchtune.toolchain import path_arg, run_tool

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ROOT / "examples" / "matmul_f32_512.mlir"
SMALL_MATMUL = ROOT / "tests" / "fixtures" / "tuner_matmul_f32_128.mlir"
LOG = ROOT / "tests" / "fixtures" / "cpu_results_matmul_256x384x256.jsonl"
QUICK_TUNE = ("--budget", "1", "--confirm-top", "0", "--no-verify", "--no-progress")
TRAIN_COSTMODEL = ("import sys; from dispatchtune.cli import train_costmodel_main; "
                   "sys.exit(train_costmodel_main())")


def run_cli(cwd: Path, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`dispatchtune ARGV` (or `train-costmodel ARGV[1:]`) in `cwd`, as a user runs it."""
    if argv[0] == "train-costmodel":
        command = [sys.executable, "-c", TRAIN_COSTMODEL, *argv[1:]]
    else:
        command = [sys.executable, "-m", "dispatchtune", *argv]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False)


def one_error_line(done: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The single stderr line of a failed run, checked to contain every fragment."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


# ---- item 7: a file name starting with '-' never reaches a tool as an option --------------------
def test_inspect_of_a_dash_file_does_not_write_the_file_its_name_names(tmp_path: Path) -> None:
    shutil.copy(MATMUL, tmp_path / "-o=victim.txt")
    (tmp_path / "precious.txt").write_text("keep me\n")
    shutil.copy(MATMUL, tmp_path / "-o=precious.txt")
    for name in ("./-o=victim.txt", "./-o=precious.txt"):
        done = run_cli(tmp_path, "inspect", name)
        assert done.returncode == 0, done.stderr
        assert "kind:    contraction" in done.stdout
    assert not (tmp_path / "victim.txt").exists()
    assert (tmp_path / "precious.txt").read_text() == "keep me\n"


def test_run_tool_refuses_an_existing_file_that_looks_like_an_option(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth for library callers that pass `str(Path("./-o=x"))`, which is `-o=x`."""
    monkeypatch.chdir(tmp_path)
    shutil.copy(MATMUL, tmp_path / "-o=victim.txt")
    with pytest.raises(InputError, match="starts with '-'"):
        run_tool("iree-opt", ["-o=victim.txt"])
    assert not (tmp_path / "victim.txt").exists()
    # The same file as a Path object is made absolute, so it can only be read as a file.
    done = run_tool("iree-opt", [Path("-o=victim.txt"), "-o", os.devnull])
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "victim.txt").exists()
    assert path_arg("-o=victim.txt") == str(tmp_path / "-o=victim.txt")


# ---- item 8: output locations that cannot be written --------------------------------------------
@contextlib.contextmanager
def tmpfs(where: Path, size: str, *, read_only: bool = False) -> Iterator[Path]:
    """A private tmpfs of `size` mounted at `where` (root only): a real full or read-only disk."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


@contextlib.contextmanager
def read_only_dir(where: Path) -> Iterator[Path]:
    """A directory this process cannot write: permissions for a user, a read-only mount for root."""
    if os.geteuid() != 0:
        where.mkdir()
        where.chmod(0o555)
        try:
            yield where
        finally:
            where.chmod(0o755)
    else:
        with tmpfs(where, "1m", read_only=True):
            yield where


def test_output_dir_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("not a directory\n")
    done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", "out", *QUICK_TUNE)
    assert done.returncode == 2
    one_error_line(done, "--output-dir", "is a file, not a directory")
    done = run_cli(tmp_path, "evaluate", "--dataset", str(LOG), "-o", "out", "--seeds", "1")
    assert done.returncode == 2
    one_error_line(done, "is a file, not a directory")


def test_output_dir_below_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", "file/out", *QUICK_TUNE)
    assert done.returncode == 2
    one_error_line(done, "cannot create --output-dir", "Not a directory")


def test_a_refused_input_leaves_the_output_dir_as_it_was(tmp_path: Path) -> None:
    """Nothing tunable in the model: one line, and no work folder or dumps left behind."""
    elementwise = ROOT / "tests" / "fixtures" / "elementwise_only.mlir"
    done = run_cli(tmp_path, "tune", str(elementwise), "-o", "out", *QUICK_TUNE)
    assert done.returncode == 2
    one_error_line(done, "tunable root op")
    assert not (tmp_path / "out" / "work").exists()
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_results_jsonl_that_is_a_directory(tmp_path: Path) -> None:
    (tmp_path / "out" / "results.jsonl").mkdir(parents=True)
    done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", "out", *QUICK_TUNE)
    assert done.returncode == 2
    one_error_line(done, "results.jsonl is a directory")
    (tmp_path / "tm" / "dispatches" / "results.jsonl").mkdir(parents=True)
    done = run_cli(tmp_path, "tune-model", str(SMALL_MATMUL), "-o", "tm", "--budget", "1")
    assert done.returncode == 2
    one_error_line(done, "results.jsonl is a directory")


def test_read_only_output_dir(tmp_path: Path) -> None:
    with read_only_dir(tmp_path / "ro") as ro:
        done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", str(ro / "out"), *QUICK_TUNE)
        assert done.returncode == 2
        one_error_line(done, "cannot create --output-dir", str(ro / "out"))
        done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", str(ro), *QUICK_TUNE)
        assert done.returncode == 2
        one_error_line(done, "is not writable", str(ro))
        done = run_cli(tmp_path, "rank", str(MATMUL), "--csv", str(ro / "ranked.csv"))
        assert done.returncode == 2
        one_error_line(done, "not writable")


def test_full_disk_before_the_run(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "64k") as disk:
        (disk / "filler").write_bytes(b"\0" * (64 * 1024))  # tmpfs rounds up: write until full
        with contextlib.suppress(OSError), (disk / "more").open("ab") as more:
            while True:
                more.write(b"\0" * 4096)
                more.flush()
        done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", str(disk / "out"), *QUICK_TUNE)
        assert done.returncode == 2
        one_error_line(done, "not writable", "No space left on device")


def test_disk_filling_up_during_the_run(tmp_path: Path) -> None:
    """24 KiB left: the start-up check passes, the run's own files do not fit. Whichever write
    fails first (ours: exit 1, or IREE's: exit 2), it is one line with the reason, not a traceback."""
    with tmpfs(tmp_path / "disk", "256k") as disk:
        (disk / "filler").write_bytes(b"\0" * (232 * 1024))
        done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", str(disk / "out"), *QUICK_TUNE)
        assert done.returncode in (1, 2), done.stderr
        line = one_error_line(done, "No space left on device")
        assert line.startswith("dispatchtune: error: ")


def test_train_costmodel_checks_its_output_before_training(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x\n")
    for output in ("file/model.json", "."):
        done = run_cli(tmp_path, "train-costmodel", str(LOG), "-o", output, "--no-cv")
        assert done.returncode == 2
        one_error_line(done)  # one line: nothing was trained ("training data: ..." not printed)
    (tmp_path / "model.report.md").mkdir()
    done = run_cli(tmp_path, "train-costmodel", str(LOG), "-o", "model.json", "--no-cv")
    assert done.returncode == 2
    one_error_line(done, "model.report.md is a directory")
    with read_only_dir(tmp_path / "ro") as ro:
        done = run_cli(tmp_path, "train-costmodel", str(LOG), "-o", str(ro / "m.json"), "--no-cv")
        assert done.returncode == 2
        one_error_line(done, "not writable")


def test_train_costmodel_rescues_a_model_it_cannot_write(tmp_path: Path) -> None:
    """The probe fits but the model does not: it is saved in the temporary directory instead."""
    from dispatchtune.costmodel.modelfile import load_model

    with tmpfs(tmp_path / "disk", "8k") as disk:
        done = run_cli(tmp_path, "train-costmodel", str(LOG), "-o", str(disk / "m.json"),
                       "--no-cv", "--no-plot")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "No space left on device" in last and "the model was saved to " in last, last
    rescued = Path(last.split("the model was saved to ", 1)[1].split(" instead", 1)[0])
    try:
        assert load_model(rescued).kind == "gbm"
    finally:
        rescued.unlink()


# ---- item 9: --storage --------------------------------------------------------------------------
def test_storage_needs_the_online_order(tmp_path: Path) -> None:
    done = run_cli(tmp_path, "tune", str(SMALL_MATMUL), "-o", "out", "--storage", "sqlite:///s.db",
                   *QUICK_TUNE)
    assert done.returncode == 2
    one_error_line(done, "--storage", "needs --order online", "not --order model")
    assert not (tmp_path / "out").exists() and not (tmp_path / "s.db").exists()


def test_storage_urls_name_the_driver_the_postgres_extra_installs() -> None:
    """The same mapping from the CLI and from the library (`open_storage`)."""
    from dispatchtune.cli.options import storage_url
    from dispatchtune.search.optuna_search import resolve_storage_url

    assert storage_url("sqlite:///s.db", "online") == "sqlite:///s.db"
    for url in ("postgresql://u@h:5432/db", "postgres://u@h:5432/db"):
        try:
            assert storage_url(url, "online") == "postgresql+psycopg://u@h:5432/db"
            assert resolve_storage_url(url) == "postgresql+psycopg://u@h:5432/db"
        except InputError as exc:  # only where the extra is not installed
            assert "pip install 'dispatchtune[postgres]'" in str(exc)
    with pytest.raises(InputError, match="needs --order online"):
        storage_url("sqlite:///s.db", "heuristic")


def test_a_missing_postgres_driver_is_one_line_naming_the_extra(tmp_path: Path) -> None:
    hide_driver = ("import sys, runpy; sys.modules['psycopg'] = None; "
                   "sys.argv[0] = 'dispatchtune'; runpy.run_module('dispatchtune', run_name='__main__')")
    done = subprocess.run(
        [sys.executable, "-c", hide_driver, "tune", str(SMALL_MATMUL), "-o", "out", "--order",
         "online", "--storage", "postgresql://u@127.0.0.1:1/db", *QUICK_TUNE],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 2
    one_error_line(done, "psycopg", "pip install 'dispatchtune[postgres]'")


def test_tune_from_python_passes_dash_names_to_iree_as_absolute_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library API, not only the CLI: a relative input and output named like options."""
    from dispatchtune.tuner.loop import TuneOptions, tune

    shutil.copy(SMALL_MATMUL, tmp_path / "-o=victim.txt")
    (tmp_path / "victim.txt").write_text("precious")
    monkeypatch.chdir(tmp_path)
    result = tune("-o=victim.txt", "host", "-out", TuneOptions(
        budget=1, compile_only=True, verify=False, progress=False))
    assert (tmp_path / "victim.txt").read_text() == "precious"
    assert result.output_dir == tmp_path / "-out" and (tmp_path / "-out" / "results.jsonl").is_file()
