"""Datasets that ship with the package (`datasets/data/`), addressable as `shipped:NAME`.

Every command that reads measured data (`train-costmodel`, `dispatchtune evaluate`, the benchmark
scripts) accepts `shipped:NAME` wherever it accepts a path (`datasets.spaces.classify_inputs`).
Each dataset has a card (`data/NAME.md`): how it was collected, the command that regenerates or
extends it, the machine and the measured noise.
"""

from __future__ import annotations

from pathlib import Path

from dispatchtune.errors import InputError

DATA_DIR = Path(__file__).resolve().parent / "data"
PREFIX = "shipped:"

#: name -> (file under DATA_DIR, one-line description)
SHIPPED = {
    "cpu_host": ("cpu_host.jsonl.gz",
                 "28 dispatches of BERT/Llama/ViT/ResNet/UNet, 150 random candidates each, "
                 "llvm-cpu on a 2-core x86 VM (card: cpu_host.md)"),
    "cpu_avx2": ("cpu_avx2.jsonl.gz",
                 "the same 28 dispatches, 100 random candidates each, llvm-cpu on a 2-core "
                 "AVX2 VM (card: cpu_avx2.md)"),
}


def shipped_path(name: str) -> Path:
    """The file of shipped dataset `name` (one-line error for an unknown or missing one)."""
    if name not in SHIPPED:
        raise InputError(f"no shipped dataset {name!r}; shipped: {', '.join(sorted(SHIPPED))}")
    path = DATA_DIR / SHIPPED[name][0]
    if not path.is_file():
        raise InputError(f"shipped dataset {name!r} is missing from this install ({path})")
    return path


def resolve(raw: str | Path) -> Path:
    """`shipped:NAME` as its file; anything else as a plain path."""
    text = str(raw)
    return shipped_path(text[len(PREFIX):]) if text.startswith(PREFIX) else Path(raw)
