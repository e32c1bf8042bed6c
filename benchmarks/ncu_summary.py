"""Read what ``benchmarks/ncu_profile.py`` had Nsight Compute write (``ncu -i ... --page raw --csv`` and
``--page source --csv --print-source sass``, plain or gzipped) and print, per profiled kernel: its time,
SM clock, cycles, tensor-pipe activity, instructions and stall reasons; then, per kernel, its SASS grouped
by how often each instruction ran (the loop body of a kernel is the group run most often: its instructions
per warp per trip, by opcode), and its instructions with the most stall samples.

Each row is named ``label [ncu's kernel name]``. The labels are ``kernels.json``'s ``kernels`` (one per
profiled kernel, where someone has matched them) or else its ``calls`` in launch order, which name the
kernels only where every call launched exactly one: a copy launches none that ncu profiles (a memcpy), and
cuBLAS may launch two (a split-K product and its reduction). Where the counts differ the rows are labelled
``?``; the bracketed name always says which kernel a row is.

    python3 benchmarks/ncu_summary.py benchmarks/data/attention-fastexp-2026-11-29-h200/ncu-before
"""

from __future__ import annotations

import argparse
import collections
import csv
import gzip
import io
import json
from pathlib import Path
from typing import Any

METRICS = {
    "time us": ("gpu__time_duration.sum", 1),  # scaled by its unit below
    "SM GHz": ("sm__cycles_elapsed.avg.per_second", 1),
    "tensor active %": ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active", 1),
    "issue active %": ("smsp__issue_active.avg.pct_of_peak_sustained_active", 1),
    "warp instr (M)": ("smsp__inst_executed.sum", 1e-6),
}
STALLS = ("barrier", "long_scoreboard", "wait", "short_scoreboard", "dispatch_stall", "mio_throttle", "gmma")


def _read(path: Path) -> str:
    for p in (path, path.with_name(path.name + ".gz")):
        if p.exists():
            return gzip.open(p, "rt").read() if p.suffix == ".gz" else p.read_text()
    raise FileNotFoundError(path)


#: Each metric in the unit the table prints (us, GHz), whatever unit ncu chose for it.
_UNITS = {"gpu__time_duration.sum": {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                                     "msecond": 1e3, "s": 1e6, "second": 1e6},
          "sm__cycles_elapsed.avg.per_second": {"hz": 1e-9, "khz": 1e-6, "mhz": 1e-3, "ghz": 1.0, "cycle/second": 1e-9,
                                                "cycle/usecond": 1e-3, "cycle/nsecond": 1.0}}


def raw_rows(folder: Path) -> list[dict[str, str]]:
    """One dict per kernel; times in microseconds and clocks in GHz whatever units ncu chose for them."""
    rows = list(csv.reader(io.StringIO(_read(folder / "raw.csv"))))
    units = dict(zip(rows[0], rows[1]))
    out = []
    for r in rows[2:]:
        d = dict(zip(rows[0], r))
        for metric, scale in _UNITS.items():
            unit = units.get(metric, "").strip().lower()
            if metric in d and d[metric]:
                if unit not in scale:
                    raise ValueError(f"{metric} is in {unit!r}, which this script cannot convert; add it to _UNITS")
                d[metric] = str(_num(d[metric]) * scale[unit])
        out.append(d)
    return out


def labels(folder: Path, n_kernels: int) -> list[str]:
    """A label per profiled kernel (module docstring): ``kernels`` if given, ``calls`` if they are as many as
    the kernels, else ``?``."""
    listed = json.loads((folder / "kernels.json").read_text())
    names = listed.get("kernels") or listed["calls"]
    return names if len(names) == n_kernels else ["?"] * n_kernels


def _short(name: str) -> str:
    return name.removeprefix("void ").split("<")[0].split("(")[0][:48]


def source_kernels(folder: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    hdr: list[str] | None = None
    for row in csv.reader(io.StringIO(_read(folder / "source.csv"))):
        if row and row[0] == "Kernel Name":
            out.append({"name": row[1], "rows": []})
            hdr = None
        elif row and row[0] == "Address":
            hdr = row
        elif hdr and row:
            out[-1]["rows"].append(dict(zip(hdr, row)))
    return out


def _num(v: str) -> float:
    return float(v.replace(",", "")) if v not in ("", "-", "n/a") else 0.0


def _opcode(sass: str) -> str:
    words = [w for w in sass.split() if not w.startswith("@")]
    return words[0].split(".")[0] if words else ""


def summarize(folder: Path, groups: int = 3, top: int = 12) -> str:
    lines = []
    raw = raw_rows(folder)
    names = [f"{label} [{_short(r.get('Kernel Name', ''))}]" for label, r in zip(labels(folder, len(raw)), raw)]
    lines.append("| kernel | " + " | ".join(METRICS) + " | cycles (k) | "
                 + " | ".join(f"stall {s}" for s in STALLS) + " |")
    lines.append("|---" * (len(METRICS) + len(STALLS) + 2) + "|")
    for name, r in zip(names, raw):
        vals = {k: _num(r.get(m, "")) * f for k, (m, f) in METRICS.items()}
        cycles = vals["time us"] * vals["SM GHz"]  # thousands
        stalls = [_num(r.get(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio", "")) for s in STALLS]
        lines.append(f"| {name} | " + " | ".join(f"{v:.3g}" for v in vals.values()) + f" | {cycles:.0f} | "
                     + " | ".join(f"{s:.2f}" for s in stalls) + " |")
    for name, k in zip(names, source_kernels(folder)):
        rows = k["rows"]
        total = sum(_num(r["Instructions Executed"]) for r in rows)
        by_count: dict[float, list[dict[str, str]]] = collections.defaultdict(list)
        for r in rows:
            by_count[_num(r["Instructions Executed"])].append(r)
        lines.append(f"\n{name} ({k['name'][:80]}): {len(rows)} SASS instructions, {total / 1e6:.1f} M executed")
        for count, rs in sorted(by_count.items(), key=lambda kv: -kv[0] * len(kv[1]))[:groups]:
            ops = collections.Counter(_opcode(r["Source"]) for r in rs)
            share = count * len(rs) / total
            lines.append(f"  run {count:.0f} times each: {len(rs)} instructions ({share:.0%} of all): "
                         + ", ".join(f"{op} {n}" for op, n in ops.most_common(10)))
        samples = "Warp Stall Sampling (All Samples)"
        reasons = [h for h in rows[0] if h.startswith("stall_") and "Not Issued" not in h] if rows else []
        for i, r in sorted(enumerate(rows), key=lambda ir: -_num(ir[1][samples]))[:top]:
            why = sorted(((_num(r[s]), s[6:]) for s in reasons if _num(r[s])), reverse=True)[:2]
            lines.append(f"  #{i:<5d} {_num(r[samples]):6.0f} samples, run {_num(r['Instructions Executed']):8.0f}: "
                         f"{r['Source'].strip()[:60]:60s} {', '.join(f'{s} {n:.0f}' for n, s in why)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", type=Path, help="holds raw.csv, source.csv (or .gz) and kernels.json")
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args(argv)
    print(summarize(args.folder, args.groups, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
