"""Measuring processes forked from the tuning process (autotuner/forking.py): when forking is allowed, that a
forked child runs nothing of its parent's twice and survives the thread pools its parent started, the
driver query behind ``local_gpus``, and a tune on the C target whose measuring process is forked, or
spawned when forking is turned off or a forked one does not start."""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from kernels.c_kernels import add, ref_add
from test_timeline import order_of

import autotuner.bench as bench_mod
import autotuner.compile as compile_mod
from autotuner import AutoTuner, forking
from autotuner.job import MEASURER

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forking is used on Linux only")


def run_script(tmp_path, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


def test_a_forked_child_runs_none_of_its_parents_exit_handlers_finally_blocks_or_buffered_output(tmp_path):
    out = run_script(tmp_path, """
        import atexit, os
        from autotuner import forking
        atexit.register(lambda: print("atexit", flush=True))
        print("before", end="")  # buffered when the child is forked
        try:
            child = forking.fork_child(lambda: print("child", os.environ.get("TC_ENV"), flush=True),
                                       {"TC_ENV": "set"}, "tc-test")
            print("code", child.wait(60), os.environ.get("TC_ENV"))
        finally:
            print("finally", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    for line in ("before", "child set", "code 0 None", "finally", "atexit"):
        assert out.stdout.count(line) == 1, out.stdout
    assert out.stdout.index("child") < out.stdout.index("finally") < out.stdout.index("atexit"), out.stdout


def test_a_forked_child_survives_the_openmp_team_its_parent_started(tmp_path):
    """Seen 2026-11-22: a measuring process forked after this process ran torch CPU ops on several threads
    crashed in libgomp at its first large tensor op (every candidate a runtime_error)."""
    out = run_script(tmp_path, """
        import torch
        from autotuner import forking
        torch.set_num_threads(2)
        x = torch.empty(10_000_000); x.fill_(1.0)  # an OpenMP parallel region in this thread

        def main():
            y = torch.empty(10_000_000); y.fill_(2.0)
            assert float((y + y).sum()) == 4e7

        print("code", forking.fork_child(main, {}).wait(60), torch.get_num_threads())
    """)
    assert out.returncode == 0 and "code 0 2" in out.stdout, (out.stdout, out.stderr)


def test_a_forked_child_that_fails_or_hangs_is_handled_as_a_popen():
    def fail():
        raise ValueError("from the child")

    failed = forking.fork_child(fail, {})
    assert failed.wait(60) == 1 and failed.poll() == 1
    slow = forking.fork_child(lambda: time.sleep(60), {})
    with pytest.raises(subprocess.TimeoutExpired):
        slow.wait(0.2)
    slow.kill()
    assert slow.wait(10) == -9


def test_cuda_started_asks_the_driver_when_torch_has_not(monkeypatch):
    class Driver:  # cuDeviceGetCount answers CUDA_ERROR_NOT_INITIALIZED (3) until cuInit
        answer = 3

        def cuDeviceGetCount(self, n):  # noqa: N802 - the driver's name
            return self.answer

    driver = Driver()
    monkeypatch.setattr(forking, "_libcuda", lambda: driver)
    assert not forking.cuda_started()
    driver.answer = 0  # some library called cuInit
    assert forking.cuda_started() and not forking.can_fork("cuda")
    monkeypatch.setattr(forking, "_libcuda", lambda: None)  # no driver at all (this CPU machine)
    assert not forking.cuda_started()


def fake_ray(initialized: bool, left_behind: bool = False) -> types.ModuleType:
    """A module standing in for Ray: connected or not, and with or without what ``ray.shutdown()`` leaves."""
    GcsErrorSubscriber = type("GcsErrorSubscriber", (), {})  # noqa: N806 - the class name is what is read
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: initialized
    worker = types.SimpleNamespace(gcs_error_subscriber=GcsErrorSubscriber() if left_behind else None)
    ray._private = types.SimpleNamespace(worker=types.SimpleNamespace(global_worker=worker))
    return ray


def test_forking_is_refused_when_turned_off_after_cuda_started_and_once_ray_has_run_here(monkeypatch):
    monkeypatch.delenv(forking.START_ENV, raising=False)
    monkeypatch.setattr(forking, "_RAY_SEEN", False)
    monkeypatch.setattr(forking, "cuda_started", lambda: False)
    assert forking.can_fork("cpu") and forking.can_fork("cuda")
    monkeypatch.setattr(forking, "cuda_started", lambda: True)  # a child could use no GPU
    assert forking.can_fork("cpu") and not forking.can_fork("cuda")
    monkeypatch.setattr(forking, "cuda_started", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False))
    assert forking.can_fork("cpu") and compile_mod.default_backend() == "multiprocessing"  # imported, not run
    monkeypatch.setitem(sys.modules, "ray", fake_ray(True))
    assert not forking.can_fork("cpu") and not forking.fork_safe()
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False))  # ray.shutdown(): its threads live on
    assert not forking.can_fork("cpu") and compile_mod.default_backend() == "loky"
    monkeypatch.setattr(forking, "_RAY_SEEN", False)
    monkeypatch.setenv(forking.START_ENV, "spawn")
    assert not forking.can_fork("cpu") and not forking.can_fork("cuda")


def test_a_ray_shut_down_before_tilecarve_first_looked_still_rules_out_forking(monkeypatch):
    """A user's own ``ray.init()`` and ``ray.shutdown()`` before any tune: what Ray leaves behind tells."""
    monkeypatch.setattr(forking, "_RAY_SEEN", False)
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False))
    assert forking.fork_safe()  # imported, never connected
    monkeypatch.setitem(sys.modules, "ray", fake_ray(False, left_behind=True))
    assert not forking.fork_safe() and not forking.can_fork("cpu")


