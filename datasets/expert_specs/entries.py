"""What a spec file's matcher becomes: the dispatch and its expert configuration, by meaning."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatchtune.problem import Problem

#: Size given to dynamic dimensions: SDXL/punet specs are tuned for batch 2 (classifier-free
#: guidance), and IREE's collapsed static shapes in the README (2x1024 -> 2048) agree.
DYNAMIC_SIZE = 2


#: SDXL UNet attention at 1024x1024 (batch 2, head dim 64): (B, heads, M, N, K1, K2) self- and
#: cross-attention (64 text tokens) at the 64x64 (10 heads) and 32x32 (20 heads) latent levels,
#: the shapes the shape-free attention matchers were tuned for (IREE's own gfx942 spec names
#: 2x10x4096x64x64x64).
SDXL_ATTENTION_SHAPES: tuple[tuple[int, int, int, int, int, int], ...] = (
    (2, 10, 4096, 64, 64, 4096), (2, 10, 4096, 64, 64, 64),
    (2, 20, 1024, 64, 64, 1024), (2, 20, 1024, 64, 64, 64),
)


#: The SDXL export's attention layout: Q [B, H, M, K1], K [B, H, K2, K1], V [B, H, N, K2] (V
#: transposed), O [B, H, M, N]; loops d0..d5 = B, H, M, N, K1, K2 (IREE's gfx942 spec maps).
_SDXL_ATTENTION_MAPS = ((0, 1, 2, 4), (0, 1, 5, 4), (0, 1, 3, 5), (0, 1, 2, 3))


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
