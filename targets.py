"""Target registry: each compile target, its flags, its runtime device and its hardware facts.

GPU facts (subgroup sizes, workgroup memory, compute units, MMA intrinsics) come from IREE's own
`iree_gpu.TargetInfo` for the target, read from a probe compile; CPU facts come from the executable
target IREE builds for this machine (`native_vector_size`, CPU features) and the OS (cores, caches).
Facts are probed once per process and cached.
"""

from __future__ import annotations

import functools
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from dispatchtune.errors import DispatchTuneError, TargetError
from dispatchtune.toolchain import compile_to_text, iree_compiler_version

logger = logging.getLogger(__name__)

Backend = Literal["llvm-cpu", "rocm", "cuda"]


@dataclass(frozen=True)
class CpuFacts:
    """Hardware facts of an llvm-cpu target."""

    cpu: str
    native_vector_bytes: int
    vector_registers: int
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    features: tuple[str, ...] = field(repr=False, default=())

    @property
    def max_vector_bytes(self) -> int:
        """IREE's LLVMCPU verifier rejects vector ops of this many bytes or more.

        The bound is 512 native vectors (measured with iree-compile 3.13: "large vector sizes
        (8192 / 16384 / 32768 bytes)" for 16 / 32 / 64-byte native vectors).
        """
        return 512 * self.native_vector_bytes


@dataclass(frozen=True)
class GpuFacts:
    """Hardware facts of a GPU target, from `iree_gpu.TargetInfo` (plus a documented fallback)."""

    arch: str
    subgroup_sizes: tuple[int, ...]
    max_threads_per_workgroup: int
    max_workgroup_sizes: tuple[int, ...]
    max_workgroup_memory_bytes: int
    compute_units: int
    simds_per_cu: int
    mma_intrinsics: tuple[str, ...] = field(repr=False, default=())
    registers_per_simd: int = 512  # 32-bit registers per lane available to one wave/warp


def intrinsic_shape(name: str) -> tuple[int, int, int] | None:
    """M, N and K of an MMA intrinsic, read from its name (`MFMA_F32_16x16x16_F16`: 16 x 16 x
    16; older spellings too); None when the name carries no shape."""
    match = re.search(r"(\d+)x(\d+)x(\d+)", name)
    if not match:
        return None
    m, n, k = (int(v) for v in match.groups())
    return m, n, k


def intrinsic_operand_types(name: str) -> tuple[str, ...]:
    """The operand element types an intrinsic's name ends with (`MFMA_I32_16x16x32_I8`:
    `("i8",)`), lower case; empty when the name does not end that way."""
    match = re.search(r"_\d+x\d+x\d+((?:_[A-Za-z0-9]+)+)$", name)
    return tuple(t.lower() for t in match.group(1).split("_")[1:]) if match else ()


@dataclass(frozen=True)
class Target:
    """A compile target and the device its binaries run on.

    `compute_units_fallback` is used when IREE's TargetInfo reports no CU count for an
    architecture name (it only knows it for product names such as mi300x).
    """

    name: str
    backend: Backend
    arch: str
    description: str
    compile_flags: tuple[str, ...]
    device_uri: str
    aliases: tuple[str, ...] = ()
    compute_units_fallback: int = 0
    simds_fallback: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.backend != "llvm-cpu"

    @property
    def tuning_spec_flag(self) -> str:
        """The flag that makes iree-compile apply a tuning spec for this target.

        CUDA silently ignores `--iree-codegen-tuning-spec-path` in IREE 3.13; the transform-dialect
        library flag (same spec file, entry `__kernel_config`) works on every backend there.
        """
        if self.backend == "cuda":
            return "--iree-codegen-transform-dialect-library"
        return "--iree-codegen-tuning-spec-path"

    def tuning_spec_flags(self, spec: str | os.PathLike[str]) -> tuple[str, ...]:
        """The iree-compile flags that apply the tuning spec `spec`, and keep it from hanging.

        IREE 3.13 deadlocks now and then when it configures a module's executables in parallel
        with a spec: its worker threads wait on the lock that loads the spec
        (`IREECodegenDialect::getOrLoadTransformLibraryModule`; measured on a two-dispatch model,
        1 hang in 100-150 compiles with threads, none in 400 without). One thread costs little
        next to a compile that never ends.
        """
        return (f"{self.tuning_spec_flag}={os.fspath(spec)}", "--mlir-disable-threading")

    def check_runs_here(self, remedy: str = "use --target host or --compile-only") -> None:
        """Raise a one-line `TargetError` if this machine cannot run this llvm-cpu target's code
        (`remedy`: what the command suggests instead)."""
        if self.is_gpu or self.name == _TARGETS[0].name:
            return
        missing = sorted(set(self.cpu_facts().features) - set(_TARGETS[0].cpu_facts().features))
        if missing:
            raise TargetError(
                f"this machine's CPU lacks {', '.join(missing[:4])}"
                f"{' ...' if len(missing) > 4 else ''} of {self.arch}, so {self.name} binaries "
                f"cannot be benchmarked here; {remedy}"
            )

    def cpu_facts(self) -> CpuFacts:
        if self.is_gpu:
            raise TargetError(f"target {self.name} is a GPU target; it has no CPU facts")
        return _probe_cpu(self)

    def gpu_facts(self) -> GpuFacts:
        if not self.is_gpu:
            raise TargetError(f"target {self.name} is a CPU target; it has no GPU facts")
        return _probe_gpu(self)


