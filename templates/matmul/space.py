"""The matmul family's configs: the exhaustive baseline, the carver's ranked candidates with their
variants (split-K for few waves, the Hopper variants), and the validity check.

The typed functions (:func:`space`, :func:`candidates`, :func:`check`) take a
:class:`~carver.problem.MatmulProblem`, a :class:`~carver.arch.GPUArch` and :class:`MatmulConfig`s;
the dict-based ones (:func:`default_space`, :func:`split_k_candidates`, :func:`hopper_variants`,
:func:`validate`, :func:`carver_template`) are the older API, kept with their signatures.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from carver.arch import CUDA, GPUArch
from carver.problem import MatmulProblem, int_in_range, positive_int, shape_dim
from carver.validity import (
    C_ON_RING,
    GRID_SMEM_MARK,
    RULE_KEYS,
    WS_VARIANTS,
    check_matmul_config,
    cluster_shape,
    kernel_key_arch_problems,
    split_has_work,
    split_k_limit,
    ws_smem_bytes,
)
from carver.ws_model import WS_CONSTANTS, WSConstants, predict_pipelined_us, predict_ws_us

from .config import (
    AUTO_WS,
    CARVER_KEYS,
    EXTRA_DEFAULTS,
    IN_DTYPES,
    PASS_CONFIGS_KEY,
    MatmulConfig,
    check_dtype,
    checked_configs,
    kernel_part,
    make_problem,
    normalize_config,
    separate_c_smem_bytes,
)

__all__ = [
    "GRID",
    "candidates",
    "carver_template",
    "check",
    "default_space",
    "hint_configs",
    "row_tile_hedge",
    "hopper_variants",
    "predicted_ms",
    "hopper_variants_for",
    "pingpong_variants_for",
    "space",
    "split_k_candidates",
    "split_k_variants",
    "validate",
    "ws_variants_for",
    "subwave_cluster_variants_for",
    "cluster_split_variants_for",
]

#: TileLang's GEMM grid (its ``example_gemm_autotune``), in the measured files' order.
GRID: dict[str, list[Any]] = {
    "block_M": [64, 128, 256],
    "block_N": [64, 128, 256],
    "block_K": [32, 64],
    "num_stages": [0, 1, 2, 3],
    "thread_num": [128, 256],
    "enable_rasterization": [True, False],
}


# --------------------------------------------------------------------------------------------------
# The exhaustive baseline
# --------------------------------------------------------------------------------------------------
def default_space(M: int, N: int, K: int) -> list[dict[str, Any]]:
    """TileLang's 288-config GEMM grid (its ``example_gemm_autotune``), in the measured files' order.

    It does not depend on the shape; M, N and K are taken so every template's space has one signature.
    Some configs do not fit (e.g. 256x256 tiles with 3 stages overflow shared memory): the exhaustive
    baseline is the grid as TileLang users run it, so they stay in and fail as trials.
    """
    for value, name in ((M, "M"), (N, "N"), (K, "K")):
        shape_dim(value, name)
    return [dict(zip(GRID, values)) for values in itertools.product(*GRID.values())]


def space(problem: MatmulProblem) -> list[MatmulConfig]:
    """:func:`default_space` as configs: the protocol's exhaustive baseline."""
    return [MatmulConfig(**c) for c in default_space(problem.M, problem.N, problem.K)]


# --------------------------------------------------------------------------------------------------
# The carver and the one validity check
# --------------------------------------------------------------------------------------------------
def carver_template(
    M: int,
    N: int,
    K: int,
    in_dtype: str = "float16",
    out_dtype: str | None = None,
    accum_dtype: str = "float32",
    trans_A: bool = False,
    trans_B: bool = True,
    arch: Any = "cuda",
) -> Any:
    """The carver's model of this kernel on ``arch`` (a name such as "H100", "sm_90a", "cuda" for the
    local GPU, or an arch object): ``.recommend_hints(topk)``, ``.validate(config)``, ``.rank(configs)``."""
    from carver import MatmulTemplate

    p = make_problem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B)
    tmpl = MatmulTemplate(M=p.M, N=p.N, K=p.K, in_dtype=p.in_dtype, out_dtype=p.out_dtype,
                          accum_dtype=p.accum_dtype, trans_A=p.trans_A, trans_B=p.trans_B)
    return tmpl.with_arch(arch)  # a name goes through carver.arch.CUDA there


