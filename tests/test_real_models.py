"""Real exported architectures through `dispatchtune tune-model`, exactly as
`examples/models/README.md` shows it: the run completes, the model's time is accounted for, and
every problem not tuned is reported with its share and reason instead of aborting the run."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from dispatchtune.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "examples" / "models" / "README.md"


def _readme_commands() -> dict[str, list[str]]:
    """model stem -> the README's command line (arguments after `dispatchtune`)."""
    commands = {}
    for line in README.read_text().splitlines():
        if line.startswith("dispatchtune tune-model examples/models/"):
            args = shlex.split(line)[1:]
            commands[Path(args[1]).stem] = args
    return commands


COMMANDS = _readme_commands()


def _run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    args = COMMANDS[name]
    out_index = args.index("-o") + 1
    out = tmp_path / args[out_index]
    args = [*args[:out_index], str(out), *args[out_index + 1 :]]
    monkeypatch.chdir(ROOT)  # the README's paths are relative to the repository root
    monkeypatch.setenv("DISPATCHTUNE_CACHE", str(tmp_path / "cache"))
    assert cli_main([*args, "--no-progress"]) == 0
    return out, (out / "summary.md").read_text()


def _not_tuned(summary: str) -> dict[str, str]:
    section = summary.split("## Not tuned", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)` \| [\d.]+% \| (.+) \|$",
                                                          section, re.MULTILINE)}


def test_readme_shows_the_real_models() -> None:
    assert {"llama_l1_s128", "bert_l1_s128", "resnet18_b2_64"} <= set(COMMANDS)


def test_sdpa_transformer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    out, summary = _run("llama_l1_s128", tmp_path, monkeypatch)
    assert "speedup" in capsys.readouterr().out
    profile = json.loads((out / "model_log.jsonl").read_text().splitlines()[0])
    assert profile["kind"] == "profile" and profile["dispatches"]
    assert "**Speedup" in summary and "Tuned problems cover **" in summary
    # Every problem is either tuned or listed with a reason.
    table = summary.split("## Where the time goes", 1)[1].split("## Not tuned", 1)[0]
    keys = re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)
    assert any(k.startswith("attention_") for k in keys)
    skipped = _not_tuned(summary)
    tuned = [k for k in keys if k not in skipped]
    assert len(tuned) == 1 and all(skipped.values())
    assert (out / "tuning_spec.mlir").exists()


def test_resnet18_refuses_only_pooling_without_aborting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, summary = _run("resnet18_b2_64", tmp_path, monkeypatch)
    skipped = _not_tuned(summary)
    refused = {k: r for k, r in skipped.items() if r.startswith("cannot be configured")}
    # The 1x1 convs (contractions with three M loops) are configurable since issue #21 part 3;
    # the max pooling is the only refused problem.
    assert not any(k.startswith("contraction_") for k in refused)
    assert [r for k, r in refused.items() if k.startswith("convolution_")]
    assert all("pooling" in r for r in refused.values())
    # No budget went to a refused problem.
    records = [json.loads(line) for line in
               (out / "dispatches" / "results.jsonl").read_text().splitlines()]
    assert records and not {r["problem_key"] for r in records} & set(refused)
    assert "**Speedup" in summary


def test_bert_default_build_crash_is_retried_without_const_eval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """IREE 3.13 crashes in const-eval of this export's weights; the run says so and goes on."""
    out, summary = _run("bert_l1_s128", tmp_path, monkeypatch)
    records = [json.loads(line) for line in (out / "model_log.jsonl").read_text().splitlines()]
    assert "--iree-opt-const-eval=false" in records[0]["compile_flags"]
    assert "disables constant evaluation" in summary and "--iree-opt-const-eval=false" in summary
    assert records[-1]["kind"] == "final"


def test_inspect_reads_a_model_whose_const_eval_crashes() -> None:
    """`inspect` (and `rank`/`tune`, which read dispatches the same way) retry the build that
    IREE 3.13 crashes on without constant evaluation, and say that the flag is needed."""
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "dispatchtune", "inspect", "examples/models/bert_l1_s128.mlir",
         "--target", "host"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "contraction_" in proc.stdout
    assert "--iree-opt-const-eval=false" in proc.stderr and "Traceback" not in proc.stderr
