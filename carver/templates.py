"""First models for memory-bound kernels: GEMV, elementwise and row reductions.

Same interface as :class:`~carver.matmul.MatmulTemplate` (``with_arch``, ``recommend_hints``, ``rank``,
``predict``, ``validate``), a simpler model: these kernels move every byte once, so time is the larger
of DRAM time and the per-CTA latency chain (a load's latency, hidden only by the CTAs and the loads in
flight per SM), over waves of CTAs. They reuse the family's calibrated latency and per-SM bandwidth;
nothing here is calibrated on measurements of these kernels yet (docs/carver.md says so).

Config keys: elementwise ``block_size`` (elements per CTA), ``thread_num``; GEMV ``block_N`` (output
rows per CTA), ``block_K`` (reduction chunk per step), ``thread_num`` and, for its tensor-core path,
``path="mma"``, ``num_stages``, ``split_k`` (``templates.gemv``'s kernels; the GEMV has its own fitted
model, ``carver.gemv_model``); reduction ``block_M`` (rows per CTA), ``block_N`` (chunk per step),
``thread_num``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .arch import CUDA, GPUArch
from .gemv_model import GemvConstants, gemv_constants_for, gemv_time
from .hint import NoRasterization
from .lowering import ConfigArrays, lower
from .matmul import DroppedConfig, RankedConfig, Ranking
from .model import ModelConstants, constants_for
from .problem import (
    INT32_MAX,
    MatmulProblem,
    canonical_dtype,
    check_device_bytes,
    dtype_bytes,
    int_in_range,
    is_bool,
    positive_int,
    shape_dim,
)
from .validity import (
    MAX_BLOCK,
    MAX_GRID_YZ,
    MAX_NUM_STAGES,
    MAX_SMEM_PER_BLOCK,
    check_matmul_config,
    legal_mask,
    split_has_work,
)

__all__ = [
    "GEMV_GRID",
    "GEMV_MAX_M",
    "GEMV_MMA_ASYNC_GRID",
    "GEMV_MMA_GRID",
    "GEMV_MMA_ROWS",
    "GEMV_OPTIONAL",
    "GEMV_PATHS",
    "ElementwiseTemplate",
    "GEMVTemplate",
    "GeneralReductionTemplate",
    "KernelHint",
    "KernelPrediction",
    "gemv_mma_misaligned",
    "gemv_mma_threads",
    "gemv_space",
    "gemv_vec",
]

#: Fraction of the data-sheet DRAM bandwidth a streaming kernel reaches (H200: 4.3 of 4.8 TB/s copy).
_DRAM_FRACTION = 0.9


@dataclass(frozen=True)
class KernelPrediction:
    """Predicted latency (ms) and its terms: DRAM time, the per-CTA latency chain, waves."""

    config: dict
    latency_ms: float
    memory_ms: float
    latency_chain_ms: float
    waves: float
    ctas: int
    bound: str
    errors: tuple[str, ...] = ()

    @property
    def legal(self) -> bool:
        return not self.errors

    @property
    def terms(self) -> dict[str, float]:
        return dict(memory_ms=self.memory_ms, latency_chain_ms=self.latency_chain_ms, waves=self.waves)


@dataclass(frozen=True)
class KernelHint:
    """A recommended config of a memory-bound template; ``to_config()`` is the kernel's keyword dict."""

    items: tuple[tuple[str, int], ...]
    prediction: KernelPrediction | None = field(default=None, compare=False, repr=False)
    pipeline_stage: int = 0
    warp: tuple[int, ...] = ()
    rasterization_plan: NoRasterization = NoRasterization()

    def to_config(self) -> dict[str, int]:
        return dict(self.items)

    @property
    def threads(self) -> int:
        return self.to_config()["thread_num"]

    @property
    def block(self) -> tuple[int, ...]:
        return tuple(v for k, v in self.items if k.startswith("block"))

    @property
    def rstep(self) -> tuple[int, ...]:
        c = self.to_config()
        return (c["block_K"],) if "block_K" in c else ((c["block_N"],) if "block_M" in c else ())


