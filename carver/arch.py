"""GPU descriptions the carver models, as plain frozen dataclasses that need no GPU to build.

TileLang's ``CUDA("cuda")`` needs a physical device and, without one, silently falls back to CUDA-core
hints with a 48 KB shared-memory limit. Here every built-in GPU is described from its public data sheet,
so ranking works on a laptop or a CI box; ``CUDA("cuda")`` reads the local device from the CUDA driver
(``autotuner.forking.local_gpus``: asked in a forked child, so that reading it does not start CUDA in
this process; lazily: importing this module imports neither torch nor tilelang) and overlays what the
driver reports on the built-in entry for that model. Users can build a :class:`GPUArch` for a GPU we do not list.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import types
from dataclasses import dataclass, field

__all__ = [
    "ARCHS",
    "CDNA",
    "CUDA",
    "GPUArch",
    "TensorInstruction",
    "known_names",
]

logger = logging.getLogger(__name__)

_KB = 1024
_MB = 1024 * 1024
_GB = 1024 * _MB


@dataclass(frozen=True)
class TensorInstruction:
    """One tensor-core instruction family, e.g. Hopper's ``wgmma.m64nNk16``.

    ``n_min..n_max`` step ``n_step`` is the legal N range of one instruction; ``k_bytes`` is the K extent
    in bytes (32 bytes: k16 for fp16/bf16, k32 for fp8), so one entry covers every input width.
    ``warps`` is how many warps issue it together (4 for a wgmma warpgroup, 1 for ``mma.sync``).
    """

    name: str
    m: int
    n_min: int
    n_max: int
    n_step: int
    k_bytes: int
    warps: int


WGMMA = TensorInstruction("wgmma", m=64, n_min=8, n_max=256, n_step=8, k_bytes=32, warps=4)
MMA_SYNC = TensorInstruction("mma.sync", m=16, n_min=8, n_max=8, n_step=8, k_bytes=32, warps=1)


@dataclass(frozen=True)
class GPUArch:
    """What the carver needs to know about one GPU (all sizes in bytes, rates per second).

    ``tensor_peak`` is the dense tensor-core peak (FLOP/s) per input dtype with fp32 accumulation, the
    data-sheet number without sparsity; a dtype missing from it is not supported on this GPU.
    ``smem_per_block`` is the opt-in maximum of dynamic shared memory one block may request (227 KB on
    Hopper, not the 48 KB default that TileLang's carver reads). ``memory_bytes`` is the device memory
    (None: unknown, then problems are bounded by :data:`carver.problem.MAX_DEVICE_BYTES`); a problem whose
    tensors do not fit is refused when it is bound to this GPU.
    """

    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    smem_per_block: int
    smem_per_sm: int
    l2_bytes: int
    dram_bandwidth: float
    tensor_peak: tuple[tuple[str, float], ...]
    clock_mhz: int
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    regs_per_sm: int = 65536
    max_regs_per_thread: int = 255
    max_threads_per_block: int = 1024
    smem_reserved_per_block: int = 1024
    warp_size: int = 32
    tensor_instructions: tuple[TensorInstruction, ...] = field(default=(MMA_SYNC,))
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        for name in ("sm_count", "smem_per_block", "smem_per_sm", "l2_bytes", "regs_per_sm",
                     "max_threads_per_sm", "max_blocks_per_sm", "max_threads_per_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPUArch.{name} must be a positive int, got {value!r}")
        m = self.memory_bytes
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m <= 0):
            raise ValueError(f"GPUArch.memory_bytes must be a positive int (bytes of device memory) or None, "
                             f"got {m!r}")
        if not self.dram_bandwidth > 0:
            raise ValueError(f"GPUArch.dram_bandwidth must be > 0 bytes/s, got {self.dram_bandwidth!r}")
        if not self.tensor_peak:
            raise ValueError(f"GPUArch {self.name!r} needs at least one tensor_peak entry, e.g. "
                             f"(('float16', 989.4e12),); the carver models tensor-core kernels only")

    @property
    def sm_version(self) -> int:
        """90 for sm_90: the number nvcc's ``-arch=sm_XX`` takes."""
        return self.compute_capability[0] * 10 + self.compute_capability[1]

    @property
    def family(self) -> str:
        """The model-constant family: "hopper", "ada" or "ampere" (constants are calibrated per family)."""
        major, minor = self.compute_capability
        if major >= 9:
            return "hopper"
        if (major, minor) >= (8, 9):
            return "ada"
        return "ampere"

    @property
    def has_wgmma(self) -> bool:
        return any(i.name == "wgmma" for i in self.tensor_instructions)

    @property
    def has_tma(self) -> bool:
        """TMA bulk copies (sm_90+): TileLang then warp-specializes pipelined loops (a producer warpgroup)."""
        return self.compute_capability[0] >= 9

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s for ``dtype`` inputs; raises if this GPU has no tensor path for it."""
        for name, flops in self.tensor_peak:
            if name == dtype:
                return flops
        raise ValueError(f"{self.name} has no tensor-core peak for {dtype!r}; it supports "
                         f"{[n for n, _ in self.tensor_peak]}. Use one of those dtypes or add the peak to "
                         f"GPUArch.tensor_peak")

    def supports(self, dtype: str) -> bool:
        return any(name == dtype for name, _ in self.tensor_peak)


def _hopper_peaks(fp16: float) -> tuple[tuple[str, float], ...]:
    return (("float16", fp16), ("bfloat16", fp16), ("float8_e4m3", 2 * fp16), ("float8_e5m2", 2 * fp16))


def _ampere_peaks(fp16: float) -> tuple[tuple[str, float], ...]:
    return (("float16", fp16), ("bfloat16", fp16))


_HOPPER = dict(compute_capability=(9, 0), smem_per_block=227 * _KB, smem_per_sm=228 * _KB,
               tensor_instructions=(WGMMA, MMA_SYNC))
_ADA = dict(compute_capability=(8, 9), smem_per_block=99 * _KB, smem_per_sm=100 * _KB,
            max_threads_per_sm=1536, max_blocks_per_sm=24)
# Device memory: the data sheet's GB read as GiB, a little above what the driver reports, so the bound
# refuses only what cannot fit (CUDA('cuda') overlays the exact total).

#: The built-in table (data-sheet numbers, dense tensor peaks with fp32 accumulation).
ARCHS: dict[str, GPUArch] = {a.name: a for a in (
    GPUArch("H100", sm_count=132, l2_bytes=50 * _MB, dram_bandwidth=3.35e12,
            tensor_peak=_hopper_peaks(989.4e12), clock_mhz=1980, **_HOPPER, memory_bytes=80 * _GB),
    GPUArch("H100-PCIe", sm_count=114, l2_bytes=50 * _MB, dram_bandwidth=2.0e12,
            tensor_peak=_hopper_peaks(756.5e12), clock_mhz=1755, **_HOPPER, memory_bytes=80 * _GB),
    GPUArch("H200", sm_count=132, l2_bytes=60 * _MB, dram_bandwidth=4.8e12,
            tensor_peak=_hopper_peaks(989.4e12), clock_mhz=1980, **_HOPPER, memory_bytes=141 * _GB),
    GPUArch("A100-40GB", compute_capability=(8, 0), sm_count=108, smem_per_block=163 * _KB,
            smem_per_sm=164 * _KB, l2_bytes=40 * _MB, dram_bandwidth=1.555e12,
            tensor_peak=_ampere_peaks(312e12), clock_mhz=1410, memory_bytes=40 * _GB),
    GPUArch("A100-80GB", compute_capability=(8, 0), sm_count=108, smem_per_block=163 * _KB,
            smem_per_sm=164 * _KB, l2_bytes=40 * _MB, dram_bandwidth=2.039e12,
            tensor_peak=_ampere_peaks(312e12), clock_mhz=1410, memory_bytes=80 * _GB),
    GPUArch("L40S", sm_count=142, l2_bytes=96 * _MB, dram_bandwidth=864e9,
            tensor_peak=_ampere_peaks(362.05e12), clock_mhz=2520, **_ADA, memory_bytes=48 * _GB),
    GPUArch("RTX4090", sm_count=128, l2_bytes=72 * _MB, dram_bandwidth=1008e9,
            tensor_peak=_ampere_peaks(165.2e12), clock_mhz=2520, **_ADA, memory_bytes=24 * _GB),
    GPUArch("RTX3090", compute_capability=(8, 6), sm_count=82, smem_per_block=99 * _KB,
            smem_per_sm=100 * _KB, l2_bytes=6 * _MB, dram_bandwidth=936e9,
            tensor_peak=_ampere_peaks(71e12), clock_mhz=1695, max_threads_per_sm=1536,
            max_blocks_per_sm=16, memory_bytes=24 * _GB),
)}

# Aliases, keyed by the normalised spelling (lower case, alphanumerics only, no "nvidia"/"geforce").
_ALIASES: dict[str, str] = {
    **{k: "H100" for k in ("h100", "h100sxm", "h100sxm5", "h100sxm580gb", "h10080gbhbm3", "h100hbm3",
                           "sm90", "sm90a", "hopper")},
    **{k: "H100-PCIe" for k in ("h100pcie", "h10080gbpcie", "h100pcie80gb")},
    **{k: "H200" for k in ("h200", "h200sxm", "h200141gbhbm3e", "h200hbm3e")},
    **{k: "A100-40GB" for k in ("a10040gb", "a100sxm440gb", "a100pcie40gb", "a10040gbpcie")},
    **{k: "A100-80GB" for k in ("a100", "a10080gb", "a100sxm480gb", "a10080gbpcie", "a100pcie80gb",
                                "sm80", "ampere")},
    **{k: "L40S" for k in ("l40s", "sm89", "ada")},
    **{k: "RTX4090" for k in ("rtx4090", "4090")},
    **{k: "RTX3090" for k in ("rtx3090", "3090", "sm86")},
}


def _normalise(name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    for prefix in ("nvidia", "geforce"):
        key = key.removeprefix(prefix)
    return key


def known_names() -> list[str]:
    """Every name :func:`CUDA` accepts besides "cuda": the built-in entries and their aliases."""
    return sorted(ARCHS) + sorted({a for a in _ALIASES if a not in {_normalise(n) for n in ARCHS}})


def _lookup(name: str) -> GPUArch | None:
    key = _normalise(name)
    for canonical in ARCHS:
        if _normalise(canonical) == key:
            return ARCHS[canonical]
    return ARCHS[_ALIASES[key]] if key in _ALIASES else None


def CUDA(name: str | GPUArch = "cuda") -> GPUArch:  # noqa: N802 - the name TileLang users know
    """A GPU description by name ("H100", "sm_90", "NVIDIA H100 80GB HBM3", ...), or "cuda" / "cuda:1"
    for the local device (needs torch and a visible GPU). A :class:`GPUArch` is returned as is.

    An unknown name is an error that lists the known ones: silently modelling some other GPU (or
    CUDA cores instead of tensor cores, as TileLang's carver does) gives hints that look fine and are not.
    """
    if isinstance(name, GPUArch):
        return name
    if not isinstance(name, str):
        raise TypeError(f"CUDA() takes a GPU name or a GPUArch, got {name!r} of type {type(name).__name__}")
    if re.fullmatch(r"cuda(:\d+)?", name.strip().lower()):
        index = int(name.split(":")[1]) if ":" in name else 0
        return _local_device(index)
    arch = _lookup(name)
    if arch is None:
        raise ValueError(f"unknown GPU {name!r}; known: {', '.join(known_names())}, or 'cuda' for the local "
                         f"device. For another GPU build a carver.arch.GPUArch(...) and pass it instead")
    return arch


def CDNA(name: str = "hip") -> GPUArch:  # noqa: N802 - the name TileLang users import
    """TileLang's AMD architecture, here so that ``from carver.arch import CDNA`` (TileLang's examples
    import it next to ``CUDA``) resolves; the carver models NVIDIA GPUs only, so calling it is an error."""
    raise NotImplementedError(f"CDNA({name!r}): tilecarve's carver models NVIDIA GPUs only (carver.arch.CUDA); "
                              "for AMD GPUs use TileLang's own carver (tilelang.carver.arch.CDNA)")


def _local_device(index: int) -> GPUArch:
    """The local GPU: the built-in entry for its model, overlaid with what the driver reports."""
    from autotuner.forking import local_gpus  # the driver asked without starting CUDA in this process

    try:
        gpus = local_gpus()
    except ImportError as e:  # no driver to ask, and no torch: the carver itself does not need it
        raise RuntimeError("CUDA('cuda') reads the local GPU through the CUDA driver or torch, and neither is "
                           "available; name the GPU instead, e.g. CUDA('H100')") from e
    if index >= len(gpus):
        raise RuntimeError(f"CUDA('cuda') found no CUDA device {index} ({len(gpus)} visible); name the GPU "
                           f"instead, e.g. CUDA('H100')")
    props = types.SimpleNamespace(**gpus[index])
    base = _lookup(props.name)
    cc = (props.major, props.minor)
    if base is None:
        by_cc = {(9, 0): "H100", (8, 0): "A100-80GB", (8, 9): "L40S", (8, 6): "RTX3090"}
        if cc not in by_cc:
            raise ValueError(f"local GPU {props.name!r} (sm_{cc[0]}{cc[1]}) is not in the built-in table and "
                             f"its compute capability has no template; build a carver.arch.GPUArch for it")
        base = ARCHS[by_cc[cc]]
        logger.warning("local GPU %r is not in the built-in table; modelling it as %s with the SM count, "
                       "shared memory and L2 the driver reports", props.name, base.name)
    sms = int(props.multi_processor_count)
    scale = sms / base.sm_count  # a cut-down part has proportionally less tensor throughput
    overlay = dict(
        name=str(props.name),
        compute_capability=cc,
        sm_count=sms,
        smem_per_block=int(getattr(props, "shared_memory_per_block_optin", 0) or base.smem_per_block),
        smem_per_sm=int(getattr(props, "shared_memory_per_multiprocessor", 0) or base.smem_per_sm),
        l2_bytes=int(getattr(props, "L2_cache_size", 0) or base.l2_bytes),
        regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 0) or base.regs_per_sm),
        max_threads_per_sm=int(getattr(props, "max_threads_per_multi_processor", 0)
                               or base.max_threads_per_sm),
        tensor_peak=tuple((d, f * scale) for d, f in base.tensor_peak),
        clock_mhz=int(getattr(props, "clock_rate", 0) or 0) // 1000 or base.clock_mhz,  # kHz when present
        memory_bytes=int(getattr(props, "total_memory", 0) or 0) or base.memory_bytes,
    )
    arch = dataclasses.replace(base, **overlay)
    logger.info("CUDA('cuda'): %s, %d SMs, %d KB smem/block, %d MB L2", arch.name, arch.sm_count,
                arch.smem_per_block // _KB, arch.l2_bytes // _MB)
    return arch
