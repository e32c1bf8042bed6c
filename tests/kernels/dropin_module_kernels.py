"""Kernel factories written as TileLang's examples write them, reaching the autotuner through the
module (``@tilelang.autotune``, ``@tl.autotune``, ``tl.autotuner.AutoTuner``), with only the import
line changed to tilecarve's (tests/test_dropin_module.py, C target). TileLang reads kernels through
inspect, so they live in a file."""

import tilelang.language as T

import tilecarve.tilelang as tilelang
import tilecarve.tilelang as tl
from templates import matmul

from . import c_kernels, dropin_kernels

CONFIGS = [dict(block_M=16, block_N=32), dict(block_M=32, block_N=32), dict(block_M=32, block_N=64)]
# block_N=64 leaves half of C unwritten; tilecarve's NaN-poisoned outputs reject it
CONFIGS_WITH_A_BUG = [dict(block_M=32, block_N=32), dict(block_M=32, block_N=64)]


def ref_scale_add(A, B):
    return 2 * A + B


def ref_add(A, B):
    return A + B


# dropin_kernels.scale_add's factory (C = 2 A + B, every config correct), decorated through the module
scale_add = tilelang.autotune(configs=CONFIGS, warmup=1, rep=3, ref_prog=ref_scale_add)(
    tilelang.jit(out_idx=[-1], target="c", pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})(
        dropin_kernels.scale_add.factory))


@tl.autotune(configs=CONFIGS_WITH_A_BUG, warmup=1, rep=3, ref_prog=ref_add)
@tl.jit(out_idx=[-1], target="c")
def add_half_unwritten(M, N, block_M=32, block_N=32, dtype=T.float32):
    """C = A + B, except that block_N=64 writes only the first half of each tile."""
    cols = block_N // 2 if block_N == 64 else block_N

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), B: T.Tensor((M, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
            for i, j in T.Parallel(block_M, cols):
                C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j]
                                                         + B[by * block_M + i, bx * block_N + j])

    return main


def tune_with_module_autotuner():
    """TileLang's chained form reached as ``tl.autotuner.AutoTuner`` (as example_gemm_autotune.py builds it)."""
    return (tl.autotuner.AutoTuner.from_kernel(kernel=c_kernels.add_buggy, configs=CONFIGS_WITH_A_BUG)
            .set_compile_args(out_idx=[-1], target="c")
            .set_profile_args(ref_prog=ref_add)
            .run(warmup=1, rep=3))


# tilecarve's GEMM template decorated as TileLang's dequant examples declare theirs (no target: the GPU's)
gemm = tilelang.autotune(configs=[dict(block_M=128, block_N=128, block_K=64, num_stages=2, thread_num=128,
                                       enable_rasterization=True)], warmup=3, rep=20)(
    tilelang.jit(out_idx=[-1], pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})(matmul.kernel))


@tl.autotune(configs=CONFIGS, warmup=1, rep=3)
@tl.jit(target="c")
def eager_add(A, B, block_M=32, block_N=32):
    """TileLang's eager style (tensors as arguments, T.const / T.empty), as example_gemv.py's kernels."""
    M, N = T.const("M, N")
    A: T.Tensor((M, N), T.float32)
    B: T.Tensor((M, N), T.float32)
    C = T.empty((M, N), T.float32)
    with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=1) as (bx, by):
        for i, j in T.Parallel(block_M, block_N):
            C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j]
                                                     + B[by * block_M + i, bx * block_N + j])
    return C
