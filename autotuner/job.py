"""A tuning job: many problems (a model's keys, a list of shapes) tuned in one call, as fast as one.

:func:`tune_all` takes plans (:meth:`AutoTuner.plan`); ``AutoTuner.run`` is the job of one plan and
``Recording.tune`` the job of every recorded key. Tuning problems one after another would drain and
refill the compile pool and start a measuring process per problem, the GPU idle while each compiles.
A job instead:

1. serves every plan whose finished run in the database passes the warm path's checks;
2. starts ONE measuring side for the rest, at once, so that its imports overlap with compiling: an
   isolated measuring process holding every plan's spec (one per device with
   ``set_tuning(devices=...)``, one Ray actor per GPU with ``backend="ray"``; this process with
   ``isolate=False``);
3. resumes each plan's interrupted trials, records the configs ``validate`` refuses, and sends every
   remaining candidate of every plan to ONE compile pool, plan after plan, so that a plan's candidates
   finish close together: its inputs live on the measuring side only while they are measured (made at
   its first candidate, freed after its last). Each candidate is checked and timed as it finishes
   compiling;
4. once the pool has drained (compilation no longer competes for the CPU), takes each plan in turn:
   its finalists re-timed in interleaved rounds on inputs made again (same seed, same data), the pick,
   the winner loaded (unless ``load_kernels=False``) and stored, its inputs freed again.

Every trial is written to the database as it arrives, so a job cut short resumes where it stopped;
each plan is judged exactly as a run of its own would judge it (same checks, same pick). A failing
config is a trial; a plan that fails (no config survived, a wrong reference) does not stop the
others. One tqdm bar counts every candidate of the job; with several plans its postfix names the one
being measured and how many are done. Its timeline (:mod:`.timeline`: when the measuring sides and the
compile pool came up, when each device measured, the finalist rounds) is logged at INFO in one line and
kept on every plan's ``TuneResult.timeline``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sqlite3
import statistics
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any

from . import forking, procs, spares
from .bench import Measurer, make_measurer
from .cache import DamagedRow, TuningCacheWarning, TuningDB, db_file
from .compile import CompileBatch, compile_many
from .config import config_label, same_config
from .devices import DevicePool, open_isolated
from .errors import CudaContextLost, KernelFactoryWarning, TuningCacheError, TuningError, TuningInputError
from .logs import tilelang_logs_for_run
from .settings import check_setting
from .timeline import Timeline
from .trial import STATUSES, Status, Trial, error_headline, format_error
from .tuner import AutoTuner, Plan, TuneResult

__all__ = ["raise_errors", "tune_all"]

logger = logging.getLogger(__name__)

#: The fewest candidates re-timed in rounds (when that many succeeded). One timing per candidate drifts
#: by more than a 3% margin between the first and the last of a job (the GPU's clock moves with what ran
#: before): on an H200 (2026-11-22, benchmarks/data/model-mlp-2026-11-22d-h200) a candidate timed
#: 1471.5 us was left out of rounds that then timed both finalists at 1485 and 1502 us.
MIN_FINALISTS = 3

#: The run settings a job shares (one pool, one measuring side); plans that differ go in separate jobs.
_SHARED = ("n_jobs", "backend", "isolate", "run_timeout", "devices", "allow_mixed_devices")
#: The timeline's name for the one measuring side of a job without ``devices`` (a process, or this one).
MEASURER = "measurer"


def tune_all(plans: Iterable[Plan | AutoTuner], *, progress: bool | None = None, load_kernels: bool = True,
             errors: str = "raise") -> list[Any]:
    """Tune every plan as one job (see the module docstring); their results, in order.

    * ``plans``: :meth:`AutoTuner.plan` results (a bare ``AutoTuner`` is planned with its defaults).
    * ``progress``: the job's one bar (total: every candidate); ``None``: on if any plan's
      ``set_tuning(progress=...)`` is.
    * ``load_kernels``: load each winner in this process (``TuneResult.kernel``). ``False`` leaves it
      ``None`` (keyed kernels compile their own served kernels) unless the winner had to be loaded to
      be checked (one measured by an earlier, interrupted run).
    * ``errors``: ``"raise"``: once every plan is done, a failed plan's exception (``TuningError``,
      ``TuningInputError``) is raised, several as one ``TuningError`` naming each; ``"return"``: the
      exception takes the failed plan's place in the list.

    Plans that differ in how candidates are compiled or measured (``n_jobs``, ``backend``, ``isolate``,
    ``run_timeout``, ``devices``, or a target of another kind) are tuned in separate jobs, in turn.
    """
    if errors not in ("raise", "return"):
        raise ValueError(f"errors must be 'raise' or 'return', got {errors!r}")
    check_setting("progress", progress if progress is not None else True)
    if not isinstance(load_kernels, bool):
        raise TypeError(f"load_kernels must be True or False, got {load_kernels!r}")
    first: dict[str, int] = {}  # a problem asked for twice (same database key) is tuned once
    try:  # from the first plan on: a plan starts measuring sides and compile hosts (:mod:`.spares`)
        plans = [p.plan() if isinstance(p, AutoTuner) else p for p in plans]
        for p in plans:
            if not isinstance(p, Plan):
                raise TypeError(f"tune_all takes AutoTuner.plan(...) results or AutoTuners, got {p!r}")
        groups: dict[tuple, list[int]] = {}
        for i, p in enumerate(plans):
            if first.setdefault(p.key, i) == i:
                shared = tuple(getattr(p.run_settings, name) for name in _SHARED) + (p.target.kind,)
                groups.setdefault(shared, []).append(i)
        out: list[Any] = [None] * len(plans)
        for slots in groups.values():
            on = progress if progress is not None else any(plans[i].run_settings.progress for i in slots)
            for i, r in zip(slots, _Job([plans[i] for i in slots], on, load_kernels).run()):
                out[i] = r
    finally:
        spares.close_all()  # measuring sides the plans started for plans served from the database
        forking.release_driver()  # the driver query's child, holding the driver while they started
    out = [out[first[p.key]] for p in plans]
    if errors == "raise":
        raise_errors([p.label for p in plans], out)
    return out


def raise_errors(labels: list[str], outcomes: list[Any]) -> None:
    """Raise the failures among a job's outcomes: one as it is, several as one ``TuningError`` naming each
    (by its label) and chained from the first; nothing when every plan was tuned."""
    failed = [(label, r) for label, r in zip(labels, outcomes) if isinstance(r, BaseException)]
    if len(failed) == 1:
        raise failed[0][1]
    if failed:
        lines = "\n".join(f"  {label}: {type(e).__name__}: {error_headline(str(e), 300)}" for label, e in failed)
        raise TuningError(f"{len(failed)} of {len(outcomes)} problems failed to tune:\n{lines}") from failed[0][1]


def _without_db(db: TuningDB, what: str, label: str, e: sqlite3.Error) -> None:
    """Warn that ``db`` failed while doing ``what`` for the problem ``label``, which goes on without it."""
    warnings.warn(f"the tuning database {db.path} failed while {what} for {label} ({type(e).__name__}: {e}); "
                  "tuning goes on without it, and this result is not stored",
                  TuningCacheWarning, stacklevel=3)


def _open_db(path: Any) -> TuningDB:
    """The tuning database at ``path`` for a job. One that exists but cannot be opened for writing (a
    read-only file or directory, a full disk) is opened read-only, with a warning: its winners are still
    served, and what this job measures is returned but not stored. One that cannot be created at all is a
    :class:`.errors.TuningCacheError` naming it and the ways out, before anything is measured."""
    try:
        return TuningDB(path)
    except TuningCacheError as e:
        if not db_file(path).is_file():
            raise
        try:
            db = TuningDB(path, readonly=True)
        except TuningCacheError:
            raise e from None
        warnings.warn(f"{e}; the database was opened read-only: its stored results are used, and what this run "
                      "measures is not stored", TuningCacheWarning, stacklevel=4)
        return db


def _distrust(why: str) -> None:
    warnings.warn(f"not using the stored tuning result: {why}; tuning again", TuningCacheWarning, stacklevel=5)


class _Job:
    """Plans that share a compile pool and a measuring side. :meth:`run` reads as the module docstring."""

    def __init__(self, plans: list[Plan], progress: bool, load_kernels: bool) -> None:
        self.plans, self.progress, self.load_kernels = plans, progress, load_kernels
        self.bar: Any = None
        self.runs: list[_PlanRun] = []
        self.phases: dict[str, float] = {}  # the job's own steps, in every plan's TuneResult.phases
        self._last = time.perf_counter()
        start = time.time() - (self._last - min(p.t_start for p in plans))  # t=0: the first plan's start
        self.timeline = Timeline(start)
        self.timeline.mark("plan", at=start)
        for p in plans:
            self.timeline.stamps(p.label, p.stamps)
        self.timeline.mark("job start")

    def run(self) -> list[Any]:
        out: list[Any] = [None] * len(self.plans)
        dbs: dict[str, TuningDB] = {}
        with tilelang_logs_for_run(self.progress), procs.run_scratch():
            try:
                for slot, plan in enumerate(self.plans):
                    rs = plan.run_settings
                    db = None
                    if rs.cache:
                        db = dbs.get(str(rs.db_path))
                        if db is None:
                            db = dbs[str(rs.db_path)] = _open_db(rs.db_path)
                    try:
                        hit = plan.cached(db) if db is not None else None
                    except TuningError as e:  # the stored winner's factory hangs: this plan's failure
                        out[slot] = e
                        continue
                    except sqlite3.Error as e:  # as _PlanRun._in_db: tune without the database
                        _without_db(db, "looking up the stored result", plan.label, e)
                        hit = db = None
                    if hit is not None:
                        out[slot] = hit
                    else:  # a file only readable: looked up, nothing stored (_open_db warned)
                        self.runs.append(_PlanRun(self, len(self.runs), slot, plan, None if db and db.readonly else db))
                if self.runs:
                    self._tune()
                    for r in self.runs:
                        out[r.slot] = r.outcome
            finally:
                for db in dbs.values():
                    db.close()
        return out

    def _tune(self) -> None:
        from tqdm import tqdm  # a plain bar on stderr, also in notebooks

        runs, first = self.runs, self.runs[0].plan
        rs = first.run_settings
        self._last = time.perf_counter()
        self.bar = tqdm(total=sum(len(r.plan.configs) for r in runs), desc="tuning", unit="cfg", file=sys.stderr,
                        disable=not self.progress, leave=False)
        specs = [r.plan.spec for r in runs]
        tl = self.timeline
        tl.mark("tune start")
        if first.devices:  # backend="ray" always has its devices: one actor each
            close_wait = 0.0
            if rs.backend == "ray":
                from .ray_cluster import HANDBACK_S as close_wait  # its actors kept before the run returns
                from .ray_cluster import RayBench as open_bench  # (ray.shutdown() may follow)
            else:
                open_bench = open_isolated
            bench: Measurer = DevicePool(specs, rs.run_timeout, first.devices, open_bench=open_bench, timeline=tl,
                                         close_wait=close_wait)
        else:
            tl.mark("open", MEASURER)
            bench = make_measurer(specs, rs.isolate, rs.run_timeout)
            tl.mark("opened", MEASURER)
        if len(runs) > 1:
            logger.info("tuning %d problems (%d candidates) in one job", len(runs), self.bar.total)
        try:
            todo = [r.resume_and_validate() for r in runs]
            first = next(((r, t[0]) for r, t in zip(runs, todo) if t), None)
            if first is not None:  # its inputs and reference made while the measuring side waits for candidates
                r, i = first
                bench.prepare(r.sid, r.plan.configs[i], r.plan.tuner.compile_settings.compile_timeout)
            self._mark("start")
            try:
                self._compile_and_measure(bench, todo)
                self._mark("compile and measure")
                self.bar.close()
                for r in runs:
                    if r.outcome is None:
                        r.finish(bench)
            except CudaContextLost as e:  # only in this process (isolate=False): a measuring process is replaced
                raise CudaContextLost(f"{e}. Nothing more can run in this process, so the job stops: with "
                                      "isolate=True (the default) such a candidate costs only its own trial") from None
        finally:
            self.bar.close()
            bench.close()
            tl.mark("job end")
            logger.info("timeline (s since the plan): %s", tl.line())

    def _mark(self, phase: str) -> None:
        now = time.perf_counter()
        self.phases[phase] = now - self._last
        self._last = now

    def show(self, current: _PlanRun) -> None:
        """The bar's postfix: plans done, and the plan whose candidate was recorded last."""
        if len(self.runs) > 1:
            done = sum(r.outcome is not None or r.left == 0 for r in self.runs)
            self.bar.set_postfix_str(f"{done}/{len(self.runs)} done; {current.plan.label} "
                                     f"{current.counted}/{len(current.plan.configs)}", refresh=False)

    def _compile_and_measure(self, bench: Measurer, todo: list[list[int]]) -> None:
        runs = self.runs
        rs = runs[0].plan.run_settings
        batches = []
        for r, indices in zip(runs, todo):
            cs = r.plan.tuner.compile_settings
            batches.append(CompileBatch(r.plan.tuner.fn, r.plan.configs, indices, r.plan.target.spec,
                                        cs.compile_timeout, cs.pass_config_dict))
            r.left = len(indices)
        tl = self.timeline
        tl.mark("pool start", "compile")
        outcomes = compile_many(batches, n_jobs=rs.n_jobs, backend=rs.backend,
                                on_ready=lambda: tl.mark("pool ready", "compile"))
        pending: dict[Future, tuple[_PlanRun, int]] = {}
        last: float | None = None  # when the last outcome arrived
        with contextlib.closing(outcomes):  # a failure here shuts the compile pool down at once
            for out in outcomes:
                last = time.time()
                tl.once("first compiled", "compile")
                r = runs[out.batch]
                if r.outcome is not None:  # the plan has failed (its reference): the rest of it is dropped
                    continue
                cfg = r.plan.configs[out.index]
                if out.prim is not None:
                    r.prims[out.index] = out.prim
                if out.status != Status.OK:
                    r.record(out.index, Trial(cfg, Status(out.status), out.error, out.seconds), bench)
                elif isinstance(bench, DevicePool):  # the next free device measures it
                    pending[bench.submit(r.sid, out.index, cfg, out.seconds, out.prim)] = (r, out.index)
                    self._collect(bench, pending, block=False)
                else:
                    r.measured(out.index, functools.partial(self.timeline.measure, MEASURER, bench, r.sid,
                                                            out.index, cfg, out.seconds, out.prim), bench)
                if any(x.outcome is not None for x in runs) and all(x.outcome is not None or x.left == 0
                                                                     for x in runs):
                    break  # what is left in the pool belongs to failed plans: stop it
        if last is not None:
            tl.mark("last compiled", "compile", at=last)
        while pending:
            self._collect(bench, pending, block=True)
        tl.mark("compile and measure done")

    @staticmethod
    def _drop_failed(pending: dict[Future, tuple[_PlanRun, int]], bench: Measurer) -> None:
        """Stop waiting for candidates of plans that have failed (not started ones are cancelled). One a
        device is already running makes the plan's inputs again after the plan's release: it is released
        once more when that candidate ends."""
        for fut, (r, _) in list(pending.items()):
            if r.outcome is not None:
                if not fut.cancel():
                    fut.add_done_callback(lambda _f, sid=r.sid: bench.release(sid))
                del pending[fut]

    def _collect(self, bench: Measurer, pending: dict[Future, tuple[_PlanRun, int]], block: bool) -> None:
        """Record the trials of the devices that have finished (waiting for one if ``block``)."""
        done, _ = wait(pending, timeout=None if block else 0, return_when=FIRST_COMPLETED)
        for fut in done:
            if fut in pending:
                r, i = pending.pop(fut)
                if r.outcome is None:
                    r.measured(i, fut.result, bench)
        self._drop_failed(pending, bench)


