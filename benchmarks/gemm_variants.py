"""Do the template's Hopper variants pay? The carver's top-k, each also as ``warp_policy="full_row"`` and as
a persistent kernel (``templates.matmul.hopper_variants``), all tuned in one AutoTuner run per shape;
then cuBLAS, the best grid-expressible hint and the best variant timed side by side in this process.

Run on the GPU machine from the repository root (tilelang importable, e.g. after ``. .gpu/setup.sh``):

    python benchmarks/gemm_variants.py --out .bench/variants
    python benchmarks/gemm_variants.py --out .bench/variants --shapes 8192x8192x512 --dtypes bf16

Prints one table and writes ``variants.json`` and ``variants.md`` under ``--out``. The tuning database
and TileLang's kernel cache live under ``--out`` too, wiped first, so every run is cold.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import _cfg_label, _cublas_nt, _cuda_up, _environment, _error, _inputs, _shape, _tflops, _time_ms  # noqa: E402

LARGE = ("4096x4096x4096", "8192x8192x8192", "2048x14336x4096", "2048x4096x14336", "8192x8192x512",
         "4000x4000x4000")


def variant_class(cfg: dict[str, Any]) -> str:
    """"grid" (what TileLang's grid can express), "full_row", "persistent" or "persistent+full_row"."""
    parts = [p for p in ("persistent" if cfg.get("persistent") else "",
                         cfg.get("warp_policy", "square") if cfg.get("warp_policy", "square") != "square" else "")
             if p]
    if cfg.get("split_k", 1) > 1:
        parts.append("split_k")
    return "+".join(parts) or "grid"


def run_case(M: int, N: int, K: int, dtype: str, topk: int) -> dict[str, Any]:
    from templates import matmul as mm

    tmpl = mm.carver_template(M, N, K, dtype)
    hints = mm.hint_configs(tmpl, topk)
    variants = mm.hopper_variants(hints, M, N, K, tmpl.arch.sm_count, tmpl.arch.smem_per_block, dtype, dtype,
                                  top=topk)
    t0 = time.perf_counter()
    res = mm.tuner(M, N, K, dtype=dtype, configs=hints + variants).run(warmup=3, rep=20)
    row: dict[str, Any] = dict(M=M, N=N, K=K, dtype=dtype, tune_s=time.perf_counter() - t0,
                               n_hints=len(hints), n_variants=len(variants))
    best: dict[str, tuple[float, dict[str, Any]]] = {}
    for t in res.trials:
        if t.latency is None:
            continue
        cls = variant_class(t.config)
        if cls not in best or t.latency < best[cls][0]:
            best[cls] = (t.latency, t.config)
    row["trials"] = [dict(config=t.config, status=t.status, ms=t.latency, error=(t.error or "")[-300:])
                     for t in res.trials]
    row["best_by_class"] = {cls: dict(ms=ms, config=cfg) for cls, (ms, cfg) in best.items()}
    # Side by side in this process: cuBLAS, the best grid config, the tuned (best overall) kernel.
    c = dict(M=M, N=N, K=K, dtype=dtype)
    a, b = _inputs(c)
    ref = _cublas_nt(a, b)
    row["cublas_ms"] = _time_ms(functools.partial(_cublas_nt, a, b))
    kernels = {"tuned": (res.config, res.kernel)}
    if "grid" in best and best["grid"][1] != res.config:
        kernels["grid"] = (best["grid"][1], mm.compile(M, N, K, best["grid"][1], dtype=dtype))
    elif "grid" in best:
        kernels["grid"] = kernels["tuned"]
    for name, (cfg, fn) in kernels.items():
        try:
            out = fn(a, b)
            row[f"{name}_err"] = float((out.float() - ref.float()).abs().max().item())
            row[f"{name}_ms"] = _time_ms(functools.partial(fn, a, b))
            row[f"{name}_config"] = cfg
        except Exception as e:  # noqa: BLE001 - reported in the row
            row[f"{name}_error"] = _error(e)
    for name in ("cublas", "grid", "tuned"):
        row[f"{name}_tflops"] = _tflops(c, row.get(f"{name}_ms"))
    return row


def render(rows: list[dict[str, Any]], env: dict[str, Any], command: str) -> str:
    classes = sorted({cls for r in rows for cls in r.get("best_by_class", {})}, key=lambda s: (s != "grid", s))
    head = ["shape", "dtype", "cuBLAS", "best grid hint", "tuned", "tuned / cuBLAS", "grid / cuBLAS"]
    head += [f"{cls} / grid (tuner)" for cls in classes if cls != "grid"] + ["tuned config"]
    lines = [f"Device: {env.get('device')} ({env.get('sms')} SMs), {env.get('cpus')} CPUs; torch {env.get('torch')}, "
             f"tilelang {env.get('tilelang')}; {env.get('date')}", f"Command: `{command}`", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['M']}x{r['N']}x{r['K']} | {r['dtype']} | error: {r['error'][:80]} |")
            continue
        f = lambda v, s=".0f": "-" if v is None else format(v, s)  # noqa: E731
        ratio = lambda x, y: (x / y) if x and y else None  # noqa: E731
        bbc = r["best_by_class"]
        grid_ms = bbc.get("grid", {}).get("ms")
        cells = [f"{r['M']}x{r['N']}x{r['K']}", r["dtype"], f(r.get("cublas_tflops")), f(r.get("grid_tflops")),
                 f(r.get("tuned_tflops")), f(ratio(r.get("tuned_tflops"), r.get("cublas_tflops")), ".3f"),
                 f(ratio(r.get("grid_tflops"), r.get("cublas_tflops")), ".3f")]
        cells += [f(ratio(grid_ms, bbc.get(cls, {}).get("ms")), ".3f") for cls in classes if cls != "grid"]
        cells.append(_cfg_label(r.get("tuned_config")))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "TFLOP/s from CUDA events, L2 flushed, median of 100 calls, in one process. "
              "`<class> / grid (tuner)`: speed of the class's best over the best grid-expressible hint, "
              "both as the autotuner timed them (> 1: the variant is faster)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", nargs="+", default=list(LARGE), help="MxNxK ...")
    ap.add_argument("--dtypes", default="fp16", help="comma-separated: fp16,bf16")
    ap.add_argument("--topk", type=int, default=4, help="carver hints per shape, each with its variants")
    args = ap.parse_args(argv)
    dtypes = [{"fp16": "float16", "bf16": "bfloat16"}.get(d, d) for d in args.dtypes.split(",")]
    shapes = [_shape(s) for s in args.shapes]
    cache = args.out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    os.environ["TILECARVE_CACHE_DIR"] = str(cache / "tilecarve")
    os.environ["TILELANG_CACHE_DIR"] = str(cache / "tilelang")
    _cuda_up()
    env = dict(_environment(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    command = "python benchmarks/gemm_variants.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = []
    for (M, N, K) in shapes:
        for dtype in dtypes:
            print(f"[variants] {M}x{N}x{K} {dtype}", flush=True)
            try:
                rows.append(run_case(M, N, K, dtype, args.topk))
            except Exception as e:  # noqa: BLE001 - one failed shape is a row, not the end of the run
                rows.append(dict(M=M, N=N, K=K, dtype=dtype, error=_error(e)))
            r = rows[-1]
            print(f"    cuBLAS {r.get('cublas_tflops') or 0:.0f}  grid {r.get('grid_tflops') or 0:.0f}  tuned "
                  f"{r.get('tuned_tflops') or 0:.0f} TFLOP/s  {r.get('tuned_config')}", flush=True)
            (args.out / "variants.json").write_text(json.dumps(dict(env=env, command=command, rows=rows), indent=1))
    md = render(rows, env, command)
    (args.out / "variants.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
