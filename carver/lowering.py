"""How TileLang 0.1.15 lowers the GEMM template for one config on one GPU, for many configs at once.

Validity (``validity.py``) and the latency model (``model.py``) both start from this one description,
so they cannot disagree about what a config becomes. Everything here was read off TileLang's source
(``src/cuda/op/gemm.cc``, ``cuda/pipeline.py``, ``annotate_warp_group_reg_alloc.cc``) and checked by
compiling boundary configs for sm_90a and reading the generated CUDA and cubin (docs/carver.md):

* ``T.gemm`` becomes ``wgmma`` on Hopper when block_M >= 64, thread_num is a multiple of 128 and the
  dtype/layout is one wgmma takes; otherwise ``mma.sync``. The warp partition is TileLang's "Square"
  policy, reproduced exactly (for wgmma, m_warp is a multiple of 4 so a warpgroup owns 64-row slabs).
* With TMA (sm_90+, every global row stride a multiple of 16 bytes) and num_stages >= 1, the pipelined
  loop is warp-specialized: a 128-thread producer warpgroup issues TMA loads, the ``thread_num``
  consumer threads run wgmma. The launch then has thread_num + 128 threads and registers are re-split
  with ``setmaxnreg`` (24 for the producer, 240 for 1-2 consumer warpgroups, 160 for 3), so the
  kernel always runs one CTA per SM. num_stages = 0 gives synchronous copies and no producer; a
  misaligned stride gives cp.async pipelining without a producer.
* Shared memory is ``max(stages * (A tile + B tile), C tile)`` rounded to 1 KB: the C staging tile
  reuses the pipeline buffers (256x256x64 with 3 stages is 192 KB and runs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .arch import GPUArch
from .problem import MatmulProblem

__all__ = [
    "ConfigArrays",
    "Lowering",
    "lower",
]

_PRODUCER_THREADS = 128


@dataclass(frozen=True, eq=False)
class ConfigArrays:
    """Candidate configs as parallel int arrays (one entry per config), so thousands rank in a few ms."""

    block_M: np.ndarray
    block_N: np.ndarray
    block_K: np.ndarray
    num_stages: np.ndarray
    thread_num: np.ndarray
    enable_rasterization: np.ndarray
    panel_size: np.ndarray
    split_k: np.ndarray
    #: bool: the splits are summed in a cluster's shared memory (``split_reduce="cluster"``), not in a global
    #: workspace by a second kernel; all False when not given (the carver's own search space)
    cluster_reduce: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.cluster_reduce is None:
            object.__setattr__(self, "cluster_reduce", np.zeros(len(self.block_M), dtype=bool))

    @classmethod
    def from_configs(cls, configs: list[dict]) -> ConfigArrays:
        def col(key: str, default: int | None = None) -> np.ndarray:
            return np.array([int(c.get(key, default)) for c in configs], dtype=np.int64)

        cluster = np.array([c.get("split_reduce", "workspace") == "cluster" for c in configs], dtype=bool)
        return cls(col("block_M"), col("block_N"), col("block_K"), col("num_stages"), col("thread_num"),
                   col("enable_rasterization"), col("panel_size", 10), col("split_k", 1), cluster)

    def workspace_split(self) -> np.ndarray:
        """bool: the config splits K and sums its partials through a global fp32 workspace in a second kernel
        (``split_reduce="workspace"``, the default)."""
        return (self.split_k > 1) & ~self.cluster_reduce

    def __len__(self) -> int:
        return len(self.block_M)

    def config(self, i: int) -> dict:
        """The i-th config as the kernel's keyword dict (extra keys only when they differ from default)."""
        cfg = dict(block_M=int(self.block_M[i]), block_N=int(self.block_N[i]), block_K=int(self.block_K[i]),
                   num_stages=int(self.num_stages[i]), thread_num=int(self.thread_num[i]),
                   enable_rasterization=bool(self.enable_rasterization[i]))
        if int(self.panel_size[i]) != 10:
            cfg["panel_size"] = int(self.panel_size[i])
        if int(self.split_k[i]) != 1:
            cfg["split_k"] = int(self.split_k[i])
        if self.cluster_reduce[i]:
            cfg["split_reduce"] = "cluster"
        return cfg