class _PlanRun:
    """One plan's part of a job: its trials, resumed, recorded and judged as a run of its own would."""

    def __init__(self, job: _Job, sid: int, slot: int, plan: Plan, db: TuningDB | None) -> None:
        self.job, self.sid, self.slot, self.plan, self.db = job, sid, slot, plan, db
        self.trials: list[Trial | None] = [None] * len(plan.configs)
        self.counted = 0  # trials on the bar
        self.left = 0  # candidates sent to compile and not yet recorded
        self.outcome: TuneResult | BaseException | None = None
        #: The PrimFuncs compile workers built (pickled), by config: what each candidate's measuring side
        #: loaded, checked and timed, so that a finalist re-timed elsewhere and the winner returned here are
        #: that kernel and not the factory's output in another process. Kept only for candidates that may
        #: still become finalists (:meth:`_hold`).
        self.prims: dict[int, bytes] = {}

    def _store(self, i: int, trial: Trial) -> None:
        self.trials[i] = trial
        self._in_db("recording a trial", lambda db: db.record_trial(self.plan.key, i, trial))

    def _in_db(self, what: str, call: Callable[[TuningDB], Any]) -> Any:
        """``call(db)``; where the database fails (locked past its timeout by another process, a full disk,
        a read-only file), a warning, and this plan goes on without it: its result is returned, not stored."""
        if self.db is None:
            return None
        try:
            return call(self.db)
        except sqlite3.Error as e:
            _without_db(self.db, what, self.plan.label, e)
            self.db = None
            return None

    def _note(self, i: int, trial: Trial) -> None:
        """Store a trial and count it on the bar."""
        self._store(i, trial)
        self.counted += 1
        self.job.bar.update(1)
        if trial.status != Status.OK:
            logger.debug("config %s: %s %s", config_label(trial.config), trial.status, error_headline(trial.error))

    def record(self, i: int, trial: Trial, bench: Measurer) -> None:
        """A compiled candidate's trial; after the last, its inputs are freed on the measuring side."""
        self._note(i, trial)
        self._hold(i, trial)
        self.left -= 1
        if self.left == 0:
            bench.release(self.sid)
        self.job.show(self)

    def _hold(self, i: int, trial: Trial) -> None:
        """Keep candidate ``i``'s PrimFunc only while it may become a finalist: finalists are among the
        fastest ``max(max_finalists, MIN_FINALISTS)`` ok trials, so a slower one's is dropped (25 kB each
        for a GEMM; a job of many problems would otherwise hold every candidate's)."""
        if trial.status != Status.OK:
            self.prims.pop(i, None)
            return
        held = [j for j in self.prims if (t := self.trials[j]) is not None and t.status == Status.OK]
        if len(held) > max(self.plan.spec.timing.max_finalists, MIN_FINALISTS):
            # the slowest; of tied ones the last by index, as the finalists' stable sort leaves it out
            del self.prims[max(held, key=lambda j: (self.trials[j].median_ms, j))]

    def measured(self, i: int, measure: Callable[[], Trial], bench: Measurer) -> None:
        """Record ``measure()``'s trial, or fail the plan if its problem is wrong (``TuningInputError``)."""
        try:
            trial = measure()
        except TuningInputError as e:
            self.fail(e, bench)
        else:
            self.record(i, trial, bench)

    def fail(self, error: BaseException, bench: Measurer) -> None:
        """The problem itself is wrong: nothing of this plan is worth keeping; the job goes on."""
        self.outcome = error
        self.prims.clear()
        self._in_db("discarding the run", lambda db: db.discard_run(self.plan.key))
        self.job.bar.update(len(self.plan.configs) - self.counted)
        self.counted = len(self.plan.configs)
        bench.release(self.sid)

    def resume_and_validate(self) -> list[int]:
        """Take the trials an interrupted run already recorded (if sound), reject configs ``validate``
        refuses, and return the indices left to compile."""
        plan, configs = self.plan, self.plan.configs
        prior = self._in_db("opening the run", self._resumed) or {}
        for i, tr in prior.items():
            self.trials[i] = tr
            self.counted += 1
            self.job.bar.update(1)
        if prior:
            logger.info("resuming an interrupted tuning run of %s: %d of %d trials already recorded",
                        plan.label, len(prior), len(configs))
        to_compile = []
        for i, cfg in enumerate(configs):
            if self.trials[i] is not None:
                continue
            reasons = plan.reasons(cfg)
            if reasons:
                self._note(i, Trial(cfg, Status.RESOURCE_ERROR, "; ".join(reasons)))
            else:
                to_compile.append(i)
        return to_compile

    def _resumed(self, db: TuningDB) -> dict[int, Trial]:
        """Open this plan's run in ``db``; the sound trials an interrupted run of it recorded, by index."""
        plan, configs, t = self.plan, self.plan.configs, self.plan.spec.timing
        db.open_run(plan.key, plan.kernel_name, str(plan.target.spec), len(configs),
                    {"warmup": t.warmup, "rep": t.rep, "n_jobs": plan.run_settings.n_jobs, "prekey": plan.prekey})
        try:
            prior = db.trials(plan.key)
        except DamagedRow as e:
            _distrust(f"a damaged trial row ({e}) in the interrupted run")
            db.forget_trials(plan.key, range(len(configs)))
            prior = {}
        bad = [i for i, tr in prior.items() if i >= len(configs) or not same_config(tr.config, configs[i])]
        if bad:
            _distrust(f"trials {bad} of the interrupted run are not for the configs asked for")
            db.forget_trials(plan.key, bad)
        return {i: tr for i, tr in prior.items() if i not in bad}

    def finish(self, bench: Measurer) -> None:
        """Finalist rounds, the pick, the winner loaded and checked as needed, stored: ``self.outcome``."""
        plan = self.plan
        phases = dict(self.job.phases)
        last = time.perf_counter()

        def mark(phase: str) -> None:
            nonlocal last
            now = time.perf_counter()
            phases[phase], last = now - last, now

        tl = self.job.timeline
        try:
            try:
                tl.mark("finalists start", plan.label)
                finalists = self._retime_finalists(bench)
                tl.mark("finalists end", plan.label)
                mark("finalist rounds")
                ref_latency = bench.fetch_ref_latency(self.sid)
                best_i = self._pick(finalists, ref_latency)
                jit, phash = self._winner_kernel(bench, best_i)
                measured_hash = bench.measured_hash(self.sid, best_i)
                if measured_hash is not None:  # also unloaded: a keyed kernel builds the winner here later
                    self._same_here(best_i, phash if best_i not in self.prims else None, measured_hash,
                                    None if jit is None else phash in (None, measured_hash))
                mark("load the winner")
                tl.mark("winner loaded", plan.label)
            finally:
                bench.release(self.sid)
                self.prims.clear()
            best = self.trials[best_i]
            if phash is not None and plan.run_settings.recheck and phash != measured_hash:
                # loaded again here from a PrimFunc other than the one checked in this run (a resumed
                # trial, or a factory that changed): check what is returned
                failed = plan.verified(jit)
                if failed is not None:
                    raise TuningError(f"the winner {config_label(best.config)}, loaded again in this process, fails "
                                      f"its check ({failed}); its factory does not give the same kernel twice")
            mark("check the winner")
        except TuningInputError as e:  # the problem is wrong: nothing of this run is worth keeping
            self._in_db("discarding the run", lambda db: db.discard_run(plan.key))
            self.outcome = e
            return
        except CudaContextLost:
            raise  # the whole job's end, not this problem's (later problems would run in the same process)
        except TuningError as e:
            self.outcome = e
            return
        best_prim = phash or measured_hash  # the PrimFunc measured (a kernel's prim_func is TileLang's lowered copy)
        self._in_db("storing the winner", lambda db: db.finish_run(plan.key, best, ref_latency, best_prim))
        logger.info("tuning phases of %s: %s", plan.label, ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()))
        self.outcome = plan.result(jit, best, ref_latency, [x for x in self.trials if x is not None], phases,
                                   self.job.timeline)

    def _same_here(self, i: int, here: str | None, measured: str, timed: bool | None) -> None:
        """Warn (:class:`KernelFactoryWarning`) when the factory gives config ``i`` another PrimFunc in this
        process than the one measured (``here``: its hash when the winner was elaborated here already;
        ``timed``: whether the kernel returned is the one measured, ``None`` when none is returned)."""
        cfg = self.trials[i].config
        try:
            if here is None:
                here = self.plan.own_hash(cfg)
            detail = None if here == measured else f"hash {here[:12]} here, {measured[:12]} there"
        except Exception as e:  # noqa: BLE001 - a factory that fails or hangs here differs as much
            detail = f"here it fails: {error_headline(format_error(e))}"
        if detail is not None:
            warnings.warn(
                f"{self.plan.kernel_name}({config_label(cfg)}) elaborates to a different PrimFunc in this process "
                f"than where it was measured ({detail}). {_RETURNED[timed]} The factory depends on the "
                "process it runs in (an environment variable: compile workers set CUDA_VISIBLE_DEVICES=''; a GPU "
                "it queries; global state; chance): make the kernel depend on its arguments only. Until then a "
                "stored result cannot be reused, and each run tunes again.", KernelFactoryWarning, stacklevel=2)

    def _retime_finalists(self, bench: Measurer) -> list[int]:
        """Re-time every candidate within ``finalist_margin`` of the fastest, and at least the
        :data:`MIN_FINALISTS` fastest, in interleaved rounds (each round times each finalist once, in a
        rotated order), so that drift in clocks or load between two candidates' measurements cannot
        decide the pick. Returns the finalists that survived."""
        t, trials = self.plan.spec.timing, self.trials
        ok = sorted((i for i, tr in enumerate(trials) if tr is not None and tr.status == Status.OK),
                    key=lambda i: trials[i].median_ms)
        if not ok or len(ok) < 2 and t.finalist_mode == t.candidate_mode:  # a lone one, timed that way already
            return ok
        fastest = trials[ok[0]].median_ms
        finalists = [i for i in ok if trials[i].median_ms <= fastest * (1 + t.finalist_margin)]
        finalists = (finalists if len(finalists) >= MIN_FINALISTS else ok[:MIN_FINALISTS])[: t.max_finalists]
        rounds: dict[int, list[Any]] = {i: [] for i in finalists}
        on = bench.finalist_device if isinstance(bench, DevicePool) else None  # every finalist on one device
        for r in range(t.finalist_rounds):
            k = r % len(finalists)
            for i in finalists[k:] + finalists[:k]:
                if i in rounds:
                    timing = bench.retime(self.sid, i, trials[i].config, self.prims.get(i))
                    if timing is None:  # it died or hung when run again: not a kernel to return
                        old = trials[i]
                        self._store(i, Trial(old.config, Status.RUNTIME_ERROR, "died, hung or failed when re-timed "
                                             "as a finalist (the log says which)", old.compile_s, device=on))
                        del rounds[i]
                    else:
                        rounds[i].append(timing)
        for i, timings in rounds.items():
            medians = [x.median_ms for x in timings]
            med = statistics.median(medians)
            old = trials[i]
            self._store(i, Trial(old.config, Status.OK, None, old.compile_s, med, min(x.min_ms for x in timings),
                                 statistics.median(x.iqr_ms for x in timings), len(timings),
                                 (max(medians) - min(medians)) / med, on))
        return list(rounds)

    def _pick(self, finalists: list[int], ref_latency: float | None) -> int:
        """The fastest finalist (all finalists were timed alike), or the fastest ok trial if none."""
        pool = finalists or [i for i, tr in enumerate(self.trials) if tr is not None and tr.status == Status.OK]
        if not pool:
            self._in_db("storing the run", lambda db: db.finish_run(self.plan.key, None, ref_latency))
            raise TuningError(_failure_message([x for x in self.trials if x is not None], str(self.plan.target.spec)))
        return min(pool, key=lambda i: self.trials[i].median_ms)

    def _winner_kernel(self, bench: Measurer, i: int) -> tuple[Any, str | None]:
        """The winner's kernel and, when it had to be loaded again here (a TileLang disk-cache hit), its
        PrimFunc hash, so that the caller checks it; the measured object itself needs no check. Not
        loaded (``None, None``) when the job does not load kernels and the winner was measured in it."""
        jit = bench.local_kernel(self.sid, i)
        if jit is not None:
            return jit, None
        if not self.job.load_kernels and bench.measured_hash(self.sid, i) is not None:
            return None, None
        return self.plan.load(self.trials[i].config, self.prims.get(i))


#: What a :class:`KernelFactoryWarning` says of the kernel returned: the one measured, one elaborated here
#: (its compiled PrimFunc was not kept: a winner resumed from an interrupted run), or none.
_RETURNED = {
    True: "The kernel returned is the one checked and timed; what the factory gives here was neither.",
    False: "The kernel returned was elaborated here, as its compiled PrimFunc was not kept, and checked once "
           "(unless recheck=False); it is not the one timed.",
    None: "What the factory gives here, where a keyed kernel or a table builds the winner, was neither checked "
          "nor timed.",
}


def _failure_message(trials: list[Trial], target: str) -> str:
    counts = Counter(str(t.status) for t in trials)
    lines = [f"no config survived tuning for {target}: "
             + ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])]
    for status in STATUSES:
        first = next((t for t in trials if t.status == status), None)
        if first is not None and first.error:
            lines.append(f"  first {status} ({config_label(first.config)}): {error_headline(first.error, 1000)}")
    return "\n".join(lines)
