"""MatmulTemplate: rank GEMM tilings for TileLang on a GPU with the analytical model, without a GPU.

    tmpl = MatmulTemplate(M=4096, N=4096, K=4096).with_arch(CUDA("H100"))
    hints = tmpl.recommend_hints(topk=8)       # best first, all legal
    hints[0].to_config()                       # the kernel's keyword config
    tmpl.rank(configs)                         # a user's list: legal ones ordered, illegal ones with why
    tmpl.predict(config)                       # latency and the terms behind it
    tmpl.validate(config)                      # [] if legal, else what is wrong and how to fix it

The search covers more than TileLang's 288-config grid (block 192/96/32, 4+ stages, block_K 128,
384 threads, split-K where the tiles underfill the GPU) but only legal configs, and it hedges: while
the next config of the region the constants were calibrated on is predicted within ``HEDGE_RANGE`` of
the best, at most half of the hints may come from outside it, so a wrong extrapolation cannot push every
measured winner out of the top-k (past that range, e.g. at few rows, the list may hold none of them).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import CUDA, GPUArch
from .hint import Hint, NoRasterization, Rasterization2DRow
from .lowering import ConfigArrays, Lowering, lower
from .model import ModelConstants, Terms, constants_for, predict_arrays
from .problem import MatmulProblem, check_device_bytes, positive_int
from .validity import check_matmul_config, explain_no_legal_config, legal_mask, normalize_config

__all__ = [
    "DroppedConfig",
    "EXTRAPOLATION_MARGIN",
    "MatmulTemplate",
    "Prediction",
    "RankedConfig",
    "Ranking",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one config (times in milliseconds).

    ``latency_ms`` is the prediction; ``compute_ms`` (tensor cores), ``memory_ms`` (L2 and DRAM),
    ``pipeline_ms`` (load latency over the stages in flight) and ``epilogue_ms`` (fill + C store) are the
    terms it blends; ``waves`` / ``wave_efficiency`` describe the tail; ``bound`` names the limit that
    dominates. ``errors`` is non-empty when the config is illegal (the numbers then say how it would do).
    """

    config: dict
    latency_ms: float
    compute_ms: float
    memory_ms: float
    pipeline_ms: float
    epilogue_ms: float
    iteration_us: float
    waves: float
    wave_efficiency: float
    occupancy: int
    bound: str
    tflops: float
    instruction: str
    warp_specialized: bool
    smem_bytes: int
    acc_regs: float
    errors: tuple[str, ...] = ()

    @property
    def legal(self) -> bool:
        return not self.errors

    @property
    def terms(self) -> dict[str, float]:
        return dict(compute_ms=self.compute_ms, memory_ms=self.memory_ms, pipeline_ms=self.pipeline_ms,
                    epilogue_ms=self.epilogue_ms, waves=self.waves, wave_efficiency=self.wave_efficiency)


@dataclass(frozen=True)
class RankedConfig:
    config: dict
    prediction: Prediction


@dataclass(frozen=True)
class DroppedConfig:
    config: Any
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Ranking:
    """What :meth:`MatmulTemplate.rank` returns. Iterating yields the legal configs, best first;
    ``.ranked`` pairs each with its prediction; ``.dropped`` lists the illegal ones with the reasons."""

    ranked: tuple[RankedConfig, ...]
    dropped: tuple[DroppedConfig, ...]

    @property
    def configs(self) -> list[dict]:
        return [r.config for r in self.ranked]

    def __iter__(self) -> Iterator[dict]:
        return iter(self.configs)

    def __len__(self) -> int:
        return len(self.ranked)


