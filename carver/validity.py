"""THE validity function: which matmul configs TileLang 0.1.15 can compile and launch on a GPU.

The carver only recommends what passes here, and the autotuner calls the same function (through
``MatmulTemplate.validate``) to drop a config before it reaches nvcc (STYLE.md 4). Each rule is written
once, as a vectorised predicate over :class:`~carver.lowering.Lowering` arrays plus a message for one
config, so :func:`legal_mask` (the search) and :func:`check_matmul_config` (one config, with reasons)
cannot drift apart.

A config is rejected when TileLang or nvcc refuses it, when the driver would refuse to launch it
(shared memory over the opt-in limit compiles fine and fails at launch), or when its accumulator cannot
stay in registers (ptxas spills it to local memory, 4-30x slower in the measured grids, or, with three
consumer warpgroups, fails with "Insufficient registers"). Every message names the bad value and a fix.

The rules come in three tiers, each written once:

* :func:`normalize_config`: each key on its own: known keys, ints that are ints (numpy ints too, never a
  bool), values in range (``thread_num <= 1024``, ``num_stages <= 32``, ``split_k <= 65535``, ...).
* :data:`CONFIG_RULES`: what no GPU accepts, for this problem (block_M a multiple of 16, whole warps, the
  fp8 wgmma path, split-K splits that all get work, CUDA's grid limits, a tile no GPU's shared memory or
  register file holds, more bytes than any GPU has). ``templates.matmul.kernel`` checks these with no arch.
* :data:`RULES`: what this GPU refuses (its tensor dtypes, threads with the TMA producer, TileLang's warp
  partition, shared memory, registers, device memory).

The kernel-only keys (``warp_policy``, ``persistent``, ``variant``, ``cluster``, ``split_reduce``) have their rules in
:func:`kernel_key_problems` (with the problem, no GPU) and :func:`kernel_key_arch_problems` (on a GPU).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import ARCHS, GPUArch
from .lowering import ConfigArrays, Lowering, lower
from .problem import INT32_MAX, MAX_DEVICE_BYTES, MatmulProblem, int_in_range, is_bool

__all__ = [
    "CONFIG_KEYS",
    "CONFIG_RULES",
    "ConfigRule",
    "KERNEL_KEYS",
    "MAX_NUM_STAGES",
    "OPTIONAL_KEYS",
    "Rule",
    "RULES",
    "WARP_POLICIES",
    "CLUSTERS",
    "MAX_CLUSTER_SIZE",
    "SPLIT_REDUCES",
    "VARIANTS",
    "PINGPONG_MAX_TILE",
    "WS_PRODUCER_THREADS",
    "WS_VARIANTS",
    "C_ON_RING",
    "GRID_SMEM_MARK",
    "RULE_KEYS",
    "check_matmul_config",
    "cluster_shape",
    "cluster_split_smem_bytes",
    "cluster_splits",
    "explain_no_legal_config",
    "kernel_key_arch_problems",
    "kernel_key_problems",
    "ws_smem_bytes",
    "legal_mask",
    "normalize_config",
    "require_matmul_config",
    "split_has_work",
    "split_k_limit",
]

#: The reserved parameters every matmul config sets.
CONFIG_KEYS: tuple[str, ...] = (
    "block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization",
)
#: Keys the matmul kernel (templates.matmul.kernel) also takes, with their defaults.
OPTIONAL_KEYS: dict[str, int] = {"panel_size": 10, "split_k": 1}
#: Keys only the kernel takes (the carver ranks the grid's program without them), with their defaults.
KERNEL_KEYS: dict[str, Any] = {"warp_policy": "square", "persistent": 0, "variant": "pipelined", "cluster": "1x1",
                               "split_reduce": "workspace"}
#: The kernel keys the carver's rules read (a config may give them to :func:`check_matmul_config` without
#: ``kernel_keys``): a split summed in its cluster (``split_reduce="cluster"``) has no workspace in device
#: memory and no reduction grid.
RULE_KEYS: tuple[str, ...] = ("split_reduce",)
#: ``warp_policy`` values: how ``T.gemm`` splits the block over warps (TileLang's ``GemmWarpPolicy``).
WARP_POLICIES: tuple[str, ...] = ("square", "full_row", "full_col")
#: ``variant`` values: TileLang's ``T.Pipelined`` main loop, or the hand-scheduled warp-specialised one
#: (``templates/matmul/ws_program.py``: TMA producer, consumers keeping one wgmma batch in flight), whose
#: consumer warpgroups share each tile ("ws") or take turns on tiles of their own ("pingpong": one
#: warpgroup's main loop runs while the other stores its C).
VARIANTS: tuple[str, ...] = ("pipelined", "ws", "pingpong")
#: The variants of the hand-scheduled loop (``ws_program.py``): TMA, wgmma and setmaxnreg, Hopper only.
WS_VARIANTS: tuple[str, ...] = ("ws", "pingpong")
#: The largest tile one ping-pong warpgroup holds: its fp32 accumulator is ``block_M * block_N / 128``
#: registers a thread, which must leave room under the consumers' setmaxnreg budget (232) for addresses,
#: descriptors and the epilogue (128x192: 192, no spill on sm_90a; 128x256 needs 256).
PINGPONG_MAX_TILE = 128 * 192
#: ``cluster`` values, CTAs along M x along N (CUTLASS's order): "1x2" pairs two N tiles that share their
#: A tile, which one TMA multicast loads into both; "2x1" pairs two M tiles sharing B. Only ``variant="ws"``.
CLUSTERS: tuple[str, ...] = ("1x1", "2x1", "1x2")
#: ``split_reduce`` values: how a split-K tile's ``split_k`` fp32 partials are summed. "workspace": each split
#: writes its partial to global memory and a second kernel sums them; "cluster": the tile's splits are one
#: thread-block cluster, which sums them in shared memory (each CTA sums ``block_M / split_k`` of the tile's
#: rows from its peers' partials, sent over the cluster's shared memory) and stores C itself: one launch, no
#: workspace. Hopper only.
SPLIT_REDUCES: tuple[str, ...] = ("workspace", "cluster")
#: The largest thread-block cluster CUDA launches without opting in to a non-portable size.
MAX_CLUSTER_SIZE = 8
#: The ws variant's producer warpgroup, launched on top of the ``thread_num`` consumer threads.
WS_PRODUCER_THREADS = 128
#: The most consumer threads the ws variant takes (two warpgroups: setmaxnreg re-splits 64K registers
#: as 40 for the producer and 232 for each consumer; a third warpgroup would leave 160).
WS_MAX_CONSUMER_THREADS = 256

#: CUDA's limits, the same on every GPU the carver knows.
WARP_SIZE = 32
MAX_THREADS_PER_BLOCK = 1024
MAX_GRID_YZ = 65535            # gridDim.y and gridDim.z (gridDim.x goes to 2**31 - 1)
#: The largest register file of an SM (64K 32-bit registers): an accumulator over it cannot live in registers.
MAX_REGISTER_FILE_BYTES = 4 * max(a.regs_per_sm for a in ARCHS.values())
#: The most shared memory any GPU gives one block (Hopper's 227 KB): a tile over it fits nowhere.
MAX_SMEM_PER_BLOCK = max(a.smem_per_block for a in ARCHS.values())
#: More stages than this buys nothing on any GPU (the carver searches 0-8); it is a typo.
MAX_NUM_STAGES = 32
#: A bound on block sizes that keeps every product the model forms inside int64; the shared-memory and
#: register rules refuse much smaller tiles.
MAX_BLOCK = 2**16
#: The split-K reduction kernel of templates.matmul sums 16 rows of C per CTA row.
SPLIT_K_REDUCE_ROWS = 16


@dataclass(frozen=True)
class _IntKey:
    lo: int
    hi: int
    meaning: str
    too_big: str
    fix: str
    kind: str | None = None


_INT_KEYS: dict[str, _IntKey] = {
    "block_M": _IntKey(1, MAX_BLOCK, "", "no GPU holds such a tile", "use a multiple of 16 such as 64 or 128"),
    "block_N": _IntKey(1, MAX_BLOCK, "", "no GPU holds such a tile", "use a multiple of 8 such as 128 or 256"),
    "block_K": _IntKey(1, MAX_BLOCK, "", "no GPU holds such a tile",
                       "use a multiple of 32 bytes of the input dtype such as 32 or 64"),
    "num_stages": _IntKey(0, MAX_NUM_STAGES, "0: no pipeline, synchronous copies; 2-4 is typical",
                          "", "use e.g. 3", kind=f">= 0 and <= {MAX_NUM_STAGES}"),
    "thread_num": _IntKey(1, MAX_THREADS_PER_BLOCK, "threads per CTA, whole warps of 32",
                          "CUDA's limit of threads per block", "use 128 or 256"),
    "panel_size": _IntKey(1, MAX_GRID_YZ, "tile rows per rasterization panel",
                          "a grid has at most 65535 rows of CTAs", "use e.g. 10"),
    "split_k": _IntKey(1, MAX_GRID_YZ, "1: no split; s: K is split over s CTAs per tile",
                       "CUDA's grid limit in z", "use a small split such as 2-16"),
    "persistent": _IntKey(0, INT32_MAX, "0: one CTA per tile; n: n resident CTAs that loop over the tiles, "
                                        "e.g. the GPU's SM count", "CUDA's grid limit in x",
                          "use 0 or the GPU's SM count"),
}


@dataclass(frozen=True)
class ConfigRule:
    """A rule no GPU escapes: ``broken(problem, cfg)`` flags configs (bool array); ``message(...)``
    explains config ``i`` with its value and a fix."""

    name: str
    broken: Callable[[MatmulProblem, ConfigArrays], np.ndarray]
    message: Callable[[MatmulProblem, ConfigArrays, int], str]
    #: Stands in for a rule of :data:`RULES` when no arch is named (the GPU's own rule is exact, and stricter).
    without_arch_only: bool = False


@dataclass(frozen=True)
class Rule:
    """One legality rule of a GPU: ``broken(problem, arch, lw)`` flags configs (bool array);
    ``message(...)`` explains config ``i`` with its value and a fix."""

    name: str
    broken: Callable[[MatmulProblem, GPUArch, Lowering], np.ndarray]
    message: Callable[[MatmulProblem, GPUArch, Lowering, int], str]


def _cfg_str(c: ConfigArrays, i: int) -> str:
    return f"{int(c.block_M[i])}x{int(c.block_N[i])}x{int(c.block_K[i])}"


def _ceil_div(a: Any, b: Any) -> Any:
    return -(-a // b)


def _round_down(value: int, step: int) -> int:
    return max(step, value // step * step)


def _k_step(p: MatmulProblem) -> int:
    """K of one tensor-core step in elements: 32 bytes of the input dtype."""
    return max(1, 32 // p.in_bytes)


def split_has_work(K: int, block_K: int, split_k: int) -> bool:
    """Whether each of ``split_k`` splits of K gets some of it (each takes ceil(K / split_k) rounded up to whole
    K tiles). Not monotone: K=1000 in tiles of 128 splits 2, 3, 4 and 8 ways, not 5, 6 or 7."""
    k_per = _ceil_div(_ceil_div(K, split_k), block_K) * block_K
    return split_k <= 1 or (split_k - 1) * k_per < K


def split_k_limit(K: int, block_K: int) -> int:
    """The largest split_k for which every split still gets some of K (splits are whole K tiles); some smaller
    ones may not (:func:`split_has_work`)."""
    s = max(1, _ceil_div(K, block_K))
    while not split_has_work(K, block_K, s):
        s -= 1
    return min(s, MAX_GRID_YZ)


def _bytes_needed(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    """A, B and C plus the split-K workspace (split_k fp32 partial C's; none when the splits are summed in a
    cluster), as float64 (no overflow)."""
    split = c.split_k.astype(np.float64)
    work = np.where(c.workspace_split(), split * float(p.M) * float(p.N) * p.accum_bytes, 0.0)
    return float(p.operand_bytes) + work


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# ------------------------------------------------------------------------ rules no GPU escapes
def _msg_warps(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    t = int(c.thread_num[i])
    return (f"thread_num must be a positive multiple of {WARP_SIZE} (whole warps), got {t}; use "
            f"{_round_down(t, WARP_SIZE)} or {_round_down(t, WARP_SIZE) + WARP_SIZE}")


def _msg_block_mult(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    bm, bn = int(c.block_M[i]), int(c.block_N[i])
    if bm <= 0 or bm % 16:
        return f"block_M must be a positive multiple of 16 (one MMA row slab), got {bm}; e.g. {_round_down(bm, 16)}"
    return f"block_N must be a positive multiple of 8 (one MMA column slab), got {bn}; e.g. {_round_down(bn, 8)}"


def _msg_block_k(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    bk, k = int(c.block_K[i]), _k_step(p)
    return (f"block_K must be a positive multiple of {k}, i.e. block_K must be a multiple of {k} for "
            f"{p.in_dtype} (one tensor-core k-step of 32 bytes), got {bk}; e.g. {_round_down(bk, k)}")


def _fp8_broken(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    if p.in_bytes != 1:
        return np.zeros(len(c), dtype=bool)
    layout = p.trans_A or not p.trans_B
    return layout | (c.block_M < 64) | (c.thread_num % 128 != 0)


def _msg_fp8(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    why = ("needs A as (M, K) and B as (N, K): trans_A=False, trans_B=True"
           if (p.trans_A or not p.trans_B) else
           f"needs the wgmma path: block_M >= 64 (got {int(c.block_M[i])}) and thread_num a multiple of "
           f"128 (got {int(c.thread_num[i])})")
    return f"{p.in_dtype} GEMM {why}; TileLang has no mma.sync lowering for it"


def _one_stage_bytes(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    stage = (c.block_M + c.block_N) * c.block_K * p.in_bytes
    c_tile = np.where(c.split_k > 1, 0, c.block_M * c.block_N * p.out_bytes)
    return np.maximum(stage, c_tile)


def _msg_tile_smem(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    return (f"block {_cfg_str(c, i)} needs {int(_one_stage_bytes(p, c)[i])} bytes of shared memory for a single "
            f"stage (A and B tiles, or the C tile), more than any GPU gives a block ({MAX_SMEM_PER_BLOCK}); "
            f"use a smaller tile, e.g. 128x128x64")


def _acc_bytes(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    return c.block_M * c.block_N * p.accum_bytes


def _msg_tile_regs(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    return (f"block {_cfg_str(c, i)} has a {int(_acc_bytes(p, c)[i])}-byte {p.accum_dtype} accumulator, more than "
            f"the register file of any GPU's SM ({MAX_REGISTER_FILE_BYTES} bytes): ptxas would spill all of it to "
            f"local memory; use a smaller block_M*block_N, e.g. 128x256")


def _split_broken(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    split = np.maximum(c.split_k, 1)
    bk = np.maximum(c.block_K, 1)
    k_per = _ceil_div(_ceil_div(p.K, split), bk) * bk  # ceil(K / split), rounded up to whole K tiles
    return (split > 1) & ((split - 1) * k_per >= p.K)


def _msg_split(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    s, bk = int(c.split_k[i]), int(c.block_K[i])
    limit = split_k_limit(p.K, bk)
    if s > limit:
        fix = f"use split_k <= {limit}"
    else:  # a gap below the limit: the nearest split below that works, and the limit
        lower = next(t for t in range(s - 1, 0, -1) if split_has_work(p.K, bk, t))
        fix = f"use split_k={lower} or {limit} (not every split_k up to {limit} gives each split work)"
    return (f"split_k={s} leaves a split with no work for K={p.K}, block_K={bk} (splits are whole K tiles); "
            f"{fix}")


def _grid_broken(p: MatmulProblem, c: ConfigArrays) -> np.ndarray:
    rows = _ceil_div(p.M, np.maximum(c.block_M, 1))
    reduce_rows = _ceil_div(p.M, SPLIT_K_REDUCE_ROWS)
    return (rows > MAX_GRID_YZ) | (c.workspace_split() & (reduce_rows > MAX_GRID_YZ))


def _msg_grid(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    bm = int(c.block_M[i])
    rows = _ceil_div(p.M, bm)
    if rows > MAX_GRID_YZ:
        need = _ceil_div(_ceil_div(p.M, MAX_GRID_YZ), 16) * 16
        return (f"block_M={bm} launches {rows} rows of CTAs for M={p.M}, over CUDA's grid limit of {MAX_GRID_YZ} "
                f"(gridDim.y); use block_M >= {need}, or compute C^T = B^T @ A^T (swap M and N and flip "
                f"trans_A/trans_B: the N tiles run along gridDim.x, which goes to 2**31 - 1)")
    return (f"split_k={int(c.split_k[i])} sums its partials with {_ceil_div(p.M, SPLIT_K_REDUCE_ROWS)} rows of CTAs "
            f"for M={p.M}, over CUDA's grid limit of {MAX_GRID_YZ}; use split_k=1 (split-K is for small M), or "
            f"split_reduce='cluster' on Hopper (no second kernel)")


def _memory_message(p: MatmulProblem, c: ConfigArrays, i: int, have_bytes: float, have: str) -> str:
    """Why A, B and C (and a workspace split's fp32 partials) do not fit ``have_bytes``, and the fix: a split
    whose workspace fits, or, when the operands alone are too large, that no config fits."""
    need, s = float(_bytes_needed(p, c)[i]), int(c.split_k[i])
    if float(p.operand_bytes) > have_bytes:
        return (f"{p.describe()} needs {float(p.operand_bytes):.0f} bytes ({_gib(float(p.operand_bytes))}) for A, B "
                f"and C alone, over {have}; no config fits: split the problem (e.g. along N) across calls or GPUs")
    per_split = float(p.M) * float(p.N) * p.accum_bytes
    fits = int((have_bytes - float(p.operand_bytes)) // per_split)
    fix = f"split_k <= {fits}" if fits >= 2 else "split_k=1"
    return (f"{p.describe()} with split_k={s} needs {need:.0f} bytes ({_gib(need)}) with its fp32 workspace of {s} "
            f"partial C's, over {have}; use {fix}, or split_reduce='cluster' on Hopper (no workspace)")


def _msg_memory_any(p: MatmulProblem, c: ConfigArrays, i: int) -> str:
    return _memory_message(p, c, i, MAX_DEVICE_BYTES, f"what any GPU holds (bound {_gib(MAX_DEVICE_BYTES)})")


#: Rules no GPU escapes, in the order their messages are reported. ``templates.matmul`` checks these
#: before it builds a kernel, with no arch.
CONFIG_RULES: tuple[ConfigRule, ...] = (
    ConfigRule("warps", lambda p, c: c.thread_num % WARP_SIZE != 0, _msg_warps),
    ConfigRule("block_multiple", lambda p, c: (c.block_M <= 0) | (c.block_M % 16 != 0) | (c.block_N <= 0)
               | (c.block_N % 8 != 0), _msg_block_mult),
    ConfigRule("block_K", lambda p, c: (c.block_K <= 0) | (c.block_K % _k_step(p) != 0), _msg_block_k),
    ConfigRule("fp8_path", _fp8_broken, _msg_fp8),
    ConfigRule("split", _split_broken, _msg_split),
    ConfigRule("grid", _grid_broken, _msg_grid),
    ConfigRule("tile_shared_memory", lambda p, c: _one_stage_bytes(p, c) > MAX_SMEM_PER_BLOCK, _msg_tile_smem,
               without_arch_only=True),
    ConfigRule("tile_registers", lambda p, c: _acc_bytes(p, c) > MAX_REGISTER_FILE_BYTES, _msg_tile_regs,
               without_arch_only=True),
    ConfigRule("device_memory_any", lambda p, c: _bytes_needed(p, c) > MAX_DEVICE_BYTES, _msg_memory_any,
               without_arch_only=True),
)


# ------------------------------------------------------------------------------ rules of one GPU
def _max_stages(problem: MatmulProblem, arch: GPUArch, lw: Lowering, i: int) -> int:
    c = lw.cfg
    per_stage = (int(c.block_M[i]) + int(c.block_N[i])) * int(c.block_K[i]) * problem.in_bytes
    return max(0, (arch.smem_per_block - 1024) // per_stage)


def _msg_dtype(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    return (f"in_dtype={p.in_dtype!r} has no tensor-core path on {a.name} (supported: "
            f"{[d for d, _ in a.tensor_peak]}); use one of those dtypes or another GPU")


def _msg_threads(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    t = int(lw.cfg.thread_num[i])
    return (f"thread_num={t} launches {int(lw.launched_threads[i])} threads (with the 128-thread TMA "
            f"producer), over the {a.max_threads_per_block} a block may have; use thread_num <= "
            f"{a.max_threads_per_block - 128 * bool(lw.warp_specialized[i])}")


def _msg_partition(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    bm, bn, t = int(c.block_M[i]), int(c.block_N[i]), int(c.thread_num[i])
    inst = "wgmma" if lw.wgmma[i] else "mma.sync"
    extra = " with m_warp a multiple of 4 (whole warpgroups)" if lw.wgmma[i] else ""
    return (f"no warp partition for block {bm}x{bn} over thread_num={t} ({t // a.warp_size} warps, {inst}): "
            f"each warp must own a multiple of 16 rows and 8 columns{extra}; use thread_num=128, or "
            f"block_M a multiple of {16 * max(4, t // a.warp_size)} or block_N a multiple of "
            f"{8 * max(1, t // a.warp_size // 4)}")


#: What the grid program's shared-memory message says (:func:`_msg_smem`), so that a caller judging a ws
#: variant, whose own rule counts its ring and C tiles exactly (:func:`ws_smem_bytes`), can leave it out.
GRID_SMEM_MARK = "bytes of shared memory, over"


def _msg_smem(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    s = int(lw.cfg.num_stages[i])
    fit = _max_stages(p, a, lw, i)
    fix = (f"use num_stages <= {fit}" if fit >= 1 else "use a smaller block_K or tile")
    return (f"{_cfg_str(lw.cfg, i)} with num_stages={s} needs {int(lw.smem_bytes[i])} {GRID_SMEM_MARK} "
            f"{a.name}'s {a.smem_per_block} per block (it compiles, then fails to launch); {fix}")


def _msg_regs(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    t = int(lw.cfg.thread_num[i])
    acc = float(lw.acc_regs[i])
    need_threads = next((x for x in (128, 256) if acc * t / x <= 192 and x > t), None)
    fix = (f"use thread_num={need_threads} or a smaller block_M*block_N" if need_threads
           else "use a smaller block_M*block_N")
    return (f"block {_cfg_str(lw.cfg, i)} needs {acc:.0f} accumulator registers per thread with thread_num={t}, "
            f"over the {int(lw.acc_reg_limit[i])} that fit (ptxas would spill them or fail); {fix}")


def _memory_broken(p: MatmulProblem, a: GPUArch, lw: Lowering) -> np.ndarray:
    return _bytes_needed(p, lw.cfg) > (a.memory_bytes or MAX_DEVICE_BYTES)


def _msg_memory(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    if not a.memory_bytes:
        return _msg_memory_any(p, lw.cfg, i)
    return _memory_message(p, lw.cfg, i, a.memory_bytes, f"{a.name}'s {_gib(a.memory_bytes)} of device memory")


#: The rules of one GPU, in the order their messages are reported (after :data:`CONFIG_RULES`).
RULES: tuple[Rule, ...] = (
    Rule("dtype", lambda p, a, lw: np.full(len(lw.cfg), not a.supports(p.in_dtype)), _msg_dtype),
    Rule("threads", lambda p, a, lw: lw.launched_threads > a.max_threads_per_block, _msg_threads),
    Rule("warp_partition", lambda p, a, lw: ~lw.partition_ok, _msg_partition),
    Rule("shared_memory", lambda p, a, lw: lw.smem_bytes > a.smem_per_block, _msg_smem),
    Rule("registers", lambda p, a, lw: lw.acc_regs > lw.acc_reg_limit, _msg_regs),
    Rule("device_memory", _memory_broken, _msg_memory),
)


# --------------------------------------------------------------------------------- entry points
def _config_rules(with_arch: bool) -> tuple[ConfigRule, ...]:
    return tuple(r for r in CONFIG_RULES if not (with_arch and r.without_arch_only))


def legal_mask(problem: MatmulProblem, arch: GPUArch, lw: Lowering) -> np.ndarray:
    """True where a config passes every rule (the vectorised form of :func:`check_matmul_config`, for
    configs whose keys are already in range, such as the carver's search space)."""
    ok = np.ones(len(lw.cfg), dtype=bool)
    for config_rule in _config_rules(with_arch=True):
        ok &= ~np.asarray(config_rule.broken(problem, lw.cfg), dtype=bool)
    for rule in RULES:
        ok &= ~np.asarray(rule.broken(problem, arch, lw), dtype=bool)
    return ok


def explain_no_legal_config(problem: MatmulProblem, arch: GPUArch, lw: Lowering) -> str:
    """Why no config of ``lw`` is legal: the rules every one of them breaks, with the message of one."""
    reasons = [r.message(problem, lw.cfg, int(np.argmax(b))) for r in _config_rules(with_arch=True)
               if (b := np.asarray(r.broken(problem, lw.cfg), dtype=bool)).size and b.all()]
    reasons += [r.message(problem, arch, lw, 0) for r in RULES
                if (b := np.asarray(r.broken(problem, arch, lw), dtype=bool)).size and b.all()]
    if not reasons:
        reasons = ["each candidate breaks a different rule (shared memory, registers, warp partition)"]
    return f"no legal config for {problem.describe()} on {arch.name}: " + "; ".join(dict.fromkeys(reasons))


#: The kernel keys that take one of a few names: the names, and what the default means.
_STRING_KEYS: dict[str, tuple[tuple[str, ...], str]] = {
    "warp_policy": (WARP_POLICIES, "'square' is TileLang's default"),
    "variant": (VARIANTS, "'pipelined' is TileLang's T.Pipelined loop, 'ws' the hand-scheduled Hopper loop, "
                "'pingpong' its form whose two warpgroups take turns on tiles of their own"),
    "cluster": (CLUSTERS, "CTAs along M x along N; '1x1' launches no clusters"),
    "split_reduce": (SPLIT_REDUCES, "how split-K partials are summed: 'workspace' by a second kernel, 'cluster' "
                     "in the shared memory of the tile's cluster of splits"),
}


def _normalize(config: Any, kernel_keys: bool) -> tuple[dict[str, Any] | None, list[tuple[type, str]]]:
    """Each key on its own: ``(config with defaults, [])`` or ``(None, [(exception type, message), ...])``."""
    if not isinstance(config, Mapping):
        return None, [(TypeError, f"a matmul config must be a dict, got {config!r} of type {type(config).__name__}")]
    optional = {**OPTIONAL_KEYS, **(KERNEL_KEYS if kernel_keys else {})}
    # the kernel keys the carver's own rules read, checked and kept where given (not filled in)
    read = tuple(k for k in RULE_KEYS if k in config and k not in optional)
    problems: list[tuple[type, str]] = []
    unknown = [k for k in config if k not in CONFIG_KEYS and k not in optional and k not in read]
    if unknown:
        problems.append((ValueError, f"unknown config key(s) {unknown}; a matmul config takes "
                                     f"{list(CONFIG_KEYS) + list(optional)}"))
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        problems.append((ValueError, f"config {dict(config)} lacks {missing}; every matmul config sets "
                                     f"{list(CONFIG_KEYS)}"))
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS + tuple(optional) + read:
        if key not in config:
            if key in optional:
                out[key] = optional[key]
            continue
        value = config[key]
        if key == "enable_rasterization":
            # A string "False" is truthy and would silently turn rasterization on.
            if not is_bool(value):
                problems.append((TypeError, f"enable_rasterization must be a bool, got {value!r} of type "
                                            f"{type(value).__name__}; use True or False"))
            else:
                out[key] = bool(value)
        elif key in _STRING_KEYS:
            allowed, hint = _STRING_KEYS[key]
            if not isinstance(value, str) or value not in allowed:
                problems.append((ValueError, f"{key} must be one of {list(allowed)}, got {value!r}; {hint}"))
            out[key] = value
        else:
            spec = _INT_KEYS[key]
            try:
                out[key] = int_in_range(value, key, spec.lo, spec.hi, meaning=spec.meaning,
                                        too_big=spec.too_big, fix=spec.fix, kind=spec.kind)
            except ValueError as e:
                problems.append((ValueError, str(e)))
    return (None, problems) if problems else (out, [])


def normalize_config(config: Mapping[str, Any], *, kernel_keys: bool = False
                     ) -> tuple[dict[str, Any] | None, list[str]]:
    """Check a config's keys and each value on its own: ``(config with defaults, [])`` or
    ``(None, [problems])``. ``kernel_keys`` also admits the kernel-only keys (:data:`KERNEL_KEYS`)."""
    cfg, problems = _normalize(config, kernel_keys)
    return cfg, [m for _, m in problems]


def cluster_shape(cluster: str) -> tuple[int, int]:
    """``"1x2"`` as ``(1, 2)``: CTAs of a cluster along M and along N."""
    cm, cn = cluster.split("x")
    return int(cm), int(cn)


def _pingpong_problems(cfg: Mapping[str, Any]) -> list[str]:
    """What the ping-pong form of the hand-scheduled loop cannot do: it needs its two consumer warpgroups,
    tiles to alternate on (the persistent loop) and a tile one warpgroup's registers hold."""
    out = []
    if cfg["thread_num"] != 256:
        out.append(f"variant='pingpong' runs two consumer warpgroups that take turns on tiles of their own "
                   f"(thread_num=256; the 128-thread producer is launched on top), got thread_num="
                   f"{cfg['thread_num']}; use thread_num=256")
    if not cfg["persistent"]:
        out.append("variant='pingpong' alternates the two warpgroups over the tiles a resident CTA walks, so it "
                   "needs persistent=n (n CTAs, e.g. the SM count), got persistent=0; use persistent=132 on an "
                   "H100 or H200, or variant='ws'")
    if cfg["cluster"] != "1x1":
        out.append(f"variant='pingpong' hands out single tiles, so it takes no cluster, got "
                   f"cluster={cfg['cluster']!r}; use cluster='1x1'")
    if cfg["block_M"] * cfg["block_N"] > PINGPONG_MAX_TILE:
        out.append(f"variant='pingpong' gives each warpgroup a whole {cfg['block_M']}x{cfg['block_N']} tile, whose "
                   f"fp32 accumulator takes {cfg['block_M'] * cfg['block_N'] // 128} registers a thread, over "
                   f"the {PINGPONG_MAX_TILE // 128} that fit beside the rest under setmaxnreg; use a tile of at "
                   f"most {PINGPONG_MAX_TILE} elements (128x128, 128x192, 64x256) or variant='ws'")
    return out


def _ws_problems(problem: MatmulProblem | None, cfg: Mapping[str, Any]) -> list[str]:
    """What the hand-scheduled warp-specialised loop (``variant="ws"`` or ``"pingpong"``) cannot do, on any
    GPU."""
    out = []
    t, bm, stages, v = cfg["thread_num"], cfg["block_M"], cfg["num_stages"], repr(cfg["variant"])
    if cfg["variant"] == "pingpong":
        out += _pingpong_problems(cfg)
    elif t % 128 or not 128 <= t <= WS_MAX_CONSUMER_THREADS:
        out.append(f"variant='ws' runs one or two consumer warpgroups (thread_num=128 or 256; the 128-thread "
                   f"producer is launched on top), got thread_num={t}; use thread_num=256")
    if bm % 64:
        out.append(f"variant={v} issues wgmma, whose M is 64 rows per warpgroup: block_M must be a multiple of 64, "
                   f"got {bm}; use block_M=128")
    if stages < 2:
        out.append(f"variant={v} keeps one wgmma batch in flight, which holds a stage while the next one computes: "
                   f"num_stages must be >= 2 (1 would deadlock), got {stages}; use num_stages=3 or 4")
    if cfg["split_k"] != 1:
        out.append(f"variant={v} does not split K, got split_k={cfg['split_k']}; use split_k=1 or "
                   f"variant='pipelined'")
    cm, cn = cluster_shape(cfg["cluster"])
    if cm * cn > 1 and cfg["persistent"]:
        out.append(f"cluster={cfg['cluster']!r} and persistent={cfg['persistent']} do not combine (the persistent "
                   f"loop hands out single tiles); use cluster='1x1' or persistent=0")
    if cm * cn > 1 and cfg["enable_rasterization"] and cfg["panel_size"] % (cm * cn):
        out.append(f"cluster={cfg['cluster']!r} rasterizes whole clusters (TileLang's rasterization2DRowWithCluster): "
                   f"panel_size must be a multiple of {cm * cn}, got {cfg['panel_size']}; use panel_size=10")
    if problem is not None and not problem.tma_aligned:
        a = (problem.M if problem.trans_A else problem.K) * problem.in_bytes
        b = (problem.K if problem.trans_B else problem.N) * problem.in_bytes
        out.append(f"variant={v} loads A and B with TMA (T.tma_copy), which needs row strides that are multiples of "
                   f"16 bytes; {problem.describe()} has A rows of {a} bytes and B rows of {b} bytes; use "
                   f"variant='pipelined' (it falls back to cp.async) or pad the operands")
    return out


def _band_splits_threads(band: int, threads: int) -> bool:
    """TileLang lays a fragment of ``band`` elements over ``threads`` threads only when one divides the other
    (else its layout inference fails: "no available layout found")."""
    return band % threads == 0 or threads % band == 0


def cluster_splits(block_M: int, block_N: int, thread_num: int) -> list[int]:
    """The splits ``split_reduce="cluster"`` can take for a tile: 2 to :data:`MAX_CLUSTER_SIZE` CTAs that
    divide block_M into bands of rows whose elements TileLang can lay over the threads."""
    return [s for s in range(2, MAX_CLUSTER_SIZE + 1)
            if block_M % s == 0 and _band_splits_threads(block_M // s * block_N, thread_num)]


def _cluster_split_problems(cfg: Mapping[str, Any]) -> list[str]:
    """What ``split_reduce="cluster"`` needs: a split of 2-8 CTAs (one cluster per tile), a tile whose rows
    divide among them into bands the threads can share out, and the grid's x axis for the cluster (no
    rasterization, no other cluster)."""
    out = []
    s, bm, bn, t = cfg["split_k"], cfg["block_M"], cfg["block_N"], cfg["thread_num"]
    fits = cluster_splits(bm, bn, t)
    fix = f"use split_k in {fits} or split_reduce='workspace'" if fits else "use split_reduce='workspace'"
    if not 2 <= s <= MAX_CLUSTER_SIZE:
        out.append(f"split_reduce='cluster' makes a tile's split_k CTAs one thread-block cluster, of 2 to "
                   f"{MAX_CLUSTER_SIZE} CTAs (CUDA's portable cluster size), got split_k={s}; {fix}")
    elif bm % s:
        out.append(f"split_reduce='cluster' has each of the split_k={s} CTAs sum block_M / split_k rows of the tile, "
                   f"so block_M={bm} must be a multiple of split_k; {fix}")
    elif t > 0 and not _band_splits_threads(bm // s * bn, t):
        out.append(f"split_reduce='cluster' has each CTA sum a band of block_M / split_k = {bm // s} rows by "
                   f"block_N={bn}, {bm // s * bn} elements, which TileLang lays over thread_num={t} threads only if "
                   f"one divides the other; {fix}")
    if cfg["enable_rasterization"]:
        out.append("split_reduce='cluster' runs the splits of a tile along the grid's x axis, which TileLang's "
                   "rasterization would remap; use enable_rasterization=False (split-K grids have few rows of "
                   "tiles, so it changes little)")
    if cfg["variant"] != "pipelined" or cfg["cluster"] != "1x1":
        out.append(f"split_reduce='cluster' is a form of the split-K grid program (variant='pipelined', "
                   f"cluster='1x1'), got variant={cfg['variant']!r}, cluster={cfg['cluster']!r}; use those or "
                   f"split_reduce='workspace'")
    return out


def cluster_split_smem_bytes(problem: MatmulProblem, cfg: Mapping[str, Any]) -> int:
    """Shared memory of ``split_reduce="cluster"``: the pipeline's A/B stages, or the reduction's two fp32
    tiles (a CTA's own partial, and the peers' partials of its rows), whichever is larger: TileLang's
    planner puts the reduction's tiles on the stages, which the main loop has finished with."""
    stages = max(cfg["num_stages"], 1) * (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * problem.in_bytes
    return max(stages, 2 * cfg["block_M"] * cfg["block_N"] * problem.accum_bytes) + 1024


def kernel_key_problems(problem: MatmulProblem | None, cfg: Mapping[str, Any]) -> list[str]:
    """Rules between the kernel-only keys and the others (and the problem, when given), on any GPU.
    ``cfg`` is normalised, with every key (:func:`normalize_config`)."""
    out = []
    persistent, split_k = cfg["persistent"], cfg["split_k"]
    if persistent and split_k != 1:
        out.append(f"persistent={persistent} and split_k={split_k} do not combine; set one of them (persistent=0 "
                   f"or split_k=1)")
    # the warps one T.gemm spreads over: the block's, or one warpgroup's in ping-pong (each has its own tile,
    # and wgmma's 64-row instructions give its 4 warps whole rows whatever the policy)
    warps = 4 if cfg["variant"] == "pingpong" else cfg["thread_num"] // WARP_SIZE
    if cfg["warp_policy"] == "full_row" and cfg["block_M"] % (16 * warps):
        what = f"{warps // 4} warpgroups" if warps % 4 == 0 else f"{warps} warps"
        out.append(f"warp_policy='full_row' stacks the {what} along M (each warp takes whole rows), so block_M "
                   f"must be a multiple of {16 * warps}, got {cfg['block_M']}; use warp_policy='square'")
    if cfg["split_reduce"] == "cluster":
        out += _cluster_split_problems(cfg)
        if problem is not None and _ceil_div(problem.N, cfg["block_N"]) > MAX_GRID_YZ:
            out.append(f"split_reduce='cluster' puts the {_ceil_div(problem.N, cfg['block_N'])} tiles along N on the "
                       f"grid's y axis, over CUDA's limit of {MAX_GRID_YZ}; use split_reduce='workspace'")
    if cfg["variant"] in WS_VARIANTS:
        out += _ws_problems(problem, cfg)
    elif cfg["cluster"] != "1x1":
        out.append(f"cluster={cfg['cluster']!r} needs variant='ws' (TileLang's T.Pipelined loop issues no multicast "
                   f"loads); use variant='ws' or cluster='1x1'")
    return out


#: The TileLang pass config (a config's ``pass_configs``) under which its shared-memory planner aliases
#: buffers whose uses do not overlap: the ws program's C staging tile then reuses the ring of stages, which
#: the main loop has finished with when C is written. Not with ``persistent``, whose producer loads the next
#: tile into the ring while the consumers store this one.
C_ON_RING = "tl.enable_aggressive_shared_memory_merge"


def ws_smem_bytes(problem: MatmulProblem, cfg: Mapping[str, Any], c_on_ring: bool = False) -> int:
    """Shared memory of the ws variants: the ring of A/B stages, C's staging tile beside it (the epilogue
    runs inside the consumer branch, where TileLang's default planner does not alias it onto the ring; one
    per warpgroup in ping-pong, whose two stores may overlap) or, with ``c_on_ring`` (:data:`C_ON_RING`
    set), within it, and the barriers."""
    stage = (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * problem.in_bytes
    ring = _ceil_div(cfg["num_stages"] * stage, 1024) * 1024
    c_tile = _ceil_div(cfg["block_M"] * cfg["block_N"] * problem.out_bytes, 1024) * 1024
    if cfg.get("variant") == "pingpong":
        c_tile *= 2
    return (max(ring, c_tile) if c_on_ring else ring + c_tile) + 1024


def _cluster_split_arch_problems(problem: MatmulProblem, arch: GPUArch, cfg: Mapping[str, Any]) -> list[str]:
    """``split_reduce="cluster"`` on one GPU: clusters and their shared-memory copies (Hopper), and the larger
    of the stages and the reduction's tiles in one block's shared memory."""
    if not arch.has_tma:
        return [f"split_reduce='cluster' sums the splits in a thread-block cluster's shared memory (sm_90 or "
                f"newer); {arch.name} is sm_{arch.compute_capability[0]}{arch.compute_capability[1]}; use "
                f"split_reduce='workspace'"]
    need = cluster_split_smem_bytes(problem, cfg)
    if need > arch.smem_per_block:
        tiles = 2 * cfg["block_M"] * cfg["block_N"] * problem.accum_bytes
        stage = (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * problem.in_bytes
        fit = (arch.smem_per_block - 1024) // stage
        fix = ("use a smaller tile (the two fp32 tiles must fit whatever the stages) or split_reduce='workspace'"
               if tiles + 1024 > arch.smem_per_block else
               f"use num_stages <= {fit}" if fit >= 1 else "use a smaller block_K or tile")
        return [f"split_reduce='cluster' {cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} with num_stages="
                f"{cfg['num_stages']} needs {need} bytes of shared memory (the larger of its A/B stages and two "
                f"fp32 {cfg['block_M']}x{cfg['block_N']} tiles for the sum), over {arch.name}'s "
                f"{arch.smem_per_block} per block; {fix}"]
    return []


def kernel_key_arch_problems(problem: MatmulProblem, arch: GPUArch, cfg: Mapping[str, Any],
                             c_on_ring: bool = False) -> list[str]:
    """The kernel-only keys' rules on one GPU (``cfg`` normalised, with every key): the ws variant needs
    Hopper's wgmma, TMA and setmaxnreg, and its ring plus C tile (C within the ring with ``c_on_ring``)
    must fit the GPU's shared memory."""
    if cfg["split_reduce"] == "cluster":
        return _cluster_split_arch_problems(problem, arch, cfg)
    if cfg["variant"] not in WS_VARIANTS:
        return []
    if not (arch.has_wgmma and arch.has_tma):
        return [f"variant={cfg['variant']!r} needs Hopper (sm_90: wgmma, TMA, mbarrier transactions, setmaxnreg"
                f"{', clusters' if cfg['cluster'] != '1x1' else ''}); {arch.name} is sm_"
                f"{arch.compute_capability[0]}{arch.compute_capability[1]}; use variant='pipelined'"]
    need = ws_smem_bytes(problem, cfg, c_on_ring)
    if need > arch.smem_per_block:
        stage = (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * problem.in_bytes
        beside = 0 if c_on_ring else need - 1024 - _ceil_div(cfg["num_stages"] * stage, 1024) * 1024
        fit = (arch.smem_per_block - 1024 - beside) // stage
        fix = f"use num_stages <= {fit}" if fit >= 2 else "use a smaller block_K or tile"
        if not c_on_ring and not cfg["persistent"] and ws_smem_bytes(problem, cfg, True) <= arch.smem_per_block:
            fix += f", or pass_configs={{{C_ON_RING!r}: True}} to put C's tile on the ring"
        where = "within the ring" if c_on_ring else "beside the ring of stages"
        tiles = "its two C tiles, one a warpgroup," if cfg["variant"] == "pingpong" else "its C tile"
        return [f"variant={cfg['variant']!r} {cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} with num_stages="
                f"{cfg['num_stages']} needs {need} bytes of shared memory ({tiles} {where}), over "
                f"{arch.name}'s {arch.smem_per_block} per block; {fix}"]
    return []


def _violations(problem: MatmulProblem | None, config: Any, arch: GPUArch | None, kernel_keys: bool,
                arch_stand_ins: bool = True) -> tuple[dict[str, Any] | None, list[tuple[type, str]]]:
    cfg, problems = _normalize(config, kernel_keys)
    if cfg is None or problem is None:
        return cfg, problems
    arrays = ConfigArrays.from_configs([cfg])
    msgs = [r.message(problem, arrays, 0) for r in _config_rules(arch is not None or not arch_stand_ins)
            if bool(r.broken(problem, arrays)[0])]
    if kernel_keys:
        msgs += kernel_key_problems(problem, cfg)
    if not msgs and arch is not None:  # lower only what is in range: the model assumes it
        lw = lower(problem, arch, arrays)
        msgs = [r.message(problem, arch, lw, 0) for r in RULES if bool(r.broken(problem, arch, lw)[0])]
        if kernel_keys:
            msgs += kernel_key_arch_problems(problem, arch, cfg)
    return cfg, [(ValueError, m) for m in msgs]


def check_matmul_config(problem: MatmulProblem, config: Mapping[str, Any], arch: GPUArch | None = None, *,
                        kernel_keys: bool = False, arch_stand_ins: bool = True) -> list[str]:
    """Why ``config`` cannot compile or launch for ``problem`` on ``arch``; an empty list means legal.

    This is the one validity function of the project: the carver filters its search with the same
    rules, and the autotuner calls it before compiling and records a non-empty answer as a
    ``resource_error`` trial. Without ``arch`` only the rules no GPU escapes are checked (what
    ``templates.matmul.kernel`` needs), with bounds of any GPU standing in for the GPU's shared memory,
    registers and device memory unless ``arch_stand_ins`` is False (the caller asks a GPU's template for
    those next). ``kernel_keys`` admits and checks the kernel-only keys (:data:`KERNEL_KEYS`).
    """
    return [m for _, m in _violations(problem, config, arch, kernel_keys, arch_stand_ins)[1]]


def require_matmul_config(problem: MatmulProblem | None, config: Mapping[str, Any], arch: GPUArch | None = None,
                          *, kernel_keys: bool = False) -> dict[str, Any]:
    """:func:`check_matmul_config` that raises (with ``problem=None``: only :func:`normalize_config`'s
    per-key checks). Returns the normalised config (ints, defaults filled in); raises a TypeError when
    only types are wrong (a config that is not a dict, a flag that is not a bool), else a ValueError,
    with every problem in the message."""
    cfg, problems = _violations(problem, config, arch, kernel_keys)
    if problems:
        exc = TypeError if all(t is TypeError for t, _ in problems) else ValueError
        raise exc("; ".join(m for _, m in problems))
    assert cfg is not None
    return cfg