def test_a_stand_in_for_ray_does_not_turn_forking_off(monkeypatch):
    """A test's mock answers every attribute (``is_initialized()`` gives a truthy mock): not a Ray that ran."""
    from unittest import mock

    monkeypatch.setattr(forking, "_RAY_SEEN", False)
    for stand_in in (mock.MagicMock(), types.SimpleNamespace(is_initialized=lambda: True)):
        monkeypatch.setitem(sys.modules, "ray", stand_in)
        assert forking.fork_safe()
    bad = fake_ray(False)
    bad.is_initialized = lambda: 1 / 0  # a Ray that fails to answer
    monkeypatch.setitem(sys.modules, "ray", bad)
    assert forking.fork_safe() and not forking._RAY_SEEN


@pytest.mark.parametrize("n_jobs, backend", [(1, None), (2, None), (2, "multiprocessing"), (2, "threading"),
                                             (1, "loky")])
def test_a_process_that_has_run_ray_tunes_without_forking(monkeypatch, caplog, n_jobs, backend):
    """Compile workers and the measuring process start as fresh interpreters (joblib's loky, a spawned
    process), one compile worker included, also where ``backend`` names one that forks (with a warning),
    and the winner is right."""
    monkeypatch.delenv(forking.START_ENV, raising=False)
    monkeypatch.setattr(forking, "_RAY_SEEN", True)

    def refuse():
        raise AssertionError("forked in a process that has run Ray")

    monkeypatch.setattr(os, "fork", refuse)
    with caplog.at_level(logging.WARNING, logger="autotuner.compile"):
        result = (AutoTuner.from_kernel(add, [dict(block_M=16), dict(block_M=32)])
                  .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
                  .set_tuning(n_jobs=n_jobs, backend=backend, progress=False, cache=False).run(1, 3))
    assert [str(t.status) for t in result.trials] == ["ok", "ok"], result.trials
    steps = order_of(result.timeline, MEASURER)
    assert "process spawned" in steps and "process forked" not in steps, steps
    warned = [r.getMessage() for r in caplog.records if "would fork" in r.getMessage()]
    assert len(warned) == (backend in ("multiprocessing", "threading")), warned
    import torch
    torch.testing.assert_close(result.kernel(torch.ones(256, 256), torch.ones(256, 256)), torch.full((256, 256), 2.0))


