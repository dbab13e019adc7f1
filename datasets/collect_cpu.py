"""Collect a CPU training set for the learned cost models: random-order tuning runs of real shapes.

`SHAPES` lists dispatch shapes taken from real models (BERT-base, Llama-style decoders, ViT,
ResNet-50, a Stable-Diffusion-style UNet), scaled down so that one benchmark on a 2-core machine
takes milliseconds (about 10-500 MFLOP each; the scaling is stated per shape). For each shape this
script writes `OUT/<name>/<name>.mlir` (`Problem.to_mlir()`) and runs the real tuning loop on it
in **random order** (an unbiased sample of the enumerated space, which is what a cost model must
be trained and judged on), one output directory per shape:

    dispatchtune tune OUT/<name>/<name>.mlir --target host --order random --seed 7 \
        --budget 150 --repetitions 3 -o OUT/<name> --confirm-top 0 --no-verify

Regenerate the whole set (about 27 shapes x 150 candidates; hours on a shared 2-core machine; the
loop resumes an interrupted directory, so re-running the same command continues):

    .venv/bin/python datasets/collect_cpu.py --output-dir cpu_dataset --budget 150

then train on it with `train-costmodel cpu_dataset --model gbm -o cpu_gbm.json`.

`OUT/manifest.json` lists the shapes. IREE's front end may rewrite a shape before tuning (a 1x1
convolution becomes a matmul with M = batch x H x W), so the `problem_key` in a results log is the
dispatch IREE built, not necessarily `written_problem_key` of the manifest.

Convolutions all have batch >= 2: the shipped dataset was collected before unit-batch
convolutions became configurable (their spec now restores the batch loop first; see
docs/search_space.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from dispatchtune.errors import DispatchTuneError, InputError
from dispatchtune.problem import Problem


@dataclass(frozen=True)
class Shape:
    """One dispatch shape: a short name, the model it comes from (and how it was scaled)."""

    name: str
    source: str
    problem: Problem


def _mm(name: str, source: str, m: int, n: int, k: int, transpose_b: bool = False) -> Shape:
    return Shape(name, source, Problem.matmul(m, n, k, "f32", transpose_b=transpose_b))


def _bmm(name: str, source: str, b: int, m: int, n: int, k: int,
         transpose_b: bool = False) -> Shape:
    return Shape(name, source, Problem.batch_matmul(b, m, n, k, "f32", transpose_b=transpose_b))


def _conv(name: str, source: str, batch: int, out: int, cin: int, cout: int, kernel: int,
          stride: int = 1) -> Shape:
    problem = Problem.conv2d_nhwc_hwcf(batch, out, out, cin, cout, kernel, kernel, "f32",
                                       stride=stride)
    return Shape(name, source, problem)


#: The collected shapes (f32; sizes are GEMM M x N x K or conv batch, output HxW, Cin -> Cout).
SHAPES: tuple[Shape, ...] = (
    # BERT-base: hidden 768, FFN 3072, 12 heads of 64; sequence 128 (FFN: 64 tokens).
    _mm("bert_qkv_proj", "BERT-base QKV/out projection, seq 128", 128, 768, 768),
    _mm("bert_ffn_up", "BERT-base FFN up, 64 tokens", 64, 3072, 768),
    _mm("bert_ffn_down", "BERT-base FFN down, 64 tokens", 64, 768, 3072),
    _bmm("bert_attn_scores", "BERT-base Q K^T, 12 heads, seq 128", 12, 128, 128, 64,
         transpose_b=True),
    _bmm("bert_attn_context", "BERT-base P V, 12 heads, seq 128", 12, 128, 64, 128),
    # Llama-style decoder (hidden 4096, FFN 11008, head dim 128), weights [out, in] (transpose_b),
    # widths scaled by 1/4 where noted.
    _mm("llama_q_proj", "Llama-7B q_proj, 16 tokens, 1/4 of the outputs", 16, 1024, 4096,
        transpose_b=True),
    _mm("llama_mlp_up", "Llama-7B gate/up proj at 1/4 width, 16 tokens", 16, 2752, 1024,
        transpose_b=True),
    _mm("llama_mlp_down", "Llama-7B down proj at 1/4 width, 16 tokens", 16, 1024, 2752,
        transpose_b=True),
    _mm("llama_decode_proj", "Llama-7B projection in decode, 4 sequences, 1/4 of K", 4, 4096,
        1024, transpose_b=True),
    _mm("llama_lm_head", "Llama-7B lm_head slice (32000/8 vocab), 1/4 hidden, 8 tokens", 8, 4000,
        1024, transpose_b=True),
    _bmm("llama_attn_scores", "Llama Q K^T, 8 heads, 64 tokens, head dim 128", 8, 64, 64, 128,
         transpose_b=True),
    _bmm("llama_attn_context", "Llama P V, 8 heads, 64 tokens, head dim 128", 8, 64, 128, 64),
    # ViT: B/16 with its CLS token (197 tokens), B/32 (50 tokens).
    _mm("vit_b16_qkv", "ViT-B/16 attention projection, 197 tokens", 197, 768, 768),
    _mm("vit_b32_mlp_up", "ViT-B/32 MLP up, 50 tokens", 50, 3072, 768),
    _mm("vit_b32_mlp_down", "ViT-B/32 MLP down, 50 tokens", 50, 768, 3072),
    # ResNet-50 (NHWC), batch 2; 3x3 convs at half resolution or half output channels.
    _conv("resnet_stem_7x7", "ResNet-50 stem 7x7/2, half resolution", 2, 56, 3, 64, 7, stride=2),
    _conv("resnet_s1_3x3", "ResNet-50 stage 1 3x3, half resolution", 2, 28, 64, 64, 3),
    _conv("resnet_s1_1x1_expand", "ResNet-50 stage 1 1x1 expand", 2, 56, 64, 256, 1),
    _conv("resnet_s2_3x3", "ResNet-50 stage 2 3x3, half resolution", 2, 14, 128, 128, 3),
    _conv("resnet_s3_1x1_reduce", "ResNet-50 stage 3 1x1 reduce", 2, 14, 1024, 256, 1),
    _conv("resnet_s3_3x3", "ResNet-50 stage 3 3x3, half output channels", 2, 14, 256, 128, 3),
    _conv("resnet_s4_3x3", "ResNet-50 stage 4 3x3, half output channels", 2, 7, 512, 256, 3),
    _mm("resnet_fc", "ResNet-50 classifier, batch 8", 8, 1000, 2048),
    # Stable-Diffusion-style UNet, batch 2, channels at half width where noted.
    _conv("unet_res_3x3_16", "SD UNet resblock 3x3 at 16x16, half width (160)", 2, 16, 160, 160,
          3),
    _conv("unet_res_3x3_8", "SD UNet resblock 3x3 at 8x8 (320)", 2, 8, 320, 320, 3),
    _conv("unet_skip_1x1", "SD UNet 1x1 skip 320 -> 160 at 16x16", 2, 16, 320, 160, 1),
    _mm("unet_attn_proj", "SD UNet transformer projection, 16x16 tokens, 320 channels", 256, 320,
        320),
    _bmm("unet_attn_scores", "SD UNet self-attention Q K^T, 8 heads of 40, 256 tokens", 8, 256,
         256, 40, transpose_b=True),
)


def select(names: Sequence[str] = ()) -> list[Shape]:
    """The shapes named (all by default); unknown names are a one-line error."""
    if not names:
        return list(SHAPES)
    by_name = {s.name: s for s in SHAPES}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InputError(f"unknown shape {unknown[0]!r}; see --list")
    return [by_name[n] for n in names]


def write_shape(shape: Shape, out_dir: Path) -> Path:
    """Write the shape's MLIR (`Problem.to_mlir()`) into its own directory; returns the file."""
    directory = out_dir / shape.name
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{shape.name}.mlir"
    path.write_text(shape.problem.to_mlir())
    return path


