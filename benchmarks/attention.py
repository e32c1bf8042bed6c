"""Flash attention on the GPU: the exhaustive grid, the carver's top-8 against it, and the tuned kernel
against every torch SDPA backend. One process, its own time limit, JSON written after every shape.

    . .gpu/setup.sh && python3 benchmarks/attention.py --out $OUT/attn                 # all steps
    python3 benchmarks/attention.py --steps torch --shapes 1,32,8,4096,128,1 --out /tmp/a

Steps (``--steps grid,holdout,torch``, all by default):

* ``grid``: every config of ``templates.attention.space`` for the calibration shapes, each checked
  against the fp32 reference (zero mismatches at atol = rtol = 1e-2) and timed; files
  ``grid/<label>.json`` in ``benchmarks/measure_gemm_grid.py``'s format (``summary`` + ``results``,
  ``family: attention``), for calibrating the carver and for ``benchmarks/hint_quality.py``.
* ``holdout``: the same on shapes not in the calibration data, and the carver's best of top-8
  (``templates.attention.candidates`` for the local GPU) as a fraction of the exhaustive best.
* ``torch``: Llama-3-8B attention (32 query heads, 8 KV heads, head dim 128), sequence 1k to 16k,
  batch 1 to 8, causal and not: the best of the carver's top-8 against each SDPA backend torch has
  here (flash, cuDNN, memory-efficient), in interleaved rounds in this one process, with TFLOP/s.
  SDPA gets the BSHD tensors as BHSD views (no copy); a backend that refuses ``enable_gqa`` gets K and
  V repeated to every query head beforehand (not timed), and the row says so.

A shape is ``B,H,H_kv,S,D,causal`` (causal 0 or 1), fp16 unless ``--dtype bfloat16``. The candidates
here are the T.Pipelined program's (``variants=False``); ``benchmarks/attention_ws.py`` races the
hand-scheduled ``variant="ws"``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from benchlib import (  # noqa: E402
    T0,
    Clock,
    config_id,
    dump,
    error_text,
    geomean,
    log,
    measure_configs,
    median,
    round_order,
    score_hints,
)

Shape = tuple[int, int, int, int, int, bool]
CAL: list[Shape] = [(1, 32, 8, 4096, 128, False), (1, 32, 8, 4096, 128, True), (4, 32, 32, 2048, 64, False),
                    (2, 32, 32, 4096, 64, True)]
HOLDOUT: list[Shape] = [(2, 32, 8, 8192, 128, True), (8, 32, 8, 1000, 128, False), (1, 32, 32, 16384, 64, True),
                        (4, 32, 8, 3000, 128, False)]
TORCH: list[Shape] = [(8, 32, 8, 1024, 128, c) for c in (False, True)] + \
    [(4, 32, 8, 4096, 128, c) for c in (False, True)] + [(1, 32, 8, 16384, 128, c) for c in (False, True)]
QUICK_CAL, QUICK_HOLDOUT, QUICK_TORCH = CAL[:1], HOLDOUT[:1], TORCH[2:4]


def parse_shape(text: str) -> Shape:
    try:
        b, h, hkv, s, d, c = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a shape is B,H,H_kv,S,D,causal (e.g. 1,32,8,4096,128,1), got {text!r}") from None
    return b, h, hkv, s, d, bool(c)


def label(shape: Shape, dtype: str) -> str:
    b, h, hkv, s, d, c = shape
    return f"b{b}-h{h}kv{hkv}-s{s}-d{d}-{'causal' if c else 'full'}-{dtype}"


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        import torch

        from carver.arch import CUDA

        self.args, self.torch = args, torch
        self.clock = Clock(args.time_limit, args.rep)
        self.arch = CUDA("cuda")
        self.device = torch.cuda.get_device_name()
        self.out = Path(args.out)

    def problem(self, shape: Shape) -> Any:
        from templates.attention import AttentionProblem

        b, h, hkv, s, d, c = shape
        return AttentionProblem(b, h, s, d, kv_heads=hkv, causal=c, dtype=self.args.dtype)

    def inputs(self, shape: Shape) -> tuple[Any, Any, Any]:
        torch = self.torch
        b, h, hkv, s, d, _ = shape
        g = torch.Generator(device="cuda").manual_seed(hash(shape) % 2**31)
        dt = getattr(torch, self.args.dtype)
        q = torch.randn(b, s, h, d, device="cuda", generator=g).to(dt)
        k = torch.randn(b, s, hkv, d, device="cuda", generator=g).to(dt)
        v = torch.randn(b, s, hkv, d, device="cuda", generator=g).to(dt)
        return q, k, v

    def tflops(self, problem: Any) -> Any:
        return lambda ms: {"tflops": problem.flops / ms / 1e9}

    def grid(self, shapes: list[Shape], sub: str) -> list[dict[str, Any]]:
        from templates.attention import ATTENTION

        out = []
        for shape in shapes:
            if self.clock.left() < 60:
                log(f"{sub}: time limit, skipping {label(shape, self.args.dtype)}")
                continue
            problem = self.problem(shape)
            space = ATTENTION.space(problem)
            hints = ATTENTION.candidates(problem, self.arch, 8, variants=False)  # ws: attention_ws.py
            todo = space + [h for h in hints if h not in space]
            qkv = self.inputs(shape)
            t = time.time()
            ref = ATTENTION.reference(problem)(*qkv)
            ref_s = time.time() - t
            t = time.time()
            rows = measure_configs(ATTENTION, problem, todo, qkv, ref, self.clock, self.args.jobs,
                                   extra=self.tflops(problem))
            summary = {"family": "attention", "device": self.device, "shape": label(shape, self.args.dtype),
                       "problem": dict(zip(("batch", "heads", "kv_heads", "seq_len", "dim", "causal"), shape),
                                       dtype=self.args.dtype),
                       "flops": problem.flops, "n_configs": len(todo), "reference_s": ref_s,
                       "wall_s": time.time() - t, **score_hints(rows, hints)}
            dump(self.out / sub / f"{label(shape, self.args.dtype)}.json", {"summary": summary, "results": rows})
            b = summary["best"] or {"ms": float("nan"), "tflops": float("nan"), "config": None}
            log(f"{sub} {summary['shape']}: best {b['ms']:.4} ms ({b['tflops']:.0f} TFLOP/s) {b['config']}; "
                f"top-1 {summary['carver_top1_vs_best']}, top-8 {summary['carver_top8_vs_best']}; "
                f"mismatching {summary['mismatching_configs']}, {len(todo)} configs in {summary['wall_s']:.0f} s")
            out.append(summary)
        return out

    def sdpa_backends(self) -> dict[str, Any]:
        from torch.nn.attention import SDPBackend

        names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
        return {k: getattr(SDPBackend, v) for k, v in names.items() if hasattr(SDPBackend, v)}

    def sdpa_call(self, backend: Any, q: Any, k: Any, v: Any, causal: bool) -> tuple[Any, str]:
        """A zero-argument SDPA call on ``backend`` and a note ("" or how K/V were adapted), or raises."""
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))  # BSHD -> BHSD views

        def call(kt: Any = kt, vt: Any = vt, gqa: bool = q.shape[2] != k.shape[2]) -> Any:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)

        try:
            call()
            return call, ""
        except RuntimeError:
            if q.shape[2] == k.shape[2]:
                raise
            rep = q.shape[2] // k.shape[2]
            ke, ve = (t.repeat_interleave(rep, dim=1) for t in (kt, vt))
            fn = (lambda: call(ke, ve, False))
            fn()
            return fn, "K/V repeated to every query head (backend refuses enable_gqa)"

    def flash_and_cudnn(self, q: Any, k: Any, v: Any, causal: bool) -> tuple[dict[str, Any], dict[str, str]]:
        """Zero-argument calls of the flash and cuDNN SDPA backends that run here, and a note per backend (how
        it was called, or why it is unavailable)."""
        calls, notes = {}, {}
        for name, backend in self.sdpa_backends().items():
            if name == "efficient":
                continue
            try:
                calls[name], notes[name] = self.sdpa_call(backend, q, k, v, causal)
            except RuntimeError as e:
                notes[name] = f"unavailable: {str(e)[:200]}"
        return calls, notes

    def race_with_sdpa(self, calls: dict[str, Any], q: Any, k: Any, v: Any, causal: bool) -> dict[str, Any]:
        """``calls`` (name -> zero-argument call) and the flash and cuDNN SDPA backends in ``rounds``
        interleaved rounds: medians (``ms``), every round's times and how each backend was called."""
        backends, notes = self.flash_and_cudnn(q, k, v, causal)
        times = self.interleaved({**calls, **backends})
        return {"ms": {n: median(t) for n, t in times.items()}, "rounds": times, "notes": notes}

    def interleaved(self, calls: dict[str, Any]) -> dict[str, list[float]]:
        """Each call's time (ms) in each of ``rounds`` rounds, every call once per round in an order rotated each
        round (:func:`benchlib.round_order`), so that clock drift hits every implementation alike."""
        times: dict[str, list[float]] = {n: [] for n in calls}
        for r in range(self.args.rounds):
            for n in round_order(calls, r):
                times[n].append(self.clock.time(calls[n]))
        return times

    def versus_torch(self, shapes: list[Shape]) -> list[dict[str, Any]]:
        from templates.attention import ATTENTION

        torch = self.torch
        rows: list[dict[str, Any]] = []
        for shape in shapes:
            name = label(shape, self.args.dtype)
            if self.clock.left() < 45:
                log(f"torch: time limit, skipping {name}")
                continue
            problem = self.problem(shape)
            q, k, v = self.inputs(shape)
            ref = ATTENTION.reference(problem)(q, k, v)
            hints = ATTENTION.candidates(problem, self.arch, 8, variants=False)  # ws: attention_ws.py
            kernels: dict[str, Any] = {}
            measured = measure_configs(ATTENTION, problem, hints, (q, k, v), ref, self.clock, self.args.jobs,
                                       kernels=kernels)
            ok = [r for r in measured if r["ms"] is not None]
            if not ok:
                rows.append({"shape": name, "error": "no top-8 config compiled and checked", "hints": measured})
                continue
            best = min(ok, key=lambda r: r["ms"])
            kern = kernels[config_id(best["config"])]  # the checked kernel, not a second compile
            impls: dict[str, Any] = {"ours": lambda kern=kern, q=q, k=k, v=v: kern(q, k, v)}
            notes: dict[str, str] = {}
            for bname, backend in self.sdpa_backends().items():
                try:
                    fn, note = self.sdpa_call(backend, q, k, v, shape[5])
                    err = float((fn().transpose(1, 2).float() - ref.float()).abs().max())
                    impls[bname], notes[bname] = fn, note + (f" max|err| {err:.3g}" if err > 2e-2 else "")
                except Exception as e:  # a backend torch cannot run here is reported, not fatal
                    notes[bname] = f"unavailable: {error_text(e)[:200]}"
            times = self.interleaved(impls)
            med = {n: median(ts) for n, ts in times.items()}
            torch_best = min((m, n) for n, m in med.items() if n != "ours") if len(med) > 1 else (None, None)
            row = {"shape": name, "problem": list(shape), "dtype": self.args.dtype, "config": best["config"],
                   "ms": med, "tflops": {n: problem.flops / m / 1e9 for n, m in med.items()}, "notes": notes,
                   "fastest_torch": torch_best[1],
                   "speedup_vs_fastest_torch": (torch_best[0] / med["ours"]) if torch_best[0] else None,
                   "rounds": times, "top8": [{"config": r["config"], "ms": r["ms"], "error": r["error"]}
                                             for r in measured]}
            log(f"torch {name}: ours {med['ours']:.3f} ms ({row['tflops']['ours']:.0f} TFLOP/s); "
                + ", ".join(f"{n} {m:.3f}" for n, m in med.items() if n != "ours")
                + f"; vs fastest ({torch_best[1]}) {row['speedup_vs_fastest_torch']}")
            rows.append(row)
            dump(self.out / "versus_torch.json", {"device": self.device, "rows": rows})
            del q, k, v, ref
            torch.cuda.empty_cache()
        return rows


