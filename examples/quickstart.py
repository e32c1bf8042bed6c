"""The main job, on whatever machine this is.

* With a CUDA GPU: tune a 4096^3 fp16 GEMM from the carver's top-8 hints and compare with cuBLAS
  (examples/gemm/example_gemm_autotune.py).
* Without one: tune a CPU-target kernel end to end (examples/cpu/axpby.py), then print the
  carver's offline hints for a named GPU (default H100) without touching any GPU.

    python3 examples/quickstart.py [--gpu H100] [--shape 4096 4096 4096]

The same from the command line: ``tilecarve hints --gpu H100 4096 4096 4096`` (offline) and
``tilecarve tune matmul 4096 4096 4096`` (on a GPU); docs/cli.md.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def offline_hints(gpu: str, m: int, n: int, k: int) -> None:
    from carver import MatmulTemplate
    from carver.arch import CUDA

    tmpl = MatmulTemplate(M=m, N=n, K=k, in_dtype="float16", out_dtype="float16", accum_dtype="float32",
                          trans_A=False, trans_B=True).with_arch(CUDA(gpu))
    print(f"\ncarver top-8 hints for a {m}x{n}x{k} fp16 GEMM on {gpu} (offline, no GPU used):")
    predicted = []
    for rank, hint in enumerate(tmpl.recommend_hints(topk=8), 1):
        predicted.append(tmpl.predict(hint.to_config()).latency_ms)
        print(f"  {rank}. {hint.to_config()}  predicted {predicted[-1]:.4f} ms")
    if predicted != sorted(predicted):
        from tilecarve.cli import OUT_OF_ORDER

        print(f"  {OUT_OF_ORDER['matmul']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", default="H100",
                    help="GPU to give offline hints for when none is present (H100, H200, A100-80GB, ...)")
    ap.add_argument("--shape", nargs=3, type=int, default=[4096, 4096, 4096], metavar=("M", "N", "K"))
    args = ap.parse_args()
    from carver.arch import ARCHS, CUDA

    try:  # before any work: a GPU name the carver does not know fails now, not after a CPU tune
        CUDA(args.gpu)
    except (ValueError, RuntimeError):  # a name not in the table; "cuda" with no GPU here
        ap.error(f"--gpu {args.gpu!r} is not a GPU the carver knows; known: {', '.join(ARCHS)} (and aliases such as "
                 f"sm90, hopper)")
    import torch

    if torch.cuda.is_available():
        sys.argv = [str(HERE / "gemm" / "example_gemm_autotune.py"), *map(str, args.shape), "--with_roller"]
        runpy.run_path(sys.argv[0], run_name="__main__")
        return
    print("no CUDA GPU here: tuning a CPU-target kernel end to end, then offline carver hints")
    sys.path.insert(0, str(HERE / "cpu"))
    runpy.run_path(str(HERE / "cpu" / "axpby.py"), run_name="__main__")
    offline_hints(args.gpu, *args.shape)


if __name__ == "__main__":
    main()
