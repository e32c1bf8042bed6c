"""The GEMV family's program: ``y[m, n] = sum_k x[m, k] * W[n, k]`` with fp32 accumulation.

One CTA owns ``block_N`` rows of W; ``thread_num / block_N`` threads (``threadIdx.x``, a power of two up
to a warp) share each row and walk K in steps of ``block_K``: each thread first issues ``unroll`` vector
loads of its row (128-bit when K allows), then, for every row of x, loads the matching x vector (a few
KB, read from L1/L2) and accumulates in fp32. So every element of W is read from memory once and used
for all M rows: for M > 1 the weights are streamed once, not M times. The threads of a row then sum
with ``__shfl_xor_sync`` and the first stores y (in ``out_dtype``).

Shapes that do not divide: rows past N are clamped to row N - 1 (loaded, computed, never stored), so
the hot loop has no predicate; the K blocks that fit wholly run unguarded and the last partial block
guards each vector (``K % vec == 0`` is a rule, so a vector is wholly in or out of range).

This is the "vectorized, tvm-style split-K" GEMV of TileLang's ``examples/gemv/example_gemv.py``, with
the reduction threads on ``threadIdx.x`` (coalesced rows, warp-shuffle reduction), several rows of x,
and loads batched per step.

``path="mma"`` is the tensor-core program: ``templates.matmul``'s, with a 16-row tile of x
(``block_M = 16``, one m16n8k16 row slab) and ``trans_B`` (W is (N, K)). Its pipelined loop streams
``block_N x block_K`` tiles of W into shared memory (TMA with a producer warpgroup on Hopper when rows
are 16-byte aligned, else predicated cp.async), rows of x past M are zero-filled and never loaded, y is
stored only inside (M, N), and ``split_k > 1`` sums fp32 partials in a second kernel (no atomics).
With ``tma=False`` the mma path is its own, plainer program (cp.async, no producer warpgroup).
"""

# No `from __future__ import annotations` here: TileLang reads the T.prim_func's annotations.
from typing import TYPE_CHECKING

from .config import GemvConfig, GemvProblem, make_problem, resolved_vec

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

__all__ = ["kernel", "program"]


def program(problem: GemvProblem, config: GemvConfig) -> "PrimFunc":
    """Build the GEMV ``T.prim_func`` for one config (nothing is compiled here). The config must pass
    ``templates.gemv.space.check`` (the carver's GEMV rules); the template checks before calling."""
    if config.path == "mma":
        return _mma_program(problem, config)
    import tilelang.language as T

    M, N, K = problem.M, problem.N, problem.K
    dtype, out_dtype, accum = problem.dtype, problem.out_dtype, "float32"
    block_N, block_K = config.block_N, config.block_K
    vec = resolved_vec(problem, config)
    rt = config.thread_num // block_N  # threads along K per row
    unroll = block_K // (rt * vec)  # vectors in flight per thread and step
    full = K // block_K  # K blocks wholly in range: no guard
    tail = (K + block_K - 1) // block_K - full  # 0 or 1 partial block
    offsets = [rt >> i for i in range(1, rt.bit_length())]  # shuffle distances rt/2, ..., 1

    @T.prim_func
    def main(x: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=(rt, block_N)) as bn:
            tk = T.get_thread_binding(0)
            tn = T.get_thread_binding(1)
            row = T.min(bn * block_N + tn, N - 1)
            w_loc = T.alloc_local((unroll, vec), dtype)
            x_loc = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((M,), accum)
            for m in T.unroll(M):
                acc[m] = T.cast(0, accum)
            for b in T.serial(full):
                for u in T.unroll(unroll):
                    for v in T.vectorized(vec):
                        w_loc[u, v] = W[row, b * block_K + (u * rt + tk) * vec + v]
                for u in T.unroll(unroll):
                    for m in T.unroll(M):
                        for v in T.vectorized(vec):
                            x_loc[v] = x[m, b * block_K + (u * rt + tk) * vec + v]
                        for v in T.unroll(vec):
                            acc[m] += T.cast(w_loc[u, v], accum) * T.cast(x_loc[v], accum)
            for _b in T.serial(tail):
                for u in T.unroll(unroll):
                    if full * block_K + (u * rt + tk) * vec < K:
                        for v in T.vectorized(vec):
                            w_loc[u, v] = W[row, full * block_K + (u * rt + tk) * vec + v]
                        for m in T.unroll(M):
                            for v in T.vectorized(vec):
                                x_loc[v] = x[m, full * block_K + (u * rt + tk) * vec + v]
                            for v in T.unroll(vec):
                                acc[m] += T.cast(w_loc[u, v], accum) * T.cast(x_loc[v], accum)
            for m in T.unroll(M):
                for off in offsets:
                    acc[m] += T.shfl_xor(acc[m], off, rt)
            if tk == 0 and bn * block_N + tn < N:
                for m in T.unroll(M):
                    y[m, bn * block_N + tn] = T.cast(acc[m], out_dtype)

    return main


