"""How much of a GEMM's time its last, partly filled wave of tiles costs, ours against cuBLAS.

A grid of T output tiles on P SMs runs ceil(T / P) waves; when T / P is not whole, the last wave leaves SMs
idle. This times one config at several M around a shape (so that the tile count crosses a whole number of
waves) and cuBLAS at the same M, back to back (50 calls between two CUDA events, no L2 flush: how a model's
forward runs them), in interleaved rounds, and prints time per tile and per unit of work. If our time moves
with the wave count and cuBLAS's with the work, the gap at that shape is the last wave.

    python3 benchmarks/wave_tail.py --out $OUT/wave --rounds 5 --time-limit 200

Writes ``<out>/wave_tail.json`` (every round) and ``<out>/wave_tail.md``. ``--cases`` is a JSON file of
``[{"N": ..., "K": ..., "Ms": [...], "configs": [{...}, ...]}]`` (or one ``"config"``): every config of a case
is compiled first (``--jobs`` at a time, checked against ``x @ W.T`` with C starting as poison), then timed
with cuBLAS in the same rounds. The default cases are the Llama-3-8B MLP's projections at 2048 and 8192 tokens
with the configs its tuned table picked on an H200 (2026-11-23). ``--symbolic`` also compiles every config with
M symbolic, as the matmul op serves it (one kernel per bucket), and times both forms in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import Clock, compile_all, config_id, dump, log, median, poisoned_call, round_order  # noqa: E402
from few_rows import back_to_back_ms, operands  # noqa: E402

from templates.matmul.op import gemm  # noqa: E402

_FR = {"block_K": 64, "block_M": 128, "block_N": 256, "num_stages": 3, "thread_num": 256, "warp_policy": "full_row"}
DEFAULT_CASES = [
    {"N": 4096, "K": 14336, "Ms": [1920, 2048, 2112], "config": {**_FR, "enable_rasterization": False}},
    {"N": 14336, "K": 4096, "Ms": [1792, 1920, 2048], "config": {**_FR, "enable_rasterization": True}},
    {"N": 4096, "K": 14336, "Ms": [7936, 8192, 8448], "config": {**_FR, "enable_rasterization": True}},
    {"N": 14336, "K": 4096, "Ms": [8064, 8192, 8448],
     "config": {"block_K": 64, "block_M": 192, "block_N": 224, "num_stages": 4, "thread_num": 256,
                "enable_rasterization": True}},
]


def cublas_kernel(x: Any, w: Any) -> str:
    """The name of the kernel ``x @ w.T`` launches (torch's profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        x @ w.T
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return ", ".join(dict.fromkeys(names)) or "?"


def short(cfg: dict[str, Any]) -> str:
    """A config in a table cell: its tile, stages and threads, then the keys off their defaults."""
    base = f"{cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} s{cfg['num_stages']} t{cfg['thread_num']}"
    tile_keys = ("block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization")
    plain = (0, 1, "square", "pipelined", "1x1", "workspace")
    extra = [f"{k}={v}" for k, v in cfg.items() if k not in tile_keys and (v not in plain or k == "panel_size")]
    return " ".join([base, "r" if cfg.get("enable_rasterization") else "", *extra]).replace("  ", " ")


def label(run: dict[str, Any]) -> str:
    """A run's config cell: the config, marked where it was compiled with M symbolic."""
    return ("symbolic M: " if run.get("form") else "") + short(run["config"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", type=Path, help="a JSON list of cases (see the module docstring)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=200)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--jobs", type=int, default=8, help="configs compiled at a time")
    ap.add_argument("--symbolic", action="store_true",
                    help="also time each config compiled with a symbolic M, as the matmul op serves it")
    args = ap.parse_args()
    import tilelang.language as T
    import torch

    from templates import matmul
    from templates.matmul.config import MatmulConfig

    cases = json.loads(args.cases.read_text()) if args.cases else DEFAULT_CASES
    clock = Clock(args.time_limit, 50)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for case in cases:
        N, K = case["N"], case["K"]
        configs = case.get("configs") or [case["config"]]
        for M in case["Ms"]:
            if clock.left() < 20:
                log("time limit: the remaining shapes are left out")
                break
            problem = matmul.make_problem(M, N, K, args.dtype)
            x, w = operands(M, N, K, args.dtype)
            ref = (x @ w.T).float()
            kernels = {}
            typed = [MatmulConfig.from_dict(c) for c in configs]
            forms = [("", compile_all(matmul.MATMUL, problem, typed, args.jobs))]
            if args.symbolic:  # the op's factory with M symbolic: what a bucket's kernel runs
                forms.append(("symbolic ", compile_all(matmul.MATMUL, problem, typed, args.jobs, build=lambda cfg, N=N,
                              K=K: gemm(T.dynamic("M"), N, K, args.dtype, **cfg.kernel_kwargs()))))
            for form, built in forms:
                for cfg, k, _, err in built:
                    if err is None:
                        try:  # C starts as poison: an element the kernel leaves unwritten cannot pass
                            torch.testing.assert_close(poisoned_call(k, (x, w)).float(), ref, atol=2e-2, rtol=2e-2)
                            kernels[form + config_id(cfg.to_dict())] = (cfg.to_dict(), k, form)
                            continue
                        except Exception as e:  # a wrong kernel is a result, not a reason to stop
                            err = str(e).splitlines()[0]
                    log(f"{M}x{N}x{K} {form}{cfg.to_dict()}: {err}")
                    runs.append({"M": M, "N": N, "K": K, "config": cfg.to_dict(), "form": form.strip(), "error": err})
            if not kernels:
                continue
            cub_kernel, cub_ms = cublas_kernel(x, w), []
            ours_ms: dict[str, list[float]] = {cid: [] for cid in kernels}
            for r in range(args.rounds):  # cuBLAS and each config, in an order rotated every round
                for cid in round_order(["cublas", *kernels], r):
                    if cid == "cublas":
                        cub_ms.append(back_to_back_ms(lambda x=x, w=w: x @ w.T))
                    else:
                        k = kernels[cid][1]
                        ours_ms[cid].append(back_to_back_ms(lambda k=k, x=x, w=w: k(x, w)))
            for cid, (cfg, _, form) in kernels.items():
                tiles = math.ceil(M / cfg["block_M"]) * math.ceil(N / cfg["block_N"])
                run = {"M": M, "N": N, "K": K, "config": cfg, "form": form.strip(), "tiles": tiles,
                       "waves": tiles / sms,
                       "cublas_kernel": cub_kernel, "ours_ms": ours_ms[cid], "cublas_ms": cub_ms,
                       "ours": median(ours_ms[cid]), "cublas": median(cub_ms)}
                log(f"{M}x{N}x{K}: {tiles} tiles ({tiles / sms:.2f} waves) ours {run['ours'] * 1e3:.1f} us, cuBLAS "
                    f"{run['cublas'] * 1e3:.1f} us ({run['cublas'] / run['ours']:.3f}); {cfg}; {cub_kernel}")
                runs.append(run)
            dump(args.out / "wave_tail.json", {"sms": sms, "device": torch.cuda.get_device_name(0), "runs": runs})
    lines = ["| M x N x K | config | tiles | waves | ours us | cuBLAS us | cuBLAS / ours | ours ns per GFLOP "
             "| cuBLAS ns per GFLOP | cuBLAS kernel |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['M']}x{r['N']}x{r['K']} | {label(r)} | failed: {r['error'][:80]} "
                         "|  |  |  |  |  |  |  |")
            continue
        gf = 2 * r["M"] * r["N"] * r["K"] / 1e9
        cells = [f"{r['M']}x{r['N']}x{r['K']}", label(r), r["tiles"], f"{r['waves']:.2f}",
                 f"{r['ours'] * 1e3:.1f}", f"{r['cublas'] * 1e3:.1f}", f"{r['cublas'] / r['ours']:.3f}",
                 f"{r['ours'] * 1e6 / gf:.1f}", f"{r['cublas'] * 1e6 / gf:.1f}", r["cublas_kernel"]]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    (args.out / "wave_tail.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
