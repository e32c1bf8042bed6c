"""When the hand-scheduled Hopper main loop pays (``variant="ws"``, ``templates/matmul/ws_program.py``):
the carver's latency model (:mod:`carver.model`) applied to that loop instead of TileLang's ``T.Pipelined``.

The variant keeps the tile, the stages and the TMA producer of the config it is made from, so it is the
same model with four terms changed, each by a constant of :class:`WSConstants`:

* **the drain**: ``T.Pipelined`` waits for every wgmma batch before releasing its stage
  (``warpgroup_wait<0>``), so the tensor pipe drains every K step (the model's ``warpgroup_drain_us``);
  with one batch in flight the next batch is queued while the last one finishes: ``drain_hidden`` of the
  drain goes, and the per-iteration fixed cost (``iter_overhead_us``) shrinks to ``iter_overhead_factor``;
* **the shared operand** (clusters): a TMA multicast reads the tile two CTAs share from L2 once, so the
  L2-to-SM traffic per CTA falls from ``bm + bn`` rows to ``bm / cn + bn / cm`` (``multicast_efficiency``
  of the saving is realised; the per-SM ingest is unchanged), while each cluster barrier arrival costs
  ``cluster_sync_us`` per iteration;
* **the epilogue** (persistent): the producer loads the next tile while the consumers store this one, so
  ``persistent_overlap`` of every wave's fill and epilogue but the first is hidden;
* **tall tiles**: with ``block_M > 128`` the ws loop measured ``tall_tile_loss`` slower than its model.
  Those 256x128 tiles were all measured with TileLang's square warp split, which deals each of the two
  consumer warpgroups half the *columns* (m64n64 wgmma reading A twice; 2026-11-23, sm_90a source).
  ``templates.matmul.space.ws_variants_for`` now gives them ``warp_policy="full_row"`` (each warpgroup
  128 whole rows, m64n128), measured 1.05-1.11x faster than the square form and still 0.91-0.97x of the
  pipelined twin (``benchmarks/data/warp-split-2026-11-23-*``), where 128x256 measured 0.94-0.99x. So most
  of the constant was the split; it is NOT refit on full_row pairs (no pair table of that form exists in
  the calibration format), and it keeps 256-row ws forms out of the candidates, which the measurements
  support.

CALIBRATED for the Hopper family by ``python -m carver.calibrate_ws
benchmarks/data/hopper-ws-2026-11-22-h200/hopper_ws.json``: least squares on log(gain) over 42 ws/twin
pairs of 4 fp16 shapes (4096^3, 8192^3, 4000^3, 4001x4097x4096) on ONE H200, 2026-11-22, burst timings,
no holdout. rms log error 0.115 -> 0.046; the predicted gain is on the measured side of 1 for 28 of the
30 pairs measured outside +-3% (9 of 30 with the guesses; the two misses: 4096^3 128x256x64 s3, measured
0.967, predicted 1.013; 8192^3 128x256x32 s6, 0.963 / 1.029); Spearman rho 0.49 -> 0.89. Three constants
sit on a bound (drain_hidden, multicast_efficiency, persistent_overlap = 1): the data says those effects
are at most as large as the model allows, not that they are exactly 1. The H100 is unmeasured; it uses
the same constants (one Hopper family). :func:`ws_gain` decides which variants the autotuner measures
(``min_gain``); it never reorders the carver's own hints. docs/hopper-ws.md has the pair table.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .arch import GPUArch
from .lowering import ConfigArrays, lower
from .model import ModelConstants, constants_for, predict_arrays
from .problem import MatmulProblem
from .validity import cluster_shape

__all__ = ["WSConstants", "WS_CONSTANTS", "predict_pipelined_us", "predict_ws_us", "ws_gain"]


@dataclass(frozen=True)
class WSConstants:
    """How the ws loop changes the model's terms (see the module docstring). The defaults are the
    uncalibrated guesses (and ``tall_tile_loss=0``); :data:`WS_CONSTANTS` holds the fitted values."""

    drain_hidden: float = 0.8          # fraction of the per-iteration wgmma drain one batch in flight hides
    iter_overhead_factor: float = 0.8  # ws per-iteration fixed cost over T.Pipelined's
    multicast_efficiency: float = 0.8  # fraction of the shared operand's L2 reads a multicast saves
    cluster_sync_us: float = 0.01      # per iteration: remote empty-barrier arrivals, cluster co-scheduling
    persistent_overlap: float = 0.7    # fraction of each later wave's fill + epilogue the persistent loop hides
    tall_tile_loss: float = 0.0        # latency fraction lost by block_M > 128 (two consumer warpgroups along M)
    min_gain: float = 0.02             # predicted speedup (fraction) a variant needs to be proposed
    calibrated: bool = False

    def replace(self, **changes: Any) -> WSConstants:
        """A copy with ``changes`` (the calibration fit moves constants through this)."""
        return dataclasses.replace(self, **changes)


#: Per arch family; only Hopper runs the variant. Fitted on H200 pairs (module docstring); ``min_gain``
#: is the noise of those burst timings (3%): a form predicted within it of its base is not worth a trial.
WS_CONSTANTS: dict[str, WSConstants] = {"hopper": WSConstants(
    drain_hidden=1.0, iter_overhead_factor=1.0217, multicast_efficiency=1.0, cluster_sync_us=0.0476,
    persistent_overlap=1.0, tall_tile_loss=0.1443, min_gain=0.03, calibrated=True)}


def _one(problem: MatmulProblem, arch: GPUArch, config: Mapping[str, Any], k: ModelConstants) -> Any:
    cfgs = ConfigArrays.from_configs([dict(config)])
    return predict_arrays(problem, arch, lower(problem, arch, cfgs), k)


def predict_pipelined_us(problem: MatmulProblem, arch: GPUArch, config: Mapping[str, Any],
                         const: ModelConstants | None = None) -> float:
    """Predicted latency (us) of ``config`` as TileLang's ``T.Pipelined`` program: the carver's model."""
    return _finite(float(_one(problem, arch, config, const or constants_for(arch)).latency_us[0]), problem, config)


def predict_ws_us(problem: MatmulProblem, arch: GPUArch, config: Mapping[str, Any],
                  const: ModelConstants | None = None, ws: WSConstants | None = None) -> float:
    """Predicted latency (us) of ``config`` run as the ws variant (its ``cluster`` and ``persistent`` keys
    read; the rest is the tile the carver models)."""
    k = const or constants_for(arch)
    w = ws or WS_CONSTANTS.get(arch.family, WSConstants())
    cm, cn = cluster_shape(config.get("cluster", "1x1"))
    bm, bn = float(config["block_M"]), float(config["block_N"])
    saved = w.multicast_efficiency * (bm * (1 - 1 / cn) + bn * (1 - 1 / cm))
    traffic = (bm + bn - saved) / (bm + bn)
    changed = k.replace(
        warpgroup_drain_us=k.warpgroup_drain_us * (1.0 - w.drain_hidden),
        iter_overhead_us=k.iter_overhead_us * w.iter_overhead_factor + (w.cluster_sync_us if cm * cn > 1 else 0.0),
        l2_bandwidth_per_sm=k.l2_bandwidth_per_sm / traffic,
    )
    t = _one(problem, arch, config, changed)
    latency = float(t.latency_us[0])
    if config.get("persistent"):
        whole = max(1.0, math.ceil(float(t.waves[0])))
        latency -= w.persistent_overlap * float(t.epilogue_us[0]) * (1.0 - 1.0 / whole)
    return _finite(latency * (1.0 + (w.tall_tile_loss if bm > 128 else 0.0)), problem, config)


def _finite(us: float, problem: MatmulProblem, config: Mapping[str, Any]) -> float:
    if not (np.isfinite(us) and us > 0):
        raise RuntimeError(f"carver bug: the ws model predicted {us} us for {dict(config)} on {problem.describe()}; "
                           "please report it with the shape")
    return us


def ws_gain(problem: MatmulProblem, arch: GPUArch, base: Mapping[str, Any], variant: Mapping[str, Any],
            const: ModelConstants | None = None, ws: WSConstants | None = None) -> float:
    """Predicted speedup of ``variant`` (a ws config: its tile, stages, cluster and persistent keys) over
    ``base`` run as TileLang's ``T.Pipelined`` program (> 1: the variant is predicted faster). Both are
    normalised matmul config dicts; the variant may have fewer stages than its base (its C tile takes
    shared memory the base's reuses)."""
    k = const or constants_for(arch)
    base_us = predict_pipelined_us(problem, arch, base, k)
    return base_us / predict_ws_us(problem, arch, variant, k, ws)
