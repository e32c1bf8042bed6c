"""The Llama-3-8B-sized MLP block (examples/model/mlp.py) on tilecarve's Linear against torch.nn.Linear.

    python3 benchmarks/model_mlp.py --out $OUT/model_mlp --time-limit 500

Phases, each saved to ``--out/model_mlp.json`` as it finishes (a run cut short keeps what it has):

1. ``tune``: from cold (fresh tuning database and TileLang cache under ``--out/cache`` unless
   ``--cache-dir`` names warm ones), record the block at the token counts, tune every key (one job:
   one compile pool and one measuring process for all of them, ``autotuner/job.py``), write the
   table, and compile the served kernels (``mlp.py record-tune``, in this process);
2. ``serve``: ``mlp.py serve`` twice in fresh processes: first-forward seconds with the table loaded,
   TileLang's own cache-load seconds inside it, nothing timed, the same configs both times;
3. ``speed``: both blocks on the same weights, interleaved rounds per token count (CUDA events over
   back-to-back eager calls, median of rounds); speedup = torch time / tilecarve time. The kernels the
   counts need are compiled first, ``--jobs`` at a time (``KeyedKernel.precompile``), and each count's row
   names the configs that served it (``--no-refine``: every M in a bucket served by the bucket's config);
4. ``compile``: ``torch.compile(block)``: the same outputs as eager, no graph breaks (``torch._dynamo.explain``);
5. ``host`` (not by default): the host's microseconds to issue one forward of each block, and its gate and down
   projections alone (``--profile-calls`` calls issued after a sync, timed on the CPU, before the GPU is waited
   for), per token count: a forward whose GPU time is below its host time is bound by the host;
6. ``graph`` (not by default): both blocks captured into CUDA graphs of ``--profile-calls`` forwards and
   replayed in interleaved rounds (the host out of the way, as a serving engine runs small batches);
7. ``profile`` (not by default): both blocks under torch's profiler, ``--profile-calls`` back-to-back forwards per
   token count: each kernel's GPU time per forward, the GPU's busy time and the span from a forward's first
   kernel to its last (span minus busy: the gaps between kernels, such as the host falling behind).

Targets (issue 12): speedup >= 1.0 for M >= 128, >= 0.95 below, geomean >= 1.0; tuning <= 60 s;
first forward <= 2 s beyond TileLang's cache load. A markdown table goes to ``--out/model_mlp.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "examples" / "model"))

from benchlib import dump, geomean, log, median, per_call_us, round_order  # noqa: E402

TOKENS = (1, 16, 128, 512, 2048, 8192)


def target_met(m: int, speedup: float) -> bool:
    return speedup >= (1.0 if m >= 128 else 0.95)


def time_block(block, x, iters: int) -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        block(x)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters * 1e3  # us


def both_blocks(args: argparse.Namespace) -> tuple:
    """The block with tilecarve's Linear and with ``torch.nn.Linear``, on the same weights."""
    import mlp
    import torch

    block = mlp.make_block(args.hidden, args.intermediate)
    ref = mlp.MLP(args.hidden, args.intermediate, torch.nn.Linear, device="cuda", dtype=torch.float16)
    ref.load_state_dict(block.state_dict())  # the same weights
    return block, ref


