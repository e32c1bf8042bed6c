"""A kernel for the keyed-tuning tests (tests/test_keyed.py) on TileLang's C target: C = 2*A + B for
an (M, N) problem. Every store is guarded, so one config serves any M, static or symbolic
(``T.dynamic``). TileLang reads kernels through inspect, so it lives in a file."""

import tilelang.language as T

from kernels import trust_helper


def scale_add(M, N, block_M: int = 32, block_N: int = 32, dtype: str = "float32"):
    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M and bx * block_N + j < N:
                    C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j] * 2
                                                             + B[by * block_M + i, bx * block_N + j])

    return main


def scale_add_helper(M, N, block_M: int = 32, block_N: int = 32, dtype: str = "float32"):
    """scale_add + trust_helper.bias(block_M): the helper, reached through a module attribute, is outside the
    tuning key, so tests edit it to change what one config elaborates to."""
    bias = trust_helper.bias(block_M)

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M and bx * block_N + j < N:
                    C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j] * 2
                                                             + B[by * block_M + i, bx * block_N + j] + bias)

    return main


def scale_add_skipping_last_row(M, N, block_M: int = 32, block_N: int = 32, dtype: str = "float32"):
    """scale_add that never writes its last row: wrong at every M, unless the output's memory already holds it."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M - 1 and bx * block_N + j < N:
                    C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j] * 2
                                                             + B[by * block_M + i, bx * block_N + j])

    return main


def ref_scale_add(A, B):
    return A * 2 + B


def key_of(A, B):
    return {"M": A.shape[0], "N": A.shape[1], "dtype": A.dtype}


CONFIGS = [{"block_M": 16, "block_N": 64}, {"block_M": 64, "block_N": 64}]
EDGES = [8, 64]


def make_keyed(db_path=None, target="c", fn=scale_add, **kwargs):
    """The keyed kernel the tests (and their fresh subprocesses) build: M bucketed at 8 and 64."""
    from autotuner import KeyedKernel

    kwargs.setdefault("dynamic", ["M"])
    kwargs.setdefault("configs", CONFIGS)
    tuning = {"n_jobs": 2, "progress": False, **({"db_path": str(db_path)} if db_path else {})}
    return KeyedKernel(fn, ["M", "N", "dtype"], key_of=key_of, buckets={"M": EDGES},
                       compile_args={"out_idx": [-1], "ref_prog": ref_scale_add, "target": target},
                       tuning_args=tuning, warmup=1, rep=3, **kwargs)


def scale_add_skipping(M, N, block_M: int = 32, block_N: int = 32, skip: int = 0, dtype: str = "float32"):
    """scale_add that leaves its last ``skip`` rows unwritten: a config with ``skip=1`` is wrong at every M."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                if by * block_M + i < M - skip and bx * block_N + j < N:
                    C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j] * 2
                                                             + B[by * block_M + i, bx * block_N + j])

    return main
