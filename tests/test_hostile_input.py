"""Hostile but realistic input at the command line (issue #18, items 7-9), each run as a subprocess.

Every case must end with exactly one line on stderr and a non-zero exit status, never a traceback,
and must not touch files it was not asked to write.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtune.errors import InputError
from dispatchtune.toolchain import path_arg, run_tool

ROOT = Path(__file__).resolve().parent.parent
MATMUL = ROOT / "examples" / "matmul_f32_512.mlir"
SHIPPED_LOG = ROOT / "tests" / "fixtures" / "cpu_results_matmul_256x384x256.jsonl"
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
