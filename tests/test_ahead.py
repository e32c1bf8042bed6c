"""What a job does ahead of its first candidate (issue 13, the fixed start of a job), on the C target: the
measuring process started during the plan (autotuner/spares.py), and the first problem's inputs and
reference outputs made while it waits for a candidate (Bench.elaborate, Bench.make_inputs), the same as
the first candidate would have made them."""

from __future__ import annotations

import logging
import os
import sys
import time

import pytest
import torch
from kernels.c_kernels import add, add_failing, ref_add
from test_multidevice import _measuring_children
from test_timeline import assert_before, order_of

import autotuner.compile as compile_mod
from autotuner import AutoTuner, spares, tune_all
from autotuner.bench import Bench, Benches
from autotuner.errors import TuningInputError
from autotuner.job import MEASURER
from autotuner.target import ResolvedTarget

CONFIGS = [dict(block_M=m, block_N=n) for m in (16, 32) for n in (16, 32)]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; Linux only")


def tuner(configs=CONFIGS, ref=ref_add, **tuning):
    return (AutoTuner.from_kernel(add, configs).set_compile_args(out_idx=[-1], ref_prog=ref, target="c")
            .set_tuning(n_jobs=2, progress=False, **tuning))


def no_measuring_children(within: float = 20.0) -> bool:
    deadline = time.time() + within
    while _measuring_children() and time.time() < deadline:
        time.sleep(0.1)
    return not _measuring_children()


def test_the_measuring_process_starts_in_the_plan_and_has_inputs_before_the_first_candidate(monkeypatch):
    """A slow plan (the key's TileLang import, 1.9 s on an H200 host, made 3 s) and slow compiles: the
    measuring process is up before the plan ends, and the first problem's inputs and reference are made
    before the first candidate is compiled, so that it only loads its kernel."""
    real_key, real_task = ResolvedTarget.key, compile_mod.compile_task
    monkeypatch.setattr(ResolvedTarget, "key", lambda self: (time.sleep(3.0), real_key(self))[1])
    monkeypatch.setattr(compile_mod, "compile_task", lambda *a: (time.sleep(12.0), real_task(*a))[1])  # forked too
    (result,) = tune_all([tuner(CONFIGS[:2], cache=False).plan(1, 3, label="add")])
    tl = result.timeline
    assert_before(tl, ("process spawned", MEASURER), ("process up", MEASURER), ("key hashed", "add"),
                  ("job start", "job"))
    assert_before(tl, ("tune start", "job"), ("imports done", MEASURER), ("inputs made #0", MEASURER),
                  ("reference timed #0", MEASURER), ("first compiled", "compile"), ("first kernel loaded #0", MEASURER),
                  ("first measured", MEASURER))
    assert order_of(tl, MEASURER).count("inputs made #0") == 1, tl.line()  # not made again by the candidate
    assert [str(t.status) for t in result.trials] == ["ok", "ok"] and result.ref_latency > 0


def test_inputs_made_ahead_are_the_ones_the_first_candidate_would_make():
    spec = tuner(isolate=False).plan(1, 3).spec
    ahead, plain = Bench(spec), Bench(spec)
    ahead.elaborate(CONFIGS[0])
    ahead.make_inputs()
    assert ahead.ref_latency is None  # the problem's only once a candidate is checked on these inputs
    assert [str(b.measure(0, CONFIGS[0], None).status) for b in (ahead, plain)] == ["ok", "ok"]
    (a,), (b,) = ahead._cases.values(), plain._cases.values()
    assert a.names == b.names and a.out_idx == b.out_idx and sorted(a.pristine) == sorted(b.pristine)
    for i in a.pristine:
        assert torch.equal(a.pristine[i], b.pristine[i]) and torch.equal(a.args[i], b.args[i]), i
    assert len(a.refs) == len(b.refs) == 1 and torch.equal(a.refs[0], b.refs[0])
    assert ahead.ref_latency > 0 and plain.ref_latency > 0
    steps = [what for _, what in ahead.stamps]
    assert steps.count("inputs made") == 1 and steps.index("inputs made") < steps.index("first kernel loaded"), steps


