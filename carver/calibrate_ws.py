"""Fit the ws term's constants (:class:`carver.ws_model.WSConstants`) on measured ws/twin pairs (a developer
tool; scipy).

    python -m carver.calibrate_ws benchmarks/data/hopper-ws-2026-11-22-h200/hopper_ws.json

Reads ``benchmarks/hopper_ws.py``'s report: each ``speed`` shape's ``calibration`` pairs (a ws config and
its twin, the same tile run as TileLang's ``T.Pipelined`` program, both timed by the autotuner) with the
configs of its ``trials``. Fits :data:`FREE` in log space by least squares on
``log(predicted gain / measured gain)`` within :data:`BOUNDS` (each a physical range: fractions in (0, 1],
a per-iteration factor between a third and three times T.Pipelined's, costs in us), and prints every
pair's measured and predicted gain before and after, the sign agreement where the measurement is outside
the noise (``|gain - 1| > 3%``), Spearman's rho, and which forms ``min_gain`` would still propose. The
printed constants go into ``carver/ws_model.py`` by hand (docs/hopper-ws.md records the fit).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import CUDA, GPUArch
from .calibrate import fit_log_space, print_constants
from .problem import MatmulProblem
from .validity import normalize_config
from .ws_model import WS_CONSTANTS, WSConstants, ws_gain

__all__ = ["BOUNDS", "FREE", "NOISE", "WSPair", "fit", "load_pairs", "predicted", "sign_agreement"]

#: Constants the fit moves (all of them but ``min_gain``, which is a decision, not a measurement).
FREE: tuple[str, ...] = ("drain_hidden", "iter_overhead_factor", "multicast_efficiency", "cluster_sync_us",
                         "persistent_overlap", "tall_tile_loss")
BOUNDS: dict[str, tuple[float, float]] = {
    "drain_hidden": (1e-3, 1.0), "iter_overhead_factor": (0.33, 3.0), "multicast_efficiency": (1e-3, 1.0),
    "cluster_sync_us": (1e-4, 0.2), "persistent_overlap": (1e-3, 1.0), "tall_tile_loss": (1e-4, 0.5),
}
#: A measured gain within this of 1 is timing noise (burst timings of one run): no sign to agree with.
NOISE = 0.03


@dataclass(frozen=True)
class WSPair:
    """One measured pair: the ws config, its T.Pipelined twin (normalised kernel kwargs), twin ms / ws ms."""

    problem: MatmulProblem
    ws_label: str
    ws: dict[str, Any]
    twin: dict[str, Any]
    measured_gain: float


def load_pairs(path: str) -> tuple[GPUArch, list[WSPair]]:
    """The device (by its name in the report's ``env``) and every pair with both latencies measured."""
    with open(path) as fh:
        report = json.load(fh)
    arch = CUDA(report["env"]["device"])
    pairs = []
    for shape in report["speed"]:
        configs = {r["label"]: r["config"] for r in shape["trials"]}
        problem = MatmulProblem(shape["M"], shape["N"], shape["K"])
        for c in shape.get("calibration", []):
            if c.get("measured_gain") is None:
                continue
            pairs.append(WSPair(problem, c["ws"], normalize_config(configs[c["ws"]], kernel_keys=True)[0],
                                normalize_config(configs[c["twin"]], kernel_keys=True)[0], c["measured_gain"]))
    if not pairs:
        raise ValueError(f"no measured ws/twin pair in {path!r}: it needs benchmarks/hopper_ws.py's 'speed' "
                         f"section with 'calibration' rows (rerun it without --skip-speed)")
    return arch, pairs


def predicted(pairs: list[WSPair], arch: GPUArch, ws: WSConstants) -> np.ndarray:
    """The ws term's predicted gain of each pair."""
    return np.array([ws_gain(p.problem, arch, p.twin, p.ws, ws=ws) for p in pairs])


def sign_agreement(pairs: list[WSPair], pred: np.ndarray) -> tuple[int, int]:
    """(agreeing, counted): pairs measured outside :data:`NOISE` whose predicted gain is on the same side of 1."""
    meas = np.array([p.measured_gain for p in pairs])
    counted = np.abs(meas - 1.0) > NOISE
    return int(((pred > 1.0) == (meas > 1.0))[counted].sum()), int(counted.sum())


def fit(pairs: list[WSPair], arch: GPUArch, start: WSConstants, free: tuple[str, ...] = FREE) -> WSConstants:
    """Least squares on ``log(predicted / measured gain)`` over ``free`` within :data:`BOUNDS`."""
    meas = np.log([p.measured_gain for p in pairs])
    return fit_log_space(start, free, BOUNDS, lambda w: np.log(predicted(pairs, arch, w)) - meas, max_nfev=400)


def _report(title: str, pairs: list[WSPair], arch: GPUArch, ws: WSConstants) -> None:
    from scipy.stats import spearmanr

    pred, meas = predicted(pairs, arch, ws), np.array([p.measured_gain for p in pairs])
    agree, counted = sign_agreement(pairs, pred)
    rms = math.sqrt(float(np.mean((np.log(pred) - np.log(meas)) ** 2)))
    print(f"{title} rms log error {rms:.3f}, sign agrees on {agree}/{counted} pairs outside +-{NOISE:.0%}, "
          f"Spearman rho {spearmanr(pred, meas).statistic:.2f}")
    print("| shape | ws config | measured | predicted | proposed |\n|---|---|---|---|---|")
    for p, g in zip(pairs, pred):
        print(f"| {p.problem.M}x{p.problem.N}x{p.problem.K} | {p.ws_label} | {p.measured_gain:.3f} | {g:.3f} | "
              f"{'yes' if g >= 1 + ws.min_gain else 'no'} |")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="hopper_ws.json written by benchmarks/hopper_ws.py")
    ap.add_argument("--start", choices=["current", "default"], default="default",
                    help="start from WS_CONSTANTS['hopper'] or from WSConstants() (the uncalibrated guesses)")
    args = ap.parse_args(argv)
    arch, pairs = load_pairs(args.report)
    start = WS_CONSTANTS["hopper"] if args.start == "current" else WSConstants()
    _report("before:", pairs, arch, start)
    const = fit(pairs, arch, start)
    _report("after:", pairs, arch, const)
    print_constants(const)


if __name__ == "__main__":
    main()
