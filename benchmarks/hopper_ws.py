"""Does the hand-scheduled Hopper loop (``variant="ws"``, issue 14) pay, and is it correct? One GPU run of
about 7 minutes on an H200, from the repository root (after ``. .gpu/setup.sh``):

    python benchmarks/hopper_ws.py --out $OUT/hopper_ws            # both phases, 4 shapes
    python benchmarks/hopper_ws.py --out $OUT/hopper_ws --quick    # 4096^3 and 8192^3 only

Every config goes through the autotuner (``templates.matmul.tuner`` with explicit configs): compiled in
worker processes, checked against torch in an isolated process with NaN-filled outputs and no mismatch
allowed, a kernel that hangs (a barrier protocol bug) killed after ``--run-timeout`` and recorded as a
``timeout`` trial, so a bad config is a row, never the end of the run.

1. **correctness** (at most 40% of ``--budget-s``): ws configs (one and two consumer warpgroups, full_row,
   both clusters, persistent, 256x128) on 600x2800x1000 (5 M tiles and 11 N tiles of 128x256: clusters pad
   their grid) in all four layouts, on 4001x4097x1000 (C rows unaligned, tails everywhere) and fp8;
2. **speed**, per shape (fp16, NT): TileLang's own loop (the carver's top-4 and its Hopper variants), the
   ws configs (an exploratory set plus what the carver's ws term proposes) and each ws config's
   pipelined twin; then every config that passed and cuBLAS in interleaved rounds (``benchmarks/gemm.py``'s
   ``measure``), from whose medians come the pairs, the best ws and pipelined configs, the best ws config
   with C's tile on the ring (``carver.validity.C_ON_RING``) and the best of the tuner's own candidates.

Writes ``hopper_ws.json`` (every trial, after every step) and ``hopper_ws.md`` under ``--out``; the
calibration table pairs each ws config with its twin: measured gain vs the carver's predicted gain.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import gemm  # noqa: E402
from benchlib import T0, dump, log  # noqa: E402
from gemm import _cfg_label, _cuda_up, _environment, _error, _shape, measure  # noqa: E402

from carver.validity import C_ON_RING  # noqa: E402

WIDE = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True,
            variant="ws")
#: The exploratory ws set: the 128x256 tile in its forms, a tall tile, a deeper ring, 128x192, one warpgroup.
EXPLORE = [
    dict(WIDE, warp_policy="full_row"),
    dict(WIDE, warp_policy="full_row", cluster="2x1"),   # multicast B (256 rows)
    dict(WIDE, warp_policy="full_row", cluster="1x2"),   # multicast A (128 rows)
    dict(WIDE, warp_policy="full_row", persistent=-1),   # -1: the GPU's SM count
    dict(WIDE, block_M=256, block_N=128, warp_policy="full_row"),  # square deals it columns (warp_split.py)
    dict(WIDE, block_M=256, block_N=128, warp_policy="full_row", cluster="1x2"),  # multicast A (256 rows)
    dict(WIDE, block_K=32, num_stages=6, warp_policy="full_row"),
    dict(WIDE, block_N=192, num_stages=4, warp_policy="full_row"),
    dict(WIDE, block_N=128, thread_num=128, num_stages=6),  # one consumer warpgroup
    dict(WIDE, warp_policy="full_row", num_stages=4, pass_configs={C_ON_RING: True}),  # C's tile on the ring
    dict(WIDE, warp_policy="full_row", num_stages=4, pass_configs={C_ON_RING: True}, cluster="2x1"),
]
ODD, UNALIGNED = (600, 2800, 1000), (4001, 4097, 1000)
#: (name, shape, dtype, trans_A, trans_B, configs) of the correctness phase.
CHECKS = [
    ("NT-fp16", ODD, "float16", False, True,
     [WIDE, *EXPLORE[:3], dict(WIDE, persistent=13), EXPLORE[4], EXPLORE[8], EXPLORE[9], EXPLORE[10]]),
    ("NN-bf16", ODD, "bfloat16", False, False, [WIDE, EXPLORE[1], EXPLORE[2], dict(WIDE, persistent=13), EXPLORE[9]]),
    ("TN-fp16", ODD, "float16", True, False, [WIDE, EXPLORE[1], EXPLORE[2], dict(WIDE, persistent=13)]),
    ("TT-bf16", ODD, "bfloat16", True, True, [WIDE, EXPLORE[1], EXPLORE[2], dict(WIDE, persistent=13)]),
    ("NT-bf16-C-unaligned", UNALIGNED, "bfloat16", False, True, [EXPLORE[0], EXPLORE[1], dict(WIDE, persistent=7),
                                                                  EXPLORE[9]]),
    ("NT-fp8", (2048, 2048, 1024), "float8_e4m3", False, True, [  # with TileLang's loop as the control
        dict(WIDE, block_K=128), dict(WIDE, block_K=128, cluster="1x2"), dict(WIDE, block_K=128, variant="pipelined")]),
]
SHAPES = ("4096x4096x4096", "8192x8192x8192", "4000x4000x4000", "4001x4097x4096")


def run_tuner(M: int, N: int, K: int, dtype: str, trans_A: bool, trans_B: bool, configs: list[dict[str, Any]],
              args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per config: the autotuner's trial (status, ms, error), or why the rules refused it."""
    from templates import matmul as mm

    out_dtype = "float16" if dtype == "float8_e4m3" else dtype
    problem = mm.make_problem(M, N, K, dtype, out_dtype, "float32", trans_A, trans_B)
    rows, legal = [], []
    for cfg in configs:
        why = mm.check(problem, mm.MatmulConfig.from_dict(cfg))
        if why:
            rows.append(dict(config=cfg, label=_cfg_label(cfg), status="refused", ms=None, error="; ".join(why)))
        elif cfg not in legal:
            legal.append(cfg)
    if legal:
        t = mm.tuner(M, N, K, dtype=dtype, trans_A=trans_A, trans_B=trans_B, out_dtype=out_dtype, configs=legal,
                     compile_timeout=240)
        t.set_tuning(progress=False, cache=False, run_timeout=args.run_timeout)
        res = t.run(warmup=3, rep=args.rep)
        rows += [dict(config=t.config, label=_cfg_label(t.config), status=str(t.status), ms=t.latency,
                      error=(t.error or "")[-600:] or None) for t in res.trials]
    return rows