def test_what_is_made_ahead_never_changes_a_problems_outcome():
    spec = tuner(isolate=False).plan(1, 3).spec
    unchecked = Bench(spec)  # made ahead, freed before any candidate was checked: no reference latency
    unchecked.elaborate(CONFIGS[0])
    unchecked.make_inputs()
    unchecked.release()
    assert unchecked.fetch_ref_latency() is None
    wrong = Benches([tuner(ref=lambda A, B: None, isolate=False).plan(1, 3).spec])
    assert wrong.elaborate(0, CONFIGS[0]) and not wrong.make_inputs(0)  # a wrong reference: dropped ahead,
    with pytest.raises(TuningInputError, match="returned None"):  # and the problem's error at its first check
        wrong.measure(0, 0, CONFIGS[0], None)


def test_a_factory_that_hangs_for_the_config_made_ahead_costs_no_candidate(caplog):
    """The measuring process elaborates the first config ahead, bounded as everywhere by compile_timeout: one
    whose factory hangs has the process replaced, and the next candidate is measured in the new one."""
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING, logger="autotuner.bench"):
        result = (AutoTuner.from_kernel(add_failing, [dict(block_M=64, hang=True), dict(block_M=32)])
                  .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c", compile_timeout=10)
                  .set_tuning(n_jobs=2, progress=False, cache=False).run(1, 2))
    assert time.perf_counter() - t0 < 60
    assert [str(t.status) for t in result.trials] == ["timeout", "ok"], result.trials
    assert any("took more than 10 s" in r.getMessage() for r in caplog.records), caplog.records
    assert order_of(result.timeline, MEASURER).count("process spawned") == 2, result.timeline.line()


@linux_only
def test_the_plans_start_one_measuring_process_the_job_takes_and_a_stored_problem_none(tmp_path):
    assert no_measuring_children()
    db = str(tmp_path / "tuning.sqlite")
    plans = [tuner(db_path=db).plan(1, 3) for _ in range(2)]  # one problem twice: one job, one process
    assert len(_measuring_children()) == 1
    assert all("measuring started" in [what for _, what in p.stamps] for p in plans)
    first, again = tune_all(plans)
    assert first is again and not first.from_cache and no_measuring_children()
    stored = tuner(db_path=db).plan(1, 3)  # its finished run is in the database: served, nothing started
    assert "measuring started" not in [what for _, what in stored.stamps] and not _measuring_children()
    spare = tuner(cache=False).plan(1, 3)  # started, then left over: the job of a stored problem ends it
    assert "measuring started" in [what for _, what in spare.stamps] and len(_measuring_children()) == 1
    (served,) = tune_all([stored])
    assert served.from_cache and served.config == first.config and no_measuring_children()


def test_a_plan_made_in_a_thread_that_ends_starts_no_process_the_job_could_lose():
    """A measuring process dies with the thread that spawned it (PR_SET_PDEATHSIG): planned in a thread
    that ends before the job, it would die mid-job and fail a good candidate (seen in review,
    2026-11-22). Such a plan starts none, and the job spawns its own."""
    import threading

    assert no_measuring_children()
    made = []
    t = threading.Thread(target=lambda: made.append(tuner(cache=False).plan(1, 3)))
    t.start()
    t.join()
    assert "measuring started" not in [what for _, what in made[0].stamps] and not _measuring_children()
    (result,) = tune_all(made)
    assert [str(t.status) for t in result.trials] == ["ok"] * len(CONFIGS) and no_measuring_children()


class _FakeSpare:
    def __init__(self, age: float, alive: bool = True) -> None:
        self.spawned, self._alive, self.closed = time.time() - age, alive, False

    def alive(self) -> bool:
        return self._alive

    def close(self) -> None:
        self.closed = True