def phase_speed(res: dict, args: argparse.Namespace, deadline: float) -> None:
    import mlp
    import torch

    block, ref = both_blocks(args)
    from templates.matmul.op import get_op

    rows = res.setdefault("speed", {})
    op = get_op()
    shapes = ((args.intermediate, args.hidden), (args.hidden, args.intermediate))  # gate and up; down
    keys = {t: [{"M": t, "N": n, "K": k, "dtype": "float16"} for n, k in shapes] for t in args.tokens}
    used = mlp.used_configs(block, tuple(args.tokens))  # what serves each projection at each count
    by_kernel: dict = {}  # the GEMV's counts and the GEMM's
    for t in args.tokens:
        by_kernel.setdefault(op.kernel(t), []).extend(keys[t])
    t0 = time.time()
    res["precompiled"] = sum(kk.precompile(ks, jobs=args.jobs) for kk, ks in by_kernel.items())
    res["precompile_s"] = round(time.time() - t0, 1)
    log(f"speed: {res['precompiled']} kernels compiled in {res['precompile_s']} s")
    with torch.inference_mode():
        xs = {t: torch.randn(t, args.hidden, device="cuda", dtype=torch.float16) for t in args.tokens}
        iters = {}
        for t, x in xs.items():  # warm both, check outputs, pick iterations for ~20 ms per sample
            y, y_ref = block(x), ref(x)
            err = ((y.float() - y_ref.float()).abs().max() / y_ref.float().abs().max().clamp_min(1e-6)).item()
            per = time_block(ref, x, 3)
            iters[t] = max(3, min(200, int(20e3 / max(per, 1.0))))
            rows[str(t)] = {"iters": iters[t], "max_rel_err": err, "tc_us": [], "torch_us": [],
                            "served": [[used[f"{p}@{t}"][3], used[f"{p}@{t}"][2]] for p in ("gate_proj", "down_proj")]}
        arms = {"tc": block, "torch": ref}
        for r in range(args.rounds):
            if time.time() > deadline:
                log("speed: time limit; stopping the rounds early")
                break
            for t, x in xs.items():  # who goes first rotates: the second meets a GPU the first has heated
                for name in round_order(arms, r):
                    rows[str(t)][f"{name}_us"].append(time_block(arms[name], x, iters[t]))
            log(f"speed round {r + 1}/{args.rounds}")
    for t, row in rows.items():
        if row["tc_us"]:
            row["tc_median_us"], row["torch_median_us"] = median(row["tc_us"]), median(row["torch_us"])
            row["speedup"] = row["torch_median_us"] / row["tc_median_us"]
            row["target_met"] = target_met(int(t), row["speedup"])
    sp = [r["speedup"] for r in rows.values() if "speedup" in r]
    res["speed_geomean"] = geomean(sp)
    res["op_stats"] = {"gemm": dict(op.gemm.stats), "gemv": dict(op.gemv.stats)}  # refusals would show here


def kernel_spans(block, x, calls: int) -> dict:
    """``calls`` back-to-back forwards of ``block`` under torch's profiler: GPU microseconds per forward for
    each kernel name, the busy total and the span from the first kernel's start to the last one's end."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        block(x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            block(x)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    if not kernels:
        return {"error": "the profiler recorded no kernels"}
    per: dict = {}
    for e in kernels:
        per[e.name[:90]] = per.get(e.name[:90], 0.0) + (e.time_range.end - e.time_range.start) / calls
    span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / calls
    busy = sum(per.values())
    return {"busy_us": busy, "span_us": span, "gaps_us": span - busy, "kernels_per_forward": len(kernels) / calls,
            "kernels": dict(sorted(per.items(), key=lambda kv: -kv[1]))}


def host_us(block, x, calls: int) -> dict:
    """The host's microseconds to issue one forward of ``block``, and each of its three projections alone."""
    import torch.nn.functional as F

    h = F.silu(block.gate_proj(x)) * block.up_proj(x)
    return {"forward": per_call_us(lambda: block(x), calls),
            "gate_proj": per_call_us(lambda: block.gate_proj(x), calls),
            "down_proj": per_call_us(lambda: block.down_proj(h), calls)}


