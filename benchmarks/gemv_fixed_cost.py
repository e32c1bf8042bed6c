"""Where a small GEMV's fixed cost goes: register-fed mma kernels against the family's configs and a copy.

At 32 MB of weights (4096x4096 fp16) the family's kernels reach 0.78-0.83 of a device-to-device copy's
bandwidth at M = 4 and 16 (streamed, H200), where the target is 0.9: they pay about 3.5 us of launch,
ramp-up and tail against the copy's 2.1. This script times, streamed (``benchlib.Streamed``) and in
interleaved rounds, candidate programs with every load 16 bytes wide and no shared-memory staging of W:
``mma.sync`` fed from registers (W as the B operand, x as A, K permuted per thread so that each thread's
8 consecutive k feed two m16n8k16 steps), against the family's own top-8 and best-known configs, torch
and a copy. Output: ``fixed_cost.json`` and a log under ``--out``.

    python3 benchmarks/gemv_fixed_cost.py --out /tmp/gfc --time-limit 300
"""

# No `from __future__ import annotations`: TileLang reads the T.prim_func annotations.

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchlib import Streamed, copies_past_l2, dump, log, median  # noqa: E402


def regmma(M, N, K, R, U, wk, wn, unroll_steps, dtype="float16", out_dtype="float16"):
    """y = x @ W.T with m16n8k16 mma.sync from registers: a CTA of wk x wn warps owns 8 R wn rows of W;
    warps along N own 8 R rows each, warps along K split K; per step each thread loads R x U 16-byte
    vectors of W (its rows g, K chunk 8c of each 32) and U vectors of x rows g and g + 8."""
    import tilelang.language as T

    abbr = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    rows = 8 * R * wn
    kstep = wk * 32 * U
    steps = K // kstep
    assert K % kstep == 0, (K, kstep)
    nthreads = 32 * wk * wn
    loop = T.unroll if unroll_steps else T.serial

    @T.prim_func
    def main(x: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, rows), threads=nthreads) as bn:
            tid = T.get_thread_binding(0)
            warp = tid // 32
            wkk = warp % wk
            wnn = warp // wk
            lane = tid % 32
            g = lane // 4
            c = lane % 4
            wl = T.alloc_local((R * U * 8,), dtype)
            xg = T.alloc_local((U * 8,), dtype)
            xh = T.alloc_local((U * 8,), dtype)
            af = T.alloc_local((U * 16,), dtype)
            acc = T.alloc_local((R * 4,), "float32")
            red = T.alloc_shared((wk, wn * R * 128), "float32")
            for i in T.unroll(R * 4):
                acc[i] = T.float32(0)
            for s in loop(steps):
                kb = (s * wk + wkk) * (32 * U)
                for r in T.unroll(R):
                    for u in T.unroll(U):
                        for v in T.vectorized(8):
                            wl[(r * U + u) * 8 + v] = W[T.min(bn * rows + (wnn * R + r) * 8 + g, N - 1),
                                                        kb + u * 32 + c * 8 + v]
                for u in T.unroll(U):
                    if g < M:
                        for v in T.vectorized(8):
                            xg[u * 8 + v] = x[g, kb + u * 32 + c * 8 + v]
                    else:
                        for v in T.vectorized(8):
                            xg[u * 8 + v] = T.cast(0, dtype)
                    if g + 8 < M:
                        for v in T.vectorized(8):
                            xh[u * 8 + v] = x[g + 8, kb + u * 32 + c * 8 + v]
                    else:
                        for v in T.vectorized(8):
                            xh[u * 8 + v] = T.cast(0, dtype)
                for u in T.unroll(U):
                    for h in T.unroll(2):
                        for p in T.unroll(2):
                            for e in T.unroll(2):
                                af[(u * 2 + h) * 8 + p * 4 + e] = xg[u * 8 + h * 4 + p * 2 + e]
                                af[(u * 2 + h) * 8 + p * 4 + 2 + e] = xh[u * 8 + h * 4 + p * 2 + e]
                for r in T.unroll(R):
                    for u in T.unroll(U):
                        for h in T.unroll(2):
                            T.ptx_mma("float32", "m16n8k16", "row", "col", abbr, abbr, "fp32",
                                      af.data, (u * 2 + h) * 8, wl.data, (r * U + u) * 8 + h * 4,
                                      acc.data, r * 4, T.bool(False))
            for i in T.unroll(R * 4):
                red[wkk, (wnn * R * 4 + i) * 32 + lane] = acc[i]
            T.sync_threads()
            for j in T.serial(T.ceildiv(wn * R * 128, nthreads)):
                e = j * nthreads + tid
                if e < wn * R * 128:
                    tot = T.alloc_var("float32")
                    tot = T.float32(0)
                    for w in T.serial(wk):
                        tot += red[w, e]
                    i = e // 32  # (wnn * R + r) * 4 + q
                    ln = e % 32
                    q = i % 4
                    m = ln // 4 + (q // 2) * 8
                    n = bn * rows + (i // 4) * 8 + (ln % 4) * 2 + q % 2
                    if m < M and n < N:
                        y[m, n] = T.cast(tot, out_dtype)

    return main


def simt_xs(M, N, K, block_N, rt, unroll, dtype="float16", out_dtype="float16"):
    """The family's SIMT program with x staged in shared memory once per CTA (after W's first loads are
    issued), so that x is read from L2 once per CTA and W's loads cannot evict it from L1. A copy of
    ``templates.gemv.program``'s SIMT body with that one change: the family's program stays untouched
    (its source keys the tuning cache) until the change earns its place there."""
    import tilelang.language as T

    vec = 8
    block_K = rt * vec * unroll
    full = K // block_K
    assert K % block_K == 0
    offsets = [rt >> i for i in range(1, rt.bit_length())]

    @T.prim_func
    def main(x: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=(rt, block_N)) as bn:
            tk = T.get_thread_binding(0)
            tn = T.get_thread_binding(1)
            row = T.min(bn * block_N + tn, N - 1)
            w_loc = T.alloc_local((unroll, vec), dtype)
            x_loc = T.alloc_local((vec,), dtype)
            acc = T.alloc_local((M,), "float32")
            xs = T.alloc_shared((M, K), dtype)
            for m in T.unroll(M):
                acc[m] = T.float32(0)
            for u in T.unroll(unroll):
                for v in T.vectorized(vec):
                    w_loc[u, v] = W[row, (u * rt + tk) * vec + v]
            for i in T.serial(T.ceildiv(M * K // vec, rt * block_N)):
                e = (i * block_N + tn) * rt + tk
                if e < M * K // vec:
                    for v in T.vectorized(vec):
                        xs[e // (K // vec), (e % (K // vec)) * vec + v] = x[e // (K // vec), (e % (K // vec)) * vec + v]
            T.sync_threads()
            for b in T.serial(full):
                if b > 0:
                    for u in T.unroll(unroll):
                        for v in T.vectorized(vec):
                            w_loc[u, v] = W[row, b * block_K + (u * rt + tk) * vec + v]
                for u in T.unroll(unroll):
                    for m in T.unroll(M):
                        for v in T.vectorized(vec):
                            x_loc[v] = xs[m, b * block_K + (u * rt + tk) * vec + v]
                        for v in T.unroll(vec):
                            acc[m] += T.cast(w_loc[u, v], "float32") * T.cast(x_loc[v], "float32")
            for m in T.unroll(M):
                for off in offsets:
                    acc[m] += T.shfl_xor(acc[m], off, rt)
            if tk == 0 and bn * block_N + tn < N:
                for m in T.unroll(M):
                    y[m, bn * block_N + tn] = T.cast(acc[m], out_dtype)

    return main


def smem_mma(M, N, K, block_N, block_K, threads, stages, dtype="float16", out_dtype="float16"):
    """The plainest tensor-core GEMV in TileLang: a ``16 x block_N`` tile (x zero-filled past M), W and x
    through a ``stages``-deep ``T.Pipelined`` loop into shared memory, ``T.gemm`` with the warps along N."""
    import tilelang.language as T

    @T.prim_func
    def main(x: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), threads=threads) as bn:
            xs = T.alloc_shared((16, block_K), dtype)
            Ws = T.alloc_shared((block_N, block_K), dtype)
            C = T.alloc_fragment((16, block_N), "float32")
            T.clear(C)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=stages):
                T.copy(x[0, k * block_K], xs)
                T.copy(W[bn * block_N, k * block_K], Ws)
                T.gemm(xs, Ws, C, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
            T.copy(C, y[0, bn * block_N])

    return main


def build(name: dict, make: Callable[[], Any]) -> tuple[str, Any, str | None]:
    """``(name as JSON, kernel or None, error or None)``: ``make()``'s program compiled for the local GPU
    (without TMA and warp specialization when ``name["tma"]`` is False)."""
    import tilelang

    key = json.dumps(name, sort_keys=True)
    plain = {"tl.disable_tma_lower": True, "tl.disable_warp_specialized": True}
    try:
        return key, tilelang.compile(make(), out_idx=[-1], target="cuda",
                                     pass_configs=plain if name.get("tma") is False else None), None
    except Exception as e:  # a failing program is a result, recorded with its message
        return key, None, f"{type(e).__name__}: {str(e)[-300:]}"


def reg_space(K: int) -> list[dict]:
    out = []
    for R, U, wk, wn, un in itertools.product((1, 2, 4), (2, 4, 8, 16), (1, 2, 4, 8, 16), (1, 2, 4), (False, True)):
        threads = 32 * wk * wn
        if threads > 512 or R * U > 16 or K % (wk * 32 * U):
            continue
        steps = K // (wk * 32 * U)
        if un and steps > 16 or steps > 4 and wk < 4:
            continue
        out.append(dict(R=R, U=U, wk=wk, wn=wn, unroll_steps=un))
    return out


def sm_space(K: int, deep: bool = False) -> list[dict]:
    """The ``sm`` grid: with and without TMA; ``deep``: cp.async only, smaller K tiles, deeper pipelines,
    and 8-column tiles (one warp, one m16n8k16 column: 512 CTAs for N = 4096)."""
    grid = ((8, 16, 32, 64), (64, 128, 256), (32, 64, 128), (4, 6, 8), (False,)) if deep else \
        ((16, 32, 64), (256, 512, 1024), (32, 64, 128), (2, 4), (True, False))
    out = []
    for bn, bk, th, st, tma in itertools.product(*grid):
        if bn // (th // 32) < 8 or st * (16 + bn) * bk * 2 > 200 * 1024 or K % bk:
            continue
        out.append(dict(block_N=bn, block_K=bk, threads=th, stages=st, tma=tma))
    return out


def xs_space(M: int, K: int) -> list[dict]:
    out = []
    for bn, rt, un in itertools.product((1, 2, 4, 8, 16, 32), (8, 16, 32), (4, 8, 16)):
        if bn * rt % 32 or bn * rt > 1024 or K % (rt * 8 * un) or M * K * 2 > 160 * 1024:
            continue
        out.append(dict(block_N=bn, rt=rt, unroll=un))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--ms", default="4,16,1")
    p.add_argument("--weights", default="4096x4096")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--jobs", type=int, default=16)
    p.add_argument("--time-limit", type=float, default=300)
    p.add_argument("--paths", default="reg,xs,family", help="which programs to time, comma-separated")
    p.add_argument("--sm-deep", action="store_true", help="the sm programs' deeper grid (cp.async only)")
    args = p.parse_args()
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    from carver.arch import CUDA
    from templates.gemv import GEMV, GemvConfig, GemvProblem

    arch = CUDA("cuda")
    device = torch.cuda.get_device_name()
    rows = []
    for NK in args.weights.split(","):
        N, K = map(int, NK.split("x"))
        for M in map(int, args.ms.split(",")):
            if time.time() - t0 > args.time_limit - 40:
                log(f"time limit: skipping {M}x{N}x{K}")
                continue
            problem = GemvProblem(M, N, K)
            arms: dict[str, object] = {}

            paths = set(args.paths.split(","))
            fam = GEMV.candidates(problem, arch, 8) if "family" in paths else []
            if "family" in paths:
                for extra in (dict(block_N=1, block_K=4096, thread_num=32),
                              dict(path="mma", block_N=32, block_K=256, thread_num=128, num_stages=4),
                              dict(path="mma", block_N=64, block_K=256, thread_num=128, num_stages=4)):
                    c = GemvConfig(**extra)
                    if c not in fam and not GEMV.check(problem, c, arch):
                        fam.append(c)
            with ThreadPoolExecutor(args.jobs) as pool:
                jobs = [(dict(path="reg", **c), partial(regmma, M, N, K, **c))
                        for c in (reg_space(K) if "reg" in paths else [])]
                jobs += [(dict(path="xs", **c), partial(simt_xs, M, N, K, **c))
                         for c in (xs_space(M, K) if "xs" in paths else [])]
                sms = sm_space(K, args.sm_deep) if "sm" in paths else []
                jobs += [(dict(path="sm", **c), partial(smem_mma, M, N, K, c["block_N"], c["block_K"], c["threads"],
                                                        c["stages"])) for c in sms]
                jobs += [(c.to_dict(), partial(GEMV.program, problem, c)) for c in fam]
                built = list(pool.map(lambda job: build(*job), jobs))
            errors = {n: e for n, _, e in built if e}
            log(f"{M}x{N}x{K}: built {sum(1 for b in built if b[1])} of {len(built)} in {time.time() - t0:.0f} s")
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(M, K, device="cuda", dtype=torch.float16, generator=g)
            W = torch.randn(N, K, device="cuda", dtype=torch.float16, generator=g)
            ref = (x.float() @ W.float().T)
            wrong = {}
            for name, k, _ in built:
                if k is None:
                    continue
                out = k(x, W).float()
                if bool(torch.isclose(out, ref, atol=1e-2 * K ** 0.5, rtol=1e-2).all()):
                    arms[name] = k
                else:
                    wrong[name] = float((out - ref).abs().max())
            if wrong:
                log(f"{len(wrong)} wrong: {list(wrong.items())[:3]}")
            n = copies_past_l2(problem.weight_bytes)
            Ws = [W] + [W.clone() for _ in range(n - 1)]
            srcs = [w.view(-1) for w in Ws]
            dsts = [torch.empty_like(s) for s in srcs]
            calls = {name: [partial(k, x, w) for w in Ws] for name, k in arms.items()}
            calls["torch"] = [partial(torch.matmul, x, w.T) for w in Ws]
            # a read-only pass over the same bytes: torch's row sums (each row's fp32 sum, fp16 out)
            calls["rowsum"] = [partial(torch.sum, w, dim=1) for w in Ws]
            calls["copy"] = [(lambda d=d, s=s: d.copy_(s)) for d, s in zip(dsts, srcs)]
            streams = {name: Streamed(fs, 4 * n) for name, fs in calls.items()}
            times = {name: [] for name in calls}
            for _ in range(args.rounds):
                for name, st in streams.items():
                    times[name].append(st.time(20))
            med = {name: median(v) for name, v in times.items()}
            copy = med["copy"]
            ranked = sorted((v, k) for k, v in med.items() if k not in ("copy", "torch", "rowsum"))
            row = dict(M=M, N=N, K=K, device=device, copies=n, copy_ms=copy, torch_ms=med["torch"],
                       ms=med, of_copy={k: copy / (2 * v) for k, v in med.items()}, errors=errors, wrong=wrong)
            rows.append(row)
            kinds = {"reg": lambda k: '"reg"' in k, "xs": lambda k: '"xs"' in k, "sm": lambda k: '"sm"' in k,
                     "family": lambda k: not any(f'"{p}"' in k for p in ("reg", "xs", "sm"))}
            kinds = {k: v for k, v in kinds.items() if k in paths}
            for label, pick in kinds.items():
                b = min(((v, k) for v, k in ranked if pick(k)), default=None)
                if b:
                    log(f"{M}x{N}x{K} best {label}: {b[0] * 1e3:.2f} us = {copy / (2 * b[0]):.3f} of copy, "
                        f"{med['torch'] / b[0]:.3f}x torch  {b[1]}")
            log(f"{M}x{N}x{K} copy {copy * 1e3:.2f} us, torch {med['torch'] * 1e3:.2f} us, row sums "
                f"{med['rowsum'] * 1e3:.2f} us = {copy / (2 * med['rowsum']):.3f} of copy")
            log(f"{M}x{N}x{K} top-6: " + "; ".join(f"{v * 1e3:.2f} {k}" for v, k in ranked[:6]))
            dump(args.out / "fixed_cost.json", {"device": device, "rows": rows})
            del Ws, srcs, dsts, calls, streams, arms
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
