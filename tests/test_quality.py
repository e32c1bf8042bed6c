"""tilecarve.quality on the measured grids shipped in benchmarks/data (offline: no GPU, no compiling)."""

from __future__ import annotations

import json
import math

import pytest

from tilecarve import quality

GEMM = quality.DATA_ROOT / "h200-gemm-grid"
GEMV = quality.DATA_ROOT / "gemv-2026-11-21-h200"
ATTENTION = quality.DATA_ROOT / "attention-2026-11-21-h200"


@pytest.fixture(scope="module")
def gemm_scores():
    return [quality.score_grid(g) for g in quality.load_grids(GEMM)]


def test_recall_curve_and_spearman_on_small_cases():
    assert quality.recall_curve([2.0, None, 1.0], 1.0, ks=(1, 2, 3, 4)) == [0.5, 0.5, 1.0, None]
    assert quality.recall_curve([None, 4.0], 2.0, ks=(1, 2)) == [None, 0.5]
    assert quality.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert quality.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert quality.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)  # ties averaged
    with pytest.raises(ValueError, match="at least 2"):
        quality.spearman([1.0], [1.0])


def test_the_gemm_grids_score_as_docs_carver_md_says(gemm_scores):
    by = {s["label"]: s for s in gemm_scores}
    assert set(by) == {"2048x14336x4096", "256x8192x8192", "4096x4096x4096", "8192x8192x8192"}
    for s in gemm_scores:
        assert s["family"] == "matmul" and s["arch"] == "H200"
        if s["label"] == "256x8192x8192":
            # the carver's top 16 are deeper-staged or split tiles this grid (stages <= 3) never measured;
            # few-rows-2026-11-23b-h200 measured them: test_few_row_searches_... below
            assert s["recall"][quality.TILECARVE_HINTS][7] is None
        else:
            assert s["recall"][quality.TILECARVE_HINTS][7] == 1.0  # the best config is in the top 8
        assert s["recall"][quality.TILECARVE_RANK][7] == 1.0
        assert 0.9 < s["spearman"] < 1.0
        assert s["tilelang_hints"] == "recorded"
        # TileLang's own recorded score, recomputed from its recorded hints
        assert s["recall"][quality.TILELANG_HINTS][9] == pytest.approx(
            json.loads(open(s["file"]).read())["summary"]["carver_top10_vs_best"])
        assert s["recall"][quality.TILELANG_HINTS][15] < 0.5  # TileLang's carver misses by 2x or more
        assert s["dropped_best_fraction"] < 0.5  # the validity rules drop no winner
    assert by["4096x4096x4096"]["spearman"] == pytest.approx(0.943, abs=1e-3)
    assert by["256x8192x8192"]["recall"][quality.TILECARVE_HINTS][0] is None  # its first hint is not in the grid


def test_few_row_searches_hold_their_best_in_the_carvers_top8_and_in_tunes_top4_with_the_hedge():
    """The GEMM model over every few-row search in benchmarks/data (M = 64 to 512, measured back to back on
    an H200): the regime where it is weakest (docs/carver.md). Before the miss-latency term (2026-11-23)
    the worst top-8 was 0.801 and the geomean of the top-4 0.962."""
    import sys

    sys.path.insert(0, str(quality.DATA_ROOT.parent))
    import few_rows_scores

    from carver.arch import CUDA
    from carver.model import constants_for

    rows = few_rows_scores.search_scores(CUDA("H200"), constants_for(CUDA("H200")))
    assert len(rows) >= 16 and any("256x8192x8192" in r["name"] for r in rows)
    assert min(r["top8"] for r in rows) >= 0.98
    assert min(r["top4_hedge"] for r in rows) >= 0.95
    assert math.exp(sum(math.log(r["top4_hedge"]) for r in rows) / len(rows)) >= 0.99
    assert all(r["top4_hedge"] >= r["top4"] for r in rows)


def test_every_family_in_the_data_is_scored():
    grids = quality.load_grids(quality.DATA_ROOT)
    assert {g.family for g in grids} == {"matmul", "gemv", "attention"}
    gemv = [quality.score_grid(g) for g in grids if g.family == "gemv"]
    assert len(gemv) == 12  # 5 SIMT-only H200 grids, 4 H200 holdout grids, 3 H100 holdout grids (2026-12-07)
    for s in gemv:
        # the first GEMV grids (SIMT only, 72 configs) predate the mma path: its hints are unmeasured there
        simt_only = s["n_legal"] == 72
        assert simt_only or s["n_legal"] >= 100
        assert simt_only or s["unmeasured"][quality.TILECARVE_HINTS] <= 1
        assert quality.TILELANG_HINTS not in s["recall"]
        assert all(v is None or 0 < v <= 1 for v in s["recall"][quality.TILECARVE_HINTS])
        assert -1 <= s["spearman"] <= 1
    for g in quality.load_grids(GEMV):  # every hint of theirs not measured is an mma one
        hints = quality.FAMILIES["gemv"].hints(None, g.summary, "H200", 16)
        mma = sum(h.get("path") == "mma" for h in hints)
        assert 0 < mma == quality.score_grid(g)["unmeasured"][quality.TILECARVE_HINTS]
    offline = [quality.score_grid(g) for g in grids if g.path.parent.name == "h200-hints-2026-11-21"]
    assert {s["tilelang_hints"] for s in offline} == {"computed offline"}


