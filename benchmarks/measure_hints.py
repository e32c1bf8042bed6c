"""Measure the carver's top-k hints against TileLang's 288-config grid on the local GPU.

Run on the GPU machine from the project root (tilelang and torch importable):

    . .gpu/setup.sh && python3 benchmarks/measure_hints.py 4000x4000x4000 64x4096x4096 --out $OUT

For each shape ``MxNxK`` (fp16, C = A @ B.T as in the shared grids; ``--dtype bfloat16`` too) it
compiles the carver's ``--topk`` hints plus the grid with a thread pool (like measure_gemm_grid.py),
checks every kernel against torch, times it with triton's ``do_bench`` (L2 flushed), and writes
``MxNxK.json`` in measure_gemm_grid.py's format (so ``benchmarks/hint_quality.py --data`` scores it),
with the carver's hints, predictions and measured top-k quality in the summary. At the end it prints,
per shape, the measured top-1 and best-of-top-k of the hints as fractions of the best config found
(grid or hint), and writes ``summary.json``.

Robustness: each shape runs in its own child process. A config that fails to compile or run is
recorded and skipped; a config that poisons the CUDA context ends its child, which is restarted on the
remaining configs (the culprit is recorded as crashed). Progress is appended to ``MxNxK.partial.jsonl``
so nothing measured is lost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
for p in (str(REPO), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

KEYS = ("block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization")


def config_key(cfg: dict[str, Any]) -> str:
    """A stable string id of a config (the six grid keys, plus panel_size/split_k when not default)."""
    parts = [f"{k}={int(cfg[k])}" for k in KEYS]
    for k, default in (("panel_size", 10), ("split_k", 1)):
        if int(cfg.get(k, default)) != default:
            parts.append(f"{k}={int(cfg[k])}")
    return ",".join(parts)


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        M, N, K = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise SystemExit(f"shape must look like 4096x4096x4096 (MxNxK), got {text!r}") from None
    if min(M, N, K) <= 0:
        raise SystemExit(f"shape dimensions must be positive, got {text!r}")
    return M, N, K


# ---------------------------------------------------------------------------------------------- child
def _event_bench(fn: Any, warmup: int = 10, rep: int = 50) -> float:
    """CUDA-event timing with an L2 flush before every call; median ms (``rep`` is a count here)."""
    import torch

    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    for _ in range(max(1, warmup // 2)):
        fn()
    times = []
    for _ in range(max(10, rep)):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _ensure_do_bench() -> None:
    """measure_gemm_grid.py imports triton's do_bench; where triton is missing, stand in for it."""
    try:
        import triton.testing  # noqa: F401
    except ImportError:
        import types

        triton = types.ModuleType("triton")
        testing = types.ModuleType("triton.testing")
        testing.do_bench = _event_bench  # type: ignore[attr-defined]
        triton.testing = testing  # type: ignore[attr-defined]
        sys.modules.setdefault("triton", triton)
        sys.modules.setdefault("triton.testing", testing)
        print("triton is not installed: timing with CUDA events (median, L2 flushed)", flush=True)


