"""AttentionTemplate: rank flash-attention forward tilings (``templates.attention``) without a GPU.

    tmpl = AttentionTemplate(AttentionProblem(8, 32, 4096, 128, kv_heads=8, causal=True)).with_arch("H100")
    tmpl.recommend_hints(8)     # legal configs, best first;  tmpl.rank(configs), .predict(c), .validate(c)

Same interface as :class:`~carver.matmul.MatmulTemplate` and :class:`~carver.templates.GEMVTemplate`.
The problem, the config keys and the rules live here (``templates.attention`` re-exports the problem and
asks :func:`check_attention_config`), so the carver never ranks what the kernel refuses (STYLE.md 4).

The model is Roller-style, per CTA step (one ``block_N`` slice of keys) on one SM:

* **tensor**: the two products, ``2 * 2 * block_M * block_N * dim`` FLOPs, at the per-SM tensor peak
  (wgmma; mma.sync at the family's fraction), derated by the instruction width ``n / (n + n0)``;
* **softmax**: CUDA-core and MUFU cycles per score element (mask, scale, max, exp2, sum, cast) plus the
  ``O`` rescale per output element. A warpgroup waits for its own products (TileLang 0.1.15 emits
  ``warpgroup_wait<0>`` after each ``T.gemm``), so tensor and softmax overlap only across the
  warpgroups resident on the SM: ``hidden = wg_overlap * (1 - 1/warpgroups) * min(tensor, softmax)``;
  the hand-scheduled ``variant="ws"`` (ping-pong warpgroups, ``P V`` in flight during the softmax) hides
  ``ws_overlap * min(tensor, softmax)``;
* **load latency** of the K and V tiles over the stages in flight (a TMA producer on Hopper, whose
  separate K and V barriers give ``kv_lead`` stages' worth of lead even at ``num_stages=1``; cp.async
  otherwise), a small per-step cost of rotating buffers when ``num_stages >= 2`` (dynamic barrier
  index, wgmma descriptor offset), **ingest** (bytes per step over the SM's bandwidth share) and
  **DRAM** (unique Q, K, V, O bytes) as a floor on the kernel.

CTAs = batch * heads * ceil(seq_len / block_M), in waves of ``SMs x CTAs per SM`` (shared memory,
registers, threads); causal CTAs visit keys only up to the diagonal, so their work is summed exactly
and spread over the slots, with half the longest CTA as the tail. Constants: :data:`ATTENTION_CONSTANTS`
(one place, per arch family; Hopper's fitted on H200 grids by ``carver.calibrate_attention``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .arch import CUDA, GPUArch
from .matmul import DroppedConfig, RankedConfig, Ranking
from .model import constants_for
from .problem import canonical_dtype, check_device_bytes, dtype_bytes, flag, int_in_range, positive_int, shape_dim

__all__ = [
    "ATTENTION_CONSTANTS",
    "ATTENTION_DIMS",
    "ATTENTION_DTYPES",
    "ATTENTION_GRID",
    "ATTENTION_KEYS",
    "ATTENTION_OPTIONAL_KEYS",
    "ATTENTION_VARIANTS",
    "ATTENTION_WS_GRID",
    "WS_REGS",
    "WS_PRODUCER_THREADS",
    "AttentionConstants",
    "AttentionHint",
    "AttentionPrediction",
    "AttentionProblem",
    "AttentionTemplate",
    "attention_space",
    "attention_ws_space",
    "check_attention_config",
    "normalize_attention_config",
    "tile_positions",
    "tile_steps",
    "ws_tiles_pipelined",
]

ATTENTION_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
#: Head dims the kernel is written and checked for.
ATTENTION_DIMS: tuple[int, ...] = (64, 128)
#: CUDA's grid limit on gridDim.y (heads) and gridDim.z (batch).
_GRID_YZ = 65535


@dataclass(frozen=True)
class AttentionProblem:
    """``O = softmax(Q K^T / sqrt(dim) [+ causal mask]) V`` per (batch, query head), in the BSHD layout:
    Q and O are ``(batch, seq_len, heads, dim)``, K and V ``(batch, seq_len, kv_heads, dim)``; query head
    ``h`` reads KV head ``h // (heads // kv_heads)`` (GQA; ``kv_heads`` None is ``heads``, MHA).

    ``causal``: query ``i`` sees keys ``0..i`` (top-left aligned, torch's ``is_causal=True``). fp32
    accumulation and softmax, scale ``1/sqrt(dim)``; O in ``dtype``. ``seq_len`` is any positive int.
    """

    batch: int
    heads: int
    seq_len: int
    dim: int
    kv_heads: int | None = None
    causal: bool = False
    dtype: str = "float16"

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "batch", int_in_range(self.batch, "batch", 1, _GRID_YZ, too_big="CUDA's gridDim.z limit",
                                         fix="split the batch into calls of at most 65535"))
        set_(self, "heads", int_in_range(self.heads, "heads", 1, _GRID_YZ, too_big="CUDA's gridDim.y limit"))
        set_(self, "seq_len", shape_dim(self.seq_len, "seq_len"))
        kv = self.heads if self.kv_heads is None else shape_dim(self.kv_heads, "kv_heads")
        if self.heads % kv:
            raise ValueError(f"heads={self.heads} must be a multiple of kv_heads={kv} (each KV head serves "
                             f"heads // kv_heads query heads); use a kv_heads that divides {self.heads}, or None "
                             f"for MHA")
        set_(self, "kv_heads", kv)
        dim = shape_dim(self.dim, "dim")  # an int first, as every other size: 64.0 and True are refused
        if dim not in ATTENTION_DIMS:
            raise ValueError(f"dim must be one of {list(ATTENTION_DIMS)} (the head dims the kernel is written "
                             f"for), got {self.dim!r}; pad the head dim to 64 or 128")
        set_(self, "dim", dim)
        set_(self, "causal", flag(self.causal, "causal"))
        try:
            dtype = canonical_dtype(self.dtype)
        except ValueError:
            dtype = None
        if dtype not in ATTENTION_DTYPES:
            raise ValueError(f"dtype must be one of {list(ATTENTION_DTYPES)}, got {self.dtype!r}")
        set_(self, "dtype", dtype)
        check_device_bytes(self.operand_bytes, f"the attention {self.describe()}")

    @property
    def groups(self) -> int:
        """Query heads per KV head (1 for MHA)."""
        return self.heads // self.kv_heads

    @property
    def elem_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def operand_bytes(self) -> int:
        """Bytes of Q, K, V and O together (what the GPU must hold and, at least, move)."""
        return 2 * self.batch * self.seq_len * (self.heads + self.kv_heads) * self.dim * self.elem_bytes

    @property
    def pairs(self) -> int:
        """Unmasked (query, key) pairs per (batch, head): S*S, or S*(S+1)/2 when causal."""
        S = self.seq_len
        return S * (S + 1) // 2 if self.causal else S * S

    @property
    def flops(self) -> int:
        """FLOPs of the two products over the unmasked pairs: 4*B*H*S*S*D, about half of it when causal."""
        return 4 * self.batch * self.heads * self.pairs * self.dim

    def describe(self) -> str:
        heads = f"H={self.heads}" if self.kv_heads == self.heads else f"H={self.heads}/{self.kv_heads}"
        return f"B={self.batch} {heads} S={self.seq_len} D={self.dim}{' causal' if self.causal else ''} {self.dtype}"


# --------------------------------------------------------------------------------------------------
# Config keys and rules (the one validity function; templates.attention asks it)
# --------------------------------------------------------------------------------------------------
ATTENTION_KEYS: tuple[str, ...] = ("block_M", "block_N", "num_stages", "threads")
#: ``variant``: TileLang's ``T.Pipelined`` loop (``program.py``) or the hand-scheduled Hopper loop
#: (``ws_program.py``: TMA producer, two or three consumer warpgroups overlapping the softmax with the GEMMs).
ATTENTION_VARIANTS: tuple[str, ...] = ("pipelined", "ws")
#: Keys a config may leave out, with the value that stands for them.
#: ``pack_gqa`` (ws only, GQA): a tile holds the rows of all ``groups`` query heads of one KV head at
#: ``block_M / groups`` query positions (FlashAttention-3's PackGQA), so K and V are read once for them and a
#: tile's rows past seq_len or past the causal diagonal are ``groups`` times fewer.
ATTENTION_OPTIONAL_KEYS: dict[str, Any] = {"variant": "pipelined", "persistent": 0, "pack_gqa": False}
# key: (lowest, highest, multiple of, fix)
_INT_KEYS: dict[str, tuple[int, int, int, str]] = {
    "block_M": (16, 256, 16, "use 64 or 128 query rows per CTA"),
    "block_N": (16, 256, 16, "use 32, 64 or 128 keys per step"),
    "num_stages": (0, 4, 1, "use 1 or 2 (K/V tiles in flight)"),
    "threads": (32, 1024, 32, "use 128 or 256"),
}
#: The exhaustive grid (templates.attention.space trims it by the rules).
ATTENTION_GRID: dict[str, tuple[Any, ...]] = {
    "block_M": (64, 128), "block_N": (32, 64, 128), "num_stages": (1, 2, 3), "threads": (128, 256),
}
#: The ws variant's grid: two or three consumer warpgroups of 64 rows each (the rules pair block_M with threads).
ATTENTION_WS_GRID: dict[str, tuple[Any, ...]] = {
    "block_M": (128, 192), "block_N": (64, 96, 128, 160, 176), "num_stages": (2, 3), "threads": (256, 384),
    "variant": ("ws",),
}  # one stage runs (the rules allow it) but measured 2-21% slower than its plain twin and never the best ws
#  config on the six Llama shapes of benchmarks/data/attention-ws-2026-11-22-h200 (2-3 stages: 0.99-1.10).
#  160 keys, two stages (at d128 Q, O and the ring fill 224 KB): persistent over its 128-key twin 1.02-1.06 at
#  4 x 4k and 1 x 16k without the mask, 0.90-0.96 at 1k (benchmarks/data/attention-bn160-2026-11-29-h200).
#  176 keys: legal at d64 only (196 fragment registers at d128); at d64 the best or within 1% of it on four of
#  six shapes, 0.94 of cuDNN at 8 x 1k against 0.92 for 128 keys (benchmarks/data/attention-storewait-2026-11-29-h200).
#  Three warpgroups (192 rows, 160 registers a thread: 192 x 96 and 192 x 128 at d64, 192 x 64 at d128): over the
#  best two-warpgroup config 1.08-1.10 at 4 x 4k and 16k d64 without the mask, 1.03-1.04 at 4 x 4k and 16k causal;
#  0.95 at 1k (two thirds of each head's last 192-row block is past seq_len), 0.91 at 1k causal
#  (benchmarks/data/attention-w3-2026-11-29-h200).
#: Points of the ws grid left out until measured: 160 and 176 keys in three stages (legal at d64 only), 96 keys
#: with two warpgroups or three stages, 64 keys with three warpgroups in three stages never ran.
_WS_UNMEASURED: tuple[dict[str, Any], ...] = (
    {"block_N": 160, "num_stages": 3}, {"block_N": 176, "num_stages": 3}, {"block_N": 96, "threads": 256},
    {"block_N": 96, "num_stages": 3}, {"block_N": 64, "threads": 384, "num_stages": 3})
_PRODUCER_THREADS = 128
#: The ws variant: its producer warpgroup and, per count of consumer warpgroups, the setmaxnreg budgets of
#: the producer and of each consumer thread (128 * 40 + 256 * 232 and 128 * 32 + 384 * 160 <= 64K registers).
WS_PRODUCER_THREADS = _PRODUCER_THREADS
WS_REGS: dict[int, tuple[int, int]] = {2: (40, 232), 3: (32, 160)}
#: Registers a ws consumer thread keeps beside its fragments (addresses, row statistics, predicates), per count
#: of consumer warpgroups. Three: 32, where ptxas fits 128 fragment registers (192 x 128 at d64) in 160 with no
#: spill.
_WS_REG_MARGIN: dict[int, int] = {2: 48, 3: 32}
#: What the persistent form's tiles-pipelined schedule keeps beyond that (the previous tile's row sums, its
#: round, the second Q buffer's phase), per count of consumer warpgroups. Two: ptxas fits it with no spill at 160
#: fragment registers (128 keys at d128) and spills 40 bytes at 184 (160 keys at d128). Three: none at 104 (96
#: keys at d64), 72 bytes at 112 (64 keys at d128) and 52 at 128 (128 keys at d64). Those configs keep the
#: per-tile schedule.
_WS_PIPELINE_REGS: dict[int, int] = {2: 16, 3: 24}
#: ``pack_gqa`` adds each row's query position (``i % (block_M / groups)``) to that. With two consumer warpgroups
#: ptxas fits it with no spill up to 164 fragment registers (176 keys at d64) and at 160 (128 keys at d128); with
#: three, none at 80 (64 keys at d64), and at 104 (96 keys at d64) it spills 32 bytes and serializes the wgmmas.
#: That config keeps the tiles pipelined all the same: so it measured 1.075 and 1.207 of cuDNN at 8 x 1k and 4 x 1k
#: causal (GQA 32/8, H200, 2026-12-02), the per-tile schedule 0.982 and 1.016 (0.1107 against 0.1023 ms at 8 x 1k,
#: cuDNN 0.109 and 0.110 in the two runs; benchmarks/data/attention-packgqa-2026-12-02-h200, race1 and pertile).


def normalize_attention_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Each key checked on its own and normalised (numpy ints as ints).
    A bad key or value is a ValueError / TypeError naming it, the value and the fix."""
    if not isinstance(config, Mapping):
        raise TypeError(f"an attention config must be a dict, got {config!r}")
    unknown = [k for k in config if k not in ATTENTION_KEYS and k not in ATTENTION_OPTIONAL_KEYS]
    missing = [k for k in ATTENTION_KEYS if k not in config]
    if unknown or missing:
        raise ValueError(f"config {dict(config)}: unknown key(s) {unknown}, missing {missing}; an attention config "
                         f"takes {list(ATTENTION_KEYS)} and optionally {list(ATTENTION_OPTIONAL_KEYS)}")
    out: dict[str, Any] = {}
    for key, (lo, hi, step, fix) in _INT_KEYS.items():
        out[key] = int_in_range(config[key], key, lo, hi, fix=fix)
        if out[key] % step:
            raise ValueError(f"{key} must be a multiple of {step}, got {config[key]!r}; {fix}")
    variant = config.get("variant", ATTENTION_OPTIONAL_KEYS["variant"])
    if variant not in ATTENTION_VARIANTS:
        raise ValueError(f"variant must be one of {list(ATTENTION_VARIANTS)}, got {variant!r}; 'pipelined' is "
                         f"TileLang's T.Pipelined loop, 'ws' the hand-scheduled Hopper loop")
    out["variant"] = variant
    persistent = config.get("persistent", ATTENTION_OPTIONAL_KEYS["persistent"])
    out["persistent"] = int_in_range(persistent, "persistent", 0, 1 << 16,
                                     fix="0: one CTA per tile; n: n resident CTAs (the SM count) that walk the tiles")
    out["pack_gqa"] = flag(config.get("pack_gqa", ATTENTION_OPTIONAL_KEYS["pack_gqa"]), "pack_gqa")
    return out


def tile_positions(problem: AttentionProblem, config: Mapping[str, Any]) -> tuple[int, int]:
    """(query positions a tile covers, head indices the tiles walk): ``block_M`` positions of each query head, or
    with ``pack_gqa`` ``block_M / groups`` positions of each KV head's ``groups`` query heads."""
    if config.get("pack_gqa"):
        return config["block_M"] // problem.groups, problem.kv_heads
    return config["block_M"], problem.heads


def _uses_wgmma(c: Mapping[str, Any], arch: GPUArch) -> bool:
    return arch.has_wgmma and c["threads"] % 128 == 0 and c["block_M"] >= 64


def _warp_specialized(c: Mapping[str, Any], arch: GPUArch) -> bool:
    """TMA producer warpgroup: sm_90+ and a pipelined loop (read in the sm_90a source), or the ws variant."""
    return arch.has_tma and (c["num_stages"] >= 1 or c["variant"] == "ws")


def _smem_bytes(problem: AttentionProblem, c: Mapping[str, Any]) -> int:
    """Q tile plus K and V tiles per stage, rounded to 1 KB, plus barriers. O reuses Q's tile in the
    T.Pipelined loop; in the ws variant both live in the consumer branch, so O's tile sits beside."""
    b, D = problem.elem_bytes, problem.dim
    stages = max(c["num_stages"], 1)
    tiles = 2 if c["variant"] == "ws" else 1
    dyn = tiles * c["block_M"] * D * b + stages * 2 * c["block_N"] * D * b
    return -(-dyn // 1024) * 1024 + 16 * stages + 64


def _acc_regs(problem: AttentionProblem, c: Mapping[str, Any]) -> float:
    """32-bit registers per consumer thread for the fragments: S (fp32) and P (dtype), block_M x block_N,
    and O (fp32), block_M x dim."""
    bm, bn = c["block_M"], c["block_N"]
    return (bm * bn * (4 + problem.elem_bytes) + bm * problem.dim * 4) / 4 / c["threads"]


def _acc_reg_limit(c: Mapping[str, Any], arch: GPUArch) -> int:
    """Fragment registers that fit without spilling: 192 of the 240 setmaxnreg gives 1-2 consumer
    warpgroups (96 of 160 for 3), as measured for the GEMM (carver/lowering.py); without a producer, the
    launch cap less what addresses, row statistics and predicates keep live."""
    if c["variant"] == "ws":
        return _ws_fragment_limit(c["threads"])
    if _warp_specialized(c, arch):
        return 192 if c["threads"] <= 256 else 96
    return min(arch.max_regs_per_thread, arch.regs_per_sm // c["threads"] // 8 * 8) - 72


def ws_regs(threads: int) -> tuple[int, int]:
    """The ws variant's setmaxnreg budgets (producer, consumer) for ``threads`` consumer threads (256 or 384)."""
    return WS_REGS[threads // 128]


def _ws_fragment_limit(threads: int, tiles_pipelined: bool = False) -> int:
    """Fragment registers a ws consumer thread has without spilling, in the per-tile or the tiles-pipelined
    schedule (two warpgroups' where the rules refuse ``threads``, which they say on their own)."""
    n = threads // 128 if threads // 128 in WS_REGS else 2
    return WS_REGS[n][1] - _WS_REG_MARGIN[n] - _WS_PIPELINE_REGS[n] * tiles_pipelined


def ws_tiles_pipelined(problem: AttentionProblem, config: Mapping[str, Any]) -> bool:
    """Whether the persistent ws form overlaps a tile's end with the next tile's start (each CTA's tiles in two
    Q buffers, O staged in the finished tile's): where its extra registers fit beside the fragments."""
    c = normalize_attention_config(config)
    return (c["variant"] == "ws" and c["persistent"] > 0
            and _acc_regs(problem, c) <= _ws_fragment_limit(c["threads"], tiles_pipelined=True))


def _ws_problems(c: Mapping[str, Any]) -> list[str]:
    """What the hand-scheduled loop (``variant="ws"``) cannot do on any GPU."""
    out = []
    if c["threads"] // 128 not in WS_REGS or c["threads"] % 128:
        out.append(f"variant='ws' runs two or three consumer warpgroups (threads=256 or 384; the 128-thread producer "
                   f"is launched on top), got threads={c['threads']}; use threads=256 with block_M=128 or threads=384 "
                   f"with block_M=192")
    elif c["block_M"] != c["threads"] // 2:
        # 64 rows each: at 256 rows over two warpgroups the Q K^T accumulator deals rows 0-63 and 128-191 to
        # warpgroup 0, the P V operand wants rows 0-127 there (TileLang 0.1.15: "Layout infer conflict between
        # acc_s and acc_p")
        out.append(f"variant='ws' gives each consumer warpgroup 64 query rows: block_M must be threads / 2 (128 for "
                   f"threads=256, 192 for 384), got block_M={c['block_M']} with threads={c['threads']}; use "
                   f"block_M={c['threads'] // 2}")
    if c["num_stages"] < 1:
        out.append(f"variant='ws' loads K and V into a ring of num_stages stages, got num_stages={c['num_stages']}; "
                   f"use num_stages=2")
    return out


def _pack_problems(problem: AttentionProblem, c: Mapping[str, Any]) -> list[str]:
    """What ``pack_gqa`` needs of the problem and the tile: query heads to pack, and each head's rows a whole
    number of 8-row groups (the 128-byte swizzle's repeat, where each head's TMA box lands in the tile)."""
    g, bm = problem.groups, c["block_M"]
    if g == 1:
        return [f"pack_gqa=True packs the query heads that share a KV head, but this problem has one query head per "
                f"KV head (heads={problem.heads}, kv_heads={problem.kv_heads}); use pack_gqa=False"]
    if bm % (8 * g):
        fits = [f"block_M={m} with threads={2 * m}" for m in (128, 192) if m != bm and m % (8 * g) == 0]
        return [f"pack_gqa=True gives each of the {g} query heads of a KV head block_M / {g} rows of the tile, in "
                f"whole groups of 8 (where each head's TMA box lands), so block_M must be a multiple of {8 * g}, got "
                f"block_M={bm}; use {' or '.join(fits + ['pack_gqa=False'])}"]
    return []


def check_attention_config(problem: AttentionProblem, config: Mapping[str, Any],
                           arch: GPUArch | None = None) -> list[str]:
    """Why ``config`` cannot run ([] when legal). With ``arch=None`` the rules no GPU escapes; with an
    arch, its shared memory, registers and instructions too. Never raises for a bad config."""
    try:
        c = normalize_attention_config(config)
    except (TypeError, ValueError) as e:
        return [str(e)]
    out = []
    bm, bn, t = c["block_M"], c["block_N"], c["threads"]
    warps = t // 32
    if bm % (16 * warps) and c["variant"] != "ws":  # the ws rules pair block_M with threads, which implies this
        fit = max(w for w in range(1, warps + 1) if (bm // 16) % w == 0)
        out.append(f"threads={t} is {warps} warps, each owning whole rows of the {bm}x{bn} score tile (FullRow, "
                   f"16 rows at least), so block_M must be a multiple of {16 * warps}, got block_M={bm}; use "
                   f"threads={32 * fit} or block_M={16 * warps}")
    if c["variant"] == "ws":
        out += _ws_problems(c)
        if c["pack_gqa"]:
            out += _pack_problems(problem, c)
    elif c["pack_gqa"]:
        out.append(f"pack_gqa=True is a form of the hand-scheduled loop, got variant={c['variant']!r}; use "
                   f"variant='ws' or pack_gqa=False")
    if c["persistent"] and c["variant"] != "ws":
        out.append(f"persistent={c['persistent']} is a form of the hand-scheduled loop, got variant="
                   f"{c['variant']!r}; use variant='ws' or persistent=0")
    if arch is None:
        return out
    if c["variant"] == "ws" and not (arch.has_wgmma and arch.has_tma):
        cc = "".join(map(str, arch.compute_capability))
        out.append(f"variant='ws' needs Hopper (sm_90: wgmma, TMA, mbarrier transactions, setmaxnreg); {arch.name} "
                   f"is sm_{cc}; use variant='pipelined'")
    if c["persistent"] > arch.sm_count:
        out.append(f"persistent={c['persistent']} CTAs are more than {arch.name}'s {arch.sm_count} SMs hold at once "
                   f"(one each): the rest would start only when a whole walk ends; use persistent={arch.sm_count}")
    if problem.causal and not arch.has_tma and c["num_stages"] >= 2:
        out.append(f"causal with num_stages={c['num_stages']} on {arch.name}: TileLang 0.1.15 cannot generate the "
                   f"cp.async pipeline over the causal loop's run-time trip count (codegen fails: 'Downcast from "
                   f"tirx.Sub to ir.IntImm'); use num_stages=1")
    smem = _smem_bytes(problem, c)
    if smem > arch.smem_per_block:
        o_tile = (f", O's staging tile {bm}x{problem.dim} (a second Q buffer where the tiles are pipelined)"
                  if c["variant"] == "ws" else "")
        out.append(f"needs {smem // 1024} KB of shared memory per CTA (Q {bm}x{problem.dim}{o_tile}, K and V "
                   f"{bn}x{problem.dim} x {max(c['num_stages'], 1)} stages), over "
                   f"the {arch.smem_per_block // 1024} KB {arch.name} allows; use fewer num_stages or a smaller "
                   f"block_N")
    regs, limit = _acc_regs(problem, c), _acc_reg_limit(c, arch)
    if regs > limit:
        out.append(f"the S, P and O fragments need {regs:.0f} registers per thread ({bm}x{bn} scores, {bm}x"
                   f"{problem.dim} output over {t} threads), over the {limit} that fit without spilling; use more "
                   f"threads or a smaller block_M / block_N")
    launched = t + _PRODUCER_THREADS * _warp_specialized(c, arch)
    if launched > arch.max_threads_per_block:
        out.append(f"launches {launched} threads, over {arch.max_threads_per_block}; use fewer threads")
    return out


def attention_space() -> list[dict[str, Any]]:
    """The whole grid (:data:`ATTENTION_GRID`), less what no GPU can run (the rules without an arch)."""
    return _product(ATTENTION_GRID)


def attention_ws_space() -> list[dict[str, Any]]:
    """The ws variant's grid (:data:`ATTENTION_WS_GRID`) less the points not yet measured."""
    return [c for c in _product(ATTENTION_WS_GRID)
            if not any(all(c[k] == v for k, v in u.items()) for u in _WS_UNMEASURED)]


def _product(grid: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Every config of ``grid`` (key -> values), in ``itertools.product`` order."""
    return [dict(zip(grid, v)) for v in itertools.product(*grid.values())]


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionConstants:
    """The attention model's own constants (times in microseconds, rates per clock); the memory and
    latency constants (load latency, per-SM bandwidth, ...) are the GEMM's, per family (carver.model)."""

    softmax_cycles_per_score: float   # SM cycles per score element: mask, scale, max, exp2, sum, cast
    rescale_cycles_per_output: float  # SM cycles per O element per step (O *= rescale)
    wg_overlap: float                 # how much of min(tensor, softmax) other warpgroups hide
    step_overhead_us: float           # fixed per step: barriers, wgmma fence/commit/wait, reductions
    stage_cost_us: float              # per step with num_stages >= 2: buffer, barrier and descriptor rotation
    kv_lead: float                    # TMA producer: extra stages' worth of lead from K and V's own buffers
    min_warps_per_sm: float           # w0 in the CUDA-core efficiency warps / (warps + w0)
    cta_overhead_us: float            # per CTA: Q load issue, normalisation, O store
    tail_fraction: float              # causal: the part of the longest CTA left as the tail
    p: float                          # p-norm that blends the per-step limits
    ws_overlap: float = 0.49          # ws variant: share of min(tensor, softmax) its schedule hides (fitted)
    ws3_overlap: float = 0.60         # the same with three consumer warpgroups (threads=384; fitted)
    persistent_tile_share: float = 0.7  # persistent ws: share of cta_fixed a CTA's later tiles still pay (fitted)
    tiles_pipelined_share: float = 0.5  # the same where the tiles are pipelined (ws_tiles_pipelined; fitted)

    def replace(self, **changes: float) -> AttentionConstants:
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return AttentionConstants(**values)


# Hopper: fitted on the four H200 calibration grids of 2026-11-21 (`python -m carver.calibrate_attention`,
# docs/attention.md), p fixed at 16 (the warp-specialized loop overlaps loads and compute nearly fully;
# p = 8 cannot tell the stage variants of a tile apart). 0.080 cycles per score is 10 FP32 ops at 128
# per clock, just above the 16-per-clock MUFU exp2 floor (0.0625); kv_lead 1.16: K and V have their own
# barriers, so with one stage the producer already loads the next K during softmax and P V.
_HOPPER_ATT = AttentionConstants(
    softmax_cycles_per_score=0.0800, rescale_cycles_per_output=0.0239, wg_overlap=0.822, step_overhead_us=0.1772,
    stage_cost_us=0.0045, kv_lead=1.163, min_warps_per_sm=1.329, cta_overhead_us=1.844, tail_fraction=0.5, p=16.0,
)
# Ampere / Ada have no measured attention grids: first guesses from the instruction rates (16 MUFU ex2
# and ~8 FP32 ops per score), not Hopper's fit (no TMA producer there, so kv_lead is unused).
_GUESS_ATT = AttentionConstants(
    softmax_cycles_per_score=0.125, rescale_cycles_per_output=1.0 / 64, wg_overlap=0.8, step_overhead_us=0.15,
    stage_cost_us=0.0, kv_lead=0.0, min_warps_per_sm=2.0, cta_overhead_us=1.0, tail_fraction=0.5, p=6.0,
)
#: Per arch family, like carver.model.CONSTANTS.
ATTENTION_CONSTANTS: dict[str, AttentionConstants] = {
    "hopper": _HOPPER_ATT, "ada": _GUESS_ATT, "ampere": _GUESS_ATT.replace(step_overhead_us=0.2),
}


@dataclass(frozen=True)
class AttentionPrediction:
    """Predicted latency (ms) of one config and the terms behind it (per-step times in us, per SM)."""

    config: dict
    latency_ms: float
    tensor_us: float       # the two products of one step, for the CTAs sharing the SM
    softmax_us: float      # the softmax and rescale of one step, same
    pipeline_us: float     # the load-latency chain of one step
    step_us: float         # blended time of one step
    waves: float
    occupancy: int
    ctas: int
    bound: str
    tflops: float
    warp_specialized: bool
    smem_bytes: int
    acc_regs: float
    errors: tuple[str, ...] = ()

    @property
    def legal(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class AttentionHint:
    """A recommended config; ``to_config()`` is the kernel's keyword dict."""

    items: tuple[tuple[str, Any], ...]
    prediction: AttentionPrediction | None = field(default=None, compare=False, repr=False)

    def to_config(self) -> dict[str, Any]:
        return dict(self.items)

    @property
    def block(self) -> tuple[int, int]:
        c = self.to_config()
        return c["block_M"], c["block_N"]

    @property
    def pipeline_stage(self) -> int:
        return self.to_config()["num_stages"]

    @property
    def threads(self) -> int:
        return self.to_config()["threads"]

    @property
    def predicted_ms(self) -> float | None:
        return None if self.prediction is None else self.prediction.latency_ms

    def __str__(self) -> str:
        pred = "" if self.prediction is None else f" ~{self.prediction.latency_ms * 1e3:.1f} us"
        return " ".join(f"{k}={v}" for k, v in self.items) + pred


def tile_steps(problem: AttentionProblem, config: Mapping[str, Any]) -> int:
    """Key steps (``block_M x block_N`` each) the kernel's tiles take in all: every key block for every tile, or
    (causal) each tile's up to its last query's diagonal (what the model's rounds count)."""
    c = normalize_attention_config(config)
    positions, heads = tile_positions(problem, c)
    nq, nk = -(-problem.seq_len // positions), -(-problem.seq_len // c["block_N"])
    per_head = _causal_steps(nq, nk, positions, c["block_N"])[0] if problem.causal else nq * nk
    return problem.batch * heads * per_head


def _causal_steps(nq: int, nk: int, bm: int, bn: int) -> tuple[int, int]:
    """Sum over query blocks of the key blocks a causal CTA visits, min(nk, ceil((bx+1) bm / bn)), and the
    largest; exact up to 2**16 query blocks, the integral beyond (where the error is below 1e-4)."""
    if nq <= 1 << 16:
        total = sum(min(nk, -(-(bx + 1) * bm // bn)) for bx in range(nq))
    else:
        j = min(nq, nk * bn / bm)  # blocks before the visits saturate at nk
        total = int(bm / bn * j * (j + 1) / 2 + j / 2 + nk * (nq - j))
    return total, min(nk, -(-nq * bm // bn))


class AttentionTemplate:
    """An attention problem; ``.with_arch(arch)`` binds a GPU and enables ranking."""

    keys = ATTENTION_KEYS

    def __init__(self, problem: AttentionProblem, arch: GPUArch | str | None = None,
                 constants: AttentionConstants | None = None) -> None:
        if not isinstance(problem, AttentionProblem):
            raise TypeError(f"AttentionTemplate takes a carver.attention.AttentionProblem, got {problem!r}")
        self.problem = problem
        self.arch: GPUArch | None = None if arch is None else CUDA(arch)
        if self.arch is not None:
            check_device_bytes(problem.operand_bytes, f"the attention {problem.describe()}", self.arch)
        self._constants = constants

    def __repr__(self) -> str:
        return f"AttentionTemplate({self.problem.describe()}, {self.arch.name if self.arch else 'no arch'})"

    def with_arch(self, arch: GPUArch | str) -> AttentionTemplate:
        return AttentionTemplate(self.problem, CUDA(arch), self._constants)

    def _need_arch(self) -> GPUArch:
        if self.arch is None:
            raise RuntimeError("this AttentionTemplate has no GPU; call .with_arch(CUDA('H100')) first")
        return self.arch

    @property
    def constants(self) -> AttentionConstants:
        return self._constants or ATTENTION_CONSTANTS[self._need_arch().family]

    def validate(self, config: Mapping[str, Any]) -> list[str]:
        """Why ``config`` cannot run here ([] when legal): :func:`check_attention_config` on this GPU."""
        return check_attention_config(self.problem, config, self._need_arch())

    def predict(self, config: Mapping[str, Any]) -> AttentionPrediction:
        """Predicted latency of one config; an illegal one still gets numbers, with ``.errors`` set."""
        return self._predict(normalize_attention_config(config), tuple(self.validate(config)))

    def _predict(self, c: dict[str, Any], errors: tuple[str, ...] = ()) -> AttentionPrediction:
        arch, p, a = self._need_arch(), self.problem, self.constants
        k = constants_for(arch)
        bm, bn, t, D, b = c["block_M"], c["block_N"], c["threads"], p.dim, p.elem_bytes
        ws = _warp_specialized(c, arch)
        stages = c["num_stages"]
        launched = t + _PRODUCER_THREADS * ws
        smem = _smem_bytes(p, c)
        acc = _acc_regs(p, c)
        # CTAs per SM: one with a producer (setmaxnreg splits the whole register file), else the limits.
        regs = min(arch.max_regs_per_thread, -(-int(1.25 * acc + 48) // 8) * 8)
        occ_regs = arch.regs_per_sm // max(1, -(-regs * 32 // 256) * 256 * -(-launched // 32))
        occ = 1 if ws else max(1, min(occ_regs, arch.smem_per_sm // (smem + arch.smem_reserved_per_block),
                                      arch.max_threads_per_sm // launched, arch.max_blocks_per_sm))
        clock = arch.clock_mhz  # cycles per us

        # One step on one SM, for the `occ` CTAs sharing it.
        peak_sm = arch.peak_flops(p.dtype) / arch.sm_count / 1e6  # FLOP per us
        peak_sm *= 1.0 if _uses_wgmma(c, arch) else k.mma_sync_fraction
        eff = [n / (n + k.inst_n_overhead) for n in (bn, D)]
        tensor = occ * (2.0 * bm * bn * D / peak_sm / eff[0] + 2.0 * bm * bn * D / peak_sm / eff[1])
        warps_sm = occ * t / 32
        cuda_eff = warps_sm / (warps_sm + a.min_warps_per_sm)
        softmax = occ * (bm * bn * a.softmax_cycles_per_score + bm * D * a.rescale_cycles_per_output) / clock / cuda_eff
        groups = occ * max(1, t // 128)
        # ws: P V in flight during the next softmax hides about half of the shorter of the two (fitted)
        if c["variant"] == "ws":
            hidden = a.ws3_overlap if t > 256 else a.ws_overlap
        else:
            hidden = a.wg_overlap * (1.0 - 1.0 / groups)
        compute = (tensor + softmax - min(hidden, 1.0) * min(tensor, softmax) + a.step_overhead_us
                   + a.stage_cost_us * (stages >= 2))
        step_bytes = 2 * bn * D * b
        latency = k.load_latency_us + step_bytes / k.sm_bandwidth
        s_eff = 1.0 + (max(stages - 1, 0) + a.kv_lead * ws) * k.stage_efficiency
        if ws:
            pipe = (latency + compute / occ) / s_eff
        else:
            pipe = (k.sync_copy_factor * latency + compute / occ + k.sync_overhead_us) / s_eff
        ingest = occ * step_bytes / k.sm_bandwidth
        step = (compute ** a.p + pipe ** a.p + ingest ** a.p) ** (1.0 / a.p)

        # CTAs over the SMs: exact waves without the mask; causal work spread over the slots plus a tail.
        positions, heads = tile_positions(p, c)  # pack_gqa: a tile's rows are groups heads' positions
        nq, nk = -(-p.seq_len // positions), -(-p.seq_len // bn)
        ctas = p.batch * heads * nq  # tiles: one CTA each, or walked by `persistent` resident CTAs
        slots = arch.sm_count * occ
        cta_fixed = a.cta_overhead_us + k.load_latency_us + 2 * bm * D * b / k.sm_bandwidth
        workers = min(c["persistent"], ctas) or ctas
        # persistent: each CTA walks ceil(ctas / workers) tiles; its producer loads the next tile's Q, K and V
        # while the consumers finish this one, so only the first tile pays cta_fixed whole
        per_worker = -(-ctas // workers)
        if p.causal:
            per_head, longest = _causal_steps(nq, nk, positions, bn)
            total_steps = p.batch * heads * per_head
            if c["persistent"]:  # each wave of resident CTAs walks its share; a second wave starts after the first
                walk = max(total_steps / workers + a.tail_fraction * longest, longest) if ctas > workers else longest
                rounds = math.ceil(workers / slots) * walk
            else:
                rounds = max(total_steps / slots + a.tail_fraction * longest, longest) if ctas > slots else longest
        else:
            rounds = math.ceil(workers / slots) * per_worker * nk
        waves = ctas / slots
        if c["persistent"]:
            share = a.tiles_pipelined_share if ws_tiles_pipelined(p, c) else a.persistent_tile_share
            fixed = math.ceil(workers / slots) * cta_fixed * (1 + (per_worker - 1) * share)
        else:
            fixed = math.ceil(waves) * cta_fixed
        body = rounds * step + fixed
        dram = (p.operand_bytes / (arch.dram_bandwidth / 1e6 * k.dram_efficiency))
        total = (body ** a.p + dram ** a.p) ** (1.0 / a.p) + k.launch_us
        if not (math.isfinite(total) and total > 0):
            raise RuntimeError(f"carver bug: the attention model predicted {total} us for {self!r} with {c}")
        terms = {"tensor": tensor, "softmax": softmax, "pipeline": pipe, "ingest": ingest}
        bound = "memory" if dram > body else max(terms, key=terms.get)
        return AttentionPrediction(
            config=dict(c), latency_ms=total / 1e3, tensor_us=tensor, softmax_us=softmax, pipeline_us=pipe,
            step_us=step, waves=waves, occupancy=occ, ctas=ctas, bound=bound,
            tflops=p.flops / (total * 1e-6) / 1e12, warp_specialized=ws, smem_bytes=smem, acc_regs=acc,
            errors=errors)

    def rank(self, configs: Iterable[Mapping[str, Any]]) -> Ranking:
        """Legal configs best first with their predictions; illegal ones dropped with the reasons."""
        good, dropped = [], []
        for cfg in configs:
            why = self.validate(cfg)
            if why:
                dropped.append(DroppedConfig(cfg, tuple(why)))
            else:
                c = normalize_attention_config(cfg)
                good.append((c, self._predict(c)))
        good.sort(key=lambda g: (g[1].latency_ms, tuple(g[0].values())))
        return Ranking(tuple(RankedConfig(c, pr) for c, pr in good), tuple(dropped))

    def recommend_hints(self, topk: int = 8) -> list[AttentionHint]:
        """The ``topk`` best legal configs of :func:`attention_space`, best first."""
        topk = positive_int(topk, "topk")
        ranked = self.rank(attention_space()).ranked
        if not ranked:
            raise ValueError(f"no legal attention config for {self!r}")
        return [AttentionHint(tuple(r.config.items()), r.prediction) for r in ranked[:topk]]
