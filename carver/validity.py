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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import GPUArch
from .lowering import ConfigArrays, Lowering, lower
from .problem import MatmulProblem

__all__ = [
    "CONFIG_KEYS",
    "OPTIONAL_KEYS",
    "Rule",
    "RULES",
    "check_matmul_config",
    "legal_mask",
    "normalize_config",
]

#: The reserved parameters every matmul config sets.
CONFIG_KEYS: tuple[str, ...] = (
    "block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization",
)
#: Keys the matmul kernel (templates.matmul.kernel) also takes, with their defaults.
OPTIONAL_KEYS: dict[str, int] = {"panel_size": 10, "split_k": 1}


@dataclass(frozen=True)
class Rule:
    """One legality rule: ``broken(problem, arch, lw)`` flags configs (bool array); ``message(...)``
    explains config ``i`` with its value and a fix."""

    name: str
    broken: Callable[[MatmulProblem, GPUArch, Lowering], np.ndarray]
    message: Callable[[MatmulProblem, GPUArch, Lowering, int], str]


def _cfg_str(lw: Lowering, i: int) -> str:
    c = lw.cfg
    return f"{int(c.block_M[i])}x{int(c.block_N[i])}x{int(c.block_K[i])}"


def _max_stages(problem: MatmulProblem, arch: GPUArch, lw: Lowering, i: int) -> int:
    c = lw.cfg
    per_stage = (int(c.block_M[i]) + int(c.block_N[i])) * int(c.block_K[i]) * problem.in_bytes
    return max(0, (arch.smem_per_block - 1024) // per_stage)


def _msg_dtype(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    return (f"in_dtype={p.in_dtype!r} has no tensor-core path on {a.name} (supported: "
            f"{[d for d, _ in a.tensor_peak]}); use one of those dtypes or another GPU")


def _msg_fp8(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    why = ("needs A as (M, K) and B as (N, K): trans_A=False, trans_B=True"
           if (p.trans_A or not p.trans_B) else
           f"needs the wgmma path: block_M >= 64 (got {int(c.block_M[i])}) and thread_num a multiple of "
           f"128 (got {int(c.thread_num[i])})")
    return f"{p.in_dtype} GEMM {why}; TileLang has no mma.sync lowering for it"


def _msg_threads(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    t = int(lw.cfg.thread_num[i])
    if t <= 0 or t % a.warp_size:
        return f"thread_num must be a positive multiple of {a.warp_size} (whole warps), got {t}"
    return (f"thread_num={t} launches {int(lw.launched_threads[i])} threads (with the 128-thread TMA "
            f"producer), over the {a.max_threads_per_block} a block may have; use thread_num <= "
            f"{a.max_threads_per_block - 128 * bool(lw.warp_specialized[i])}")


def _msg_block_mult(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    bm, bn = int(c.block_M[i]), int(c.block_N[i])
    if bm <= 0 or bm % 16:
        return f"block_M must be a positive multiple of 16 (one MMA row slab), got {bm}; e.g. {max(16, bm // 16 * 16)}"
    return f"block_N must be a positive multiple of 8 (one MMA column slab), got {bn}; e.g. {max(8, bn // 8 * 8)}"


def _msg_block_k(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    bk = int(lw.cfg.block_K[i])
    return (f"block_K must be a positive multiple of {lw.k_step} for {p.in_dtype} (one tensor-core k-step of "
            f"32 bytes), got {bk}; e.g. {max(lw.k_step, bk // lw.k_step * lw.k_step)}")


def _msg_partition(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    bm, bn, t = int(c.block_M[i]), int(c.block_N[i]), int(c.thread_num[i])
    inst = "wgmma" if lw.wgmma[i] else "mma.sync"
    extra = " with m_warp a multiple of 4 (whole warpgroups)" if lw.wgmma[i] else ""
    return (f"no warp partition for block {bm}x{bn} over thread_num={t} ({t // a.warp_size} warps, {inst}): "
            f"each warp must own a multiple of 16 rows and 8 columns{extra}; use thread_num=128, or "
            f"block_M a multiple of {16 * max(4, t // a.warp_size)} or block_N a multiple of "
            f"{8 * max(1, t // a.warp_size // 4)}")


def _msg_smem(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    s = int(c.num_stages[i])
    fit = _max_stages(p, a, lw, i)
    fix = (f"use num_stages <= {fit}" if fit >= 1 else "use a smaller block_K or tile")
    return (f"{_cfg_str(lw, i)} with num_stages={s} needs {int(lw.smem_bytes[i])} bytes of shared memory, over "
            f"{a.name}'s {a.smem_per_block} per block (it compiles, then fails to launch); {fix}")


def _msg_regs(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    t = int(c.thread_num[i])
    acc = float(lw.acc_regs[i])
    need_threads = next((x for x in (128, 256) if acc * t / x <= 192 and x > t), None)
    fix = (f"use thread_num={need_threads} or a smaller block_M*block_N" if need_threads
           else "use a smaller block_M*block_N")
    return (f"block {_cfg_str(lw, i)} needs {acc:.0f} accumulator registers per thread with thread_num={t}, "
            f"over the {int(lw.acc_reg_limit[i])} that fit (ptxas would spill them or fail); {fix}")


def _msg_split(p: MatmulProblem, a: GPUArch, lw: Lowering, i: int) -> str:
    c = lw.cfg
    return (f"panel_size and split_k must be positive and every split must get work; got panel_size="
            f"{int(c.panel_size[i])}, split_k={int(c.split_k[i])} for K={p.K}, block_K={int(c.block_K[i])}; "
            f"use split_k <= {max(1, -(-p.K // int(c.block_K[i])))}")


def _split_broken(p: MatmulProblem, a: GPUArch, lw: Lowering) -> np.ndarray:
    c = lw.cfg
    split = c.split_k
    bk = np.maximum(c.block_K, 1)
    k_split = -(-p.K // np.maximum(split, 1))  # ceil(K / split)
    k_per = -(-k_split // bk) * bk                # rounded up to whole K tiles
    return (c.panel_size < 1) | (split < 1) | ((split > 1) & ((split - 1) * k_per >= p.K))


def _fp8_broken(p: MatmulProblem, a: GPUArch, lw: Lowering) -> np.ndarray:
    if p.in_bytes != 1:
        return np.zeros(len(lw.cfg), dtype=bool)
    return ~lw.wgmma


#: The rules, in the order their messages are reported.
RULES: tuple[Rule, ...] = (
    Rule("dtype", lambda p, a, lw: np.full(len(lw.cfg), not a.supports(p.in_dtype)), _msg_dtype),
    Rule("threads", lambda p, a, lw: (lw.cfg.thread_num <= 0) | (lw.cfg.thread_num % a.warp_size != 0)
         | (lw.launched_threads > a.max_threads_per_block), _msg_threads),
    Rule("block_multiple", lambda p, a, lw: (lw.cfg.block_M <= 0) | (lw.cfg.block_M % 16 != 0)
         | (lw.cfg.block_N <= 0) | (lw.cfg.block_N % 8 != 0), _msg_block_mult),
    Rule("block_K", lambda p, a, lw: (lw.cfg.block_K <= 0) | (lw.cfg.block_K % lw.k_step != 0), _msg_block_k),
    Rule("fp8_path", _fp8_broken, _msg_fp8),
    Rule("warp_partition", lambda p, a, lw: ~lw.partition_ok, _msg_partition),
    Rule("shared_memory", lambda p, a, lw: lw.smem_bytes > a.smem_per_block, _msg_smem),
    Rule("registers", lambda p, a, lw: lw.acc_regs > lw.acc_reg_limit, _msg_regs),
    Rule("split", _split_broken, _msg_split),
)


def legal_mask(problem: MatmulProblem, arch: GPUArch, lw: Lowering) -> np.ndarray:
    """True where a config passes every rule (the vectorised form of :func:`check_matmul_config`)."""
    ok = np.ones(len(lw.cfg), dtype=bool)
    for rule in RULES:
        ok &= ~np.asarray(rule.broken(problem, arch, lw), dtype=bool)
    return ok


def normalize_config(config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """Check a config's keys and value types: ``(config with defaults, [])`` or ``(None, [problems])``."""
    if not isinstance(config, Mapping):
        return None, [f"a matmul config must be a dict, got {config!r} of type {type(config).__name__}"]
    problems = []
    unknown = [k for k in config if k not in CONFIG_KEYS and k not in OPTIONAL_KEYS]
    if unknown:
        problems.append(f"unknown config key(s) {unknown}; a matmul config takes "
                        f"{list(CONFIG_KEYS) + list(OPTIONAL_KEYS)}")
    missing = [k for k in CONFIG_KEYS if k not in config]
    if missing:
        problems.append(f"config {dict(config)} lacks {missing}; every matmul config sets {list(CONFIG_KEYS)}")
    out: dict[str, Any] = {}
    for key in CONFIG_KEYS + tuple(OPTIONAL_KEYS):
        if key not in config:
            if key in OPTIONAL_KEYS:
                out[key] = OPTIONAL_KEYS[key]
            continue
        value = config[key]
        if key == "enable_rasterization":
            if not isinstance(value, bool) and type(value).__name__ != "bool_":
                problems.append(f"enable_rasterization must be a bool, got {value!r}")
            out[key] = bool(value)
        elif isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            problems.append(f"{key} must be an int, got {value!r} of type {type(value).__name__}")
        elif key == "num_stages" and value < 0:
            problems.append(f"num_stages must be >= 0 (0: no pipeline, synchronous copies), got {value}")
        else:
            out[key] = int(value)
    return (None, problems) if problems else (out, [])


def check_matmul_config(problem: MatmulProblem, config: Mapping[str, Any], arch: GPUArch) -> list[str]:
    """Why ``config`` cannot compile or launch for ``problem`` on ``arch``; an empty list means legal.

    This is the one validity function of the project: the carver filters its search with the same
    rules, and the autotuner calls it before compiling and records a non-empty answer as a
    ``resource_error`` trial.
    """
    cfg, problems = normalize_config(config)
    if cfg is None:
        return problems
    arrays = ConfigArrays.from_configs([cfg])
    lw = lower(problem, arch, arrays)
    return [rule.message(problem, arch, lw, 0) for rule in RULES if bool(rule.broken(problem, arch, lw)[0])]
