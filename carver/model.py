"""The latency model: a Roller-style roofline per K-iteration, made Hopper-aware, for many configs at once.

Per CTA and per K-iteration (one ``block_M x block_N x block_K`` step) the model takes the slowest of
four physical limits, blended by a soft maximum (a p-norm) because real overlap is never perfect:

* **compute**: the tensor cores, ``2*bm*bn*bk / (peak per SM)``, derated by the tensor instruction's
  width (a narrow ``wgmma`` N wastes issue slots: efficiency ``n / (n + n0)``), plus a fixed per-iteration
  cost (mbarrier wait, ``wgmma`` fence/commit/wait) and, with a single consumer warpgroup, the tensor
  pipeline drain that ``warpgroup_wait<0>`` exposes every iteration.
* **pipeline latency**: a load takes ``L = L0 + bytes / per-SM bandwidth + miss share * miss latency``;
  with S stages in flight the loop advances ``(L + compute) / S_eff`` per iteration
  (S_eff = 1 + (S-1)*stage_efficiency). Without a TMA producer (num_stages 0, or a misaligned stride)
  copies are synchronous or cp.async and latency is hidden only by other CTAs on the SM (occupancy).
* **memory**: bytes all concurrently running CTAs request per iteration over the L2-to-SM bandwidth,
  and the DRAM misses over DRAM bandwidth, joined by the same soft maximum (two resources that work at
  once). Misses are the unique A rows and B columns the CTAs of one wave touch, which is what
  rasterization (TileLang's 2D row swizzle, panel 10) shrinks; the share of a wave's loads that miss
  also lengthens the load latency above, which is where rasterization pays when the memory system is
  not saturated.
* **per-SM ingest**: the bytes one SM's CTAs load per iteration over the per-SM bandwidth.

A CTA costs a pipeline fill, ``k_iters`` iterations and an epilogue (C through shared memory, TMA
store). The kernel runs in waves of ``SMs x occupancy`` CTAs; a partial last wave runs with fewer CTAs
sharing the memory system. Constants are per arch family, calibrated on measured grids
(``carver.calibrate``, docs/carver.md); everything else comes from the GPU's data sheet.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from .arch import GPUArch
from .lowering import Lowering
from .problem import MatmulProblem

__all__ = [
    "CONSTANTS",
    "ModelConstants",
    "Terms",
    "constants_for",
    "predict_arrays",
]


@dataclass(frozen=True)
class ModelConstants:
    """The calibrated constants of one arch family (times in microseconds, bandwidths in bytes/us)."""

    load_latency_us: float        # L0: issue-to-arrival latency of a tile load, unloaded
    sm_bandwidth: float           # bytes/us one SM can ingest (TMA or LSU)
    l2_bandwidth_per_sm: float    # L2-to-SM fabric bandwidth, per SM of the GPU
    dram_efficiency: float        # fraction of the data-sheet DRAM bandwidth that miss traffic gets
    iter_overhead_us: float       # fixed cost per K-iteration (barrier wait, wgmma fence/commit/wait)
    warpgroup_drain_us: float     # tensor-pipe drain per iteration, shared among consumer warpgroups
    inst_n_overhead: float        # n0 in the instruction efficiency n / (n + n0)
    stage_efficiency: float       # how much each extra pipeline stage adds to the loads in flight
    softmax_p: float              # p of the p-norm that blends the limits
    epilogue_us: float            # fixed cost of the epilogue (C to shared memory, TMA store, wait)
    sync_copy_factor: float       # latency multiplier of thread-issued copies vs TMA
    sync_overhead_us: float       # per-iteration __syncthreads cost without a producer
    mma_sync_fraction: float      # fraction of the tensor peak that mma.sync reaches on this family
    launch_us: float              # kernel launch and tail, per kernel
    miss_latency_us: float        # extra latency of a load that misses L2 (times the wave's miss share)

    def replace(self, **changes: float) -> ModelConstants:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return ModelConstants(**values)


# Hopper: calibrated on the four H200 grids (docs/carver.md, `python -m carver.calibrate`).
_HOPPER = ModelConstants(
    load_latency_us=0.3537, sm_bandwidth=94_416.0, l2_bandwidth_per_sm=138_885.0, dram_efficiency=1.0,
    iter_overhead_us=0.1197, warpgroup_drain_us=0.0303, inst_n_overhead=1.878, stage_efficiency=0.7816,
    softmax_p=8.0, epilogue_us=0.5, sync_copy_factor=1.179, sync_overhead_us=0.02, mma_sync_fraction=0.62,
    launch_us=4.0,
    # set by hand, not fitted: 0.85-1.25 give the same few-row scores (benchmarks/few_rows_scores.py) and
    # keep the rasterization effect; the grids' least squares put it at 0.29 and lose both (docs/carver.md)
    miss_latency_us=1.0,
)
# Ampere / Ada have no measured grids here: Hopper's constants with what the architecture changes
# (mma.sync is their full-rate tensor path; no TMA, so every pipeline is cp.async).
_AMPERE = _HOPPER.replace(mma_sync_fraction=1.0, load_latency_us=0.45, sm_bandwidth=60_000.0,
                          l2_bandwidth_per_sm=45_000.0)
_ADA = _AMPERE.replace(l2_bandwidth_per_sm=40_000.0)

#: Constants per arch family.
CONSTANTS: dict[str, ModelConstants] = {"hopper": _HOPPER, "ampere": _AMPERE, "ada": _ADA}


def constants_for(arch: GPUArch) -> ModelConstants:
    return CONSTANTS[arch.family]


@dataclass(frozen=True, eq=False)
class Terms:
    """Predicted latency and the terms behind it, one entry per config (times in microseconds)."""

    latency_us: np.ndarray        # the prediction
    compute_us: np.ndarray        # tensor-core time of the whole kernel at the instruction's efficiency
    memory_us: np.ndarray         # L2 and DRAM time (soft maximum) of the whole kernel's loads
    pipeline_us: np.ndarray       # latency-bound time of the K loop (load latency / stages in flight)
    epilogue_us: np.ndarray       # prologue fill + epilogue, summed over waves (+ split-K reduction)
    iteration_us: np.ndarray      # blended time of one K-iteration in a full wave
    waves: np.ndarray             # tiles / (SMs * occupancy), fractional
    wave_efficiency: np.ndarray   # tiles / (whole waves * CTAs per wave)
    occupancy: np.ndarray         # CTAs per SM
    dram_bytes: np.ndarray        # modelled DRAM traffic of the main kernel
    bound: np.ndarray             # which limit dominates a full-wave iteration (str array)


def _smax(p: float, *terms: np.ndarray) -> np.ndarray:
    """Soft maximum sum(x^p)^(1/p): equal limits cost more than either alone, unlike max()."""
    top = np.maximum.reduce([np.asarray(t, dtype=np.float64) for t in terms])
    top = np.where(top > 0, top, 1.0)
    acc = sum((np.asarray(t) / top) ** p for t in terms)
    return top * acc ** (1.0 / p)


def _wave_span(n_act: np.ndarray, gm: np.ndarray, gn: np.ndarray, raster: np.ndarray,
               panel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tile rows and tile columns that ``n_act`` consecutively launched CTAs cover.

    Launch order is row-major over (N tiles, M tiles) without rasterization, and TileLang's
    ``rasterization2DRow<panel>`` (columns of ``panel`` tile rows) with it.
    """
    n = np.maximum(np.minimum(n_act, gm * gn), 1)
    plain_rows = np.minimum(gm, np.ceil((n - 1) / gn) + 1)
    plain_cols = np.minimum(gn, n)
    p = np.maximum(np.minimum(panel, gm), 1)
    in_panel = n <= p * gn
    r_rows = np.where(in_panel, np.minimum(p, n), np.minimum(gm, np.ceil(n / gn) + p - 1))
    r_cols = np.where(in_panel, np.minimum(gn, np.ceil(n / p)), gn)
    return np.where(raster, r_rows, plain_rows), np.where(raster, r_cols, plain_cols)