def correctness(args: argparse.Namespace, report: dict[str, Any]) -> None:
    deadline = T0 + 0.4 * args.budget_s
    for name, (M, N, K), dtype, ta, tb, configs in CHECKS:
        if time.time() > deadline - 20:
            report["correctness"].append(dict(case=name, skipped="time budget"))
            continue
        log(f"correctness {name} {M}x{N}x{K}: {len(configs)} ws configs")
        try:
            rows = run_tuner(M, N, K, dtype, ta, tb, configs, args)
        except Exception as e:  # noqa: BLE001 - a case that fails as a whole is a row
            rows, err = [], _error(e)
        else:
            err = None
        report["correctness"].append(dict(case=name, M=M, N=N, K=K, dtype=dtype, trans_A=ta, trans_B=tb,
                                          trials=rows, error=err))
        bad = [r for r in rows if r["status"] != "ok"]
        log(f"    {len(rows) - len(bad)}/{len(rows)} ok" + "".join(f"\n    {r['status']}: {r['label']}: "
                                                             f"{(r['error'] or '')[:200]}" for r in bad))
        dump(args.out / "hopper_ws.json", report)


def speed_configs(M: int, N: int, K: int, arch: Any) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """The configs to time, legal on ``arch``: the carver's candidates (TileLang-loop hints, their Hopper
    variants, the ws variants its term proposes), the exploratory ws set, and each ws config's pipelined
    twin (same keys, ``variant="pipelined"``, no cluster), with the map ws label -> twin."""
    from templates import matmul as mm

    problem = mm.make_problem(M, N, K, "float16")
    configs = list(mm.candidates(problem, arch, 4))
    for d in EXPLORE:
        c = mm.MatmulConfig(**{**d, "persistent": arch.sm_count if d.get("persistent") == -1 else
                               d.get("persistent", 0)})
        if c not in configs:
            configs.append(c)
    configs = [c for c in configs if not mm.check(problem, c, arch)]
    twins: dict[str, dict[str, Any]] = {}
    for c in [c for c in configs if c.variant == "ws"]:
        twin = dataclasses.replace(c, variant="pipelined", cluster="1x1", pass_configs=())
        if not mm.check(problem, twin, arch):
            twins[_cfg_label(c.to_dict())] = twin.to_dict()
            if twin not in configs:
                configs.append(twin)
    return [c.to_dict() for c in configs], twins


