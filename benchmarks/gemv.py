"""GEMV on the GPU: the exhaustive grid, the carver's top-8 against it, bandwidth against a copy, and the
tuned kernel against torch (cuBLAS). One process, its own time limit, JSON written after every shape.

    . .gpu/setup.sh && python3 benchmarks/gemv.py --out $OUT/gemv            # about 10-14 minutes
    python3 benchmarks/gemv.py --out $OUT/gemv --steps grid,holdout          # split over two calls
    python3 benchmarks/gemv.py --quick --out /tmp/gemv                        # about 2 minutes

Steps (``--steps grid,holdout,torch,bandwidth``; all but ``bandwidth`` by default):

* ``grid``: every config of ``templates.gemv.space`` (both paths: 72 SIMT, up to 40 mma) for the
  calibration shapes (M = 1 and 16 on 4096x4096 and 11008x4096, fp16), each checked against the fp32
  product (zero mismatches at atol = rtol = 1e-2) and timed; files ``grid/<M>x<N>x<K>-<dtype>.json`` in
  ``benchmarks/measure_gemm_grid.py``'s format (``summary`` + ``results``, with ``family: gemv``), so
  ``benchmarks/hint_quality.py --data DIR`` scores them offline.
* ``holdout``: the same on shapes not in the calibration data (Llama-3-8B), and the carver's best of
  top-8 (``templates.gemv.candidates`` for the local GPU) as a fraction of the exhaustive best.
* ``torch``: M = 1, 4, 16 on the Llama-3-8B weights (4096x4096, 14336x4096, 4096x14336, 128256x4096):
  the best of the carver's top-8 against ``x @ W.T`` (cuBLAS) and against ``dst.copy_(src)`` of the
  weight bytes, in interleaved rounds; bandwidth = weight bytes / time, a copy's = 2 x its bytes / time
  (it reads and writes them); geomean speedup per M.
* ``bandwidth``: M = 1 and 16 on the same weights: the carver's top-8, torch and the copy, each timed
  three ways in interleaved rounds (``bandwidth.json``): alone after a flush that writes L2 (the
  tuner's), alone after one that reads it, and streamed (``benchlib.Streamed``: back to back over
  copies of the weights larger than L2, in a CUDA graph), where every call pays for all its own traffic.

Timing: ``autotuner.timing.time_callable`` with CUDA events (``--backend event``, the default), every
call timed alone after an L2 flush, so the weights stream from HBM as they do in a model. With
``--backend cudagraph`` the flush comes only before each graph replay: weights that fit in L2 (60 MB
on an H200) stay resident after the graph's first call, and bandwidth is overstated (measured on an
H200, 2026-11-21: 5.7 TB/s for a 32 MB weight, above the HBM's 4.8).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from benchlib import T0, compile_all, dump, log, mismatches, poisoned_call, round_order  # noqa: E402

CAL = [(1, 4096, 4096), (16, 4096, 4096), (1, 11008, 4096), (16, 11008, 4096)]
HOLDOUT = [(1, 14336, 4096), (4, 4096, 14336), (16, 14336, 4096), (4, 128256, 4096)]
LLAMA = [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]
MS = (1, 4, 16)
QUICK_CAL = [(1, 4096, 4096), (16, 4096, 4096)]
QUICK_HOLDOUT = [(4, 4096, 14336)]
QUICK_LLAMA = [(4096, 4096), (14336, 4096)]


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from carver.arch import CUDA

        self.args, self.torch = args, torch
        self.deadline = T0 + args.time_limit
        self.arch = CUDA("cuda")
        self.device = torch.cuda.get_device_name()
        self.out = Path(args.out)
        self.flush = torch.empty(256 * 2**20, dtype=torch.int8, device="cuda")

    def left(self) -> float:
        return self.deadline - time.time()

    def time(self, fn: Any, rep: int | None = None) -> float:
        from autotuner.timing import time_callable

        return time_callable(fn, 5, rep or self.args.rep, "cuda", backend=self.args.backend).median_ms

    def inputs(self, M: int, N: int, K: int, dtype: str) -> tuple[Any, Any, Any]:
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(M * 1000003 + N * 7 + K)
        dt = getattr(torch, dtype)
        x = torch.randn(M, K, device="cuda", generator=g).to(dt)
        W = (torch.randn(N, K, device="cuda", generator=g) / math.sqrt(K)).to(dt)
        ref = (x.float() @ W.float().T)
        return x, W, ref

    def compile_all(self, problem: Any, configs: list[Any]) -> list[tuple[Any, Any, float, str | None]]:
        from templates.gemv import GEMV

        return compile_all(GEMV, problem, configs, self.args.jobs)

    def measure(self, M: int, N: int, K: int, dtype: str, configs: list[Any] | None = None) -> dict[str, Any]:
        """Compile, check and time ``configs`` (default: the whole space) for one shape."""
        torch = self.torch
        from templates.gemv import GEMV, GemvProblem

        problem = GemvProblem(M, N, K, dtype)
        space = GEMV.space(problem) if configs is None else configs
        hints = GEMV.candidates(problem, self.arch, 8)
        todo = space + [h for h in hints if h not in space]
        x, W, ref = self.inputs(M, N, K, dtype)
        t = time.time()
        built = self.compile_all(problem, todo)
        compile_wall = time.time() - t
        t = time.time()
        results = []
        for cfg, k, cs, err in built:
            row = {"config": cfg.to_dict(), "compile_s": cs, "error": err, "ms": None, "gbps": None,
                   "correct": None}
            if k is not None and self.left() > 5:
                try:
                    y = poisoned_call(k, (x, W))
                    bad = mismatches(y, ref)
                    row["correct"] = bad == 0
                    row["mismatches"] = bad
                    if bad == 0:
                        row["ms"] = self.time(lambda k=k: k(x, W))
                        row["gbps"] = problem.weight_bytes / row["ms"] / 1e6
                except Exception as e:  # a kernel that fails at run time is recorded too
                    row["error"] = f"{type(e).__name__}: {str(e)[-400:]}"
                    torch.cuda.synchronize()
            elif k is not None:
                row["error"] = "skipped: time limit"
            results.append(row)
        ok = [r for r in results if r["ms"] is not None]
        best = min(ok, key=lambda r: r["ms"]) if ok else None
        by_cfg = {json.dumps(r["config"], sort_keys=True): r for r in results}
        hint_ms = [by_cfg[json.dumps(h.to_dict(), sort_keys=True)]["ms"] for h in hints]
        measured = [m for m in hint_ms if m is not None]
        top8 = [m for m in hint_ms[:8] if m is not None]
        torch_ms = self.time(lambda: x @ W.T)
        summary = {
            "family": "gemv", "device": self.device, "M": M, "N": N, "K": K, "dtype": dtype,
            "weight_bytes": problem.weight_bytes, "cublas_ms": torch_ms, "backend": self.args.backend,
            "n_configs": len(todo), "compile_wall_s": compile_wall, "bench_wall_s": time.time() - t,
            "best": best, "hints": [{"config": h.to_dict(), "ms": m} for h, m in zip(hints, hint_ms)],
            "carver_top1_vs_best": (best["ms"] / hint_ms[0]) if best and hint_ms[0] else None,
            "carver_top8_vs_best": (best["ms"] / min(top8)) if best and top8 else None,
            # what tune() measures: the top-8 and, on a GPU with TMA, its two cp.async variants
            "carver_candidates_vs_best": (best["ms"] / min(measured)) if best and measured else None,
            "mismatching_configs": sum(1 for r in results if r["correct"] is False),
        }
        return {"summary": summary, "results": results}

    # ------------------------------------------------------------------ steps
    def grid(self, shapes: list[tuple[int, int, int]], sub: str) -> list[dict[str, Any]]:
        out = []
        for M, N, K in shapes:
            if self.left() < 30:
                log(f"{sub}: time limit, skipping {M}x{N}x{K}")
                continue
            data = self.measure(M, N, K, self.args.dtype)
            dump(self.out / sub / f"{M}x{N}x{K}-{self.args.dtype}.json", data)
            s = data["summary"]
            b = s["best"]
            b = b or {"ms": float("nan"), "gbps": float("nan"), "config": None}
            log(f"{sub} {M}x{N}x{K}: best {b['ms']:.4} ms ({b['gbps']:.0f} GB/s) {b['config']}; "
                f"top-1 {s['carver_top1_vs_best']}, top-8 {s['carver_top8_vs_best']}; torch {s['cublas_ms']:.4} ms; "
                f"mismatching configs {s['mismatching_configs']}")
            out.append(s)
        return out

    def versus_torch(self, weights: list[tuple[int, int]]) -> list[dict[str, Any]]:
        from templates.gemv import GEMV, GemvProblem

        rows = []
        for N, K in weights:
            for M in MS:
                if self.left() < 20:
                    log(f"torch: time limit, skipping {M}x{N}x{K}")
                    continue
                problem = GemvProblem(M, N, K, self.args.dtype)
                hints = GEMV.candidates(problem, self.arch, 8)
                x, W, ref = self.inputs(M, N, K, self.args.dtype)
                built = [b for b in self.compile_all(problem, hints) if b[1] is not None]
                ok = []
                for cfg, k, _, _ in built:
                    y = k(x, W)
                    if bool(self.torch.isclose(y.float(), ref, atol=1e-2, rtol=1e-2).all()):
                        ok.append((self.time(lambda k=k, x=x, W=W: k(x, W)), cfg, k))
                if not ok:
                    rows.append({"M": M, "N": N, "K": K, "error": "no top-8 config compiled and checked"})
                    continue
                _, cfg, k = min(ok, key=lambda o: o[0])
                src = W.view(-1)
                dst = self.torch.empty_like(src)
                arms = {"ours": lambda k=k, x=x, W=W: k(x, W), "cublas": lambda x=x, W=W: x @ W.T,
                        "copy": lambda d=dst, s=src: d.copy_(s)}
                got: dict[str, list[float]] = {name: [] for name in arms}
                for r in range(self.args.rounds):  # interleaved and rotated, so clock drift hits all three alike
                    for name in round_order(arms, r):
                        got[name].append(self.time(arms[name]))
                ours, cublas, copy = got["ours"], got["cublas"], got["copy"]
                med = sorted(ours)[len(ours) // 2], sorted(cublas)[len(cublas) // 2], sorted(copy)[len(copy) // 2]
                row = {"M": M, "N": N, "K": K, "dtype": self.args.dtype, "config": cfg.to_dict(), "ms": med[0],
                       "torch_ms": med[1], "copy_ms": med[2], "speedup_vs_torch": med[1] / med[0],
                       # a copy moves the bytes twice (read and write): its bandwidth counts both
                       "gbps": problem.weight_bytes / med[0] / 1e6,
                       "copy_gbps": 2 * problem.weight_bytes / med[2] / 1e6,
                       "bw_vs_copy": med[2] / (2 * med[0]), "rounds": {"ours": ours, "torch": cublas, "copy": copy}}
                log(f"torch {M}x{N}x{K}: ours {med[0]*1e3:.1f} us, torch {med[1]*1e3:.1f} us "
                    f"({row['speedup_vs_torch']:.3f}x), {row['gbps']:.0f} GB/s = {row['bw_vs_copy']:.3f} of copy")
                rows.append(row)
                dump(self.out / "versus_torch.json", {"device": self.device, "rows": rows})
        return rows


    def bandwidth(self, weights: list[tuple[int, int]], ms: tuple[int, ...]) -> list[dict[str, Any]]:
        """The carver's top-8 (``--bandwidth-space top8``) or the whole grid, its SIMT configs with twice
        its deepest unroll and its mma configs with 6 and 8 stages (``all``), torch and a copy of the
        weight bytes, each timed three ways in interleaved rounds: alone after a flush that writes L2 (the
        tuner's), alone after one that reads it, and streamed (:class:`benchlib.Streamed`: back to back
        over copies larger than L2, in a CUDA graph)."""
        from benchlib import Streamed, copies_past_l2, median

        from autotuner.timing import time_callable
        from templates.gemv import GEMV, GemvProblem

        torch, rows = self.torch, []
        for N, K in weights:
            for M in ms:
                if self.left() < 30:
                    log(f"bandwidth: time limit, skipping {M}x{N}x{K}")
                    continue
                problem = GemvProblem(M, N, K, self.args.dtype)
                x, W, ref = self.inputs(M, N, K, self.args.dtype)
                configs = GEMV.candidates(problem, self.arch, 8)
                if self.args.bandwidth_space == "all":
                    deeper = [dataclasses.replace(c, block_K=2 * c.block_K) for c in GEMV.space(problem)
                              if c.path == "simt" and c.block_K == c.thread_num // c.block_N * 8 * 8]
                    deeper += [dataclasses.replace(c, num_stages=s) for c in GEMV.space(problem)
                               if c.path == "mma" and c.num_stages == 4 for s in (6, 8)]
                    configs += [c for c in GEMV.space(problem) + deeper
                                if c not in configs and not GEMV.check(problem, c, self.arch)]
                built = [b for b in self.compile_all(problem, configs) if b[1]]
                fns: dict[str, Any] = {}
                for cfg, k, _, _ in built:
                    if bool(torch.isclose(k(x, W).float(), ref, atol=1e-2, rtol=1e-2).all()):
                        fns[json.dumps(cfg.to_dict(), sort_keys=True)] = k
                n = copies_past_l2(problem.weight_bytes)
                Ws = [W] + [W.clone() for _ in range(n - 1)]
                srcs = [w.view(-1) for w in Ws]
                dsts = [torch.empty_like(s) for s in srcs]
                calls = {name: [(lambda k=k, w=w, x=x: k(x, w)) for w in Ws] for name, k in fns.items()}
                calls["torch"] = [(lambda w=w, x=x: x @ w.T) for w in Ws]
                calls["copy"] = [(lambda d=d, s=s: d.copy_(s)) for d, s in zip(dsts, srcs)]
                streams = {name: Streamed(fs, 4 * n) for name, fs in calls.items()}
                times: dict[str, dict[str, list[float]]] = {m: {name: [] for name in calls}
                                                            for m in ("write", "read", "stream")}
                for r in range(self.args.rounds):  # interleaved and rotated, so clock drift hits every arm alike
                    for name in round_order(calls, r):
                        fs = calls[name]
                        for how in ("write", "read"):
                            times[how][name].append(time_callable(fs[0], 5, self.args.rep, "cuda",
                                                                  flush=how).median_ms)
                        times["stream"][name].append(streams[name].time(20))
                row: dict[str, Any] = {"M": M, "N": N, "K": K, "dtype": self.args.dtype, "copies": n,
                                       "weight_bytes": problem.weight_bytes, "rounds": times}
                for how, arms in times.items():
                    med = {name: median(v) for name, v in arms.items()}
                    best = min((m, name) for name, m in med.items() if name not in ("torch", "copy"))
                    row[how] = {"best_config": json.loads(best[1]), "ms": best[0], "torch_ms": med["torch"],
                                "copy_ms": med["copy"], "speedup_vs_torch": med["torch"] / best[0],
                                "gbps": problem.weight_bytes / best[0] / 1e6,
                                "copy_gbps": 2 * problem.weight_bytes / med["copy"] / 1e6,
                                "bw_vs_copy": med["copy"] / (2 * best[0]), "configs": med}
                log(f"bandwidth {M}x{N}x{K}: " + "; ".join(
                    f"{how} {r['ms'] * 1e3:.1f} us {r['gbps']:.0f} GB/s = {r['bw_vs_copy']:.3f} of copy "
                    f"({r['copy_gbps']:.0f}), {r['speedup_vs_torch']:.3f}x torch"
                    for how, r in ((h, row[h]) for h in ("write", "read", "stream"))))
                rows.append(row)
                dump(self.out / "bandwidth.json", {"device": self.device, "rows": rows})
                del Ws, srcs, dsts, calls, streams
                torch.cuda.empty_cache()
        return rows


def bandwidth_table(rows: list[dict]) -> str:
    lines = ["| M | N x K | timing | ours us | GB/s | copy GB/s | of copy | torch us | speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for how in ("write", "read", "stream"):
            b = r[how]
            lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {how} | {b['ms'] * 1e3:.1f} | {b['gbps']:.0f} | "
                         f"{b['copy_gbps']:.0f} | {b['bw_vs_copy']:.3f} | {b['torch_ms'] * 1e3:.1f} | "
                         f"{b['speedup_vs_torch']:.3f} |")
    return "\n".join(lines)


def table(grid: list[dict], holdout: list[dict], rows: list[dict]) -> str:
    lines = ["| shape | set | best us | GB/s | top-1 | best of top-8 | torch us |", "|---|---|---|---|---|---|---|"]
    for name, ss in (("calibration", grid), ("holdout", holdout)):
        for s in ss:
            b = s["best"] or {}
            f = (lambda v: f"{v:.3f}" if v is not None else "-")  # noqa: E731
            lines.append(f"| {s['M']}x{s['N']}x{s['K']} | {name} | {(b.get('ms') or 0) * 1e3:.1f} | "
                         f"{b.get('gbps') or 0:.0f} | {f(s['carver_top1_vs_best'])} | {f(s['carver_top8_vs_best'])} "
                         f"| {s['cublas_ms'] * 1e3:.1f} |")
    lines += ["", "| M | N x K | ours us | torch us | speedup | GB/s | of copy |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {r['error']} |  |  |  |  |")
            continue
        lines.append(f"| {r['M']} | {r['N']}x{r['K']} | {r['ms'] * 1e3:.1f} | {r['torch_ms'] * 1e3:.1f} | "
                     f"{r['speedup_vs_torch']:.3f} | {r['gbps']:.0f} | {r['bw_vs_copy']:.3f} |")
    for M in MS:
        sp = [r["speedup_vs_torch"] for r in rows if r.get("M") == M and "error" not in r]
        if sp:
            lines.append(f"\ngeomean speedup vs torch, M={M}: {math.exp(sum(map(math.log, sp)) / len(sp)):.3f} "
                         f"over {len(sp)} weights")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="two calibration shapes, one holdout, two weights")
    p.add_argument("--steps", default="grid,holdout,torch")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--time-limit", type=float, default=450.0, help="seconds; later shapes are skipped")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile threads")
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--backend", default="event", choices=("cudagraph", "event"))
    p.add_argument("--bandwidth-space", default="top8", choices=("top8", "all"))
    p.add_argument("--bandwidth-m", default="1,16", help="rows of x for the bandwidth step, comma-separated")
    p.add_argument("--weights", help="NxK,NxK,...: the weights of the torch and bandwidth steps (default: Llama's)")
    args = p.parse_args()
    steps = set(args.steps.split(","))
    weights = ([tuple(map(int, w.split("x"))) for w in args.weights.split(",")] if args.weights
               else QUICK_LLAMA if args.quick else LLAMA)
    b = Bench(args)
    log(f"{b.device}; carver arch {b.arch.name}; out {b.out}")
    grid, holdout, rows, bw = [], [], [], []
    try:
        if "grid" in steps:
            grid = b.grid(QUICK_CAL if args.quick else CAL, "grid")
        if "holdout" in steps:
            holdout = b.grid(QUICK_HOLDOUT if args.quick else HOLDOUT, "holdout")
        if "torch" in steps:
            rows = b.versus_torch(weights)
        if "bandwidth" in steps:
            bw = b.bandwidth(weights, tuple(map(int, args.bandwidth_m.split(","))))
    except Exception:
        traceback.print_exc()
    finally:
        text = table(grid, holdout, rows) + ("\n\n" + bandwidth_table(bw) if bw else "")
        print(text)
        b.out.mkdir(parents=True, exist_ok=True)
        (b.out / "summary.md").write_text(text + "\n")
        dump(b.out / "summary.json", {"device": b.device, "grid": grid, "holdout": holdout, "versus_torch": rows,
                                      "bandwidth": bw,
                                      "wall_s": time.time() - T0})


if __name__ == "__main__":
    main()