def capture(block, x, calls: int) -> Any:
    """A CUDA graph of ``calls`` forwards of ``block`` (warmed on a side stream first, as torch asks)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            block(x)
    return graph


def phase_graph(res: dict, args: argparse.Namespace) -> None:
    """Both blocks replayed from CUDA graphs of ``--profile-calls`` forwards, in interleaved rounds: the
    kernels' time with the host out of the way (how a serving engine runs small batches). Under capture
    the op serves checked kernels only, so both blocks run once outside it first."""
    import torch

    block, ref = both_blocks(args)
    out = res.setdefault("graph", {})
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        for t in args.tokens:
            x = torch.randn(t, args.hidden, device="cuda", dtype=torch.float16)
            block(x), ref(x)
            graphs = {"tilecarve": capture(block, x, args.profile_calls), "torch": capture(ref, x, args.profile_calls)}
            times: dict = {name: [] for name in graphs}
            for r in range(args.rounds):
                for name in round_order(graphs, r):  # who goes first rotates
                    g = graphs[name]
                    g.replay()  # once untimed: the first replay of a round pays for the other graph's data
                    start.record()
                    g.replay()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end) / args.profile_calls * 1e3)
            out[str(t)] = {name: median(v) for name, v in times.items()}
            log(f"graph {t}: tilecarve {out[str(t)]['tilecarve']:.1f} us a forward, torch {out[str(t)]['torch']:.1f}")
            del graphs
            torch.cuda.empty_cache()


def phase_per_count(res: dict, args: argparse.Namespace, name: str, measure: Any) -> None:
    """``res[name][tokens] = {"tilecarve": measure(block, x, calls), "torch": ...}`` for every token count."""
    import torch

    block, ref = both_blocks(args)
    out = res.setdefault(name, {})
    with torch.inference_mode():
        for t in args.tokens:
            x = torch.randn(t, args.hidden, device="cuda", dtype=torch.float16)
            block(x), ref(x)
            out[str(t)] = {"tilecarve": measure(block, x, args.profile_calls),
                           "torch": measure(ref, x, args.profile_calls)}
            log(f"{name} {t}: {json.dumps(out[str(t)])[:300]}")


def phase_compile(res: dict, args: argparse.Namespace) -> None:
    import mlp
    import torch

    block = mlp.make_block(args.hidden, args.intermediate)
    out = res.setdefault("compile", {})
    explain = torch._dynamo.explain(block)(torch.randn(128, args.hidden, device="cuda", dtype=torch.float16))
    out["graph_breaks"] = explain.graph_break_count
    out["graphs"] = explain.graph_count
    out["break_reasons"] = [str(b.reason)[:300] for b in explain.break_reasons]
    torch._dynamo.reset()
    compiled = torch.compile(block)
    with torch.inference_mode():
        for t in (1, 128):
            x = torch.randn(t, args.hidden, device="cuda", dtype=torch.float16)
            y, yc = block(x), compiled(x)
            out[f"same_output_M{t}"] = bool(torch.equal(y, yc))
            out[f"max_abs_diff_M{t}"] = (y.float() - yc.float()).abs().max().item()


def phase_serve(res: dict, args: argparse.Namespace, env: dict) -> None:
    runs = []
    for i in range(2):
        cmd = [sys.executable, str(ROOT / "examples" / "model" / "mlp.py"), "serve", "--table", res["tune"]["table"],
               "--hidden", str(args.hidden), "--intermediate", str(args.intermediate), "--tokens",
               *map(str, args.tokens), "--profile", str(Path(args.out) / f"serve{i + 1}-profile.txt")]
        t0 = time.time()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        wall = time.time() - t0
        if p.returncode != 0:
            runs.append({"error": p.stderr[-2000:], "wall_s": wall})
            break
        runs.append({**json.loads(p.stdout.strip().splitlines()[-1]), "wall_s": wall})
        log(f"serve run {i + 1}: first forward {runs[-1]['first_forward_total_s']:.2f} s "
            f"(TileLang load {runs[-1]['tilelang_load_s']:.2f} s), process {wall:.1f} s")
    res["serve"] = runs
    if len(runs) == 2 and "configs" in runs[1]:
        res["serve_same_configs"] = runs[0]["configs"] == runs[1]["configs"]


def write_md(res: dict, path: Path) -> None:
    lines = [f"# MLP block (hidden {res['hidden']}, intermediate {res['intermediate']}, fp16) on {res['device']}",
             "", f"{res['date']}, `{res['command']}`", "",
             "| tokens | tilecarve us | torch us | speedup | target | served (gate and up; down) |",
             "|---|---|---|---|---|---|"]
    for t, r in res.get("speed", {}).items():
        if "speedup" in r:
            served = "; ".join(f"{c.get('block_M', '')}x{c.get('block_N', '')}x{c.get('block_K', '')} "
                               f"{src.split(' ')[0]}" for src, c in r.get("served", []))
            lines.append(f"| {t} | {r['tc_median_us']:.1f} | {r['torch_median_us']:.1f} | {r['speedup']:.3f} | "
                         f"{'met' if r['target_met'] else 'missed'} | {served} |")
    if res.get("speed_geomean"):
        lines.append(f"\ngeomean speedup {res['speed_geomean']:.3f} (target >= 1.0)")
    if "tune_s" in res.get("tune", {}):  # not when a given --table is served without tuning
        tn = res["tune"]
        lines.append(f"\ntuning from cold: {tn['keys']} distinct keys (18 projection calls) in {tn['tune_s']:.1f} s "
                     f"(target <= 60 s); recording {tn['record_s']:.1f} s, served-kernel compile {tn['warm_s']:.1f} s")
        if "job" in tn:
            lines.append(f"\none job of {tn['job']['candidates']} candidates ({tn['job']['warm_keys']} keys warm): "
                         + ", ".join(f"{k} {v:.1f} s" for k, v in tn["job"]["phases"].items()))
    for i, s in enumerate(res.get("serve", [])):
        if "first_forward_total_s" in s:
            lines.append(f"\nfresh process {i + 1}: first forward (all counts) {s['first_forward_total_s']:.2f} s, of "
                         f"which TileLang's cache load {s['tilelang_load_s']:.2f} s (target: <= 2 s beyond it)")
    if "serve_same_configs" in res:
        lines.append(f"\nsame configs on a second run: {res['serve_same_configs']}")
    if "compile" in res:
        lines.append(f"\ntorch.compile: {res['compile']}")
    if res.get("host"):
        lines += ["", "| tokens | host us a forward, tilecarve | torch | gate_proj alone, tilecarve | torch | "
                  "down_proj alone, tilecarve | torch |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {t} | " + " | ".join(f"{h[b][k]:.1f}" for k in ("forward", "gate_proj", "down_proj")
                                          for b in ("tilecarve", "torch")) + " |" for t, h in res["host"].items()]
    if res.get("graph"):
        lines += ["", "| tokens | CUDA graph us a forward, tilecarve | torch | speedup |", "|---|---|---|---|"]
        lines += [f"| {t} | {g['tilecarve']:.1f} | {g['torch']:.1f} | {g['torch'] / g['tilecarve']:.3f} |"
                  for t, g in res["graph"].items()]
    if res.get("profile"):
        lines += ["", "| tokens | block | GPU busy us | span us | gaps us | kernels | the three longest (us each) |",
                  "|---|---|---|---|---|---|---|"]
        for t, both in res["profile"].items():
            for name, p in both.items():
                if "busy_us" in p:
                    top = "; ".join(f"{k[:40]} {v:.1f}" for k, v in list(p["kernels"].items())[:3])
                    lines.append(f"| {t} | {name} | {p['busy_us']:.1f} | {p['span_us']:.1f} | {p['gaps_us']:.1f} | "
                                 f"{p['kernels_per_forward']:.0f} | {top} |")
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--out", required=True, help="folder for model_mlp.json and model_mlp.md")
    ap.add_argument("--time-limit", type=float, default=500.0, help="seconds; later phases are skipped past it")
    ap.add_argument("--cache-dir", help="tuning database + TileLang cache (default: a fresh one under --out: cold)")
    ap.add_argument("--phases", default="tune,serve,speed,compile")
    ap.add_argument("--table", help="with --phases without tune: the table to serve")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--no-refine", action="store_true",
                    help="serve every M with its bucket's config (the op's refine=False)")
    ap.add_argument("--jobs", type=int, default=8, help="kernels compiled at a time before the speed rounds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile-calls", type=int, default=20, help="forwards per token count in the profile phase")
    ap.add_argument("--topk", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    args = ap.parse_args()
    deadline = time.time() + args.time_limit
    out = Path(args.out)
    cache = Path(args.cache_dir or out / "cache").resolve()
    os.environ["TILECARVE_CACHE_DIR"] = str(cache / "tilecarve")
    os.environ["TILELANG_CACHE_DIR"] = str(cache / "tilelang")  # before tilelang is imported
    import mlp
    import torch

    from templates.matmul.op import configure

    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    configure(topk=args.topk, refine=not args.no_refine)
    phases = args.phases.split(",")
    res = {"device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "command": " ".join(sys.argv), "hidden": args.hidden, "intermediate": args.intermediate,
           "tokens": args.tokens, "topk": args.topk, "cache": str(cache), "refine": not args.no_refine}
    jpath = out / "model_mlp.json"

    def save() -> None:
        dump(jpath, res)
        write_md(res, out / "model_mlp.md")

    if "tune" in phases:
        log("tune: record, tune, write the table, compile the served kernels")
        ns = argparse.Namespace(table=str(out / "mlp-table.json"), hidden=args.hidden,
                                intermediate=args.intermediate, tokens=args.tokens)
        res["tune"] = mlp.record_tune(ns)
        save()
    elif args.table:
        res["tune"] = {"table": args.table}
    if "table" in res.get("tune", {}):  # speed and compile run the deployed path: the table, loaded
        import autotuner

        autotuner.use_table(res["tune"]["table"])
    # this checkout first, and whatever made tilelang importable here (e.g. .gpu/setup.sh) after it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    steps = (("serve", lambda: phase_serve(res, args, env)), ("speed", lambda: phase_speed(res, args, deadline)),
             ("compile", lambda: phase_compile(res, args)),
             ("host", lambda: phase_per_count(res, args, "host", host_us)),
             ("graph", lambda: phase_graph(res, args)),
             ("profile", lambda: phase_per_count(res, args, "profile", kernel_spans)))
    for name, run in steps:
        if name not in phases or (name == "serve" and "table" not in res.get("tune", {})):
            continue
        if time.time() > deadline:
            res.setdefault("skipped", []).append(name)
            log(f"{name}: skipped (time limit)")
            continue
        log(f"{name}:")
        try:
            run()
        except Exception as e:  # a failing phase is a result; the next phases still run
            res[f"{name}_error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
            log(f"{name} failed: {res[f'{name}_error']}")
        save()
    save()
    log(f"wrote {jpath} and {out / 'model_mlp.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