@dataclass(frozen=True, eq=False)
class Lowering:
    """What each config becomes (arrays aligned with the ConfigArrays it came from)."""

    cfg: ConfigArrays
    warps: np.ndarray            # consumer warps (thread_num / 32)
    k_step: int                  # the tensor instruction's K for this dtype
    wgmma: np.ndarray            # bool: wgmma (else mma.sync)
    partition_ok: np.ndarray     # bool: TileLang finds a warp partition
    m_warp: np.ndarray
    n_warp: np.ndarray
    warp_specialized: np.ndarray  # bool: TMA producer warpgroup + setmaxnreg
    tma: np.ndarray              # bool: TMA loads
    launched_threads: np.ndarray
    acc_regs: np.ndarray         # accumulator registers per consumer thread
    acc_reg_limit: np.ndarray    # what fits next to addresses and descriptors without spilling
    regs_per_thread: np.ndarray  # estimated registers at launch (for occupancy)
    smem_bytes: np.ndarray       # dynamic + static shared memory per block
    occupancy: np.ndarray        # CTAs per SM
    grid_m: np.ndarray
    grid_n: np.ndarray
    tiles: np.ndarray            # CTAs of the main kernel (grid_m * grid_n * split_k)
    k_iters: np.ndarray          # pipelined K iterations per CTA

    @property
    def n_inst(self) -> np.ndarray:
        """N of one tensor instruction (wgmma) or of one warp's tile (mma)."""
        return self.cfg.block_N // np.maximum(self.n_warp, 1)

    @property
    def consumer_warpgroups(self) -> np.ndarray:
        return np.maximum(self.warps // 4, 1)


def _ceil_div(a: np.ndarray | int, b: np.ndarray | int) -> np.ndarray:
    return -(-np.asarray(a) // np.asarray(b))


def _square_partition(bm: np.ndarray, bn: np.ndarray, warps: np.ndarray, group: int,
                      n_per_warp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TileLang's ``GemmWarpPolicy.Square``: among m*n == warps with each warp owning a multiple of 16
    rows and ``n_per_warp`` columns (m a multiple of ``group``), the split whose per-warp aspect ratio is
    closest to the block's; the first (smallest m) wins a tie, as in gemm.cc."""
    bm_f, bn_f = bm.astype(np.float64), bn.astype(np.float64)
    ideal = bm_f / bn_f
    best = np.full(bm.shape, np.inf)
    m_out = np.ones_like(bm)
    n_out = np.ones_like(bm)
    max_warps = int(warps.max()) if warps.size else 0
    for m in range(group, max_warps + 1, group):
        n = np.where(warps % m == 0, warps // m, 1)
        valid = (warps % m == 0) & (warps >= m) & (bm % (m * 16) == 0) & (bn % (n * n_per_warp) == 0)
        score = np.abs((bm_f / (m * 16)) / (bn_f / (n * n_per_warp)) - ideal)
        better = valid & (score < best)
        best = np.where(better, score, best)
        m_out = np.where(better, m, m_out)
        n_out = np.where(better, n, n_out)
    return np.isfinite(best), m_out, n_out


def _wgmma_dtype_ok(problem: MatmulProblem) -> bool:
    """TileLang's CheckWgmma: 16-bit inputs in any layout; 8-bit and tf32 only K-major (NT)."""
    if problem.in_dtype in ("float16", "bfloat16"):
        return problem.accum_dtype in ("float32", "float16")
    return (not problem.trans_A) and problem.trans_B


def lower(problem: MatmulProblem, arch: GPUArch, cfg: ConfigArrays) -> Lowering:
    """Describe what TileLang makes of every config in ``cfg`` (no legality judgement here)."""
    bm, bn, bk = cfg.block_M, cfg.block_N, cfg.block_K
    stages, threads = cfg.num_stages, cfg.thread_num
    split = np.maximum(cfg.split_k, 1)
    in_b, out_b, acc_b = problem.in_bytes, problem.out_bytes, problem.accum_bytes
    warps = threads // arch.warp_size
    k_step = max(1, 32 // in_b)

    wgmma = (arch.has_wgmma and _wgmma_dtype_ok(problem)) & (bm >= 64) & (warps % 4 == 0) & (warps > 0)
    ok_w, m_w, n_w = _square_partition(bm, bn, warps, group=4, n_per_warp=8)
    ok_m, m_m, n_m = _square_partition(bm, bn, warps, group=1, n_per_warp=8)
    partition_ok = np.where(wgmma, ok_w, ok_m) & (bm % 16 == 0) & (bn % 8 == 0)
    m_warp = np.where(wgmma, m_w, m_m)
    n_warp = np.where(wgmma, n_w, n_m)

    tma = np.full(bm.shape, arch.has_tma and problem.tma_aligned) & (stages >= 1)
    ws = tma.copy()
    launched = threads + _PRODUCER_THREADS * ws

    # Registers. Consumer budget after setmaxnreg: 240 with 1-2 consumer warpgroups (192 accumulator
    # registers compile without spills, 224 spill), 160 with 3 (where ptxas still compiles the consumer
    # under the 128-register launch cap: a 128-register accumulator fails with "Insufficient
    # registers", 96 compiles). Without a producer the limit comes from the launch cap.
    cap = np.minimum(arch.max_regs_per_thread, (arch.regs_per_sm // np.maximum(launched, 1)) // 8 * 8)
    acc_regs = bm * bn * acc_b / 4.0 / np.maximum(threads, 1)
    # cp.async pipelines (stages >= 1 without TMA) keep ~120 more registers live for addresses and
    # predicates: a 144-register accumulator spilled at the 255 cap, 128 did not.
    acc_limit = np.where(ws & (threads <= 256), 192,
                         np.where(ws & (threads <= 384), 96,
                                  np.where(~ws & (stages >= 1), cap - 120, (cap * 3) // 4)))
    regs_nonws = np.minimum(cap, _ceil_div(np.ceil(1.25 * acc_regs + 48).astype(np.int64), 8) * 8)
    regs = np.where(ws, cap, regs_nonws)

    a_tile = bm * bk * in_b
    b_tile = bn * bk * in_b
    c_tile = np.where(split > 1, 0, bm * bn * out_b)
    dyn = np.maximum(np.maximum(stages, 1) * (a_tile + b_tile), c_tile)
    dyn = _ceil_div(dyn, 1024) * 1024
    static = np.where(ws, 16 * np.maximum(stages, 1) + 64, 64)
    smem = dyn + static

    warps_launched = _ceil_div(launched, arch.warp_size)
    regs_per_warp = _ceil_div(regs * arch.warp_size, 256) * 256
    occ_regs = arch.regs_per_sm // np.maximum(regs_per_warp * warps_launched, 1)
    occ_smem = arch.smem_per_sm // np.maximum(smem + arch.smem_reserved_per_block, 1)
    occ_threads = arch.max_threads_per_sm // np.maximum(launched, 1)
    occupancy = np.minimum(np.minimum(occ_regs, occ_smem), np.minimum(occ_threads, arch.max_blocks_per_sm))

    grid_m = _ceil_div(problem.M, bm)
    grid_n = _ceil_div(problem.N, bn)
    k_per_split = _ceil_div(_ceil_div(problem.K, split), bk) * bk
    k_iters = _ceil_div(np.minimum(k_per_split, problem.K), bk)
    return Lowering(cfg=cfg, warps=warps, k_step=k_step, wgmma=wgmma, partition_ok=partition_ok,
                    m_warp=m_warp, n_warp=n_warp, warp_specialized=ws, tma=tma, launched_threads=launched,
                    acc_regs=acc_regs, acc_reg_limit=acc_limit, regs_per_thread=regs, smem_bytes=smem,
                    occupancy=occupancy, grid_m=grid_m, grid_n=grid_n, tiles=grid_m * grid_n * split,
                    k_iters=k_iters)
