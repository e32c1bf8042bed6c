"""The matmul family's program: ``C = op(A) @ op(B)`` with fp32 accumulation, as one ``T.prim_func``.

Layouts: ``A`` is ``(M, K)``, or ``(K, M)`` when ``trans_A``; ``B`` is ``(K, N)``, or ``(N, K)`` when
``trans_B`` (the default, the layout of ``x @ W.T`` and of the measured grids). ``C`` is ``(M, N)``.

The plain path (``split_k == 1``) builds exactly the program that produced the measured grids in
``benchmarks/data/h200-gemm-grid`` (``benchmarks/measure_gemm_grid.py``) for the default layout,
dtypes and ``panel_size``; ``tests/test_matmul.py`` checks that, so the shared data stays valid.

``split_k > 1`` is for few output tiles and long K (small M): the K loop is split over a third grid
dimension; every split writes its fp32 partial tile into a workspace ``W`` of ``(split_k, M, N)``, a scratch
parameter (:mod:`autotuner.scratch`) that every caller allocates per call through torch, on the
current stream (not ``T.alloc_global``, whose block TVM's per-thread pool hands to the next call as
soon as the kernels are launched, whatever stream that call is on), and a
second kernel in the same program sums the partials and casts once into ``C``. So the output dtype does
not change, ``C`` needs no zero-fill, the result is deterministic (no atomics) and rounds once, like the
plain path. The cost is ``split_k * M * N * 4`` bytes of workspace and ``2 * split_k * M * N * 4`` bytes
of extra traffic, which only pays when M*N is small next to the work per tile.

``split_reduce="cluster"`` (Hopper) sums the partials without the workspace or the second kernel: a tile's
``split_k`` CTAs are one thread-block cluster, each stages its fp32 partial in shared memory, sends each
peer the ``block_M / split_k`` rows that peer sums (a bulk copy into the peer's shared memory, completing
on its barrier), then sums the partials of its own rows and stores them: one launch, no scratch, and the
same single rounding.

Two more knobs express what TileLang's grid cannot (``templates.matmul.space.hopper_variants`` proposes
them on Hopper): ``warp_policy="full_row"`` gives each warpgroup whole rows of the block (one m64n256
wgmma rather than two m64n128 for a 128x256 block), and ``persistent=n`` launches n CTAs that walk the
tiles, so the producer warpgroup loads the next tile while the consumers store this one.

``variant="ws"`` and ``"pingpong"`` are a different program, with the main loop scheduled by hand
(``ws_program.py``).
"""

# No `from __future__ import annotations` here: TileLang reads the T.prim_func's annotations (shapes
# from this function's locals) as expressions.
import math
from typing import TYPE_CHECKING

from autotuner import scratch
from carver.validity import WS_VARIANTS, require_matmul_config

from .config import CONFIG_KEYS, MatmulConfig, MatmulProblem, k_per_split, make_problem
from .ws_program import ws_program

if TYPE_CHECKING:  # heavy imports stay lazy (STYLE.md 2)
    from tvm.tirx import PrimFunc, Var

__all__ = ["kernel", "program"]


