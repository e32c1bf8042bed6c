"""The attention family's configs: the exhaustive grid, the carver's ranked candidates, the check.

All three come from the carver's attention model (``carver.attention``), which takes the same keys and
rules as this kernel (STYLE.md 4): the grid is ``carver.attention.attention_space`` less what no GPU
runs, the check is ``check_attention_config``, and the candidates are the model's ranking of the grid.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from carver.arch import CUDA
from carver.attention import (
    ATTENTION_GRID,
    AttentionTemplate,
    attention_space,
    attention_ws_space,
    check_attention_config,
    tile_positions,
    tile_steps,
)
from carver.problem import positive_int

from .config import AttentionConfig, AttentionProblem

if TYPE_CHECKING:
    from carver.arch import GPUArch

__all__ = ["PACK_MIN_SAVING", "PER_BLOCK", "WS_TOP", "candidates", "carver_template", "check", "require", "saves_work",
           "space", "tiles", "ws_ranked", "ws_space", "ws_top"]

#: At most this many of the top-k share a (block_M, block_N): every stage variant of a tile shape (the
#: calibrated model orders them by margins of ~1%, a near tie that tuning settles), and the rest of the
#: top-8 on the runner-up shapes, not on the thread variants of the same tile.
PER_BLOCK = len(ATTENTION_GRID["num_stages"])
#: How many of the ws variant's configs (the model's best) candidates() adds on a GPU that runs them.
WS_TOP = 3


def carver_template(problem: AttentionProblem, arch: Any = "cuda") -> AttentionTemplate:
    """The carver's attention model of this problem on ``arch`` (a name, "cuda" for the local GPU, or an
    arch object): ``.recommend_hints(k)``, ``.rank(configs)``, ``.validate(config)``, ``.predict(config)``."""
    return AttentionTemplate(problem).with_arch(arch)


def space(problem: AttentionProblem) -> list[AttentionConfig]:
    """The exhaustive grid (block_M x block_N x num_stages x threads) less the configs no GPU can run (a
    warp without 16 rows); a GPU's rules are ``check``'s."""
    return [AttentionConfig(**c) for c in attention_space() if not check_attention_config(problem, c)]


def ws_space(problem: AttentionProblem, arch: GPUArch | None = None) -> list[AttentionConfig]:
    """The hand-scheduled Hopper loop's grid (``variant="ws"``) less what no GPU can run. Not part of
    :func:`space`, the T.Pipelined grid the model's constants are fitted on; ``candidates`` adds its best.
    With GQA, each config's ``pack_gqa`` twin (a tile of every query head of a KV head) where the rules take it and
    it spares enough key steps (:func:`saves_work`).
    With an ``arch`` and more tiles than it has SMs, each config's persistent twin too (``persistent`` = the
    SM count: one resident CTA per SM walks the tiles)."""
    grid = [AttentionConfig(**c) for c in attention_ws_space() if not check_attention_config(problem, c)]
    if problem.groups > 1:
        packed = (dataclasses.replace(c, pack_gqa=True) for c in grid if saves_work(problem, c))
        grid += [c for c in packed if not check(problem, c)]
    if arch is None:
        return grid
    sms = CUDA(arch).sm_count  # a GPU name ("H100") or a GPUArch
    return grid + [dataclasses.replace(c, persistent=sms) for c in grid if tiles(problem, c) > sms]


#: The share of a config's key steps ``pack_gqa`` must spare for :func:`ws_space` to add its packed twin.
PACK_MIN_SAVING = 0.05


def saves_work(problem: AttentionProblem, config: AttentionConfig) -> bool:
    """Whether ``pack_gqa`` spares ``config`` at least :data:`PACK_MIN_SAVING` of its key steps
    (:func:`carver.attention.tile_steps`): a tile past seq_len or past the causal diagonal covers ``groups`` times
    fewer positions packed. Where it leaves the steps as they are, the packed form only adds TMA boxes: measured
    alike at d64 (8 x 1k: 0.172 against 0.172 ms, causal 0.114 against 0.115) and 6% slower at d128 (8 x 1k causal,
    128 x 128: 0.161 against 0.152 ms); sparing 7% of the steps it was 3% faster at d128 (128 x 160, 8 x 1k causal)
    and 10% at d64 (128 x 176; H200, benchmarks/data/attention-packgqa-2026-12-02-h200). The model prices the steps
    alone, so a twin sparing less than that is left out of the space."""
    packed, unpacked = (dataclasses.replace(config, pack_gqa=p).kernel_kwargs() for p in (True, False))
    return tile_steps(problem, packed) <= (1 - PACK_MIN_SAVING) * tile_steps(problem, unpacked)


def tiles(problem: AttentionProblem, config: AttentionConfig) -> int:
    """The kernel's (query block, head, batch) tiles: its CTAs, or what its persistent CTAs walk (``pack_gqa``: a
    tile's head is a KV head, its query block ``block_M / groups`` positions of each of its query heads)."""
    positions, heads = tile_positions(problem, config.kernel_kwargs())
    return problem.batch * heads * -(-problem.seq_len // positions)


def check(problem: AttentionProblem, config: AttentionConfig, arch: GPUArch | None = None) -> list[str]:
    """Why ``config`` cannot run for ``problem`` (empty: legal): the carver's attention rules, on ``arch``."""
    return check_attention_config(problem, config.kernel_kwargs(), None if arch is None else CUDA(arch))


def require(problem: AttentionProblem, config: AttentionConfig) -> None:
    problems = check(problem, config)
    if problems:
        raise ValueError("; ".join(problems))


def candidates(problem: AttentionProblem, arch: GPUArch | None, topk: int,
               variants: bool = True) -> list[AttentionConfig]:
    """The carver's ranking of :func:`space` for ``arch``, best first, at most :data:`PER_BLOCK` per tile
    shape until the grid runs out of others (the first is the model's top-1); with ``variants``, then the
    :data:`WS_TOP` best configs of :func:`ws_space` that ``arch`` runs (Hopper), in the model's order, so
    tuning measures the hand-scheduled loop beside the T.Pipelined one and keeps the faster."""
    if arch is None:
        raise ValueError("the attention template ranks configs for a GPU; pass arch, e.g. carver.arch.CUDA('H100')")
    topk = positive_int(topk, "topk")  # the matmul family's check: 0, -1, True and 2.5 are refused
    tmpl = carver_template(problem, arch)
    arch = tmpl.arch  # a GPU name ("H100") resolved by carver.arch.CUDA
    ranked = [AttentionConfig(**c) for c in tmpl.rank(c.kernel_kwargs() for c in space(problem)).configs]
    picked: list[AttentionConfig] = []
    seen: dict[tuple[int, int], int] = {}
    for c in ranked:
        shape = (c.block_M, c.block_N)
        if seen.get(shape, 0) < PER_BLOCK:
            picked.append(c)
            seen[shape] = seen.get(shape, 0) + 1
        if len(picked) == topk:
            break
    picked += [c for c in ranked if c not in picked][: topk - len(picked)]
    if variants:
        picked += ws_top(ws_ranked(problem, arch))
    return picked


def ws_top(ranked: list[AttentionConfig]) -> list[AttentionConfig]:
    """The :data:`WS_TOP` ws configs :func:`candidates` adds, from :func:`ws_ranked`'s order: the model's best, but
    where they are all ``pack_gqa`` twins the last slot goes to the best unpacked config (the model prices packing
    by the steps it saves alone, and on shapes measured before it the unpacked configs are what was measured)."""
    top = ranked[:WS_TOP]
    unpacked = [c for c in ranked if not c.pack_gqa]
    if top and all(c.pack_gqa for c in top) and unpacked:
        top = top[:-1] + unpacked[:1]
    return top


def ws_ranked(problem: AttentionProblem, arch: GPUArch | str) -> list[AttentionConfig]:
    """Every config of :func:`ws_space` that ``arch`` runs, in the model's order (the first :data:`WS_TOP` are
    what :func:`candidates` adds)."""
    tmpl = carver_template(problem, arch)
    return [AttentionConfig(**c) for c in tmpl.rank(c.kernel_kwargs() for c in ws_space(problem, tmpl.arch)).configs]