def test_a_process_that_may_not_fork_runs_a_compile_in_its_one_reused_loky_worker():
    there = compile_mod.in_loky_worker(os.getpid)
    assert there != os.getpid() and compile_mod.in_loky_worker(os.getpid) == there  # one worker, kept
    assert compile_mod.in_loky_worker(os.getppid) == os.getpid()


def test_the_gpus_are_asked_of_torch_not_a_forked_child_once_ray_has_run(monkeypatch):
    facts = [{"name": "NVIDIA H200", "capability": [9, 0]}]
    monkeypatch.setattr(forking, "_FACTS", {})
    monkeypatch.setattr(forking, "cuda_started", lambda: False)
    monkeypatch.setattr(forking, "_libcuda", lambda: object())  # a driver is there
    monkeypatch.setattr(forking, "_query_forked", lambda meanwhile=None: pytest.fail("forked the driver query"))
    monkeypatch.setattr(forking, "_torch_facts", lambda: facts)
    monkeypatch.setattr(forking, "_RAY_SEEN", True)
    assert forking.local_gpus() == facts


def test_the_driver_is_asked_in_a_forked_child_which_is_killed_if_it_hangs(monkeypatch):
    facts = [{"name": "NVIDIA H200", "capability": [9, 0]}]
    monkeypatch.setattr(forking, "_driver_facts", lambda: facts)
    assert forking._query_forked() == facts
    monkeypatch.setattr(forking, "_driver_facts", lambda: 1 / 0)
    assert forking._query_forked() is None
    monkeypatch.setattr(forking, "_driver_facts", lambda: time.sleep(60))
    monkeypatch.setattr(forking, "QUERY_TIMEOUT_S", 0.5)
    t0 = time.monotonic()
    assert forking._query_forked() is None and time.monotonic() - t0 < 10


def test_local_gpus_asks_once_per_visible_set_and_falls_back_to_torch(monkeypatch):
    asked = []
    monkeypatch.setattr(forking, "_FACTS", {})
    monkeypatch.setattr(forking, "_libcuda", lambda: object())  # a driver, not started here
    monkeypatch.setattr(forking, "cuda_started", lambda: False)
    monkeypatch.setattr(forking, "_query_forked", lambda meanwhile=None: asked.append("driver") or None)  # no answer
    monkeypatch.setattr(forking, "_torch_facts", lambda: asked.append("torch") or [{"name": "T", "capability": [8, 0]}])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert forking.local_gpus() == forking.local_gpus() == [{"name": "T", "capability": [8, 0]}]
    assert asked == ["driver", "torch"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    forking.local_gpus()
    assert asked == ["driver", "torch"] * 2
    monkeypatch.setattr(forking, "cuda_started", lambda: True)  # started: torch is asked, no child forked
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    forking.local_gpus()
    assert asked == ["driver", "torch"] * 2 + ["torch"]


@pytest.mark.parametrize("case", ["nvml", "no nvml", "ray imported"])
def test_resolving_the_local_gpu_imports_tilelang_while_the_driver_answers(tmp_path, case):
    """A tune asks the driver about the GPU (a forked child, 0.26-0.33 s on an H200 host) and then imports
    TileLang (1.3-2.1 s there) before it forks its measuring processes: the import runs while the driver
    answers. Not where importing TileLang would start CUDA (torch not told to ask NVML), nor in a process that
    imported Ray (its plan starts the measuring actors before this process imports TileLang)."""
    out = run_script(tmp_path, f"""
        import os, sys, time, types
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "{'0' if case == 'no nvml' else '1'}"
        if {case == 'ray imported'}:
            sys.modules["ray"] = types.ModuleType("ray")
        sys.path[:0] = {[str(p) for p in (ROOT, ROOT / "tests")]!r}
        from autotuner import forking
        from autotuner.target import resolve_target
        forking._libcuda = lambda: object()  # a driver, CUDA not started here
        forking.cuda_started = lambda: False
        forking._driver_facts = lambda: (time.sleep(1.0), [dict(name="NVIDIA H200", capability=[9, 0])])[1]
        assert "tilelang" not in sys.modules
        target = resolve_target("auto")
        print(target.spec, "|", target.device_name, "|", "tilelang" in sys.modules)
    """)
    assert out.returncode == 0, out.stderr
    spec, name, imported = (x.strip() for x in out.stdout.strip().splitlines()[-1].split("|"))
    assert spec == "{'kind': 'cuda', 'arch': 'sm_90a'}" and name == "NVIDIA H200", out.stdout
    assert imported == ("True" if case == "nvml" else "False"), out.stdout


@pytest.mark.parametrize("backend, start, want", [("loky", "fork", True), ("ray", "fork", False),
                                                   ("loky", "spawn", False)])
def test_a_plan_has_tilelang_imported_during_the_gpu_query_only_when_its_measuring_processes_fork(
        monkeypatch, backend, start, want):
    """Forked measuring processes inherit TileLang, so it is imported before them, while the driver
    answers; Ray's actors and spawned processes start before this process imports TileLang, so a plan for
    them does not ask for the import (Ray is imported only later, so ``"ray" in sys.modules`` cannot tell)."""
    import autotuner.tuner as tuner_mod

    asked = []

    class Stop(Exception):
        pass

    def resolve(target, prefetch_tilelang=True):
        asked.append(prefetch_tilelang)
        raise Stop

    monkeypatch.setattr(tuner_mod, "resolve_target", resolve)
    monkeypatch.setattr(forking, "cuda_started", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: False))  # not yet started
    monkeypatch.setenv(forking.START_ENV, start)
    t = (AutoTuner.from_kernel(add, [dict(block_M=16)]).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
         .set_tuning(n_jobs=2, progress=False, backend=backend))
    with pytest.raises(Stop):
        t.plan(1, 3)
    assert asked == [want]


