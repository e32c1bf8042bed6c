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

__all__ = ["BATCHED_METHOD", "BATCH_CALLS", "METHOD", "MIN_GROUPS", "MODES", "Timing", "batch_groups",
           "l2_flush_buffer", "time_callable"]

#: Part of the cache key: a change of timing method must not reuse old latencies.
METHOD = "v2:cuda-events+l2-flush+median|cpu-perf_counter+median|finalists-interleaved-rounds"

#: ``time_callable``'s modes (its docstring says what each does).
MODES = ("burst", "sustained", "batched")
#: Calls between two events under ``mode="batched"``, at most: each sample is a group of calls back to back, per
#: call, and ``rep`` calls make at least :data:`MIN_GROUPS` groups (20 calls: 4 groups of 5).
BATCH_CALLS, MIN_GROUPS = 10, 4
#: The cache key's part for ``mode="batched"`` alone (how its calls are grouped): a change of the grouping must not
#: reuse latencies timed with the old one, and need not drop the other modes' entries.
BATCHED_METHOD = f"groups-of-at-most-{BATCH_CALLS}-at-least-{MIN_GROUPS}+lead-call"

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


def time_callable(fn: Callable[[], Any], warmup: int, rep: int, device: str, *, mode: str = "burst",
                  backend: str = "event", sustain_s: float = 2.0,
                  prepare: Callable[[], Any] | None = None, flush: str = "write") -> Timing:
    """Median latency of ``fn()`` in milliseconds over ``rep`` calls after ``warmup`` calls.

    ``prepare()``, when given, runs before every call (warm-up calls too) outside the timed region:
    it resets or restores the buffers of a kernel that accumulates into or updates its arguments.

    ``mode="burst"`` (default): every call is timed on its own after an L2 flush, the way a kernel
    runs after unrelated work, at whatever clock the GPU holds after a short rest. ``"sustained"``:
    ``sustain_s`` seconds of back-to-back calls first, until the GPU sits at its power-capped steady
    clock, then ``rep`` back-to-back calls, each timed, with no pause between them: the way a kernel
    runs inside a busy model. ``backend="cudagraph"`` (CUDA only; TileLang's profiler, after
    Triton's ``do_bench_cudagraph``): the calls are captured into a CUDA graph and replayed, so
    launch overhead does not count; it suits compute-bound kernels of a few microseconds. L2 is
    flushed only before each replay, so inputs that fit in L2 stay resident after the graph's
    first call: for a memory-bound kernel on small data it measures L2, not HBM.

    ``mode="batched"``: ``sustain_s`` of heat as under ``"sustained"``, then the ``rep`` calls back to back
    with an event only every few calls (:func:`batch_groups`), each sample a group's time per call, as a model's
    forward issues its kernels (a host slower than the kernel shows, as it does there). An event between
    every two calls (``"sustained"``) ranks some kernels otherwise: on an H100, at 128 rows of the MLP's gate
    projection it put a 2-CTA cluster kernel 2% behind a plain one that ran 4% slower in a stream behind the
    MLP's gated product, where the picks of groups of 50 calls ran within 0.2% of the stream's best on three keys
    (``benchmarks/timing_methods.py``, ``benchmarks/data/timing-methods-2026-12-07-h100``; TileLang launches
    cluster kernels with programmatic stream serialization, whose overlap with the kernel before an event
    stops: a likely cause, not isolated). Nothing runs between a group's calls, so ``prepare`` is refused; and
    the CUDA-graph backend, which replays its calls with nothing between them anyway, takes ``"sustained"``.

    ``flush="write"`` (default) flushes L2 by zeroing a buffer larger than it, which leaves L2 full of
    dirty lines that the timed call writes back as it evicts them; ``"read"`` flushes by reading that
    buffer, which leaves clean lines, so the call pays only for its own traffic.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    if mode == "batched" and prepare is not None:
        raise ValueError("mode='batched' times calls back to back with nothing between them, so it cannot reset "
                         "or restore arguments between calls; use mode='sustained' with reset_to_zero/restore_value")
    if mode == "batched" and backend == "cudagraph":
        raise ValueError("mode='batched' groups calls between events; backend='cudagraph' replays captured calls "
                         "with nothing between them already: use mode='sustained' with it")
    if flush not in ("write", "read"):
        raise ValueError(f"flush must be 'write' or 'read', got {flush!r}")
    if rep < 1:
        raise ValueError(f"rep must be >= 1 timed call, got {rep!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0 calls, got {warmup!r}")
    call = fn if prepare is None else lambda: (prepare(), fn())
    if device == "cpu":
        for _ in range(warmup):
            call()
        if mode == "batched":
            samples = []
            for n in batch_groups(rep):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                samples.append((time.perf_counter() - t0) * 1e3 / n)
            return _summary(samples)
        samples = []
        for _ in range(rep):
            if prepare is not None:
                prepare()
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e3)
        return _summary(samples)

    import torch

    if backend == "cudagraph":
        if prepare is not None:
            raise ValueError("backend='cudagraph' cannot reset or restore arguments between the calls of a "
                             "graph; use backend='event' with reset_to_zero/restore_value")
        from tilelang.profiler.bench import do_bench

        for _ in range(warmup):
            fn()
        if mode == "sustained":
            _heat(fn, sustain_s)
        q = do_bench(fn, _n_warmup=1, _n_repeat=rep, backend="cudagraph", quantiles=[0.0, 0.25, 0.5, 0.75])
        return Timing(q[2], q[0], q[3] - q[1], rep)

    flush_buf = l2_flush_buffer(device)
    for _ in range(warmup):
        call()
    if mode != "burst":
        _heat(call, sustain_s)
    torch.cuda.synchronize()
    if mode == "batched":
        groups = batch_groups(rep)
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(len(groups) + 1)]
        fn()  # untimed: the first group's first call then waits behind a call, not for the host
        marks[0].record()
        for mark, n in zip(marks[1:], groups):
            for _ in range(n):
                fn()
            mark.record()
        torch.cuda.synchronize()
        return _summary([a.elapsed_time(b) / n for a, b, n in zip(marks, marks[1:], groups)])
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for i in range(rep):
        if prepare is not None:
            prepare()
        if mode == "burst":
            if flush == "write":
                flush_buf.zero_()
            else:
                flush_buf.max()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) for s, e in zip(starts, ends)])


def batch_groups(rep: int) -> list[int]:
    """``rep`` calls as the groups ``mode="batched"`` times: of ``min(BATCH_CALLS, rep // MIN_GROUPS)`` calls (at
    least one), the last one smaller where they do not divide."""
    size = max(1, min(BATCH_CALLS, rep // MIN_GROUPS))
    return [size] * (rep // size) + ([rep % size] if rep % size else [])


def l2_flush_buffer(device: str) -> Any:
    """The buffer larger than L2 that burst timing writes (or reads) before each call on ``device``,
    allocated at its first use in this process and kept: a measuring process makes it while it waits
    for its first candidate (:func:`.bench.start_device`)."""
    import torch

    global _flush_buf
    want = torch.device(device)
    if want.type == "cuda" and want.index is None:  # "cuda" is the current GPU; the buffer's device names it
        want = torch.device("cuda", torch.cuda.current_device())
    if _flush_buf is None or _flush_buf.device != want:
        _flush_buf = torch.empty(_L2_FLUSH_BYTES // 4, dtype=torch.int32, device=device)
    return _flush_buf


def _heat(call: Callable[[], Any], seconds: float) -> None:
    """Call back to back for ``seconds`` of wall time (the queue kept short), so the GPU reaches the
    clock it holds under sustained load (on an H200 it falls from 1980 to 1500-1650 MHz at its
    700 W cap within a few seconds of GEMMs: docs/benchmarks.md, burst against sustained)."""
    import torch

    end = time.perf_counter() + seconds
    queued = None
    while time.perf_counter() < end:
        for _ in range(8):
            call()
        done = torch.cuda.Event()
        done.record()
        if queued is not None:
            queued.synchronize()  # one batch stays queued, so the GPU never waits for the host
        queued = done
    torch.cuda.synchronize()
