"""Time one call of a kernel: CUDA events with an L2 flush on the GPU, ``perf_counter`` on the CPU.

``warmup`` and ``rep`` are *counts of calls*, not milliseconds (TileLang's and Triton's
``do_bench`` take milliseconds; ours does not, so a config's budget does not depend on its speed).
Each timed repetition on the GPU is preceded by a write of a buffer larger than L2, so a kernel
cannot look fast by finding its inputs already cached. We report the median, the minimum and the
inter-quartile range: the median is what a user gets, the IQR says whether to trust it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["METHOD", "Timing", "time_callable"]

#: Part of the cache key: a change of timing method must not reuse old latencies.
METHOD = "v1:cuda-events+l2-flush+median|cpu-perf_counter+median"

_L2_FLUSH_BYTES = 256 * 1024 * 1024  # larger than any current L2 (H100 50 MB, H200 60 MB, B200 126 MB)
_flush_buf: Any = None


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    iqr_ms: float
    reps: int


def _summary(samples: list[float]) -> Timing:
    samples = sorted(samples)
    if len(samples) >= 4:
        q = statistics.quantiles(samples, n=4)
        iqr = q[2] - q[0]
    else:
        iqr = samples[-1] - samples[0]
    return Timing(statistics.median(samples), samples[0], iqr, len(samples))


def time_callable(fn: Callable[[], Any], warmup: int, rep: int, device: str) -> Timing:
    """Median latency of ``fn()`` in milliseconds over ``rep`` calls after ``warmup`` calls."""
    if rep < 1:
        raise ValueError(f"rep must be >= 1 timed call, got {rep!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 calls, got {warmup!r}")
    if device == "cpu":
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(rep):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return _summary(samples)

    import torch

    global _flush_buf
    if _flush_buf is None or _flush_buf.device != torch.device(device):
        _flush_buf = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        _flush_buf.zero_()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) for s, e in zip(starts, ends)])
