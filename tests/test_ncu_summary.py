"""benchmarks/ncu_summary.py on the committed Nsight Compute profiles: it must read both time units, find the
loop bodies the attention note quotes (718 SASS instructions per warp per key step before the fast
exponential, 520 after, cuDNN's 576), and never put a call's name on another call's kernel."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import ncu_summary  # noqa: E402

DATA = REPO / "benchmarks" / "data" / "attention-fastexp-2026-11-29-h200"


def _loop(summary: str, kernel: str) -> str:
    section = summary.split(f"\n{kernel} [")[1]
    return next(line for line in section.splitlines() if "run 114688 times each" in line)


def test_summary_reads_times_in_either_unit_and_the_loop_bodies():
    before, after = (ncu_summary.summarize(DATA / d) for d in ("ncu-before", "ncu-after"))
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in after.splitlines() if line.startswith("| attn")}
    assert float(rows["attn_ws_persistent [main_kernel]"][1]) == 244  # us, where ncu wrote us
    assert "| attn_ws_persistent [main_kernel] | 284 |" in before  # us, where ncu wrote ms
    assert "| gemm_cublas [nvjet_sm90_hsh_320x128_64x3_1x2_h_bz_coopB_TNT] | 1.48e+03 |" in before
    old, new = _loop(before, "attn_ws_persistent"), _loop(after, "attn_ws_persistent")
    assert "718 instructions" in old and "FSETP 66" in old  # exp2f's denormal fix-up
    assert "520 instructions" in new and "FSETP" not in new
    assert "run 131072 times each: 576 instructions" in after  # cuDNN: 8 key steps in its loop


def test_a_call_that_launched_two_kernels_or_none_does_not_shift_the_names(tmp_path):
    """The GEMV profile's calls were nine names for nine kernels, but cuBLAS launched two and the copy none:
    the matched ``kernels`` list names them; without it, a mismatch in count labels every row ``?``, and ncu's
    own kernel name is on every row."""
    qbuf = ncu_summary.summarize(DATA / "ncu-qbuf")
    assert "| gemv_cublas (split-K reduction) [cublasLt::splitKreduce_kernel] | 3.68 |" in qbuf
    assert "copy_32mb" not in qbuf
    for f in ("raw.csv.gz", "source.csv.gz"):
        shutil.copy(DATA / "ncu-qbuf" / f, tmp_path / f)
    calls = json.loads((DATA / "ncu-qbuf" / "kernels.json").read_text())["calls"]
    (tmp_path / "kernels.json").write_text(json.dumps({"calls": calls[:-1]}))  # one name short of the kernels
    unmatched = ncu_summary.summarize(tmp_path)
    assert "| ? [cublasLt::splitKreduce_kernel] |" in unmatched and "| ? [main_kernel] |" in unmatched
    assert "gemv_cublas" not in unmatched
