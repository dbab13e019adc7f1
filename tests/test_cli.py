"""The command lines as users run them: every line of the README's "Using it" block, as a subprocess.

The commands are read from the README itself, so the README and this test cannot drift apart. They
run in one temporary directory (with `examples/` linked in), each once, in README order; a line that
reads an earlier line's output (`out/results.jsonl`, `cost_model.json`) runs that line first.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtune.cli import build_parser
from dispatchtune.cli.train_costmodel import build_parser as train_parser
from dispatchtune.tuner.loop import TuneOptions
from dispatchtune.tuner.model import ModelTuneOptions

ROOT = Path(__file__).resolve().parent.parent
TRAIN_COSTMODEL = ("import sys; from dispatchtune.cli import train_costmodel_main; "
                   "sys.exit(train_costmodel_main())")
#: README lines that cannot run here, by a fragment of the line, with the reason.
SKIPPED = {
    "--storage postgresql://": "needs a PostgreSQL server (shared studies are tested with SQLite)",
    "iree-compile model.mlir": "placeholder model and target flags",
}
OUTPUT_FLAGS = ("-o", "--output", "--output-dir")


def readme_lines() -> list[str]:
    """The commands of the first ```sh block under "## Using it"."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Using it\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


LINES = readme_lines()


def argv_of(line: str) -> list[str]:
    """A README line's words, without its trailing `# comment`."""
    return shlex.split(line, comments=True)


def outputs(argv: list[str]) -> set[str]:
    """What a command line writes (the values of its output flags)."""
    return {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in OUTPUT_FLAGS}


def command(argv: list[str]) -> list[str]:
    """The README command as this interpreter runs it (no console script needed on PATH)."""
    if argv[0] == "dispatchtune":
        return [sys.executable, "-m", "dispatchtune", *argv[1:]]
    if argv[0] == "train-costmodel":
        return [sys.executable, "-c", TRAIN_COSTMODEL, *argv[1:]]
    raise AssertionError(f"README line runs {argv[0]!r}, not a dispatchtune command")


def run_in(workdir: Path, argv: list[str], timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command(argv), cwd=workdir, capture_output=True, text=True, timeout=timeout,
                          check=False)


