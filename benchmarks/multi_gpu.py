"""TileLang's 288-config GEMM grid at 4096³ tuned on one GPU and on every GPU of the host (issue 13).

Each tuning runs in its own subprocess (a fresh CUDA context and tuning database), in this order:

* ``1gpu-cold`` and ``all-cold``: today's single measuring process, then ``set_tuning(devices="all")``,
  each with a fresh TileLang kernel cache: compiling and measuring, as a user's first tune;
* ``1gpu-warm`` and ``all-warm``: the same, with the cold runs' TileLang cache kept, so every compile
  is a cache hit and measuring dominates: how measuring itself scales;
* ``compare``: the two winners of each pair timed side by side in one process (5 interleaved
  rounds), so "same winner or within 1%" is judged on one GPU at one time.

Prints a table and saves JSON after every step (``--out``); ``--time-limit`` (default 510 s) skips
what would not fit. On an ``nvidia-h200-x2`` host (32 cores) the whole run takes about 4-6 minutes.
Shorter: ``--configs 96`` (every third config of the grid), ``--modes cold``.

    . .gpu/setup.sh && python3 benchmarks/multi_gpu.py --out $OUT/multi_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
from benchlib import T0, dump, log  # noqa: E402


def grid(shape: list[int], n: int) -> tuple[Any, list[Any]]:
    """The problem and an even spread of ``n`` configs over its 288-config grid (all of them by default)."""
    from templates import matmul as mm

    problem = mm.MatmulProblem(*shape)
    space = mm.MATMUL.space(problem)
    step = max(1, len(space) // n)
    return problem, space[::step][:n]


def child_tune(args: argparse.Namespace) -> dict[str, Any]:
    """One tuning of the grid, with ``devices=None`` (1gpu) or ``"all"``; runs in a subprocess."""
    import torch

    from templates import matmul as mm

    problem, configs = grid(args.shape, args.configs)
    devices = None if args.child.startswith("1gpu") else "all"
    t0 = time.perf_counter()
    r = (mm.MATMUL.tuner(problem, mm.TuneOptions(configs=configs, validate_configs=False))
         .set_tuning(cache=False, progress=False, devices=devices).run(3, 20))
    wall = time.perf_counter() - t0
    per_device: dict[str, int] = {}
    for t in r.trials:
        per_device[str(t.device)] = per_device.get(str(t.device), 0) + 1
    statuses: dict[str, int] = {}
    for t in r.trials:
        statuses[str(t.status)] = statuses.get(str(t.status), 0) + 1
    return {"mode": args.child, "devices": devices, "gpus": torch.cuda.device_count(),
            "gpu_names": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "n_configs": len(configs), "wall_s": round(wall, 2),
            "phases": {k: round(v, 2) for k, v in r.phases.items()},
            "config": r.config, "latency_ms": r.latency, "statuses": statuses, "trials_per_device": per_device}


def child_compare(args: argparse.Namespace) -> dict[str, Any]:
    """Both winners of a pair timed in 5 interleaved rounds on GPU 0; medians in ms."""
    import statistics

    import torch

    from autotuner.timing import time_callable
    from templates import matmul as mm

    problem, _ = grid(args.shape, args.configs)
    cfgs = json.loads(args.pair)
    kernels = [mm.MATMUL.compile(problem, c) for c in cfgs]
    a = torch.randn(problem.M, problem.K, device="cuda", dtype=torch.float16)
    b = torch.randn(problem.N, problem.K, device="cuda", dtype=torch.float16)
    rounds: list[list[float]] = [[], []]
    for r in range(5):
        for j in (r % 2, 1 - r % 2):
            rounds[j].append(time_callable(lambda k=kernels[j]: k(a, b), 3, 20, "cuda").median_ms)
    return {"medians_ms": [statistics.median(x) for x in rounds]}


def run_child(args: argparse.Namespace, which: str, env: dict[str, str], extra: list[str], limit: float) -> dict:
    cmd = [sys.executable, __file__, "--child", which, "--configs", str(args.configs),
           "--shape", *map(str, args.shape), *extra]
    t = time.time()
    try:
        p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"mode": which, "error": f"killed at the time limit after {limit:.0f} s"}
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not last.startswith("{"):
        return {"mode": which, "error": f"exit {p.returncode}: {p.stderr[-1500:]}"}
    out = json.loads(last)
    out["process_s"] = round(time.time() - t, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", nargs=3, type=int, default=[4096, 4096, 4096])
    p.add_argument("--configs", type=int, default=288, help="an even spread of this many grid configs")
    p.add_argument("--modes", choices=["cold", "warm", "both"], default="both")
    p.add_argument("--time-limit", type=float, default=510.0, help="seconds for the whole run")
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "multi_gpu.json")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--pair", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child_compare(args) if args.child == "compare" else child_tune(args)), flush=True)
        return
    tl_cache = tempfile.mkdtemp(prefix="multi-gpu-tl-")
    env = {"TILECARVE_CACHE_DIR": tempfile.mkdtemp(prefix="multi-gpu-db-")}
    kinds = ["cold", "warm"] if args.modes == "both" else [args.modes]
    data: dict[str, Any] = {"shape": args.shape, "configs": args.configs, "started": time.strftime("%Y-%m-%d %H:%M"),
                            "runs": {}, "pairs": {}}
    longest = 0.0
    for kind in kinds:
        for which in (f"1gpu-{kind}", f"all-{kind}"):
            left = args.time_limit - (time.time() - T0)
            if left < max(60.0, 1.1 * longest):
                data["runs"][which] = {"mode": which, "error": f"skipped: {left:.0f} s left of --time-limit"}
                log(f"{which}: skipped ({left:.0f} s left)")
                continue
            cache = os.path.join(tl_cache, which) if kind == "cold" else os.path.join(tl_cache, "1gpu-cold")
            log(f"{which}: tuning {args.configs} configs at {'x'.join(map(str, args.shape))}")
            run = run_child(args, which, {**env, "TILELANG_CACHE_DIR": cache}, [], left - 30)
            data["runs"][which] = run
            longest = max(longest, run.get("process_s", 0.0))
            log(f"{which}: {run.get('wall_s', '-')} s, winner {run.get('config')} {run.get('latency_ms')} ms, "
                f"per device {run.get('trials_per_device')} {run.get('error', '')}")
            dump(args.out, data)
        one, every = data["runs"].get(f"1gpu-{kind}", {}), data["runs"].get(f"all-{kind}", {})
        if "config" in one and "config" in every:
            pair: dict[str, Any] = {"wall_ratio": round(every["wall_s"] / one["wall_s"], 3),
                                    "same_winner": one["config"] == every["config"]}
            if not pair["same_winner"] and args.time_limit - (time.time() - T0) > 60:
                cmp = run_child(args, "compare", {**env, "TILELANG_CACHE_DIR": os.path.join(tl_cache, "1gpu-cold")},
                                ["--pair", json.dumps([one["config"], every["config"]])],
                                min(120.0, args.time_limit - (time.time() - T0) - 10))
                pair["side_by_side_ms"] = cmp.get("medians_ms", cmp.get("error"))
                if "medians_ms" in cmp:
                    m1, m2 = cmp["medians_ms"]
                    pair["all_winner_vs_1gpu_winner"] = round(m2 / m1, 4)
            ratio = pair.get("all_winner_vs_1gpu_winner")
            pair["winner_ok"] = pair["same_winner"] or (ratio is not None and ratio <= 1.01)
            data["pairs"][kind] = pair
            log(f"{kind}: all-GPU wall / 1-GPU wall = {pair['wall_ratio']}, same winner {pair['same_winner']}, "
                f"within 1% {pair['winner_ok']}")
            dump(args.out, data)
    data["total_s"] = round(time.time() - T0, 1)
    dump(args.out, data)
    print(json.dumps(data["pairs"], indent=1))
    log(f"saved {args.out}")


if __name__ == "__main__":
    main()
