"""What a spec file's matcher becomes: the dispatch and its expert configuration, by meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatchtune.problem import Problem


@dataclass(frozen=True)
class ExpertConfig:
    """One expert configuration, by meaning, per loop of the op as the spec matched it."""

    pipeline: str  # "VectorDistribute" or "TileAndFuse"
    workgroup: tuple[int, ...]  # workgroup tile per loop (0 = not tiled)
    reduction: tuple[int, ...]  # reduction tile per loop, in elements (0 = not tiled)
    intrinsic: str  # current IREE name, e.g. "MFMA_F32_16x16x16_F16"
    mma_shape: tuple[int, int, int]
    subgroup_counts: tuple[int, int]  # (M, N) subgroups per workgroup
    workgroup_size: tuple[int, ...]
    subgroup_size: int
    waves_per_eu: int = 0  # 0 = compiler default
    pv_intrinsic: str = ""  # attention: the P x V intrinsic (`intrinsic` is the Q x K^T one)
    syntax: str = "current"  # "current", "tileandfuse-2025", "modernised" (other older) or "2024"


@dataclass(frozen=True)
class ExpertEntry:
    """One matcher of a spec file: the dispatch and its expert configuration (or why not)."""

    file: str
    matcher: str
    problem: Problem | None = None
    config: ExpertConfig | None = None
    skipped: str = ""  # non-empty when the matcher could not be turned into (problem, config)
    notes: tuple[str, ...] = field(default=())

    @property
    def usable(self) -> bool:
        return self.problem is not None and self.config is not None
