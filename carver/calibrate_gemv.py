"""Fit the GEMV model's constants (``carver.gemv_model``) on measured GEMV grids (a developer tool; scipy).

    python -m carver.calibrate_gemv benchmarks/data/gemv-2026-11-21-h200/grid --arch H200 \\
        --holdout benchmarks/data/gemv-2026-11-21-h200/holdout

Reads ``benchmarks/gemv.py``'s grid files (``summary`` + ``results``), fits the free constants in log
space by weighted least squares on ``log(predicted / measured)`` over every correct, timed config (fast
configs weigh more: the carver's job is the top of the list), and prints, before and after, each grid's
top-1 and best-of-top-8 (fractions of the grid's best) and Spearman's rho. ``--holdout`` files are
only scored, never fitted. A path with no measured config is not fitted (its constants stay). The
printed constants go into ``carver/gemv_model.py`` by hand (docs/gemv.md says which and why).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import numpy as np

from .arch import CUDA, GPUArch
from .calibrate import fit_log_space, holdout_parser, print_constants, rank_scores
from .gemv_model import GemvConstants, gemv_constants_for
from .templates import GEMVTemplate, gemv_vec

__all__ = ["FREE", "GemvGrid", "fit", "load_grids", "score"]

#: Constants the fit moves for the SIMT path; the mma path adds MMA_FREE once it has measurements.
FREE: tuple[str, ...] = ("dram_fraction", "load_latency_us", "sm_bandwidth", "simt_w_cycles", "simt_x_cycles",
                         "simt_warps_half", "launch_us")
MMA_FREE: tuple[str, ...] = ("mma_load_latency_us", "mma_sm_bandwidth", "mma_step_us", "stage_efficiency")
_BOUNDS: dict[str, tuple[float, float]] = {
    "dram_fraction": (0.5, 1.0), "stage_efficiency": (0.2, 1.0), "launch_us": (0.5, 10.0),
    "simt_w_cycles": (1e-4, 1.0), "simt_x_cycles": (1e-4, 1.0), "simt_warps_half": (1e-3, 64.0),
}


@dataclass(frozen=True, eq=False)
class GemvGrid:
    """One measured shape: its model (the carver's template), its timed configs, their latencies (us)."""

    name: str
    template: GEMVTemplate
    configs: list[dict]
    measured_us: np.ndarray


def load_grids(path: str, arch: GPUArch) -> list[GemvGrid]:
    """``<M>x<N>x<K>-<dtype>.json`` files of ``benchmarks/gemv.py`` (a directory or one file)."""
    files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    out = []
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        s = data["summary"]
        rows = [r for r in data["results"] if r.get("ms") and r.get("correct")]
        tmpl = GEMVTemplate(s["N"], s["K"], s["dtype"], M=s["M"], arch=arch, vec=gemv_vec(s["K"], s["dtype"]))
        cfgs = [{k: v for k, v in r["config"].items() if k != "vec"} for r in rows]
        out.append(GemvGrid(f"{s['M']}x{s['N']}x{s['K']}", tmpl, cfgs, np.array([r["ms"] * 1e3 for r in rows])))
    return out


def _predict(g: GemvGrid, const: GemvConstants) -> np.ndarray:
    tmpl = GEMVTemplate(**g.template._args(), arch=g.template.arch, constants=const)
    return np.array([tmpl.predict(c).latency_ms * 1e3 for c in g.configs])


def score(g: GemvGrid, const: GemvConstants) -> dict[str, float]:
    """top-1 and best-of-top-8 of the model's order (fractions of the grid's best), and Spearman's rho."""
    return rank_scores(_predict(g, const), g.measured_us)


def fit(grids: list[GemvGrid], start: GemvConstants, free: tuple[str, ...] = FREE) -> GemvConstants:
    """Weighted least squares on log latency ratios over all grids."""
    weights = [1.0 + 4.0 * (g.measured_us.min() / g.measured_us) ** 2 for g in grids]

    def residuals(const: GemvConstants) -> np.ndarray:
        return np.concatenate([w * np.log(_predict(g, const) / g.measured_us) for g, w in zip(grids, weights)])

    return fit_log_space(start, free, _BOUNDS, residuals, max_nfev=400)


def _report(title: str, grids: list[GemvGrid], const: GemvConstants) -> None:
    print(title)
    for g in grids:
        s = score(g, const)
        print(f"  {g.name:>16}: top1 {s['top1']:.3f}  top8 {s['top8']:.3f}  spearman {s['spearman']:.3f}  "
              f"({len(g.configs)} configs)")


def main(argv: list[str] | None = None) -> None:
    a = holdout_parser(__doc__).parse_args(argv)
    arch = CUDA(a.arch)
    grids = load_grids(a.data, arch)
    held = load_grids(a.holdout, arch) if a.holdout else []
    start = gemv_constants_for(arch)
    has_mma = any(c.get("path") == "mma" for g in grids for c in g.configs)
    const = fit(grids, start, FREE + (MMA_FREE if has_mma else ()))
    print_constants(const)
    _report("before (calibration):", grids, start)
    _report("after (calibration):", grids, const)
    if held:
        _report("before (holdout):", held, start)
        _report("after (holdout):", held, const)


if __name__ == "__main__":
    main()