def test_a_target_checked_when_it_is_set_does_not_import_tilelang(monkeypatch):
    """``set_compile_args(target="cuda")`` asks the driver then (a wrong target fails there), before the
    plan knows whether its measuring processes fork: that question leaves TileLang's import to the plan."""
    import autotuner.target as target_mod
    from autotuner.settings import CompileSettings

    asked = []
    monkeypatch.setattr(target_mod, "_local_cuda_arch", lambda prefetch_tilelang=True: asked.append(
        prefetch_tilelang) or ("sm_90a", "NVIDIA H200"))
    CompileSettings(target="cuda")
    assert asked == [False]


def test_the_driver_querys_answer_is_read_before_the_child_has_exited(monkeypatch):
    """The child closes its end of the pipe once its answer is written: the answer does not wait for the
    child's exit (an exit after starting the driver tears it down: tens of ms)."""
    facts = [{"name": "NVIDIA H200", "capability": [9, 0]}]
    monkeypatch.setattr(forking, "_driver_facts", lambda: facts)
    real_exit = os._exit
    monkeypatch.setattr(os, "_exit", lambda code: (time.sleep(3.0), real_exit(code)))  # in the child only
    t0 = time.monotonic()
    assert forking._query_forked() == facts
    assert time.monotonic() - t0 < 2.5


def test_the_driver_querys_child_holds_the_driver_until_released_or_its_time_is_up(monkeypatch):
    """Once it has answered, the child stays (holding the driver it started, so that the measuring processes
    forked next start theirs sooner) until :func:`forking.release_driver` ends it, or :data:`forking.HOLD_S`
    has passed."""
    facts = [{"name": "NVIDIA H200", "capability": [9, 0]}]
    monkeypatch.setattr(forking, "_driver_facts", lambda: facts)
    children = []
    real_fork = forking.fork_child
    monkeypatch.setattr(forking, "fork_child", lambda *a: children.append(real_fork(*a)) or children[-1])

    def ended(child, within=10.0):
        deadline = time.monotonic() + within
        while child.returncode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        return child.returncode

    assert forking._query_forked() == facts
    time.sleep(0.5)
    assert children[0].returncode is None  # answered, and still there
    forking.release_driver()
    assert ended(children[0]) == -signal.SIGKILL
    forking.release_driver()  # nothing left to end: no error

    monkeypatch.setattr(forking, "HOLD_S", 0.2)
    assert forking._query_forked() == facts
    assert ended(children[1]) == 0  # its time was up: it exited by itself
    forking.release_driver()