def table(grid: list[dict], holdout: list[dict], rows: list[dict]) -> str:
    f = (lambda v: f"{v:.3f}" if v is not None else "-")  # noqa: E731
    lines = ["| shape | set | best ms | TFLOP/s | best config | top-1 | best of top-8 |",
             "|---|---|---|---|---|---|---|"]
    for name, ss in (("calibration", grid), ("holdout", holdout)):
        for s in ss:
            b = s["best"] or {}
            lines.append(f"| {s['shape']} | {name} | {f(b.get('ms'))} | {b.get('tflops') or 0:.0f} | "
                         f"{b.get('config')} | {f(s['carver_top1_vs_best'])} | {f(s['carver_top8_vs_best'])} |")
    backends = sorted({n for r in rows for n in r.get("ms", {}) if n != "ours"})
    lines += ["", "| shape | ours ms | ours TFLOP/s | " + " | ".join(f"{b} TFLOP/s" for b in backends)
              + " | vs fastest torch |", "|---|---|---|" + "---|" * len(backends) + "---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['shape']} | {r['error']} |")
            continue
        tf = r["tflops"]
        lines.append(f"| {r['shape']} | {r['ms']['ours']:.3f} | {tf['ours']:.0f} | "
                     + " | ".join(f"{tf[b]:.0f}" if b in tf else "-" for b in backends)
                     + f" | {f(r['speedup_vs_fastest_torch'])} |")
    sp = [r["speedup_vs_fastest_torch"] for r in rows if r.get("speedup_vs_fastest_torch")]
    if sp:
        lines.append(f"\ngeomean speedup vs the fastest torch backend: {geomean(sp):.3f} over {len(sp)} shapes; "
                     f"min {min(sp):.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--quick", action="store_true", help="one calibration shape, one holdout, two torch shapes")
    p.add_argument("--steps", default="grid,holdout,torch")
    p.add_argument("--shapes", type=parse_shape, nargs="+", help="replace the shapes of every step")
    p.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    p.add_argument("--time-limit", type=float, default=540.0, help="seconds; later shapes are skipped")
    p.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="compile threads")
    p.add_argument("--rep", type=int, default=20)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    steps = set(args.steps.split(","))
    unknown = steps - {"grid", "holdout", "torch"}
    if unknown:
        p.error(f"unknown steps {sorted(unknown)}; use a comma list of grid, holdout, torch")
    b = Bench(args)
    log(f"{b.device}; carver arch {b.arch.name}; out {b.out}")
    pick = (lambda full, quick: args.shapes or (quick if args.quick else full))  # noqa: E731
    grid, holdout, rows = [], [], []
    try:
        if "grid" in steps:
            grid = b.grid(pick(CAL, QUICK_CAL), "grid")
        if "holdout" in steps:
            holdout = b.grid(pick(HOLDOUT, QUICK_HOLDOUT), "holdout")
        if "torch" in steps:
            rows = b.versus_torch(pick(TORCH, QUICK_TORCH))
    except Exception:
        traceback.print_exc()
    finally:
        text = table(grid, holdout, rows)
        print(text)
        b.out.mkdir(parents=True, exist_ok=True)
        (b.out / "summary.md").write_text(text + "\n")
        dump(b.out / "summary.json", {"device": b.device, "date": time.strftime("%Y-%m-%d"), "grid": grid,
                                      "holdout": holdout, "versus_torch": rows, "wall_s": time.time() - T0})
    return 0


if __name__ == "__main__":
    sys.exit(main())