_LOCAL_CPU_FLAGS = (
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
)
_CPU_FLAGS = (*_LOCAL_CPU_FLAGS, "--iree-llvmcpu-target-cpu=host")

_TARGETS: tuple[Target, ...] = (
    Target(
        name="host",
        backend="llvm-cpu",
        arch="host",
        description="llvm-cpu on this machine (native vector width, all cores)",
        compile_flags=_CPU_FLAGS,
        device_uri="local-sync",
        aliases=("cpu", "llvm-cpu"),
    ),
    Target(
        name="gfx942",
        backend="rocm",
        arch="gfx942",
        description="AMD CDNA3 (MI300 family), wave64, 64 KiB LDS, MFMA",
        compile_flags=("--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"),
        device_uri="hip://0",
        compute_units_fallback=304,
    ),
    Target(
        name="mi300x",
        backend="rocm",
        arch="gfx942",
        description="AMD Instinct MI300X (gfx942, 304 CUs)",
        compile_flags=("--iree-hal-target-device=hip", "--iree-rocm-target=mi300x"),
        device_uri="hip://0",
    ),
    Target(
        name="gfx1100",
        backend="rocm",
        arch="gfx1100",
        description="AMD RDNA3 (RX 7900 XTX), wave32/64, WMMA",
        compile_flags=("--iree-hal-target-device=hip", "--iree-rocm-target=gfx1100"),
        device_uri="hip://0",
        compute_units_fallback=96,
    ),
    Target(
        name="sm_80",
        backend="cuda",
        arch="sm_80",
        description="NVIDIA Ampere (A100) PTX, warp 32, mma.sync; also runs on Hopper via PTX JIT",
        compile_flags=("--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"),
        device_uri="cuda://0",
        aliases=("a100",),
        compute_units_fallback=108,
        simds_fallback=4,
    ),
)


def list_targets() -> tuple[Target, ...]:
    """Every registered target, in display order."""
    return _TARGETS


#: `llvm-cpu:<cpu>` names an llvm-cpu target for another CPU (an LLVM CPU name: znver4,
#: x86-64-v3, ...): its space and features follow that CPU's vector width and registers.
CPU_PREFIX = "llvm-cpu:"
#: `rocm:<arch or product>` and `cuda:<sm_NN>` name any GPU IREE knows (`rocm:gfx90a`,
#: `rocm:mi250x`, `cuda:sm_86`); bare `gfxNNN` and `sm_NN` names mean the same.
GPU_PREFIXES: dict[str, Backend] = {"rocm:": "rocm", "hip:": "rocm", "cuda:": "cuda"}

#: Compute units of the most common product of a GPU architecture (vendor specifications), for
#: architecture names IREE gives no CU count for (it knows them for product names only: `mi250x`
#: 220, `mi300x` 304). Features that count waves per CU use them; name the product for its own.
_FLAGSHIP_COMPUTE_UNITS = {
    "gfx908": 120,   # Instinct MI100
    "gfx90a": 104,   # Instinct MI210 (one MI250X die: 110)
    "gfx940": 228,   # Instinct MI300A
    "gfx941": 304,   # Instinct MI300X (early)
    "gfx942": 304,   # Instinct MI300X
    "gfx950": 256,   # Instinct MI355X
    "gfx1100": 96,   # Radeon RX 7900 XTX
    "gfx1101": 60,   # Radeon RX 7800 XT
    "gfx1102": 32,   # Radeon RX 7600
    "gfx1200": 32,   # Radeon RX 9060 XT
    "gfx1201": 64,   # Radeon RX 9070 XT
    "sm_70": 80,     # Tesla V100
    "sm_75": 68,     # GeForce RTX 2080 Ti
    "sm_80": 108,    # A100
    "sm_86": 84,     # RTX A6000 / GeForce RTX 3090 (82)
    "sm_89": 128,    # GeForce RTX 4090
    "sm_90": 132,    # H100 SXM
}


