"""How should two consumer warpgroups split a tile at least as tall as wide? TileLang's default
``GemmWarpPolicy.Square`` gives a 128x128 tile (256 threads) one m64n64 wgmma per 64 rows per warpgroup, and
a 256x128 tile the same: each warpgroup takes half the *columns*. ``warp_policy="full_row"`` gives each
warpgroup whole rows, so one m64n128 wgmma reads A's 64x16 and B's 128x16 where two m64n64 read A twice:
a quarter less shared memory per FLOP. The carver's variants proposed ``full_row`` only for tiles wider
than tall, and ``carver.ws_model`` carried a fitted "tall tile loss" for the ws loop's 256x128 tiles,
all of which were measured square.

One run on the GPU machine, from the repository root (after ``. .gpu/setup.sh``):

    python benchmarks/warp_split.py --out $OUT/warp_split                 # the shapes below
    python benchmarks/warp_split.py --out $OUT/ws --shapes 4096x4096x4096 --dry-run H200   # list, no GPU

Per shape: the tuner's candidates (``templates.matmul.candidates``, topk 4), the full_row twin of each
candidate with a square split of two consumer warpgroups, and each base tile of :data:`TILES` as a
``square`` and a ``full_row`` twin, in TileLang's pipelined loop and in the ws loop. All go through the
autotuner (compiled in worker processes, checked against torch with NaN-filled outputs); every config that
passes is then timed with cuBLAS in ``--rounds`` interleaved rounds (``benchmarks/gemm.py``'s ``measure``),
and the pairs and the bests are read from those medians. Writes ``warp_split.json`` after every shape and
``warp_split.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import gemm  # noqa: E402
from benchlib import T0, dump, geomean, log  # noqa: E402
from gemm import _cfg_label, _cuda_up, _environment, _error, _fmt, _shape, measure  # noqa: E402
from hopper_ws import run_tuner  # noqa: E402

#: The MLP block's projections at 128-8192 tokens (issue 12) and two squares (issue 14).
SHAPES = ("128x4096x14336", "512x4096x14336", "2048x14336x4096", "2048x4096x14336", "8192x14336x4096",
          "8192x4096x14336", "4096x4096x4096", "8192x8192x8192")
#: (block_M, block_N, block_K, num_stages, split_k) of the base tiles, 256 consumer threads each; 128x256
#: (full_row already proposed for it) for comparison.
TILES = ((128, 128, 64, 4, 1), (128, 128, 128, 3, 1), (256, 128, 64, 3, 1), (128, 256, 64, 3, 1), (128, 128, 128, 3, 4))
VARIANTS = ("pipelined", "ws")


def configs_for(M: int, N: int, K: int, arch: Any) -> tuple[list[dict[str, Any]], int, int]:
    """The tuner's candidates (topk 4), their full_row twins not among them, then the square and full_row
    twins of every base tile and variant that the rule table allows on ``arch`` for this shape (split-K
    tiles only where their tiles fill less than a wave, and never ws); with the counts of the first two."""
    import math

    from templates import matmul as mm

    problem = mm.make_problem(M, N, K, "float16")
    out = [c.to_dict() for c in mm.candidates(problem, arch, 4)]
    n_cand = len(out)
    for c in out[:n_cand]:
        twin = mm.MatmulConfig.from_dict({**c, "warp_policy": "full_row"})
        if c.get("warp_policy", "square") == "square" and not mm.check(problem, twin, arch) \
                and twin.to_dict() not in out:
            out.append(twin.to_dict())
    n_twins = len(out) - n_cand
    for bm, bn, bk, stages, split in TILES:
        tiles = math.ceil(M / bm) * math.ceil(N / bn)
        if split > 1 and tiles * split > 2 * arch.sm_count or split == 1 and tiles < arch.sm_count // 2:
            continue
        for variant in VARIANTS if split == 1 else ("pipelined",):
            for policy in ("square", "full_row"):
                cfg = dict(block_M=bm, block_N=bn, block_K=bk, num_stages=stages, thread_num=256,
                           enable_rasterization=True, warp_policy=policy, variant=variant, split_k=split)
                c = mm.MatmulConfig.from_dict(cfg).to_dict()
                if not mm.check(problem, mm.MatmulConfig.from_dict(cfg), arch) and c not in out:
                    out.append(c)
    return out, n_cand, n_twins


def pairs(rows: list[dict[str, Any]], ms: dict[str, float]) -> list[dict[str, Any]]:
    """Each square config with a full_row twin against it, from the interleaved medians ``ms`` (by label;
    gain = square / full_row, > 1: full_row faster)."""
    out = []
    for r in rows:
        label, twin = _cfg_label(r["config"]), _cfg_label({**r["config"], "warp_policy": "full_row"})
        if r["config"].get("warp_policy", "square") != "square" or twin == label \
                or not any(_cfg_label(o["config"]) == twin for o in rows):
            continue
        sq, fr = ms.get(label), ms.get(twin)
        out.append(dict(square=label, square_ms=sq, full_row_ms=fr, gain=sq / fr if sq and fr else None))
    return out


def render(report: dict[str, Any]) -> str:
    lines = [f"# Square against full_row warp splits, {report['env'].get('device', '?')}", "",
             f"{report['date']}, `{report['command']}`", "",
             "Interleaved rounds (flushed L2), square / full_row (> 1: full_row faster):", "",
             "| shape | tile | square ms | full_row ms | gain |", "|---|---|---|---|---|"]
    for row in report["shapes"]:
        lines += [f"| {row['shape']} | {p['square']} | {_fmt(p['square_ms'], '.4f')} | "
                  f"{_fmt(p['full_row_ms'], '.4f')} | {_fmt(p['gain'], '.3f')} |" for p in row.get("pairs", [])]
    lines += ["", "The same rounds, bests against cuBLAS: the tuner's candidates; with their full_row twins; "
              "everything here; the best square and the best full_row config:", "",
              "| shape | candidates | + twins | all | best | best square | / cuBLAS | best full_row | / cuBLAS |",
              "|---|---|---|---|---|---|---|---|---|"]
    for row in report["shapes"]:
        b = row.get("best") or {}
        if b:
            ratio = {name: f"{v[1]:.3f}" for name, v in b.items()}
            label = {name: v[0] for name, v in b.items()}
            lines.append(f"| {row['shape']} | {ratio.get('candidates', '-')} | {ratio.get('twins', '-')} | "
                         f"{ratio.get('all', '-')} | {label.get('all', '-')} | {label.get('square', '-')} | "
                         f"{ratio.get('square', '-')} | {label.get('full_row', '-')} | {ratio.get('full_row', '-')} |")
    gains = [p["gain"] for row in report["shapes"] for p in row.get("pairs", []) if p["gain"]]
    if gains:
        lines += ["", f"geomean gain over {len(gains)} pairs: {geomean(gains):.3f}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".bench")) / "warp_split")
    ap.add_argument("--shapes", nargs="+", type=_shape, default=[_shape(s) for s in SHAPES])
    ap.add_argument("--budget-s", type=float, default=420.0, help="wall-clock budget; no shape starts after it")
    ap.add_argument("--rep", type=int, default=20, help="timed calls per config in the autotuner")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds of every config and cuBLAS")
    ap.add_argument("--run-timeout", type=float, default=60.0, help="seconds one config may run (hang guard)")
    ap.add_argument("--dry-run", metavar="GPU", help="no GPU: list the configs for this GPU (e.g. H200)")
    args = ap.parse_args(argv)
    gemm._ROUNDS = args.rounds

    from carver.arch import CUDA

    if args.dry_run:
        arch = CUDA(args.dry_run)
        for M, N, K in args.shapes:
            cfgs, n_cand, n_twins = configs_for(M, N, K, arch)
            print(f"{M}x{N}x{K}: {len(cfgs)} configs ({n_cand} candidates, {n_twins} twins of them)")
            for c in cfgs:
                print("   ", _cfg_label(c))
        return 0
    _cuda_up()
    from templates import matmul as mm

    arch = CUDA("cuda")
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = dict(env=_environment(), command=" ".join(sys.argv),
                                  date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                                  shapes=[])
    for M, N, K in args.shapes:
        shape = f"{M}x{N}x{K}"
        if time.time() > T0 + args.budget_s:
            report["shapes"].append(dict(shape=shape, skipped="time budget"))
            continue
        row: dict[str, Any] = dict(shape=shape, M=M, N=N, K=K)
        report["shapes"].append(row)
        try:
            configs, n_cand, n_twins = configs_for(M, N, K, arch)
            log(f"{shape}: {len(configs)} configs ({n_cand} candidates, {n_twins} twins of them)")
            rows = run_tuner(M, N, K, "float16", False, True, configs, args)
            row["trials"] = rows
            ok = [r for r in rows if r["ms"] is not None]
            kernels = {r["label"]: mm.compile(M, N, K, r["config"], dtype="float16") for r in ok}
            log(f"    {len(ok)}/{len(rows)} checked; {args.rounds} interleaved rounds")
            versus = measure(dict(M=M, N=N, K=K, dtype="float16"), kernels)
            row["versus"] = versus
            ms = {label: versus[f"{label}_ms"] for label in kernels if versus.get(f"{label}_ms")}
            row["pairs"] = pairs(rows, ms)
            labels = [_cfg_label(c) for c in configs]
            groups = {"candidates": labels[:n_cand], "twins": labels[:n_cand + n_twins], "all": labels,
                      "square": [lb for lb in labels if "full_row" not in lb],
                      "full_row": [lb for lb in labels if "full_row" in lb]}
            row["best"] = {}
            for name, group in groups.items():
                got = [(ms[lb], lb) for lb in group if lb in ms]
                if got and versus.get("cublas_ms"):
                    t, lb = min(got)
                    row["best"][name] = (lb, versus["cublas_ms"] / t)
            log(f"    best: {row['best']}")
        except Exception as e:  # noqa: BLE001 - a shape that fails as a whole is a row
            row["error"] = _error(e)
            log(f"    failed: {row['error']}")
        dump(args.out / "warp_split.json", report)
    (args.out / "warp_split.md").write_text(render(report))
    print(render(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
