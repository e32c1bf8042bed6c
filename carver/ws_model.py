"""When the hand-scheduled Hopper main loop pays (``variant="ws"``, ``templates/matmul/ws_program.py``):
the carver's latency model (:mod:`carver.model`) applied to that loop instead of TileLang's ``T.Pipelined``.

The variant keeps the tile, the stages and the TMA producer of the config it is made from, so it is the
same model with three terms changed, each by a constant of :class:`WSConstants`:

* **the drain**: ``T.Pipelined`` waits for every wgmma batch before releasing its stage
  (``warpgroup_wait<0>``), so the tensor pipe drains every K step (the model's ``warpgroup_drain_us``);
  with one batch in flight the next batch is queued while the last one finishes: ``drain_hidden`` of the
  drain goes, and the per-iteration fixed cost (``iter_overhead_us``) shrinks to ``iter_overhead_factor``;
* **the shared operand** (clusters): a TMA multicast reads the tile two CTAs share from L2 once, so the
  L2-to-SM traffic per CTA falls from ``bm + bn`` rows to ``bm / cn + bn / cm`` (``multicast_efficiency``
  of the saving is realised; the per-SM ingest is unchanged), while each cluster barrier arrival costs
  ``cluster_sync_us`` per iteration;
* **the epilogue** (persistent): the producer loads the next tile while the consumers store this one, so
  ``persistent_overlap`` of every wave's fill and epilogue but the first is hidden.

UNCALIBRATED: the constants below are guesses with a physical reading, not fits; ``benchmarks/hopper_ws.py``
measures the variant next to the configs it is made from, and its output is what calibrates them (set
``calibrated=True`` then). Until then :func:`ws_gain` only decides which variants the autotuner measures;
it never reorders the carver's own hints.
"""

from __future__ import annotations

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

__all__ = ["WSConstants", "WS_CONSTANTS", "predict_ws_us", "ws_gain"]


@dataclass(frozen=True)
class WSConstants:
    """How the ws loop changes the model's terms (see the module docstring). Uncalibrated."""

    drain_hidden: float = 0.8          # fraction of the per-iteration wgmma drain one batch in flight hides
    iter_overhead_factor: float = 0.8  # ws per-iteration fixed cost over T.Pipelined's
    multicast_efficiency: float = 0.8  # fraction of the shared operand's L2 reads a multicast saves
    cluster_sync_us: float = 0.01      # per iteration: remote empty-barrier arrivals, cluster co-scheduling
    persistent_overlap: float = 0.7    # fraction of each later wave's fill + epilogue the persistent loop hides
    min_gain: float = 0.02             # predicted speedup (fraction) a variant needs to be proposed
    calibrated: bool = False


#: Per arch family; only Hopper runs the variant.
WS_CONSTANTS: dict[str, WSConstants] = {"hopper": WSConstants()}


def _one(problem: MatmulProblem, arch: GPUArch, config: Mapping[str, Any], k: ModelConstants) -> Any:
    cfgs = ConfigArrays.from_configs([dict(config)])
    return predict_arrays(problem, arch, lower(problem, arch, cfgs), k)


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
    return latency


def ws_gain(problem: MatmulProblem, arch: GPUArch, base: Mapping[str, Any], variant: Mapping[str, Any],
            const: ModelConstants | None = None, ws: WSConstants | None = None) -> float:
    """Predicted speedup of ``variant`` (a ws config: its tile, stages, cluster and persistent keys) over
    ``base`` run as TileLang's ``T.Pipelined`` program (> 1: the variant is predicted faster). Both are
    normalised matmul config dicts; the variant may have fewer stages than its base (its C tile takes
    shared memory the base's reuses)."""
    k = const or constants_for(arch)
    base_us = float(_one(problem, arch, base, k).latency_us[0])
    ws_us = predict_ws_us(problem, arch, variant, k, ws)
    if not (np.isfinite(base_us) and np.isfinite(ws_us) and ws_us > 0):
        raise RuntimeError(f"carver bug: ws model predicted {ws_us} us against {base_us} us for {dict(variant)} "
                           f"on {problem.describe()}; please report it with the shape")
    return base_us / ws_us