def get_target(name: str) -> Target:
    """Look a target up by name or alias; unknown names raise a one-line `TargetError`."""
    wanted = name.strip().lower()
    for target in _TARGETS:
        if wanted == target.name or wanted in target.aliases:
            return target
    if wanted.startswith(CPU_PREFIX) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", wanted[len(CPU_PREFIX):]):
        return cpu_target(wanted[len(CPU_PREFIX):])
    for prefix, backend in GPU_PREFIXES.items():
        if wanted.startswith(prefix) and re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", wanted[len(prefix):]):
            return gpu_target(backend, wanted[len(prefix):])
    if re.fullmatch(r"gfx[0-9a-f]{3,4}", wanted):
        return gpu_target("rocm", wanted)
    if re.fullmatch(r"sm_[0-9]{2,3}a?", wanted):
        return gpu_target("cuda", wanted)
    if re.fullmatch(r"[a-z]+[0-9]+[a-z0-9]*", wanted):
        product = _gpu_product(wanted)
        if product is not None:
            return product
    known = ", ".join(t.name for t in _TARGETS)
    raise TargetError(f"unknown target {name!r}; known targets: {known}, {CPU_PREFIX}<cpu>, "
                      "gfx<N> or rocm:<arch or product>, sm_<N> or cuda:<sm_N>, or a GPU "
                      "product name IREE knows (mi325x, rx7900xtx, a100)")


def _gpu_product(name: str) -> Target | None:
    """The GPU target of a bare product name IREE knows (`mi325x`, `rx7900xtx`, `a100`), asked of
    IREE itself (its target probe, ROCm first), or None. Only reached for names nothing else
    matched, so a typo costs a probe compile or two before its error."""
    for backend in ("rocm", "cuda"):
        target = gpu_target(backend, name)
        try:
            target.gpu_facts()
        except DispatchTuneError:
            continue
        return target
    return None


@functools.cache
def gpu_target(backend: Backend, arch: str) -> Target:
    """A GPU target IREE knows by this architecture or product name (`gfx90a`, `mi250x`,
    `sm_86`); its facts come from IREE's TargetInfo, so a name IREE does not know fails at the
    first probe with IREE's one-line error ("Unknown ROCM target ...")."""
    for known in _TARGETS:  # `rocm:gfx942` is the registered gfx942
        if known.backend == backend and known.compile_flags[-1].endswith(f"={arch}"):
            return known
    if backend == "cuda":
        flags = ("--iree-hal-target-device=cuda", f"--iree-cuda-target={arch}")
        device, simds = "cuda://0", 4  # an SM has 4 warp schedulers (Volta to Hopper)
    else:
        flags, device, simds = ("--iree-hal-target-device=hip", f"--iree-rocm-target={arch}"), "hip://0", 0
    return Target(
        name=arch if re.fullmatch(r"gfx[0-9a-f]{3,4}|sm_[0-9]{2,3}a?", arch) else f"{backend}:{arch}",
        backend=backend,
        arch=arch,
        description=f"{'AMD' if backend == 'rocm' else 'NVIDIA'} {arch} (facts from IREE's target table)",
        compile_flags=flags,
        device_uri=device,
        compute_units_fallback=_FLAGSHIP_COMPUTE_UNITS.get(arch, 0),
        simds_fallback=simds,
    )


def record_target(name: str, cpu: str = "") -> Target:
    """The target a logged result was measured on: its name, and for `host` the CPU it recorded.

    A log of `host` written on another CPU (say AVX-512, read on an AVX2 machine) is featurised
    for the CPU it was measured on, not for this machine's.
    """
    target = get_target(name)
    host = _TARGETS[0]
    if cpu and target.name == host.name and cpu != host.cpu_facts().cpu:
        return cpu_target(cpu)
    return target


@functools.cache
def cpu_target(cpu: str) -> Target:
    """An llvm-cpu target for a named CPU; binaries run here only if this CPU has its features.

    Cores and caches are still read from this machine. An unknown CPU name fails at the first
    probe with IREE's one-line error ("Unknown CPU for target architecture").
    """
    host = _TARGETS[0]
    return Target(
        name=f"{CPU_PREFIX}{cpu}",
        backend="llvm-cpu",
        arch=cpu,
        description=f"llvm-cpu for {cpu} (benchmarks need a CPU with its features)",
        compile_flags=(*_LOCAL_CPU_FLAGS, f"--iree-llvmcpu-target-cpu={cpu}"),
        device_uri=host.device_uri,
    )


