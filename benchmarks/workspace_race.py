"""Why the split-K workspace is a scratch parameter (autotuner.scratch): the same two-kernel split-K GEMM,
once with its partials in ``T.alloc_global`` (TVM's per-thread workspace pool, as tilecarve had it before
2026-11-28) and once as tilecarve builds it now, run on two CUDA streams of one thread at once and
replayed from a CUDA graph after a larger split-K call. Counts the wrong outputs of each.

    python3 benchmarks/workspace_race.py --out results.json

Writes one JSON object: per build (each in a process of its own), rounds run and rounds wrong on two
streams, and whether the graph's replay was right (or the error it raised). H200, 2026-11-28: the pooled
build was right on two streams in 50 of 50 rounds, and its graph replay raised an illegal memory
access (the pool had freed the captured block to grow); the scratch build is tests/test_matmul_gpu.py's
``test_split_k_is_right_on_two_streams_at_once_and_in_a_cuda_graph``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tilelang.language as T  # noqa: E402


def pooled(M, N, K, split_k, block_M=64, block_N=128, block_K=64, num_stages=3, threads=128):
    """The split-K GEMM (C = A @ B.T, fp16 in and out) with its fp32 partials in T.alloc_global."""
    k_tiles = (K // split_k) // block_K

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float16")):
        W = T.alloc_global((split_k, M, N), "float32")
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=threads) as (bx, by, bz):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_N, block_K), "float16")
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(k_tiles, num_stages=num_stages):
                T.copy(A[by * block_M, (bz * k_tiles + k) * block_K], A_s)
                T.copy(B[bx * block_N, (bz * k_tiles + k) * block_K], B_s)
                T.gemm(A_s, B_s, acc, transpose_B=True)
            T.copy(acc, W[bz, by * block_M, bx * block_N])
        with T.Kernel(T.ceildiv(N, 128), T.ceildiv(M, 16), threads=128) as (rx, ry):
            s = T.alloc_fragment((16, 128), "float32")
            T.clear(s)
            for z in T.serial(split_k):
                for i, j in T.Parallel(16, 128):
                    s[i, j] += W[z, ry * 16 + i, rx * 128 + j]
            T.copy(s, C[ry * 16, rx * 128])

    return main


def current(M, N, K, split_k):
    import templates.matmul as mm

    return mm.compile(M, N, K, dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128,
                                     enable_rasterization=False, split_k=split_k))


def trial(kernel, bigger, M, N, K, rounds):
    import torch

    g = torch.Generator(device="cuda").manual_seed(0)
    ins = [(torch.randn(M, K, device="cuda", generator=g).half(), torch.randn(N, K, device="cuda", generator=g).half())
           for _ in range(2)]
    refs = [(a.float() @ b.float().T) for a, b in ins]
    streams = [torch.cuda.Stream() for _ in ins]
    wrong = 0
    for _ in range(rounds):
        outs = []
        for s, (a, b) in zip(streams, ins):
            with torch.cuda.stream(s):
                outs.append(kernel(a, b))
        torch.cuda.synchronize()
        wrong += any(not torch.allclose(o.float(), r, atol=1e-1, rtol=1e-2) for o, r in zip(outs, refs))
    graph = {}
    try:
        a, b = ins[0]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            kernel(a, b)
        torch.cuda.current_stream().wait_stream(side)
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            out = kernel(a, b)
        a2 = torch.randn(2 * M, K, device="cuda", generator=g).half()
        b2 = torch.randn(2 * N, K, device="cuda", generator=g).half()
        bigger(a2, b2)
        torch.cuda.synchronize()
        a.copy_(torch.randn(M, K, device="cuda", generator=g).half())
        gr.replay()
        torch.cuda.synchronize()
        graph["right"] = bool(torch.allclose(out.float(), a.float() @ b.float().T, atol=1e-1, rtol=1e-2))
    except Exception as e:  # noqa: BLE001 - what the pooled build does under capture is the finding
        graph["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return {"rounds": rounds, "wrong_rounds": wrong, "graph": graph}


BUILDS = ("pooled", "scratch")  # T.alloc_global as before 2026-11-28; a scratch parameter, as now
M, N, K = 64, 4096, 8192


def run_arm(build: str, rounds: int) -> dict:
    """One build's trial, in this process (an illegal address poisons the CUDA context for good)."""
    import tilelang

    if build == "pooled":
        def make(m, n, s):
            return tilelang.compile(pooled(m, n, K, s), out_idx=[-1], target="cuda")
    else:
        def make(m, n, s):
            return current(m, n, K, s)
    return trial(make(M, N, 4), make(2 * M, 2 * N, 8), M, N, K, rounds)


def main() -> None:
    import subprocess

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--arm", choices=BUILDS, help=argparse.SUPPRESS)  # the child's: one build, JSON on stdout
    a = ap.parse_args()
    if a.arm:
        print("RESULT " + json.dumps(run_arm(a.arm, a.rounds)), flush=True)
        return
    import torch

    res = {"device": torch.cuda.get_device_name(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "shape": [M, N, K], "split_k": 4}
    for build in BUILDS:  # each in a process of its own
        p = subprocess.run([sys.executable, __file__, "--out", a.out, "--rounds", str(a.rounds), "--arm", build],
                           capture_output=True, text=True)
        line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
        res[build] = json.loads(line[7:]) if line else {"exit": p.returncode, "stderr": p.stderr[-600:]}
        Path(a.out).write_text(json.dumps(res, indent=1))
        print(build, res[build], flush=True)


if __name__ == "__main__":
    main()
