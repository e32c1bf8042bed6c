"""When the steps that bound a tuning job's wall time happened (issue 13): a job's timeline.

A job's time is reported in phases, the longest being "compile and measure"; what inside it does not
shrink with more devices (a measuring process's imports, the compile pool's start, the reference) is
only visible as events: ``(t, what, where)``, ``t`` in seconds since the job's first plan started
(:meth:`.tuner.AutoTuner.plan`), ``where`` being ``"job"``, ``"compile"``, a plan's label or a measuring
device's label. The events a job records (:mod:`.job`, :mod:`.devices`, the measuring side's own
stamps, :func:`.bench.serve_one`):

* ``job``: ``plan`` (t=0), ``job start`` (keys hashed, devices resolved), ``tune start`` (cached plans
  served), ``compile and measure done``, ``job end``;
* ``compile``: ``pool start`` (asked for), ``pool ready`` (workers made, where the backend says),
  ``first compiled``, ``last compiled`` (outcomes as the job received them);
* a device: ``process spawned`` (its measuring process or Ray actor started: during the plan when the
  plan started it, :mod:`.spares`), ``open``/``opened`` (the job took or started it, from its thread),
  then the measuring side's stamps: ``process up`` (interpreter or actor running), ``torch imported``, on
  a GPU ``context created`` (by the driver API, on a thread, while torch imports), ``device ready`` (on a
  GPU, torch's CUDA start and the L2 flush buffer made), ``tilelang imported``,
  ``imports done`` (the job's specs received and its kernels' modules imported), ``first config
  elaborated #sid``, ``inputs made #sid``, ``reference run #sid``, ``reference timed #sid`` (a problem's
  inputs: made ahead of its first candidate for the job's first problem, at its first candidate for the
  others), ``first kernel loaded #sid`` (its first candidate's kernel loaded); ``first measured`` and
  ``last measured`` (when its first and its last candidate were done);
* a plan (its label): ``devices found``, ``measuring started`` (when it started the measuring side),
  ``key hashed`` (TileLang imported in this process), then ``finalists start``, ``finalists end``,
  ``winner loaded``.

Per device (:meth:`Timeline.devices`), ``busy_s`` sums its measure calls once it is up (as the job saw
them, round trip included) and ``idle_s`` the time it was up and not measuring, before its last
candidate (waiting for compiled candidates, or for the job). Stamps from other processes are wall-clock
times (``time.time()``), exact on one host; on another Ray node they are off by the clocks' skew.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Event", "Timeline"]


@dataclass(frozen=True)
class Event:
    """``what`` happened at ``where``, ``t`` seconds after the job's first plan started."""

    t: float
    what: str
    where: str


class Timeline:
    """The events of one job, recorded from any thread. ``start``: the wall time (``time.time()``) of
    t=0; now if not given."""

    def __init__(self, start: float | None = None) -> None:
        self.start = time.time() if start is None else start
        self.events: list[Event] = []
        self._spans: dict[str, list[tuple[float, float]]] = {}  # device -> (start, end) of each measure
        self._lock = threading.Lock()

    def mark(self, what: str, where: str = "job", at: float | None = None) -> None:
        """Record ``what`` at ``where``, at wall time ``at`` (now if not given)."""
        with self._lock:
            self.events.append(Event((time.time() if at is None else at) - self.start, what, where))

    def once(self, what: str, where: str = "job") -> None:
        """Record ``what`` at ``where`` unless it is recorded already (a first of its kind)."""
        with self._lock:
            if any(e.what == what and e.where == where for e in self.events):
                return
            self.events.append(Event(time.time() - self.start, what, where))

    def stamps(self, where: str, stamps: list[tuple[float, str]]) -> None:
        """The measuring side's own ``(wall time, what)`` stamps, for device ``where``."""
        for at, what in stamps:
            self.mark(what, where, at)

    def measure(self, where: str, bench: Any, *args: Any) -> Any:
        """``bench.measure(*args)`` on device ``where``: the call's span and the stamps the measuring side
        brought back with it (``bench.take_stamps()``) go on the timeline, whether or not it raised."""
        start = time.time()
        try:
            return bench.measure(*args)
        finally:
            self.measured(where, start, time.time())
            self.stamps(where, bench.take_stamps())

    def measured(self, where: str, start: float, end: float) -> None:
        """One measure call on device ``where``, from ``start`` to ``end`` (wall times)."""
        with self._lock:
            self._spans.setdefault(where, []).append((start - self.start, end - self.start))

    def devices(self) -> dict[str, dict[str, Any]]:
        """Per device: candidates ``measured``; ``ready_s`` (its first ``imports done``; a restart
        included); ``busy_s``, the measure calls after it; ``idle_s``, the gaps between them and from
        ready to the first (waiting for compiled candidates, or for the job); ``first_s`` and ``last_s``,
        when its first and last candidate were done."""
        with self._lock:
            spans = {k: sorted(v) for k, v in self._spans.items()}
            events = list(self.events)
        out = {}
        for where, s in spans.items():
            ready = [e.t for e in events if e.where == where and e.what == "imports done"]
            at = ready[0] if ready else s[0][0]
            busy = idle = 0.0
            for b, e in s:  # a call that began before its process was up waited for it: counted from ready
                idle += max(0.0, b - at)
                busy += max(0.0, e - max(b, at))
                at = max(at, e)
            out[where] = {"measured": len(s), "ready_s": round(ready[0], 3) if ready else None,
                          "busy_s": round(busy, 3), "idle_s": round(idle, 3),
                          "first_s": round(s[0][1], 3), "last_s": round(s[-1][1], 3)}
        return out

    def sorted_events(self) -> list[Event]:
        """Every event, first measured / last measured per device included, in time order."""
        with self._lock:
            spans = {k: (min(v)[1], max(e for _, e in v)) for k, v in self._spans.items() if v}
            events = list(self.events)
        for where, (first, last) in spans.items():
            events += [Event(first, "first measured", where), Event(last, "last measured", where)]
        return sorted(events, key=lambda e: e.t)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: ``events`` as ``[t, what, where]`` in time order, and ``devices``."""
        return {"events": [[round(e.t, 3), e.what, e.where] for e in self.sorted_events()],
                "devices": self.devices()}

    def line(self) -> str:
        """One compact line for the log: every event ``where:what@t``, then each device's use."""
        events = " ".join(f"{e.where}:{e.what}@{e.t:.2f}" for e in self.sorted_events()
                          if not e.what.startswith(("inputs made", "reference run")))
        use = " ".join(f"{k}[n={d['measured']} busy={d['busy_s']:.2f} idle={d['idle_s']:.2f}]"
                       for k, d in self.devices().items())
        return f"{events} | {use}"
