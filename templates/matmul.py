"""The TileLang GEMM template: ``C = op(A) @ op(B)`` with fp32 accumulation, plus the one-call tuner.

The module exposes the same names as every template (STYLE.md 1):

* :func:`kernel` -- the kernel with its reserved (tunable) parameters; returns a ``T.prim_func``.
* :func:`ref_program` -- the torch reference the autotuner checks every candidate against.
* :func:`default_space` -- TileLang's 288-config grid, the exhaustive baseline.
* :func:`carver_template` -- the carver's model of this kernel, which ranks hints and says which configs
  are legal.

and, on top of them, the product's main job:

* :func:`compile` -- a fixed config (or the carver's top-1, no tuning) compiled into a callable.
* :func:`tuner` / :func:`tune` -- carver top-k -> autotuner (compile, check, time, cache) -> the best
  kernel. A second call with the same problem, in any process, is served from the tuning database.

Layouts: ``A`` is ``(M, K)``, or ``(K, M)`` when ``trans_A``; ``B`` is ``(K, N)``, or ``(N, K)`` when
``trans_B`` (the default, the layout of ``x @ W.T`` and of the measured grids). ``C`` is ``(M, N)``.

The plain path (``split_k == 1``) builds exactly the program that produced the measured grids in
``../shared/data/h200-gemm-grid`` (``../shared/tools/measure_gemm_grid.py``) for the default layout,
dtypes and ``panel_size``; ``tests/test_matmul.py`` checks that, so the shared data stays valid.

``split_k > 1`` is for few output tiles and long K (small M): the K loop is split over a third grid
dimension; every split writes its fp32 partial tile into a workspace ``(split_k, M, N)`` that the kernel
allocates itself (``T.alloc_global``: TVM's pooled device workspace, not the torch allocator), and a
second kernel in the same program sums the partials and casts once into ``C``. So the output dtype does
not change, ``C`` needs no zero-fill, the result is deterministic (no atomics) and rounds once, like the
plain path. The cost is ``split_k * M * N * 4`` bytes of workspace and ``2 * split_k * M * N * 4`` bytes
of extra traffic, which only pays when M*N is small next to the work per tile.

Two more knobs express what TileLang's grid cannot (:func:`hopper_variants` proposes them on Hopper):
``warp_policy="full_row"`` gives each warpgroup whole rows of the block (one m64n256 wgmma rather than
two m64n128 for a 128x256 block), and ``persistent=n`` launches n CTAs that walk the tiles, so the
producer warpgroup loads the next tile while the consumers store this one.
"""

import dataclasses
import functools
import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from carver.problem import MatmulProblem, canonical_dtype, dtype_bytes, flag, int_in_range, positive_int, shape_dim
from carver.validity import CONFIG_KEYS as MATMUL_CONFIG_KEYS
from carver.validity import KERNEL_KEYS, WARP_POLICIES, check_matmul_config, require_matmul_config, split_k_limit
from carver.validity import OPTIONAL_KEYS as CARVER_OPTIONAL_KEYS

if TYPE_CHECKING:  # heavy imports stay lazy (STYLE.md 2)
    import torch
    from tvm.tirx import PrimFunc

    from autotuner.target import ResolvedTarget

__all__ = [
    "CONFIG_KEYS",
    "CUDAUnavailableError",
    "IN_DTYPES",
    "OUT_DTYPES",
    "TUNABLE_KEYS",
    "WARP_POLICIES",
    "carver_template",
    "compile",
    "default_space",
    "kernel",
    "normalize_config",
    "split_k_candidates",
    "hopper_variants",
    "ref_program",
    "tune",
    "tuner",
    "validate",
]

#: The reserved parameters of TileLang's GEMM grid; every config has them (the carver's list).
TUNABLE_KEYS: tuple[str, ...] = MATMUL_CONFIG_KEYS
#: What this template adds to the six, with the value that leaves the grid's program unchanged.
EXTRA_DEFAULTS: dict[str, Any] = {**CARVER_OPTIONAL_KEYS, **KERNEL_KEYS}
#: Everything a config may set: the six above plus the four this template adds.
CONFIG_KEYS: tuple[str, ...] = TUNABLE_KEYS + tuple(EXTRA_DEFAULTS)
#: A config may carry TileLang pass configs of its own (the autotuner hands them to the compiler).
PASS_CONFIGS_KEY = "pass_configs"
#: TileLang's role-based warp specialisation: the C tile gets its own shared buffer and a store warp.
AUTO_WS = "tl.enable_auto_warp_specialization"
#: The keys the carver models (the rest change neither a config's tile nor its registers).
_CARVER_KEYS: tuple[str, ...] = TUNABLE_KEYS + tuple(CARVER_OPTIONAL_KEYS)
#: Input dtypes. fp8 (e4m3) only on Hopper or newer, and only with K-major operands (the NT layout).
IN_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float8_e4m3")
OUT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
ACCUM_DTYPES: tuple[str, ...] = ("float32",)

