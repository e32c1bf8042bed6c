"""Burst against sustained timing: does a config's speed relative to cuBLAS hold once the GPU is hot?

The autotuner times each candidate in short bursts (``rep=20`` calls); the scoreboard times 100 calls,
three interleaved rounds. On an H200 (2026-11-21) the same kernel measured 741 TFLOP/s in the tuner and
623-649 on the board, while cuBLAS held 719-760. This script times cuBLAS and the given configs in
interleaved rounds, each round once as a burst and once sustained, and reads the SM clock, power and
temperature from ``nvidia-smi`` after every round, so the two can be told apart.

    python benchmarks/gemm_sustained.py --out .bench/sustained --shape 2048x14336x4096 \\
        --configs '128x256x64 s3 t256 r full_row' '128x256x64 s4 t256 r' '128x256x64 s3 t256 r'

A config is written as the board labels it: ``BMxBNxBK sS tT [r] [full_row] [persistentP]``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gemm import _cublas_nt, _cuda_up, _environment, _inputs, _shape, _tflops  # noqa: E402


def parse_config(label: str) -> dict[str, Any]:
    """``"128x256x64 s3 t256 r full_row persistent132"`` -> the template's config dict."""
    parts = label.split()
    bm, bn, bk = (int(x) for x in parts[0].split("x"))
    cfg: dict[str, Any] = dict(block_M=bm, block_N=bn, block_K=bk, enable_rasterization="r" in parts[1:])
    for p in parts[1:]:
        if p.startswith("s") and p[1:].isdigit():
            cfg["num_stages"] = int(p[1:])
        elif p.startswith("t") and p[1:].isdigit():
            cfg["thread_num"] = int(p[1:])
        elif p in ("full_row", "full_col"):
            cfg["warp_policy"] = p
        elif p.startswith("persistent"):
            cfg["persistent"] = int(p[len("persistent"):])
        elif p != "r":
            raise ValueError(f"config {label!r}: cannot read {p!r}; write "
                             "'BMxBNxBK sS tT [r] [full_row] [persistentP]'")
    return cfg


def gpu_state() -> dict[str, str]:
    q = "clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return {}
    return dict(zip(q.split(","), (v.strip() for v in out.split(","))))


def main(argv: list[str] | None = None) -> int:
    from autotuner.timing import time_callable
    from templates import matmul as mm

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shape", required=True)
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--configs", nargs="+", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--burst", type=int, default=20, help="calls per burst timing (the tuner's rep)")
    ap.add_argument("--sustained", type=int, default=400, help="calls per sustained timing")
    args = ap.parse_args(argv)
    M, N, K = _shape(args.shape)
    c = dict(M=M, N=N, K=K, dtype=args.dtype)
    _cuda_up()
    a, b = _inputs(c)
    fns = {"cublas": functools.partial(_cublas_nt, a, b)}
    for label in args.configs:
        fns[label] = functools.partial(mm.compile(M, N, K, parse_config(label), dtype=args.dtype), a, b)
    rounds = []
    for r in range(args.rounds):
        for mode, rep in (("burst", args.burst), ("sustained", args.sustained)):
            for name, fn in fns.items():
                ms = time_callable(fn, 3, rep, "cuda").median_ms
                rounds.append(dict(round=r, mode=mode, kernel=name, tflops=_tflops(c, ms), **gpu_state()))
                print(f"round {r} {mode:9s} {name:40s} {rounds[-1]['tflops']:7.1f} TFLOP/s  "
                      f"{rounds[-1].get('clocks.sm', '')} {rounds[-1].get('power.draw', '')}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(_environment(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    (args.out / "sustained.json").write_text(json.dumps(dict(env=env, argv=sys.argv, case=c, rounds=rounds),
                                                        indent=1))
    print("\nmedian over rounds, ratio to cuBLAS in the same mode:")
    for mode in ("burst", "sustained"):
        cub = sorted(x["tflops"] for x in rounds if x["mode"] == mode and x["kernel"] == "cublas")
        cub_med = cub[len(cub) // 2]
        for name in fns:
            v = sorted(x["tflops"] for x in rounds if x["mode"] == mode and x["kernel"] == name)
            print(f"  {mode:9s} {name:40s} {v[len(v) // 2]:7.1f} TFLOP/s  {v[len(v) // 2] / cub_med:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
