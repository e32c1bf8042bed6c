"""What the family benchmarks share (``attention.py``, ``gemv.py``, ``multi_gpu.py``): a log
with elapsed time, JSON written atomically after every step, a time limit, compiling a family's configs
in threads, measuring one problem's configs (checked against the family's reference, then timed), and the
rotated order of interleaved rounds.

A benchmark is not a test: nothing here asserts; a failing config is a row with its error.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def dump(path: Path, data: Any) -> None:
    """Write JSON atomically, so a run cut short leaves the last complete file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def median(xs: Sequence[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The order of round ``r`` of interleaved timing, rotated every round (as the autotuner's finalist rounds
    are): a kernel timed right after another meets a GPU the other has just heated, so none may always come
    second (until 2026-12-07 every benchmark timed its arms in one fixed order)."""
    names = list(names)
    k = r % len(names) if names else 0
    return names[k:] + names[:k]


def whole_rotations(rounds: int, arms: int) -> int:
    """``rounds`` raised to a multiple of ``arms``, so that under :func:`round_order` each arm leads as many rounds
    as every other."""
    return -(-rounds // arms) * arms


def geomean(xs: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[-400:]}"


def mismatches(out: Any, ref: Any, atol: float = 1e-2, rtol: float = 1e-2) -> int:
    """Elements of ``out`` not close to ``ref`` (both compared in fp32); a correct kernel has none."""
    import torch

    return int((~torch.isclose(out.float(), ref.float(), atol=atol, rtol=rtol)).sum())


def poisoned_call(kernel: Any, inputs: Sequence[Any]) -> Any:
    """``kernel(*inputs)`` for a check, its output starting as poison (:func:`autotuner.check.poisoned_allocations`):
    ``torch.empty`` hands back memory as it was freed, and memory that held a previous kernel's right answer would
    let a kernel that leaves elements unwritten pass. A first call finds the outputs' shapes and dtypes (one tensor,
    or a tuple of them); the second, whose outputs are returned, allocates them from the poisoned pool (a
    RuntimeError if it did not: on a GPU every allocation inside comes from it, on the CPU only ``torch.empty``'s)."""
    from autotuner.check import poisoned_allocations

    first = kernel(*inputs)
    many = isinstance(first, (tuple, list))
    firsts = list(first) if many else [first]
    with poisoned_allocations([(tuple(o.shape), o.dtype) for o in firsts], firsts[0].device.type) as verified:
        out = kernel(*inputs)
    if not verified(list(out) if many else [out]):
        raise RuntimeError("the check's output was not allocated from the poisoned pool, so it proves nothing")
    return out


def compile_all(family: Any, problem: Any, configs: Sequence[Any], jobs: int, out_idx: Sequence[int] = (-1,),
                build: Callable[[Any], Any] | None = None) -> list[tuple[Any, Any, float, str | None]]:
    """``(config, kernel or None, compile seconds, error or None)`` for each config (with its own pass
    configs), compiled for the local GPU in ``jobs`` threads (nvcc runs in subprocesses, so threads
    overlap). ``build(config)`` makes a config's program: ``family.program(problem, config)`` unless given
    (``attention_ab.py`` hands over programs it built beforehand)."""
    from autotuner.compile import tl_compile

    build = build or (lambda cfg: family.program(problem, cfg))

    def one(cfg: Any) -> tuple[Any, Any, float, str | None]:
        t = time.time()
        try:  # tl_compile: a split-K program's workspace is a scratch parameter, allocated per call
            k = tl_compile(build(cfg), "cuda", dict(cfg.pass_configs) or None, out_idx=list(out_idx))
            return cfg, k, time.time() - t, None
        except Exception as e:  # a failing config is a result, recorded with its message
            return cfg, None, time.time() - t, error_text(e)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(one, configs))


class Clock:
    """A benchmark's time limit and its timer (CUDA events after an L2 flush, the autotuner's)."""

    def __init__(self, limit_s: float, rep: int, backend: str = "event") -> None:
        self.deadline, self.rep, self.backend = T0 + limit_s, rep, backend

    def left(self) -> float:
        return self.deadline - time.time()

    def time(self, fn: Callable[[], Any], rep: int | None = None) -> float:
        from autotuner.timing import time_callable

        return time_callable(fn, 3, rep or self.rep, "cuda", backend=self.backend).median_ms


def measure_configs(family: Any, problem: Any, configs: Sequence[Any], inputs: Sequence[Any], ref: Any,
                    clock: Clock, jobs: int, atol: float = 1e-2, rtol: float = 1e-2,
                    extra: Callable[[float], dict[str, Any]] | None = None,
                    kernels: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Compile ``configs``, check each output against ``ref`` (zero mismatches allowed) and time the ones
    that pass. One row per config: ``config``, ``compile_s``, ``error``, ``mismatches``, ``correct``,
    ``ms`` and what ``extra(ms)`` adds (e.g. TFLOP/s). ``kernels``, when given, receives each checked
    kernel under :func:`config_id` of its config, for a caller that runs the winner again."""
    import torch

    rows = []
    for cfg, k, cs, err in compile_all(family, problem, configs, jobs):
        row: dict[str, Any] = {"config": cfg.to_dict(), "compile_s": round(cs, 2), "error": err, "ms": None,
                               "correct": None}
        if k is not None and clock.left() > 5:
            try:
                out = poisoned_call(k, inputs)
                bad = mismatches(out, ref, atol, rtol)
                row.update(correct=bad == 0, mismatches=bad)
                if bad == 0:
                    row["ms"] = clock.time(lambda k=k: k(*inputs))
                    if kernels is not None:
                        kernels[config_id(row["config"])] = k
                    row.update(extra(row["ms"]) if extra else {})
            except Exception as e:  # a kernel that fails at run time is recorded too
                row["error"] = error_text(e)
                torch.cuda.synchronize()
        elif k is not None:
            row["error"] = "skipped: time limit"
        rows.append(row)
    return rows


def per_call_us(fn: Callable[[], Any], calls: int, rounds: int = 5) -> float:
    """Median over rounds of the host's microseconds per call of ``fn``: ``calls`` calls issued back to back
    after a sync, timed before the GPU is waited for (the host's own cost, however long the kernels run)."""
    import torch

    out = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        out.append((t1 - t0) / calls * 1e6)
    return median(out)


def config_id(config: dict[str, Any]) -> str:
    """A config dict as a key: its JSON with sorted keys."""
    return json.dumps(config, sort_keys=True)


def score_hints(rows: list[dict[str, Any]], hints: Sequence[Any]) -> dict[str, Any]:
    """The exhaustive best among ``rows`` and the carver's hints scored against it: top-1 and best of
    the hints as fractions of the best (1.0 = the hints found it); ``None`` where nothing was measured."""
    ok = [r for r in rows if r["ms"] is not None]
    best = min(ok, key=lambda r: r["ms"]) if ok else None
    by_cfg = {config_id(r["config"]): r for r in rows}
    hint_ms = [by_cfg.get(config_id(h.to_dict()), {}).get("ms") for h in hints]
    measured = [m for m in hint_ms if m is not None]
    return {
        "best": best,
        "hints": [{"config": h.to_dict(), "ms": m} for h, m in zip(hints, hint_ms)],
        "carver_top1_vs_best": (best["ms"] / hint_ms[0]) if best and hint_ms and hint_ms[0] else None,
        f"carver_top{len(hints)}_vs_best": (best["ms"] / min(measured)) if best and measured else None,
        "mismatching_configs": sum(1 for r in rows if r["correct"] is False),
    }


class Streamed:
    """``fns[i % len(fns)]()`` called ``calls`` times back to back, captured once in a CUDA graph and
    replayed: milliseconds per call, as a model sees a kernel that runs layer after layer.

    Each of ``fns`` works on its own copy of the data, and together the copies are larger than L2 (see
    :func:`copies_past_l2`): every call streams its inputs from HBM, and the lines earlier calls wrote
    are written back while later ones run, so each call pays for all of its own traffic. A flush before
    every call cannot do both: a flush that writes L2 charges the next call for the flush's write-backs;
    one that reads L2 lets a copy's writes stay in L2, unpaid. The graph keeps the host's launch cost
    out, as CUDA graphs do in a decoding model."""

    def __init__(self, fns: Sequence[Callable[[], Any]], calls: int) -> None:
        import torch

        self.calls = calls - calls % len(fns) or len(fns)  # whole turns: a replay starts on a cold copy
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as torch's graph docs ask
            for f in fns:
                f()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for j in range(self.calls):
                fns[j % len(fns)]()
        self.graph.replay()
        torch.cuda.synchronize()

    def time(self, rep: int) -> float:
        """The median over ``rep`` replays of one replay's time divided by its calls, in milliseconds."""
        import torch

        samples = []
        for _ in range(rep):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self.graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / self.calls)
        return median(samples)


def copies_past_l2(nbytes: int, factor: int = 4) -> int:
    """How many copies of ``nbytes`` of data fill ``factor`` times the local GPU's L2 (two at least)."""
    import torch

    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(2, math.ceil(factor * l2 / nbytes))