def tune_command(mlir: Path, out: Path, budget: int, seed: int, repetitions: int,
                 jobs: int | None, verify: bool = False) -> list[str]:
    """The tuning-loop command line for one shape (random order, so the sample is unbiased).

    Verification and the final confirmation round are off by default: verifying builds a second
    binary per candidate (twice the compile time) and found no mismatch in 584 verified CPU
    candidates of benchmarks/data/cpu_random_samples; confirmation only matters for a spec.
    """
    command = [sys.executable, "-m", "dispatchtune", "tune", str(mlir), "--target", "host",
               "--order", "random", "--seed", str(seed), "--budget", str(budget),
               "--repetitions", str(repetitions), "--output-dir", str(out), "--no-progress",
               "--confirm-top", "0"]
    if not verify:
        command.append("--no-verify")
    if jobs:
        command += ["--jobs", str(jobs)]
    return command


def pack(shapes: Sequence[Shape], out_dir: Path, target: Path) -> int:
    """Concatenate the shapes' logs into one gzip file (mtime 0: same logs, same bytes)."""
    missing = [s.name for s in shapes if not (out_dir / s.name / "results.jsonl").is_file()]
    if missing:
        print(f"collect_cpu: error: no results.jsonl for {', '.join(missing)} in {out_dir}",
              file=sys.stderr)
        return 2
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   compresslevel=9) as packed:
        for shape in shapes:
            packed.write((out_dir / shape.name / "results.jsonl").read_bytes())
    print(f"packed {len(shapes)} shapes into {target} ({target.stat().st_size / 1e6:.1f} MB)")
    return 0