# The region the Hopper constants were calibrated on (TileLang's grid); hints outside it are capped.
_CALIBRATED = dict(block=(64, 128, 256), k_bytes=(64, 128), stages=(0, 1, 2, 3), threads=(128, 256))
#: How much faster (fraction) an extrapolated config must be predicted to rank above a calibrated one.
EXTRAPOLATION_MARGIN = 0.05
#: A calibrated config hedges against extrapolated ones only while predicted within this factor of the
#: best: 64x64 tiles predicted at 71 us against 49 us for split-K measured 75-93 us against 43-48 (H200,
#: benchmarks/data/few-rows-2026-11-22b-h200).
HEDGE_RANGE = 1.25
#: Splits the search adds for configs whose output tiles fill less than one wave of SMs.
SPLIT_K_SEARCH = (2, 3, 4, 6, 8)


class MatmulTemplate:
    """A GEMM problem; ``.with_arch(arch)`` binds a GPU and enables ranking."""

    def __init__(self, M: int, N: int, K: int, in_dtype: str = "float16", out_dtype: str | None = None,
                 accum_dtype: str = "float32", trans_A: bool = False, trans_B: bool = True,
                 arch: GPUArch | str | None = None, constants: ModelConstants | None = None) -> None:
        self.problem = MatmulProblem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B)
        self.arch: GPUArch | None = None if arch is None else CUDA(arch)
        if self.arch is not None:
            check_device_bytes(self.problem.operand_bytes, f"the GEMM {self.problem.describe()}", self.arch)
        self._constants = constants
        self._hints: list[Hint] | None = None

    def __repr__(self) -> str:
        where = self.arch.name if self.arch else "no arch"
        return f"MatmulTemplate({self.problem.describe()}, {where})"

    # ------------------------------------------------------------------ binding
    def with_arch(self, arch: GPUArch | str) -> MatmulTemplate:
        """A copy of this template bound to ``arch`` (a GPUArch or a name for :func:`carver.arch.CUDA`)."""
        p = self.problem
        return MatmulTemplate(p.M, p.N, p.K, p.in_dtype, p.out_dtype, p.accum_dtype, p.trans_A, p.trans_B,
                              arch=CUDA(arch), constants=self._constants)

    def _need_arch(self) -> GPUArch:
        if self.arch is None:
            raise RuntimeError("this MatmulTemplate has no GPU; call .with_arch(CUDA('H100')) (or another "
                               "name, or 'cuda' for the local device) first")
        return self.arch

    @property
    def constants(self) -> ModelConstants:
        return self._constants or constants_for(self._need_arch())

    def equivalent_function(self) -> Any:
        """The GEMM as an unscheduled TVM ``PrimFunc`` (``C = A @ B`` in ``accum_dtype``, cast to
        ``out_dtype``, with this problem's layouts), as TileLang's carver templates return it. Imports
        tilelang on first use; the carver's ranking never needs it."""
        import tilelang  # noqa: F401  (tvm is importable only after tilelang)
        from tvm import te

        p = self.problem
        A = te.placeholder((p.K, p.M) if p.trans_A else (p.M, p.K), name="A", dtype=p.in_dtype)
        B = te.placeholder((p.N, p.K) if p.trans_B else (p.K, p.N), name="B", dtype=p.in_dtype)
        k = te.reduce_axis((0, p.K), name="k")

        def mac(i: Any, j: Any) -> Any:
            a = A[k, i] if p.trans_A else A[i, k]
            b = B[j, k] if p.trans_B else B[k, j]
            return te.sum(a.astype(p.accum_dtype) * b.astype(p.accum_dtype), axis=k)

        acc = te.compute((p.M, p.N), mac, name="C_accum")
        C = te.compute((p.M, p.N), lambda i, j: acc[i, j].astype(p.out_dtype), name="C")
        return te.create_prim_func([A, B, C])

    # ------------------------------------------------------------------ validity
    def validate(self, config: Mapping[str, Any]) -> list[str]:
        """Why ``config`` cannot compile or launch here ([] when legal). Delegates to
        :func:`carver.validity.check_matmul_config`, the one validity function."""
        return check_matmul_config(self.problem, config, self._need_arch())

    # ------------------------------------------------------------------ model
    def _terms(self, cfgs: ConfigArrays) -> tuple[Lowering, Terms]:
        arch = self._need_arch()
        lw = lower(self.problem, arch, cfgs)
        return lw, predict_arrays(self.problem, arch, lw, self.constants)

    def _prediction(self, lw: Lowering, t: Terms, i: int, errors: tuple[str, ...] = ()) -> Prediction:
        ms = float(t.latency_us[i]) / 1e3
        return Prediction(
            config=lw.cfg.config(i), latency_ms=ms, compute_ms=float(t.compute_us[i]) / 1e3,
            memory_ms=float(t.memory_us[i]) / 1e3, pipeline_ms=float(t.pipeline_us[i]) / 1e3,
            epilogue_ms=float(t.epilogue_us[i]) / 1e3, iteration_us=float(t.iteration_us[i]),
            waves=float(t.waves[i]), wave_efficiency=float(t.wave_efficiency[i]),
            occupancy=int(t.occupancy[i]), bound=str(t.bound[i]),
            tflops=self.problem.flops / (ms * 1e-3) / 1e12,
            instruction="wgmma" if lw.wgmma[i] else "mma.sync", warp_specialized=bool(lw.warp_specialized[i]),
            smem_bytes=int(lw.smem_bytes[i]), acc_regs=float(lw.acc_regs[i]), errors=errors)

    def predict(self, config: Mapping[str, Any]) -> Prediction:
        """Predicted latency of one config and its terms. An illegal config still gets numbers (with
        ``.errors`` set); a config whose keys or types are wrong raises ValueError."""
        cfg, problems = normalize_config(config)
        if cfg is None:
            raise ValueError("; ".join(problems))
        lw, t = self._terms(ConfigArrays.from_configs([cfg]))
        errors = tuple(check_matmul_config(self.problem, cfg, self.arch))
        return self._prediction(lw, t, 0, errors)

    def rank(self, configs: Iterable[Mapping[str, Any]]) -> Ranking:
        """Order ``configs`` by predicted latency, best first; illegal ones are dropped with reasons."""
        configs = list(configs)
        good: list[dict] = []
        dropped: list[DroppedConfig] = []
        for c in configs:
            reasons = self.validate(c)
            if reasons:
                dropped.append(DroppedConfig(c, tuple(reasons)))
            else:
                good.append(normalize_config(c)[0])
        if not good:
            return Ranking((), tuple(dropped))
        lw, t = self._terms(ConfigArrays.from_configs(good))
        _check_latencies(t.latency_us, self.problem)
        order = sorted(range(len(good)), key=lambda i: (float(t.latency_us[i]), i))
        ranked = tuple(RankedConfig(_public(good[i]), self._prediction(lw, t, i))
                       for i in order)
        return Ranking(ranked, tuple(dropped))

    # ------------------------------------------------------------------ search
    def search_space(self) -> ConfigArrays:
        """Every candidate the search considers (legal or not), as arrays."""
        arch = self._need_arch()
        p = self.problem
        hopper = arch.has_wgmma
        blocks_m = [64, 128, 192, 256] if hopper else [32, 64, 128, 256]
        if p.M < 64:
            blocks_m = [16, 32] + blocks_m
        blocks_n = [16, 32, 64, 96, 128, 160, 192, 224, 256] if hopper else [32, 64, 128, 256]
        blocks_k = sorted({b // p.in_bytes for b in (64, 128, 256)})
        stages = list(range(0, 9)) if hopper else list(range(1, 6))
        threads = [128, 256, 384] if hopper else [64, 128, 256]
        grid = np.array(list(itertools.product(blocks_m, blocks_n, blocks_k, stages, threads, (1, 0))),
                        dtype=np.int64)
        # Split-K where a config's output tiles fill less than one wave: the splits that keep the grid
        # within two waves (few-row shapes such as 128x4096x14336, where 64x128 tiles give 64 CTAs).
        tiles = -(-p.M // grid[:, 0]) * -(-p.N // grid[:, 1])
        rows = [np.column_stack([grid, np.ones(len(grid), dtype=np.int64)])]
        for s in SPLIT_K_SEARCH:
            under = grid[(tiles < arch.sm_count) & (tiles * s <= 2 * arch.sm_count)]
            rows.append(np.column_stack([under, np.full(len(under), s, dtype=np.int64)]))
        grid = np.concatenate(rows)
        return ConfigArrays(grid[:, 0], grid[:, 1], grid[:, 2], grid[:, 3], grid[:, 4], grid[:, 5],
                            np.full(len(grid), 10, dtype=np.int64), grid[:, 6])

    def _calibrated(self, cfgs: ConfigArrays) -> np.ndarray:
        k_bytes = cfgs.block_K * self.problem.in_bytes
        return (np.isin(cfgs.block_M, _CALIBRATED["block"]) & np.isin(cfgs.block_N, _CALIBRATED["block"])
                & np.isin(k_bytes, _CALIBRATED["k_bytes"]) & np.isin(cfgs.num_stages, _CALIBRATED["stages"])
                & np.isin(cfgs.thread_num, _CALIBRATED["threads"]) & (cfgs.split_k == 1))

    def recommend_hints(self, topk: int = 8) -> list[Hint]:
        """The ``topk`` best legal configs by predicted latency, best first (deterministic).

        Configs outside the region the constants were calibrated on (TileLang's 288-config grid) must be
        predicted :data:`EXTRAPOLATION_MARGIN` faster to rank above a calibrated one, every prefix of the
        list holds at most half (rounded up) of them while the next calibrated config is predicted within
        :data:`HEDGE_RANGE` of the best, and an extrapolated hint must bring a new tile
        shape (or be >1% better than the same tile already chosen). Rasterization on/off twins that the
        model cannot tell apart count once. ``recommend_hints(k)`` is a prefix of ``recommend_hints(k+1)``.
        """
        topk = positive_int(topk, "topk")
        if self._hints is not None and len(self._hints) >= topk:
            return list(self._hints[:topk])
        arch = self._need_arch()
        if not arch.supports(self.problem.in_dtype):
            raise ValueError(f"in_dtype={self.problem.in_dtype!r} has no tensor-core path on {arch.name} "
                             f"(supported: {[d for d, _ in arch.tensor_peak]}); use one of those or another GPU")
        space = self.search_space()
        lw_all = lower(self.problem, arch, space)
        keep = np.flatnonzero(legal_mask(self.problem, arch, lw_all))
        if keep.size == 0:
            raise ValueError(explain_no_legal_config(self.problem, arch, lw_all))
        cfgs = ConfigArrays(*(getattr(space, f)[keep] for f in ConfigArrays.__dataclass_fields__))
        lw, t = self._terms(cfgs)
        _check_latencies(t.latency_us, self.problem)
        lat = np.round(t.latency_us, 6)
        outside = ~self._calibrated(cfgs)
        # Order by predicted latency, but an extrapolated config must be predicted EXTRAPOLATION_MARGIN
        # faster to go ahead of a calibrated one: the model's error is larger where it was not fit.
        key = np.round(lat * np.where(outside, 1.0 + EXTRAPOLATION_MARGIN, 1.0), 6)
        order = np.lexsort((cfgs.enable_rasterization * -1, cfgs.thread_num, cfgs.num_stages, cfgs.block_K,
                            cfgs.block_N, cfgs.block_M, key))
        chosen = self._select(cfgs, lat, outside, [int(i) for i in order], topk)
        hints = [self._hint(lw, t, i) for i in chosen]
        self._hints = hints
        return list(hints)

    @staticmethod
    def _select(cfgs: ConfigArrays, lat: np.ndarray, outside: np.ndarray, order: list[int],
                topk: int) -> list[int]:
        """Merge the calibrated and the extrapolated candidates (each in ``order``) so that every prefix
        of the hint list holds at most half (rounded up) extrapolated configs while the next calibrated one
        is predicted within ``HEDGE_RANGE`` of the best; the list is therefore the
        same whatever ``topk`` is. Rasterization twins the model cannot tell apart count once, and an
        extrapolated pick must bring a new tile shape or be >1% better than that tile's pick so far."""
        inside = [i for i in order if not outside[i]]
        beyond = [i for i in order if outside[i]]
        rank = {i: r for r, i in enumerate(order)}
        # A calibrated config predicted far slower than the best is no hedge: the model's error is
        # smaller than that gap (few-row shapes, where only split-K or deep pipelines fill the GPU).
        near = lat <= HEDGE_RANGE * lat.min()
        chosen: list[int] = []
        seen: dict[tuple, float] = {}   # config less rasterization -> predicted latency
        tiles: dict[tuple, float] = {}  # (block_M, block_N, block_K) -> best predicted latency chosen
        n_out = 0

        def tile_of(i: int) -> tuple[int, int, int]:
            return int(cfgs.block_M[i]), int(cfgs.block_N[i]), int(cfgs.block_K[i])

        def twin_key(i: int) -> tuple[int, ...]:
            return tile_of(i) + (int(cfgs.num_stages[i]), int(cfgs.thread_num[i]), int(cfgs.split_k[i]))

        def twin(i: int) -> bool:
            k = twin_key(i)
            return k in seen and abs(seen[k] - lat[i]) <= 1e-3 * lat[i]

        while len(chosen) < topk and (inside or beyond):
            while inside and twin(inside[0]):
                inside.pop(0)
            while beyond and (twin(beyond[0]) or (tile_of(beyond[0]) in tiles
                                                  and lat[beyond[0]] >= 0.99 * tiles[tile_of(beyond[0])])):
                beyond.pop(0)
            room = n_out + 1 <= -(-(len(chosen) + 1) // 2) or not (inside and near[inside[0]])
            take_out = beyond and room and (not inside or rank[beyond[0]] < rank[inside[0]])
            if not take_out and not inside:
                break  # only extrapolated configs are left and the prefix rule forbids them here
            i = beyond.pop(0) if take_out else inside.pop(0)
            n_out += bool(take_out)
            seen[twin_key(i)] = float(lat[i])
            tiles[tile_of(i)] = min(tiles.get(tile_of(i), np.inf), float(lat[i]))
            chosen.append(i)
        return chosen

    def _hint(self, lw: Lowering, t: Terms, i: int) -> Hint:
        c = lw.cfg
        bm, bn = int(c.block_M[i]), int(c.block_N[i])
        raster = (Rasterization2DRow(int(c.panel_size[i])) if c.enable_rasterization[i] else NoRasterization())
        return Hint(block=(bm, bn), warp=(bm // int(lw.m_warp[i]), bn // int(lw.n_warp[i])),
                    rstep=(int(c.block_K[i]),), pipeline_stage=int(c.num_stages[i]),
                    threads=int(c.thread_num[i]), rasterization_plan=raster, split_k=int(c.split_k[i]),
                    prediction=self._prediction(lw, t, i))


def _check_latencies(latency_us: np.ndarray, problem: MatmulProblem) -> None:
    """A ranking by negative or infinite latencies would be silently wrong: that is a bug, not a result."""
    if latency_us.size and not bool(np.all(np.isfinite(latency_us) & (latency_us > 0))):
        raise RuntimeError(f"carver bug: the model predicted a non-positive or non-finite latency for "
                           f"{problem.describe()} ({latency_us.min()} us); please report it with the shape")


def _public(cfg: dict) -> dict:
    """A normalised config without the optional keys that are at their defaults."""
    out = {k: v for k, v in cfg.items() if k not in ("panel_size", "split_k")}
    if cfg.get("panel_size", 10) != 10:
        out["panel_size"] = cfg["panel_size"]
    if cfg.get("split_k", 1) != 1:
        out["split_k"] = cfg["split_k"]
    return out
