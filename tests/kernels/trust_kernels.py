"""Hostile kernels for the trust tests (C target): they write to their inputs, accumulate into their
outputs, update arguments in place, or change with a helper module. TileLang reads them through
inspect, so they live in a file."""

import os
import time

import tilelang.language as T

from kernels import trust_helper

M = 64
N = 64


def add_clobber(block_M: int = 32, block_N: int = 32, clobber: str = "", threads: int = 1):
    """C = A + B; then, for clobber="B" (or "A"), zero that input's tile after using it."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]
            if clobber == "B":
                for i, j in T.Parallel(block_M, block_N):
                    B[by * block_M + i, bx * block_N + j] = 0.0
            if clobber == "A":
                for i, j in T.Parallel(block_M, block_N):
                    A[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] * 0.5

    return main


def add_accumulate(block_M: int = 32, block_N: int = 32, threads: int = 1):
    """C += A + B: correct only when C starts at zero (as an atomic-add kernel)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = C[by * block_M + i, bx * block_N + j] + A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


def scale_inplace(block_M: int = 32, block_N: int = 32):
    """X = 2 * X + Y, in place on X."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                X[by * block_M + i, bx * block_N + j] = X[by * block_M + i, bx * block_N + j] * 2.0 + Y[by * block_M + i, bx * block_N + j]

    return main


def ref_scale(X, Y):
    return X * 2 + Y


def add_helper(block_M: int = 32, block_N: int = 32):
    """C = A + B + trust_helper.bias(block_M); the factory hangs where trust_helper.hang_for says."""
    while trust_helper.hang_for(block_M):
        time.sleep(0.05)
    bias = trust_helper.bias(block_M)

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j] + bias

    return main


def add_loud(block_M: int = 32, block_N: int = 32):
    """Fails to elaborate with a long message whose first words name the fault."""
    raise ValueError(f"block_M={block_M} cannot work: the first line names the fault. " + "details " * 1200)


def add_by_process(block_M: int = 32, block_N: int = 32, elsewhere: str = "other"):
    """C = A + B, as ``add_clobber`` writes it, in a compile worker (which hides the GPU:
    CUDA_VISIBLE_DEVICES=""); in any other process another program (elsewhere="other": C = B + A, as
    right and never timed) or none (elsewhere="raise")."""
    in_worker = os.environ.get("CUDA_VISIBLE_DEVICES") == ""
    if not in_worker and elsewhere == "raise":
        raise RuntimeError("this factory only elaborates in a compile worker")
    swap = not in_worker

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if swap:
                    C[by * block_M + i, bx * block_N + j] = B[by * block_M + i, bx * block_N + j] + A[by * block_M + i, bx * block_N + j]
                else:
                    C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


def add_trap(block_M: int = 32, block_N: int = 32, threads: int = 128, trap: bool = False):
    """C = A + B; with ``trap``, a device-side assert that fails in every thread first, which leaves the
    CUDA context unusable (a sticky error) on a GPU."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if trap:
                T.device_assert(bx < 0, "trap")
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = A[by * block_M + i, bx * block_N + j] + B[by * block_M + i, bx * block_N + j]

    return main


def ref_add(A, B):
    return A + B


def div_guarded(block_M: int = 32, guard: bool = False):
    """C = A / B; guard=True writes 0 where B == 0 instead of +-inf: wrong where the reference is infinite."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                if guard and B[by * block_M + i, j] == T.float32(0):
                    C[by * block_M + i, j] = T.float32(0)
                else:
                    C[by * block_M + i, j] = A[by * block_M + i, j] / B[by * block_M + i, j]

    return main


def tril(block_M: int = 32, skip_zeros: bool = False, dtype: str = "uint8"):
    """C = tril(A); skip_zeros=True never writes the upper triangle (it counts on a zeroed buffer): wrong
    for an output allocated with torch.empty, and 0 is the first poison of unsigned integers and bools."""
    zero = T.cast(0, dtype)

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                if j <= by * block_M + i:
                    C[by * block_M + i, j] = A[by * block_M + i, j]
                elif not skip_zeros:
                    C[by * block_M + i, j] = zero

    return main


def add_helper_work(block_M: int = 16, work: int = 1):
    """C = A + B + trust_helper.bias(work), the store repeated ``work`` times: a larger work is slower, the
    result the same, so the fastest config is known."""
    bias = trust_helper.bias(work)

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for w in T.serial(work):
                for i, j in T.Parallel(block_M, N):
                    C[by * block_M + i, j] = A[by * block_M + i, j] + B[by * block_M + i, j] + bias + w * 0.0

    return main


def affine(block_M: int = 32, dtype: str = "int32", scale: int = 1000, extra: int = 0):
    """C = A * scale + B + extra * A: with extra=1 off the reference A * scale + B by A (0.1% for scale=1000)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                C[by * block_M + i, j] = (A[by * block_M + i, j] * T.cast(scale, dtype) + B[by * block_M + i, j]
                                          + A[by * block_M + i, j] * T.cast(extra, dtype))

    return main


def small_sum(block_M: int = 32, zero: bool = False):
    """C = (A + B) * 1e-3, values of about 1e-3; zero=True writes 0 everywhere instead."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                if zero:
                    C[by * block_M + i, j] = T.float32(0)
                else:
                    C[by * block_M + i, j] = (A[by * block_M + i, j] + B[by * block_M + i, j]) * T.float32(1e-3)

    return main


def add_and_corner(block_M: int = 32, wrong_corner: bool = False):
    """Two outputs: C = A + B (4096 elements) and D = A[0, 0] (one element), or A[0, 0] + 1 if wrong_corner."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32"),
             D: T.Tensor((1,), "float32")):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                C[by * block_M + i, j] = A[by * block_M + i, j] + B[by * block_M + i, j]
            if by == 0:
                D[0] = A[0, 0] + (T.float32(1) if wrong_corner else T.float32(0))

    return main


def add_forgetting_return(block_M: int = 32, forget: bool = False):
    """C = A + B, except that forget=True falls off the end without returning the PrimFunc (None)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), B: T.Tensor((M, N), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, N):
                C[by * block_M + i, j] = A[by * block_M + i, j] + B[by * block_M + i, j]

    if not forget:
        return main
