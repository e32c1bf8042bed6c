"""Score the GEMM model's ranking on the few-row searches and the calibration grids, offline, in seconds
(a benchmark for whoever changes ``carver/model.py``, not a test).

    python benchmarks/few_rows_scores.py [--set NAME=VALUE ...] [--arch H200]

The few-row searches (``benchmarks/data/few-rows-*/few_rows.json``, written by ``benchmarks/few_rows.py``
on the GPU: M of 64 to 512 against Llama-3-8B weights, 48-329 configs each, timed back to back) are the
regime where the model is weakest. Per search it prints, over the configs that search measured:

* top4 / top8: the fastest measured over the fastest of the model's first 4 / 8 (1.000 = found the best);
  +hedge: the first 4 and the row-tile hedge (``templates.matmul.space.row_tile_hedge``), as tune() has them;
* rank: where the model puts the fastest; pred/meas: its predicted over measured latency, for the fastest
  and for the model's first.

Then the same top1 / top8 / Spearman's rho on the calibration grids (``h200-gemm-grid``), and the
rasterization effect: per grid, the geomean over config pairs within 1.3x of the best of measured and
predicted latency without rasterization over with it (the effect an L2/DRAM change must keep).
``--set`` replaces a constant of :class:`carver.model.ModelConstants` (e.g. ``--set l2_bandwidth_per_sm=9e4``)
to see what a change would do before refitting with ``python -m carver.calibrate``.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from carver.arch import CUDA  # noqa: E402
from carver.calibrate import load_grids, score  # noqa: E402
from carver.lowering import ConfigArrays, lower  # noqa: E402
from carver.model import ModelConstants, constants_for, predict_arrays  # noqa: E402
from carver.problem import MatmulProblem  # noqa: E402
from carver.validity import legal_mask  # noqa: E402
from templates.matmul.config import MatmulConfig  # noqa: E402
from templates.matmul.space import row_tile_hedge  # noqa: E402

DATA = REPO / "benchmarks" / "data"


def few_row_searches(arch: Any) -> list[tuple[str, MatmulProblem, list[dict[str, Any]], np.ndarray]]:
    """(search name, problem, legal measured configs, their fastest measured latency in us) per search."""
    out = []
    for f in sorted(glob.glob(str(DATA / "few-rows-*" / "few_rows.json"))):
        doc = json.loads(Path(f).read_text())
        for shape, s in doc["search"].items():
            p = MatmulProblem(*map(int, shape.split("x")))
            best: dict[str, float] = {}
            for r in s["rows"]:
                if r["status"] == "ok" and r.get("ms"):
                    k = json.dumps(r["config"], sort_keys=True)
                    best[k] = min(best.get(k, math.inf), r["ms"] * 1e3)
            cfgs = [json.loads(k) for k in best]
            ok = legal_mask(p, arch, lower(p, arch, ConfigArrays.from_configs(cfgs)))
            out.append((f"{Path(f).parent.name} {shape}", p, [c for c, o in zip(cfgs, ok) if o],
                        np.array([v for v, o in zip(best.values(), ok) if o])))
    return out


def predicted(p: MatmulProblem, arch: Any, cfgs: list[dict[str, Any]], const: ModelConstants) -> np.ndarray:
    return predict_arrays(p, arch, lower(p, arch, ConfigArrays.from_configs(cfgs)), const).latency_us


def raster_pairs(arch: Any, const: ModelConstants) -> list[tuple[str, float, float]]:
    out = []
    for f in sorted(glob.glob(str(DATA / "h200-gemm-grid" / "*.json"))):
        doc = json.loads(Path(f).read_text())
        s = doc["summary"]
        p = MatmulProblem(int(s["M"]), int(s["N"]), int(s["K"]))
        rows = [r for r in doc["results"] if r.get("ms") and r.get("correct")]
        fastest = min(r["ms"] for r in rows)
        by: dict[str, dict[bool, float]] = {}
        for r in rows:
            c = dict(r["config"])
            by.setdefault(json.dumps({k: v for k, v in c.items() if k != "enable_rasterization"}, sort_keys=True),
                          {})[c["enable_rasterization"]] = r["ms"]
        pairs = [(json.loads(k), v) for k, v in by.items() if len(v) == 2 and min(v.values()) < 1.3 * fastest]
        lat = predicted(p, arch, [dict(c, enable_rasterization=r) for c, _ in pairs for r in (True, False)], const)
        measured = math.exp(np.mean(np.log([v[False] / v[True] for _, v in pairs])))
        out.append((Path(f).stem, measured, math.exp(np.mean(np.log(lat[1::2] / lat[0::2])))))
    return out


def search_scores(arch: Any, const: ModelConstants) -> list[dict[str, Any]]:
    """Per few-row search: the fastest measured over the fastest of the model's first 4 (``top4``), of
    those and the row-tile hedge (``top4_hedge``, what tune() has) and of its first 8 (``top8``); where
    the model ranks the fastest; predicted over measured latency of the fastest and of the model's first."""
    rows = []
    for name, p, cfgs, us in few_row_searches(arch):
        pred = predicted(p, arch, cfgs, const)
        order = np.argsort(pred, kind="stable")
        b = int(np.argmin(us))
        typed = [MatmulConfig.from_dict(cfgs[i]) for i in order]
        hedge = [typed.index(c) for c in row_tile_hedge(p, typed)]
        rows.append(dict(name=name, n=len(us), top4=us.min() / us[order[:4]].min(),
                         top4_hedge=us.min() / us[order[sorted({0, 1, 2, 3, *hedge})]].min(),
                         top8=us.min() / us[order[:8]].min(), rank=int(np.where(order == b)[0][0]),
                         fastest_ratio=pred[b] / us[b], first_ratio=pred[order[0]] / us[order[0]]))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="H200", help="the GPU the data was measured on")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="replace a model constant (repeatable)")
    a = ap.parse_args(argv)
    arch = CUDA(a.arch)
    const = constants_for(arch)
    for item in a.set:
        name, _, value = item.partition("=")
        if not hasattr(const, name) or not value:
            ap.error(f"--set {item!r}: expected NAME=VALUE with NAME a field of carver.model.ModelConstants")
        const = const.replace(**{name: float(value)})
    print("few-row searches (the model's order of the configs each search measured):")
    rows = search_scores(arch, const)
    for r in rows:
        print(f"  {r['name']:40s} n={r['n']:3d}  top4 {r['top4']:.3f}  +hedge {r['top4_hedge']:.3f}  "
              f"top8 {r['top8']:.3f}  rank {r['rank']:3d}  pred/meas fastest {r['fastest_ratio']:.2f}, "
              f"model's first {r['first_ratio']:.2f}")
    keys = ("top4", "top4_hedge", "top8")
    g = [math.exp(np.mean(np.log([r[k] for r in rows]))) for k in keys]
    print(f"  geomean top4 {g[0]:.3f}, top4 + hedge {g[1]:.3f}, top8 {g[2]:.3f}; worst "
          + ", ".join(f"{min(r[k] for r in rows):.3f}" for k in keys))
    print("calibration grids:")
    for grid in load_grids(str(DATA / "h200-gemm-grid"), arch):
        s = score(grid, arch, const)
        print(f"  {grid.name:40s} top1 {s['top1']:.3f}  top8 {s['top8']:.3f}  rho {s['spearman']:.3f}")
    print("rasterization (no raster / raster, geomean of the fast pairs):")
    for name, measured, pred in raster_pairs(arch, const):
        print(f"  {name:40s} measured {measured:.3f}  predicted {pred:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
