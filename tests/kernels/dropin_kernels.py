"""Kernels in TileLang's decorator form, for tests/test_dropin.py on the C target. TileLang reads
them through inspect, so they live in a file."""

import tilelang
import tilelang.language as T

from autotuner import autotune

CONFIGS = [dict(block_M=16, block_N=32), dict(block_M=32, block_N=32), dict(block_M=32, block_N=64)]


def ref_scale_add(A, B):
    return 2 * A + B


@autotune(configs=CONFIGS, warmup=1, rep=3, ref_prog=ref_scale_add)
@tilelang.jit(out_idx=[-1], target="c")
def scale_add(M, N, block_M=32, block_N=32, dtype="float32"):
    """C = 2 A + B, tiled; every config is correct."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j] * 2
                                                         + B[by * block_M + i, bx * block_N + j])

    return main


def scale_add_factory(M, N, block_M=32, block_N=32, dtype="float32"):
    """The same kernel as a plain factory, for the AutoTuner's chained form."""
    return scale_add.factory(M, N, block_M=block_M, block_N=block_N, dtype=dtype)


def supply_zero_b(params):
    """TileLang's supply_prog: A random, B zero. With B = 0, c_kernels.add_buggy's wrong config
    (A - B) agrees with the reference, so the tests can see whose inputs were used."""
    import torch

    assert [list(map(int, p.shape)) for p in params] == [[256, 256], [256, 256]], params
    return [torch.randn(256, 256), torch.zeros(256, 256)]


def supply_wrong_shape(params):
    import torch

    return [torch.zeros(8, 8) for _ in params]


def exact_check(outs, refs):
    """TileLang's manual_check_prog: raise when the outputs differ from the reference at all."""
    import torch

    for o, r in zip(outs, refs):
        assert torch.equal(o, r), f"max |diff| {(o - r).abs().max()}"


def accept_all(outs, refs):
    """A manual_check_prog that accepts anything: the unwritten-output check still applies."""
    return None
