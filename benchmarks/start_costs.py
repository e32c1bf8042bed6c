"""What a tune pays before and per candidate on the CPU side, on this host (issue 13's fixed start).

Prints and saves (``--out``, JSON) the seconds to import torch, tilecarve's matmul template and TileLang,
and to build the 288-config tuner at 4096^3 as ``benchmarks/multi_gpu.py`` does (profiled; of it, asking
the driver about the GPUs, ``local_gpus``, a forked child), and per config of the grid: milliseconds to
elaborate its PrimFunc, to pickle it and to load it back (what a compile worker sends the measuring side,
which no longer elaborates). Imports are timed in this order in one fresh process, so run it as its own
command:

    . .gpu/setup.sh && python3 benchmarks/start_costs.py --out $OUT/start_costs.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pickle
import pstats
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="JSON file to write")
    p.add_argument("--configs", type=int, default=40, help="how many grid configs to elaborate")
    args = p.parse_args()
    out: dict = {"started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    t = time.perf_counter()
    import torch  # noqa: F401

    out["import torch s"] = time.perf_counter() - t
    sys.path[:0] = [str(ROOT)]
    t = time.perf_counter()
    from templates import matmul as mm

    out["import templates.matmul s"] = time.perf_counter() - t
    from autotuner import forking

    problem = mm.MatmulProblem(4096, 4096, 4096)
    configs = mm.MATMUL.space(problem)
    prof = cProfile.Profile()
    t = time.perf_counter()
    try:  # as benchmarks/multi_gpu.py builds it, the driver query (local_gpus) included
        with prof:
            mm.MATMUL.tuner(problem, mm.TuneOptions(configs=configs, validate_configs=False))
        out["tuner built s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - no GPU here: the rest still tells the CPU costs
        out["tuner error"] = repr(e)
    stats = pstats.Stats(prof)
    out["of it, local_gpus s"] = sum(v[3] for k, v in stats.stats.items() if k[2] == "local_gpus")
    out["gpus"] = [g.get("name") for g in forking.local_gpus()]
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)
    out["tuner profile"] = text.getvalue()
    out["cuda started"] = forking.cuda_started()
    t = time.perf_counter()
    import tilelang  # noqa: F401

    out["import tilelang s"] = time.perf_counter() - t
    from templates.matmul.program import program

    rows = []
    for c in configs[: args.configs]:
        t = time.perf_counter()
        f = program(problem, c)
        elaborate = time.perf_counter() - t
        t = time.perf_counter()
        blob = pickle.dumps(f)
        dump = time.perf_counter() - t
        t = time.perf_counter()
        pickle.loads(blob)
        load = time.perf_counter() - t
        rows.append([round(elaborate * 1e3, 2), round(dump * 1e3, 2), round(load * 1e3, 2), len(blob)])
    out["per config: elaborate ms, pickle ms, unpickle ms, bytes"] = rows
    for k, col in (("elaborate", 0), ("pickle", 1), ("unpickle", 2)):
        out[f"median {k} ms"] = statistics.median(r[col] for r in rows)
    for k, v in out.items():
        if k != "tuner profile" and not k.startswith("per config"):
            print(f"{k}: {v}")
    print(out["tuner profile"])
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
        print("saved", os.path.abspath(args.out))


if __name__ == "__main__":
    main()
