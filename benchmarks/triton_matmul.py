"""Triton's tutorial matmul (tutorial 03, "Matrix Multiplication"), autotuned: the Triton column of
benchmarks/gemm.py.

The kernel is the tutorial's design written out here: one program per output tile, programs grouped
along M (``GROUP_M``) for L2 reuse, a K loop of ``tl.dot`` with fp32 accumulation, masked loads for the K
tail and masked stores for the M/N edges. Operands are taken through their strides, so any layout
(``A`` or ``A.T`` views) works without a copy. ``@triton.autotune`` picks among the tutorial's eight
CUDA fp16 configs, keyed on ``(M, N, K)`` as in the tutorial; the first call per key is the tuning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["TUTORIAL_CONFIGS", "matmul", "make_matmul"]

#: (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_stages, num_warps): the tutorial's CUDA configs for fp16.
TUTORIAL_CONFIGS: tuple[tuple[int, int, int, int, int, int], ...] = (
    (128, 256, 64, 8, 3, 8),
    (64, 256, 32, 8, 4, 4),
    (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
    (128, 32, 32, 8, 4, 4),
    (64, 32, 32, 8, 5, 2),
    (32, 64, 32, 8, 5, 2),
)


@functools.cache
def _jit_kernel() -> Any:
    """The ``@triton.jit`` kernel, built on first use so importing this module needs no Triton."""
    import triton
    import triton.language as tl

    @triton.jit
    def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                      stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr):
        pid = tl.program_id(axis=0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        per_group = GROUP_M * tiles_n
        group = pid // per_group
        first_m = group * GROUP_M
        rows_in_group = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % per_group) % rows_in_group)
        pid_n = (pid % per_group) // rows_in_group

        # wrap the row/column offsets so every load is in bounds; the store below masks the edges
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        rk = tl.arange(0, BLOCK_K)
        a_tile = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
        b_tile = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - k * BLOCK_K
            a = tl.load(a_tile, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_tile, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc)
            a_tile += BLOCK_K * stride_ak
            b_tile += BLOCK_K * stride_bk
        c = acc.to(c_ptr.dtype.element_ty)

        cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        tl.store(c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn, c,
                 mask=(cm[:, None] < M) & (cn[None, :] < N))

    return matmul_kernel


@functools.cache
def _autotuned(n_configs: int, quick_bench: bool) -> Any:
    import triton

    configs = [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g}, num_stages=s, num_warps=w)
        for bm, bn, bk, g, s, w in TUTORIAL_CONFIGS[:n_configs]
    ]
    kwargs: dict[str, Any] = {}
    if quick_bench:  # fewer timing reps per config (Triton's default is 25 ms warmup + 100 ms of reps)
        from triton.testing import do_bench

        kwargs["do_bench"] = lambda fn, quantiles: do_bench(fn, warmup=5, rep=20, quantiles=quantiles)
    try:
        return triton.autotune(configs=configs, key=["M", "N", "K"], **kwargs)(_jit_kernel())
    except TypeError:  # a Triton without autotune(do_bench=...): keep its default timing
        return triton.autotune(configs=configs, key=["M", "N", "K"])(_jit_kernel())


def make_matmul(n_configs: int = len(TUTORIAL_CONFIGS), quick_bench: bool = False) -> Callable[..., Any]:
    """``matmul(a, b) -> a @ b`` over the first ``n_configs`` tutorial configs.

    ``a`` is ``(M, K)`` and ``b`` is ``(K, N)``, any strides (pass ``B.T`` for a B stored ``(N, K)``).
    The output has ``a``'s dtype.
    """
    if not 1 <= n_configs <= len(TUTORIAL_CONFIGS):
        raise ValueError(f"n_configs must be in 1..{len(TUTORIAL_CONFIGS)}, got {n_configs!r}")

    def matmul(a: Any, b: Any) -> Any:
        import torch

        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
            raise ValueError(f"matmul needs a (M, K) and b (K, N), got {tuple(a.shape)} and {tuple(b.shape)}")
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        kernel = _autotuned(n_configs, quick_bench)

        def grid(meta: dict[str, int]) -> tuple[int]:
            return (((M + meta["BLOCK_M"] - 1) // meta["BLOCK_M"]) * ((N + meta["BLOCK_N"] - 1) // meta["BLOCK_N"]),)

        kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                     c.stride(0), c.stride(1))
        return c

    return matmul


#: The default: all eight tutorial configs, Triton's own autotune timing.
matmul = make_matmul()
