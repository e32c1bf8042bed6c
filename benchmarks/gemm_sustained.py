"""Burst against sustained timing: does a config's speed relative to cuBLAS hold once the GPU is hot?

The autotuner times each candidate in short bursts (``rep=20`` calls); the scoreboard times 100 calls,
three interleaved rounds. On an H200 (2026-11-21) the same kernel measured 741 TFLOP/s in the tuner and
623-649 on the board, while cuBLAS held 719-760. This script times cuBLAS and our kernels in interleaved
rounds (the order rotated every round), each round once as a burst (``--burst`` calls, each after an L2
flush) and once sustained (``--sustained`` such calls in a row, which takes the GPU to its power cap), and
reads the SM clock, power and temperature from ``nvidia-smi`` after every timing, so the two can be told
apart.

    python benchmarks/gemm_sustained.py --out .bench/sustained --shapes 2048x14336x4096 \\
        --configs '128x256x64 s3 t256 r full_row' '128x256x64 s4 t256 r' '128x256x64 s3 t256 r'
    python benchmarks/gemm_sustained.py --out .bench/sustained --tuned --dtypes fp16,bf16 \\
        --shapes 4096x4096x4096 2048x14336x4096 2048x4096x14336 8192x8192x8192 4000x4000x4000

``--tuned`` tunes each case first (``templates.matmul.tuner``, the carver's top ``--topk`` and the
family's variants, as the board's ``ours`` phase does, from cold in a cache of its own under ``--out``) and
times the kernel it returns: issue 14's
targets, under sustained timing and in bursts, per case and as geomeans (``sustained.md``). A config is
written as the board labels it, ``BMxBNxBK sS tT [r] [full_row] [persistentP]``, or as a JSON object of
any matmul config (``'{"block_M": 128, ..., "variant": "ws"}'``). Every kernel is checked against cuBLAS
before it is timed; a case that fails is a row with its error, and ``sustained.json`` is rewritten after
every case, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (  # noqa: E402
    dump,
    error_text,
    geomean,
    median,
    mismatches,
    poisoned_call,
    round_order,
    whole_rotations,
)
from gemm import _cublas_nt, _cuda_up, _environment, _inputs, _shape, _tflops  # noqa: E402


def parse_config(label: str) -> dict[str, Any]:
    """``"128x256x64 s3 t256 r full_row persistent132"`` -> the template's config dict; a label that starts
    with ``{`` is read as JSON, a config of any keys the matmul family takes (``variant``, ``pass_configs``...)."""
    if label.lstrip().startswith("{"):
        try:
            cfg = json.loads(label)
        except json.JSONDecodeError as e:
            raise ValueError(f"config {label!r} is not JSON: {e}") from None
        return cfg
    parts = label.split()
    try:
        bm, bn, bk = (int(x) for x in parts[0].split("x"))
    except (ValueError, IndexError):
        raise ValueError(f"config {label!r}: it starts with the tile, BMxBNxBK (e.g. 128x256x64)") from None
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


DTYPES = {"fp16": "float16", "bf16": "bfloat16", "float16": "float16", "bfloat16": "bfloat16"}


def time_round(fns: dict[str, Any], c: dict[str, Any], r: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One round: every kernel as a burst, then every kernel sustained, each followed by the GPU's state."""
    from autotuner.timing import time_callable

    rows = []
    for mode, rep in (("burst", args.burst), ("sustained", args.sustained)):
        for name in round_order(list(fns), r):
            fn = fns[name]
            ms = time_callable(fn, 3, rep, "cuda").median_ms
            rows.append(dict(round=r, mode=mode, kernel=name, ms=ms, tflops=_tflops(c, ms), **gpu_state()))
            print(f"round {r} {mode:9s} {name[:40]:40s} {rows[-1]['tflops']:7.1f} TFLOP/s  "
                  f"{rows[-1].get('clocks.sm', '')} {rows[-1].get('power.draw', '')}", flush=True)
    return rows


def medians(rounds: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """Each kernel's median TFLOP/s over the rounds of ``mode``."""
    return {name: median([x["tflops"] for x in rounds if x["mode"] == mode and x["kernel"] == name])
            for name in dict.fromkeys(x["kernel"] for x in rounds)}


def ratios(rounds: list[dict[str, Any]], mode: str) -> dict[str, float]:
    """Each kernel's median TFLOP/s over the rounds of ``mode``, over cuBLAS's."""
    med = medians(rounds, mode)
    return {name: v / med["cublas"] for name, v in med.items() if name != "cublas"}


def report(cases: list[dict[str, Any]], env: dict[str, Any], argv: list[str]) -> str:
    """The per-case table and, for ``--tuned``, issue 14's targets."""
    lines = [f"# Burst against sustained timing, {env.get('device', '?')}", "",
             f"{env['date']}, `{' '.join(argv)}`", "",
             "TFLOP/s ratios to cuBLAS in the same mode and sustained TFLOP/s, medians over interleaved rounds; "
             "the SM clock as `nvidia-smi` read it after the kernel's last sustained timing.", "",
             "| shape | dtype | kernel | burst | sustained | sustained TFLOP/s (cuBLAS) | last clock (cuBLAS) "
             "| config |",
             "|---|---|---|---|---|---|---|---|"]
    tuned: dict[str, list[float]] = {"burst": [], "sustained": []}
    for case in cases:
        shape = f"{case['M']}x{case['N']}x{case['K']}"
        if "error" in case:
            lines.append(f"| {shape} | {case['dtype']} | | failed: {case['error'][:100]} | | | | |")
            continue
        rb, rs = ratios(case["rounds"], "burst"), ratios(case["rounds"], "sustained")
        last = {x["kernel"]: x for x in case["rounds"] if x["mode"] == "sustained"}
        tf = medians(case["rounds"], "sustained")
        for name in rb:
            if name == "tuned":
                tuned["burst"].append(rb[name])
                tuned["sustained"].append(rs[name])
            lines.append(f"| {shape} | {case['dtype']} | {name[:60]} | {rb[name]:.3f} | {rs[name]:.3f} | "
                         f"{tf[name]:.0f} ({tf['cublas']:.0f}) | "
                         f"{last[name].get('clocks.sm', '?')} ({last['cublas'].get('clocks.sm', '?')}) | "
                         f"{json.dumps(case['configs'].get(name), sort_keys=True)} |")
    if tuned["burst"]:
        g = {m: geomean(v) for m, v in tuned.items()}
        lo = {m: min(v) for m, v in tuned.items()}
        lines += ["", "| target (issue 14, the tuned kernel) | goal | measured | met |", "|---|---|---|---|",
                  f"| geomean vs cuBLAS, sustained | >= 1.0 | {g['sustained']:.3f} | "
                  f"{'yes' if g['sustained'] >= 1.0 else 'no'} |",
                  f"| geomean vs cuBLAS, bursts | >= 1.02 | {g['burst']:.3f} | "
                  f"{'yes' if g['burst'] >= 1.02 else 'no'} |",
                  f"| no case below 0.97 (either mode) | >= 0.97 | {min(lo.values()):.3f} | "
                  f"{'yes' if min(lo.values()) >= 0.97 else 'no'} |",
                  "", f"{len(tuned['burst'])} cases timed of {len(cases)}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--shapes", "--shape", dest="shapes", nargs="+", required=True, type=_shape, help="MxNxK ...")
    ap.add_argument("--dtypes", "--dtype", dest="dtypes", default="fp16", help="comma list of fp16, bf16")
    ap.add_argument("--configs", nargs="*", default=[], help="board labels or JSON objects, timed on every case")
    ap.add_argument("--tuned", action="store_true", help="tune each case first and time the kernel it returns")
    ap.add_argument("--topk", type=int, default=8, help="with --tuned: the carver's hints tuned (the board's 8)")
    ap.add_argument("--rounds", type=int, default=4,
                    help="interleaved rounds, the order rotated each round (raised to a multiple of the kernels)")
    ap.add_argument("--burst", type=int, default=20, help="calls per burst timing (the tuner's rep)")
    ap.add_argument("--sustained", type=int, default=400, help="calls per sustained timing")
    ap.add_argument("--time-limit", type=float, default=None, help="seconds; no new case starts past it")
    args = ap.parse_args(argv)
    if not args.tuned and not args.configs:
        ap.error("nothing to time: give --tuned, --configs, or both")
    bad = [d for d in args.dtypes.split(",") if d.strip() not in DTYPES]
    if bad:
        ap.error(f"--dtypes: {', '.join(map(repr, bad))} unknown; use {', '.join(DTYPES)}")
    dtypes = [DTYPES[d.strip()] for d in args.dtypes.split(",")]
    try:
        labels = {label: parse_config(label) for label in args.configs}
    except ValueError as e:
        ap.error(str(e))
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    n_kernels = 1 + args.tuned + len(labels)
    if (rounds := whole_rotations(args.rounds, n_kernels)) != args.rounds:
        print(f"--rounds {args.rounds} -> {rounds}: a multiple of the {n_kernels} kernels, so each leads "
              f"{rounds // n_kernels} rounds", flush=True)
        args.rounds = rounds
    # tuned from cold, as the board's ``ours`` phase: a cache of this run's own, emptied first, not the user's
    cache = args.out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    os.environ.update(TILECARVE_CACHE_DIR=str(cache / "tilecarve"), TILELANG_CACHE_DIR=str(cache / "tilelang"))
    t0 = time.perf_counter()
    from templates import matmul as mm

    _cuda_up()
    env = dict(_environment(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    argv_used = [Path(sys.argv[0]).name, *(sys.argv[1:] if argv is None else argv)]
    cases: list[dict[str, Any]] = []
    for M, N, K in args.shapes:
        for dtype in dtypes:
            c = dict(M=M, N=N, K=K, dtype=dtype)
            case: dict[str, Any] = dict(c, configs={}, rounds=[])
            cases.append(case)
            if args.time_limit is not None and time.perf_counter() - t0 > args.time_limit:
                case["error"] = "time limit: not run"
                continue
            try:
                a, b = _inputs(c)
                ref = _cublas_nt(a, b)
                fns = {"cublas": functools.partial(_cublas_nt, a, b)}
                if args.tuned:
                    t1 = time.perf_counter()
                    res = mm.tuner(M, N, K, dtype=dtype, topk=args.topk).run(warmup=3, rep=20)
                    case.update(tune_s=time.perf_counter() - t1, from_cache=res.from_cache)
                    fns["tuned"], case["configs"]["tuned"] = functools.partial(res.kernel, a, b), res.config
                for label, cfg in labels.items():
                    kernel = mm.compile(M, N, K, cfg, dtype=dtype)
                    fns[label], case["configs"][label] = functools.partial(kernel, a, b), cfg
                for name, fn in fns.items():  # a wrong kernel's speed is no result; C starts as poison
                    if name != "cublas" and (bad := mismatches(poisoned_call(fn, ()), ref, atol=2e-2, rtol=2e-2)):
                        raise AssertionError(f"{name}: {bad} elements differ from cuBLAS's")
                for r in range(args.rounds):
                    case["rounds"] += time_round(fns, c, r, args)
            except Exception as e:  # noqa: BLE001 - a failed case is a row, not the end of the run
                case["error"] = error_text(e)
                print(f"{M}x{N}x{K} {dtype}: {case['error']}", flush=True)
            dump(args.out / "sustained.json", dict(env=env, argv=argv_used, cases=cases))
    text = report(cases, env, argv_used)
    (args.out / "sustained.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