def calibration(M: int, N: int, K: int, arch: Any, rows: list[dict[str, Any]],
                twins: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each ws config against its twin (``ms`` of ``rows``: the interleaved medians), next to the carver's
    predicted gain."""
    from carver.problem import MatmulProblem
    from carver.validity import normalize_config
    from carver.ws_model import ws_gain
    from templates.matmul.config import kernel_part

    ok = {r["label"]: r for r in rows if r["ms"] is not None}
    out = []
    for label, twin in twins.items():
        w, p = ok.get(label), ok.get(_cfg_label(twin))
        pred = None
        if w:
            pred = ws_gain(MatmulProblem(M, N, K), arch, normalize_config(kernel_part(twin), kernel_keys=True)[0],
                           normalize_config(kernel_part(w["config"]), kernel_keys=True)[0])
        out.append(dict(ws=label, twin=_cfg_label(twin), ws_ms=w and w["ms"], twin_ms=p and p["ms"],
                        measured_gain=p["ms"] / w["ms"] if w and p else None, predicted_gain=pred))
    return out


def speed(args: argparse.Namespace, report: dict[str, Any], arch: Any) -> None:
    from templates import matmul as mm

    for M, N, K in args.shapes:
        if time.time() > T0 + args.budget_s - 45:
            report["speed"].append(dict(M=M, N=N, K=K, skipped="time budget"))
            continue
        row: dict[str, Any] = dict(M=M, N=N, K=K, dtype="float16")
        try:
            configs, twins = speed_configs(M, N, K, arch)
            log(f"speed {M}x{N}x{K}: {len(configs)} configs ({sum(c.get('variant') == 'ws' for c in configs)} ws)")
            rows = run_tuner(M, N, K, "float16", False, True, configs, args)
            row["trials"] = rows
            # every checked config and cuBLAS in interleaved rounds: the autotuner's burst timings, one config
            # after another, drift with the GPU's clock by more than the gains measured here (2-5%)
            kernels = {r["label"]: mm.compile(M, N, K, r["config"], dtype="float16")
                       for r in rows if r["ms"] is not None}
            log(f"    {len(kernels)} checked configs and cuBLAS, interleaved")
            versus = measure(dict(M=M, N=N, K=K, dtype="float16"), kernels)
            for r in rows:
                r["burst_ms"], r["ms"] = r["ms"], versus.get(f"{r['label']}_ms")
            row["calibration"] = calibration(M, N, K, arch, rows, twins)
            # the best ws and pipelined configs, the tuner's pick among its own candidates, the best ws config
            # with C's tile on the ring
            cands = {_cfg_label(c.to_dict()) for c in mm.candidates(mm.make_problem(M, N, K, "float16"), arch, 4)}
            groups = {v: [r for r in rows if r["config"].get("variant", "pipelined") == v] for v in ("ws", "pipelined")}
            groups.update(tuned=[r for r in rows if r["label"] in cands],
                          ring=[r for r in rows if r["label"].endswith("C-on-ring")])
            best = {name: min((r for r in kept if r["ms"] is not None), key=lambda r: r["ms"], default=None)
                    for name, kept in groups.items()}
            row["best"] = {v: b and b["label"] for v, b in best.items()}
            row.update(cublas_ms=versus.get("cublas_ms"), cublas_round_ms=versus.get("cublas_round_ms"),
                       **{f"{v}_ms": b["ms"] for v, b in best.items() if b},
                       **{f"{v}_err": versus.get(f"{b['label']}_err") for v, b in best.items() if b})
        except Exception as e:  # noqa: BLE001 - one failed shape is a row, not the end of the run
            row["error"] = _error(e)
        report["speed"].append(row)
        dump(args.out / "hopper_ws.json", report)
        c = row.get("cublas_ms")
        if not c:
            log(f"    error: {row.get('error', '')[:400]}")
            continue
        log(f"    cuBLAS {2 * M * N * K / c / 1e9:.0f} TFLOP/s")
        for v in ("ws", "pipelined"):
            if row.get(f"{v}_ms"):
                log(f"    best {v:9s} {row['best'][v]}: {c / row[f'{v}_ms']:.3f}x cuBLAS")
        if row.get("ws_ms") and row.get("pipelined_ms"):
            log(f"    ws / pipelined: {row['pipelined_ms'] / row['ws_ms']:.3f}x")
        for v in ("tuned", "ring"):
            if row.get(f"{v}_ms"):
                log(f"    {v} {row['best'][v]}: {c / row[f'{v}_ms']:.3f}x cuBLAS, max err {row.get(f'{v}_err')}")
        for p in row["calibration"]:
            g = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            log(f"    gain {p['ws']}: measured {g(p['measured_gain'])}, predicted {g(p['predicted_gain'])}")


def render(report: dict[str, Any]) -> str:
    env = report["env"]
    lines = [f"Device: {env.get('device')} ({env.get('sms')} SMs); torch {env.get('torch')}, tilelang "
             f"{env.get('tilelang')}; {report['date']}", f"Command: `{report['command']}`", "", "## Correctness", "",
             "| case | shape | config | status | error |", "|---|---|---|---|---|"]
    for case in report["correctness"]:
        shape = f"{case.get('M')}x{case.get('N')}x{case.get('K')} {case.get('dtype', '')}"
        if case.get("skipped") or case.get("error"):
            lines.append(f"| {case['case']} | {shape} | - | {case.get('skipped') or 'error'} | "
                         f"{(case.get('error') or '')[:120]} |")
        for r in case.get("trials", []):
            lines.append(f"| {case['case']} | {shape} | {r['label']} | {r['status']} | {(r['error'] or '')[:120]} |")
    lines += ["", "## Speed (fp16, NT; ratios > 1: faster than the denominator)", "",
              "| shape | cuBLAS TFLOP/s | best ws | ws / cuBLAS | best pipelined | pipelined / cuBLAS | "
              "ws / pipelined | best C on the ring | / cuBLAS | the tuner's pick | / cuBLAS |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["speed"]:
        c, w, p = r.get("cublas_ms"), r.get("ws_ms"), r.get("pipelined_ms")
        f = lambda x, y: f"{x / y:.3f}" if x and y else "-"  # noqa: E731
        tf = f"{2 * r['M'] * r['N'] * r['K'] / c / 1e9:.0f}" if c else r.get("skipped") or "error"
        best = r.get("best", {})
        lines.append(f"| {r['M']}x{r['N']}x{r['K']} | {tf} | {best.get('ws')} | {f(c, w)} | {best.get('pipelined')} | "
                     f"{f(c, p)} | {f(p, w)} | {best.get('ring')} | {f(c, r.get('ring_ms'))} | {best.get('tuned')} | "
                     f"{f(c, r.get('tuned_ms'))} |")
    lines += ["", "## Calibration pairs (interleaved rounds; gain = twin ms / ws ms)", "",
              "| shape | ws config | ws ms | twin ms | measured gain | predicted gain |", "|---|---|---|---|---|---|"]
    for r in report["speed"]:
        for p in r.get("calibration", []):
            g = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {r['M']}x{r['N']}x{r['K']} | {p['ws']} | {g(p['ws_ms'])} | {g(p['twin_ms'])} | "
                         f"{g(p['measured_gain'])} | {g(p['predicted_gain'])} |")
    return "\n".join(lines) + "\n"


def dry_run(args: argparse.Namespace) -> int:
    """Without a GPU: every config of both phases, checked by the carver's rules for ``args.dry_run``."""
    from carver.arch import CUDA
    from templates import matmul as mm

    arch = CUDA(args.dry_run)
    for name, (M, N, K), dtype, ta, tb, configs in CHECKS:
        problem = mm.make_problem(M, N, K, dtype, None, "float32", ta, tb)
        for cfg in configs:
            why = mm.check(problem, mm.MatmulConfig.from_dict(cfg), arch)
            print(f"correctness {name:22s} {_cfg_label(cfg):55s} {'; '.join(why) or 'ok'}")
    for M, N, K in args.shapes:
        configs, twins = speed_configs(M, N, K, arch)
        for cfg in configs:
            print(f"speed {M}x{N}x{K} {_cfg_label(cfg)}" + (" (twin)" if cfg in twins.values() else ""))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".bench")) / "hopper_ws")
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget; phases stop starting work")
    ap.add_argument("--shapes", nargs="+", type=_shape, default=[_shape(s) for s in SHAPES])
    ap.add_argument("--quick", action="store_true", help="speed on 4096^3 and 8192^3 only")
    ap.add_argument("--skip-correctness", action="store_true")
    ap.add_argument("--rep", type=int, default=20, help="timed calls per config in the autotuner")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of every config and cuBLAS")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds one config may run (hang guard)")
    ap.add_argument("--dry-run", metavar="GPU", help="no GPU: list and check every config for this GPU (e.g. H200)")
    args = ap.parse_args(argv)
    gemm._ROUNDS = args.rounds
    if args.quick:
        args.shapes = args.shapes[:2]
    if args.dry_run:
        return dry_run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(os.environ.get("TMPDIR", "/tmp")) / "hopper_ws_cache"  # outside --out: not copied back
    os.environ.setdefault("TILECARVE_CACHE_DIR", str(scratch / "tilecarve"))
    os.environ.setdefault("TILELANG_CACHE_DIR", str(scratch / "tilelang"))
    _cuda_up()
    report: dict[str, Any] = dict(
        env=_environment(), date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        command="python benchmarks/hopper_ws.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        correctness=[], speed=[])
    from templates import matmul as mm

    arch = mm.MATMUL.resolve(mm.make_problem(16, 16, 16), "auto").arch
    if not args.skip_correctness:
        correctness(args, report)
    speed(args, report, arch)
    md = render(report)
    (args.out / "hopper_ws.md").write_text(md)
    dump(args.out / "hopper_ws.json", report)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