def _carver_for(problem: MatmulProblem, arch: Any) -> Any:
    return carver_template(problem.M, problem.N, problem.K, problem.in_dtype, problem.out_dtype,
                           problem.accum_dtype, problem.trans_A, problem.trans_B, arch=arch)


def predicted_ms(problem: MatmulProblem, arch: Any, config: MatmulConfig) -> float:
    """The carver's latency (ms) for ``config`` on ``problem``: its tile, stages, threads, rasterization and
    split (:meth:`MatmulConfig.carver_dict`; the warp split and the Hopper variants are priced as the grid
    program of the same tile)."""
    return float(_carver_for(problem, arch).predict(config.carver_dict()).latency_ms)


def validate(tmpl: Any, K: int, in_dtype: str, config: Mapping[str, Any]) -> list[str]:
    """Why ``config`` cannot run (empty: legal): the carver's rules no GPU escapes, with the kernel's own
    keys, then the carver template's rules for its GPU and the kernel keys' rules there (the ws variant), then
    the separate C tile's shared memory.

    The carver's validity is the one validity function (STYLE.md 4); this returns problems instead of
    raising, so the autotuner can drop a candidate before it reaches nvcc and say why. The carver models
    the grid's program: ``warp_policy`` and ``persistent`` change neither its registers nor its tile, so
    the carver template judges the config without them.
    """
    try:
        cfg = normalize_config(config)
    except (ValueError, TypeError) as e:
        return [str(e)]
    problem = getattr(tmpl, "problem", None)
    if isinstance(problem, MatmulProblem):
        problem = dataclasses.replace(problem, K=K, in_dtype=in_dtype)
    else:  # a stand-in carver template: the rules that need only K and the dtype (M = N = 1)
        problem = MatmulProblem(1, 1, K, in_dtype)
    problems = check_matmul_config(problem, kernel_part(cfg), kernel_keys=True, arch_stand_ins=False)
    problems += _pass_config_problems(cfg)
    if problems:
        return problems
    full = {**EXTRA_DEFAULTS, **cfg}
    problems = list(tmpl.validate({k: v for k, v in cfg.items() if k in CARVER_KEYS or k in RULE_KEYS}))
    arch = getattr(tmpl, "arch", None)
    if isinstance(arch, GPUArch):  # the ws variants' own rules on this GPU (their C tiles, Hopper only)
        ws = kernel_key_arch_problems(problem, arch, {k: v for k, v in full.items() if k != PASS_CONFIGS_KEY},
                                      c_on_ring=_c_on_ring(cfg))
        # the ws loop's and the cluster sum's shared memory are their own rules' to count, and to fix
        if ws and (full["variant"] in WS_VARIANTS or full["split_reduce"] == "cluster"):
            problems = [m for m in problems if GRID_SMEM_MARK not in m]
        problems += ws
    separate_c = "" if full["variant"] in WS_VARIANTS else "persistent" if full["persistent"] else (
        "role-based warp-specialised" if (cfg.get(PASS_CONFIGS_KEY) or {}).get(AUTO_WS) else "")
    if separate_c:
        need = separate_c_smem_bytes(full, problem.in_dtype, problem.out_dtype)
        limit = getattr(getattr(tmpl, "arch", None), "smem_per_block", None)
        if limit is not None and need > limit:
            problems.append(
                f"{separate_c} {cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} with num_stages="
                f"{cfg['num_stages']} needs {need} bytes of shared memory (its C tile does not reuse the A/B "
                f"stages), over the {limit} per block; use fewer stages")
    return problems


def _c_on_ring(cfg: Mapping[str, Any]) -> bool:
    return bool((cfg.get(PASS_CONFIGS_KEY) or {}).get(C_ON_RING))


def _pass_config_problems(cfg: Mapping[str, Any]) -> list[str]:
    """The rules on a config's own pass configs: C's tile may share the ring only where nothing loads into
    the ring while C is written (:data:`carver.validity.C_ON_RING`)."""
    if _c_on_ring(cfg) and cfg.get("persistent"):
        return [f"pass_configs {C_ON_RING!r} lets C's staging tile share the ring of A/B stages, which the "
                f"persistent kernel (persistent={cfg['persistent']}) fills with the next tile while it stores "
                f"this one: a race; leave the pass config out or use persistent=0"]
    return []