def test_a_spare_too_old_or_dead_is_closed_not_taken():
    kind = ("test", "fake")
    old, dead, fresh = _FakeSpare(spares.MAX_AGE_S + 1), _FakeSpare(1, alive=False), _FakeSpare(1)
    for s in (old, dead, fresh):
        spares.keep(kind, s)
    try:
        assert spares.take(kind) is fresh and spares.take(kind) is None
        assert old.closed and dead.closed and not fresh.closed
    finally:
        spares.close_all()


def test_the_kinds_waiting_are_those_with_a_usable_spare():
    usable, stale = ("test", "usable"), ("test", "stale")
    spares.keep(usable, _FakeSpare(1))
    spares.keep(stale, old := _FakeSpare(spares.MAX_AGE_S + 1))
    try:
        waiting = spares.kinds()
        assert usable in waiting and stale not in waiting and old.closed
    finally:
        spares.close_all()


def test_a_gpu_measuring_side_without_a_driver_starts_all_the_same(monkeypatch):
    """The context thread (bench._create_context) finds no libcuda here: it stamps nothing and raises
    nothing, and the rest of the start (imports, torch's own CUDA start, which fails quietly) goes on; the
    first candidate meets and reports the missing GPU."""
    import ctypes

    from autotuner import bench

    def no_driver(name, *args, **kwargs):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", no_driver)
    monkeypatch.setattr(torch.cuda, "init", lambda: (_ for _ in ()).throw(RuntimeError("no NVIDIA driver")))
    made: list[float] = []
    bench._create_context(made)
    assert made == []
    stamps = bench.start_device("cuda")
    assert [what for _, what in stamps] == ["torch imported", "device ready", "tilelang imported"]


@pytest.mark.gpu
def test_the_context_made_ahead_is_the_one_torch_then_uses():
    """The driver-API context of the measuring process's start is device 0's primary context, which torch
    makes current: one context per process, not two (run in a fresh process)."""
    import subprocess

    code = ("import ctypes, torch\n"
            "from autotuner.bench import _create_context\n"
            "made = []; _create_context(made); assert made, 'no context'\n"
            "torch.empty(1, device='cuda')\n"
            "cuda = ctypes.CDLL('libcuda.so.1')\n"
            "cur, prim, dev = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()\n"
            "assert cuda.cuCtxGetCurrent(ctypes.byref(cur)) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0\n"
            "assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(prim), dev) == 0\n"
            "assert cur.value == prim.value, (cur.value, prim.value)\n"
            "print('same context')\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "same context" in p.stdout, p.stderr[-2000:]


def test_a_compiled_candidates_primfunc_travels_to_the_measuring_side_which_does_not_elaborate_it(monkeypatch):
    """A compile sends back the PrimFunc it built (pickled), the one the config elaborates to; measuring
    loads it rather than elaborating the config again (15-25 ms of CPU per GEMM candidate). Without it
    (a PrimFunc that does not pickle, or a damaged blob) the measuring side elaborates, as before."""
    from autotuner.cache import prim_hash

    outs = list(compile_mod.compile_all(add, CONFIGS[:2], [0, 1], "c", timeout=120, n_jobs=2))
    assert all(o.prim is not None for o in outs), outs
    for o in outs:
        assert prim_hash(compile_mod.load_prim(o.prim)) == prim_hash(add(**CONFIGS[o.index]))
    assert compile_mod.load_prim(b"not a pickle") is None and compile_mod.load_prim(None) is None

    calls = []
    real = compile_mod.elaborate_config
    monkeypatch.setattr(compile_mod, "elaborate_config", lambda *a: (calls.append(os.getpid()), real(*a))[1])
    result = tuner(cache=False, isolate=False).run(1, 3)
    assert [str(t.status) for t in result.trials] == ["ok"] * 4
    assert calls.count(os.getpid()) <= 1, calls  # the winner's load at most; no candidate elaborated here
    calls.clear()
    monkeypatch.setattr(compile_mod, "dump_prim", lambda func: None)  # the forked compile workers inherit it
    result = tuner(cache=False, isolate=False).run(1, 3)
    assert [str(t.status) for t in result.trials] == ["ok"] * 4
    assert calls.count(os.getpid()) >= 4, calls  # each candidate elaborated where it is measured
