"""Fit ``AttentionConstants.ws_overlap`` (the ws attention loop's share of min(tensor, softmax) hidden) on
measured ws/plain pairs (a developer tool).

    python -m carver.calibrate_attention_ws benchmarks/data/attention-ws-2026-11-22-h200 --arch H200

Reads ``benchmarks/attention_ws.py``'s ``ws.json`` files under the folder. A pair is a correct ws config
and its plain twin (the same tile and stages) timed on the same shape; its measured gain is twin / ws.
The fit picks the ``ws_overlap`` (a grid of 0.01 steps) that minimises the rms of ``log(predicted gain /
measured gain)`` over the pairs with two or more stages: one-stage ws configs are not in the ws grid
(``carver.attention.ATTENTION_WS_GRID`` says why). The printed value goes into ``carver/attention.py``
by hand.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
from dataclasses import dataclass

from .arch import CUDA, GPUArch
from .attention import ATTENTION_CONSTANTS, AttentionProblem, AttentionTemplate

__all__ = ["WsPair", "fit_ws_overlap", "load_pairs", "rms_log_error"]


@dataclass(frozen=True)
class WsPair:
    problem: AttentionProblem
    ws: dict
    twin: dict
    gain: float  # measured: twin ms / ws ms


def load_pairs(folder: str, min_stages: int = 2) -> list[WsPair]:
    """Every (ws config, plain twin) pair measured correct in the ``ws.json`` files under ``folder``."""
    pairs: list[WsPair] = []
    for path in sorted(glob.glob(os.path.join(folder, "**", "ws.json"), recursive=True)):
        for row in json.load(open(path))["rows"]:
            b, h, kv, s, d, causal = row["problem"]
            problem = AttentionProblem(batch=b, heads=h, seq_len=s, dim=d, kv_heads=kv, causal=bool(causal),
                                       dtype=row["dtype"])
            ms = {tuple(sorted(r["config"].items())): r["ms"] for r in row["measured"] if r["ms"] and r["correct"]}
            for key, t in ms.items():
                c = dict(key)
                twin = tuple(sorted((k, v) for k, v in c.items() if k != "variant"))
                if c.get("variant") == "ws" and c["num_stages"] >= min_stages and twin in ms:
                    pairs.append(WsPair(problem, c, dict(twin), ms[twin] / t))
    return pairs


def rms_log_error(pairs: list[WsPair], arch: GPUArch, ws_overlap: float) -> float:
    """The rms of log(predicted gain / measured gain) with ``ws_overlap`` in the arch family's constants."""
    const = ATTENTION_CONSTANTS[arch.family].replace(ws_overlap=ws_overlap)
    errs = []
    for p in pairs:
        t = AttentionTemplate(p.problem, arch, constants=const)
        errs.append(math.log(t.predict(p.twin).latency_ms / t.predict(p.ws).latency_ms / p.gain))
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def fit_ws_overlap(pairs: list[WsPair], arch: GPUArch) -> tuple[float, float]:
    """``(ws_overlap, rms)``: the best value on a 0.01 grid over [0, 1] and its rms log error."""
    if not pairs:
        raise ValueError("no ws/plain pairs to fit: the folder has no ws.json with both timed")
    return min(((w / 100, rms_log_error(pairs, arch, w / 100)) for w in range(101)), key=lambda x: x[1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--arch", default="H200")
    a = ap.parse_args(argv)
    arch = CUDA(a.arch)
    pairs = load_pairs(a.folder)
    now = ATTENTION_CONSTANTS[arch.family].ws_overlap
    w, rms = fit_ws_overlap(pairs, arch)
    print(f"{len(pairs)} pairs; ws_overlap {now} -> {w:.2f}; rms log error {rms_log_error(pairs, arch, now):.4f} "
          f"-> {rms:.4f}")


if __name__ == "__main__":
    main()
