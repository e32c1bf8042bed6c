"""The GEMV model's constants and its one formula, for both of ``templates.gemv``'s programs.

``y[M, N] = x[M, K] @ W[N, K].T`` for M <= 16 streams W once, so a kernel's time is the soft maximum
(a p-norm) of what can hold it back:

* **memory**: W's bytes (and y's) over the DRAM bandwidth a streaming kernel reaches;
* **latency chain**: each CTA walks K in steps; a step costs a load's latency plus its transfer at the
  SM's share of bandwidth, divided by the loads in flight (the mma path's pipeline stages), times the
  waves of CTAs (what decides small weights, where too few CTAs or too few bytes in flight per SM
  cannot cover the latency);
* **issue** (``simt``): the CUDA cores do ``c_w + c_x * M`` SM-cycles of work per weight element (one
  conversion of W, then per row of x a load, a conversion and an FMA), at a rate that needs enough
  resident warps per SM (``warps / (warps + half)`` of the peak): at M = 16 this, not memory, bounds
  the SIMT kernel, and its threads per row decide it;
* **tensor** (``mma``): per step, the ``16 x block_N x block_K`` mma.sync product at the family's
  mma.sync rate plus a fixed per-step cost (barrier waits, ldmatrix), shared by the CTAs of an SM.

``split_k > 1`` (mma only) adds the second kernel that sums the fp32 partials: a launch and its bytes.
The constants are fitted on measured grids by ``python -m carver.calibrate_gemv`` (docs/gemv.md says
which and why); the mma ones start from the GEMM calibration until grids of that path exist.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .arch import GPUArch

__all__ = ["GEMV_CONSTANTS", "GemvConstants", "GemvTime", "gemv_constants_for", "gemv_time"]


@dataclass(frozen=True)
class GemvConstants:
    """The GEMV model's constants for one arch family (times in us, bandwidths in bytes/us)."""

    dram_fraction: float      # fraction of the data-sheet DRAM bandwidth a streaming kernel reaches
    load_latency_us: float    # SIMT: issue-to-arrival latency of a step's loads, unloaded
    sm_bandwidth: float       # SIMT: bytes/us one SM ingests
    simt_w_cycles: float      # SM-cycles per weight element, independent of M (W's conversion, indexing)
    simt_x_cycles: float      # SM-cycles per weight element and row of x (x load, conversion, FMA)
    simt_warps_half: float    # resident warps per SM at which the SIMT issue rate is half its peak
    softmax_p: float          # p of the p-norm that blends the limits
    launch_us: float          # launch and tail of one kernel
    mma_fraction: float       # fraction of the tensor peak mma.sync reaches (m16n8k16)
    mma_load_latency_us: float  # mma: latency of a tile load (TMA or cp.async) into shared memory
    mma_sm_bandwidth: float   # mma: bytes/us one SM ingests into shared memory
    mma_step_us: float        # fixed cost per pipelined step of the mma path (barriers, ldmatrix)
    stage_efficiency: float   # how much each extra pipeline stage adds to the loads in flight

    def replace(self, **changes: float) -> GemvConstants:
        return dataclasses.replace(self, **changes)


#: Hopper: the SIMT constants fitted on the four H200 grids of benchmarks/data/gemv-2026-11-21-h200/grid
#: (``python -m carver.calibrate_gemv``; docs/gemv.md); the mma ones are the GEMM calibration's
#: (carver/model.py: load latency, per-SM bandwidth, iteration cost, stage efficiency, mma.sync
#: fraction) until a grid of that path is measured.
_HOPPER = GemvConstants(
    dram_fraction=0.8399, load_latency_us=0.1911, sm_bandwidth=1_532_000.0, simt_w_cycles=0.1047,
    simt_x_cycles=0.02077, simt_warps_half=4.228, softmax_p=4.0, launch_us=5.374,
    mma_fraction=0.62, mma_load_latency_us=0.3537, mma_sm_bandwidth=94_416.0, mma_step_us=0.1197,
    stage_efficiency=0.7816,
)
_AMPERE = _HOPPER.replace(load_latency_us=0.45, sm_bandwidth=60_000.0, mma_fraction=1.0, mma_load_latency_us=0.45,
                          mma_sm_bandwidth=60_000.0)
