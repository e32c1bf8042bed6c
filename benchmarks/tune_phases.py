"""Where a cold tune spends its seconds: ``TuneResult.phases`` for a cold and then a warm tune of GEMMs.

Run on the GPU machine from the repository root (fresh tuning and TileLang caches in temporary
directories, so the first tune of each shape is cold):

    . .gpu/setup.sh && python3 benchmarks/tune_phases.py --shapes 4096x4096x4096 2048x14336x4096
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4096x4096x4096", "2048x14336x4096"])
    p.add_argument("--dtype", default="float16")
    args = p.parse_args()
    os.environ["TILECARVE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tune-phases-db-")
    os.environ["TILELANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="tune-phases-tl-")
    t0 = time.perf_counter()
    from templates import matmul as mm

    print(f"import templates.matmul: {time.perf_counter() - t0:.2f} s", flush=True)
    for label in args.shapes:
        M, N, K = (int(x) for x in label.split("x"))
        for kind in ("cold", "warm"):
            t1 = time.perf_counter()
            r = mm.tuner(M, N, K, dtype=args.dtype, trans_B=True, topk=8).set_tuning(progress=False).run(3, 20)
            wall = time.perf_counter() - t1
            finalists = [t for t in r.trials if t.rounds]
            phases = ", ".join(f"{k} {v:.2f} s" for k, v in r.phases.items())
            print(f"{label} {kind}: {wall:.2f} s wall, from cache {r.from_cache}; {len(r.trials)} candidates, "
                  f"{len(finalists)} finalists, winner spread {r.spread}; {phases}", flush=True)


if __name__ == "__main__":
    main()