@dataclass(frozen=True)
class _Work:
    """What one config asks of the GPU: CTAs, bytes per CTA and in total, steps per CTA."""

    ctas: int
    bytes_total: float
    bytes_per_step: float
    steps: int


class _MemoryBoundTemplate:
    """Shared machinery: a config space, rules, a work description, the streaming model."""

    keys: tuple[str, ...] = ()

    def __init__(self, arch: GPUArch | str | None = None) -> None:
        self.arch: GPUArch | None = None if arch is None else CUDA(arch)
        # The subclass has set its shape: refuse one no GPU (or not this one) can hold.
        check_device_bytes(self._operand_bytes(), f"{type(self).__name__}({self._describe()})", self.arch)

    def _args(self) -> dict[str, Any]:
        raise NotImplementedError

    def _operand_bytes(self) -> int:
        """Bytes of every input and output tensor together."""
        raise NotImplementedError

    def _describe(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._args().items())

    def with_arch(self, arch: GPUArch | str) -> Any:
        return type(self)(**self._args(), arch=CUDA(arch))

    def _need_arch(self) -> GPUArch:
        if self.arch is None:
            raise RuntimeError(f"this {type(self).__name__} has no GPU; call .with_arch(CUDA('H100')) first")
        return self.arch

    # subclass hooks
    def _space(self) -> Iterable[dict[str, int]]:
        raise NotImplementedError

    def _rules(self, c: dict[str, int]) -> list[str]:
        raise NotImplementedError

    def _work(self, c: dict[str, int]) -> _Work:
        raise NotImplementedError

    def _normalize(self, config: Mapping[str, Any]) -> tuple[dict[str, int] | None, list[str]]:
        if not isinstance(config, Mapping):
            return None, [f"a {type(self).__name__} config must be a dict, got {config!r}"]
        problems = []
        unknown = [k for k in config if k not in self.keys]
        missing = [k for k in self.keys if k not in config]
        if unknown:
            problems.append(f"unknown config key(s) {unknown}; this template takes {list(self.keys)}")
        if missing:
            problems.append(f"config {dict(config)} lacks {missing}; this template takes {list(self.keys)}")
        out = {}
        for k in self.keys:
            try:  # thread_num's range and multiples are _thread_rules'; here: an int a kernel can index
                out[k] = int_in_range(config.get(k, 1), k, 1, INT32_MAX, too_big="TileLang indexes with int32")
            except ValueError as e:
                problems.append(str(e))
        return (None, problems) if problems else (out, [])

    def _thread_rules(self, t: int) -> list[str]:
        arch = self._need_arch()
        if t % arch.warp_size or not 0 < t <= arch.max_threads_per_block:
            return [f"thread_num must be a multiple of {arch.warp_size} in [32, {arch.max_threads_per_block}], "
                    f"got {t}"]
        return []

    def _tie_key(self, c: dict[str, Any]) -> tuple:
        """Orders configs the model predicts equal (the same order every run)."""
        return tuple(c.values())

    def validate(self, config: Mapping[str, Any]) -> list[str]:
        """Why ``config`` cannot run here ([] when legal); each message names the value and a fix."""
        cfg, problems = self._normalize(config)
        return problems if cfg is None else self._thread_rules(cfg["thread_num"]) + self._rules(cfg)

    def predict(self, config: Mapping[str, Any]) -> KernelPrediction:
        cfg, problems = self._normalize(config)
        if cfg is None:
            raise ValueError("; ".join(problems))
        return self._predict(cfg, tuple(self.validate(cfg)))

    def _predict(self, c: dict[str, int], errors: tuple[str, ...] = ()) -> KernelPrediction:
        arch = self._need_arch()
        k: ModelConstants = constants_for(arch)
        w = self._work(c)
        t = c["thread_num"]
        occ = max(1, min(arch.max_threads_per_sm // t, arch.max_blocks_per_sm))
        per_wave = arch.sm_count * occ
        waves = w.ctas / per_wave
        active = min(w.ctas, per_wave)
        per_sm = active / min(active, arch.sm_count)
        # One step: a load's latency plus its transfer at this SM's share of bandwidth; the loads of a
        # step are issued together, so more threads per CTA do not add latency, only bytes in flight.
        step = k.load_latency_us + w.bytes_per_step * per_sm / k.sm_bandwidth
        chain = math.ceil(waves) * w.steps * step if w.ctas else 0.0
        memory = w.bytes_total / (arch.dram_bandwidth * _DRAM_FRACTION / 1e6)
        total = (memory ** 4 + chain ** 4) ** 0.25 + k.launch_us
        if not (math.isfinite(total) and total > 0):
            raise RuntimeError(f"carver bug: the model predicted {total} us for {self!r} with {c}; please report it")
        return KernelPrediction(config=dict(c), latency_ms=total / 1e3, memory_ms=memory / 1e3,
                                latency_chain_ms=chain / 1e3, waves=waves, ctas=w.ctas,
                                bound="memory" if memory >= chain else "latency", errors=errors)

    def rank(self, configs: Iterable[Mapping[str, Any]]) -> Ranking:
        """Legal configs best first with their predictions; illegal ones dropped with the reasons
        (the same :class:`~carver.matmul.Ranking` as ``MatmulTemplate.rank``)."""
        good, dropped = [], []
        for c in configs:
            why = self.validate(c)
            if why:
                dropped.append(DroppedConfig(c, tuple(why)))
            else:
                cfg = self._normalize(c)[0]
                good.append((cfg, self._predict(cfg)))
        good.sort(key=lambda g: (g[1].latency_ms, self._tie_key(g[0])))
        return Ranking(tuple(RankedConfig(c, p) for c, p in good), tuple(dropped))

    def recommend_hints(self, topk: int = 8) -> list[KernelHint]:
        topk = positive_int(topk, "topk")
        scored = []
        for c in self._space():
            if not self.validate(c):
                p = self._predict(c)
                scored.append((p.latency_ms, self._tie_key(c), c, p))
        if not scored:
            raise ValueError(f"no legal config for {self!r}")
        scored.sort(key=lambda s: (s[0], s[1]))
        return [KernelHint(tuple(c.items()), p) for _, _, c, p in scored[:topk]]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self._args().items())
        return f"{type(self).__name__}({args}, arch={self.arch.name if self.arch else None})"


class ElementwiseTemplate(_MemoryBoundTemplate):
    """``out[i] = f(in_0[i], ..., in_{n-1}[i])`` over ``numel`` elements."""

    keys = ("block_size", "thread_num")

    def __init__(self, numel: int, num_inputs: int = 1, dtype: str = "float16", out_dtype: str | None = None,
                 arch: GPUArch | str | None = None) -> None:
        self.numel = shape_dim(numel, "numel")
        self.num_inputs = positive_int(num_inputs, "num_inputs")
        self.dtype = canonical_dtype(dtype)
        self.out_dtype = canonical_dtype(out_dtype or dtype, "out_dtype")
        super().__init__(arch)

    def _args(self) -> dict[str, Any]:
        return dict(numel=self.numel, num_inputs=self.num_inputs, dtype=self.dtype, out_dtype=self.out_dtype)

    def _operand_bytes(self) -> int:
        return self.numel * (self.num_inputs * dtype_bytes(self.dtype) + dtype_bytes(self.out_dtype))

    def _space(self) -> Iterable[dict[str, int]]:
        for b, t in itertools.product([256 * 2 ** i for i in range(7)], (128, 256, 512, 1024)):
            yield dict(block_size=b, thread_num=t)

    def _rules(self, c: dict[str, int]) -> list[str]:
        vec = max(1, 16 // dtype_bytes(self.dtype))
        if c["block_size"] % (c["thread_num"] * vec):
            return [f"block_size must be a multiple of thread_num * {vec} (one 16-byte vector per thread), got "
                    f"block_size={c['block_size']}, thread_num={c['thread_num']}; use block_size="
                    f"{c['thread_num'] * vec * max(1, c['block_size'] // (c['thread_num'] * vec))}"]
        return []

    def _work(self, c: dict[str, int]) -> _Work:
        per_elem = self.num_inputs * dtype_bytes(self.dtype) + dtype_bytes(self.out_dtype)
        return _Work(ctas=math.ceil(self.numel / c["block_size"]), bytes_total=self.numel * per_elem,
                     bytes_per_step=c["block_size"] * per_elem, steps=1)


class GeneralReductionTemplate(_MemoryBoundTemplate):
    """``out[m] = reduce(x[m, :])`` for an ``(M, N)`` input (reduce the last axis)."""

    keys = ("block_M", "block_N", "thread_num")

    def __init__(self, M: int, N: int, dtype: str = "float16", out_dtype: str | None = None,
                 arch: GPUArch | str | None = None) -> None:
        self.M, self.N = shape_dim(M, "M"), shape_dim(N, "N")
        self.dtype = canonical_dtype(dtype)
        self.out_dtype = canonical_dtype(out_dtype or dtype, "out_dtype")
        super().__init__(arch)

    def _args(self) -> dict[str, Any]:
        return dict(M=self.M, N=self.N, dtype=self.dtype, out_dtype=self.out_dtype)

    def _operand_bytes(self) -> int:
        return self.M * self.N * dtype_bytes(self.dtype) + self.M * dtype_bytes(self.out_dtype)

    def _space(self) -> Iterable[dict[str, int]]:
        for bm, bn, t in itertools.product((1, 2, 4, 8, 16, 32), (128, 256, 512, 1024, 2048, 4096),
                                           (64, 128, 256, 512)):
            yield dict(block_M=bm, block_N=bn, thread_num=t)

    def _row_rules(self, rows: int, chunk: int, t: int, chunk_name: str, vec: int = 0) -> list[str]:
        vec = vec or max(1, 16 // dtype_bytes(self.dtype))
        out = []
        if chunk % vec:
            out.append(f"{chunk_name} must be a multiple of {vec} ({vec}-element vectors of {self.dtype}), got {chunk}")
        elif rows * chunk < t * vec:
            out.append(f"thread_num={t} leaves threads idle: {rows} rows x {chunk} = {rows * chunk} elements per "
                       f"step is under one {vec}-element vector per thread; use thread_num <= "
                       f"{max(32, rows * chunk // vec // 32 * 32)} or a larger {chunk_name}")
        if rows * chunk * dtype_bytes(self.dtype) > self._need_arch().smem_per_block:
            out.append(f"a {rows}x{chunk} step needs more shared memory than {self._need_arch().name} has per "
                       f"block; use a smaller {chunk_name}")
        return out

    def _rules(self, c: dict[str, int]) -> list[str]:
        return self._row_rules(c["block_M"], c["block_N"], c["thread_num"], "block_N")

    def _work(self, c: dict[str, int]) -> _Work:
        b = dtype_bytes(self.dtype)
        return _Work(ctas=math.ceil(self.M / c["block_M"]),
                     bytes_total=self.M * self.N * b + self.M * dtype_bytes(self.out_dtype),
                     bytes_per_step=c["block_M"] * c["block_N"] * b, steps=math.ceil(self.N / c["block_N"]))


#: The GEMV kernel's grid (``templates/gemv``), SIMT path: rows per CTA, threads along K per row (a power
#: of two up to a warp, so the reduction is warp shuffles) and vectors each thread loads before it uses any.
GEMV_GRID: dict[str, tuple[int, ...]] = {
    "block_N": (1, 2, 4, 8, 16, 32),
    "reduce_threads": (4, 8, 16, 32),
    "unroll": (1, 2, 4, 8),
}
#: The mma path's grid: ``templates.matmul``'s program with a 16-row x tile (``block_M = 16``), W tiles
#: of ``block_N x block_K`` through a ``num_stages`` pipeline, K split over ``split_k`` CTAs (summed in
#: fp32 by a second kernel). ``thread_num`` follows block_N (:func:`gemv_mma_threads`).
GEMV_MMA_GRID: dict[str, tuple[int, ...]] = {
    "block_N": (16, 32, 64, 128),
    "block_K": (128, 256, 512),
    "num_stages": (2, 4),
    "split_k": (1, 2),
}
#: The mma path's cp.async configs (``tma=False``): the same tiles loaded by cp.async in a plain
#: ``T.Pipelined`` loop, with no TMA and no producer warpgroup. On a 32 MB weight they measured 4-7% faster
#: than the TMA lowering at M = 4 and 16, and 40% faster with 16-column tiles (H200, 2026-11-23,
#: ``benchmarks/data/gemv-fixed-cost-2026-11-23-h200``), so the grid holds the tiles that did best there.
GEMV_MMA_ASYNC_GRID: dict[str, tuple[int, ...]] = {
    "block_N": (16, 32, 64),
    "block_K": (128, 256),
    "num_stages": (4, 8),
}
#: The GEMV programs: CUDA-core FMAs with warp shuffles, or tensor cores (mma.sync) on a 16-row x tile.
GEMV_PATHS: tuple[str, ...] = ("simt", "mma")
#: Rows of x (tokens) the GEMV kernel takes: past this a tensor-core GEMM (templates.matmul) wins.
GEMV_MAX_M = 16
#: Rows of the mma path's x tile (one m16n8k16 row slab): rows >= M are zero-filled, never loaded or stored.
GEMV_MMA_ROWS = 16
#: The optional keys of a GEMV config, with the SIMT path's values.
GEMV_OPTIONAL: dict[str, Any] = {"path": "simt", "num_stages": 0, "split_k": 1, "tma": True}


def gemv_vec(K: int, dtype: str) -> int:
    """Elements per vector load of a W row: the widest power of two, at most 16 bytes, that divides K
    (rows of W start 16-byte aligned only when K is a multiple of 16 bytes: K = 4100 in fp16 takes 8-byte
    loads, an odd K scalar ones)."""
    vec = max(1, 16 // dtype_bytes(dtype))
    while K % vec:
        vec //= 2
    return vec


def gemv_mma_threads(block_N: int) -> int:
    """Threads of the mma path: a warp per 8 columns of the tile, at most four warps (each warp owns
    16 x block_N / warps of the accumulator)."""
    return min(128, max(1, block_N // 8) * 32)


def gemv_mma_misaligned(K: int, dtype: str) -> bool:
    """Rows of x and W not on 4-byte boundaries (odd K in 16-bit types): TileLang 0.1.15 then emits 2-byte
    ``cp.async`` copies for some mma tiles, which PTX does not have (the compile fails; measured on an H200,
    2026-11-21, K = 4097 and 14337), so the mma path is not offered; the SIMT path loads such rows."""
    return K * dtype_bytes(dtype) % 4 != 0


def gemv_space(K: int, dtype: str, vec: int = 0) -> list[dict[str, Any]]:
    """The GEMV kernel's whole grid for this K and dtype, SIMT then mma, in the carver's dict form.

    SIMT (``block_N``, ``block_K``, ``thread_num``): ``thread_num = block_N * reduce_threads`` (a multiple
    of 32), ``block_K = reduce_threads * vec * unroll`` (``vec`` 0: the widest load K allows). mma (plus
    ``path``, ``num_stages``, ``split_k``): :data:`GEMV_MMA_GRID` less the stages no GPU's shared memory
    holds and the splits that leave one with no K, then :data:`GEMV_MMA_ASYNC_GRID` with ``tma=False``
    (cp.async, no split). The carver ranks exactly these;
    ``templates.gemv.space`` is this list less what the stand-in GPU refuses."""
    vec = vec or gemv_vec(K, dtype)
    out: list[dict[str, Any]] = []
    for bn, rt, un in itertools.product(*GEMV_GRID.values()):
        if bn * rt % 32 == 0:
            out.append(dict(block_N=bn, block_K=rt * vec * un, thread_num=bn * rt))
    if gemv_mma_misaligned(K, dtype):
        return out
    mma = [(bn, bk, st, sk, {}) for bn, bk, st, sk in itertools.product(*GEMV_MMA_GRID.values())
           if split_has_work(K, bk, sk)]
    mma += [(bn, bk, st, 1, {"tma": False}) for bn, bk, st in itertools.product(*GEMV_MMA_ASYNC_GRID.values())]
    for bn, bk, st, sk, tma in mma:
        if st * (GEMV_MMA_ROWS + bn) * bk * dtype_bytes(dtype) + 1024 <= MAX_SMEM_PER_BLOCK:
            out.append(dict(path="mma", block_N=bn, block_K=bk, thread_num=gemv_mma_threads(bn), num_stages=st,
                            split_k=sk, **tma))
    return out


class GEMVTemplate(GeneralReductionTemplate):
    """``y[M, N] = x[M, K] @ A[N, K].T`` for a few rows of x (``M``, default 1), by one of two programs
    (``templates.gemv``): ``path="simt"`` (the default), ``thread_num / block_N`` threads reduce one row
    with warp shuffles, each loading ``block_K / (thread_num / block_N)`` elements per step in vectors
    of :func:`gemv_vec`; ``path="mma"``, the matmul program with a 16-row x tile, checked by the
    matmul rules (``carver.validity``). The model is :func:`carver.gemv_model.gemv_time`."""

    keys = ("block_N", "block_K", "thread_num", "path", "num_stages", "split_k", "tma")

    def __init__(self, N: int, K: int, dtype: str = "float16", out_dtype: str | None = None,
                 arch: GPUArch | str | None = None, M: int = 1, vec: int = 0,
                 constants: GemvConstants | None = None) -> None:
        N, self.K = shape_dim(N, "N"), shape_dim(K, "K")
        self.rows = int_in_range(M, "M", 1, GEMV_MAX_M, meaning="rows of x",
                                 too_big=f"for more than {GEMV_MAX_M} rows use the GEMM (templates.matmul)")
        widest = gemv_vec(self.K, canonical_dtype(dtype))
        vec = int_in_range(vec, "vec", 0, 16, fix="use 0 (16-byte vectors) or the width the kernel loads")
        # 0: the model alone, 16-byte vectors whatever K is; templates.gemv passes the width its kernel loads.
        self._given_vec = vec
        self.vec = vec or max(1, 16 // dtype_bytes(canonical_dtype(dtype)))
        if vec and (vec & (vec - 1) or widest % vec):
            raise ValueError(f"vec={vec} elements cannot load rows of K={self.K} {canonical_dtype(dtype)} (a "
                             f"power of two dividing K, at most 16 bytes: at most {widest} here); use vec=0 "
                             f"(the widest, {widest}) or a power of two below it")
        self.constants = constants
        self._mma_ok: set[tuple] = set()  # mma configs the matmul rules passed (see _legal_mma)
        super().__init__(M=N, N=K, dtype=dtype, out_dtype=out_dtype, arch=arch)
        # The mma path is the matmul program: its problem, for the matmul rules.
        self.matmul_problem = MatmulProblem(self.rows, self.M, self.K, self.dtype, self.out_dtype, trans_B=True)

    def _args(self) -> dict[str, Any]:
        return dict(N=self.M, K=self.K, dtype=self.dtype, out_dtype=self.out_dtype, M=self.rows, vec=self._given_vec)

    def with_arch(self, arch: GPUArch | str) -> GEMVTemplate:
        return type(self)(**self._args(), arch=CUDA(arch), constants=self.constants)

    def _operand_bytes(self) -> int:  # A (N, K), x (M, K), y (M, N)
        b = dtype_bytes(self.dtype)
        return self.M * self.K * b + self.rows * self.K * b + self.rows * self.M * dtype_bytes(self.out_dtype)

    def _space(self) -> Iterable[dict[str, Any]]:
        return gemv_space(self.K, self.dtype, self.vec)

    def _normalize(self, config: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
        """The carver's dict form: the three SIMT keys, or all six for the mma path."""
        if not isinstance(config, Mapping):
            return None, [f"a GEMVTemplate config must be a dict, got {config!r}"]
        path = config.get("path", "simt")
        if path not in GEMV_PATHS:
            return None, [f"path must be one of {list(GEMV_PATHS)}, got {path!r}; use 'simt' (CUDA cores) or "
                          f"'mma' (tensor cores, for several rows of x)"]
        tma = config.get("tma", True)
        if not is_bool(tma):
            return None, [f"tma must be a bool, got {tma!r} of type {type(tma).__name__}; use True (TileLang's TMA "
                          "lowering) or False (cp.async)"]
        if path != "mma" and not tma:
            return None, ["tma is a key of the mma path, got tma=False with path='simt'; add path='mma' or leave "
                          "it out"]
        ints = {k: v for k, v in config.items() if k not in ("path", "tma")}
        if path == "mma":
            ints = {"num_stages": 2, "split_k": 1, **ints}
        else:
            ints = {"num_stages": 0, "split_k": 1, **ints}
        int_keys = tuple(k for k in self.keys if k not in ("path", "tma"))
        problems = [f"unknown config key(s) {[k for k in ints if k not in int_keys]}; this template takes "
                    f"{list(self.keys)}"] if any(k not in int_keys for k in ints) else []
        missing = [k for k in int_keys if k not in ints]
        if missing:
            problems.append(f"config {dict(config)} lacks {missing}; this template takes {list(self.keys)}")
        out: dict[str, Any] = {"path": "mma"} if path == "mma" else {}
        for k in int_keys:
            lo = 0 if k == "num_stages" else 1
            try:
                out[k] = int_in_range(ints.get(k, 1), k, lo, INT32_MAX, too_big="TileLang indexes with int32")
            except ValueError as e:
                problems.append(str(e))
        if problems:
            return None, problems
        if path == "simt" and (out["num_stages"], out["split_k"]) != (0, 1):
            return None, [f"num_stages and split_k are keys of the mma path, got num_stages={out['num_stages']}, "
                          f"split_k={out['split_k']} with path='simt'; add path='mma' or leave them out"]
        if path == "simt":
            del out["num_stages"], out["split_k"]
        elif not tma:  # the default (TMA) stays out, as in the dicts of the grid
            out["tma"] = False
        return out, []

    @staticmethod
    def _matmul_config(c: Mapping[str, Any]) -> dict[str, Any]:
        return dict(block_M=GEMV_MMA_ROWS, block_N=c["block_N"], block_K=c["block_K"], num_stages=c["num_stages"],
                    thread_num=c["thread_num"], enable_rasterization=False, split_k=c["split_k"])

    def _legal_mma(self, configs: list[Mapping[str, Any]]) -> None:
        """The matmul rules for many mma configs in one vectorised pass (a config at a time costs ~1 ms):
        the legal ones are remembered, so :meth:`_rules` skips them."""
        arch = self._need_arch()
        todo = [self._normalize(c)[0] for c in configs if isinstance(c, Mapping) and c.get("path") == "mma"]
        todo = [c for c in todo if c is not None and c["num_stages"] <= MAX_NUM_STAGES
                and max(c["block_N"], c["block_K"]) <= MAX_BLOCK and c["split_k"] <= MAX_GRID_YZ
                and c["thread_num"] <= arch.max_threads_per_block]
        if not todo:
            return
        cfgs = ConfigArrays.from_configs([self._matmul_config(c) for c in todo])
        ok = legal_mask(self.matmul_problem, arch, lower(self.matmul_problem, arch, cfgs))
        self._mma_ok.update(tuple(c.values()) for c, o in zip(todo, ok) if o)

    def rank(self, configs: Iterable[Mapping[str, Any]]) -> Ranking:
        configs = list(configs)
        self._legal_mma(configs)
        return super().rank(configs)

    def recommend_hints(self, topk: int = 8) -> list[KernelHint]:
        self._legal_mma(list(self._space()))
        return super().recommend_hints(topk)

    def _rules(self, c: dict[str, Any]) -> list[str]:
        if c.get("path") == "mma":
            if gemv_mma_misaligned(self.K, self.dtype):
                return [f"the mma path needs rows of x and W on 4-byte boundaries (K * {dtype_bytes(self.dtype)} bytes "
                        f"a multiple of 4), got K={self.K}: TileLang 0.1.15 would copy them in 2-byte cp.async "
                        f"pieces, which PTX lacks; use path='simt' (the default) for this K"]
            if not c.get("tma", True) and c["split_k"] != 1:
                return [f"split_k is a key of the TMA program, got split_k={c['split_k']} with tma=False (the "
                        f"cp.async program runs one kernel); use split_k=1 or tma=True"]
            if tuple(c.values()) in self._mma_ok:
                return []
            return check_matmul_config(self.matmul_problem, self._matmul_config(c), self._need_arch())
        out = self._row_rules(c["block_N"], c["block_K"], c["thread_num"], "block_K", self.vec)
        bn, bk, t = c["block_N"], c["block_K"], c["thread_num"]
        rt = t // bn
        vec = self.vec
        pow2 = 2 ** (min(32, max(1, rt)).bit_length() - 1)
        if t % bn or rt not in (1, 2, 4, 8, 16, 32):
            out.append(f"thread_num / block_N must be a power of two up to 32 (threads reducing one row with warp "
                       f"shuffles), got thread_num={t}, block_N={bn}; use thread_num={bn * pow2}")
        elif bk % (rt * vec):
            out.append(f"block_K must be a multiple of thread_num / block_N * vec = {rt} * {vec} (each thread "
                       f"loads whole {vec}-element vectors; K={self.K} allows {vec}), got block_K={bk}; use "
                       f"block_K={rt * vec * max(1, bk // (rt * vec))}")
        return out

    def _tie_key(self, c: dict[str, Any]) -> tuple:
        # On a tie the TMA program (the one the stored grids measured) comes before its cp.async twin.
        return (c.get("path", "simt"),) + tuple(not c.get(k, True) if k == "tma" else c.get(k, GEMV_OPTIONAL.get(k))
                                                for k in self.keys if k != "path")

    def _predict(self, c: dict[str, Any], errors: tuple[str, ...] = ()) -> KernelPrediction:
        arch = self._need_arch()
        const = self.constants or gemv_constants_for(arch)
        full = {**GEMV_OPTIONAL, **c}
        t = gemv_time(arch, const, self.rows, self.M, self.K, dtype_bytes(self.dtype), dtype_bytes(self.out_dtype),
                      full["path"], full["block_N"], full["block_K"], full["thread_num"], full["num_stages"],
                      full["split_k"], full["tma"])
        if not (math.isfinite(t.total_us) and t.total_us > 0):
            raise RuntimeError(f"carver bug: the model predicted {t.total_us} us for {self!r} with {c}; "
                               f"please report it")
        terms = {"memory": t.memory_us, "latency": t.chain_us, "compute": t.compute_us}
        bound = max(terms, key=terms.__getitem__)
        return KernelPrediction(config=dict(c), latency_ms=t.total_us / 1e3, memory_ms=t.memory_us / 1e3,
                                latency_chain_ms=t.chain_us / 1e3, waves=t.waves, ctas=t.ctas, bound=bound,
                                errors=errors)
