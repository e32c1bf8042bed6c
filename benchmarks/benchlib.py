"""What the family benchmarks share (``attention.py``, ``gemv.py``, ``multi_gpu.py``): a log
with elapsed time, JSON written atomically after every step, a time limit, compiling a family's configs
in threads, and measuring one problem's configs: checked against the family's reference, then timed.

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


def geomean(xs: Sequence[float]) -> float | None:
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[-400:]}"


def compile_all(family: Any, problem: Any, configs: Sequence[Any], jobs: int,
                out_idx: Sequence[int] = (-1,)) -> list[tuple[Any, Any, float, str | None]]:
    """``(config, kernel or None, compile seconds, error or None)`` for each config, compiled for the
    local GPU in ``jobs`` threads (nvcc runs in subprocesses, so threads overlap)."""
    import tilelang

    def one(cfg: Any) -> tuple[Any, Any, float, str | None]:
        t = time.time()
        try:
            k = tilelang.compile(family.program(problem, cfg), out_idx=list(out_idx), target="cuda")
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
                out = k(*inputs)
                bad = int((~torch.isclose(out.float(), ref.float(), atol=atol, rtol=rtol)).sum())
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