def check(problem: MatmulProblem, config: MatmulConfig, arch: GPUArch | None = None) -> list[str]:
    """Why ``config`` cannot run for ``problem`` (empty: legal), from the carver's rule table: on ``arch``
    with its own limits (:func:`validate`), or, with no arch, the rules no GPU escapes."""
    if arch is None:
        return (check_matmul_config(problem, config.kernel_kwargs(), kernel_keys=True)
                + _pass_config_problems(config.to_dict()))
    return validate(_carver_for(problem, arch), problem.K, problem.in_dtype, config.to_dict())


def hint_configs(tmpl: Any, topk: int) -> list[dict[str, Any]]:
    """The carver template's top ``topk`` hints as normalised config dicts, without duplicates."""
    configs: list[dict[str, Any]] = []
    for hint in tmpl.recommend_hints(topk=topk):
        cfg = normalize_config(hint.to_config())
        if cfg not in configs:
            configs.append(cfg)
    return configs


# --------------------------------------------------------------------------------------------------
# Variants of the carver's hints
# --------------------------------------------------------------------------------------------------
def _tiles(problem: MatmulProblem, cfg: MatmulConfig) -> int:
    return math.ceil(problem.M / cfg.block_M) * math.ceil(problem.N / cfg.block_N)


def split_k_variants(problem: MatmulProblem, configs: Sequence[MatmulConfig], num_sms: int, per_config: int = 3,
                     top: int = 2) -> list[MatmulConfig]:
    """Split-K variants of the top configs when their output tiles fill less than one wave of SMs.

    With M=64, N=4096 and 64x128 tiles there are 32 tiles for 132 SMs: three quarters of the GPU idles
    whatever the tile. Splitting K over ``s`` CTAs per tile fills it; candidates are ``s`` near
    ``SMs / tiles`` and its neighbours, so the autotuner (not a guess) picks one.
    """
    out: list[MatmulConfig] = []
    for cfg in configs[:top]:
        tiles = _tiles(problem, cfg)
        if cfg.split_k != 1 or tiles >= num_sms:
            continue
        fill = max(2, num_sms // tiles)
        limit = min(split_k_limit(problem.K, cfg.block_K), 16)
        for s in sorted({s for s in (fill // 2, fill, 2 * fill)
                         if 2 <= s <= limit and split_has_work(problem.K, cfg.block_K, s)})[:per_config]:
            candidate = dataclasses.replace(cfg, split_k=s)
            if candidate not in out and candidate not in configs:
                out.append(candidate)
    return out


def hopper_variants_for(problem: MatmulProblem, configs: Sequence[MatmulConfig], num_sms: int, smem_per_block: int,
                        top: int = 3, persistent_max_k_iters: int = 16) -> list[MatmulConfig]:
    """What the grid cannot express, tried on the top ``top`` configs: the other warp split and the
    persistent kernel.

    * ``warp_policy="full_row"`` when a block has several consumer warpgroups and rows enough for each to
      take whole rows: one wgmma as wide as the block per 64 rows, where TileLang's "square" split gives
      each warpgroup a share of the *columns* (128x256: two m64n128; 128x128 and 256x128: m64n64), which
      reads A again for every column share. Measured side by side (H200 and H100, 2026-11-23,
      ``benchmarks/warp_split.py``, ``benchmarks/data/warp-split-2026-11-23-*``), full_row over square:
      0.97-1.17x (median 1.01) for 128x128 and 256x128 tiles, 0.96-1.04x (median 0.99-1.02) for 128x256;
      the ws loop 1.04-1.12x on 128x128 and 256x128. The tuner measures both.
    * ``persistent=num_sms`` when there is more than one wave of tiles and K is short (at most
      ``persistent_max_k_iters`` K tiles): resident CTAs walk the tiles, and the producer loads the next
      tile while the consumers store this one. Stages are cut until the C tile fits beside them, but not
      below 3. On an H200 (2026-11-21, ``benchmarks/gemm_variants.py``, data in
      ``benchmarks/data/gemm-variants-2026-11-21``) it made 8192x8192x512 1.09x faster and every shape
      with K >= 4096 0.93-0.97x slower, hence the K limit; with 2 stages the 192x256 and 256x192
      persistent kernels ran 3.4-4.9x slower than the same tiles unpersisted, hence the stage floor.

    The carver does not model either (it ranks the grid's program); the autotuner measures them.
    """
    def smem(c: MatmulConfig) -> int:
        return separate_c_smem_bytes(c.kernel_kwargs(), problem.in_dtype, problem.out_dtype)

    out: list[MatmulConfig] = []
    for cfg in configs[:top]:
        if (cfg.split_k, cfg.warp_policy, cfg.persistent) != (1, "square", 0):
            continue
        groups = cfg.thread_num // 128 if cfg.thread_num % 128 == 0 else 0
        policies = ["square"]
        if groups > 1 and cfg.block_M % (groups * 64) == 0:
            policies.append("full_row")
        for policy in policies:
            base = cfg if policy == "square" else dataclasses.replace(cfg, warp_policy=policy)
            wanted = [] if policy == "square" else [base]
            if _tiles(problem, cfg) > num_sms and math.ceil(problem.K / cfg.block_K) <= persistent_max_k_iters:
                pers = dataclasses.replace(base, persistent=num_sms)
                while pers.num_stages > 3 and smem(pers) > smem_per_block:
                    pers = dataclasses.replace(pers, num_stages=pers.num_stages - 1)
                if pers.num_stages >= 3 and smem(pers) <= smem_per_block:
                    wanted.append(pers)
            out += [c for c in wanted if c not in out and c not in configs]
    return out


def ws_variants_for(problem: MatmulProblem, configs: Sequence[MatmulConfig], arch: GPUArch, top: int = 3,
                    ws: WSConstants | None = None) -> list[MatmulConfig]:
    """The hand-scheduled Hopper loop (``variant="ws"``) of the top ``top`` configs, where the carver's ws
    term (:mod:`carver.ws_model`) predicts it ``min_gain`` faster than the config itself; and the cluster
    (multicast of the larger operand tile) and persistent forms where each is predicted ``min_gain``
    faster than the config and no slower than the plain ws form; and the plain form with one stage more
    (the batch in flight holds one), C's staging tile on the ring (:data:`carver.validity.C_ON_RING`)
    where it does not fit beside it, under the same condition. Each keeps its base's tile; the plain
    form's stages are cut until C's staging tile fits beside the ring (not below 2); blocks with two
    consumer warpgroups take ``warp_policy="full_row"`` where their rows allow (one wgmma as wide as the
    tile per 64 rows; the square split measured 4-12% slower in this loop, ``benchmarks/warp_split.py``).
    Ordered by the term's predicted latency, best first. Configs whose tiles fill less
    than one wave of SMs get none: there split-K is the lever (:func:`split_k_variants`), and a faster
    loop on a grid that leaves SMs idle is not worth a trial. The ws constants are fitted on 4 H200
    shapes (``carver/ws_model.py``): these are proposals for the autotuner, and on those shapes no
    256-row tile and no cluster form is proposed (both measured slower).
    """
    w = ws or WS_CONSTANTS.get(arch.family)
    if w is None or not (arch.has_wgmma and arch.has_tma) or not problem.tma_aligned:
        return []

    def legal(c: MatmulConfig) -> bool:
        return not check(problem, c, arch)

    def ws_us(c: MatmulConfig) -> float:
        return predict_ws_us(problem, arch, c.kernel_kwargs(), ws=w)

    out: list[tuple[float, MatmulConfig]] = []  # (predicted us, config)
    for cfg in configs[:top]:
        if (cfg.split_k, cfg.persistent, cfg.variant) != (1, 0, "pipelined") or _tiles(problem, cfg) < arch.sm_count:
            continue
        groups = cfg.thread_num // 128 if cfg.thread_num % 128 == 0 else 0
        policy = "full_row" if groups == 2 and cfg.block_M % 128 == 0 else cfg.warp_policy
        plain = dataclasses.replace(cfg, variant="ws", num_stages=max(2, cfg.num_stages), warp_policy=policy)
        while plain.num_stages > 2 and ws_smem_bytes(problem, plain.kernel_kwargs()) > arch.smem_per_block:
            plain = dataclasses.replace(plain, num_stages=plain.num_stages - 1)
        if not legal(plain):
            continue
        # a form's gain is its base's predicted us over its own (carver.ws_model.ws_gain, the base predicted once)
        base_us, plain_us = predict_pipelined_us(problem, arch, cfg.kernel_kwargs()), ws_us(plain)
        gain = base_us / plain_us
        wanted = [(plain_us, plain)] if gain >= 1 + w.min_gain else []
        m_tiles, n_tiles = math.ceil(problem.M / cfg.block_M), math.ceil(problem.N / cfg.block_N)
        cluster = "1x2" if cfg.block_M >= cfg.block_N and n_tiles >= 2 else "2x1" if m_tiles >= 2 else None
        more = [dataclasses.replace(plain, cluster=cluster)] if cluster else []
        if m_tiles * n_tiles > arch.sm_count:
            more.append(dataclasses.replace(plain, persistent=arch.sm_count))
        # one stage more than the plain form: the batch in flight holds a stage that T.Pipelined has freed,
        # so the ws loop needs it to keep as many loads in flight; C's tile goes on the ring if beside it
        # that stage does not fit
        deeper = dataclasses.replace(plain, num_stages=plain.num_stages + 1)
        if ws_smem_bytes(problem, deeper.kernel_kwargs()) > arch.smem_per_block:
            deeper = dataclasses.replace(deeper, pass_configs={C_ON_RING: True})
        more.append(deeper)
        for c in more:
            if legal(c) and base_us / (us := ws_us(c)) >= max(1 + w.min_gain, gain):
                wanted.append((us, c))
        out += [(us, c) for us, c in wanted if c not in configs and all(c != o for _, o in out)]
    # best predicted first (stable, so ties keep their base's rank)
    return [c for _, c in sorted(out, key=lambda t: t[0])]


#: :func:`subwave_cluster_variants_for` proposes its forms for grids of at least this share of a wave (and under one),
SUBWAVE_MIN_FILL = 0.5
#: with 64-wide K steps and the most stages that fit in this range (those measured held 5 and 6),
SUBWAVE_STAGES = (3, 6)
#: for the best-ranked hints that have one, this many forms at most.
SUBWAVE_MAX_FORMS = 2


def _padded_ctas(m_tiles: int, n_tiles: int, cluster: str) -> int:
    """The CTAs a grid of ``m_tiles x n_tiles`` launches in clusters of ``cluster``: padded to whole ones."""
    cm, cn = cluster_shape(cluster)
    return math.ceil(m_tiles / cm) * cm * math.ceil(n_tiles / cn) * cn


def subwave_cluster_variants_for(problem: MatmulProblem, configs: Sequence[MatmulConfig],
                                 arch: GPUArch) -> list[MatmulConfig]:
    """For an unsplit config whose tiles fill at least :data:`SUBWAVE_MIN_FILL` of the SMs but less than one
    wave (a few rows against a large weight, where the grid is bound by what L2 feeds the SMs), the
    hand-scheduled loop with a 2-CTA cluster that multicasts the operand tile its two CTAs share: the pair
    reads it from L2 once. The grid is padded to whole clusters (its padding CTAs run the K loop too), so a
    direction is taken only where its padded grid is still under one wave: the one that shares the larger
    operand tile first. The form keeps the hint's tile and takes 64-wide K steps, in as many stages as fit
    beside C's staging tile within :data:`SUBWAVE_STAGES`; a 64-row tile runs one consumer warpgroup
    (``thread_num=128``, the rows whole), 128-row tiles two, stacked (``full_row``). The forms of the best-ranked
    hints, :data:`SUBWAVE_MAX_FORMS` at most. :func:`ws_variants_for` proposes nothing for such grids (its model
    is fitted over whole waves), and this rule does not consult that model: the tuner measures the forms.

    The evidence (one H200, 2026-12-02, ``benchmarks/wave_tail.py`` back to back in interleaved rounds with
    cuBLAS, which itself runs clusters of 2 there; ``benchmarks/data/multicast-2026-12-02-h200``), cuBLAS's
    time over ours:

    * 128x14336x4096 (the MLP's gate and up at 128 tokens): 64x224 with a 2x1 cluster 1.030, 128x128 with a
      1x2 cluster 1.028 (128x112 1.040), against 1.020 and 0.973 for the same tiles in TileLang's loop, and
      1.008 and 1.007 for the loop without the cluster;
    * 512x4096x14336 (the down projection at 512): 128x128 with a 2x1 or 1x2 cluster 1.010-1.013 in two calls,
      against 0.917-0.988 for TileLang's loop of 128x128 tiles and 0.915-0.918 for the ws loop without the
      cluster. Every config the carver proposed there ran 0.86-0.99."""
    if not (arch.has_wgmma and arch.has_tma) or not problem.tma_aligned:
        return []
    out: list[MatmulConfig] = []
    for cfg in configs:
        tiles = _tiles(problem, cfg)
        if ((cfg.split_k, cfg.persistent, cfg.variant) != (1, 0, "pipelined")
                or not SUBWAVE_MIN_FILL * arch.sm_count <= tiles < arch.sm_count):
            continue
        m_tiles, n_tiles = math.ceil(problem.M / cfg.block_M), math.ceil(problem.N / cfg.block_N)
        # the pair shares the larger of its operand tiles (B's, 2x1 along M, where the tile is wider than tall),
        # else the other one, where that one's grid, padded to whole clusters (the padding CTAs run the K loop
        # too), still fits in one wave
        order = ("2x1", "1x2") if cfg.block_N > cfg.block_M else ("1x2", "2x1")
        fits = [c for c in order if (m_tiles if c == "2x1" else n_tiles) >= 2
                and _padded_ctas(m_tiles, n_tiles, c) < arch.sm_count]
        if not fits or cfg.block_M % 64:
            continue
        cluster = fits[0]
        threads, policy = (128, "square") if cfg.block_M == 64 else (256, "full_row")
        form = dataclasses.replace(cfg, variant="ws", cluster=cluster, thread_num=threads, warp_policy=policy,
                                   block_K=64, num_stages=SUBWAVE_STAGES[1], panel_size=10)
        while (form.num_stages > SUBWAVE_STAGES[0]
               and ws_smem_bytes(problem, form.kernel_kwargs()) > arch.smem_per_block):
            form = dataclasses.replace(form, num_stages=form.num_stages - 1)
        if not check(problem, form, arch) and form not in out and form not in configs:
            out.append(form)
    return out[:SUBWAVE_MAX_FORMS]


#: The most cluster-summed split-K forms (:func:`cluster_split_variants_for`) one problem gets, and their split.
CLUSTER_SPLIT_MAX_FORMS = 2
CLUSTER_SPLIT = 2


def cluster_split_variants_for(problem: MatmulProblem, ranked: Sequence[MatmulConfig],
                               arch: GPUArch) -> list[MatmulConfig]:
    """The best-ranked configs among ``ranked`` (the carver's ranking, best first) that split K in
    :data:`CLUSTER_SPLIT` and whose grid of CTAs fits in one wave, with their partials summed in their
    cluster's shared memory (``split_reduce="cluster"``): no fp32 workspace written to memory and read back, no
    second kernel, and a call with one launch and nothing to allocate. :data:`CLUSTER_SPLIT_MAX_FORMS` at most;
    Hopper only (clusters and their shared-memory copies). The carver prices a config as the workspace program;
    the workspace's cost is the same for every config of one problem and split, so its order among them stands.

    The evidence (one H200, 2026-12-02, ``benchmarks/wave_tail.py`` back to back in interleaved rounds with
    cuBLAS; ``benchmarks/data/splitk-cluster-2026-12-02-h200``), cuBLAS's time over ours:

    * split in 2, one wave or less: 64x4096x14336 (64x64 tiles) 1.140 against 1.020 with the workspace and 1.085
      for the best unsplit config; 32x4096x14336 1.080 against 0.956 and 1.016; 64x4096x4096 1.488 against 0.702
      and 1.396;
    * split in 2 over one wave (224-256 CTAs): 0.92-0.95, behind the unsplit configs (1.00-1.06);
    * split in 4 (clusters of 4, 128 CTAs): 0.61-0.89, behind the workspace's 0.92-1.00 on every shape tried."""
    if not arch.has_tma:
        return []
    out: list[MatmulConfig] = []
    for cfg in ranked:
        if (cfg.split_k, cfg.split_reduce, cfg.variant) != (CLUSTER_SPLIT, "workspace", "pipelined") \
                or CLUSTER_SPLIT * _tiles(problem, cfg) > arch.sm_count:
            continue
        form = dataclasses.replace(cfg, split_reduce="cluster", enable_rasterization=False, panel_size=10)
        if form not in out and not check(problem, form, arch):
            out.append(form)
        if len(out) == CLUSTER_SPLIT_MAX_FORMS:
            break
    return out


#: The ping-pong form (:func:`pingpong_variants_for`) is proposed up to this many K tiles of 64 ...
PINGPONG_MAX_K_ITERS = 64
#: ... and where its 128x128 tiles give every resident CTA at least this many tiles to alternate on,
PINGPONG_MIN_TILES_PER_CTA = 2
#: with each of these rasterization panels (tile columns a panel of the persistent walk spans).
PINGPONG_PANELS = (4, 8)


def pingpong_variants_for(problem: MatmulProblem, arch: GPUArch) -> list[MatmulConfig]:
    """The ping-pong form of the hand-scheduled loop (``variant="pingpong"``: each of two consumer warpgroups
    runs a whole 128x128 tile's main loop while the other stores its C), 4 stages, one resident CTA per SM,
    walking the tiles in panels of 4 and of 8 columns, where K is at most :data:`PINGPONG_MAX_K_ITERS` K tiles,
    there are tiles enough to alternate and 4 stages fit beside the two C tiles.

    The evidence (one H200, 2026-12-02, ``benchmarks/wave_tail.py`` in interleaved rounds with cuBLAS and
    TileLang's loop of the 128x256 tile the tuned tables pick; ``benchmarks/data/pingpong-2026-12-02-h200``):

    * short and middling K, where a tile's epilogue is a larger share of it: over TileLang's loop 1.04-1.05x
      at 4096x4096x1024 and x2048, 1.14x at 4096x14336x2048, 1.06x at 2048x14336x4096 and 1.04x at 4096^3,
      faster than cuBLAS on those last three (cuBLAS's time over ours 1.01-1.05); but 0.99x at 4096^3 in
      another call, and at 8192x14336x4096 the better of panels 4 and 8 was 0.99x;
    * long K, where its 128x128 tile's extra shared-memory reads per FLOP tell: 0.96x at 8192x4096x14336,
      0.97x at 8192^3, 1.0x at 2048x4096x14336 (one call each); so K above 4096 gets none;
    * the panel moves it by up to 12% (2-16 measured), with no one width best everywhere; the better of 4
      and 8 was within 2% of the best on each of seven shapes; 3 stages ran 0.73-0.88x cuBLAS and 2 stages
      0.41-0.53x, so none is proposed with fewer than 4.

    The same config moved up to 10% between two calls, more than some of these margins: the tuner measures,
    and this rule only decides what it measures. The carver does not model the form (it ranks the grid's
    program). 16-bit inputs only (what was measured)."""
    if not (arch.has_wgmma and arch.has_tma) or not problem.tma_aligned or problem.in_bytes != 2:
        return []
    base = MatmulConfig(block_M=128, block_N=128, block_K=64, num_stages=4, thread_num=256,
                        enable_rasterization=True, variant="pingpong", persistent=arch.sm_count)
    if (math.ceil(problem.K / base.block_K) > PINGPONG_MAX_K_ITERS
            or _tiles(problem, base) < PINGPONG_MIN_TILES_PER_CTA * arch.sm_count):
        return []
    out = [dataclasses.replace(base, panel_size=p) for p in PINGPONG_PANELS]
    return [c for c in out if not check(problem, c, arch)]  # fp32 C: two 64 KB tiles, 4 stages no longer fit


#: How deep in the carver's ranking :func:`row_tile_hedge` looks.
ROW_HEDGE_DEPTH = 32


def row_tile_hedge(problem: MatmulProblem, ranked: Sequence[MatmulConfig]) -> list[MatmulConfig]:
    """With few rows (M spans at most two of the top config's tile rows), the best-ranked unsplit config
    whose ``block_M`` differs from the top one's: there the model's error (20-35% on the few-row searches,
    ``benchmarks/few_rows_scores.py``) is larger than the gap it sees between one and two tile rows
    (64x224 won 128x14336x4096 by 3%; 128x64 won 128x6144x4096 by 27% over the model's 64x96), so tuning
    measures the best of each. Empty otherwise."""
    if not ranked or math.ceil(problem.M / ranked[0].block_M) > 2:
        return []
    top = ranked[0].block_M
    return [c for c in ranked if c.block_M != top and c.split_k == 1][:1]


def candidates(problem: MatmulProblem, arch: GPUArch | None, topk: int, variants: bool = True, *,
               split_k: bool = True) -> list[MatmulConfig]:
    """The carver's top ``topk`` hints for ``arch``, best first, then the row-tile hedge
    (:func:`row_tile_hedge`), then (with ``split_k``) split-K variants
    of the top two when their tiles fill less than one wave, with the cluster-summed form of the best-ranked
    configs split in two on Hopper (:func:`cluster_split_variants_for`), and (with ``variants``, on a GPU with wgmma)
    the Hopper variants of the top three (the row-wise warp split, the persistent kernel and, where the
    carver's ws term predicts it pays, the hand-scheduled loop), the clustered loop of the hints whose grids
    fill part of one wave (:func:`subwave_cluster_variants_for`), and the ping-pong loop where K is short
    (:func:`pingpong_variants_for`). The first config is always the carver's top-1."""
    if arch is None:
        raise ValueError("the matmul template ranks configs for a GPU; pass arch, e.g. carver.arch.CUDA('H100')")
    topk = positive_int(topk, "topk")  # checked here: the ranking below asks for at least ROW_HEDGE_DEPTH
    arch = CUDA(arch)  # a GPU name ("H100") as check and the gemv family take it; an arch as it is
    ranked = [MatmulConfig.from_dict(c) for c in hint_configs(_carver_for(problem, arch), max(topk, ROW_HEDGE_DEPTH))]
    hints = ranked[:topk]
    out = hints + [c for c in row_tile_hedge(problem, ranked) if c not in hints]
    if split_k:
        out += split_k_variants(problem, hints, arch.sm_count)
        out += [c for c in cluster_split_variants_for(problem, ranked, arch) if c not in out]
    if variants and arch.has_wgmma:
        out += hopper_variants_for(problem, hints, arch.sm_count, arch.smem_per_block)
        out += [c for c in ws_variants_for(problem, hints, arch) if c not in out]
        out += [c for c in subwave_cluster_variants_for(problem, hints, arch) if c not in out]
        out += [c for c in pingpong_variants_for(problem, arch) if c not in out]
    return out


# --------------------------------------------------------------------------------------------------
# The dict-based variants (older API)
# --------------------------------------------------------------------------------------------------
def split_k_candidates(
    configs: Sequence[Mapping[str, Any]], M: int, N: int, K: int, num_sms: int, per_config: int = 3,
    top: int = 2,
) -> list[dict[str, Any]]:
    """:func:`split_k_variants` for config dicts (each checked first; the first bad one says which)."""
    problem = MatmulProblem(M, N, K)  # fp16's block_K rule is the loosest of the template's dtypes
    num_sms = positive_int(num_sms, "num_sms")
    per_config = int_in_range(per_config, "per_config", 0, 2**31 - 1)
    top = int_in_range(top, "top", 0, 2**31 - 1)
    typed = [MatmulConfig.from_dict(c) for c in checked_configs(problem, configs, "configs")]
    return [c.to_dict() for c in split_k_variants(problem, typed, num_sms, per_config, top)]


def hopper_variants(
    configs: Sequence[Mapping[str, Any]], M: int, N: int, K: int, num_sms: int, smem_per_block: int,
    in_dtype: str = "float16", out_dtype: str | None = None, top: int = 3, persistent_max_k_iters: int = 16,
) -> list[dict[str, Any]]:
    """:func:`hopper_variants_for` for config dicts (each checked first; the first bad one says which)."""
    in_dtype = check_dtype(in_dtype, IN_DTYPES, "in_dtype")
    # any output dtype the carver knows: only its size counts
    problem = MatmulProblem(M, N, K, in_dtype, out_dtype)  # None: the input's default (default_out_dtype)
    num_sms = positive_int(num_sms, "num_sms")
    smem_per_block = positive_int(smem_per_block, "smem_per_block")
    top = int_in_range(top, "top", 0, 2**31 - 1)
    persistent_max_k_iters = int_in_range(persistent_max_k_iters, "persistent_max_k_iters", 0, 2**31 - 1)
    typed = [MatmulConfig.from_dict(c) for c in checked_configs(problem, configs, "configs")]
    return [c.to_dict() for c in hopper_variants_for(problem, typed, num_sms, smem_per_block, top,
                                                      persistent_max_k_iters)]
