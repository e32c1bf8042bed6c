"""Keyed tuning on a CUDA GPU: record -> tune -> table -> a fresh process serves it with no timing.
The C-target tests (tests/test_keyed.py) cover the logic; this checks the same flow, with a symbolic
M (T.dynamic), on the GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from kernels.keyed_kernels import make_keyed

from autotuner import load_table, record

pytestmark = pytest.mark.gpu
TESTS = Path(__file__).parent


def test_record_tune_and_serve_a_table_on_the_gpu(tmp_path):
    out = Path(os.environ.get("OUT", tmp_path))
    kk = make_keyed(tmp_path / "db.sqlite", target="cuda")
    with record() as rec:
        for m in (3, 40):
            a, b = torch.randn(m, 64, device="cuda"), torch.randn(m, 64, device="cuda")
            torch.testing.assert_close(kk(a, b), a * 2 + b)
    path = rec.tune(out / "keyed_table_gpu.json")
    table = load_table(path, target="cuda")
    assert table.gpu == torch.cuda.get_device_name(0) and len(table.kernels["kernels.keyed_kernels.scale_add"]
                                                               .entries) == 2
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(TESTS)!r})
        import torch, autotuner
        autotuner.AutoTuner.plan = lambda *a, **k: sys.exit("tuned in a fresh process")
        from kernels.keyed_kernels import make_keyed
        kk = make_keyed(target="cuda")
        autotuner.use_table({str(path)!r})
        for m in (1, 5, 8, 9, 63, 64, 1000):
            a, b = torch.randn(m, 64, device="cuda"), torch.randn(m, 64, device="cuda")
            torch.testing.assert_close(kk(a, b), a * 2 + b)
        print(json.dumps(dict(kk.stats)))
    """)
    env = {**os.environ, "TILECARVE_CACHE_DIR": str(tmp_path / "fresh")}
    p = subprocess.run([sys.executable, "-c", script], cwd=TESTS.parent, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    # one kernel per bucket, each checked once against the reference before it is served
    assert json.loads(p.stdout.strip().splitlines()[-1]) == {"table": 2, "compiles": 2, "served checks": 2}
    assert not (tmp_path / "fresh" / "tuning.sqlite").exists()


def test_the_outputs_tilelang_allocates_for_a_served_check_start_as_poison_on_the_gpu():
    """TileLang's launcher for a kernel with ``out_idx`` allocates the outputs itself, in C++ through TVM-FFI
    or with ``torch.empty``; either way the check's outputs must start as poison (autotuner/check.py)."""
    import tilelang
    from kernels.keyed_kernels import scale_add

    from autotuner.check import poisoned_allocations

    jit = tilelang.compile(scale_add(100, 64), out_idx=[-1], target="cuda")
    a, b = torch.randn(100, 64, device="cuda"), torch.randn(100, 64, device="cuda")
    for second in (False, True):
        with poisoned_allocations([((100, 64), torch.float32)], "cuda", second) as verified:
            got = jit(a, b)
        assert verified([got]), (type(jit.adapter).__name__, second)
        torch.testing.assert_close(got, a * 2 + b)


def test_a_served_kernel_leaving_its_last_row_unwritten_is_refused_on_the_gpu(tmp_path):
    """The reference returns a copy, so the block it frees holds the right answer, which the caching allocator
    may hand to the kernel's output next; the check's outputs start as poison instead."""
    from kernels.keyed_kernels import scale_add_skipping_last_row

    from autotuner.errors import KeyRefused

    kk = make_keyed(tmp_path / "db.sqlite", target="cuda", fn=scale_add_skipping_last_row)
    kk.compile_args["ref_prog"] = lambda A, B: (A * 2 + B).clone()
    a = torch.randn(40, 64, device="cuda")
    with pytest.raises(KeyRefused, match="does not match the reference"):
        kk(a, a)
