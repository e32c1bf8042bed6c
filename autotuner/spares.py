"""Measuring sides started during the plan, before the job that uses them exists (issue 13).

A measuring process spends seconds before it can measure: importing torch and TileLang, creating its
CUDA context, allocating the L2 flush buffer. :meth:`.tuner.AutoTuner.plan` therefore starts the ones
its job will need at once (:func:`.bench.prestart`, :func:`.ray_cluster.prestart_actors`), so that
this overlaps the rest of the plan (the parent's own TileLang import, 1.9 s of a 2.6 s plan on an H200
host), and keeps them here, by kind: ``("process", env, device)`` or ``("ray", device)``. The job's
measuring side takes them (:func:`take`) where it would start its own; :func:`.job.tune_all` closes
the ones left over (plans served from the database need none). A spare not taken within
:data:`MAX_AGE_S` is not used, and a measuring process waiting that long for its job quits by itself,
so a plan that is never tuned costs a process for a few minutes at most.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

__all__ = ["MAX_AGE_S", "Spare", "close_all", "count", "keep", "kinds", "take"]

#: A spare older than this is closed rather than taken (a measuring process quits on its own 60 s later).
MAX_AGE_S = 240.0


class Spare(Protocol):
    """A measuring side started ahead: when (wall time), whether it still runs, and how to end it."""

    spawned: float

    def alive(self) -> bool: ...

    def close(self) -> None: ...


_LOCK = threading.Lock()
_SPARES: dict[tuple, list[Spare]] = {}


def _fresh(s: Spare) -> bool:
    return time.time() - s.spawned < MAX_AGE_S and s.alive()


def count(kind: tuple) -> int:
    """How many usable spares of ``kind`` are waiting (stale ones are closed)."""
    with _LOCK:
        spares = _SPARES.get(kind, [])
        stale = [s for s in spares if not _fresh(s)]
        _SPARES[kind] = [s for s in spares if s not in stale]
        n = len(_SPARES[kind])
    for s in stale:
        s.close()
    return n


def kinds() -> list[tuple]:
    """The kinds that have usable spares waiting (stale ones are closed)."""
    with _LOCK:
        waiting = list(_SPARES)
    return [k for k in waiting if count(k)]


def keep(kind: tuple, spare: Spare) -> None:
    with _LOCK:
        _SPARES.setdefault(kind, []).append(spare)


def take(kind: tuple) -> Any | None:
    """A usable spare of ``kind``, removed from the waiting ones; ``None`` if there is none."""
    count(kind)
    with _LOCK:
        spares = _SPARES.get(kind)
        return spares.pop(0) if spares else None


def close_all() -> None:
    """End every spare still waiting (a job's plans that were served from the database, or never tuned)."""
    with _LOCK:
        spares = [s for ss in _SPARES.values() for s in ss]
        _SPARES.clear()
    for s in spares:
        s.close()