# ---- probing ----------------------------------------------------------------------------------
_PROBE_MLIR = """
func.func @probe(%a: tensor<64x64xf16>, %b: tensor<64x64xf16>) -> tensor<64x64xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<64x64xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x64xf32>) -> tensor<64x64xf32>
  %r = linalg.matmul ins(%a, %b : tensor<64x64xf16>, tensor<64x64xf16>)
                     outs(%f : tensor<64x64xf32>) -> tensor<64x64xf32>
  return %r : tensor<64x64xf32>
}
"""


@functools.cache
def _executable_target_text(target: Target) -> str:
    """The `#hal.executable.target<...>` attribute IREE builds for a target, as text."""
    from iree.compiler import ir
    from iree.compiler.dialects import iree_codegen

    text = compile_to_text(
        ["-", *target.compile_flags, "--compile-to=executable-configurations"],
        input_text=_PROBE_MLIR,
        what=f"the {target.name} target probe",
    )
    with ir.Context():
        module = ir.Module.parse(text)
        variants = iree_codegen.get_executable_variant_ops(module)
        return str(variants[0].attributes["target"])


def undescribed_target_error(target: Target, reason: str) -> TargetError | None:
    """The error for a target IREE has no description of, when `reason` (its words) says so."""
    if "missing GPU target" in reason or re.search(r"Unknown \w+ target", reason):
        # e.g. IREE 3.13 has no description of sm_90 or gfx1030.
        return TargetError(f"IREE {iree_compiler_version()} has no GPU description of target "
                           f"{target.name!r} (`{target.compile_flags[-1]}`): {reason}")
    return None


@functools.cache
def _probe_gpu(target: Target) -> GpuFacts:
    from iree.compiler import ir
    from iree.compiler.dialects import iree_gpu

    try:
        text = _executable_target_text(target)
    except DispatchTuneError as exc:  # IREE's own words: "Unknown ROCM target 'gfx9999'"
        raise (undescribed_target_error(target, str(exc))
               or TargetError(f"IREE cannot compile for {target.name}: {exc}")) from None
    with ir.Context():
        info = iree_gpu.TargetInfo.get_gpu_target_info(ir.Attribute.parse(text))
        facts = GpuFacts(
            arch=str(info.arch),
            subgroup_sizes=tuple(int(s) for s in info.subgroup_size_choices),
            max_threads_per_workgroup=int(info.max_thread_count_per_workgroup),
            max_workgroup_sizes=tuple(int(s) for s in info.max_workgroup_sizes),
            max_workgroup_memory_bytes=int(info.max_workgroup_memory_bytes),
            compute_units=int(info.workgroup_count) or target.compute_units_fallback
            or _FLAGSHIP_COMPUTE_UNITS.get(str(info.arch), 0),
            simds_per_cu=int(info.simds_per_workgroup) or target.simds_fallback,
            mma_intrinsics=tuple(str(i) for i in info.mma_intrinsics),
        )
    if facts.compute_units == 0:
        # The features then count one CU, so the terms that need the count are all alike.
        logger.warning("%s: IREE gives no compute-unit count for %s and none is known here; "
                       "features that count workgroups per CU are neutral", target.name,
                       facts.arch)
    return facts


def _cache_bytes(level: int, kind: str) -> int:
    """Per-core cache size from sysfs (0 when unknown)."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            if int((index / "level").read_text()) != level:
                continue
            if (index / "type").read_text().strip() not in kind:
                continue
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        factor = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(size[-1], 1)
        return int(size.rstrip("KMG")) * factor
    return 0


@functools.cache
def _probe_cpu(target: Target) -> CpuFacts:
    text = _executable_target_text(target)
    cpu = re.search(r'cpu = "([^"]*)"', text)
    features_match = re.search(r'cpu_features = "([^"]*)"', text)
    width = re.search(r"native_vector_size = (\d+)", text)
    features = tuple(
        f[1:]
        for f in (features_match.group(1).split(",") if features_match else [])
        if f.startswith("+")
    )
    # x86 has 32 vector registers with AVX-512 and 16 without; AArch64 has 32.
    registers = 32 if ("avx512f" in features or "neon" in features or "sve" in features) else 16
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )
    return CpuFacts(
        cpu=cpu.group(1) if cpu else "generic",
        native_vector_bytes=int(width.group(1)) if width else 16,
        vector_registers=registers,
        cores=cores,
        l1d_bytes=_cache_bytes(1, "Data Unified") or 32 * 1024,
        l2_bytes=_cache_bytes(2, "Unified Data") or 1024 * 1024,
        l3_bytes=_cache_bytes(3, "Unified Data") or 8 * 1024 * 1024,
        features=features,
    )