def noise_table(log: Path) -> pd.DataFrame:
    """Per problem of a packed log (or a collection directory): candidates measured, repetitions,
    the median coefficient of variation of a candidate's repetitions, the CV of the default
    configuration's time over the run (re-measured at intervals: drift and load), how many
    candidates are within 5% of the best, and the default's time over the best's. Times are the
    minimum over repetitions (`min_ms`), the estimator the labels use."""
    from dispatchtune.datasets.records import load_results
    from dispatchtune.datasets.spaces import classify_inputs

    logs, _ = classify_inputs([log])
    frame = load_results(logs, kinds=("candidate", "baseline")) if logs else pd.DataFrame()
    if frame.empty:
        raise InputError(f"{log}: no benchmarked candidates")
    reps = frame["times_ms"].map(lambda t: len(t) if isinstance(t, list) else 0)
    frame = frame.assign(
        repetitions=reps,
        cv=frame["times_ms"].map(lambda t: float(np.std(t) / np.mean(t)) if isinstance(t, list)
                                 and len(t) > 1 else float("nan")),
        measured=(frame["bench_status"] == "ok") & (reps > 0))
    rows = []
    for key, group in frame.groupby("problem_key", sort=False):
        candidates = group[group["kind"] == "candidate"]
        ok = candidates[candidates["measured"]]
        base = group.loc[(group["kind"] == "baseline") & (group["repetitions"] > 0), "min_ms"]
        if ok.empty:
            continue
        best = ok["min_ms"].min()
        rows.append({
            "problem": key, "candidates": len(ok), "failed": len(candidates) - len(ok),
            "repetitions": int(ok["repetitions"].median()),
            "repetition_cv": float(ok["cv"].median()),
            "default_cv_over_run": float(base.std(ddof=0) / base.mean()) if len(base) > 1
            else float("nan"),
            "default_measurements": len(base),
            "within_5pct": int((ok["min_ms"] <= best * 1.05).sum()),
            "default_over_best": float(base.median() / best) if len(base) else float("nan"),
        })
    if not rows:
        raise InputError(f"{log}: no benchmarked candidates")
    return pd.DataFrame(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--output-dir", "-o", type=Path, default=Path("cpu_dataset"),
                        help="one subdirectory per shape (default cpu_dataset)")
    parser.add_argument("--budget", type=int, default=150, help="candidates per shape (150)")
    parser.add_argument("--repetitions", type=int, default=3, help="benchmark repetitions (3)")
    parser.add_argument("--seed", type=int, default=7, help="random-order seed (7)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the loop's)")
    parser.add_argument("--verify", action="store_true",
                        help="verify each candidate's output (doubles compile time)")
    parser.add_argument("--only", nargs="*", default=[], metavar="NAME", help="these shapes only")
    parser.add_argument("--list", action="store_true", help="list the shapes and exit")
    parser.add_argument("--write-only", action="store_true",
                        help="write the MLIR files and the manifest, do not tune")
    parser.add_argument("--stats", type=Path, metavar="LOG",
                        help="do not tune: print the noise table of a packed log or output dir")
    parser.add_argument("--pack", type=Path, metavar="FILE.jsonl.gz",
                        help="do not tune: pack every shape's results.jsonl into one gzip log "
                             "(how datasets/data/cpu_host.jsonl.gz is made)")
    args = parser.parse_args(argv)
    try:
        shapes = select(args.only)
    except InputError as exc:
        print(f"collect_cpu: error: {exc}", file=sys.stderr)
        return 2
    if args.list:
        for s in shapes:
            print(f"{s.name:24s} {s.problem.describe()}  ({s.source}; "
                  f"{s.problem.flops / 1e6:.0f} MFLOP)")
        return 0
    if args.pack:
        return pack(shapes, args.output_dir, args.pack)
    if args.stats:
        try:
            table = noise_table(args.stats)
            print("| " + " | ".join(table.columns) + " |\n|" + "---|" * len(table.columns))
            for row in table.itertuples(index=False):
                print("| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v)
                                        for v in row) + " |")
        except DispatchTuneError as exc:
            print(f"collect_cpu: error: {exc}", file=sys.stderr)
            return 2
        return 0
    args.output_dir.mkdir(parents=True, exist_ok=True)
    # The manifest lists the whole set, also when --only (re)collects a few shapes of it.
    manifest = [{"name": s.name, "source": s.source, "written_problem_key": s.problem.key,
                 "describe": s.problem.describe(), "mflop": s.problem.flops / 1e6}
                for s in SHAPES]
    (args.output_dir / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    failed = []
    for index, shape in enumerate(shapes, start=1):
        mlir = write_shape(shape, args.output_dir)
        if args.write_only:
            continue
        command = tune_command(mlir, args.output_dir / shape.name, args.budget, args.seed,
                               args.repetitions, args.jobs, args.verify)
        print(f"[{index}/{len(shapes)}] {shape.name}: {shape.problem.describe()}",
              file=sys.stderr, flush=True)
        start = time.monotonic()
        rc = subprocess.run(command, check=False).returncode
        print(f"[{index}/{len(shapes)}] {shape.name}: exit {rc} after "
              f"{time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
        if rc != 0:
            failed.append(shape.name)
    if failed:
        print(f"collect_cpu: {len(failed)} shape(s) failed: {', '.join(failed)} (re-run the same "
              "command to resume)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