_GRID = {
    "block_M": [64, 128, 256],
    "block_N": [64, 128, 256],
    "block_K": [32, 64],
    "num_stages": [0, 1, 2, 3],
    "thread_num": [128, 256],
    "enable_rasterization": [True, False],
}
_DEFAULT_SMS = 132  # H100 SXM / H200: used only when the carver's arch does not say
_SM_ARCH = re.compile(r"^sm_\d+[af]?$")  # sm_90, sm_90a, sm_100f
_TARGETS = ("'auto' (the local CUDA GPU), 'cuda', an arch such as 'sm_90a' (compile-only, no GPU needed), a "
            "dict such as {'kind': 'cuda', 'arch': 'sm_90a'}, or a CUDA tvm.target.Target")


class CUDAUnavailableError(RuntimeError):
    """The call must run a GEMM on a CUDA GPU and none is visible (``torch.cuda.is_available()`` is False).

    Raised by :func:`tune`, :func:`tuner` and :func:`compile` (with ``target="auto"`` or ``"cuda"``) before
    anything compiles. A RuntimeError, not a ValueError: the arguments are fine, the machine lacks a GPU.
    The message says what works offline: the carver's hints for a named GPU, and compile-only checks.
    """


# --------------------------------------------------------------------------------------------------
# Argument checks, run at the API edge so a typo fails here and not deep inside TVM. The rules
# themselves live in the carver (carver.problem for shapes, carver.validity for configs): one place.
# --------------------------------------------------------------------------------------------------
def _dtype(value: object, allowed: Sequence[str], what: str) -> str:
    """Normalise a dtype name (``"fp16"``, ``torch.float16`` and ``"float16"`` are one dtype)."""
    try:
        name = canonical_dtype(value, what)  # the carver's aliases: one table for the project
    except ValueError:
        name = None
    if name not in allowed:
        raise ValueError(f"{what} must be one of {list(allowed)}, got {value!r}")
    return name


def _check_problem(
    M: object, N: object, K: object, in_dtype: object, out_dtype: object, accum_dtype: object,
    trans_A: object, trans_B: object,
) -> MatmulProblem:
    """The template's dtypes and layouts, then the carver's problem (sizes a GPU can hold)."""
    in_dtype = _dtype(in_dtype, IN_DTYPES, "in_dtype")
    out_dtype = _dtype(out_dtype, OUT_DTYPES, "out_dtype")
    accum_dtype = _dtype(accum_dtype, ACCUM_DTYPES, "accum_dtype")
    problem = MatmulProblem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B)
    if in_dtype == "float8_e4m3" and (problem.trans_A or not problem.trans_B):
        # wgmma reads fp8 operands only K-major from shared memory.
        raise ValueError(
            f"float8_e4m3 needs A as (M, K) and B as (N, K) (trans_A=False, trans_B=True), got "
            f"trans_A={problem.trans_A}, trans_B={problem.trans_B}; transpose the operands in torch first"
        )
    return problem


#: The largest split_k for which every split still gets some of K (the carver's rule).
_split_k_limit = split_k_limit


def _k_per_split(K: int, block_K: int, split_k: int) -> int:
    return math.ceil(math.ceil(K / split_k) / block_K) * block_K


def _check_config(
    K: int, in_dtype: str, block_M: object, block_N: object, block_K: object, num_stages: object,
    thread_num: object, enable_rasterization: object, panel_size: object, split_k: object,
    warp_policy: object = "square", persistent: object = 0,
) -> None:
    """The carver's config rules that need only K and the dtype (M = N = 1 stands in for the rest)."""
    config = dict(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages, thread_num=thread_num,
                  enable_rasterization=enable_rasterization, panel_size=panel_size, split_k=split_k,
                  warp_policy=warp_policy, persistent=persistent)
    require_matmul_config(MatmulProblem(1, 1, K, in_dtype), config, kernel_keys=True)


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Check a config dict once at the API edge: its keys, and each value on its own (the carver's
    :func:`carver.validity.normalize_config`); returns a plain dict in CONFIG_KEYS order, ints as ints.

    Rules between keys and the problem (block_K against the dtype, split_k against K, ...) need the
    problem: :func:`kernel`, :func:`compile` and :func:`tuner` check them too.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"a config must be a dict, got {config!r}")
    if PASS_CONFIGS_KEY in config and not isinstance(config[PASS_CONFIGS_KEY], Mapping):
        raise TypeError(f"{PASS_CONFIGS_KEY} must be a dict of TileLang pass configs, got "
                        f"{config[PASS_CONFIGS_KEY]!r}")
    values = require_matmul_config(None, _kernel_part(config), kernel_keys=True)
    out = {k: values[k] for k in CONFIG_KEYS if k in config}
    if PASS_CONFIGS_KEY in config:
        out[PASS_CONFIGS_KEY] = config[PASS_CONFIGS_KEY]
    return out


def _kernel_part(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != PASS_CONFIGS_KEY}


