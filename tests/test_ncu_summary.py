"""benchmarks/ncu_summary.py on the committed Nsight Compute profiles: it must read both time units and find
the loop bodies the attention note quotes (718 SASS instructions per warp per key step before the fast
exponential, 520 after, cuDNN's 576)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import ncu_summary  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "attention-fastexp-2026-11-29-h200"


def test_summary_reads_times_in_either_unit_and_the_loop_bodies():
    before, after = (ncu_summary.summarize(DATA / d) for d in ("ncu-before", "ncu-after"))
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in after.splitlines() if line.startswith("| attn")}
    assert float(rows["attn_ws_persistent"][1]) == 244 and float(rows["attn_cudnn"][1]) == 231  # us, not ms
    assert "| attn_ws_persistent | 284 |" in before and "| gemm_cublas | 1.48e+03 |" in before
    def loop(summary: str, kernel: str) -> str:
        section = summary.split(f"\n{kernel} (")[1]
        return next(line for line in section.splitlines() if "run 114688 times each" in line)

    assert "718 instructions" in loop(before, "attn_ws_persistent") and "FSETP 66" in loop(before, "attn_ws_persistent")
    assert "520 instructions" in loop(after, "attn_ws_persistent") and "FSETP" not in loop(after, "attn_ws_persistent")
    assert "run 131072 times each: 576 instructions" in after  # cuDNN: 8 key steps in its loop