def test_attention_grids_are_scored_without_the_removed_overlap_rows():
    """The H200 attention files hold 9 overlap configs (all mismatching; the knob is gone): skipped and
    counted, and the calibrated carver's top-8 holds each file's best (docs/attention.md, Measured)."""
    scores = [quality.score_grid(g) for g in quality.load_grids(ATTENTION)]
    assert len(scores) == 6 and {s["family"] for s in scores} == {"attention"}
    for s in scores:
        assert s["n_unknown_keys"] == 9 and s["unmeasured"][quality.TILECARVE_HINTS] == 0
        assert s["n_measured"] == 27 and s["n_legal"] + s["n_dropped"] == 27
        assert s["best_config"] == {"block_M": 128, "block_N": 128, "num_stages": 1, "threads": 256}
        assert s["recall"][quality.TILECARVE_HINTS][7] == 1.0 and s["recall"][quality.TILECARVE_RANK][7] == 1.0
        assert s["spearman"] > 0.9


def test_rows_with_keys_the_family_no_longer_has_are_skipped(tmp_path):
    row = {"config": {"block_M": 128, "block_N": 64, "num_stages": 1, "threads": 256}, "ms": 1.0, "correct": True}
    gone = {"config": {**row["config"], "overlap": False}, "ms": 0.5, "correct": True}  # would be the best
    summary = {"family": "attention", "device": "NVIDIA H200",
               "problem": {"batch": 1, "heads": 8, "seq_len": 1024, "dim": 64}}
    (tmp_path / "a.json").write_text(json.dumps({"summary": summary, "results": [row, gone]}))
    (g,) = quality.load_grids(tmp_path)
    assert g.rows == [row] and g.unknown_keys == 1
    s = quality.score_grid(g)
    assert s["best_ms"] == 1.0 and s["n_unknown_keys"] == 1 and s["n_legal"] == 1


def test_unknown_family_names_the_fix(tmp_path):
    (tmp_path / "1x2x3.json").write_text(json.dumps({"summary": {"family": "conv"}, "results": []}))
    with pytest.raises(ValueError, match=r"\['conv'\].*FAMILIES"):
        quality.load_grids(tmp_path)
    with pytest.raises(FileNotFoundError, match="nothing-here does not exist"):
        quality.load_grids(tmp_path / "nothing-here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no measured grid"):
        quality.load_grids(tmp_path / "empty")


def test_mispredictions_are_worst_first(gemm_scores):
    worst = quality.mispredictions(gemm_scores[0], 5)
    errs = [abs(math.log(w["ratio"])) for w in worst]
    assert len(worst) == 5 and errs == sorted(errs, reverse=True)
    assert all(1 <= w["model_rank"] <= gemm_scores[0]["n_legal"] for w in worst)


