"""A user's kernel with reserved parameters, tuned on TileLang's C target (runs on any CPU).

    python3 examples/cpu/axpby.py            # tune, then tune again (served from the cache)

Each trial is stored in the tuning cache: ``tilecarve cache list`` shows the run afterwards.
"""

from __future__ import annotations

import argparse
import itertools
import time

import tilelang.language as T
import torch

from autotuner import AutoTuner

M, N = 1024, 1024
ALPHA, BETA = 2.0, -0.5


def axpby(block_M: int = 32, block_N: int = 32, thread_num: int = 1):
    """Y = ALPHA * X + BETA * Y0, tiled block_M x block_N."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y0: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            for i, j in T.Parallel(block_M, block_N):
                Y[by * block_M + i, bx * block_N + j] = (ALPHA * X[by * block_M + i, bx * block_N + j]
                                                         + BETA * Y0[by * block_M + i, bx * block_N + j])

    return main


def ref_program(X: torch.Tensor, Y0: torch.Tensor) -> torch.Tensor:
    return ALPHA * X + BETA * Y0


def configs() -> list[dict[str, int]]:
    return [dict(block_M=bm, block_N=bn) for bm, bn in itertools.product((16, 64, 256), (16, 64, 256))]


def tune():
    return (AutoTuner.from_kernel(kernel=axpby, configs=configs())
            .set_compile_args(out_idx=[-1], target="c", ref_prog=ref_program, supply_type="normal")
            .run(warmup=3, rep=20))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    t0 = time.perf_counter()
    result = tune()
    cold = time.perf_counter() - t0
    result.summary()
    t0 = time.perf_counter()
    again = tune()
    warm = time.perf_counter() - t0
    x, y0 = torch.randn(M, N), torch.randn(M, N)
    torch.testing.assert_close(again.kernel(x, y0), ref_program(x, y0))
    print(f"CPU tuning: cold {cold:.1f} s, warm {warm:.2f} s (from cache: {again.from_cache}); "
          f"best {result.config} at {result.latency:.3f} ms vs torch {result.ref_latency:.3f} ms")


if __name__ == "__main__":
    main()
