"""Fit the attention model's constants (``carver.attention``) on measured grids (a developer tool; scipy).

    python -m carver.calibrate_attention benchmarks/data/attention-2026-11-21-h200/grid --arch H200 \\
        --holdout benchmarks/data/attention-2026-11-21-h200/holdout

Reads ``benchmarks/attention.py``'s files (``summary["problem"]`` + ``results``), keeps the correct,
timed configs the current rules accept (configs with keys the config no longer has, such as the removed
``overlap``, and configs the rules refuse on ``--arch`` are skipped and counted), fits the free constants
in log space by weighted least squares on ``log(predicted / measured)`` (fast configs weigh more: the
carver's job is the top of the list), and prints, before and after, each file's top-1 and best-of-top-8
(fractions of its best) and Spearman's rho. ``--holdout`` files are only scored, never fitted. The
printed constants go into ``carver/attention.py`` by hand (docs/attention.md says which and why).
"""

from __future__ import annotations

import glob
import json
import os
from dataclasses import dataclass

import numpy as np

from .arch import CUDA, GPUArch
from .attention import ATTENTION_CONSTANTS, ATTENTION_KEYS, AttentionConstants, AttentionProblem, AttentionTemplate
from .calibrate import fit_log_space, holdout_parser, print_constants, rank_scores

__all__ = ["FREE", "AttentionGrid", "fit", "load_grids", "score"]

#: Constants the fit moves; ``p`` and ``tail_fraction`` stay (the grids cannot tell them apart).
FREE: tuple[str, ...] = ("softmax_cycles_per_score", "rescale_cycles_per_output", "wg_overlap", "step_overhead_us",
                         "stage_cost_us", "kv_lead", "min_warps_per_sm", "cta_overhead_us")
_BOUNDS: dict[str, tuple[float, float]] = {
    "wg_overlap": (0.05, 1.0), "kv_lead": (0.01, 8.0), "min_warps_per_sm": (0.01, 64.0),
    "softmax_cycles_per_score": (1e-3, 2.0), "rescale_cycles_per_output": (1e-4, 1.0),
}


@dataclass(frozen=True, eq=False)
class AttentionGrid:
    """One measured shape: its name and problem, the configs the rules accept, their latencies (us)."""

    name: str
    problem: AttentionProblem
    configs: list[dict]
    measured_us: np.ndarray
    unknown: int   # configs with keys the attention config does not have (the removed overlap)
    illegal: int   # correct, timed configs the rules refuse on the arch


def load_grids(path: str, arch: GPUArch) -> list[AttentionGrid]:
    """``benchmarks/attention.py`` files (a directory or one file), correct and timed configs only."""
    files = sorted(glob.glob(os.path.join(path, "*.json"))) if os.path.isdir(path) else [path]
    out = []
    for f in files:
        with open(f) as fh:
            data = json.load(fh)
        problem = AttentionProblem(**data["summary"]["problem"])
        tmpl = AttentionTemplate(problem, arch)
        known = [r for r in data["results"] if set(r["config"]) <= set(ATTENTION_KEYS)]
        timed = [r for r in known if r.get("ms") and r.get("correct")]
        legal = [r for r in timed if not tmpl.validate(r["config"])]
        out.append(AttentionGrid(os.path.basename(f).removesuffix(".json"), problem, [r["config"] for r in legal],
                                 np.array([r["ms"] * 1e3 for r in legal]), len(data["results"]) - len(known),
                                 len(timed) - len(legal)))
    return out


def _predict(g: AttentionGrid, arch: GPUArch, const: AttentionConstants) -> np.ndarray:
    tmpl = AttentionTemplate(g.problem, arch, const)
    return np.array([tmpl.predict(c).latency_ms * 1e3 for c in g.configs])


def score(g: AttentionGrid, arch: GPUArch, const: AttentionConstants) -> dict[str, float]:
    """top-1 and best-of-top-8 of the model's order (fractions of the grid's best), and Spearman's rho."""
    return rank_scores(_predict(g, arch, const), g.measured_us)


def fit(grids: list[AttentionGrid], arch: GPUArch, start: AttentionConstants,
        free: tuple[str, ...] = FREE, order: float = 3.0) -> AttentionConstants:
    """Weighted least squares on log latency ratios over all grids, plus ``order`` times the same ratios
    less their shape's weighted mean (the error in the order within a shape, which ranking depends on)."""
    weights = [1.0 + 4.0 * (g.measured_us.min() / g.measured_us) ** 2 for g in grids]

    def residuals(const: AttentionConstants) -> np.ndarray:
        out = []
        for g, w in zip(grids, weights):
            r = np.log(_predict(g, arch, const) / g.measured_us)
            out += [w * r, order * w * (r - np.average(r, weights=w))]
        return np.concatenate(out)

    return fit_log_space(start, free, _BOUNDS, residuals, max_nfev=400)


def _report(title: str, grids: list[AttentionGrid], arch: GPUArch, const: AttentionConstants) -> None:
    print(title)
    for g in grids:
        s = score(g, arch, const)
        print(f"  {g.name:>36}: top1 {s['top1']:.3f}  top8 {s['top8']:.3f}  spearman {s['spearman']:.3f}  "
              f"({len(g.configs)} configs; skipped {g.unknown} with unknown keys, {g.illegal} illegal)")


def main(argv: list[str] | None = None) -> None:
    ap = holdout_parser(__doc__)
    ap.add_argument("--free", default=",".join(FREE), help="comma-separated constants to fit")
    a = ap.parse_args(argv)
    arch = CUDA(a.arch)
    grids = load_grids(a.data, arch)
    held = load_grids(a.holdout, arch) if a.holdout else []
    start = ATTENTION_CONSTANTS[arch.family]
    const = fit(grids, arch, start, tuple(x for x in a.free.split(",") if x))
    print_constants(const)
    _report("before (calibration):", grids, arch, start)
    _report("after (calibration):", grids, arch, const)
    if held:
        _report("before (holdout):", held, arch, start)
        _report("after (holdout):", held, arch, const)


if __name__ == "__main__":
    main()