def _checked_configs(problem: MatmulProblem, configs: Iterable[Mapping[str, Any]], what: str
                     ) -> list[dict[str, Any]]:
    """``configs`` normalised, each checked against the carver's rules no GPU escapes; the first bad one is
    a ValueError (or TypeError) that says which."""
    out = []
    if isinstance(configs, Mapping) or not isinstance(configs, Iterable):
        raise TypeError(f"{what} must be a list of config dicts, got {configs!r}")
    for i, config in enumerate(configs):
        try:
            cfg = normalize_config(config)
            require_matmul_config(problem, _kernel_part(cfg), kernel_keys=True)
        except (TypeError, ValueError) as e:
            raise type(e)(f"{what}[{i}]: {e}") from e
        out.append(cfg)
    return out


# --------------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------------
def kernel(
    M: int,
    N: int,
    K: int,
    block_M: int,
    block_N: int,
    block_K: int,
    num_stages: int,
    thread_num: int,
    enable_rasterization: bool,
    in_dtype: str = "float16",
    out_dtype: str = "float16",
    accum_dtype: str = "float32",
    trans_A: bool = False,
    trans_B: bool = True,
    panel_size: int = 10,
    split_k: int = 1,
    warp_policy: str = "square",
    persistent: int = 0,
) -> "PrimFunc":
    """Build the GEMM ``T.prim_func`` for one config (nothing is compiled here).

    Everything the program depends on is in this one function body, on purpose: the autotuner keys its
    cache on this function's source plus the values bound to it, so an edit to the program must be an
    edit here. Shapes that do not divide by the tile are handled by ``T.copy``'s boundary predication
    (out-of-range loads read zeros, out-of-range stores are skipped).
    """
    import tilelang.language as T

    # Every argument is checked (by the carver's rules) before any TIR is built; values come back as ints.
    problem = _check_problem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B)
    cfg = require_matmul_config(problem, dict(
        block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages, thread_num=thread_num,
        enable_rasterization=enable_rasterization, panel_size=panel_size, split_k=split_k,
        warp_policy=warp_policy, persistent=persistent), kernel_keys=True)
    M, N, K, trans_A, trans_B = problem.M, problem.N, problem.K, problem.trans_A, problem.trans_B
    in_dtype, out_dtype, accum_dtype = problem.in_dtype, problem.out_dtype, problem.accum_dtype
    block_M, block_N, block_K, num_stages, thread_num, enable_rasterization, panel_size, split_k, warp_policy, \
        persistent = (cfg[k] for k in CONFIG_KEYS)
    policy = {"square": T.GemmWarpPolicy.Square, "full_row": T.GemmWarpPolicy.FullRow,
              "full_col": T.GemmWarpPolicy.FullCol}[warp_policy]
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_tile = (block_K, block_M) if trans_A else (block_M, block_K)
    B_tile = (block_N, block_K) if trans_B else (block_K, block_N)

    if persistent:
        # `persistent` resident CTAs walk the tiles (tile w * persistent + cta): on Hopper the producer
        # warpgroup loads the next tile's first stages while the consumers store this tile's C, so the
        # epilogue and the pipeline fill stop costing a full tile each. No shared buffer is reused
        # across tiles, so C's staging tile sits beside the A/B stages (see `_separate_c_smem_bytes`).
        m_tiles, n_tiles = math.ceil(M / block_M), math.ceil(N / block_N)
        waves = math.ceil(m_tiles * n_tiles / persistent)
        swizzle = panel_size if enable_rasterization else 1

        @T.prim_func
        def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
                 C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(persistent, threads=thread_num) as (cta,):
                A_shared = T.alloc_shared(A_tile, in_dtype)
                B_shared = T.alloc_shared(B_tile, in_dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                C_shared = T.alloc_shared((block_M, block_N), out_dtype)
                sched = T.PersistentTileScheduler(m_tiles, n_tiles, num_workers=persistent, swizzle_size=swizzle,
                                                  stateful=False)
                for w in T.serial(waves):
                    tm, tn = sched.coord(w * persistent + cta)
                    if tm < m_tiles and tn < n_tiles:
                        T.clear(C_local)
                        for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                            if trans_A:
                                T.copy(A[k * block_K, tm * block_M], A_shared)
                            else:
                                T.copy(A[tm * block_M, k * block_K], A_shared)
                            if trans_B:
                                T.copy(B[tn * block_N, k * block_K], B_shared)
                            else:
                                T.copy(B[k * block_K, tn * block_N], B_shared)
                            T.gemm(A_shared, B_shared, C_local, transpose_A=trans_A, transpose_B=trans_B,
                                   policy=policy)
                        T.copy(C_local, C_shared)
                        T.copy(C_shared, C[tm * block_M, tn * block_N])

        return main

    if split_k == 1:
        # For trans_A=False, trans_B=True, in == out dtype and panel_size=10 this is, statement for
        # statement, the program of the measured grids (tests/test_matmul.py compares the TIR).
        @T.prim_func
        def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
                 C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
                A_shared = T.alloc_shared(A_tile, in_dtype)
                B_shared = T.alloc_shared(B_tile, in_dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                C_shared = T.alloc_shared((block_M, block_N), out_dtype)
                T.use_swizzle(panel_size=panel_size, enable=enable_rasterization)
                T.clear(C_local)
                for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                    if trans_A:
                        T.copy(A[k * block_K, by * block_M], A_shared)
                    else:
                        T.copy(A[by * block_M, k * block_K], A_shared)
                    if trans_B:
                        T.copy(B[bx * block_N, k * block_K], B_shared)
                    else:
                        T.copy(B[k * block_K, bx * block_N], B_shared)
                    T.gemm(A_shared, B_shared, C_local, transpose_A=trans_A, transpose_B=trans_B, policy=policy)
                T.copy(C_local, C_shared)
                T.copy(C_shared, C[by * block_M, bx * block_N])

        return main

    # split_k > 1: split z owns K tiles [z * k_tiles, (z + 1) * k_tiles); the tail past K reads zeros.
    k_tiles = _k_per_split(K, block_K, split_k) // block_K
    red_M, red_N, red_threads = 16, 128, 128  # the reduction: 16 fp32 partial sums per thread and split

    @T.prim_func
    def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
             C: T.Tensor((M, N), out_dtype)):
        W = T.alloc_global((split_k, M, N), accum_dtype)
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k,
                      threads=thread_num) as (bx, by, bz):
            A_shared = T.alloc_shared(A_tile, in_dtype)
            B_shared = T.alloc_shared(B_tile, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=panel_size, enable=enable_rasterization)
            T.clear(C_local)
            for k in T.Pipelined(k_tiles, num_stages=num_stages):
                if trans_A:
                    T.copy(A[(bz * k_tiles + k) * block_K, by * block_M], A_shared)
                else:
                    T.copy(A[by * block_M, (bz * k_tiles + k) * block_K], A_shared)
                if trans_B:
                    T.copy(B[bx * block_N, (bz * k_tiles + k) * block_K], B_shared)
                else:
                    T.copy(B[(bz * k_tiles + k) * block_K, bx * block_N], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_A=trans_A, transpose_B=trans_B, policy=policy)
            T.copy(C_local, W[bz, by * block_M, bx * block_N])
        with T.Kernel(T.ceildiv(N, red_N), T.ceildiv(M, red_M), threads=red_threads) as (rx, ry):
            C_sum = T.alloc_fragment((red_M, red_N), accum_dtype)
            T.clear(C_sum)
            for s in T.serial(split_k):
                for i, j in T.Parallel(red_M, red_N):
                    if ry * red_M + i < M and rx * red_N + j < N:
                        C_sum[i, j] += W[s, ry * red_M + i, rx * red_N + j]
            T.copy(C_sum, C[ry * red_M, rx * red_N])

    return main


