"""The GEMV family's configs: the exhaustive grid, the carver's ranked candidates, the validity check.

All three come from the carver's GEMV model (``carver.templates.GEMVTemplate``), which takes the same
keys and rules as this kernel's two programs (STYLE.md 4; the mma path's are the matmul rules): the
grid is ``carver.templates.gemv_space``, the check is the model's ``validate``, and the candidates are
its ranking of that grid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from carver.problem import positive_int
from carver.templates import GEMVTemplate, gemv_space

from .config import GemvConfig, GemvProblem

if TYPE_CHECKING:
    from carver.arch import GPUArch

__all__ = ["candidates", "carver_template", "check", "require", "space"]

#: The rules are checked against this GPU when no arch is named: warps of 32, at most 1024 threads, and
#: for the mma path shared memory (H100's 227 KB per block, the most any GPU gives; others are stricter).
_STAND_IN = "H100"
#: At most this many of the top-k share a path and block_N: the model hedges over the rows-per-CTA
#: choice rather than trusting one.
_PER_BLOCK_N = 2
#: cp.async configs (``tma=False``) appended to the top-k on a GPU with TMA (see :func:`candidates`).
_ASYNC_VARIANTS = 2
#: The deepest cp.async pipeline (``num_stages * block_K`` columns in flight) a variant may have, as a
#: fraction of K. The model prefers deep pipelines; measured at K = 4096 (32 MB weight, M = 4 and 16, H100
#: and H200, streamed) the configs 1024 columns deep were the fastest and those 2048 deep 3-40% slower
#: (`benchmarks/data/gemv-bandwidth-all-2026-11-23-h100`, `gemv-fixed-cost-2026-11-23-h200/e`).
_ASYNC_MAX_DEPTH = 0.25
# _ASYNC_NARROW_TWIN: the first cp.async variant is joined by its twin of the same block_N and depth with a
# narrower K step (more, smaller stages), the model's best such. The model ranks the two alike or the wider
# step first; measured at K = 4096 (32 MB weight, M = 4 and 16, streamed) 32x128 with 8 stages was the
# fastest cp.async config on the H100 (0.905-0.909 of a copy, against 0.900-0.901 for 32x256 with 4) and
# on the H200 (0.837-0.849 against 0.829-0.839): `gemv-bandwidth-all-2026-11-23-h100`,
# `gemv-fixed-cost-2026-11-23-h200/e`. So both are measured.
#: At least topk // this of the top-k come from each path (half) while the mma path's constants are the GEMM
#: calibration's (no GEMV grid of that path measured yet): the measurement decides between them.
_PATH_SHARE = 2


def carver_template(problem: GemvProblem, arch: Any = "cuda", vec: int = 0) -> GEMVTemplate:
    """The carver's GEMV model of this problem on ``arch`` (a name, "cuda" for the local GPU, or an
    arch object): ``.recommend_hints(k)``, ``.rank(configs)``, ``.validate(config)``, ``.predict(config)``."""
    from carver.arch import CUDA
    from carver.templates import gemv_vec

    vec = vec or gemv_vec(problem.K, problem.dtype)  # the width the kernel loads
    return GEMVTemplate(problem.N, problem.K, problem.dtype, problem.out_dtype, M=problem.M, vec=vec,
                        arch=CUDA(arch) if isinstance(arch, str) else arch)


def space(problem: GemvProblem) -> list[GemvConfig]:
    """The exhaustive grid, widest vectors: 72 SIMT configs (rows per CTA x threads per row x loads in
    flight), then up to 40 mma configs (block_N x block_K x stages x split, those shared memory holds),
    then up to 11 mma configs of the cp.async program (``tma=False``; 64x256 with 8 stages never fits)."""
    return [GemvConfig(**c) for c in gemv_space(problem.K, problem.dtype)]


def check(problem: GemvProblem, config: GemvConfig, arch: GPUArch | None = None) -> list[str]:
    """Why ``config`` cannot run for ``problem`` (empty: legal): the carver's GEMV rules, on ``arch``."""
    if config.path == "mma" and config.vec:
        return [f"vec is a key of the simt path, got vec={config.vec} with path='mma' (its loads are whole tiles); "
                f"leave vec out"]
    try:
        tmpl = carver_template(problem, arch if arch is not None else _STAND_IN, vec=config.vec)
    except ValueError as e:  # a vec this K cannot load
        return [str(e)]
    return tmpl.validate(config.carver_dict())


