"""Score the carver's hints offline against measured grids, every family (a benchmark, not a test).

    python benchmarks/hint_quality.py [--data DIR_OR_FILE ...] [--arch H200] [--out DIR]

``--data`` defaults to the grids shipped in ``benchmarks/data`` (the H200 GEMM grids, the H200 hint runs,
the GEMV and attention grids); any directory of files in measure_gemm_grid.py's format works, e.g. what
``benchmarks/measure_hints.py`` or ``benchmarks/gemv.py`` wrote on the GPU machine. The scores are those
of ``tilecarve.quality`` (its module doc says what each means); per file it prints

* hints@1 / hints@8: the grid's best measured latency over that of the carver's first hint / of the best
  of its top 8 (1.000 = found the best). Hints the file has no measurement for are skipped and counted
  ("unmeas", of 16); a hints@1 marked ``*`` is that of the first *measured* hint;
* rank@1 / rank@8: the same for the model's order of the measured configs (no unmeasured entries);
* rho: Spearman's rho of predicted against measured latency; legal / dropped measured configs and the best
  dropped one as a fraction of the best;
* TL@8 / TL@16: TileLang's carver, where its hints are recorded (``r``) or computed offline (``o``).

It writes ``hint_quality.json`` and the figures (predicted vs measured, recall@k, Spearman) to ``--out``
(default: a fresh directory under the system temp dir; the path is printed). Figures need matplotlib.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tilecarve import quality  # noqa: E402


def fmt(x: float | None, star: bool = False) -> str:
    return "   -  " if x is None else f"{x:.3f}{'*' if star else ' '}"


def first_measured(curve: list[float | None]) -> tuple[float | None, bool]:
    """The fraction of the first measured entry, and whether it is not the first entry."""
    i = next((i for i, v in enumerate(curve) if v is not None), None)
    return (None, False) if i is None else (curve[i], i > 0)


def print_table(scores: list[dict[str, Any]]) -> None:
    head = (f"{'family':>9} {'shape':>36} {'arch':>5} | {'hints@1':>7} {'hints@8':>7} {'unmeas':>6} | "
            f"{'rank@1':>6} {'rank@8':>6} | {'rho':>6} {'legal':>5} {'drop':>4} {'drop-best':>9} | "
            f"{'TL@8':>6} {'TL@16':>6}")
    print(head)
    print("-" * len(head))
    for s in scores:
        r = s["recall"]
        h = r.get(quality.TILECARVE_HINTS, [None] * 16)
        h1, star = first_measured(h)
        tl = r.get(quality.TILELANG_HINTS)
        src = {"recorded": "r", "computed offline": "o"}.get(s["tilelang_hints"], " ")
        rho = "   -  " if s["spearman"] is None else f"{s['spearman']:6.3f}"
        print(f"{s['family']:>9} {s['label']:>36} {s['arch']:>5} | {fmt(h1, star):>7} {fmt(h[7]):>7} "
              f"{s['unmeasured'].get(quality.TILECARVE_HINTS, 0):>3}/16 | "
              f"{fmt(r[quality.TILECARVE_RANK][0])} {fmt(r[quality.TILECARVE_RANK][7])} | "
              f"{rho} {s['n_legal']:>5} {s['n_dropped']:>4} {fmt(s['dropped_best_fraction']):>9} | "
              f"{fmt(tl and tl[7])}{src} {fmt(tl and tl[15])}")
    print("* the first hint has no measurement: hints@1 is that of the first measured hint. TL: r = TileLang's "
          "hints recorded with the grid, o = computed offline (benchmarks/tilelang_hints.py), unmeasured skipped.")
    for s in scores:
        if s["n_unknown_keys"]:
            print(f"{s['family']} {s['label']}: skipped {s['n_unknown_keys']} configs with keys the {s['family']} "
                  f"config no longer has (a removed knob)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", nargs="+", default=[str(quality.DATA_ROOT)],
                    help="directories (searched recursively) or files of measured grids (default: %(default)s)")
    ap.add_argument("--arch", default=None, help="a carver.arch name for every file (default: each file's device)")
    ap.add_argument("--out", default=None, help="directory for hint_quality.json and the PNGs (default: a temp dir)")
    a = ap.parse_args(argv)
    try:
        scores = [quality.score_grid(g, a.arch) for g in quality.load_grids(*a.data)]
    except FileNotFoundError as e:
        print(f"{e}; pass --data", file=sys.stderr)
        return 2
    print_table(scores)
    out = Path(a.out or tempfile.mkdtemp(prefix="tilecarve-hint-quality-"))
    try:
        summary = quality.save_report(scores, out, " ".join(a.data), a.arch)
    except ImportError as e:
        print(f"\n{e}", file=sys.stderr)
        return 1
    print()
    for path in summary["paths"].values():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
