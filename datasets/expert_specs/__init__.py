"""Expert tuning specs: the configurations engineers shipped for real dispatches, as data.

A tuning spec is a transform-dialect module whose `match_*` named sequences each name one root op
(shape, element types, indexing maps) and the `compilation_info` to give it. This module turns each
matcher into an `ExpertEntry`: the op rebuilt as a `Problem` and the configuration described by
meaning (`ExpertConfig`: workgroup/reduction tiles per loop, intrinsic, subgroup counts, workgroup
size, pipeline), so it can be looked up in an enumerated candidate table (`expert_columns`).

Current syntax (`#iree_gpu.lowering_config<{workgroup = ..., mma_kind = ...}>`) is parsed with
IREE's Python bindings. Older syntax is mapped by meaning first:
- 2025 TileAndFuse specs: `translation_info = <pipeline = LLVMGPUTileAndFuse ...>`;
- 2024 specs: `#iree_codegen.lowering_config<tile_sizes = [[...]]>` (one level: parallel loops
  carry workgroup tiles, reduction loops reduction tiles), `#iree_gpu.mma_schedule<intrinsic =
  ..., subgroup_m_count, subgroup_n_count>` and intrinsic names `MFMA_<in>_MxNxK_<out>`.
Dynamic sizes (`dims_equal [-1, ...]`, `tensor<?x...>`) become `dynamic_size` (2: the SDXL batch).
Ops are rebuilt from IREE 3.13's matcher ops (`transform.iree.match.contraction` / `convolution`
/ `attention` / `online_attention`: indexing maps, element types, `dims_equal` per dimension
class, as IREE's tuner and dispatchtune's own specs write them), from DAG matchers
(`cast_compatible_dag_from_root`) and from 2024 named-op matchers. A convolution configured as an
implicit GEMM (tile lists shorter than its loops) is read in IREE's IGEMM loops; unit loops IREE
folds (batch 1) are dropped when the lists are that much shorter. Attention matchers that name
no size (any f16 `online_attention`, some with static dims or `dim_is_multiple_of`) become one
entry per SDXL attention shape they match (`SDXL_ATTENTION_SHAPES`, sized class by class in the
matcher's own layout when it states its maps); those with `dims_equal` are the one attention
they name. Either way the `decomposition_config`
(intrinsic, subgroup basis) is read with IREE's bindings. A file that matches one op twice with
one configuration (attention in both forms) counts it once. Matchers the project cannot rebuild
(transform-dialect scripts) are kept with a reason.

A dispatch two matchers of a file match gets the configuration of the first in the file's
`foreach_match` order, as in IREE; the other is skipped as shadowed. A file's name may state the
product, architecture and compute-partition mode it was tuned on (`named_product`,
`named_architecture`, `named_partitions`: `_mi308`, `_gfx1100`, `_qpx`), which the choice of
space and the per-CU features need.

Spec files are read as a hostile reader would: text only (nothing is executed), `//` comments
dropped, every matcher (a named sequence that yields a configuration) either becomes an entry or
is skipped with a reason (`skip_reasons` counts them), and nothing a file says can raise anything
but a one-line `InputError` for the file (unreadable, not UTF-8, aliases that expand without bound).
Intermediate syntax generations are mapped to IREE 3.13's before its bindings read them
(`modernise`): `translation_info<LLVMGPUVectorDistribute ...>` / `<pipeline = LLVMGPU...>` pipeline
spellings, 2024 intrinsic names, `mma_schedule` in the translation config and
`subgroup_m_count`/`subgroup_n_count` in a `#iree_gpu.lowering_config`.

The package reads in that order: `entries` (what a matcher becomes), `text` (helpers), `problems`
(the op rebuilt), `configs` (the configuration by meaning, and in candidate-table columns),
`files` (files and directories).
"""

from dispatchtune.datasets.expert_specs.configs import (
    configuration_columns,
    expert_columns,
    gemm_classes,
    modernise,
)
from dispatchtune.datasets.expert_specs.entries import ExpertConfig, ExpertEntry
from dispatchtune.datasets.expert_specs.files import (
    PARTITION_MODES,
    load_spec_dir,
    load_spec_file,
    named_architecture,
    named_partitions,
    named_product,
    skip_reasons,
)
from dispatchtune.datasets.expert_specs.problems import (
    DYNAMIC_SIZE,
    SDXL_ATTENTION_SHAPES,
    attention_problem,
    contraction_problem,
    convolution_problem,
)
from dispatchtune.datasets.expert_specs.text import current_intrinsic

__all__ = [
    "DYNAMIC_SIZE", "PARTITION_MODES", "SDXL_ATTENTION_SHAPES", "ExpertConfig", "ExpertEntry",
    "attention_problem", "configuration_columns", "contraction_problem", "convolution_problem",
    "current_intrinsic", "expert_columns", "gemm_classes", "load_spec_dir", "load_spec_file",
    "modernise", "named_architecture", "named_partitions", "named_product", "skip_reasons",
]