# --------------------------------------------------------------------------------------------------
# Reference, search space, carver
# --------------------------------------------------------------------------------------------------
def _torch_dtype(name: str) -> "torch.dtype":
    import torch

    return torch.float8_e4m3fn if name == "float8_e4m3" else getattr(torch, name)


def _default_out(in_dtype: str) -> str:
    """fp16/bf16 GEMMs return their input dtype; fp8 returns fp16 (an fp8 C loses most of the answer)."""
    return "float16" if in_dtype == "float8_e4m3" else in_dtype


def ref_program(
    A: "torch.Tensor", B: "torch.Tensor", trans_A: bool = False, trans_B: bool = True,
    out_dtype: str | None = None,
) -> "torch.Tensor":
    """The torch answer for the same layouts, in ``out_dtype`` (default: the kernel's default for A).

    Always an fp32 product of the (upcast) inputs, cast once, as the kernel accumulates: the
    reference must be at least as precise as the kernel it judges. A half-precision ``torch.matmul``
    is not: on 4097x4097x4097 (H200, 2026-11-21) cuBLAS differed from every tuned kernel by up to 2
    in bf16 (1.2M elements over atol=rtol=1e-2) while agreeing on 4096^3. The autotuner's
    ``ref_latency`` is therefore the fp32 product's time; benchmarks time cuBLAS separately.
    """
    a = A.T if trans_A else A
    b = B.T if trans_B else B
    in_name = str(A.dtype).removeprefix("torch.")
    out_name = _dtype(out_dtype, OUT_DTYPES, "out_dtype") if out_dtype is not None else (
        _default_out(_dtype(in_name, IN_DTYPES, "A.dtype")))
    return (a.float() @ b.float()).to(_torch_dtype(out_name))