def test_write_report_writes_the_figures(tmp_path):
    pytest.importorskip("matplotlib", reason="pip install -e '.[test]' for matplotlib")
    summary = quality.write_report(GEMV, tmp_path / "out")
    paths = summary["paths"]
    assert set(paths) == {"scatter", "recall", "spearman", "json"}
    for key in ("scatter", "recall", "spearman"):
        assert open(paths[key], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert summary["families"]["gemv"]["files"] == 5
    assert summary["families"]["gemv"][f"{quality.TILECARVE_HINTS} recall@8"]["min"] > 0.9
    json.dumps(summary)  # JSON-able
    assert len(json.loads(open(paths["json"]).read())["scores"]) == 5


def test_tilelang_hints_offline_are_the_ones_recorded_on_the_gpu():
    """benchmarks/tilelang_hints.py's device-free arch gives TileLang's carver the hints it gave on the H200."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tilelang_hints", quality.DATA_ROOT.parent / "tilelang_hints.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    summary = json.loads((GEMM / "256x8192x8192.json").read_text())["summary"]
    want = [h["config"] for h in summary["hints"]]
    assert mod.tilelang_hints(256, 8192, 8192, topk=len(want)) == want


def test_a_file_that_spells_every_default_out_scores_as_one_that_leaves_them_out(tmp_path):
    """A grid file may write a config whole (``"tma": true``, ``"panel_size": 10``...) where the
    carver's hints leave defaults out: a row is found by its canonical spelling, not as written (a GEMV
    file with ``"tma": true`` raised KeyError before)."""
    import dataclasses

    for family, folder in (("matmul", GEMM), ("gemv", GEMV), ("attention", ATTENTION)):
        grid = next(g for g in quality.load_grids(folder) if g.family == family)
        doc = json.loads(grid.path.read_text())
        cls = quality.FAMILIES[family].config()
        spelled = 0
        for r in doc["results"]:
            try:
                c = cls.from_dict(r["config"])
                # the keys the carver models (the grids measure its program), not the kernels' own knobs
                full = c.carver_dict() if family == "matmul" else {
                    f.name: getattr(c, f.name) for f in dataclasses.fields(c) if f.name not in ("pass_configs", "vec")}
            except Exception:  # noqa: BLE001 - rows the class refuses stay as written
                continue
            spelled += len(full) > len(r["config"])
            r["config"] = full
        assert spelled > 10, family
        (tmp_path / family).mkdir()
        (tmp_path / family / grid.path.name).write_text(json.dumps(doc))
        (whole,) = quality.load_grids(tmp_path / family)
        a, b = quality.score_grid(grid), quality.score_grid(whole)
        assert a["recall"] == b["recall"] and a["spearman"] == b["spearman"], family


HINTS = quality.DATA_ROOT / "attention-hints-2026-11-29-h200"


def test_attention_grids_of_both_programs_score_what_tuning_measures():
    """``benchmarks/attention_ws.py``'s grids (``"variants": true``: the plain top-8 and every ws config, measured on
    an H200 after the d64 changes of 2026-11-29, with the plain program as it was before its mask replaced the
    scores) score the candidates tuning measures at ``topk=8`` in the model's order: the ws configs come first, and
    the best 8 hold each shape's best to 0.97 (the issue's target; measured: 0.995 or better, on four shapes of the
    calibration sets and four nobody measured before). Scored as plain grids, the hints are the T.Pipelined top-8
    alone, whose best is 0.76-0.93 of each shape's best. The grids predate ``pack_gqa``: where the candidates now
    hold packed configs (GQA at d64, which the race of 2026-12-02 measured faster), those are the hints the grids
    lack (two at most: where the model's three best ws configs are all packed, the third slot goes to its best
    unpacked one, ``space.ws_top``), and the measured hints still hold each shape's best to 0.97 (the packed grids
    of that day judge the packed ones: :func:`test_attention_grids_with_packed_gqa_hold_the_best_in_the_top8`)."""
    from templates.attention.space import WS_TOP

    grids = quality.load_grids(HINTS)
    assert len(grids) == 8 and all(g.summary["variants"] and g.summary["topk"] == 8 for g in grids)
    judged = 0  # shapes all of whose hints the grid measured
    for g in grids:
        s = quality.score_grid(g)
        hints = quality.FAMILIES["attention"].hints(quality.FAMILIES["attention"].model(g.summary, "H200"),
                                                    g.summary, "H200", 16)
        assert hints[0]["variant"] == "ws" and len(hints) == 8 + WS_TOP  # the grid's topk, not the 16 asked
        measured = {json.dumps(r["config"], sort_keys=True) for r in g.rows}
        lacking = [h for h in hints if json.dumps(h, sort_keys=True) not in measured]
        assert all(h.get("pack_gqa") for h in lacking), (g.label, lacking)  # only what the grid predates
        assert s["unmeasured"][quality.TILECARVE_HINTS] == len(lacking) <= WS_TOP - 1
        judged += not lacking
        assert s["recall"][quality.TILECARVE_HINTS][7] >= 0.97, g.label
        plain = quality.score_grid(quality.Grid(g.path, {**g.summary, "variants": False}, g.rows))
        assert plain["recall"][quality.TILECARVE_HINTS][7] < 0.97 * s["recall"][quality.TILECARVE_HINTS][7], g.label
    assert judged == 4  # 2 x 8k, 3 x 3500, 1 x 12288 causal, 2 x 6144 d128: no packed twin among the three


def test_attention_grids_with_packed_gqa_hold_the_best_in_the_top8():
    """The ws space with ``pack_gqa`` measured whole on two shapes nobody had measured (H200, 2026-12-02,
    ``benchmarks/data/attention-packgqa-2026-12-02-h200/unseen1``): every hint measured, and the best 8 of the
    candidates tuning measures hold each shape's best to 0.97 (measured: 1.000 and 0.985)."""
    grids = quality.load_grids(quality.DATA_ROOT / "attention-packgqa-2026-12-02-h200" / "unseen1" / "grid")
    assert len(grids) == 2 and all(g.summary["variants"] for g in grids)
    for g in grids:
        s = quality.score_grid(g)
        assert s["unmeasured"][quality.TILECARVE_HINTS] == 0, g.label
        assert s["recall"][quality.TILECARVE_HINTS][7] >= 0.97, g.label
        assert s["best_config"].get("pack_gqa"), g.label  # packing is what the best config of each shape does
