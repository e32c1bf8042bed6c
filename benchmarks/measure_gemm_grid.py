"""(Adapted from ../shared/tools/measure_gemm_grid.py, which does not travel to the GPU machine: the same
kernel, grid, timing and file format, so its files and the shared grid files compare;
benchmarks/measure_hints.py reuses its kernel and grid. The one change: triton is imported when
measuring, not at import, so ``--help`` and ``from measure_gemm_grid import gemm`` work without it.)

Anchor measurement on a GPU: tilelang's own carver hints vs an exhaustive grid vs cuBLAS.

Usage (on the GPU machine, tilelang on PYTHONPATH):
    python3 benchmarks/measure_gemm_grid.py M N K [--grid] [--topk 20] [--out results.json]

Records, for one fp16 GEMM C = A @ B.T (A: MxK, B: NxK):
  * torch.matmul (cuBLAS) latency,
  * every carver top-k hint (rank order kept) compiled + timed,
  * with --grid, the 288-config grid of tilelang's example_gemm_autotune,
  * wall time of compilation (threaded, like tilelang's autotuner).
"""
import argparse, itertools, json, os, sys, time, traceback
from concurrent.futures import ThreadPoolExecutor

import torch
import tilelang
import tilelang.language as T


def gemm(M, N, K, block_M, block_N, block_K, num_stages, thread_num, enable_rasterization,
         dtype="float16", accum_dtype="float"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), dtype)
            T.use_swizzle(panel_size=10, enable=enable_rasterization)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])
    return main


def carver_configs(M, N, K, topk):
    from tilelang.carver.template import MatmulTemplate
    from tilelang.carver.arch import CUDA
    from tilelang.carver.roller.rasterization import NoRasterization
    t = time.time()
    tmpl = MatmulTemplate(M=M, N=N, K=K, in_dtype="float16", out_dtype="float16",
                          accum_dtype="float").with_arch(CUDA("cuda"))
    hints = tmpl.recommend_hints(topk=topk)
    dt = time.time() - t
    out = []
    for h in hints:
        bm, bn = h.block
        wm, wn = h.warp
        out.append(dict(block_M=bm, block_N=bn, block_K=h.rstep[0],
                        num_stages=h.pipeline_stage if h.pipeline_stage > 1 else 0,
                        thread_num=(bm // wm) * (bn // wn) * 32,
                        enable_rasterization=h.rasterization_plan is not NoRasterization))
    return out, dt


def grid_configs():
    keys = ["block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization"]
    vals = [[64, 128, 256], [64, 128, 256], [32, 64], [0, 1, 2, 3], [128, 256], [True, False]]
    return [dict(zip(keys, v)) for v in itertools.product(*vals)]


def key(c):
    return tuple(sorted(c.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("M", type=int); ap.add_argument("N", type=int); ap.add_argument("K", type=int)
    ap.add_argument("--grid", action="store_true")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from triton.testing import do_bench  # only to measure: --help and the kernel's importers need no triton
    M, N, K = a.M, a.N, a.K
    flops = 2 * M * N * K
    dev = torch.cuda.get_device_name()
    A = torch.randn(M, K, device="cuda", dtype=torch.float16)
    B = torch.randn(N, K, device="cuda", dtype=torch.float16)
    ref = A @ B.T
    cublas_ms = do_bench(lambda: A @ B.T, warmup=25, rep=100)
    print(f"[{dev}] {M}x{N}x{K} cuBLAS {cublas_ms*1e3:.1f} us  {flops/cublas_ms/1e9:.1f} TFLOP/s", flush=True)

    hint_cfgs, carver_s = carver_configs(M, N, K, a.topk)
    print(f"carver recommend_hints(topk={a.topk}) took {carver_s:.2f} s, gave {len(hint_cfgs)}", flush=True)
    cfgs = {key(c): c for c in hint_cfgs}
    if a.grid:
        for c in grid_configs():
            cfgs.setdefault(key(c), c)
    todo = list(cfgs.values())

    def build(c):
        t = time.time()
        try:
            k = tilelang.compile(gemm(M, N, K, **c), out_idx=[-1], target="cuda")
            return k, None, time.time() - t
        except Exception as e:
            return None, f"{type(e).__name__}: {str(e)[-200:]}", time.time() - t

    t0 = time.time()
    with ThreadPoolExecutor(a.workers) as ex:
        built = list(ex.map(build, todo))
    compile_wall = time.time() - t0
    print(f"compiled {len(todo)} configs in {compile_wall:.1f} s wall ({a.workers} workers); "
          f"failures {sum(1 for b in built if b[0] is None)}", flush=True)

    results = []
    t1 = time.time()
    for c, (k, err, ct) in zip(todo, built):
        r = dict(config=c, compile_s=ct, error=err)
        if k is not None:
            try:
                out = k(A, B)
                torch.cuda.synchronize()
                ok = torch.allclose(out.float(), ref.float(), atol=1e-1, rtol=1e-2)
                ms = do_bench(lambda: k(A, B), warmup=10, rep=50)
                r.update(ms=ms, tflops=flops / ms / 1e9, correct=bool(ok))
            except Exception as e:
                r["error"] = f"run {type(e).__name__}: {str(e)[-200:]}"
        results.append(r)
    bench_wall = time.time() - t1

    good = [r for r in results if r.get("ms") and r.get("correct")]
    best = min(good, key=lambda r: r["ms"]) if good else None
    hint_keys = [key(c) for c in hint_cfgs]
    by_key = {key(r["config"]): r for r in results}
    hint_ms = [by_key[h].get("ms") if by_key[h].get("correct") else None for h in hint_keys]
    summ = dict(device=dev, M=M, N=N, K=K, cublas_ms=cublas_ms, cublas_tflops=flops / cublas_ms / 1e9,
                carver_s=carver_s, n_configs=len(todo), compile_wall_s=compile_wall, bench_wall_s=bench_wall,
                best=best, hints=[dict(config=hint_cfgs[i], ms=hint_ms[i]) for i in range(len(hint_cfgs))])
    if best:
        for k_ in (1, 5, 10, 20):
            ms = [m for m in hint_ms[:k_] if m]
            summ[f"carver_top{k_}_vs_best"] = (best["ms"] / min(ms)) if ms else None
        print(f"best of {len(good)} ok configs: {best['config']} {best['tflops']:.1f} TFLOP/s "
              f"({best['ms']/cublas_ms:.2f}x cuBLAS latency)")
        for k_ in (1, 5, 10, 20):
            v = summ[f"carver_top{k_}_vs_best"]
            print(f"  carver best-of-top{k_}: {v if v is None else round(v, 3)} of best-found perf")
    print("hint ranks (TFLOP/s):", [round(flops / m / 1e9) if m else None for m in hint_ms])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(summary=summ, results=results), f, indent=1, default=str)


if __name__ == "__main__":
    main()