def program(problem: MatmulProblem, config: MatmulConfig, M_var: "Var | None" = None) -> "PrimFunc":
    """Build the GEMM ``T.prim_func`` for one config (nothing is compiled here).

    ``M_var``: a symbolic M (``T.dynamic("M")``) to compile for instead of ``problem.M``, so that one
    kernel serves every M (the drop-in op, ``templates/matmul/op.py``, compiles one per bucket of M);
    ``problem.M`` then only stands in for it in the rules. Partial M tiles are safe on every path: TMA
    and predicated copies zero-fill loads and skip stores past M, and the split-K sum guards its rows.

    Everything the program depends on is in this one function body, on purpose: the autotuner keys its
    cache on this function's source plus the values bound to it, so an edit to the program must be an
    edit here. Shapes that do not divide by the tile are handled by ``T.copy``'s boundary predication
    (out-of-range loads read zeros, out-of-range stores are skipped).
    """
    import tilelang.language as T

    # The carver's rules no GPU escapes, for this problem, before any TIR is built (the config's own
    # values were checked when it was made, the problem's when it was).
    require_matmul_config(problem, config.kernel_kwargs(), kernel_keys=True)
    if config.variant in WS_VARIANTS:
        return ws_program(problem, config, M_var)
    M, N, K, trans_A, trans_B = problem.M, problem.N, problem.K, problem.trans_A, problem.trans_B
    if M_var is not None:
        M = M_var
    in_dtype, out_dtype, accum_dtype = problem.in_dtype, problem.out_dtype, problem.accum_dtype
    block_M, block_N, block_K, num_stages, thread_num, enable_rasterization, panel_size, split_k, warp_policy, \
        persistent, _, _, split_reduce = (getattr(config, k) for k in CONFIG_KEYS)
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
        # across tiles, so C's staging tile sits beside the A/B stages (see `separate_c_smem_bytes`).
        m_tiles, n_tiles = math.ceil(M / block_M) if M_var is None else T.ceildiv(M, block_M), math.ceil(N / block_N)
        tiles = m_tiles * n_tiles  # a CTA's w-th tile is w * persistent + cta, while that is below this
        waves = math.ceil(tiles / persistent) if M_var is None else T.ceildiv(tiles, persistent)
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
                    # the tile's index, not its decoded coordinates (the same tiles: the scheduler maps [0, tiles)
                    # onto the grid); on the coordinates TileLang 0.1.15's ThreadSync failed to lower C's store
                    # sync on some grids (1664x4096, 2304x7168 and 2560x14336 in 128x256 tiles on 132 CTAs)
                    if w * persistent + cta < tiles:
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
    k_tiles = k_per_split(K, block_K, split_k) // block_K

    @T.macro
    def split_partial(A, B, A_shared, B_shared, C_local, bx, by, bz):
        """Split ``bz``'s fp32 partial of tile (by, bx) into ``C_local``."""
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

    if split_reduce == "cluster":
        # A tile's splits are one cluster along x. Each CTA stages its fp32 partial P in shared memory
        # (on the pipeline's stages, which its loop has finished with), then sends band p of P (block_M /
        # split_k rows) to CTA p's slot R[z] by a bulk shared-memory copy that arrives on CTA p's barrier.
        # When its split_k copies have landed, a CTA sums its band's partials and stores those rows of C.
        band = block_M // split_k

        @T.prim_func
        def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
                 C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(split_k, T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num,
                          cluster_dims=(split_k, 1, 1)) as (bz, bx, by):
                A_shared = T.alloc_shared(A_tile, in_dtype)
                B_shared = T.alloc_shared(B_tile, in_dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
                P = T.alloc_shared((block_M, block_N), accum_dtype)
                R = T.alloc_shared((split_k, band, block_N), accum_dtype)
                C_band = T.alloc_fragment((band, block_N), accum_dtype)
                landed = T.alloc_cluster_barrier([split_k])
                # TileLang launches cluster kernels with programmatic stream serialization: wait for the
                # kernel before on the stream to finish with memory before reading A or B or writing C
                T.pdl_sync()
                split_partial(A, B, A_shared, B_shared, C_local, bx, by, bz)
                T.copy(C_local, P)
                T.fence_proxy_async()  # P's stores, before the bulk copies read it
                T.cluster_sync()  # every CTA's P is written and its stages free for R, its barrier initialised
                for p in T.unroll(split_k):
                    T.copy_cluster(P[p * band:(p + 1) * band, :], R[bz, :, :], dst_block=p, remote_barrier=landed[0])
                T.mbarrier_wait_parity(landed[0], 0)
                T.clear(C_band)
                for s in T.unroll(split_k):
                    for i, j in T.Parallel(band, block_N):
                        C_band[i, j] += R[s, i, j]
                T.copy(C_band, C[by * block_M + bz * band, bx * block_N])
                T.cluster_sync()  # no CTA leaves while a copy still reads its P

        return main
    red_M, red_N, red_threads = 16, 128, 128  # the reduction: 16 fp32 partial sums per thread and split

    # W, the partials, is a scratch parameter (autotuner.scratch), allocated per call by the caller through
    # torch on the current stream, not T.alloc_global's pooled block (shared across streams and graphs)
    @T.prim_func
    def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
             W: T.Tensor((split_k, M, N), accum_dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k,
                      threads=thread_num) as (bx, by, bz):
            A_shared = T.alloc_shared(A_tile, in_dtype)
            B_shared = T.alloc_shared(B_tile, in_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=panel_size, enable=enable_rasterization)
            split_partial(A, B, A_shared, B_shared, C_local, bx, by, bz)
            T.copy(C_local, W[bz, by * block_M, bx * block_N])
        with T.Kernel(T.ceildiv(N, red_N), T.ceildiv(M, red_M), threads=red_threads) as (rx, ry):
            C_sum = T.alloc_fragment((red_M, red_N), accum_dtype)
            T.clear(C_sum)
            for s in T.serial(split_k):
                for i, j in T.Parallel(red_M, red_N):
                    if ry * red_M + i < M and rx * red_N + j < N:
                        C_sum[i, j] += W[s, ry * red_M + i, rx * red_N + j]
            T.copy(C_sum, C[ry * red_M, rx * red_N])

    return scratch.mark(main, "W")


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
    variant: str = "pipelined",
    cluster: str = "1x1",
    split_reduce: str = "workspace",
) -> "PrimFunc":
    """:func:`program` with loose arguments: the kernel function with reserved parameters, as TileLang's
    examples write it (``functools.partial(kernel, M, N, K)`` is a kernel for TileLang's AutoTuner).
    Every argument is checked by the carver's rules before any TIR is built."""
    problem = make_problem(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B)
    config = MatmulConfig(block_M=block_M, block_N=block_N, block_K=block_K, num_stages=num_stages,
                          thread_num=thread_num, enable_rasterization=enable_rasterization, panel_size=panel_size,
                          split_k=split_k, warp_policy=warp_policy, persistent=persistent, variant=variant,
                          cluster=cluster, split_reduce=split_reduce)
    return program(problem, config)
