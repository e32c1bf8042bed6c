"""Does the tuner's timing rank a key's candidates the way a model's forward runs them?

Until 2026-12-07 the op tuned with ``timing="back_to_back"``: after a short heat, each call timed on its own
between two CUDA events (``autotuner.timing.time_callable``, ``mode="sustained"``); since then in groups of calls
between two events (``timing="batched"``, ``mode="batched"``). A model issues its kernels with nothing
between them, so a kernel's launch can overlap the tail of the one before (TileLang launches cluster kernels
with programmatic stream serialization, which needs a kernel, not an event, before it). This times every
candidate ``templates.matmul.space.candidates`` gives a key, compiled as the op serves it (M symbolic), and
``F.linear``, in interleaved rounds, four ways:

* ``per_call``: the op's timing until 2026-12-07, the median of 20 calls each between two events, after 0.05 s
  of heat (named ``tuner`` in ``benchmarks/data/timing-methods-2026-12-07-h100``, which has no ``op`` column);
* ``op``: the op's timing since, the same 20 calls in groups between two events (``mode="batched"``);
* ``batched``: 50 calls back to back between two events, per call;
* ``in_stream``: 50 pairs of a SiLU-gated product (``x = silu(g) * u``, the MLP's op before its down
  projection, an elementwise kernel writing the GEMM's input) and the GEMM, back to back, less 50 products
  alone: the GEMM as the block's forward issues it.

    python3 benchmarks/timing_methods.py --out $OUT/timing --rounds 5 --time-limit 300

Writes ``<out>/timing_methods.json`` after each round and ``<out>/timing_methods.md`` at the end: per key and
method, each candidate's median over the rounds, cuBLAS's time over it, and the candidate each method picks.
Each candidate is first checked against ``x @ W.T`` with its output starting as poison.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import T0, compile_all, dump, log, median, poisoned_call  # noqa: E402
from few_rows import back_to_back_ms, operands  # noqa: E402

METHODS = ("per_call", "op", "batched", "in_stream")
#: the MLP block's keys (Llama-3-8B: hidden 4096, intermediate 14336) where the last tunes' picks and the
#: races disagreed
DEFAULT_KEYS = ("128x4096x14336", "128x14336x4096", "64x4096x14336", "512x4096x14336", "2048x14336x4096")


def short(cfg: dict[str, Any]) -> str:
    s = f"{cfg['block_M']}x{cfg['block_N']}x{cfg['block_K']} s{cfg['num_stages']} t{cfg['thread_num']}"
    for k, default in (("split_k", 1), ("variant", "pipelined"), ("cluster", "1x1"), ("split_reduce", "workspace"),
                       ("persistent", 0), ("warp_policy", "square")):
        if cfg.get(k, default) != default:
            s += f" {k}={cfg[k]}"
    return s + (" r" if cfg["enable_rasterization"] else "")


def timers(x: Any, g: Any, u: Any) -> dict[str, Any]:
    """Each method as ``fn -> ms per call``."""
    import torch
    import torch.nn.functional as F

    from autotuner.timing import time_callable

    def produce() -> None:
        torch.mul(F.silu(g), u, out=x)

    def in_stream(fn: Any) -> float:
        return back_to_back_ms(lambda: (produce(), fn())) - back_to_back_ms(produce)

    def tuned(mode: str) -> Any:
        return lambda fn: time_callable(fn, 3, 20, "cuda", mode=mode, sustain_s=0.05).median_ms

    return {"per_call": tuned("sustained"), "op": tuned("batched"), "batched": back_to_back_ms, "in_stream": in_stream}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keys", nargs="+", default=list(DEFAULT_KEYS), help="MxNxK, fp16 y = x @ W.T")
    ap.add_argument("--topk", type=int, default=4, help="the op's topk (templates.matmul.op.MatmulOp)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=300.0, help="seconds; rounds stop when it is near")
    args = ap.parse_args()

    import tilelang.language as T
    import torch

    import carver
    from templates.matmul import make_problem, space
    from templates.matmul.op import gemm

    arch = carver.arch.CUDA("cuda")  # the local GPU
    cases = []
    for key in args.keys:
        M, N, K = map(int, key.split("x"))
        problem = make_problem(M, N, K, "float16")
        cands = space.candidates(problem, arch, args.topk)
        built = compile_all(None, problem, cands, args.jobs,
                            build=lambda c, N=N, K=K: gemm(T.dynamic("M"), N, K, "float16", **c.kernel_kwargs()))
        x, w = operands(M, N, K, "float16")
        g, u = torch.randn_like(x), torch.randn_like(x)
        ref = (x.float() @ w.float().T)
        kernels = {"cuBLAS": lambda x=x, w=w: torch.nn.functional.linear(x, w)}
        for cfg, k, _secs, err in built:
            name = short(cfg.to_dict())
            if err:
                log(f"{key} {name}: compile failed: {err[:200]}")
                continue
            y = poisoned_call(k, (x, w)).float()
            if not torch.allclose(y, ref, atol=2e-2, rtol=2e-2):
                log(f"{key} {name}: WRONG (max err {(y - ref).abs().max().item():.3g}), not timed")
                continue
            kernels[name] = lambda k=k, x=x, w=w: k(x, w)
        cases.append({"key": key, "kernels": kernels, "x": x, "g": g, "u": u,
                      "configs": {short(c.to_dict()): c.to_dict() for c, k, _, e in built if not e}})
        log(f"{key}: {len(kernels) - 1} of {len(cands)} candidates built and checked")

    rows: dict[str, dict[str, dict[str, list[float]]]] = {
        c["key"]: {n: {m: [] for m in METHODS} for n in c["kernels"]} for c in cases}
    gen = torch.Generator().manual_seed(0)
    for r in range(args.rounds):
        if r and (time_left := args.time_limit - (time.time() - T0)) < 60:
            log(f"stopping after {r} rounds ({time_left:.0f} s left)")
            break
        for c in cases:
            t = timers(c["x"], c["g"], c["u"])
            names = list(c["kernels"])
            for i in torch.randperm(len(names), generator=gen).tolist():
                for m in METHODS:
                    rows[c["key"]][names[i]][m].append(t[m](c["kernels"][names[i]]))
        dump(args.out / "timing_methods.json", {"rows": rows, "configs": {c["key"]: c["configs"] for c in cases},
                                                "device": torch.cuda.get_device_name(), "rounds": r + 1})
        log(f"round {r + 1} done")

    lines = [f"# Timing methods ({torch.cuda.get_device_name()})", ""]
    for c in cases:
        key = c["key"]
        med = {n: {m: median(v[m]) for m in METHODS} for n, v in rows[key].items() if v[METHODS[0]]}
        lines += [f"## {key}", "", "| candidate | " + " | ".join(f"{m} us (cuBLAS/ours)" for m in METHODS) + " |",
                  "|---|" + "---|" * len(METHODS)]
        for n, v in med.items():
            lines.append(f"| {n} | " + " | ".join(
                f"{v[m] * 1e3:.1f} ({med['cuBLAS'][m] / v[m]:.3f})" for m in METHODS) + " |")
        ours = [n for n in med if n != "cuBLAS"]
        picks = {m: min(ours, key=lambda n: med[n][m]) for m in METHODS}
        lines += ["", "picks: " + "; ".join(f"{m}: {p}" for m, p in picks.items()), ""]
        best = med[picks["in_stream"]]["in_stream"]
        for m in ("per_call", "op"):  # what each of the op's timings' pick costs in the block's stream
            lines.append(f"- the {m} timing's pick runs {best / med[picks[m]]['in_stream']:.3f} of the stream's best, "
                         "in the stream")
        lines.append("")
    (args.out / "timing_methods.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
