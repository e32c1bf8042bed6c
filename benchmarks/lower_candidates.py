"""Lower every candidate the carver proposes, for every family, on shapes nobody tuned on: a config the rules admit
must also compile. TileLang's passes can refuse a program for one grid and not its neighbours (its ThreadSync did,
for the persistent matmul loops, until 2026-12-07), and the tuner survives such a config as one failed trial, but
``compile(...)`` with it raises. No GPU and no nvcc needed: each config is lowered for ``--target`` only.

    python3 benchmarks/lower_candidates.py --jobs 2            # all three families, about 5 minutes on 2 cores

Prints one line per config (``ok`` or the error's last line) and a count per family; exits 1 if any failed.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Shapes per family, none of them in a calibration set: odd sizes, tails, few rows and wide grids.
MATMUL = [(3000, 5000, 2000), (1664, 4096, 4096), (2304, 7168, 4096), (96, 14336, 4096), (513, 4096, 14336),
          (6144, 1536, 8192), (1000, 1000, 1000), (8, 4096, 4096), (12000, 2048, 512)]
ATTENTION = [((1, 32, 3000, 128), 8), ((3, 32, 1777, 64), 8), ((8, 16, 700, 128), 16), ((2, 32, 9000, 64), 4)]
GEMV = [(1, 5000, 3000), (7, 11008, 4096), (16, 4096, 12000), (2, 128256, 4096), (13, 1000, 1000)]
#: The carver's top-k per problem, its variants appended (what ``tune`` measures by default).
TOPK = 8


def problems(family: str) -> list:
    if family == "matmul":
        from carver.problem import MatmulProblem

        return [MatmulProblem(M, N, K, d) for (M, N, K) in MATMUL for d in ("float16", "bfloat16")]
    if family == "attention":
        from carver.attention import AttentionProblem

        return [AttentionProblem(*a, kv_heads=h, causal=c) for a, h in ATTENTION for c in (False, True)]
    from templates.gemv.config import GemvProblem

    return [GemvProblem(M, N, K) for (M, N, K) in GEMV]


def template(family: str):
    if family == "matmul":
        from templates.matmul.api import MATMUL as t
    elif family == "attention":
        from templates.attention.api import ATTENTION as t
    else:
        from templates.gemv.api import GEMV as t
    return t


def lower_one(job: tuple) -> tuple[str, str, str, str]:
    """Lower one candidate: (family, problem, config, "ok" or the error's last line)."""
    family, problem, config, target = job
    import tilelang  # noqa: F401 - puts its tvm on the path
    from tilelang.engine.lower import lower
    from tvm.target import Target

    tgt = Target({"kind": "cuda", "arch": target})
    try:
        with tgt:
            lower(template(family).program(problem, config), target=tgt)
        result = "ok"
    except Exception as e:  # noqa: BLE001 - every failure is a finding, reported with its message
        result = "FAILED " + (str(e).strip().splitlines() or [type(e).__name__])[-1][:200]
    return family, repr(problem), repr(config.to_dict()), result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", default="matmul,attention,gemv")
    ap.add_argument("--arch", default="H100", help="the GPU the carver ranks for")
    ap.add_argument("--target", default="sm_90a", help="the CUDA arch lowered for")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = []
    for family in args.families.split(","):
        t = template(family)
        for problem in problems(family):
            jobs += [(family, problem, config, args.target) for config in t.candidates(problem, args.arch, TOPK)]
    counts: dict[str, list[int]] = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        for family, problem, config, result in pool.map(lower_one, jobs):
            print(f"{family} {problem} {config}: {result}", flush=True)
            n = counts.setdefault(family, [0, 0])
            n[0] += 1
            n[1] += result != "ok"
    for family, (n, bad) in counts.items():
        print(f"{family}: {n} candidates lowered, {bad} failed")
    return 1 if any(bad for _, bad in counts.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