def _bench(fn: Any) -> float:
    """Milliseconds per call, as measure_gemm_grid.py times (triton's do_bench, L2 flushed)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=50))


def _kernel_func(M: int, N: int, K: int, cfg: dict[str, Any], dtype: str) -> Any:
    """The measured grids' exact program (measure_gemm_grid.gemm) for the plain configs; the project's
    template kernel for anything it alone takes (split_k, panel_size)."""
    if set(cfg) <= set(KEYS):
        from measure_gemm_grid import gemm

        return gemm(M, N, K, **cfg, dtype=dtype)
    from templates.matmul import kernel

    return kernel(M, N, K, **cfg, in_dtype=dtype, out_dtype=dtype)


def run_child(a: argparse.Namespace) -> int:
    import torch

    from autotuner.compile import tl_compile

    _ensure_do_bench()
    from measure_gemm_grid import grid_configs

    from carver import MatmulTemplate
    from carver.arch import CUDA

    M, N, K = parse_shape(a.child)
    dtype = a.dtype
    out_json = os.path.join(a.out, f"{M}x{N}x{K}.json")
    partial = os.path.join(a.out, f"{M}x{N}x{K}.partial.jsonl")
    torch_dtype = getattr(torch, dtype)
    flops = 2 * M * N * K
    dev = torch.cuda.get_device_name()
    torch.manual_seed(0)
    A = torch.randn(M, K, device="cuda", dtype=torch_dtype)
    B = torch.randn(N, K, device="cuda", dtype=torch_dtype)
    ref = A @ B.T
    cublas_ms = _bench(lambda: A @ B.T)
    print(f"[{dev}] {M}x{N}x{K} {dtype} cuBLAS {cublas_ms * 1e3:.1f} us {flops / cublas_ms / 1e9:.1f} TFLOP/s",
          flush=True)

    arch = CUDA(a.arch)
    t0 = time.perf_counter()
    tmpl = MatmulTemplate(M, N, K, in_dtype=dtype, out_dtype=dtype).with_arch(arch)
    hints = tmpl.recommend_hints(topk=a.topk)
    carver_s = time.perf_counter() - t0
    hint_cfgs = [h.to_config() for h in hints]
    predicted = {config_key(h.to_config()): h.prediction.latency_ms for h in hints}
    print(f"carver ({arch.name}) recommend_hints(topk={a.topk}) took {carver_s * 1e3:.1f} ms:", flush=True)
    for h in hints:
        print(f"  {h}", flush=True)

    todo: dict[str, dict[str, Any]] = {config_key(c): c for c in hint_cfgs}
    if a.grid:
        for c in grid_configs():
            todo.setdefault(config_key(c), c)

    # Resume: rows already measured, and the config that was running when a previous child died.
    done: dict[str, dict[str, Any]] = {}
    running = None
    if os.path.exists(partial):
        with open(partial) as f:
            for line in f:
                rec = json.loads(line)
                if "running" in rec:
                    running = rec["running"]
                else:
                    done[config_key(rec["config"])] = rec
                    running = None if running == config_key(rec["config"]) else running
    if running is not None and running not in done:
        done[running] = dict(config=todo.get(running, {}), compile_s=None, correct=False,
                             error="crashed the CUDA context (the child process was restarted)")
        with open(partial, "a") as f:
            f.write(json.dumps(done[running]) + "\n")
    pending = [c for k, c in todo.items() if k not in done]

    def build(c: dict[str, Any]) -> tuple[Any, str | None, float]:
        t = time.time()
        try:
            # tl_compile: a split-K config's workspace is a scratch parameter it allocates per call
            return tl_compile(_kernel_func(M, N, K, c, dtype), "cuda", out_idx=[-1]), None, time.time() - t
        except Exception as e:  # noqa: BLE001 - a failing config is a result, recorded with its error
            return None, f"{type(e).__name__}: {str(e)[-300:]}", time.time() - t

    t0 = time.time()
    with ThreadPoolExecutor(a.workers) as ex:
        built = list(ex.map(build, pending))
    compile_wall = time.time() - t0
    print(f"compiled {len(pending)} configs in {compile_wall:.1f} s ({a.workers} threads); failures "
          f"{sum(b[0] is None for b in built)}", flush=True)

    t1 = time.time()
    with open(partial, "a") as log:
        for c, (k, err, ct) in zip(pending, built):
            key = config_key(c)
            rec: dict[str, Any] = dict(config=c, compile_s=ct, error=err)
            if k is not None:
                log.write(json.dumps({"running": key}) + "\n")
                log.flush()
                try:
                    out = k(A, B)
                    torch.cuda.synchronize()
                    ok = bool(torch.allclose(out.float(), ref.float(), atol=1e-1, rtol=1e-2))
                    ms = _bench(lambda k=k: k(A, B))
                    rec.update(ms=ms, tflops=flops / ms / 1e9, correct=ok)
                except Exception as e:  # noqa: BLE001
                    rec["error"] = f"run {type(e).__name__}: {str(e)[-300:]}"
                    try:  # is the context still usable?
                        torch.cuda.synchronize()
                        (A[:1, :1] + 1).sum().item()
                    except Exception:  # noqa: BLE001
                        rec["error"] += " (CUDA context lost; restarting)"
                        log.write(json.dumps(rec) + "\n")
                        log.flush()
                        return 3
            log.write(json.dumps(rec) + "\n")
            log.flush()
            done[key] = rec
    bench_wall = time.time() - t1

    results = [done[k] for k in todo if k in done]
    good = [r for r in results if r.get("ms") and r.get("correct")]
    best = min(good, key=lambda r: r["ms"]) if good else None
    grid_keys = {config_key(c) for c in grid_configs()}
    grid_good = [r for r in good if config_key(r["config"]) in grid_keys]
    grid_best = min(grid_good, key=lambda r: r["ms"]) if grid_good else None
    hint_ms = []
    for c in hint_cfgs:
        r = done.get(config_key(c), {})
        hint_ms.append(r.get("ms") if r.get("correct") else None)
    summ: dict[str, Any] = dict(
        device=dev, M=M, N=N, K=K, dtype=dtype, out_dtype=dtype, arch=arch.name, carver="tilecarve",
        cublas_ms=cublas_ms, cublas_tflops=flops / cublas_ms / 1e9, carver_s=carver_s, n_configs=len(todo),
        compile_wall_s=compile_wall, bench_wall_s=bench_wall, best=best, grid_best=grid_best,
        hints=[dict(config=c, ms=m, predicted_ms=predicted[config_key(c)]) for c, m in zip(hint_cfgs, hint_ms)],
        date=time.strftime("%Y-%m-%d"))
    if best:
        for k_ in (1, 5, 8, 10):
            ms = [m for m in hint_ms[:k_] if m]
            summ[f"carver_top{k_}_vs_best"] = (best["ms"] / min(ms)) if ms else None
            summ[f"carver_top{k_}_vs_grid_best"] = (grid_best["ms"] / min(ms)) if ms and grid_best else None
    with open(out_json, "w") as f:
        json.dump(dict(summary=summ, results=results), f, indent=1, default=str)
    print(f"wrote {out_json}", flush=True)
    return 0


# --------------------------------------------------------------------------------------------- parent
def _summarise(path: str, topk: int) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        s = json.load(f)["summary"]
    return dict(shape=f"{s['M']}x{s['N']}x{s['K']}", device=s["device"], date=s.get("date"),
                top1=s.get("carver_top1_vs_best"), topk=s.get(f"carver_top{topk}_vs_best"),
                topk_vs_grid=s.get(f"carver_top{topk}_vs_grid_best"),
                best=s["best"]["config"] if s.get("best") else None,
                best_tflops=s["best"]["tflops"] if s.get("best") else None,
                hint1_tflops=(2 * s["M"] * s["N"] * s["K"] / s["hints"][0]["ms"] / 1e9)
                if s["hints"] and s["hints"][0]["ms"] else None,
                cublas_tflops=s["cublas_tflops"], carver_ms=s["carver_s"] * 1e3)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", nargs="*", help="MxNxK shapes, e.g. 4000x4000x4000 64x4096x4096")
    ap.add_argument("--arch", default="cuda", help="carver arch: 'cuda' (the local GPU) or a name")
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--no-grid", dest="grid", action="store_false", help="measure only the hints")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", default=None, help="output directory (default: ./hint-measurements-<date>)")
    ap.add_argument("--retries", type=int, default=3, help="restarts of a shape after a lost CUDA context")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    a.out = a.out or os.path.join(os.getcwd(), "hint-measurements-" + time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(a.out, exist_ok=True)
    if a.child:
        return run_child(a)
    if not a.shapes:
        ap.error("give at least one MxNxK shape")
    for s in a.shapes:
        parse_shape(s)
    print(f"writing to {os.path.abspath(a.out)}", flush=True)
    rows = []
    for shape in a.shapes:
        t0 = time.time()
        rc = None
        for attempt in range(1 + a.retries):
            cmd = [sys.executable, os.path.abspath(__file__), "--child", shape, "--out", a.out,
                   "--arch", a.arch, "--dtype", a.dtype, "--topk", str(a.topk), "--workers", str(a.workers)]
            if not a.grid:
                cmd.append("--no-grid")
            rc = subprocess.call(cmd)
            if rc == 0:
                break
            print(f"{shape}: child exited with {rc} (attempt {attempt + 1}); "
                  f"{'restarting on the remaining configs' if attempt < a.retries else 'giving up'}",
                  flush=True)
        M, N, K = parse_shape(shape)
        row = _summarise(os.path.join(a.out, f"{M}x{N}x{K}.json"), a.topk)
        if row is None:
            row = dict(shape=shape, error=f"no result (child exit code {rc})")
        row["wall_s"] = time.time() - t0
        rows.append(row)

    def f3(x: Any) -> str:
        return "  -  " if x is None else f"{x:.3f}"

    print(f"\nmeasured hint quality (top-{a.topk} of the carver vs the best config found, grid or hint)")
    print(f"{'shape':>17} | {'top1':>5} {'top' + str(a.topk):>5} {'vs grid':>7} | {'hint1 TF/s':>10} "
          f"{'best TF/s':>9} {'cuBLAS':>7} | {'wall s':>6}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:>17} | {r['error']}")
            continue
        print(f"{r['shape']:>17} | {f3(r['top1'])} {f3(r['topk'])} {f3(r['topk_vs_grid']):>7} | "
              f"{r['hint1_tflops'] or 0:10.1f} {r['best_tflops'] or 0:9.1f} {r['cublas_tflops']:7.1f} | "
              f"{r['wall_s']:6.0f}")
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1, default=str)
    print(f"wrote {os.path.join(a.out, 'summary.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
