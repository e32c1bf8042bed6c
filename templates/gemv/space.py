"""The GEMV family's configs: the exhaustive grid, the carver's ranked candidates, the validity check.

All three come from the carver's GEMV model (``carver.templates.GEMVTemplate``), which takes the same
keys and rules as this kernel (STYLE.md 4): the grid is ``carver.templates.gemv_space``, the check is
the model's ``validate``, and the candidates are its ranking of that grid.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from carver.templates import GEMVTemplate, gemv_space

from .config import GemvConfig, GemvProblem

if TYPE_CHECKING:
    from carver.arch import GPUArch

__all__ = ["candidates", "carver_template", "check", "require", "space"]

#: Rules no NVIDIA GPU escapes (warps of 32, at most 1024 threads) are checked against this one when no
#: arch is named; the kernel uses no shared memory, so nothing else in the rules depends on the GPU.
_STAND_IN = "H100"
#: At most this many of the top-k share a block_N: the model is not calibrated on GEMV measurements
#: yet, so the top-k hedges over the rows-per-CTA choice rather than trusting one.
_PER_BLOCK_N = 2


def carver_template(problem: GemvProblem, arch: Any = "cuda", vec: int = 0) -> GEMVTemplate:
    """The carver's GEMV model of this problem on ``arch`` (a name, "cuda" for the local GPU, or an
    arch object): ``.recommend_hints(k)``, ``.rank(configs)``, ``.validate(config)``, ``.predict(config)``."""
    from carver.arch import CUDA
    from carver.templates import gemv_vec

    vec = vec or gemv_vec(problem.K, problem.dtype)  # the width the kernel loads
    return GEMVTemplate(problem.N, problem.K, problem.dtype, problem.out_dtype, M=problem.M, vec=vec,
                        arch=CUDA(arch) if isinstance(arch, str) else arch)


def space(problem: GemvProblem) -> list[GemvConfig]:
    """The exhaustive grid (72 configs: rows per CTA x threads per row x loads in flight), widest vectors."""
    return [GemvConfig(**c) for c in gemv_space(problem.K, problem.dtype)]


def check(problem: GemvProblem, config: GemvConfig, arch: GPUArch | None = None) -> list[str]:
    """Why ``config`` cannot run for ``problem`` (empty: legal): the carver's GEMV rules, on ``arch``."""
    try:
        tmpl = carver_template(problem, arch if arch is not None else _STAND_IN, vec=config.vec)
    except ValueError as e:  # a vec this K cannot load
        return [str(e)]
    return tmpl.validate({k: getattr(config, k) for k in GEMVTemplate.keys})


def require(problem: GemvProblem, config: GemvConfig) -> None:
    problems = check(problem, config)
    if problems:
        raise ValueError("; ".join(problems))


def candidates(problem: GemvProblem, arch: GPUArch | None, topk: int, variants: bool = True) -> list[GemvConfig]:
    """The carver's ranking of :func:`space` for ``arch``, best first, at most two per ``block_N`` until
    the grid runs out of others (the first is the model's top-1). ``variants``: none for this family."""
    if arch is None:
        raise ValueError("the gemv template ranks configs for a GPU; pass arch, e.g. carver.arch.CUDA('H100')")
    grid = [{k: getattr(c, k) for k in GEMVTemplate.keys} for c in space(problem)]
    ranked = [GemvConfig(**c) for c in carver_template(problem, arch).rank(grid).configs]
    picked: list[GemvConfig] = []
    seen: dict[int, int] = {}
    for c in ranked:
        if seen.get(c.block_N, 0) < _PER_BLOCK_N:
            picked.append(c)
            seen[c.block_N] = seen.get(c.block_N, 0) + 1
        if len(picked) == topk:
            return picked
    return picked + [c for c in ranked if c not in picked][: topk - len(picked)]
