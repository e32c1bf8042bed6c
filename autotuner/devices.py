"""Measuring on several devices of one host (``set_tuning(devices="all" | [0, 1, ...])``).

One isolated measuring process per device (:class:`.bench.IsolatedBench`, pinned to its GPU with
``CUDA_VISIBLE_DEVICES``, holding every problem of the job), each owned by a thread that lives as long
as the run: the measuring process dies with the thread that started it (``PR_SET_PDEATHSIG``; the
plan's thread for the first one, which the plan starts: :mod:`.spares`), and its restarts after a crash
or a hang happen in the device's thread. Candidates go into one queue as they
finish compiling and the next free device takes the next one, so a faster device measures more (no
fixed chunks). A crash or a hang costs one candidate on one device and restarts that device's
process only.

Timings from two GPU models do not compare, so devices of different models are refused unless the
caller allows them (``allow_mixed_devices=True``); every trial records its device. Finalists are
re-timed on one device, the first listed, so the pick never depends on which device measured what.
On the C target the indices are fake devices: that many CPU measuring processes, so the scheduler
runs on machines without a GPU.

The pool takes any measuring side with :class:`.bench.IsolatedBench`'s methods (``open_bench``):
:mod:`.ray_cluster` puts a Ray actor behind each device. A device that is gone for good (its node
lost) raises :class:`DeviceLost`: the job it was given goes to another device, and the run goes on
with the rest.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from .bench import BenchSpec, IsolatedBench
from .errors import TuningError
from .timeline import Timeline
from .timing import Timing
from .trial import Trial

__all__ = ["Device", "DeviceLost", "DevicePool", "device_count", "device_name", "resolve_devices"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Device:
    """One measuring device: its index in this process, the label its trials record, its model and the
    environment its measuring process gets."""

    index: int
    label: str
    name: str
    env: dict[str, str] = field(default_factory=dict)


class DeviceLost(RuntimeError):
    """A measuring device that cannot come back (its Ray node is gone, its actor cannot be placed): the
    pool drops it and hands its job to another device. Raised before the job ran on it."""


def device_name(kind: str, index: int) -> str:
    """The model of device ``index`` (``torch.cuda.get_device_name``; ``"cpu"`` for the C target's fake
    devices): two devices whose timings compare have the same name. Tests replace this function."""
    if kind == "cuda":
        from .forking import local_gpus

        gpus = local_gpus()
        if not 0 <= index < len(gpus):
            raise ValueError(f"there is no GPU {index}: {len(gpus)} are visible")
        return gpus[index]["name"]
    return "cpu"


def device_count(kind: str) -> int:
    """How many devices ``"all"`` means: the visible GPUs, or on the C target the CPU cores."""
    if kind == "cuda":
        from .forking import local_gpus

        return len(local_gpus())
    return os.cpu_count() or 1


def resolve_devices(devices: str | Sequence[int], kind: str, allow_mixed: bool) -> list[Device]:
    """The devices ``devices`` names on this host, checked: every index exists (GPUs), and all are one
    model unless ``allow_mixed``. A GPU's index is this process's (torch's), mapped through this
    process's ``CUDA_VISIBLE_DEVICES`` for the measuring process."""
    count = device_count(kind)
    indices = list(range(count)) if devices == "all" else list(devices)
    if kind == "cuda":
        missing = [i for i in indices if i >= count]
        if missing or not indices:
            raise ValueError(f"devices={devices!r}: this process sees {count} GPU(s) (indices 0 to {count - 1}), "
                             f"so {missing or 'none'} cannot be used; name existing indices, or devices='all'")
    names = [device_name(kind, i) for i in indices]
    mixed = len(set(names)) > 1
    if mixed and not allow_mixed:
        listing = ", ".join(f"{i}: {n}" for i, n in zip(indices, names))
        raise ValueError(f"devices={devices!r} are different models ({listing}); timings on one do not compare "
                         "with timings on another. Name devices of one model, e.g. "
                         f"devices={[i for i, n in zip(indices, names) if n == names[0]]}, or pass "
                         "set_tuning(allow_mixed_devices=True) to rank across them anyway (finalists are "
                         f"re-timed on device {indices[0]}, and every trial records its device)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    physical = [v.strip() for v in visible.split(",")] if visible else None
    prefix = "cuda" if kind == "cuda" else "cpu"
    out = []
    for i, name in zip(indices, names):
        env = {"CUDA_VISIBLE_DEVICES": physical[i] if physical and i < len(physical) else str(i)} \
            if kind == "cuda" else {}
        out.append(Device(i, f"{prefix}:{i}" + (f" ({name})" if mixed else ""), name, env))
    return out


_Job = tuple[Future, Callable[["_Worker"], Any], bool]  # (future, work, pinned to the finalists' device)
#: Opens the measuring side of one device for a job's problems: ``(specs, run_timeout, device) -> bench``.
BenchOpener = Callable[[list[BenchSpec], float, "Device"], Any]


def open_isolated(specs: list[BenchSpec], run_timeout: float, device: Device) -> IsolatedBench:
    """A measuring process on this host for every problem of a job, pinned to ``device`` through its
    environment."""
    return IsolatedBench(specs, run_timeout, device.env)


class _Worker(threading.Thread):
    """The thread that owns one device's measuring side and runs the jobs it takes."""

    def __init__(self, pool: DevicePool, device: Device, specs: list[BenchSpec], run_timeout: float,
                 open_bench: BenchOpener) -> None:
        super().__init__(name=f"tilecarve-measure-{device.label}", daemon=True)
        self.pool, self.device, self._specs, self._run_timeout = pool, device, specs, run_timeout
        self._open = open_bench
        self.inbox: deque[_Job | None] = deque()  # jobs for this device only (finalists); None: stop
        self.bench: Any = None
        self.opened = threading.Event()  # its measuring side is started (or failed to start)
        self.busy = False
        self.measured = 0

    def run(self) -> None:
        error: BaseException | None = None
        self.pool.timeline.mark("open", self.device.label)
        try:
            self.bench = self._open(self._specs, self._run_timeout, self.device)
        except Exception as e:  # noqa: BLE001 - handed to every job this device takes, so the run raises it
            error = e
        finally:
            self.opened.set()
        self.pool.timeline.mark("opened", self.device.label)
        while (job := self.pool._take(self)) is not None:
            fut, fn, _ = job
            if not (fut.running() or fut.set_running_or_notify_cancel()):  # running: handed on by a lost device
                continue
            self.busy = not getattr(fn, "housekeeping", False)  # what close() aborts: a candidate, not a release
            try:
                if error is not None:
                    raise error
                fut.set_result(fn(self))
            except DeviceLost as e:
                self.pool._lost(self, job, e)
                break
            except BaseException as e:  # noqa: BLE001 - raised again where the caller reads the result
                fut.set_exception(e)
            finally:
                self.busy = False
        if self.bench is not None:
            self.bench.close()


def _log_failed_release(sid: int, fut: Future) -> None:
    """Nobody waits on a release: say when one failed (the problem's inputs stay on that device)."""
    if not fut.cancelled() and fut.exception() is not None:
        logger.warning("freeing problem %d's inputs on a measuring device failed: %r", sid, fut.exception())


class DevicePool:
    """One measuring side per device (``open_bench``, by default :class:`.bench.IsolatedBench`) behind one
    queue, each holding every problem of the job: a :class:`.bench.Measurer`, plus :meth:`submit`, which
    measures on the next free device. Each device's start and measure calls go on ``timeline``.

    Each device's measuring side is opened on its own thread, and the pool returns once every one is
    started (a process spawned, an actor created, or one the plan started taken: :mod:`.spares`; not
    necessarily imported yet): a process forked from this one
    meanwhile (the job's compile pool) would inherit the pipe ``subprocess.Popen`` waits on until the
    measuring process runs, and hold it open for its life. Seen on the C target (2026-11-22): every
    device's ``Popen`` returned only when the compile pool ended, so no device began its imports before
    the last candidate was compiled (a warm grid's whole compile stream).
    """

    def __init__(self, specs: list[BenchSpec], run_timeout: float, devices: Sequence[Device],
                 open_bench: BenchOpener = open_isolated, timeline: Timeline | None = None,
                 close_wait: float = 0.0) -> None:
        if not devices:
            raise ValueError("a DevicePool needs at least one device")
        self.timeline = timeline if timeline is not None else Timeline()
        self._close_wait = close_wait  # close()'s default wait
        self._cond = threading.Condition()
        self._shared: deque[_Job] = deque()
        self._closed = False
        self._measured_on: dict[tuple[int, int], _Worker] = {}
        self._workers = [_Worker(self, d, list(specs), run_timeout, open_bench) for d in devices]
        self._alive = list(self._workers)  # in the order listed; a lost device leaves it
        self._dead: DeviceLost | None = None  # set when the last device is lost
        for w in self._workers:
            w.start()
        try:
            for w in self._workers:  # see the class docstring: started before the job forks its compile pool
                w.opened.wait()
        except BaseException:  # Ctrl-C while they open: close those started (a Ray actor holds its GPU)
            self.close()
            raise
        logger.info("measuring on %d devices: %s", len(devices), ", ".join(d.label for d in devices))

    @property
    def finalist_device(self) -> str:
        """The label of the device the finalists are re-timed on (the first one listed that is not lost)."""
        with self._cond:
            return (self._alive or self._workers)[0].device.label

    def measured_per_device(self) -> dict[str, int]:
        """How many candidates each device has measured so far, by label."""
        return {w.device.label: w.measured for w in self._workers}

    def _lost(self, worker: _Worker, job: _Job, why: DeviceLost) -> None:
        """``worker``'s device is gone: its job (and any finalist jobs waiting for it) go to the first
        device left, a shared job to the front of the queue; with none left, every job fails."""
        with self._cond:
            if worker in self._alive:
                self._alive.remove(worker)
            pinned = [job] if job[2] else []
            pinned += [j for j in worker.inbox if j is not None]
            worker.inbox.clear()
            if self._alive:
                logger.warning("measuring device %s lost (%s); going on with %s", worker.device.label, why,
                               ", ".join(w.device.label for w in self._alive))
                self._alive[0].inbox.extend(pinned)
                if not job[2]:
                    self._shared.appendleft(job)
                self._cond.notify_all()
                return
            failed = pinned + ([] if job[2] else [job]) + list(self._shared)
            self._shared.clear()
            self._dead = why
        err = TuningError(f"every measuring device was lost, the last one {worker.device.label}: {why}")
        for fut, _, _ in failed:
            if not fut.done():
                fut.set_exception(err)

    def _take(self, worker: _Worker) -> _Job | None:
        with self._cond:
            while True:
                if worker.inbox:
                    return worker.inbox.popleft()
                if self._shared and not self._closed:
                    return self._shared.popleft()
                self._cond.wait()

    def submit(self, sid: int, index: int, cfg: dict[str, Any], compile_s: float | None,
               prim: bytes | None = None) -> Future:
        """Measure ``cfg`` on the next free device; the future's result is the trial, carrying its
        device's label."""
        def job(w: _Worker) -> Trial:
            trial = self.timeline.measure(w.device.label, w.bench, sid, index, cfg, compile_s, prim)
            self._measured_on[sid, index] = w
            w.measured += 1
            return replace(trial, device=w.device.label)

        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the device pool is closed")
            if self._dead is not None:
                raise TuningError(f"every measuring device was lost: {self._dead}")
            self._shared.append((fut, job, False))
            self._cond.notify()
        return fut

    def measure(self, sid: int, index: int, cfg: dict[str, Any], compile_s: float | None,
                prim: bytes | None = None) -> Trial:
        """:meth:`submit` and wait: one candidate on the next free device."""
        return self.submit(sid, index, cfg, compile_s, prim).result()

    def _on(self, worker: _Worker | None, fn: Callable[[_Worker], Any]) -> Future:
        """Run ``fn`` on ``worker``'s thread, before anything from the shared queue; ``None``: on the first
        device not lost (the finalists' device; a job for it moves on if it is lost)."""
        fut: Future = Future()
        with self._cond:
            if not self._alive:
                raise TuningError(f"every measuring device was lost: {self._dead}")
            if worker is None:
                self._alive[0].inbox.append((fut, fn, True))
            elif worker in self._alive:
                worker.inbox.append((fut, fn, False))
            else:
                fut.set_result(None)  # a lost device has nothing left to run
            self._cond.notify_all()
        return fut

    def prepare(self, sid: int, config: dict[str, Any], elaborate_timeout: float) -> None:
        """Have every device make problem ``sid``'s inputs for ``config`` while it waits for its first
        candidate (:meth:`.bench.IsolatedBench.prepare`); returns at once."""
        for w in list(self._alive):
            self._on(w, lambda w: w.bench.prepare(sid, config, elaborate_timeout))

    def retime(self, sid: int, index: int, cfg: dict[str, Any], prim: bytes | None = None) -> Timing | None:
        """Time a candidate again on the first device (it loads the kernel from ``prim``, a disk-cache hit,
        when another device measured it): every finalist is timed on that one device."""
        return self._on(None, lambda w: w.bench.retime(sid, index, cfg, prim)).result()

    def fetch_ref_latency(self, sid: int) -> float | None:
        """The reference's latency on the first device (where the finalists were timed)."""
        return self._on(None, lambda w: w.bench.fetch_ref_latency(sid)).result()

    def release(self, sid: int) -> None:
        """Free a problem's inputs on every device, before the next candidate each device takes; returns at
        once. A failed release is logged (nobody waits on it); a candidate of a failed problem still running
        when it is released gets another release when it ends (:mod:`.job`)."""
        def free(w: _Worker) -> None:
            w.bench.release(sid)

        free.housekeeping = True  # type: ignore[attr-defined] - close() lets it end (it keeps the process usable)
        for w in list(self._alive):
            self._on(w, free).add_done_callback(functools.partial(_log_failed_release, sid))

    def local_kernel(self, sid: int, index: int) -> Any | None:
        """Never: candidates live in the measuring processes; the caller loads the winner itself."""
        return None

    def take_stamps(self) -> list[tuple[float, str]]:
        """None: each device's stamps go on the pool's ``timeline``, under its label, as they arrive."""
        return []

    def measured_hash(self, sid: int, index: int) -> str | None:
        """The PrimFunc hash of the kernel checked and timed as ``index``, on whichever device did it."""
        w = self._measured_on.get((sid, index))
        return w.bench.measured_hash(sid, index) if w is not None and w.bench is not None else None

    def close(self, wait: float | None = None) -> None:
        """Cancel what no device has taken, kill the measuring processes still busy with a candidate (a run
        that stops early; not one freeing a problem's inputs), and let each thread close its process and end.
        Returns at once, or once every thread has ended, but after ``wait`` seconds at most (by default the
        pool's ``close_wait``: a Ray run's, whose threads hand their actors back for the next run,
        :mod:`.ray_cluster`)."""
        wait = self._close_wait if wait is None else wait
        with self._cond:
            self._closed = True
            pending = list(self._shared)
            self._shared.clear()
            for w in self._workers:
                w.inbox.append(None)
            self._cond.notify_all()
        for fut, _, _ in pending:
            if not fut.cancel() and not fut.done():  # running: handed on by a lost device, not yet taken
                fut.set_exception(RuntimeError("the device pool was closed"))
        for w in self._workers:
            if w.busy and w.bench is not None:
                w.bench.abort()
        if wait > 0:
            deadline = time.monotonic() + wait
            for w in self._workers:
                if w is not threading.current_thread():
                    w.join(max(0.0, deadline - time.monotonic()))
            for w in self._workers:  # still closing: ended, so that nothing of the run goes on after it
                if w.is_alive() and w.bench is not None:
                    w.bench.abort()
