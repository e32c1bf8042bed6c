"""benchmarks/warp_split.py offline: the configs it times, and the committed measurements the carver's
full_row proposals rest on (docs/hopper-ws.md, "The warp split")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from carver.arch import CUDA
from templates import matmul as mm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
warp_split = pytest.importorskip("warp_split")
DATA = {gpu: ROOT / "benchmarks" / "data" / f"warp-split-2026-11-23-{gpu}" for gpu in ("h200", "h100")}


def test_every_config_is_legal_and_every_base_tile_comes_in_both_splits():
    arch = CUDA("H200")
    configs, n_cand, n_twins = warp_split.configs_for(2048, 14336, 4096, arch)
    problem = mm.make_problem(2048, 14336, 4096, "float16")
    assert [mm.MatmulConfig.from_dict(c) for c in configs[:n_cand]] == mm.candidates(problem, arch, 4)
    assert all(mm.check(problem, mm.MatmulConfig.from_dict(c), arch) == [] for c in configs)
    assert len({json.dumps(c, sort_keys=True) for c in configs}) == len(configs)
    tiles = configs[n_cand + n_twins:]
    for c in tiles:
        other = "square" if c.get("warp_policy", "square") == "full_row" else "full_row"
        assert mm.MatmulConfig.from_dict({**c, "warp_policy": other}).to_dict() in configs
    assert {c.get("variant", "pipelined") for c in tiles} == {"pipelined", "ws"}
    # split-K tiles only where their tiles fill less than a wave
    few, _, _ = warp_split.configs_for(128, 4096, 14336, arch)
    assert any(c.get("split_k", 1) > 1 for c in few) and not any(c.get("variant") == "ws" for c in few)


def test_pairs_read_the_interleaved_medians():
    sq = dict(block_M=256, block_N=128, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
    fr, alone = dict(sq, warp_policy="full_row"), dict(sq, block_N=256)
    rows = [dict(config=c, ms=1.0) for c in (sq, fr, alone)]
    label = warp_split._cfg_label
    (pair,) = warp_split.pairs(rows, {label(sq): 2.0, label(fr): 1.6, label(alone): 1.0})
    assert pair == dict(square=label(sq), square_ms=2.0, full_row_ms=1.6, gain=1.25)
    assert warp_split.pairs(rows, {label(sq): 2.0})[0]["gain"] is None  # the twin failed: no gain


@pytest.mark.parametrize("gpu", list(DATA))
def test_committed_tables_match_their_data_and_the_ws_loop_gains_from_full_row(gpu):
    report = json.loads((DATA[gpu] / "warp_split.json").read_text())
    assert warp_split.render(report) == (DATA[gpu] / "warp_split.md").read_text()
    pairs = [p for row in report["shapes"] for p in row.get("pairs", []) if p["gain"]]
    tall_ws = [p["gain"] for p in pairs if p["square"].endswith(" ws") and not p["square"].startswith("128x256")]
    assert len(tall_ws) >= 14 and min(tall_ws) > 1.04  # the claim ws_variants_for's full_row rests on
    tall = [p["gain"] for p in pairs if " ws" not in p["square"] and not p["square"].startswith("128x256")]
    assert sorted(tall)[len(tall) // 2] > 1.0  # pipelined: median gain, with a few losses
