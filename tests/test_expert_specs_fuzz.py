"""A hostile reader's test: ~1,000 seeded mutations of fixture specs never raise anything but a
one-line `InputError`; every matcher is an entry or skipped with a one-line reason."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dispatchtune.datasets.expert_specs import expert_columns, load_spec_file
from dispatchtune.errors import InputError

FIXTURES = Path(__file__).parent / "fixtures" / "expert_specs"
#: Tokens a mutation inserts: brackets, separators, attribute and SSA sigils, numbers, keywords.
TOKENS = ("<", ">", "[", "]", "{", "}", "(", ")", ",", "=", "->", "#", "%", "@", "?", "x", "-1",
          "0", "99999999999", "tensor<?x", "affine_map<(d0) -> (d0)>", "#iree_codegen.compilation_info<",
          "transform.named_sequence @m(", "#a = #a #a", "//", "\"", "\x00", "é")


def _mutate(text: str, rng: random.Random) -> str:
    """One random edit: delete, duplicate, insert, renumber, truncate or swap lines."""
    i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
    match rng.randrange(6):
        case 0:
            return text[:i] + text[j:]
        case 1:
            return text[:j] + text[i:j] + text[j:]
        case 2:
            return text[:i] + rng.choice(TOKENS) + text[i:]
        case 3:
            number = rng.choice(("0", "-1", "1", "7", "1000000000000", "-99"))
            return text[:i] + number + text[i:].lstrip("0123456789")
        case 4:
            return text[:i]
        case _:
            lines = text.splitlines()
            a, b = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[a], lines[b] = lines[b], lines[a]
            return "\n".join(lines)


@pytest.mark.parametrize(
    ("names", "runs"),
    [
        (("generations.mlir", "unet_fp16_vectordistribute.mlir", "sdxl_2024.mlir"), 1000),
        # IREE 3.13 matcher ops (convolution, attention with dims_equal) and parsed DAG roots.
        (("iree313_matchers.mlir", "dag_convolutions.mlir"), 300),
    ],
    ids=["older-forms", "iree313-forms"],
)
def test_mutated_specs_are_entries_skips_or_one_line_errors(
    names: tuple[str, ...], runs: int, tmp_path: Path
) -> None:
    base = "\n".join((FIXTURES / name).read_text() for name in names)
    rng = random.Random(22)
    path = tmp_path / "mutant.mlir"
    outcomes = {"usable": 0, "skipped": 0, "errors": 0}
    for _ in range(runs):
        text = base
        for _ in range(rng.randrange(1, 4)):
            text = _mutate(text, rng)
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            entries = load_spec_file(path)
        except InputError as exc:
            assert "\n" not in str(exc)
            outcomes["errors"] += 1
            continue
        for entry in entries:
            if entry.usable:
                expert_columns(entry)  # a usable entry always describes itself
                outcomes["usable"] += 1
            else:
                assert entry.skipped and "\n" not in entry.skipped
                outcomes["skipped"] += 1
    # The mutations exercise every outcome (a fuzz test that never reaches the parser proves little).
    assert outcomes["usable"] and outcomes["skipped"], outcomes


def test_unreadable_and_hostile_files_are_one_line_errors(tmp_path: Path) -> None:
    binary = tmp_path / "binary.mlir"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    bomb = tmp_path / "bomb.mlir"
    # Aliases that nest: each level multiplies the text by 64 (4 levels: 16 million copies).
    levels = [f"#a{i} = " + " ".join([f"#a{i + 1}"] * 64) for i in range(4)] + ["#a4 = x"]
    bomb.write_text("\n".join(levels) + "\n#a0\n")
    for path in (binary, bomb):
        try:
            load_spec_file(path)
        except InputError as exc:
            assert "\n" not in str(exc)
        else:
            raise AssertionError(f"{path.name} was read")