def predict_arrays(problem: MatmulProblem, arch: GPUArch, lw: Lowering,
                   const: ModelConstants | None = None) -> Terms:
    """Predict every config of ``lw`` (illegal ones too: the numbers then say how bad they would be)."""
    k = const or constants_for(arch)
    c = lw.cfg
    bm, bn, bk = (x.astype(np.float64) for x in (c.block_M, c.block_N, c.block_K))
    stages = c.num_stages.astype(np.float64)
    in_b, out_b = problem.in_bytes, problem.out_bytes
    sms = arch.sm_count
    ws = lw.warp_specialized

    peak_sm = arch.peak_flops(problem.in_dtype) / sms / 1e6 if arch.supports(problem.in_dtype) else 1e6
    peak_sm = np.where(lw.wgmma, peak_sm, peak_sm * k.mma_sync_fraction)
    n_inst = np.maximum(lw.n_inst.astype(np.float64), 8.0)
    t_mma = 2.0 * bm * bn * bk / peak_sm / (n_inst / (n_inst + k.inst_n_overhead))
    groups = np.maximum(lw.consumer_warpgroups.astype(np.float64), 1.0)
    compute = t_mma + k.iter_overhead_us + k.warpgroup_drain_us / groups

    bytes_it = (bm + bn) * bk * in_b
    latency = k.load_latency_us + bytes_it / k.sm_bandwidth
    s_eff = 1.0 + np.maximum(stages - 1.0, 0.0) * k.stage_efficiency
    l2_bw = k.l2_bandwidth_per_sm * sms
    dram_bw = arch.dram_bandwidth / 1e6 * k.dram_efficiency

    occ = np.maximum(lw.occupancy, 1).astype(np.float64)
    per_wave = sms * occ
    tiles = lw.tiles.astype(np.float64)
    n_full = np.floor(tiles / per_wave)
    rest = tiles - n_full * per_wave
    split = np.maximum(c.split_k, 1).astype(np.float64)
    gm, gn = lw.grid_m.astype(np.float64), lw.grid_n.astype(np.float64)
    raster = c.enable_rasterization.astype(bool)
    panel = c.panel_size.astype(np.float64)
    kit = lw.k_iters.astype(np.float64)
    epilogue = k.epilogue_us + bm * bn * np.where(split > 1, 4.0, out_b) / k.sm_bandwidth

    def cta_time(n_act: np.ndarray) -> tuple[np.ndarray, ...]:
        """Duration of one wave of ``n_act`` concurrent CTAs, and its terms."""
        n_act = np.maximum(n_act, 1.0)
        per_sm = n_act / np.minimum(n_act, sms)  # CTAs sharing one SM in this wave
        # Split-K launches z-major: a wave covers tiles of one K range, then of the next.
        rows, cols = _wave_span(np.minimum(n_act, gm * gn), gm, gn, raster, panel)
        miss = (rows * bm + cols * bn) * bk * in_b * np.maximum(n_act / (gm * gn), 1.0)
        t_mem = _smax(k.softmax_p, n_act * bytes_it / l2_bw, miss / dram_bw)
        t_ingest = per_sm * bytes_it / k.sm_bandwidth
        lat = latency + k.miss_latency_us * np.minimum(miss / (n_act * bytes_it), 1.0)
        pipe_ws = (lat + compute) / s_eff
        serial = (k.sync_copy_factor * lat + compute + k.sync_overhead_us) / s_eff
        t_ws = _smax(k.softmax_p, compute, pipe_ws, t_mem, t_ingest)
        t_nows = _smax(k.softmax_p, serial, per_sm * compute, t_mem, t_ingest)
        t_it = np.where(ws, t_ws, t_nows)
        pipe = np.where(ws, pipe_ws, serial)
        dur = lat + kit * t_it + epilogue
        return dur, t_it, pipe, t_mem, miss, lat

    full = cta_time(per_wave)
    part = cta_time(np.where(rest > 0, rest, per_wave))
    has_rest = rest > 0
    waves_whole = n_full + has_rest
    total = n_full * full[0] + np.where(has_rest, part[0], 0.0)

    # split-K: a second, memory-bound kernel sums split_k fp32 partial tiles into C.
    reduce_bytes = np.where(split > 1, problem.M * problem.N * (split * 4.0 + out_b), 0.0)
    total = total + reduce_bytes / dram_bw + np.where(split > 1, k.launch_us, 0.0) + k.launch_us

    def over_waves(i: int) -> np.ndarray:
        return n_full * kit * full[i] + np.where(has_rest, kit * part[i], 0.0)

    bound_names = np.array(["compute", "pipeline", "memory", "ingest"])
    pipe_full = full[2]
    ingest_full = (per_wave / np.minimum(per_wave, sms)) * bytes_it / k.sm_bandwidth
    which = np.argmax(np.stack([compute * np.where(ws, 1.0, occ), pipe_full, full[3], ingest_full]), axis=0)
    dram_bytes = n_full * kit * full[4] + np.where(has_rest, kit * part[4], 0.0)
    return Terms(
        latency_us=total,
        compute_us=waves_whole * kit * t_mma * np.where(ws, 1.0, occ),
        memory_us=over_waves(3),
        pipeline_us=over_waves(2),
        epilogue_us=(n_full * (full[5] + epilogue) + np.where(has_rest, part[5] + epilogue, 0.0)
                     + reduce_bytes / dram_bw),
        iteration_us=full[1],
        waves=tiles / per_wave,
        wave_efficiency=tiles / (waves_whole * per_wave),
        occupancy=occ,
        dram_bytes=dram_bytes,
        bound=bound_names[which],
    )
