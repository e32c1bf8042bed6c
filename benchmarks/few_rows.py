"""GEMMs with few rows (a model's 64-512 tokens against its weights): how far the carver's candidates are
from the best of a wide search, and both from cuBLAS, on the GPU.

    python3 benchmarks/few_rows.py --out $OUT/few_rows --time-limit 400

Such a GEMM streams the whole weight once and is bound by memory, or close to it: the tile that fills the
SMs and keeps enough bytes in flight wins, which is not what a compute-bound model ranks first. Per shape:

1. ``search``: the autotuner (isolated, every candidate checked) over a wide list: TileLang's 288 grid
   (unless ``--no-grid``), the carver's top-48 hints, split-K of the top 16 at 2 to 8 splits, and the
   candidates ``tune()`` would try (the carver's top ``--topk`` with its variants), and any
   ``--also-configs``. Each trial's median
   is kept (``few_rows.json``). ``--timing back_to_back`` times them back to back, each call between two events;
   ``--timing batched`` in groups of calls between two events, as the op tunes.
2. ``versus``: the search's best 4, the best of ``tune()``'s candidates and cuBLAS (``x @ W.T``), in
   interleaved rounds in this process (CUDA events after an L2 flush): ratios to cuBLAS and the bytes
   streamed per second (``few_rows.json``, ``few_rows.md``).
3. ``served`` (``--served``): the search's best 2 and tune()'s best compiled with a static M and with a
   symbolic M (as the op serves them), against cuBLAS, after an L2 flush and back to back (a model's
   forward). ``--searched few_rows.json`` reuses an earlier run's searches.

A benchmark, not a test: failing configs are rows with their error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from benchlib import Clock, config_id, dump, geomean, log, median, poisoned_call  # noqa: E402

SHAPES = ("128x14336x4096", "128x4096x14336", "256x14336x4096", "64x4096x14336")


def wide_list(problem: Any, arch: Any, topk: int, grid: bool = True,
              block_ns: tuple[int, ...] = (), also: tuple[dict[str, Any], ...] = ()) -> tuple[list[Any], list[Any]]:
    """(every config to search, the ones tune() would try), as MatmulConfigs, checked, no duplicates.
    ``block_ns``: the top-16 hints again with each of these block_N (tiles the carver does not enumerate),
    unsplit and split 2 to 8. ``also``: more configs (another model's hints, say), as dicts."""
    from templates.matmul import space
    from templates.matmul.config import MatmulConfig

    tuned = space.candidates(problem, arch, topk)
    hints = space.candidates(problem, arch, 48, variants=False, split_k=False)
    split = space.split_k_variants(problem, hints[:16], arch.sm_count, per_config=4, top=16)
    more = [dataclasses.replace(c, split_k=s) for c in hints[:16] for s in (2, 3, 4, 6, 8)
            if c.split_k == 1 and s <= space.split_k_limit(problem.K, c.block_K)]
    wider = [dataclasses.replace(c, block_N=n, split_k=s) for c in hints[:16] for n in block_ns
             for s in (1, 2, 3, 4, 6, 8) if s <= space.split_k_limit(problem.K, c.block_K)]
    out: list[Any] = []
    extra = [MatmulConfig.from_dict(c) for c in also]
    refused = [c for c in extra if space.check(problem, c, arch)]
    if refused:
        log(f"--also-configs: {len(refused)} of {len(extra)} refused by the template's rules, not searched")
    for c in [*tuned, *hints, *split, *more, *wider, *extra, *(space.space(problem) if grid else [])]:
        if c not in out and not space.check(problem, c, arch):
            out.append(c)
    return out, tuned


def phase_search(shape: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    import carver
    from templates import matmul
    from templates.matmul.config import make_problem

    M, N, K = map(int, shape.split("x"))
    arch = carver.arch.CUDA(args.arch)
    problem = make_problem(M, N, K, args.dtype, None, "float32", False, True, in_name="dtype")
    also = tuple(json.loads(Path(args.also_configs).read_text()).get(shape, [])) if args.also_configs else ()
    configs, tuned = wide_list(problem, arch, args.topk, grid=not args.no_grid, block_ns=tuple(args.also_block_n),
                               also=also)
    log(f"{shape}: searching {len(configs)} configs ({len(tuned)} of them tune()'s)")
    t0 = time.time()
    tuner = matmul.tuner(M, N, K, dtype=args.dtype, configs=[c.to_dict() for c in configs], arch=args.arch)
    tuner.set_tuning(db_path=str(out / "tuning.sqlite"), progress=False, timing=args.timing, sustain_s=0.05)
    res = tuner.run(3, 20)
    rows = [{"config": t.config, "status": str(t.status), "ms": t.median_ms,
             "error": (t.error or "")[:300] or None} for t in res.trials]
    return {"shape": shape, "configs": len(configs), "seconds": round(time.time() - t0, 1),
            "tuned": [c.to_dict() for c in tuned], "winner": res.config, "winner_ms": res.latency, "rows": rows}


def picks_of(search: dict[str, Any], n: int) -> dict[str, tuple[str, dict[str, Any]]]:
    """The search's ``n`` fastest checked configs and the fastest of tune()'s own candidates, by config id:
    ``(where it comes from, config)``."""
    ok = sorted((r for r in search["rows"] if r["ms"] is not None and r["status"] == "ok"), key=lambda r: r["ms"])
    tuned_ids = {config_id(c) for c in search["tuned"]}
    picks = {config_id(r["config"]): ("search", r["config"]) for r in ok[:n]}
    best_tuned = next((r for r in ok if config_id(r["config"]) in tuned_ids), None)
    if best_tuned is not None:
        picks[config_id(best_tuned["config"])] = ("tune", best_tuned["config"])
    return picks


def operands(M: int, N: int, K: int, dtype: str) -> tuple[Any, Any]:
    """``x`` (M, K) and ``W`` (N, K) on the GPU, ``W`` scaled so that ``x @ W.T`` stays near 1."""
    import torch

    dt = getattr(torch, dtype)
    return torch.randn(M, K, device="cuda", dtype=dt), torch.randn(N, K, device="cuda", dtype=dt) / K**0.5


def phase_versus(search: dict[str, Any], args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    import torch

    from templates import matmul

    M, N, K = map(int, search["shape"].split("x"))
    picks = picks_of(search, 4)
    x, w = operands(M, N, K, args.dtype)
    kernels = {}
    for cid, (_, cfg) in picks.items():
        kernels[cid] = matmul.compile(M, N, K, config=cfg, dtype=args.dtype)
        torch.testing.assert_close(poisoned_call(kernels[cid], (x, w)).float(), (x @ w.T).float(), atol=2e-2,
                                   rtol=2e-2)
    times: dict[str, list[float]] = {cid: [] for cid in kernels}
    times["cublas"] = []
    for _ in range(args.rounds):
        if clock.left() < 10:
            break
        times["cublas"].append(clock.time(lambda: x @ w.T))
        for cid, k in kernels.items():
            times[cid].append(clock.time(lambda k=k: k(x, w)))
    cub = median(times["cublas"])
    weight_bytes = N * K * x.element_size()
    rows = [{"config": picks[cid][1], "from": picks[cid][0], "ms": median(ts), "vs_cublas": cub / median(ts),
             "weight_tbps": weight_bytes / median(ts) / 1e9, "rounds": ts}
            for cid, ts in times.items() if cid != "cublas" and ts]
    rows.sort(key=lambda r: r["ms"])
    return {"shape": search["shape"], "cublas_ms": cub, "cublas_rounds": times["cublas"],
            "cublas_weight_tbps": weight_bytes / cub / 1e9, "rows": rows}


def back_to_back_ms(fn: Any, calls: int = 50) -> float:
    """Milliseconds a call, ``calls`` calls issued back to back between two CUDA events (no L2 flush, the
    host ahead of the GPU): how a model's forward runs them."""
    import torch

    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def phase_served(search: dict[str, Any], args: argparse.Namespace, clock: Clock) -> dict[str, Any]:
    """The search's best 2 and tune()'s best, compiled as ``matmul.compile`` does (static M) and as the op
    serves them (M symbolic, ``templates.matmul.op.gemm``), against cuBLAS, timed after an L2 flush and
    back to back, in interleaved rounds."""
    import tilelang.language as T
    import torch

    from autotuner.compile import tl_compile
    from templates import matmul
    from templates.matmul.op import gemm

    M, N, K = map(int, search["shape"].split("x"))
    picks = {cid: cfg for cid, (_, cfg) in picks_of(search, 2).items()}
    x, w = operands(M, N, K, args.dtype)
    ref = (x @ w.T).float()
    kernels: dict[str, Any] = {}
    for cid, cfg in picks.items():
        kernels[f"static {cid}"] = matmul.compile(M, N, K, config=cfg, dtype=args.dtype)
        kernels[f"symbolic {cid}"] = tl_compile(gemm(T.dynamic("M"), N, K, args.dtype, **cfg), "cuda", out_idx=[-1])
    for name, k in kernels.items():
        torch.testing.assert_close(poisoned_call(k, (x, w)).float(), ref, atol=2e-2, rtol=2e-2,
                                   msg=lambda m, name=name: f"{name}: {m}")
    calls = {"cublas": lambda: x @ w.T, **{name: (lambda k=k: k(x, w)) for name, k in kernels.items()}}
    flushed: dict[str, list[float]] = {n: [] for n in calls}
    b2b: dict[str, list[float]] = {n: [] for n in calls}
    for _ in range(args.rounds):
        if clock.left() < 10:
            break
        for name, fn in calls.items():
            flushed[name].append(clock.time(fn))
            b2b[name].append(back_to_back_ms(fn))
    cub_f, cub_b = median(flushed["cublas"]), median(b2b["cublas"])
    rows = [{"kernel": name, "flushed_ms": median(flushed[name]), "back_to_back_ms": median(b2b[name]),
             "flushed_vs_cublas": cub_f / median(flushed[name]), "back_to_back_vs_cublas": cub_b / median(b2b[name])}
            for name in calls if flushed[name]]
    return {"shape": search["shape"], "rows": rows, "rounds": {"flushed": flushed, "back_to_back": b2b}}


def write_md(res: dict[str, Any], path: Path) -> None:
    lines = [f"# GEMMs with few rows, {res.get('device', '?')}", "",
             f"{res.get('date', '')}, `{res.get('command', '')}`",
             "", "| shape | searched | search s | best (search) / cuBLAS | best of tune()'s / cuBLAS | "
             "cuBLAS TB/s | best TB/s | best config |", "|---|---|---|---|---|---|---|---|"]
    ratios = []
    for shape, v in res.get("versus", {}).items():
        s = res["search"][shape]
        best = v["rows"][0] if v["rows"] else None
        tuned = next((r for r in v["rows"] if r["from"] == "tune"), None)
        if best:
            ratios.append(best["vs_cublas"])
        lines.append(f"| {shape} | {s['configs']} | {s['seconds']} | {best['vs_cublas']:.3f} | "
                     f"{tuned['vs_cublas'] if tuned else float('nan'):.3f} | {v['cublas_weight_tbps']:.2f} | "
                     f"{best['weight_tbps']:.2f} | `{best['config']}` |" if best else f"| {shape} | - |")
    if ratios:
        lines += ["", f"geomean best / cuBLAS: {geomean(ratios):.3f}"]
    for shape, v in res.get("served", {}).items():
        lines += ["", f"## {shape}: static and symbolic M (as the op serves), after an L2 flush and back to back",
                  "", "| kernel | flushed us | / cuBLAS | back to back us | / cuBLAS |", "|---|---|---|---|---|"]
        lines += [f"| {r['kernel']} | {r['flushed_ms'] * 1e3:.1f} | {r['flushed_vs_cublas']:.3f} | "
                  f"{r['back_to_back_ms'] * 1e3:.1f} | {r['back_to_back_vs_cublas']:.3f} |" for r in v["rows"]]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help="MxNxK (A is MxK, W is NxK)")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--arch", default="H200", help="the carver's GPU")
    ap.add_argument("--topk", type=int, default=4, help="tune()'s topk (model_mlp.py uses 4)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-grid", action="store_true", help="leave TileLang's 288 grid out of the search")
    ap.add_argument("--served", action="store_true",
                    help="also time the best configs compiled as the op serves them (symbolic M), back to back")
    ap.add_argument("--timing", default="burst", choices=["burst", "back_to_back", "batched"],
                    help="how the search times candidates (back_to_back: as a forward runs them, each call between "
                         "two events; batched: in groups of calls, the op's way)")
    ap.add_argument("--also-block-n", nargs="*", type=int, default=[],
                    help="also search the top-16 hints with these block_N (e.g. 112: 14336 / 112 = 128 tiles)")
    ap.add_argument("--also-configs", help="a JSON file {MxNxK: [config, ...]} of more configs to search "
                    "(another carver's hints, to score both orders offline with few_rows_scores.py)")
    ap.add_argument("--searched", help="a few_rows.json whose searches to reuse (shapes found there are not searched)")
    ap.add_argument("--time-limit", type=float, default=400.0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    clock = Clock(args.time_limit, 50)
    import torch

    res: dict[str, Any] = {"device": torch.cuda.get_device_name(0),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "command": "python3 benchmarks/few_rows.py " + " ".join(sys.argv[1:]), "search": {},
                           "versus": {}}
    earlier = json.loads(Path(args.searched).read_text())["search"] if args.searched else {}
    res["served"] = {}
    for shape in args.shapes:
        if clock.left() < 60:
            log(f"{shape}: time limit, skipped")
            continue
        if shape in earlier:
            res["search"][shape] = earlier[shape]
        else:
            res["search"][shape] = phase_search(shape, args, out)
            dump(out / "few_rows.json", res)
            res["versus"][shape] = phase_versus(res["search"][shape], args, clock)
            dump(out / "few_rows.json", res)
            v = res["versus"][shape]
            log(f"{shape}: cuBLAS {v['cublas_ms'] * 1e3:.1f} us; " + "; ".join(
                f"{r['from']} {r['ms'] * 1e3:.1f} us ({r['vs_cublas']:.3f})" for r in v["rows"]))
        if args.served:
            res["served"][shape] = phase_served(res["search"][shape], args, clock)
            dump(out / "few_rows.json", res)
            log(f"{shape} served: " + "; ".join(f"{r['kernel'][:60]} {r['flushed_vs_cublas']:.3f} flushed, "
                                               f"{r['back_to_back_vs_cublas']:.3f} back to back"
                                               for r in res["served"][shape]["rows"]))
        write_md(res, out / "few_rows.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