class ReadmeSession:
    """Runs README lines once each in one directory, earlier lines first where their output is read."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        (workdir / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
        self.done: dict[int, subprocess.CompletedProcess[str]] = {}

    def run(self, index: int) -> subprocess.CompletedProcess[str]:
        if index not in self.done:
            argv = argv_of(LINES[index])
            read = {arg.split("/")[0] for arg in argv[1:]} - outputs(argv)
            for earlier in range(index):
                if outputs(argv_of(LINES[earlier])) & read:
                    assert self.run(earlier).returncode == 0, f"needed line failed: {LINES[earlier]}"
            self.done[index] = run_in(self.workdir, argv)
        return self.done[index]


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> ReadmeSession:
    return ReadmeSession(tmp_path_factory.mktemp("readme"))


def _line_id(index: int) -> str:
    argv = argv_of(LINES[index])
    return f"{index:02d}-{'-'.join(argv[:2])}"


def test_the_readme_shows_every_command() -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    shown = {tuple(argv_of(line)[:2]) for line in LINES}
    for name in subparsers.choices:  # type: ignore[union-attr]
        assert ("dispatchtune", name) in shown, f"README 'Using it' has no `dispatchtune {name}` line"
    assert any(line.startswith("train-costmodel ") for line in LINES)


@pytest.mark.parametrize("index", range(len(LINES)), ids=_line_id)
def test_readme_line_runs(index: int, session: ReadmeSession) -> None:
    line = LINES[index]
    for fragment, reason in SKIPPED.items():
        if fragment in line:
            pytest.skip(reason)
    argv = argv_of(line)
    done = session.run(index)
    assert done.returncode == 0, f"{line}\nstdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr
    for written in outputs(argv):
        assert (session.workdir / written).exists(), f"{line} did not write {written}"
    name = argv[1] if argv[0] == "dispatchtune" else argv[0]
    out = done.stdout
    if name == "targets":
        assert "host" in out and "gfx942" in out
    elif name == "inspect":
        assert "kind:" in out and "layout:" in out
    elif name == "candidates" and "--json" in argv:
        rows = [json.loads(row) for row in out.splitlines()]
        assert len(rows) == 5 and all("compilation_info" in row for row in rows)
    elif name == "candidates":
        assert "the first 5 candidates (--limit)" in out
    elif name == "rank" and "--json" in argv:
        rows = [json.loads(row) for row in out.splitlines()]
        assert [row["rank"] for row in rows] == [0, 1, 2]
        assert all({"score", "knobs", "compilation_info"} <= set(row) for row in rows)
        assert "gfx942.json" in done.stderr  # a GPU target that ships a model orders by it
    elif name == "rank":
        assert " candidates, " in out
        if "--cost-model" in argv:
            assert "cost_model.json" in done.stderr and " candidates, model order" in out
    elif name in ("tune", "tune-model"):
        out_dir = session.workdir / outputs(argv).pop()
        assert (out_dir / "tuning_spec.mlir").is_file() and (out_dir / "summary.md").is_file()
    elif name == "evaluate":
        report = session.workdir / outputs(argv).pop() / "report.md"
        assert report.is_file() and "heuristic" in out
        if "--split" in argv:  # both CPUs' 28 spaces, each scored by a model that never saw it
            assert report.read_text().count(" | gbm | ") == 2 * 28
    elif name == "train-costmodel":
        assert "Feature importances" in out


# ---- bad input: one stderr line, exit status 2 -------------------------------------------------
MATMUL = "examples/matmul_f32_512.mlir"
BAD = [
    (["dispatchtune"], "required: COMMAND"),
    (["dispatchtune", "targets", "--bogus"], "unrecognized arguments: --bogus"),
    (["dispatchtune", "inspect", "missing.mlir"], "missing.mlir"),
    (["dispatchtune", "candidates", MATMUL, "--target", "nope"], "unknown target"),
    (["dispatchtune", "candidates", MATMUL, "--target", "host", "--limit", "-1"],
     "--limit must be at least 0, got -1"),
    (["dispatchtune", "rank", MATMUL, "--cost-model", MATMUL], "not a dispatchtune model file"),
    (["dispatchtune", "rank", MATMUL, "--seed", "-3"], "--seed must be at least 0"),
    # The flag by its name (it read "extra_knobs applies to GPU targets only"), before any work.
    (["dispatchtune", "rank", MATMUL, "--waves-per-eu", "1,2"],
     "--waves-per-eu is an AMD GPU hint; host is not an AMD target"),
    (["dispatchtune", "candidates", MATMUL, "--target", "sm_80", "--waves-per-eu", "1"],
     "--waves-per-eu is an AMD GPU hint; sm_80 is not an AMD target"),
    # An example of the file the flag writes (it suggested model.json for --csv).
    (["dispatchtune", "rank", MATMUL, "--csv", "examples"],
     "is a directory; give a file path such as ranked.csv"),
    (["train-costmodel", "shipped:cpu_host", "-o", "examples"],
     "is a directory; give a file path such as model.json"),
    (["dispatchtune", "tune", MATMUL, "-o", "o", "--budget", "0"], "--budget must be at least 1"),
    (["dispatchtune", "tune", MATMUL, "-o", "o", "--jobs", "-5"], "--jobs must be at least 0, got -5"),
    (["dispatchtune", "tune", MATMUL, "-o", "o", "--compile-timeout", "0"],
     "--compile-timeout must be > 0"),
    (["dispatchtune", "tune", MATMUL], "required: --output-dir/-o"),
    (["dispatchtune", "tune-model", "missing.mlir", "-o", "o"], "no such file: missing.mlir"),
    (["dispatchtune", "tune-model", MATMUL, "-o", "o", "--coverage", "1.5"],
     "--coverage must be in (0, 1], got 1.5"),
    (["dispatchtune", "evaluate", "--dataset", "shipped:cpu_host", "-o", "o", "--seeds", "0"],
     "--seeds must be at least 1"),
    (["dispatchtune", "evaluate", "--dataset", "shipped:cpu_host", "-o", "o", "--threshold", "1"],
     "--threshold must be in (0, 1)"),
    (["train-costmodel", "shipped:cpu_host", "-o", "m.json", "--folds", "0"], "--folds must be at least 2"),
    (["train-costmodel", "shipped:cpu_host", "-o", "m.json", "--model", "bogus"], "invalid choice"),
    (["train-costmodel", "missing.jsonl", "-o", "m.json"], "no such file"),
]


@pytest.mark.parametrize(("argv", "message"), BAD, ids=[" ".join(a[:2]) + f" {i}" for i, (a, _) in
                                                         enumerate(BAD)])
def test_bad_input_is_one_stderr_line_and_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    done = run_in(tmp_path, argv, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(err) == 1 and message in err[0], done.stderr
    assert err[0].startswith(("dispatchtune", "train-costmodel"))


# ---- parsing ------------------------------------------------------------------------------------
def test_tune_model_keeps_the_mlir_model_and_the_cost_model_apart() -> None:
    args = build_parser().parse_args(["tune-model", "m.mlir", "--cost-model", "c.json", "-o", "o"])
    # Paths are made absolute while parsing (issue #18: no file name can become a tool option).
    assert (args.model_mlir, args.cost_model) == (Path("m.mlir").absolute(), Path("c.json").absolute())
    args = build_parser().parse_args(["tune-model", "m.mlir", "-o", "o"])
    assert args.model_mlir == Path("m.mlir").absolute() and args.cost_model is None


def test_deprecated_model_flag_is_the_cost_model(capsys: pytest.CaptureFixture[str]) -> None:
    for command_name in ("rank", "tune", "tune-model"):
        args = build_parser().parse_args([command_name, "m.mlir", "--model", "c.json", "-o", "o"]
                                         if command_name != "rank" else
                                         [command_name, "m.mlir", "--model", "c.json"])
        assert args.cost_model == Path("c.json").absolute()
        assert "--cost-model" in capsys.readouterr().err
    assert train_parser().parse_args(["x", "--model", "rf", "-o", "m.json"]).model_kind == "rf"


def test_tuning_defaults_come_from_the_options_dataclasses() -> None:
    tune, model = TuneOptions(), ModelTuneOptions()
    args = build_parser().parse_args(["tune", "f.mlir", "-o", "o"])
    assert (args.budget, args.jobs, args.repetitions, args.baseline_every, args.confirm_top,
            args.confirm_rounds, args.min_speedup, args.compile_timeout, args.stop_margin) == (
        tune.budget, tune.jobs, tune.repetitions, tune.baseline_every, tune.confirm_top,
        tune.confirm_rounds, tune.min_speedup, tune.compile_timeout_s, tune.stop_margin)
    args = build_parser().parse_args(["tune-model", "m.mlir", "-o", "o"])
    assert (args.budget, args.coverage, args.max_dispatches, args.min_share, args.top,
            args.model_rounds, args.model_rounds_max, args.keep_alpha, args.final_rounds,
            args.min_model_speedup, args.timer) == (
        model.budget, model.coverage, model.max_dispatches, model.min_share, model.top,
        model.model_rounds, model.model_rounds_max, model.keep_alpha, model.final_rounds,
        model.min_model_speedup, model.timer)


def test_every_help_renders() -> None:
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in subparsers.choices.items():  # type: ignore[union-attr]
        assert f"dispatchtune {name}" in parser.format_help()
    assert "(default: leave one problem out)" in " ".join(train_parser().format_help().split())


def test_the_command_line_never_imports_benchmarks() -> None:
    probe = ("import sys; from dispatchtune.cli import build_parser, train_costmodel; build_parser(); "
             "train_costmodel.build_parser(); print(sorted(m for m in sys.modules if 'benchmarks' in m))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