def _mma_program(problem: GemvProblem, config: GemvConfig) -> "PrimFunc":
    """The tensor-core path: the matmul family's program for ``x @ W.T`` with a 16-row tile of x, or with
    ``tma=False`` :func:`_async_program`."""
    if not config.tma:
        return _async_program(problem, config)
    from carver.problem import MatmulProblem
    from carver.templates import GEMV_MMA_ROWS
    from templates.matmul.config import MatmulConfig
    from templates.matmul.program import program as matmul_program

    mm = MatmulProblem(problem.M, problem.N, problem.K, problem.dtype, problem.out_dtype, trans_B=True)
    return matmul_program(mm, MatmulConfig(
        block_M=GEMV_MMA_ROWS, block_N=config.block_N, block_K=config.block_K, num_stages=config.num_stages,
        thread_num=config.thread_num, enable_rasterization=False, split_k=config.split_k))


def _async_program(problem: GemvProblem, config: GemvConfig) -> "PrimFunc":
    """The mma path with ``tma=False``: the plainest tensor-core GEMV, with no TMA and no producer
    warpgroup. A ``16 x block_N`` tile of y; x (zero-filled past M: ``T.copy`` predicates rows, and columns
    past K) and W tiles through a ``num_stages``-deep ``T.Pipelined`` loop of cp.async copies into shared
    memory; ``T.gemm`` with the warps side by side along N; y stored inside (M, N) only. Measured against
    the TMA lowering of the same tiles in ``benchmarks/gemv_fixed_cost.py`` (its ``sm`` programs)."""
    import tilelang.language as T

    from carver.templates import GEMV_MMA_ROWS

    M, N, K = problem.M, problem.N, problem.K
    dtype, out_dtype = problem.dtype, problem.out_dtype
    block_N, block_K, stages = config.block_N, config.block_K, config.num_stages
    no_tma = {"disable_tma": True}

    @T.prim_func
    def main(x: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=config.thread_num) as bn:
            x_s = T.alloc_shared((GEMV_MMA_ROWS, block_K), dtype)
            W_s = T.alloc_shared((block_N, block_K), dtype)
            acc = T.alloc_fragment((GEMV_MMA_ROWS, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                T.copy(x[0, k * block_K], x_s, annotations=no_tma)
                T.copy(W[bn * block_N, k * block_K], W_s, annotations=no_tma)
                T.gemm(x_s, W_s, acc, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
            T.copy(acc, y[0, bn * block_N])

    return main


def kernel(M: int, N: int, K: int, block_N: int, block_K: int, thread_num: int, vec: int = 0,
           dtype: str = "float16", out_dtype: str | None = None, path: str = "simt", num_stages: int = 0,
           split_k: int = 1, tma: bool = True) -> "PrimFunc":
    """:func:`program` with loose arguments (the kernel function with reserved parameters), checked by
    the carver's GEMV rules first."""
    from .space import require

    problem = make_problem(M, N, K, dtype, out_dtype)
    config = GemvConfig(block_N=block_N, block_K=block_K, thread_num=thread_num, vec=vec, path=path,
                        num_stages=num_stages, split_k=split_k, tma=tma)
    require(problem, config)
    return program(problem, config)
