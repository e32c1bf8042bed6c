"""Score the carver's GEMM hints offline against measured grids (a benchmark, not a test).

    python benchmarks/hint_quality.py [--data ../shared/data/h200-gemm-grid] [--arch H200] [--out DIR]

For every measured shape (files in measure_gemm_grid.py's format, e.g. the shared H200 grids or what
benchmarks/measure_hints.py wrote on the GPU machine) it reports:

* hints top-1 / best-of-top-8: the measured latency of the grid's best config divided by that of the
  carver's first hint / its best hint among the top 8 (1.0 = found the best). Hints the file has no
  measurement for (the carver searches beyond TileLang's 288-config grid) cannot be scored: they are
  counted as "unmeasured" and the scores use the measured hints only, so a top-1 that is unmeasured is
  reported as the first *measured* hint and flagged with "*".
* grid top-1 / top-8: the same with ``tmpl.rank()`` over the measured configs only, which needs no
  unmeasured configs and so measures the model alone.
* Spearman's rho between predicted and measured latency over every legal measured config, and how many
  measured configs the validity function rejects (with the best of them, to show none was a winner).
* the time one ``recommend_hints(topk=8)`` call takes on this CPU.

It prints a table and writes ``hint_quality.json`` and ``hint_quality.png`` (predicted vs measured)
to ``--out`` (default: a fresh directory under the system temp dir; the path is printed).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from carver import MatmulTemplate  # noqa: E402
from carver.arch import CUDA, GPUArch  # noqa: E402

DEFAULT_DATA = REPO.parent / "shared" / "data" / "h200-gemm-grid"
KEYS = ("block_M", "block_N", "block_K", "num_stages", "thread_num", "enable_rasterization")


def config_key(cfg: dict[str, Any]) -> tuple:
    """The identity of a config in a measured file (panel_size 10 and split_k 1 are the defaults)."""
    return tuple(int(cfg[k]) for k in KEYS) + (int(cfg.get("panel_size", 10)), int(cfg.get("split_k", 1)))


def spearman(x: list[float], y: list[float]) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def score_file(path: str, arch: GPUArch, topk: int = 8) -> dict[str, Any]:
    with open(path) as f:
        data = json.load(f)
    s = data["summary"]
    M, N, K = int(s["M"]), int(s["N"]), int(s["K"])
    dtype = s.get("dtype", "float16")
    rows = [r for r in data["results"] if r.get("ms") and r.get("correct")]
    measured = {config_key(r["config"]): r["ms"] for r in rows}
    best_ms = min(measured.values())
    tmpl = MatmulTemplate(M, N, K, in_dtype=dtype, out_dtype=s.get("out_dtype", dtype)).with_arch(arch)

    t0 = time.perf_counter()
    hints = tmpl.recommend_hints(topk=topk)
    first_call_ms = (time.perf_counter() - t0) * 1e3
    reps = 10
    t0 = time.perf_counter()
    for _ in range(reps):
        MatmulTemplate(M, N, K, in_dtype=dtype).with_arch(arch).recommend_hints(topk=topk)
    call_ms = (time.perf_counter() - t0) * 1e3 / reps

    hint_rows = []
    for h in hints:
        cfg = h.to_config()
        ms = measured.get(config_key(cfg))
        hint_rows.append(dict(config=cfg, predicted_ms=h.prediction.latency_ms, measured_ms=ms,
                              fraction_of_best=None if ms is None else best_ms / ms))
    got = [r["measured_ms"] for r in hint_rows if r["measured_ms"] is not None]
    first = next((r for r in hint_rows if r["measured_ms"] is not None), None)

    ranking = tmpl.rank([r["config"] for r in rows])
    ranked_ms = [measured[config_key(rc.config)] for rc in ranking.ranked]
    pred = [rc.prediction.latency_ms for rc in ranking.ranked]
    dropped_ms = [measured[config_key(d.config)] for d in ranking.dropped]
    return dict(
        shape=f"{M}x{N}x{K}", M=M, N=N, K=K, dtype=dtype, device=s.get("device"), file=os.path.abspath(path),
        grid_best_ms=best_ms, grid_best=min(rows, key=lambda r: r["ms"])["config"],
        cublas_ms=s.get("cublas_ms"),
        hints=hint_rows,
        hints_unmeasured=sum(r["measured_ms"] is None for r in hint_rows),
        top1=None if first is None else best_ms / first["measured_ms"],
        top1_is_first_hint=bool(hint_rows and hint_rows[0]["measured_ms"] is not None),
        top8=None if not got else best_ms / min(got),
        grid_top1=best_ms / ranked_ms[0], grid_top8=best_ms / min(ranked_ms[:topk]),
        spearman=spearman(pred, ranked_ms), n_legal=len(ranked_ms), n_dropped=len(dropped_ms),
        dropped_best_fraction=None if not dropped_ms else best_ms / min(dropped_ms),
        recommend_ms_first=first_call_ms, recommend_ms=call_ms,
        # measure_gemm_grid.py files score TileLang's carver there; measure_hints.py files ("carver":
        # "tilecarve") score ours, which is not what this column reports
        tilelang_carver_top10=None if s.get("carver") == "tilecarve" else s.get("carver_top10_vs_best"),
        scatter=dict(predicted_ms=pred, measured_ms=ranked_ms),
    )


def fmt(x: float | None, star: bool = False) -> str:
    return "   -  " if x is None else f"{x:.3f}{'*' if star else ' '}"


def print_table(results: list[dict[str, Any]], arch: GPUArch) -> None:
    print(f"carver hint quality on {arch.name} (fractions of each grid's measured best; 1.000 = found it)")
    head = (f"{'shape':>17} | {'top1':>6} {'top8':>6} {'unmeas':>6} | {'grid1':>6} {'grid8':>6} | "
            f"{'rho':>6} {'legal':>5} {'drop':>4} {'drop-best':>9} | {'ms/call':>7} | {'TL carver10':>11}")
    print(head)
    print("-" * len(head))
    for r in results:
        print(f"{r['shape']:>17} | {fmt(r['top1'], not r['top1_is_first_hint'])} {fmt(r['top8'])} "
              f"{r['hints_unmeasured']:>4}/8 | {fmt(r['grid_top1'])} {fmt(r['grid_top8'])} | "
              f"{r['spearman']:6.3f} {r['n_legal']:>5} {r['n_dropped']:>4} {fmt(r['dropped_best_fraction']):>9} | "
              f"{r['recommend_ms']:7.1f} | {fmt(r['tilelang_carver_top10']):>11}")
    print("* the first hint has no measurement; top1 is the first measured hint. 'unmeas' hints are outside "
          "the measured grid and are not scored (measure them with benchmarks/measure_hints.py).")
    for r in results:
        print(f"\n{r['shape']} ({r['device']}): grid best {r['grid_best_ms'] * 1e3:.1f} us {r['grid_best']}")
        for i, h in enumerate(r["hints"]):
            m = "unmeasured" if h["measured_ms"] is None else (
                f"measured {h['measured_ms'] * 1e3:8.1f} us ({h['fraction_of_best']:.3f})")
            print(f"  #{i + 1} {h['config']}  predicted {h['predicted_ms'] * 1e3:8.1f} us  {m}")


def plot(results: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(results)
    cols = min(n, 2)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 5 * rows), squeeze=False)
    for ax, r in zip(axes.flat, results):
        meas = [m * 1e3 for m in r["scatter"]["measured_ms"]]
        pred = [p * 1e3 for p in r["scatter"]["predicted_ms"]]
        ax.scatter(meas, pred, s=8, alpha=0.5, label="legal measured configs")
        hm = [(h["measured_ms"] * 1e3, h["predicted_ms"] * 1e3) for h in r["hints"] if h["measured_ms"]]
        if hm:
            ax.scatter(*zip(*hm), s=40, facecolors="none", edgecolors="red", label="top-8 hints (measured)")
        lo, hi = min(meas + pred), max(meas + pred)
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured latency (us)")
        ax.set_ylabel("predicted latency (us)")
        ax.set_title(f"{r['shape']}: rho={r['spearman']:.3f}, top8={fmt(r['top8']).strip()}")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA), help="a directory of MxNxK.json grids, or files")
    ap.add_argument("--arch", default="H200", help="the GPU the data was measured on (a carver.arch name)")
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--out", default=None, help="directory for hint_quality.json/.png (default: a temp dir)")
    a = ap.parse_args(argv)
    # one file per shape, named MxNxK.json; measure_hints.py's summary.json beside them is not a grid
    files = sorted(f for f in glob.glob(os.path.join(a.data, "*.json"))
                   if re.fullmatch(r"\d+x\d+x\d+\.json", os.path.basename(f))) if os.path.isdir(a.data) else [a.data]
    if not files:
        print(f"no *.json grids under {a.data}; pass --data", file=sys.stderr)
        return 2
    arch = CUDA(a.arch)
    results = [score_file(f, arch, a.topk) for f in files]
    print_table(results, arch)
    out = a.out or tempfile.mkdtemp(prefix="tilecarve-hint-quality-")
    os.makedirs(out, exist_ok=True)
    json_path = os.path.join(out, "hint_quality.json")
    with open(json_path, "w") as f:
        json.dump(dict(arch=arch.name, topk=a.topk, results=results), f, indent=1)
    png_path = os.path.join(out, "hint_quality.png")
    plot(results, png_path)
    print(f"\nwrote {json_path}\nwrote {png_path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