def default_space(M: int, N: int, K: int) -> list[dict[str, Any]]:
    """TileLang's 288-config GEMM grid (its ``example_gemm_autotune``), in the measured files' order.

    It does not depend on the shape; M, N and K are taken so every template's space has one signature.
    Some configs do not fit (e.g. 256x256 tiles with 3 stages overflow shared memory): the exhaustive
    baseline is the grid as TileLang users run it, so they stay in and fail as trials.
    """
    for value, name in ((M, "M"), (N, "N"), (K, "K")):
        shape_dim(value, name)
    return [dict(zip(_GRID, values)) for values in itertools.product(*_GRID.values())]


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
    from carver import arch as carver_arch

    in_name = _dtype(in_dtype, IN_DTYPES, "in_dtype")
    out_name = _default_out(in_name) if out_dtype is None else out_dtype
    p = _check_problem(M, N, K, in_name, out_name, accum_dtype, trans_A, trans_B)
    tmpl = MatmulTemplate(M=p.M, N=p.N, K=p.K, in_dtype=p.in_dtype, out_dtype=p.out_dtype,
                          accum_dtype=p.accum_dtype, trans_A=p.trans_A, trans_B=p.trans_B)
    return tmpl.with_arch(carver_arch.CUDA(arch) if isinstance(arch, str) else arch)


def validate(tmpl: Any, K: int, in_dtype: str, config: Mapping[str, Any]) -> list[str]:
    """Why ``config`` cannot run (empty: legal): the carver's rules no GPU escapes, with the kernel's own
    keys, then the carver template's rules for its GPU, then the separate C tile's shared memory.

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
    problems = check_matmul_config(problem, _kernel_part(cfg), kernel_keys=True, arch_stand_ins=False)
    if problems:
        return problems
    full = {**EXTRA_DEFAULTS, **cfg}
    problems = list(tmpl.validate({k: v for k, v in cfg.items() if k in _CARVER_KEYS}))
    separate_c = "persistent" if full["persistent"] else (
        "role-based warp-specialised" if (cfg.get(PASS_CONFIGS_KEY) or {}).get(AUTO_WS) else "")
    if separate_c:
        need = _separate_c_smem_bytes(full, problem.in_dtype, problem.out_dtype)
        limit = getattr(getattr(tmpl, "arch", None), "smem_per_block", None)
        if limit is not None and need > limit:
            problems.append(
                f"{separate_c} {cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} with num_stages="
                f"{cfg['num_stages']} needs {need} bytes of shared memory (its C tile does not reuse the A/B "
                f"stages), over the {limit} per block; use fewer stages")
    return problems


def _separate_c_smem_bytes(cfg: Mapping[str, Any], in_dtype: str, out_dtype: str) -> int:
    """Shared memory when C's staging tile sits beside every A/B stage (persistent, role-based WS)."""
    stage = (cfg["block_M"] + cfg["block_N"]) * cfg["block_K"] * dtype_bytes(in_dtype)
    return max(cfg["num_stages"], 1) * stage + cfg["block_M"] * cfg["block_N"] * dtype_bytes(out_dtype) + 1024


def _hint_configs(tmpl: Any, topk: int) -> list[dict[str, Any]]:
    configs = []
    for hint in tmpl.recommend_hints(topk=topk):
        cfg = normalize_config(hint.to_config())
        if cfg not in configs:
            configs.append(cfg)
    return configs


