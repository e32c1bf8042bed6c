"""Calibrate a family's model constants on measured GEMM grids (a developer tool; needs scipy).

    python -m carver.calibrate benchmarks/data/h200-gemm-grid --arch H200 [--cv]

Fits the free constants of :class:`~carver.model.ModelConstants` in log space by weighted least squares
on ``log(predicted / measured)`` over every legal measured config; fast configs weigh more, because the
carver's job is to order the top of the list. ``--cv`` refits once per shape with that shape held out
and reports the held-out scores, which is the honest estimate for shapes the fit never saw.
The printed constants go into ``carver/model.py`` by hand (they are few and each has a meaning).
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from .arch import CUDA, GPUArch
from .lowering import ConfigArrays, lower
from .model import ModelConstants, constants_for, predict_arrays
from .problem import MatmulProblem
from .validity import legal_mask

__all__ = ["Grid", "FREE", "fit", "fit_log_space", "holdout_parser", "load_grids", "print_constants", "rank_scores",
           "score"]

logger = logging.getLogger(__name__)

#: Constants the fit moves; the rest stay at their physical values.
FREE: tuple[str, ...] = (
    "load_latency_us", "sm_bandwidth", "l2_bandwidth_per_sm", "iter_overhead_us", "warpgroup_drain_us",
    "inst_n_overhead", "stage_efficiency", "sync_copy_factor",
)
# softmax_p is not fitted: the grids cannot tell p=3 from p=16 (every score within 0.005), and the
# other constants trade against it, so it is fixed at a middle value and they are fitted around it.
_BOUNDS: dict[str, tuple[float, float]] = {
    "dram_efficiency": (0.3, 1.0), "stage_efficiency": (0.2, 1.0), "softmax_p": (2.0, 16.0),
}


@dataclass(frozen=True, eq=False)
class Grid:
    """One measured shape: the problem, its measured legal configs and their latencies (us)."""

    problem: MatmulProblem
    configs: ConfigArrays
    measured_us: np.ndarray
    dropped: int  # measured configs the validity function rejects

    @property
    def name(self) -> str:
        return f"{self.problem.M}x{self.problem.N}x{self.problem.K}"


def load_grids(path: str, arch: GPUArch) -> list[Grid]:
    """Read ``MxNxK.json`` files in measure_gemm_grid.py's format (correct, timed rows only)."""
    files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    grids = []
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        s = data["summary"]
        problem = MatmulProblem(int(s["M"]), int(s["N"]), int(s["K"]))
        rows = [r for r in data["results"] if r.get("ms") and r.get("correct")]
        cfgs = ConfigArrays.from_configs([r["config"] for r in rows])
        ok = legal_mask(problem, arch, lower(problem, arch, cfgs))
        keep = [r["config"] for r, o in zip(rows, ok) if o]
        grids.append(Grid(problem, ConfigArrays.from_configs(keep),
                          np.array([r["ms"] * 1e3 for r, o in zip(rows, ok) if o]), int((~ok).sum())))
    return grids


def score(grid: Grid, arch: GPUArch, const: ModelConstants) -> dict[str, float]:
    """top-1 and best-of-top-8 (fraction of the grid's best) and Spearman's rho, ranking the grid."""
    pred = predict_arrays(grid.problem, arch, lower(grid.problem, arch, grid.configs), const).latency_us
    return rank_scores(pred, grid.measured_us)


def rank_scores(pred: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """top-1 and best-of-top-8 of the order of ``pred`` (fractions of the best ``measured``), Spearman's rho."""
    from scipy.stats import spearmanr

    order = np.argsort(pred, kind="stable")
    best = measured.min()
    return dict(top1=best / measured[order[0]], top8=best / measured[order[:8]].min(),
                spearman=float(spearmanr(pred, measured).statistic))


def holdout_parser(doc: str | None) -> argparse.ArgumentParser:
    """The command line of the family fits (GEMV, attention): grid files to fit, holdout files to score."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a directory of grid files, or one file (fitted)")
    ap.add_argument("--holdout", default=None, help="a directory or file scored with the fitted constants only")
    ap.add_argument("--arch", default="H200", help="the GPU the grids were measured on")
    return ap


def print_constants(const: Any) -> None:
    print("fitted constants:")
    for f in fields(const):
        print(f"  {f.name} = {getattr(const, f.name):.6g}")


def fit_log_space(start: Any, free: tuple[str, ...], bounds: dict[str, tuple[float, float]],
                  residuals: Callable[[Any], np.ndarray], max_nfev: int = 300) -> Any:
    """Least squares over the constants ``free`` of ``start`` (a dataclass with ``replace``), in log space
    within ``bounds``; ``residuals(constants)`` is the vector to shrink. Shared by the GEMM and GEMV fits."""
    from scipy.optimize import least_squares

    lo = [math.log(bounds.get(n, (1e-6, 1e9))[0]) for n in free]
    hi = [math.log(bounds.get(n, (1e-6, 1e9))[1]) for n in free]

    def unpack(x: np.ndarray) -> Any:
        return start.replace(**{n: math.exp(v) for n, v in zip(free, x)})

    x0 = np.clip([math.log(max(getattr(start, n), 1e-2)) for n in free], np.array(lo) + 1e-9, np.array(hi) - 1e-9)
    return unpack(least_squares(lambda x: residuals(unpack(x)), x0, bounds=(lo, hi), max_nfev=max_nfev).x)


def fit(grids: list[Grid], arch: GPUArch, start: ModelConstants, free: tuple[str, ...] = FREE,
        max_nfev: int = 300) -> ModelConstants:
    """Weighted least squares on log latency ratios over all grids."""
    lws = [lower(g.problem, arch, g.configs) for g in grids]
    weights = [1.0 + 4.0 * (g.measured_us.min() / g.measured_us) ** 2 for g in grids]

    def residuals(const: ModelConstants) -> np.ndarray:
        out = [w * np.log(predict_arrays(g.problem, arch, lw, const).latency_us / g.measured_us)
               for g, lw, w in zip(grids, lws, weights)]
        return np.concatenate(out)

    return fit_log_space(start, free, _BOUNDS, residuals, max_nfev)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", help="a directory of MxNxK.json grids, or one file")
    ap.add_argument("--arch", default="H200", help="the GPU the grids were measured on")
    ap.add_argument("--cv", action="store_true", help="also report leave-one-shape-out scores")
    ap.add_argument("--free", default=",".join(FREE), help="comma-separated constants to fit")
    a = ap.parse_args(argv)
    arch = CUDA(a.arch)
    grids = load_grids(a.data, arch)
    free = tuple(x for x in a.free.split(",") if x)
    start = constants_for(arch)
    const = fit(grids, arch, start, free)
    print("fitted constants:")
    for f in fields(const):
        print(f"  {f.name} = {getattr(const, f.name):.6g}")
    for g in grids:
        s = score(g, arch, const)
        print(f"{g.name:>16}: top1 {s['top1']:.3f}  top8 {s['top8']:.3f}  spearman {s['spearman']:.3f}"
              f"  ({len(g.measured_us)} legal, {g.dropped} dropped)")
    if a.cv:
        print("leave-one-shape-out:")
        for i, g in enumerate(grids):
            held = fit([h for j, h in enumerate(grids) if j != i], arch, start, free)
            s = score(g, arch, held)
            print(f"{g.name:>16}: top1 {s['top1']:.3f}  top8 {s['top8']:.3f}  spearman {s['spearman']:.3f}")


if __name__ == "__main__":
    main()