def require(problem: GemvProblem, config: GemvConfig) -> None:
    problems = check(problem, config)
    if problems:
        raise ValueError("; ".join(problems))


def candidates(problem: GemvProblem, arch: GPUArch | None, topk: int, variants: bool = True) -> list[GemvConfig]:
    """The carver's ranking of :func:`space` less its cp.async configs for ``arch``, best first: the
    model's top-1 first, at most two per path and ``block_N``, and at least ``topk // 2`` of each path,
    until the grid runs out of others. Then, with ``variants`` on a GPU with TMA, the model's best
    :data:`_ASYNC_VARIANTS` cp.async configs (``tma=False``, one per ``block_N``, at most a quarter of K
    in flight where any is: :data:`_ASYNC_MAX_DEPTH`) and the first one's twin with a narrower K step at
    the same depth, where the grid has one (``_ASYNC_NARROW_TWIN``), as the matmul family
    appends its Hopper variants. They beat the TMA program's same tiles in most side-by-side comparisons
    measured so far (32 and 117 MB weights, M = 1, 4 and 16; by up to 9 us with 16- and 32-column tiles,
    within 0.9 us either way with 64-column ones at 32 MB), but the model predicts the two programs alike
    and no grid of them exists beyond 32 MB, so they join the tuner's candidates without displacing the
    hints the stored grids score."""
    if arch is None:
        raise ValueError("the gemv template ranks configs for a GPU; pass arch, e.g. carver.arch.CUDA('H100')")
    topk = positive_int(topk, "topk")  # the matmul family's check: 0, -1, True and 2.5 are refused
    tmpl = carver_template(problem, arch)
    grid = [c.carver_dict() for c in space(problem)]
    ranked_all = [GemvConfig(**c) for c in tmpl.rank(grid).configs]
    ranked = [c for c in ranked_all if c.tma]
    asyncs = [c for c in ranked_all if not c.tma] if variants and tmpl.arch.has_tma else []
    asyncs = [c for c in asyncs if c.num_stages * c.block_K <= problem.K * _ASYNC_MAX_DEPTH] or asyncs
    extra: list[GemvConfig] = []
    for c in asyncs:
        if len(extra) < _ASYNC_VARIANTS and all(e.block_N != c.block_N for e in extra):
            extra.append(c)
    if extra:  # the first variant's narrower K step at the same depth (see _ASYNC_NARROW_TWIN)
        first = extra[0]
        extra += [c for c in asyncs if c.block_N == first.block_N and c.block_K < first.block_K
                  and c.block_K * c.num_stages == first.block_K * first.num_stages][:1]
    return _top_k(ranked, topk) + extra


def _top_k(ranked: list[GemvConfig], topk: int) -> list[GemvConfig]:
    """The first ``topk`` of ``ranked`` under the per-path and per-``block_N`` rules of :func:`candidates`."""
    share = {p: min(topk // _PATH_SHARE, sum(c.path == p for c in ranked)) for p in ("simt", "mma")}
    picked: list[GemvConfig] = []
    seen: dict[tuple[str, int], int] = {}
    for c in ranked:
        if len(picked) == topk:
            break
        other = "mma" if c.path == "simt" else "simt"
        room = topk - len(picked) - max(0, share[other] - sum(p.path == other for p in picked))
        if seen.get((c.path, c.block_N), 0) < _PER_BLOCK_N and room > 0:
            picked.append(c)
            seen[(c.path, c.block_N)] = seen.get((c.path, c.block_N), 0) + 1
    rest = [c for c in ranked if c not in picked]
    return picked + rest[: topk - len(picked)]