def _num_sms(tmpl: Any) -> int:
    arch = getattr(tmpl, "arch", None)
    for name in ("num_sms", "sm_count", "sms", "num_sm", "compute_max_core"):
        value = getattr(arch, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return _DEFAULT_SMS


def split_k_candidates(
    configs: Sequence[Mapping[str, Any]], M: int, N: int, K: int, num_sms: int, per_config: int = 3,
    top: int = 2,
) -> list[dict[str, Any]]:
    """Split-K variants of the top configs when their output tiles fill less than one wave of SMs.

    With M=64, N=4096 and 64x128 tiles there are 32 tiles for 132 SMs: three quarters of the GPU idles
    whatever the tile. Splitting K over ``s`` CTAs per tile fills it; candidates are ``s`` near
    ``SMs / tiles`` and its neighbours, so the autotuner (not a guess) picks one.
    """
    problem = MatmulProblem(M, N, K)  # fp16's block_K rule is the loosest of the template's dtypes
    num_sms = positive_int(num_sms, "num_sms")
    per_config = int_in_range(per_config, "per_config", 0, 2**31 - 1)
    top = int_in_range(top, "top", 0, 2**31 - 1)
    configs = _checked_configs(problem, configs, "configs")
    M, N, K = problem.M, problem.N, problem.K
    out: list[dict[str, Any]] = []
    for cfg in configs[:top]:
        if cfg.get("split_k", 1) != 1:
            continue
        tiles = math.ceil(M / cfg["block_M"]) * math.ceil(N / cfg["block_N"])
        if tiles >= num_sms:
            continue
        fill = max(2, num_sms // tiles)
        limit = min(_split_k_limit(K, cfg["block_K"]), 16)
        wanted = sorted({s for s in (fill // 2, fill, 2 * fill) if 2 <= s <= limit})[:per_config]
        for s in wanted:
            candidate = {**cfg, "split_k": s}
            if candidate not in out and candidate not in configs:
                out.append(candidate)
    return out


def hopper_variants(
    configs: Sequence[Mapping[str, Any]], M: int, N: int, K: int, num_sms: int, smem_per_block: int,
    in_dtype: str = "float16", out_dtype: str = "float16", top: int = 3, persistent_max_k_iters: int = 16,
) -> list[dict[str, Any]]:
    """What the grid cannot express, tried on the top ``top`` configs: the other warp split and the
    persistent kernel.

    * ``warp_policy="full_row"`` when a block wider than tall has several consumer warpgroups: each takes
      whole rows (one m64n256 wgmma instead of two m64n128), which reads less shared memory per FLOP.
      For blocks at least as tall as wide TileLang's "square" split is already row-wise.
    * ``persistent=num_sms`` when there is more than one wave of tiles and K is short (at most
      ``persistent_max_k_iters`` K tiles): resident CTAs walk the tiles, and the producer loads the next
      tile while the consumers store this one. Stages are cut until the C tile fits beside them, but not
      below 3. On an H200 (2026-11-21, ``benchmarks/gemm_variants.py``, data in
      ``benchmarks/data/gemm-variants-2026-11-21``) it made 8192x8192x512 1.09x faster and every shape
      with K >= 4096 0.93-0.97x slower, hence the K limit; with 2 stages the 192x256 and 256x192
      persistent kernels ran 3.4-4.9x slower than the same tiles unpersisted, hence the stage floor.

    The carver does not model either (it ranks the grid's program); the autotuner measures them.
    """
    in_dtype = _dtype(in_dtype, IN_DTYPES, "in_dtype")
    problem = MatmulProblem(M, N, K, in_dtype, out_dtype)  # any dtype the carver knows: only its size counts
    out_dtype = problem.out_dtype
    num_sms = positive_int(num_sms, "num_sms")
    smem_per_block = positive_int(smem_per_block, "smem_per_block")
    top = int_in_range(top, "top", 0, 2**31 - 1)
    persistent_max_k_iters = int_in_range(persistent_max_k_iters, "persistent_max_k_iters", 0, 2**31 - 1)
    configs = _checked_configs(problem, configs, "configs")
    M, N, K = problem.M, problem.N, problem.K
    out: list[dict[str, Any]] = []
    for cfg in configs[:top]:
        if any(cfg.get(k, EXTRA_DEFAULTS[k]) != EXTRA_DEFAULTS[k] for k in ("split_k", "warp_policy", "persistent")):
            continue
        groups = cfg["thread_num"] // 128 if cfg["thread_num"] % 128 == 0 else 0
        policies = ["square"]
        if groups > 1 and cfg["block_N"] > cfg["block_M"] and cfg["block_M"] % (groups * 64) == 0:
            policies.append("full_row")
        tiles = math.ceil(M / cfg["block_M"]) * math.ceil(N / cfg["block_N"])
        for policy in policies:
            base = dict(cfg) if policy == "square" else {**cfg, "warp_policy": policy}
            wanted = [] if policy == "square" else [base]
            if tiles > num_sms and math.ceil(K / cfg["block_K"]) <= persistent_max_k_iters:
                pers = {**base, "persistent": num_sms}
                while pers["num_stages"] > 3 and _separate_c_smem_bytes(pers, in_dtype, out_dtype) > smem_per_block:
                    pers["num_stages"] -= 1
                if pers["num_stages"] >= 3 and _separate_c_smem_bytes(pers, in_dtype, out_dtype) <= smem_per_block:
                    wanted.append(pers)
            out += [c for c in wanted if c not in out and c not in configs]
    return out


def _target_spec(target: Any) -> Any:
    """"sm_90a" -> ``{"kind": "cuda", "arch": "sm_90a"}`` (compile-only without such a GPU); anything
    else ("auto", "cuda", a dict, a TVM target) as given. A dict stays picklable for compile workers."""
    if isinstance(target, str) and _SM_ARCH.match(target):
        return {"kind": "cuda", "arch": target}
    return target


def _tvm_target(target: Any) -> Any:
    spec = _target_spec(target)
    if isinstance(spec, dict):
        import tilelang  # noqa: F401 - puts its bundled tvm on the path
        from tvm.target import Target

        return Target(spec)
    return spec


def _no_gpu_message(what: str, M: int, N: int, K: int) -> str:
    return (f"{what} needs a CUDA GPU and none is visible (torch.cuda.is_available() is False), so nothing "
            f"was compiled; the GEMM has no CPU target. Without a GPU you can rank configs for a named GPU: "
            f"templates.matmul.carver_template({M}, {N}, {K}, arch=carver.arch.CUDA('H100')).recommend_hints(8) "
            f"(or carver.MatmulTemplate({M}, {N}, {K}).with_arch(carver.arch.CUDA('H100')).recommend_hints(8)), "
            f"and check that a config compiles (nvcc, no GPU): templates.matmul.compile({M}, {N}, {K}, config, "
            f"target={{'kind': 'cuda', 'arch': 'sm_90a'}})")


def _cuda_target(target: Any, what: str, problem: MatmulProblem) -> "ResolvedTarget":
    """``target`` checked once, by the autotuner's :func:`~autotuner.target.resolve_target`, for a GEMM:
    a CUDA target (a compile-only arch is fine). "auto"/"cuda" without a GPU is a CUDAUnavailableError;
    anything else that is not a CUDA target is a ValueError that lists what is accepted."""
    from autotuner.target import resolve_target

    if target is None or (isinstance(target, str) and target in ("auto", "cuda")):
        if resolve_target("auto").kind != "cuda":
            raise CUDAUnavailableError(_no_gpu_message(what, problem.M, problem.N, problem.K))
    spec = _target_spec(target)
    try:
        resolved = resolve_target(spec)
    except (TypeError, ValueError) as e:
        raise ValueError(f"target {target!r} is not one the matmul template accepts ({e}); it takes "
                         f"{_TARGETS}") from e
    if resolved.kind != "cuda":
        raise ValueError(f"target {target!r} is TileLang's C target on the CPU, which cannot lower the GEMM's "
                         f"T.gemm; the matmul template takes {_TARGETS}")
    if not _SM_ARCH.match(str(resolved.arch)):
        raise ValueError(f"target {target!r} names the CUDA arch {resolved.arch!r}; an arch is spelled 'sm_XY' "
                         f"or 'sm_XYa', e.g. 'sm_90a' (H100, H200), 'sm_89' (L40S) or 'sm_80' (A100); the matmul "
                         f"template takes {_TARGETS}")
    if isinstance(spec, dict):  # spelled by the user: let TVM judge every field before anything compiles
        try:
            _tvm_target(spec)
        except ValueError as e:
            raise ValueError(f"target {target!r} is not a valid CUDA target ({e}); the matmul template takes "
                             f"{_TARGETS}") from e
    return resolved


def _carver_arch(arch: Any, target: Any) -> Any:
    """Which GPU the carver models: ``arch`` when given; else the arch the target names; else local."""
    if arch is not None:
        return arch
    spec = _target_spec(target)
    if isinstance(spec, dict) and isinstance(spec.get("arch"), str):
        return spec["arch"]
    if hasattr(spec, "export"):  # tvm.target.Target
        named = dict(spec.export()).get("arch")
        if isinstance(named, str) and named:
            return named
    return "cuda"


# --------------------------------------------------------------------------------------------------
# One config, no tuning
# --------------------------------------------------------------------------------------------------
def compile(
    M: int,
    N: int,
    K: int,
    config: Mapping[str, Any] | None = None,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    out_dtype: str | None = None,
    arch: Any = None,
    target: Any = "auto",
) -> Any:
    """Compile one config into a callable ``kernel(A, B) -> C``: ``config`` as given, or, when None, the
    carver's top-1 hint (the no-tuning default: one compile, no GPU timing).

    ``target`` "auto" uses the local GPU; "sm_90a", ``{"kind": "cuda", "arch": "sm_90a"}`` (or a TVM
    target) compiles without one, for a check (the carver then models the GPU that arch names). Every
    argument, the config and the target are checked before anything compiles: a bad value is a
    ValueError (TypeError for a wrong type), "auto" or "cuda" without a GPU a :class:`CUDAUnavailableError`.
    """
    in_dtype = _dtype(dtype, IN_DTYPES, "dtype")
    out_name = _default_out(in_dtype) if out_dtype is None else _dtype(out_dtype, OUT_DTYPES, "out_dtype")
    problem = _check_problem(M, N, K, in_dtype, out_name, "float32", trans_A, trans_B)
    _cuda_target(target, "templates.matmul.compile(target=" + repr(target) + ")", problem)
    if config is None:
        tmpl = carver_template(problem.M, problem.N, problem.K, in_dtype, out_name, "float32", problem.trans_A,
                               problem.trans_B, arch=_carver_arch(arch, target))
        config = _hint_configs(tmpl, 1)[0]
    cfg = normalize_config(config)
    pass_configs = cfg.pop(PASS_CONFIGS_KEY, None)
    func = kernel(problem.M, problem.N, problem.K, **cfg, in_dtype=in_dtype, out_dtype=out_name,
                  trans_A=problem.trans_A, trans_B=problem.trans_B)  # checks the config against the problem
    import tilelang

    return tilelang.compile(func, out_idx=[-1], target=_tvm_target(target), pass_configs=pass_configs)


# --------------------------------------------------------------------------------------------------
# Tuning
# --------------------------------------------------------------------------------------------------
def tuner(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    topk: int = 8,
    arch: Any = None,
    out_dtype: str | None = None,
    configs: Iterable[Mapping[str, Any]] | None = None,
    split_k: bool = True,
    variants: bool = True,
    validate_configs: bool = True,
    target: Any = "auto",
    supply_type: Any = None,
    atol: float = 1e-2,
    rtol: float = 1e-2,
    compile_timeout: float = 120,
) -> Any:
    """The configured :class:`autotuner.AutoTuner` that :func:`tune` runs (for callers that want the full
    result: ``.config``, ``.latency``, ``.trials``, ``.from_cache``).

    Candidates: ``configs`` when given (e.g. :func:`default_space` for the exhaustive baseline), else the
    carver's top ``topk`` hints plus, with ``split_k``, split-K variants of the top two when their tiles
    fill less than one wave, and, with ``variants`` on a Hopper GPU, :func:`hopper_variants` of the top
    three (the row-wise warp split and, for short K, the persistent kernel). Every candidate is checked
    against :func:`ref_program` with no mismatches allowed, and illegal ones are dropped by :func:`validate`
    before they reach nvcc (unless ``validate_configs`` is False: an exhaustive baseline should try
    everything, as TileLang does). Configs no GPU can run (bad keys or values, block_M=7, thread_num=4096)
    are refused here with a ValueError either way.

    ``target`` "auto" (or "cuda") needs a CUDA GPU: without one this raises :class:`CUDAUnavailableError`
    before anything compiles. A compile-only target (``"sm_90a"`` or ``{"kind": "cuda", "arch": "sm_90a"}``
    with no such GPU) gives a tuner whose candidates can be inspected and compiled, not run.
    """
    from autotuner import AutoTuner

    in_dtype = _dtype(dtype, IN_DTYPES, "dtype")
    out_name = _default_out(in_dtype) if out_dtype is None else _dtype(out_dtype, OUT_DTYPES, "out_dtype")
    problem = _check_problem(M, N, K, in_dtype, out_name, "float32", trans_A, trans_B)
    M, N, K, trans_A, trans_B = problem.M, problem.N, problem.K, problem.trans_A, problem.trans_B
    topk = positive_int(topk, "topk")
    split_k, variants = flag(split_k, "split_k"), flag(variants, "variants")
    validate_configs = flag(validate_configs, "validate_configs")
    _cuda_target(target, "templates.matmul.tuner/tune", problem)
    given = None if configs is None else _checked_configs(problem, configs, "configs")
    tmpl = carver_template(M, N, K, in_dtype, out_name, "float32", trans_A, trans_B,
                           arch=_carver_arch(arch, target))
    if given is None:
        candidates = _hint_configs(tmpl, topk)
        hints = list(candidates)
        if split_k:
            candidates += split_k_candidates(hints, M, N, K, _num_sms(tmpl))
        if variants and getattr(tmpl.arch, "has_wgmma", False):
            candidates += hopper_variants(hints, M, N, K, _num_sms(tmpl), tmpl.arch.smem_per_block, in_dtype,
                                          out_name)
    else:
        candidates = given
        if not candidates:
            raise ValueError("configs is empty; pass None for the carver's hints or default_space(M, N, K)")
    fn = functools.partial(kernel, M, N, K, in_dtype=in_dtype, out_dtype=out_name, accum_dtype="float32",
                           trans_A=trans_A, trans_B=trans_B)
    ref = functools.partial(ref_program, trans_A=trans_A, trans_B=trans_B, out_dtype=out_name)
    check = functools.partial(validate, tmpl, K, in_dtype)
    return (AutoTuner.from_kernel(kernel=fn, configs=candidates, validate=check if validate_configs else None)
            .set_compile_args(out_idx=[-1], target=_target_spec(target), supply_type=supply_type,
                              ref_prog=ref, skip_check=False, atol=atol, rtol=rtol,
                              max_mismatched_ratio=0.0, compile_timeout=compile_timeout))


def tune(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    trans_A: bool = False,
    trans_B: bool = True,
    topk: int = 8,
    arch: Any = None,
    warmup: int = 3,
    rep: int = 20,
    out_dtype: str | None = None,
    configs: Iterable[Mapping[str, Any]] | None = None,
    split_k: bool = True,
    variants: bool = True,
) -> Callable[..., Any]:
    """Tune ``C = op(A) @ op(B)`` on the local GPU and return the fastest checked kernel: ``C = k(A, B)``.

    The carver proposes ``topk`` configs (plus split-K variants for few-wave shapes and, on Hopper, the
    variants of :func:`hopper_variants`), the autotuner compiles them in parallel, checks each against
    torch, times them (``warmup``/``rep`` are counts) and stores every trial; a later call for the same
    problem, in any process, returns the stored winner without compiling or timing. Use :func:`tuner` for
    the result object behind the kernel.

    Without a CUDA GPU it raises :class:`CUDAUnavailableError` at once, before anything compiles; offline,
    use :func:`carver_template` with a named arch for hints, or :func:`compile` with
    ``target={"kind": "cuda", "arch": "sm_90a"}`` to check that a config compiles.
    """
    return tuner(M, N, K, dtype=dtype, trans_A=trans_A, trans_B=trans_B, topk=topk, arch=arch,
                 out_dtype=out_dtype, configs=configs, split_k=split_k,
                 variants=variants).run(warmup=warmup, rep=rep).kernel