def test_the_holding_child_keeps_the_drivers_descriptors_and_none_of_its_parents(monkeypatch, tmp_path):
    """A pipe this process closes reaches its reader as EOF at once, not when the holding child ends; what the
    driver opened in the child (here a stand-in file) stays open there."""
    driver = tmp_path / "driver"  # stands for the device files the driver opens
    driver.write_text("")
    opened = []
    monkeypatch.setattr(forking, "_driver_facts", lambda: opened.append(os.open(driver, os.O_RDONLY)) or [])
    children = []
    real_fork = forking.fork_child
    monkeypatch.setattr(forking, "fork_child", lambda *a: children.append(real_fork(*a)) or children[-1])
    r, w = os.pipe()
    try:
        assert forking._query_forked() == []
        time.sleep(0.3)  # the child closes what it inherited once it has answered
        held = {os.readlink(f"/proc/{children[0].pid}/fd/{fd}") for fd in os.listdir(f"/proc/{children[0].pid}/fd")}
        os.close(w)
        ready, _, _ = select.select([r], [], [], 5.0)
        assert ready and os.read(r, 1) == b""  # EOF: the child holds no copy of the write end
        assert children[0].returncode is None  # still holding
        assert str(driver) in held
    finally:
        forking.release_driver()
        os.close(r)


def test_an_interrupt_while_the_driver_answers_leaves_no_open_pipe_and_no_zombie(monkeypatch):
    """Ctrl-C during what runs meanwhile (TileLang's import): the pipe is closed and the child killed and
    reaped, as on every other way out."""
    monkeypatch.setattr(forking, "_driver_facts", lambda: time.sleep(60))
    children, pipes = [], []
    real_fork, real_pipe = forking.fork_child, os.pipe
    monkeypatch.setattr(forking, "fork_child", lambda *a: children.append(real_fork(*a)) or children[-1])
    monkeypatch.setattr(os, "pipe", lambda: pipes.append(real_pipe()) or pipes[-1])

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        forking._query_forked(interrupted)
    (child,) = children
    deadline = time.monotonic() + 10
    while child.returncode is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert child.returncode == -signal.SIGKILL  # killed, and reaped (by the reaping thread)
    (r, _w), = pipes
    with pytest.raises(OSError):
        os.fstat(r)  # closed (the write end was closed as soon as the child had it)


def tune(**tuning):
    return (AutoTuner.from_kernel(add, [dict(block_M=16), dict(block_M=32)])
            .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=2, progress=False, cache=False, **tuning).run(1, 3))


def test_importing_tilecarve_has_torch_ask_nvml_unless_the_environment_says_otherwise(tmp_path):
    """TileLang's import asks ``torch.cuda.is_available()``, which starts CUDA unless torch asks NVML."""
    code = "import os, autotuner; print(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK'))"
    env = {k: v for k, v in os.environ.items() if k != forking.NVML_CHECK_ENV}
    for preset, want in ((None, "1"), ("0", "0")):
        run_env = env if preset is None else {**env, forking.NVML_CHECK_ENV: preset}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=run_env, timeout=120)
        assert out.stdout.strip() == want, (preset, out.stdout, out.stderr)


def test_a_tune_forks_its_measuring_process_unless_told_to_spawn(monkeypatch):
    monkeypatch.delenv(forking.START_ENV, raising=False)
    forked = tune()
    assert [str(t.status) for t in forked.trials] == ["ok", "ok"]
    assert "process forked" in order_of(forked.timeline, MEASURER), forked.timeline.line()
    monkeypatch.setenv(forking.START_ENV, "spawn")
    spawned = tune()
    steps = order_of(spawned.timeline, MEASURER)
    assert "process spawned" in steps and "process forked" not in steps, spawned.timeline.line()
    assert [str(t.status) for t in spawned.trials] == ["ok", "ok"]


