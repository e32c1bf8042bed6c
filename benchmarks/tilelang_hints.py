"""TileLang 0.1.15's own carver hints for a GEMM, computed offline (no GPU), for hint-quality comparisons.

    python benchmarks/tilelang_hints.py benchmarks/data/h200-hints-2026-11-21 [--topk 20] [--check DIR]

TileLang's ``carver.arch.CUDA`` reads the device through the CUDA runtime, so on a machine without a GPU
it cannot be built. :class:`OfflineCUDA` sets the same fields from a data sheet (an H100/H200: sm_90,
132 SMs, TileLang's 48 KB per-block shared-memory figure) and TileLang's matmul analysis is pointed at
it while the hints are computed. For every ``MxNxK.json`` grid in the directory (matmul files whose
summary does not record TileLang's hints) it writes ``tilelang_hints.json`` there, which
``tilecarve.quality`` reads; hints outside the measured grid stay unmeasured and are counted so.
``--check DIR`` recomputes the hints that measure_gemm_grid.py recorded on the GPU machine in DIR's files
and fails unless they are identical (they are, for the four shipped H200 grids).
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def offline_cuda(sm: int = 90, sms: int = 132, smem_per_block: int = 48 * 1024) -> Any:
    """A ``tilelang.carver.arch.CUDA`` built without a device (the fields its __init__ reads from it)."""
    import tilelang  # noqa: F401  (tvm is importable only after tilelang)
    import tvm
    from tilelang.carver.arch import CUDA

    arch = CUDA.__new__(CUDA)
    arch.__dict__.update(
        target=tvm.target.Target({"kind": "cuda", "arch": f"sm_{sm}"}), sm_version=sm, device=None,
        name=f"offline sm_{sm}", platform="CUDA", smem_cap=smem_per_block, compute_max_core=sms,
        warp_size=32, compute_capability=str(sm), reg_cap=65536, max_smem_usage=2 * smem_per_block,
        sm_partition=4, l2_cache_size_bytes=50 * 2**20, transaction_size=[32, 128], bandwidth=[750, 12080],
        available_tensor_instructions=None)
    return arch


@contextmanager
def _offline(arch: Any):
    """TileLang's matmul analysis builds its own ``CUDA(target)``; give it ``arch`` instead."""
    import tilelang.carver.matmul_analysis as ma

    saved = ma.get_arch
    ma.get_arch = lambda target: arch
    try:
        yield
    finally:
        ma.get_arch = saved


def tilelang_hints(M: int, N: int, K: int, topk: int = 20, arch: Any = None) -> list[dict[str, Any]]:
    """TileLang's ``MatmulTemplate(...).recommend_hints(topk)`` as kernel configs, mapped exactly as
    measure_gemm_grid.py maps them (fp16 in and out, fp32 accumulate, C = A @ B.T)."""
    from tilelang.carver.roller.rasterization import NoRasterization
    from tilelang.carver.template import MatmulTemplate

    arch = arch or offline_cuda()
    with _offline(arch):
        hints = MatmulTemplate(M=M, N=N, K=K, in_dtype="float16", out_dtype="float16",
                               accum_dtype="float").with_arch(arch).recommend_hints(topk=topk)
    out = []
    for h in hints:
        (bm, bn), (wm, wn) = h.block, h.warp
        out.append(dict(block_M=bm, block_N=bn, block_K=h.rstep[0],
                        num_stages=h.pipeline_stage if h.pipeline_stage > 1 else 0,
                        thread_num=(bm // wm) * (bn // wn) * 32,
                        enable_rasterization=h.rasterization_plan is not NoRasterization))
    return out


def _grids(d: Path) -> list[tuple[Path, dict[str, Any]]]:
    out = []
    for f in sorted(d.glob("*.json")):
        data = json.loads(f.read_text())
        if isinstance(data, dict) and "summary" in data and data["summary"].get("family", "matmul") == "matmul":
            out.append((f, data["summary"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("data", nargs="?", help="a directory of matmul grids to write tilelang_hints.json into")
    ap.add_argument("--topk", type=int, default=20)
    ap.add_argument("--check", help="a directory whose files record TileLang's hints: recompute and compare")
    a = ap.parse_args(argv)
    bad = 0
    for f, s in _grids(Path(a.check)) if a.check else []:
        want = [h["config"] for h in s["hints"]]
        got = tilelang_hints(s["M"], s["N"], s["K"], len(want))
        print(f"{f.name}: {'identical' if got == want else 'DIFFERENT'} ({len(want)} hints)")
        bad += got != want
    if a.data:
        d = Path(a.data)
        todo = {f.stem: s for f, s in _grids(d) if s.get("carver") == "tilecarve" or not s.get("hints")}
        if not todo:
            print(f"no matmul grid without TileLang's hints under {d}", file=sys.stderr)
            return 2
        import tilelang

        hints = {k: tilelang_hints(s["M"], s["N"], s["K"], a.topk) for k, s in todo.items()}
        out = d / "tilelang_hints.json"
        out.write_text(json.dumps(dict(
            generator="benchmarks/tilelang_hints.py (offline, sm_90, 132 SMs, 48 KB shared memory per block)",
            tilelang=tilelang.__version__, topk=a.topk, hints=hints), indent=1))
        print(f"wrote {out} ({', '.join(hints)})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