#: Constants per arch family (the GEMM model's families).
GEMV_CONSTANTS: dict[str, GemvConstants] = {"hopper": _HOPPER, "ampere": _AMPERE, "ada": _AMPERE}


def gemv_constants_for(arch: GPUArch) -> GemvConstants:
    return GEMV_CONSTANTS[arch.family]


@dataclass(frozen=True)
class GemvTime:
    """One config's predicted time (us) and its terms."""

    total_us: float
    memory_us: float
    chain_us: float
    compute_us: float
    waves: float
    ctas: int


def _smax(p: float, *terms: float) -> float:
    top = max(terms)
    return top * sum((t / top) ** p for t in terms) ** (1.0 / p) if top > 0 else 0.0


def gemv_time(arch: GPUArch, const: GemvConstants, M: int, N: int, K: int, in_bytes: int, out_bytes: int,
              path: str, block_N: int, block_K: int, thread_num: int, num_stages: int = 0,
              split_k: int = 1, use_tma: bool = True) -> GemvTime:
    """The model for one legal config (``path`` "simt" or "mma"; the rules are the caller's).
    ``use_tma=False``: the mma path's cp.async program. The model only drops the TMA producer warpgroup's
    threads from the occupancy; where shared memory bounds occupancy it predicts the two programs alike
    (``templates.gemv.space.candidates`` appends cp.async configs as variants rather than ranking them)."""
    sms = arch.sm_count
    mma = path == "mma"
    k_len = math.ceil(math.ceil(K / split_k) / block_K) * block_K if mma else K  # K per CTA, whole steps
    steps = math.ceil(k_len / block_K)
    ctas = math.ceil(N / block_N) * (split_k if mma else 1)
    tma = use_tma and mma and arch.has_tma and num_stages >= 1 and K * in_bytes % 16 == 0  # else cp.async
    threads = thread_num + (128 if tma else 0)  # TileLang's TMA producer warpgroup
    occ = min(arch.max_threads_per_sm // threads, arch.max_blocks_per_sm)
    if mma:
        smem = max(num_stages, 1) * (16 + block_N) * block_K * in_bytes + arch.smem_reserved_per_block
        occ = min(occ, arch.smem_per_sm // smem)
    occ = max(occ, 1)
    per_wave = sms * occ
    waves = ctas / per_wave
    active = min(ctas, per_wave)
    per_sm = active / min(active, sms)
    busy_sms = min(ctas, sms)

    step_bytes = (block_N + M) * block_K * in_bytes  # W from DRAM, x from L2
    l0, bw = (const.mma_load_latency_us, const.mma_sm_bandwidth) if mma else (const.load_latency_us, const.sm_bandwidth)
    latency = l0 + step_bytes * per_sm / bw
    memory = (N * K * in_bytes + M * N * out_bytes) / (arch.dram_bandwidth / 1e6 * const.dram_fraction)
    if mma:
        s_eff = 1.0 + max(num_stages - 1, 0) * const.stage_efficiency
        peak = arch.peak_flops("float16") / sms / 1e6 * const.mma_fraction
        step = 2.0 * 16 * block_N * block_K / peak * per_sm + const.mma_step_us
        chain = math.ceil(waves) * (latency + steps * _smax(const.softmax_p, latency / s_eff, step))
        compute = math.ceil(waves) * steps * step
        extra = 0.0
        if split_k > 1:  # the partials are written and summed by a second kernel
            work = M * N * (2 * split_k * 4 + out_bytes)
            extra = const.launch_us + work / (arch.dram_bandwidth / 1e6 * const.dram_fraction)
        total = _smax(const.softmax_p, memory, chain) + const.launch_us + extra
    else:
        chain = math.ceil(waves) * steps * latency
        # Few resident warps per SM cannot keep the CUDA cores issuing (dependent FMAs, no other warp to
        # switch to): the rate saturates as warps / (warps + half).
        warps = per_sm * thread_num / arch.warp_size
        rate = busy_sms * arch.clock_mhz * warps / (warps + const.simt_warps_half)
        compute = N * K * (const.simt_w_cycles + const.simt_x_cycles * M) / rate
        total = _smax(const.softmax_p, memory, chain, compute) + const.launch_us
    return GemvTime(total, memory, chain, compute, waves, ctas)