def test_a_forked_measuring_process_that_never_starts_is_replaced_by_a_spawned_one(monkeypatch, caplog):
    """A forked child could inherit a lock that a thread of this process held at the fork; it is never ready.
    It is killed and a fresh interpreter measures instead, and every later measuring process is spawned."""
    monkeypatch.delenv(forking.START_ENV, raising=False)
    monkeypatch.setattr(bench_mod, "_FORK_FAILED", [])
    monkeypatch.setattr(bench_mod, "FORKED_READY_S", 3.0)
    monkeypatch.setattr(bench_mod, "start_device", lambda device: time.sleep(3600))  # forked children only
    with caplog.at_level(logging.WARNING, logger="autotuner.bench"):
        result = tune()
    assert [str(t.status) for t in result.trials] == ["ok", "ok"]
    steps = order_of(result.timeline, MEASURER)
    assert steps.count("process forked") == 1 and steps.count("process spawned") == 2, steps
    assert bench_mod._FORK_FAILED and any("not ready within 3 s" in r.getMessage() for r in caplog.records)
    assert "process forked" not in order_of(tune().timeline, MEASURER)


def test_measuring_processes_are_named():
    proc = bench_mod._spawn({}, "cpu")
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            with open(f"/proc/{proc.proc.pid}/comm") as f:
                if f.read().strip() == bench_mod.MEASURING_PROCESS_NAME:
                    break
            time.sleep(0.05)
        else:
            pytest.fail("the measuring process never named itself")
    finally:
        proc.conn.close()
        proc.proc.wait(30) if proc.proc.poll() is None else None
        if proc.proc.poll() is None:
            proc.proc.kill()


@pytest.mark.gpu
def test_on_the_gpu_a_fresh_process_forks_its_measuring_process_and_one_that_started_cuda_spawns(tmp_path):
    """The script's first tune, through the matmul template with target "auto" (so the carver reads the
    local GPU: ``CUDA("cuda")``), runs before anything started CUDA in it, as a script's or a benchmark's
    tune does: its measuring process is forked (seen 2026-11-22: reading the GPU through torch started CUDA,
    and every process was spawned). Loading its winner starts CUDA, so the second is spawned. Both winners
    are right, and so is every trial's status; the carver's local GPU is what torch reports."""
    out = run_script(tmp_path, """
        import json
        import torch
        from autotuner import forking
        import tilelang  # a user's script imports it (after tilecarve): it must not start CUDA
        from autotuner.job import MEASURER
        from carver.arch import CUDA
        from templates import matmul as mm

        problem = mm.MatmulProblem(512, 512, 512)
        arch = CUDA("cuda")
        report = {"started_before": forking.cuda_started()}
        for run in ("first", "second"):
            r = (mm.MATMUL.tuner(problem, mm.TuneOptions(topk=2, split_k=False, variants=False, cache=False,
                                                         progress=False, warmup=3, rep=10))
                 .run(3, 10))
            a = torch.randn(512, 512, device="cuda", dtype=torch.float16)
            b = torch.randn(512, 512, device="cuda", dtype=torch.float16)
            close = torch.allclose(r.kernel(a, b).float(), a.float() @ b.float().T, atol=1e-1, rtol=1e-2)
            steps = [e.what for e in r.timeline.sorted_events() if e.where == MEASURER]
            report[run] = {"forked": "process forked" in steps, "spawned": "process spawned" in steps,
                           "statuses": sorted({str(t.status) for t in r.trials}), "close": close}
        props = torch.cuda.get_device_properties(0)
        report["arch"] = [arch.name == props.name, arch.sm_count == props.multi_processor_count,
                          arch.memory_bytes == props.total_memory]
        print(json.dumps(report))
    """, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["started_before"] is False and report["arch"] == [True, True, True], report
    assert report["first"] == {"forked": True, "spawned": True, "statuses": ["ok"], "close": True}, report
    assert report["second"] == {"forked": False, "spawned": True, "statuses": ["ok"], "close": True}, report
