"""GEMM autotuning written the way TileLang's examples write it, running on tilecarve.

    python examples/gemm/example_gemm_dropin.py --m 4096 --n 4096 --k 4096 --use_autotune --with_roller
    python examples/gemm/example_gemm_dropin.py --use_autotune                 # TileLang's 288-config grid
    python examples/gemm/example_gemm_dropin.py --use_autotune --with_roller --mode decorator

The calls, argument names and flags are TileLang's (``AutoTuner.from_kernel(...).set_compile_args(...)
.set_profile_args(...).run(...)``, ``@autotune(...)`` over ``@tilelang.jit(out_idx=...)``,
``MatmulTemplate(...).with_arch(CUDA(...)).recommend_hints(...)``, ``kernel.get_profiler()``); only
the import lines name tilecarve's packages (docs/dropin.md has the mapping). Without
``--use_autotune`` the carver's top-1 hint is compiled with ``tilelang.jit`` and nothing is tuned.

Needs a CUDA GPU: without one it says so and exits with status 2.
"""

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing

import tilelang  # noqa: E402  (after the path line above)
import tilelang.language as T  # noqa: E402

from autotuner import AutoTuner, autotune  # noqa: E402  (TileLang: tilelang.autotuner)
from carver.arch import CUDA  # noqa: E402  (TileLang: tilelang.carver.arch)
from carver.roller.rasterization import NoRasterization  # noqa: E402  (TileLang: tilelang.carver.roller.rasterization)
from carver.template import MatmulTemplate  # noqa: E402  (TileLang: tilelang.carver.template)


def ref_program(A, B):
    """C = A @ B^T, B stored (N, K)."""
    return A @ B.T


def get_configs(M, N, K, with_roller=False, topk=10, arch="cuda"):
    """The carver's ``topk`` hints as kernel configs, or TileLang's 288-config grid."""
    if not with_roller:
        grid = itertools.product([64, 128, 256], [64, 128, 256], [32, 64], [0, 1, 2, 3], [128, 256], [True, False])
        keys = ("block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization")
        return [dict(zip(keys, values)) for values in grid]
    template = MatmulTemplate(M=M, N=N, K=K, in_dtype=T.float16, out_dtype=T.float16,
                              accum_dtype=T.float32).with_arch(CUDA(arch))
    assert template.equivalent_function() is not None
    configs = []
    for hint in template.recommend_hints(topk=topk):
        block_m, block_n = hint.block
        warp_m, warp_n = hint.warp
        configs.append({
            "block_M": block_m,
            "block_N": block_n,
            "block_K": hint.rstep[0],
            "num_stages": hint.pipeline_stage if hint.pipeline_stage > 1 else 0,
            "thread_num": (block_m // warp_m) * (block_n // warp_n) * 32,
            "enable_rasterization": not isinstance(hint.rasterization_plan, NoRasterization),
        })
    return configs  # two hints may map to one config here (stages 0 and 1): the AutoTuner keeps one


def matmul(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2, thread_num=128,
           enable_rasterization=True, dtype=T.float16, accum_dtype=T.float32):
    """The kernel factory: every tunable is a keyword parameter, as the AutoTuner's configs name them."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.use_swizzle(panel_size=10, enable=enable_rasterization)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm


def roller_configs(M, N, K):
    return get_configs(M, N, K, with_roller=True)


@autotune(configs=roller_configs, warmup=3, rep=20, ref_prog=ref_program)
@tilelang.jit(out_idx=[-1])
def matmul_autotuned(M, N, K, block_M=128, block_N=128, block_K=32, num_stages=2, thread_num=128,
                     enable_rasterization=True):
    return matmul(M, N, K, block_M, block_N, block_K, num_stages, thread_num, enable_rasterization)


def get_best_config(M, N, K, with_roller=False, profile_backend="event"):
    def kernel(block_M=None, block_N=None, block_K=None, num_stages=None, thread_num=None,
               enable_rasterization=None):
        return matmul(M, N, K, block_M, block_N, block_K, num_stages, thread_num, enable_rasterization)

    autotuner = (AutoTuner.from_kernel(kernel=kernel, configs=get_configs(M, N, K, with_roller))
                 .set_compile_args(out_idx=[-1], target="auto")
                 .set_profile_args(supply_type=tilelang.TensorSupplyType.Auto, ref_prog=ref_program,
                                   skip_check=False, backend=profile_backend))
    return autotuner.run(warmup=3, rep=20)


def main(M=4096, N=4096, K=4096, use_autotune=False, with_roller=False, profile_backend="event", mode="api"):
    import torch

    if not torch.cuda.is_available():
        print("example_gemm_dropin: no CUDA GPU here; run it on a GPU machine (`python -m pytest -m nvcc "
              "tests/test_dropin.py` compiles its kernel for sm_90a without one).", file=sys.stderr)
        return 2
    if use_autotune and mode == "decorator":
        kernel = matmul_autotuned(M, N, K)
        print(f"decorator: tuned over {len(roller_configs(M, N, K))} carver configs")
    elif use_autotune:
        result = get_best_config(M, N, K, with_roller=with_roller, profile_backend=profile_backend)
        print(f"best config {result.config}: {result.latency:.4f} ms (reference {result.ref_latency:.4f} ms)")
        kernel = result.kernel
    else:
        config = get_configs(M, N, K, with_roller=True, topk=1)[0]  # the carver's top-1: no tuning
        print(f"carver's top-1 config {config}")
        kernel = tilelang.jit(out_idx=[-1])(matmul)(M, N, K, **config)

    profiler = kernel.get_profiler(tensor_supply_type=tilelang.TensorSupplyType.Auto)
    tilelang_latency = profiler.do_bench(backend=profile_backend)
    ref_latency = profiler.do_bench(ref_program, backend=profile_backend)
    profiler.assert_allclose(ref_program, atol=1e-2, rtol=1e-2)
    print(f"TileLang latency: {tilelang_latency}")
    print(f"Ref latency: {ref_latency}")
    print(f"TileLang TFlops: {2 * M * N * K / tilelang_latency * 1e-9}")
    print(f"Ref TFlops: {2 * M * N * K / ref_latency * 1e-9}")
    return 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Autotuned MatMul Benchmark (TileLang's flags, tilecarve underneath)")
    parser.add_argument("--m", type=int, default=4096, help="Matrix dimension M")
    parser.add_argument("--n", type=int, default=4096, help="Matrix dimension N")
    parser.add_argument("--k", type=int, default=4096, help="Matrix dimension K")
    parser.add_argument("--use_autotune", action="store_true", default=False, help="Tune instead of the carver's top-1")
    parser.add_argument("--with_roller", action="store_true", default=False, help="Tune the carver's hints")
    parser.add_argument("--profile_backend", type=str, default="event", help="Profiler backend (event or cudagraph)")
    parser.add_argument("--mode", choices=["api", "decorator"], default="api",
                        help="AutoTuner chain or @autotune decorator (the decorator tunes the carver's hints)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    args = parse_args()
    sys.exit(main(args.m, args.n, args.k, args.use_autotune, args.with_roller, args.profile_backend, args.mode))
