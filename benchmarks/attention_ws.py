"""The hand-scheduled attention loop (``variant="ws"``) on the GPU: is it correct on the Llama-3-8B shapes,
and how fast is it against the T.Pipelined program's best and torch's cuDNN (and flash) SDPA backends?

    . .gpu/setup.sh && python3 benchmarks/attention_ws.py --out $OUT/attn_ws            # ~10 min
    python3 benchmarks/attention_ws.py --shapes 8,32,8,1024,128,0 8,32,8,1024,128,1 --out $OUT/w1

Per shape (``B,H,H_kv,S,D,causal`` as in ``benchmarks/attention.py``; the six Llama shapes by default):

1. **check**, in a child process with a time limit (``--check-timeout``): every ws config the carver's
   rules accept on this GPU (``templates.attention.space.ws_space``) is compiled and its output compared
   with the fp32 reference (zero mismatches at atol = rtol = 1e-2), in the model's order, so the time limit
   cuts the configs tuning would measure last. A deadlocked or crashing kernel (no answer ``STALL_S`` into
   its check) is a row that says so, not a hung benchmark; the config the time limit cut sooner is a row with
   ``correct`` None; TileLang's disk cache hands the compiled kernels to the parent.
2. **measure**: the plain top-8 (``candidates(..., variants=False)``) and the ws configs that passed, each
   checked again and timed once.
3. **race**: the best plain config, the best ws config and the SDPA backends in ``--rounds`` interleaved
   rounds (CUDA events after an L2 flush); medians, TFLOP/s and the ratios.

Writes ``<out>/ws.json`` after every shape (rows, the model's prediction of each ws config), ``<out>/summary.md``
at the end, and per shape a grid file ``<out>/grid/<shape>.json`` in ``measure_gemm_grid.py``'s format, marked
``"variants": true``: every config step 2 measured (the plain top-8 and the whole ws space) and every config the
check found wrong. ``benchmarks/hint_quality.py --data <out>/grid`` then scores the candidates tuning measures
(``candidates(..., 8, variants=True)``: both programs) against them. ``--grids-from <ws.json>`` writes the grid files
of an earlier run into ``<out>/grid`` (no GPU).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from attention import TORCH, Bench, label, parse_shape  # noqa: E402
from benchlib import compile_all, config_id, dump, geomean, log, measure_configs  # noqa: E402


def check_in_child(args: argparse.Namespace, shape: tuple) -> list[dict[str, Any]]:
    """Step 1 in a child process: its rows, or one ``timeout`` row per config when it did not finish."""
    out = Path(args.out) / "check" / f"{label(shape, args.dtype)}.json"
    cmd = [sys.executable, __file__, "--child", ",".join(str(int(v)) for v in shape), "--out", str(out),
           "--dtype", args.dtype, "--jobs", str(args.jobs)]
    out.unlink(missing_ok=True)  # never an earlier run's answer
    try:
        subprocess.run(cmd, timeout=args.check_timeout, check=False)
    except subprocess.TimeoutExpired:
        log(f"check {label(shape, args.dtype)}: no answer in {args.check_timeout} s (deadlock?)")
    data = json.loads(out.read_text()) if out.exists() else {"rows": [], "running": None}
    if data.get("running"):
        data["rows"].append(unfinished(data["running"], time.time() - data["since"], args.check_timeout))
    return data["rows"]


#: The plain program's top-k the sweep measures beside every ws config, as tuning's default ``topk`` does.
TOPK = 8
#: Seconds one config's check may take before it counts as hung (they take 2-5 s on an H200 after the compiles).
STALL_S = 30.0


def unfinished(config: dict[str, Any], ran_s: float, limit_s: float) -> dict[str, Any]:
    """The row of the config the child was checking when it stopped: wrong if it ran ``STALL_S`` or more (a
    deadlock, a crash), else unchecked (``correct`` None: the shape's time limit ran out while it ran)."""
    if ran_s >= STALL_S:
        return {"config": config, "correct": False,
                "error": f"the check crashed or hung: no answer {ran_s:.0f} s into this config"}
    return {"config": config, "correct": None,
            "error": f"not checked: the shape's {limit_s:.0f} s check limit ran out {ran_s:.0f} s into it"}


def check_order(problem: Any, arch: Any) -> list:
    """Every legal ws config of ``problem`` on ``arch``: first the ones tuning measures (``space.ws_top``), then the
    rest in the model's order (``space.ws_ranked``)."""
    from templates.attention.space import ws_ranked, ws_top

    ranked = ws_ranked(problem, arch)
    top = ws_top(ranked)
    return top + [c for c in ranked if c not in top]


def child(args: argparse.Namespace) -> int:
    """Compile and check every legal ws config of one shape; rows written as they finish."""
    from templates.attention import ATTENTION

    b = Bench(args)
    shape = args.child
    problem = b.problem(shape)
    configs = check_order(problem, b.arch)  # a time limit cuts what tuning would measure last
    qkv = b.inputs(shape)
    ref = ATTENTION.reference(problem)(*qkv)
    compile_all(ATTENTION, problem, configs, args.jobs)  # in parallel, into TileLang's disk cache
    rows = []
    for cfg in configs:  # one at a time, so a hang names its config in the file
        dump(Path(args.out), {"running": cfg.to_dict(), "since": time.time(), "rows": rows})
        (row,) = measure_configs(ATTENTION, problem, [cfg], qkv, ref, b.clock, args.jobs)
        rows.append(row)
        log(f"check {label(shape, args.dtype)} {cfg}: correct {row['correct']} mismatches "
            f"{row.get('mismatches')} error {row['error']}")
    dump(Path(args.out), {"rows": rows})
    return 0


def race(b: Bench, shape: tuple, best: dict[str, dict | None], kernels: dict, qkv: tuple) -> dict[str, Any]:
    """Step 3: the best of each kind (``best``: name -> measured row) and the SDPA backends, interleaved;
    medians in ms."""
    q, k, v = qkv
    impls = {name: kernels[config_id(row["config"])] for name, row in best.items() if row}
    return b.race_with_sdpa({n: (lambda kern=kern: kern(q, k, v)) for n, kern in impls.items()}, q, k, v, shape[5])


#: What the race times beside the SDPA backends: the best measured config of each kind.
KINDS = ("plain", "ws", "persistent")


def _kind(config: dict[str, Any]) -> str:
    """``plain`` (T.Pipelined), ``ws`` (the hand-scheduled loop, one CTA per tile) or ``persistent``."""
    if config.get("variant", "pipelined") != "ws":
        return "plain"
    return "persistent" if config.get("persistent") else "ws"


def ratio(ms: dict[str, float], a: str, c: str) -> float | None:
    """Time of ``a`` over time of ``c`` (how much faster ``c`` is), None when either did not run."""
    return ms[a] / ms[c] if a in ms and c in ms else None


def grid(row: dict[str, Any], device: str) -> dict[str, Any]:
    """One shape's ``ws.json`` row as a grid file (``tilecarve.quality``'s format): every config measured in step 2,
    and the ws configs the check found wrong (``correct`` False: the grid scores only correct, timed rows). The
    grid is no exhaustive T.Pipelined grid: it holds the plain program's top ``TOPK`` and every ws config, so it
    judges the candidates tuning measures at that ``topk`` (``"variants": true``), which add the ws configs to it."""
    b, h, hkv, s, d, causal = row["problem"]
    wrong = [r for r in row["check"] if r.get("correct") is False]
    results = row["measured"] + wrong
    return {"summary": {"family": "attention", "variants": True, "topk": TOPK, "device": device, "shape": row["shape"],
                        "problem": {"batch": b, "heads": h, "kv_heads": hkv, "seq_len": s, "dim": d,
                                    "causal": bool(causal), "dtype": row["dtype"]},
                        "source": "benchmarks/attention_ws.py", "n_configs": len(results)},
            "results": results}


def write_grids(rows: list[dict[str, Any]], device: str, out: Path) -> list[Path]:
    """``out/<shape>.json`` for each row (:func:`grid`)."""
    paths = []
    for row in rows:
        paths.append(out / f"{row['shape']}.json")
        dump(paths[-1], grid(row, device))
    return paths


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    from templates.attention import ATTENTION
    from templates.attention.space import carver_template

    b = Bench(args)
    out = Path(args.out)
    rows: list[dict[str, Any]] = []
    log(f"{b.device}; carver arch {b.arch.name}; out {out}")
    for shape in args.shapes or TORCH:
        name = label(shape, args.dtype)
        problem = b.problem(shape)
        checked = check_in_child(args, shape)
        good = [ATTENTION.config_type.from_dict(r["config"]) for r in checked if r.get("correct")]
        plain = ATTENTION.candidates(problem, b.arch, TOPK, variants=False)
        qkv = b.inputs(shape)
        ref = ATTENTION.reference(problem)(*qkv)
        kernels: dict[str, Any] = {}
        measured = measure_configs(ATTENTION, problem, plain + good, qkv, ref, b.clock, args.jobs, kernels=kernels)
        ok = [r for r in measured if r["ms"] is not None]
        best = {kind: min((r for r in ok if _kind(r["config"]) == kind), key=lambda r: r["ms"], default=None)
                for kind in KINDS}
        raced = race(b, shape, best, kernels, qkv)
        ms = raced["ms"]
        tmpl = carver_template(problem, b.arch)
        row = {"shape": name, "problem": list(shape), "dtype": args.dtype, "check": checked, "measured": measured,
               "best_plain": best["plain"], "best_ws": best["ws"], "best_persistent": best["persistent"], **raced,
               "tflops": {n: problem.flops / m / 1e9 for n, m in ms.items()},
               "ws_speedup_vs_plain": ratio(ms, "plain", "ws"), "ws_vs_cudnn": ratio(ms, "cudnn", "ws"),
               "plain_vs_cudnn": ratio(ms, "cudnn", "plain"),
               "persistent_vs_ws": ratio(ms, "ws", "persistent"),
               "persistent_vs_cudnn": ratio(ms, "cudnn", "persistent"),
               "predicted_ms": {config_id(c.to_dict()): tmpl.predict(c.kernel_kwargs()).latency_ms
                                for c in plain + good}}
        bad = [r for r in checked if r.get("correct") is False]
        cut = [r for r in checked if r.get("correct") is None]
        log(f"{name}: ws {len(checked) - len(bad) - len(cut)}/{len(checked) - len(cut)} correct ({len(cut)} cut); "
            + ", ".join(f"{n} {m:.3f} ms" for n, m in ms.items())
            + f"; ws/plain {row['ws_speedup_vs_plain']}, persistent/ws {row['persistent_vs_ws']}, "
            f"persistent/cudnn {row['persistent_vs_cudnn']}")
        rows.append(row)
        dump(out / "ws.json", {"device": b.device, "rows": rows})
        write_grids([row], b.device, out / "grid")
        del qkv, ref, kernels
        torch.cuda.empty_cache()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    f = (lambda v: f"{v:.3f}" if v is not None else "-")  # noqa: E731
    lines = ["| shape | ws correct | plain TFLOP/s | ws TFLOP/s | persistent TFLOP/s | cuDNN TFLOP/s | ws / plain | "
             "persistent / ws | persistent / cuDNN | ws / cuDNN | best ws config | best persistent config |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tf, n_ok = r["tflops"], sum(1 for c in r["check"] if c.get("correct"))
        n_checked = sum(1 for c in r["check"] if c.get("correct") is not None)
        lines.append(f"| {r['shape']} | {n_ok}/{n_checked} | {tf.get('plain', 0):.0f} | {tf.get('ws', 0):.0f} | "
                     f"{tf.get('persistent', 0):.0f} | {tf.get('cudnn', 0):.0f} | {f(r['ws_speedup_vs_plain'])} | "
                     f"{f(r.get('persistent_vs_ws'))} | {f(r.get('persistent_vs_cudnn'))} | {f(r['ws_vs_cudnn'])} | "
                     f"{(r['best_ws'] or {}).get('config')} | {(r.get('best_persistent') or {}).get('config')} |")
    for key in ("ws_speedup_vs_plain", "persistent_vs_ws", "persistent_vs_cudnn", "ws_vs_cudnn", "plain_vs_cudnn"):
        xs = [r[key] for r in rows if r.get(key)]
        if xs:
            lines.append(f"\ngeomean {key}: {geomean(xs):.3f} over {len(xs)} shapes (min {min(xs):.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--shapes", type=parse_shape, nargs="+", help="B,H,H_kv,S,D,causal (default: the Llama six)")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--time-limit", type=float, default=560.0, help="seconds; timing stops after it")
    p.add_argument("--check-timeout", type=float, default=150.0, help="seconds for one shape's check")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile threads")
    p.add_argument("--rep", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--grids-from", metavar="WS_JSON", help="write the grid files of this earlier ws.json into "
                   "<out>/grid")
    p.add_argument("--child", type=parse_shape, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    if args.grids_from:
        data = json.loads(Path(args.grids_from).read_text())
        for path in write_grids(data["rows"], data["device"], Path(args.out) / "grid"):
            print(f"wrote {path}")
        return 0
    t0 = time.time()
    rows = run(args)
    text = table(rows)
    print(text)
    out = Path(args.out)
    (out / "summary.md").write_text(text + f"\n\nwall {time.time() - t0:.0f} s\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
