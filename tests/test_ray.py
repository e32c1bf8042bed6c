"""The Ray backend (``set_tuning(backend="ray")``, autotuner/ray_cluster.py) on a local Ray instance, C target.

One local Ray per module (2 CPUs, no GPU, no dashboard), started here the way a user starts one
(``ray.init``), which tilecarve must reuse; the GPU test comes first and starts its own. Two fake
devices (measuring actors that reserve nothing) tune configs whose cost is known in advance, one of
which crashes its actor; a second run resumes an interrupted one.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sqlite3
import sys
import time

import pytest
import torch
from test_multidevice import tuner as multidevice_tuner  # add_crashing on the C target, 2 compile workers

import autotuner.ray_cluster as ray_cluster

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="the Ray backend needs ray: pip install 'tilecarve[ray]'")

# add_crashing writes C `repeat` times over, so the winner is known: the only config with repeat=1, 16 times
# faster than the next (4 times was not enough margin for two actors on a loaded 2-core CI machine once)
WINNER = dict(block_M=32, block_N=32, repeat=1)
CONFIGS = [dict(mode="abort"), dict(block_M=16, block_N=32, repeat=16), WINNER,
           dict(block_M=32, block_N=16, repeat=16), dict(block_M=64, block_N=64, repeat=32)]


def tuner(**tuning):
    return multidevice_tuner(CONFIGS, **tuning)


@pytest.mark.gpu
@needs_ray
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs (an nvidia-h200-x2 machine: "
                    "python3 -m pytest -m gpu tests/test_ray.py)")
def test_a_matmul_tuned_on_a_local_ray_cluster_is_measured_on_every_gpu():
    import ray

    from templates import matmul as mm

    started = not ray.is_initialized()  # first in the module: its own Ray, with every core and GPU
    if started:
        ray.init(include_dashboard=False, log_to_driver=False)
    try:
        problem = mm.MatmulProblem(2048, 2048, 2048)
        configs = mm.MATMUL.space(problem)[::12]  # 24 of the 288
        result = (mm.MATMUL.tuner(problem, mm.TuneOptions(configs=configs, validate_configs=False))
                  .set_tuning(cache=False, progress=False, backend="ray").run(3, 20))
    finally:
        if started:
            ray.shutdown()
    measured = {t.device for t in result.trials if t.status == "ok"}
    assert measured == {f"ray:{i}" for i in range(torch.cuda.device_count())}, [(t.status, t.device)
                                                                                for t in result.trials]
    assert {t.device for t in result.trials if t.rounds} == {"ray:0"}
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(result.kernel(a, b).float(), (a @ b.T).float(), atol=1.0, rtol=1e-2)


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    import ray

    with pytest.MonkeyPatch.context() as mp:  # the workers share the tests' cache; set for this module only
        mp.setenv("TILELANG_CACHE_DIR", os.environ.get("TILELANG_CACHE_DIR",
                                                       str(tmp_path_factory.getbasetemp() / "tilelang-cache")))
        ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)  # alike on any host
        yield ray
        ray.shutdown()  # this process forks nothing from now on (forking.fork_safe); conftest.py runs this last


@pytest.fixture(scope="module")
def ray_run(local_ray, tmp_path_factory):
    """The result and database of a run on two fake devices, ``ray:1`` listed first; ``ray.init`` calls made
    during the run (there must be none: the running instance is reused); the pool's warnings."""
    db = tmp_path_factory.mktemp("ray") / "tuning.sqlite"
    inits: list = []
    warned = _Records()
    logging.getLogger("autotuner.devices").addHandler(warned)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(local_ray, "init", lambda *a, **k: inits.append((a, k)))
            result = tuner(backend="ray", devices=[1, 0], db_path=str(db), run_timeout=60).run(1, 3)
    finally:
        logging.getLogger("autotuner.devices").removeHandler(warned)
    return result, db, inits, warned.messages


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@needs_ray
def test_a_crash_costs_one_candidate_and_the_winner_is_the_local_runs(ray_run):
    result, _, _, warned = ray_run
    assert [t.status for t in result.trials] == ["runtime_error"] + ["ok"] * 4, result.trials
    assert "Ray measuring actor ray:" in result.trials[0].error and "died" in result.trials[0].error
    assert not [m for m in warned if "lost" in m], warned  # the crashed actor was restarted, not dropped
    local = tuner(cache=False).run(1, 3)
    assert result.config == local.config == WINNER, (result.config, local.config)
    torch.testing.assert_close(result.kernel(torch.ones(256, 256), torch.ones(256, 256)), torch.full((256, 256), 2.0))


@needs_ray
def test_every_trial_is_in_the_database_with_its_actor(ray_run):
    result, db, _, _ = ray_run
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT idx, status, device FROM trials ORDER BY idx").fetchall()
    assert [(s, d) for _, s, d in rows] == [(t.status, t.device) for t in result.trials]
    assert {d for _, _, d in rows} <= {"ray:0", "ray:1"} and None not in {d for _, _, d in rows}, rows
    assert {t.device for t in result.trials if t.rounds} == {"ray:1"}  # finalists: on the first listed


@needs_ray
def test_the_timeline_has_each_actors_start_and_candidates(ray_run):
    from test_timeline import assert_before

    result, _, _, _ = ray_run
    tl = result.timeline
    for label in ("ray:0", "ray:1"):
        assert_before(tl, ("open", label), ("opened", label), ("job end", "job"))
    for label in {t.device for t in result.trials}:
        assert_before(tl, ("opened", label), ("first measured", label), ("last measured", label),
                      ("compile and measure done", "job"))
        if label != result.trials[0].device:  # not the crashed actor, whose stamps died with it
            assert_before(tl, ("process spawned", label), ("job start", "job"), ("opened", label),
                          ("imports done", label), ("first measured", label))
            assert_before(tl, ("process up", label), ("device ready", label), ("imports done", label))
    assert_before(tl, ("pool start", "compile"), ("pool ready", "compile"), ("first compiled", "compile"),
                  ("last compiled", "compile"))
    assert sum(d["measured"] for d in tl.devices().values()) == len(CONFIGS), tl.devices()


@pytest.fixture(autouse=True)
def _nothing_kept_between_tests(request):
    """Each test starts without the actors and hosts an earlier test's runs kept, and (a moment at most) with
    the CPUs free that earlier hosts held: a host reserves the CPUs Ray reports free, and one short of its
    slots' is not kept."""
    if "local_ray" in request.fixturenames:
        ray = request.getfixturevalue("local_ray")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and sum(ray_cluster.free_cpus(ray).values()) < 2:
            time.sleep(0.1)
    yield
    ray_cluster.end_kept()


def _spy_starts(monkeypatch) -> tuple[list, list]:
    """The compile hosts (one list per start) and measuring actors started from now on."""
    hosts: list = []
    actors: list = []
    real_hosts, real_actor = ray_cluster._new_hosts, ray_cluster._new_actor

    def new_hosts(ray, preload, n_jobs):
        hosts.append(real_hosts(ray, preload, n_jobs))
        for h in hosts[-1]:
            h.ready_ref = h.up  # its ready() call, whose answer Ray keeps after the host ends
        return hosts[-1]

    def new_actor(ray, device):
        actors.append(real_actor(ray, device))
        return actors[-1]

    monkeypatch.setattr(ray_cluster, "_new_hosts", new_hosts)
    monkeypatch.setattr(ray_cluster, "_new_actor", new_actor)
    return hosts, actors


def _kept() -> dict[str, int]:
    with ray_cluster._KEPT_LOCK:
        return {k[0]: len(v) for k, v in ray_cluster._KEPT.items() if v}


def _ended(ray, call, within: float = 60.0) -> bool:
    """Whether the actor ``call`` (a method, e.g. ``actor.__ray_ready__``) asks ends within ``within`` s."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            ray.get(call.remote(), timeout=within)
        except ray.exceptions.ActorDiedError:  # not ActorUnavailableError (restarting)
            return True
        time.sleep(0.25)
    return False


@needs_ray
def test_the_plan_started_the_compile_host_the_run_took_and_the_next_run_takes_it_again(local_ray, tmp_path,
                                                                                        monkeypatch):
    """The plan starts one compile host per node (here one, with both CPUs as slots) while it plans; the run
    compiles on it rather than start another. The run keeps its host and measuring actors for this process's
    next run, which starts none (its actors measure at once: no process start on its timeline); end_kept()
    ends them."""
    monkeypatch.setattr(ray_cluster, "KEEP_S", 600.0)  # so that only end_kept() can end them within the test
    hosts, actors = _spy_starts(monkeypatch)
    configs = CONFIGS[1:]  # none crashes its actor: each actor is kept
    first = multidevice_tuner(configs, backend="ray", devices=[1, 0], cache=False, run_timeout=60).run(1, 3)
    assert first.config == WINNER
    assert len(hosts) == 1 and [h.slots for h in hosts[0]] == [2] and len(actors) == 2, (hosts, actors)
    ray_cluster._await_handbacks()  # the devices' threads hand the actors back once the run has returned
    assert _spare_hosts() == 0 and _kept() == {"ray-compile": 1, "ray": 2}, ray_cluster._KEPT

    second = multidevice_tuner(configs, backend="ray", devices=[1, 0], cache=False, run_timeout=60).run(1, 3)
    assert second.config == WINNER
    assert len(hosts) == 1 and len(actors) == 2, (hosts, actors)  # none started for the second run
    events = {(what, where) for _, what, where in second.timeline.as_dict()["events"]}
    for label in {t.device for t in second.trials}:  # a device's stamps come with its measurements
        assert ("kept from an earlier run", label) in events and ("process spawned", label) not in events, events
    ray_cluster._await_handbacks()
    assert _kept() == {"ray-compile": 1, "ray": 2}

    assert ray_cluster.end_kept() == 3 and _kept() == {}
    assert _ended(local_ray, hosts[0][0].actor.ready, within=30)
    assert all(_ended(local_ray, a.__ray_ready__, within=30) for a in actors)


@needs_ray
def test_what_a_run_keeps_ends_itself_when_no_run_takes_it(local_ray, tmp_path, monkeypatch):
    """Kept past KEEP_S with no run to take them, the compile host (with its scratch directory) and the
    measuring actors end themselves; a run then starts new ones."""
    monkeypatch.setattr(ray_cluster, "KEEP_S", 3.0)
    monkeypatch.setattr(ray_cluster, "KEEP_MARGIN_S", 1.0)
    hosts, actors = _spy_starts(monkeypatch)
    multidevice_tuner(CONFIGS[1:3], backend="ray", devices=[0, 1], cache=False, run_timeout=60).run(1, 3)
    ray_cluster._await_handbacks()
    assert _kept() == {"ray-compile": 1, "ray": 2}, ray_cluster._KEPT
    host = hosts[0][0]
    scratch = local_ray.get(host.ready_ref, timeout=60)["scratch"]
    assert _ended(local_ray, host.actor.ready) and _gone_dir(scratch)
    assert all(_ended(local_ray, a.__ray_ready__) for a in actors)
    result = multidevice_tuner(CONFIGS[1:3], backend="ray", devices=[0, 1], cache=False, run_timeout=60).run(1, 3)
    assert result.config == WINNER and len(hosts) == 2 and len(actors) == 4, (hosts, actors)


@needs_ray
def test_nothing_kept_is_used_once_a_module_it_imported_changed(local_ray, tmp_path, monkeypatch):
    """A kernel or reference edited between two runs would be compiled or checked as it was when a kept host or
    actor imported it: once the file of a module they imported changes (here the kernels' module, a copy of
    tests/kernels/c_kernels.py, its content and times left as they were: only its inode's change time moves, as
    any write moves it), the kept host and actors are ended and new ones started; so too once this process's
    import path changed."""
    import importlib

    from kernels import c_kernels

    from autotuner import AutoTuner

    copy = tmp_path / "kept_probe_kernels.py"
    copy.write_text(open(c_kernels.__file__).read())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kept_probe_kernels", raising=False)
    probe = importlib.import_module("kept_probe_kernels")
    monkeypatch.setattr(ray_cluster, "KEEP_S", 600.0)
    time.sleep(ray_cluster.STALE_MARGIN_S + 0.2)  # written well before any host or actor starts
    hosts, actors = _spy_starts(monkeypatch)

    def run():
        result = (AutoTuner.from_kernel(probe.add_crashing, CONFIGS[1:3])
                  .set_compile_args(out_idx=[-1], ref_prog=probe.ref_add, target="c")
                  .set_tuning(backend="ray", devices=[0, 1], n_jobs=2, progress=False, cache=False, run_timeout=60)
                  .run(1, 3))
        ray_cluster._await_handbacks()
        return result

    assert run().config == WINNER and len(hosts) == 1 and len(actors) == 2
    assert run().config == WINNER and len(hosts) == 1 and len(actors) == 2  # unchanged: kept, taken again
    st = os.stat(copy)
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns))  # the same times: its ctime moves
    time.sleep(ray_cluster.STALE_MARGIN_S + 0.2)  # so that the new ones start well after it
    assert run().config == WINNER and len(hosts) == 2 and len(actors) == 4, (hosts, actors)
    assert _ended(local_ray, hosts[0][0].actor.ready, within=30)
    assert all(_ended(local_ray, a.__ray_ready__, within=30) for a in actors[:2])
    assert run().config == WINNER and len(hosts) == 2 and len(actors) == 4  # the new ones are kept and taken
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    assert run().config == WINNER and len(hosts) == 3 and len(actors) == 6, (hosts, actors)


@needs_ray
def test_an_actor_whose_torch_settings_a_reference_changed_is_not_kept(local_ray, monkeypatch):
    """A reference that changes a process-wide torch setting (TF32 here) leaves it set in its measuring actor:
    the next run's reference would run under it, so the actor is not kept (the compile host is)."""
    from kernels.c_kernels import add, ref_add_setting_tf32

    from autotuner import AutoTuner

    monkeypatch.setattr(ray_cluster, "KEEP_S", 600.0)
    _, actors = _spy_starts(monkeypatch)
    was = torch.backends.cuda.matmul.allow_tf32  # the winner's check runs the reference here too: set back after
    try:
        result = (AutoTuner.from_kernel(add, [dict(block_M=16, block_N=16)])
                  .set_compile_args(out_idx=[-1], ref_prog=ref_add_setting_tf32, target="c")
                  .set_tuning(backend="ray", n_jobs=2, progress=False, cache=False, run_timeout=60).run(1, 3))
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was
    assert str(result.trials[0].status) == "ok"
    ray_cluster._await_handbacks()
    assert _kept() == {"ray-compile": 1} and len(actors) == 1
    assert _ended(local_ray, actors[0].__ray_ready__, within=30)


def test_what_makes_a_measuring_process_unfit_for_another_job(monkeypatch):
    """Changed torch settings, globals a job put into ``__main__`` (a kernel or reference defined there, whose
    next job's globals would not replace them), and the jobs served each make it unfit; else it is fit."""
    flags, main = ray_cluster._torch_flags(), set(vars(sys.modules["__main__"]))
    assert ray_cluster._unfit(flags, main, 1) is None
    assert "served" in ray_cluster._unfit(flags, main, ray_cluster.KEEP_RUNS)
    monkeypatch.setitem(vars(sys.modules["__main__"]), "tilecarve_test_global", 1)
    assert "__main__" in ray_cluster._unfit(flags, main, 1)
    monkeypatch.delitem(vars(sys.modules["__main__"]), "tilecarve_test_global")
    matmul = torch.backends.cuda.matmul  # a property of torch's cuBLAS module object: set back by hand
    was = matmul.allow_tf32
    try:
        matmul.allow_tf32 = not was
        assert "torch numerics" in ray_cluster._unfit(flags, main, 1)
    finally:
        matmul.allow_tf32 = was


def test_a_module_file_changed_after_the_start_is_stale(tmp_path, monkeypatch):
    """A module whose file changed (content, times or inode) or went away after the process started is stale;
    one untouched since is not."""
    path = tmp_path / "tilecarve_stale_probe.py"
    path.write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import tilecarve_stale_probe  # noqa: F401

    assert "tilecarve_stale_probe" in (ray_cluster._stale(time.time()) or "")  # written as this "process" began
    time.sleep(ray_cluster.STALE_MARGIN_S + 0.2)
    started = time.time()
    assert "tilecarve_stale_probe" not in (ray_cluster._stale(started) or "")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # times as they were; the inode's change time moves
    assert "tilecarve_stale_probe" in (ray_cluster._stale(started) or "")
    path.unlink()
    assert "is gone" in (ray_cluster._stale(started) or "")
    monkeypatch.delitem(sys.modules, "tilecarve_stale_probe")


@needs_ray
def test_ray_shut_down_right_after_a_run_stays_down(tmp_path):
    """A script that shuts Ray down as soon as its run returns: the run's actors were kept (or ended) before it
    returned, so nothing of it calls Ray afterwards, which would start a new local instance."""
    import subprocess

    code = ("import ray, sys, time; sys.path[:0] = sys.argv[1:]; "
            "ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False); "
            "from test_ray import CONFIGS, multidevice_tuner; "
            "r = multidevice_tuner(CONFIGS[1:3], backend='ray', devices=[0, 1], cache=False, run_timeout=60)"
            ".run(1, 3); "
            "ray.shutdown(); time.sleep(3); print('UP' if ray.is_initialized() else 'DOWN', r.config['repeat'])")
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, here, os.path.dirname(here)], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"})
    assert out.stdout.split() == ["DOWN", "1"], (out.stdout, out.stderr[-3000:])
    assert out.stderr.count("Started a local Ray instance") <= 1, out.stderr[-3000:]


@needs_ray
def test_kept_hosts_that_do_not_fit_the_next_run_are_ended(local_ray, tmp_path, monkeypatch):
    """A run with other compile slots (n_jobs), or whose kernel's module the kept fork server did not import,
    starts its own hosts; the kept ones end rather than hold their CPUs."""
    from kernels.c_kernels import add, add_crashing, ref_add

    from autotuner import AutoTuner

    monkeypatch.setattr(ray_cluster, "KEEP_S", 600.0)  # so that only being ended ends them within the test
    hosts, _ = _spy_starts(monkeypatch)
    multidevice_tuner(CONFIGS[1:3], backend="ray", cache=False, run_timeout=60).run(1, 3)
    result = (AutoTuner.from_kernel(add_crashing, CONFIGS[1:3])
              .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
              .set_tuning(backend="ray", n_jobs=1, progress=False, cache=False, run_timeout=60).run(1, 3))
    assert result.config == WINNER and len(hosts) == 2 and [h.slots for h in hosts[1]] == [1], hosts
    assert _ended(local_ray, hosts[0][0].actor.ready, within=30)
    assert _kept()["ray-compile"] == 1

    monkeypatch.setattr(ray_cluster, "_kernel_modules", lambda kernels: ["kernels.c_kernels", "json"])
    (AutoTuner.from_kernel(add, [dict(block_M=16, block_N=16)])
     .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
     .set_tuning(backend="ray", n_jobs=1, progress=False, cache=False, run_timeout=60).run(1, 3))
    assert len(hosts) == 3 and _ended(local_ray, hosts[1][0].actor.ready, within=30), hosts


def _spare_hosts() -> int:
    from autotuner import spares

    return sum(spares.count(kind) for kind in spares.kinds() if kind[0] == "ray-compile")


@needs_ray
def test_the_running_ray_instance_is_reused(ray_run, local_ray):
    _, _, inits, _ = ray_run
    assert inits == [] and len(local_ray.nodes()) == 1


@needs_ray
def test_a_ray_driver_forks_nothing_while_connected_or_after_shutdown(ray_run, tmp_path):
    """Ray's threads outlive ``ray.shutdown()``; children forked after it died in CI (autotuner/forking.py)."""
    import subprocess

    from autotuner import compile as compile_mod
    from autotuner import forking

    assert not forking.fork_safe() and not forking.can_fork("cpu") and compile_mod.default_backend() == "loky"
    code = ("import ray; from autotuner import forking; print(forking.fork_safe()); "
            "ray.init(num_cpus=1, num_gpus=0, include_dashboard=False, log_to_driver=False); ray.shutdown(); "
            "forking._RAY_SEEN = False; print(forking.fork_safe())")  # what a shut-down Ray leaves must tell
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env={**{k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
                              "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.stdout.split() == ["True", "False"], (out.stdout, out.stderr[-2000:])


@needs_ray
def test_a_ray_worker_compiles_without_forking_a_python_child(local_ray):
    """A Ray worker has Ray's threads, so a compile host forks nothing itself: its compiles are children of
    its fork server (a fresh interpreter). Here a host in a Ray task compiles with ``os.fork`` made to raise
    in that Ray worker."""
    from kernels.c_kernels import add

    from autotuner.compile import cloudpickle_module, kernel_globals, kernel_sources
    from autotuner.target import resolve_target

    task = (cloudpickle_module().dumps(add), kernel_globals(add), kernel_sources(add), 0, dict(block_M=16, block_N=16),
            resolve_target("c").spec, None, 120.0, os.getpid(), None)

    def in_a_ray_worker(task):  # nested, so that Ray pickles it by value
        import os
        from multiprocessing import spawn

        from autotuner import forking
        from autotuner.ray_cluster import CompileHost

        def refuse():
            raise AssertionError("forked in a Ray worker")

        fork, os.fork = os.fork, refuse
        prepare = spawn.get_preparation_data  # the host changes it for its process, a pooled worker here
        host = None
        try:
            host = CompileHost(["kernels.c_kernels"])
            return forking.fork_safe(), host.ready()["up_s"], host.compile(*task)
        finally:
            os.fork, spawn.get_preparation_data = fork, prepare
            if host is not None:
                host.claim()  # not to end itself (and this worker) later
                host.shutdown()

    remote = local_ray.remote(in_a_ray_worker).options(num_cpus=1, **ray_cluster.run_options(local_ray))
    safe, up_s, outcome = local_ray.get(remote.remote(task), timeout=300)
    assert safe is False and up_s >= 0 and outcome.status == "ok", outcome


def _compile_on_ray(kernel, configs, n_jobs=2, timeout=120.0):
    from autotuner.compile import CompileBatch, compile_many
    from autotuner.target import resolve_target

    batch = CompileBatch(kernel, configs, range(len(configs)), resolve_target("c").spec, timeout)
    return compile_many([batch], n_jobs=n_jobs, backend="ray")


@needs_ray
def test_a_compile_process_killed_from_outside_costs_its_config_only(local_ray):
    from kernels.c_kernels import add_killing_worker

    configs = [dict(block_M=16), dict(block_M=32, kill_worker=True), dict(block_M=64), dict(block_M=128)]
    outcomes = {o.index: o for o in _compile_on_ray(add_killing_worker, configs)}
    assert sorted(outcomes) == [0, 1, 2, 3]
    assert [outcomes[i].status for i in (0, 2, 3)] == ["ok"] * 3, outcomes
    assert outcomes[1].status == "compile_error" and "killed from outside" in outcomes[1].error, outcomes[1]


def _host_killer(ray, hosts, pidfile):
    """A thread that waits for the hanging compile's pid in ``pidfile``, then kills the host (of ``hosts``)
    whose compile it is, as if its node were lost; ``killed`` gets that host, and the compiler's pid."""
    import threading

    pids = {ray.get(h.actor.ready.remote(), timeout=120)["pid"]: h for h in hosts}
    killed: list = []

    def kill_the_host_of_the_hanging_compile():
        deadline = time.monotonic() + 120
        while not pidfile.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.2)  # the pid written
        pid = compiler = int(pidfile.read_text())
        while pid > 1 and pid not in pids:  # up from the compiler process to the host's actor
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        killed.extend([pids.get(pid), compiler])
        ray.kill(pids[pid].actor, no_restart=True)

    thread = threading.Thread(target=kill_the_host_of_the_hanging_compile, daemon=True)
    thread.start()
    return thread, killed


def _gone(pid: int, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    return not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def _one_slot_hosts(ray, monkeypatch, n, n_jobs):
    """``n`` compile hosts of one slot each on this node (as on ``n`` nodes), kept as a plan keeps them."""
    from autotuner import spares

    node = ray.nodes()[0]["NodeID"]
    monkeypatch.setattr(ray_cluster, "host_slots", lambda ray, n_jobs: {node: 1})
    hosts = [h for _ in range(n) for h in ray_cluster._new_hosts(ray, ["kernels.c_kernels"], 1)]
    for h in hosts:
        spares.keep(ray_cluster._spare_kind(n_jobs), h)
    return hosts


@needs_ray
@pytest.mark.parametrize("n_hosts, restarts, told", [(2, 0, "go to the other hosts"),
                                                      (1, 2, "go to a host started again on node")])
def test_a_lost_compile_host_hands_its_compiles_on(local_ray, tmp_path, monkeypatch, caplog, n_hosts, restarts, told):
    """Hosts of one slot each (as on as many nodes); the one compiling the first config is killed (as if its
    node were lost): with two and no restarts (its node gone), that config is compiled again on the other;
    with one, its node still alive, a new host is started there. Every config comes back right (none recorded
    as failed), and the lost host's compile process ends with it."""
    from kernels.c_kernels import add_hanging

    monkeypatch.setattr(ray_cluster, "HOST_RESTARTS", restarts)
    hosts = _one_slot_hosts(local_ray, monkeypatch, n_hosts, n_hosts)
    pidfile = tmp_path / "pid"
    killer, killed = _host_killer(local_ray, hosts, pidfile)
    configs = [dict(block_M=16, pidfile=str(pidfile)), dict(block_M=32), dict(block_M=64)]
    with caplog.at_level(logging.WARNING, logger="autotuner.ray_cluster"):
        outcomes = {o.index: o for o in _compile_on_ray(add_hanging, configs, n_jobs=n_hosts)}
    killer.join(5)
    assert killed and killed[0] is not None, killed
    assert sorted(outcomes) == [0, 1, 2] and all(o.status == "ok" for o in outcomes.values()), outcomes
    assert any("was lost" in r.getMessage() and told in r.getMessage() for r in caplog.records), caplog.records
    assert _gone(killed[1])


@needs_ray
def test_with_no_compile_host_left_the_run_stops_rather_than_record_what_it_did_not_try(local_ray, tmp_path,
                                                                                        monkeypatch):
    """Its only host lost and none to be started (its node's restarts spent): an error that says so, and no
    config is reported as a compile error (a re-run would never try it again)."""
    from kernels.c_kernels import add_hanging

    monkeypatch.setattr(ray_cluster, "HOST_RESTARTS", 0)
    hosts = _one_slot_hosts(local_ray, monkeypatch, 1, 1)
    pidfile = tmp_path / "pid"
    killer, _ = _host_killer(local_ray, hosts, pidfile)
    configs = [dict(block_M=16, pidfile=str(pidfile)), dict(block_M=32), dict(block_M=64)]
    seen = []
    with pytest.raises(RuntimeError, match=r"no Ray compile host is left for this run \(the host on node .* was "
                                           r"lost .*3 config\(s\) were not compiled.*run again to resume"):
        for outcome in _compile_on_ray(add_hanging, configs, n_jobs=1):
            seen.append(outcome)
    killer.join(5)
    assert seen == []


@needs_ray
def test_a_compile_host_starts_when_other_ray_work_holds_every_cpu(local_ray, monkeypatch):
    """A host reserves only the CPUs free on its node; asking for all of them, it waited for them forever."""
    from kernels.c_kernels import add

    monkeypatch.setattr(ray_cluster, "HOST_START_TIMEOUT_S", 60.0)

    class Holder:
        def ready(self):
            return True

    holder = local_ray.remote(Holder).options(num_cpus=2).remote()
    try:
        local_ray.get(holder.ready.remote(), timeout=60)
        assert ray_cluster.free_cpus(local_ray) == {local_ray.nodes()[0]["NodeID"]: 0.0}
        configs = [dict(block_M=m) for m in (16, 32, 64)]
        outcomes = list(_compile_on_ray(add, configs, n_jobs=2))
    finally:
        local_ray.kill(holder)
    assert sorted(o.index for o in outcomes) == [0, 1, 2] and all(o.status == "ok" for o in outcomes), outcomes


@needs_ray
def test_a_compile_host_no_job_takes_ends_itself_and_its_files(local_ray, monkeypatch):
    """Hosts a plan started for a job that never came (a plan not tuned, in a notebook that lives on) end
    themselves, removing their scratch directory; a run's hosts, kept for the next run, remove theirs when
    they end."""
    from kernels.c_kernels import add

    from autotuner import spares

    configs = [dict(block_M=m) for m in (16, 32)]
    ray_cluster.prestart_compile_hosts(add, 2)
    taken = spares.take(ray_cluster._spare_kind(2))
    spares.keep(ray_cluster._spare_kind(2), taken)
    run_scratch = local_ray.get(taken.actor.ready.remote(), timeout=120)["scratch"]
    assert os.path.isdir(run_scratch)
    assert all(o.status == "ok" for o in _compile_on_ray(add, configs))
    assert os.path.isdir(run_scratch) and _kept() == {"ray-compile": 1}  # kept for the next run, its files too
    ray_cluster.end_kept()
    assert _gone_dir(run_scratch)

    monkeypatch.setattr(ray_cluster, "UNCLAIMED_EXIT_S", 3.0)
    ray_cluster.prestart_compile_hosts(add, 2)
    host = spares.take(ray_cluster._spare_kind(2))  # as a plan that never reaches its job leaves it
    scratch = local_ray.get(host.actor.ready.remote(), timeout=120)["scratch"]
    deadline = time.monotonic() + 60
    with pytest.raises(local_ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            local_ray.get(host.actor.ready.remote(), timeout=60)
            time.sleep(0.5)
    assert _gone_dir(scratch)


def _gone_dir(path: str, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not os.path.exists(path)


@needs_ray
def test_a_plan_that_fails_ends_what_the_plans_before_it_started(local_ray, tmp_path, monkeypatch):
    """``tune_all`` plans inside its cleanup: the first plan's compile hosts and measuring actor are ended when
    a later plan raises (here as Ctrl-C would), not left holding the cluster's CPUs."""
    from autotuner import spares
    from autotuner.job import tune_all

    first = tuner(backend="ray", db_path=str(tmp_path / "db.sqlite"), run_timeout=60)
    second = tuner(backend="ray", db_path=str(tmp_path / "db.sqlite"), run_timeout=60)

    started: list = []

    def interrupted():
        started.extend(s.actor for ss in spares._SPARES.values() for s in ss)  # the first plan's
        assert _spare_hosts() >= 1, spares._SPARES
        raise KeyboardInterrupt

    monkeypatch.setattr(second, "plan", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune_all([first, second])
    assert _spare_hosts() == 0 and not any(spares._SPARES.values()), spares._SPARES
    for actor in started:  # ended, not just forgotten
        with pytest.raises(local_ray.exceptions.RayActorError):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                local_ray.get(actor.__ray_ready__.remote(), timeout=60)
                time.sleep(0.5)


@needs_ray
def test_a_config_the_fork_server_cannot_be_sent_costs_only_itself(local_ray, caplog):
    """A config Ray carries (cloudpickle) but the fork server's pickle cannot (a lambda in it) is that config's
    compile error; its host is not taken as lost, and the others compile."""
    from kernels.c_kernels import add

    configs = [dict(block_M=16, block_N=lambda: 16), dict(block_M=32), dict(block_M=64), dict(block_M=128)]
    with caplog.at_level(logging.WARNING, logger="autotuner.ray_cluster"):
        outcomes = {o.index: o for o in _compile_on_ray(add, configs)}
    assert outcomes[0].status == "compile_error" and "cannot be sent to its compile process" in outcomes[0].error
    assert [outcomes[i].status for i in (1, 2, 3)] == ["ok"] * 3, outcomes
    assert not [r for r in caplog.records if "lost" in r.getMessage()], caplog.records


@needs_ray
def test_a_config_that_brings_its_host_down_is_found_out_alone_and_the_others_compile(local_ray, monkeypatch, caplog):
    """The host compiling it is killed each time: the configs beside it are compiled again, and it is compiled
    alone on a host started again, whose loss makes it (and only it) a compile error."""
    from kernels.c_kernels import add_killing_its_ray_host

    from autotuner import spares

    spares.close_all()  # none an earlier test left: this one's hosts have two slots
    node = local_ray.nodes()[0]["NodeID"]
    monkeypatch.setattr(ray_cluster, "host_slots", lambda ray, n_jobs: {node: 2})
    configs = [dict(block_M=16, kill_host=True), dict(block_M=32), dict(block_M=64), dict(block_M=128)]
    with caplog.at_level(logging.WARNING, logger="autotuner.ray_cluster"):
        outcomes = {o.index: o for o in _compile_on_ray(add_killing_its_ray_host, configs, n_jobs=2)}
    assert outcomes[0].status == "compile_error" and "alone" in outcomes[0].error, outcomes[0]
    assert [outcomes[i].status for i in (1, 2, 3)] == ["ok"] * 3, outcomes
    assert sum("was lost" in r.getMessage() for r in caplog.records) == 3  # in flight twice, then alone


def test_a_suspect_runs_alone_and_the_configs_behind_it_go_to_busy_hosts():
    pool = ray_cluster._HostPool.__new__(ray_cluster._HostPool)
    pool.tries = {0: 2, 1: 0, 2: 2, 3: 1}
    queue = pool.queue = ray_cluster.deque([(None,) * 3 + (i,) for i in range(4)])
    assert pool._next(idle=False)[3] == 1  # past the suspect at the head
    assert pool._next(idle=False)[3] == 3
    assert pool._next(idle=False) is None  # only suspects left: for idle hosts
    assert pool._next(idle=True)[3] == 0 and len(queue) == 1


def test_a_lost_host_is_started_again_on_its_node_while_alive_else_on_a_free_one():
    class Cluster:
        alive = {"a": True, "b": True, "c": True}

        def nodes(self):
            return [{"NodeID": k, "Alive": v, "Resources": {"CPU": {"a": 8, "b": 4, "c": 16}[k]}}
                    for k, v in self.alive.items()]

    pool = ray_cluster._HostPool.__new__(ray_cluster._HostPool)
    pool.ray, pool.restarts = Cluster(), {}
    pool.hosts = [ray_cluster._Host(None, 0.0, "", "a", 8, 8, up=False), ray_cluster._Host(None, 0.0, "", "b", 4, 4)]
    assert pool._restart_node("a", avoid="a") == "c"  # where a host in its place could not start
    assert pool._restart_node("a") == "a"  # alive: there again
    pool.ray.alive = {"a": False, "b": True, "c": True}
    assert pool._restart_node("a") == "c"  # gone: a node without a host of the run, the most CPUs first
    pool.restarts = {"c": ray_cluster.HOST_RESTARTS}
    assert pool._restart_node("a") is None  # b has the run's other host, c has had its restarts


@needs_ray
def test_stopping_early_ends_the_compiles_still_running(local_ray, tmp_path):
    from kernels.c_kernels import add_hanging

    pidfile = tmp_path / "pid"
    outcomes = _compile_on_ray(add_hanging, [dict(block_M=16), dict(block_M=32, pidfile=str(pidfile))])
    assert next(outcomes).status == "ok"
    deadline = time.monotonic() + 120
    while not pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(pidfile.read_text())
    outcomes.close()
    deadline = time.monotonic() + 20
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


@needs_ray
def test_a_rerun_measures_only_what_the_interrupted_run_did_not_record(ray_run, monkeypatch):
    _, db, _, _ = ray_run
    with sqlite3.connect(db) as conn:  # as if the run had been killed before these two trials and its end
        conn.execute("UPDATE runs SET finished=NULL, best_config=NULL")
        conn.execute("DELETE FROM trials WHERE idx IN (2, 4)")
    compiled: list[dict] = []
    real = ray_cluster.compile_on_ray

    def spy(tasks, n_jobs, kernels):
        compiled.extend(t[4] for t in tasks)  # (payload, globals, sources, position, config, ...)
        return real(tasks, n_jobs, kernels)

    monkeypatch.setattr(ray_cluster, "compile_on_ray", spy)
    result = tuner(backend="ray", devices=[1, 0], db_path=str(db), run_timeout=60).run(1, 3)
    assert compiled == [CONFIGS[2], CONFIGS[4]]  # the crashing config 0 and the others were not run again
    assert result.config == WINNER and not result.from_cache
    assert [t.status for t in result.trials] == ["runtime_error"] + ["ok"] * 4


@needs_ray
def test_a_job_of_several_problems_runs_on_one_set_of_actors(local_ray, tmp_path, monkeypatch):
    """tune_all on Ray (issue 13's model-scale jobs): three problems, one compile stream storing each kernel
    once, one actor per device holding every problem, each problem's winner right."""
    from kernels.c_kernels import add, ref_add

    from autotuner import AutoTuner, tune_all

    actors: list = []
    real_init = ray_cluster.RayBench.__init__

    def spy(self, specs, run_timeout, device):
        actors.append((device.label, len(specs)))
        real_init(self, specs, run_timeout, device)

    monkeypatch.setattr(ray_cluster.RayBench, "__init__", spy)
    released: list = []  # (device, sid, what went wrong): a release nobody waits on must still work
    real_release = ray_cluster.RayBench.release

    def release(self, sid):
        try:
            real_release(self, sid)
            released.append((self.device.label, sid, None))
        except Exception as e:  # noqa: BLE001 - recorded for the assertion
            released.append((self.device.label, sid, repr(e)))
            raise

    monkeypatch.setattr(ray_cluster.RayBench, "release", release)
    plans = [AutoTuner.from_kernel(add, [dict(block_M=m, block_N=n) for m in (16, 32)])
             .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
             .set_tuning(backend="ray", devices=[1, 0], progress=False, db_path=str(tmp_path / "db.sqlite"))
             .plan(1, 3) for n in (16, 32, 64)]
    results = tune_all(plans)
    assert sorted(actors) == [("ray:0", 3), ("ray:1", 3)]  # one actor per device for the whole job
    assert [r for r in released if r[2] is not None] == []
    assert {(d, sid) for d, sid, _ in released} >= {(d, sid) for d in ("ray:0", "ray:1") for sid in range(3)}
    assert len({r.key for r in results}) == 3
    for r in results:
        assert [str(t.status) for t in r.trials] == ["ok", "ok"]
        assert {t.device for t in r.trials if t.rounds} == {"ray:1"}  # finalists on the first listed
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        torch.testing.assert_close(r.kernel(a, b), a + b)


@needs_ray
def test_devices_on_ray_are_actors_counted_from_the_cluster(local_ray, monkeypatch):
    assert [d.label for d in ray_cluster.resolve_ray_devices(None, "c", None, False)] == ["ray:0"]
    assert [d.label for d in ray_cluster.resolve_ray_devices("all", "c", None, False)] == ["ray:0", "ray:1"]
    assert [d.label for d in ray_cluster.resolve_ray_devices([2, 0], "c", None, False)] == ["ray:2", "ray:0"]
    with pytest.raises(ValueError, match="has no GPUs"):
        ray_cluster.resolve_ray_devices(None, "cuda", "NVIDIA H200", False)
    monkeypatch.setattr(local_ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 2.0})  # two GPU nodes' worth
    gpus = ray_cluster.resolve_ray_devices(None, "cuda", "NVIDIA H200", False)
    assert [(d.label, d.name) for d in gpus] == [("ray:0", "NVIDIA H200"), ("ray:1", "NVIDIA H200")]
    assert ray_cluster.resolve_ray_devices([1], "cuda", "NVIDIA H200", True)[0].name == ray_cluster.ANY_MODEL
    with pytest.raises(ValueError, match=r"has 2 GPU\(s\), so 3 measuring actors.*at most 2"):
        ray_cluster.resolve_ray_devices([0, 1, 2], "cuda", "NVIDIA H200", False)


@needs_ray
def test_connect_uses_the_running_instance_else_ray_address_else_starts_one(monkeypatch):
    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_cluster.connect()
    ray_cluster.connect()  # now initialised: no second start
    assert calls == [{"include_dashboard": False, "log_to_driver": False}]
    calls.clear()
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.7:6379")
    ray_cluster.connect()
    assert calls == [{"address": "10.0.0.7:6379"}]


def test_ray_measures_in_actors_so_isolate_false_is_refused():
    with pytest.raises(ValueError, match="backend='ray' measures in Ray actors.*isolate=True"):
        tuner(backend="ray", isolate=False)



@needs_ray
def test_no_more_compiles_run_at_once_than_n_jobs(local_ray, monkeypatch):
    from kernels.c_kernels import add

    in_flight: list[int] = []

    class Spy:
        def __getattr__(self, name):
            return getattr(local_ray, name)

        def wait(self, refs, **kwargs):
            in_flight.append(len(refs))
            return local_ray.wait(refs, **kwargs)

    monkeypatch.setattr(ray_cluster, "connect", Spy)
    configs = [dict(block_M=m, block_N=n) for m in (16, 32) for n in (16, 64)]
    outcomes = list(_compile_on_ray(add, configs, n_jobs=1))
    assert sorted(o.index for o in outcomes) == [0, 1, 2, 3] and all(o.status == "ok" for o in outcomes), outcomes
    assert max(in_flight) == 1, in_flight  # the host's ready() call, then one compile at a time


@pytest.mark.parametrize("cpus, n_jobs, want", [
    ([32], None, [32]),              # an nvidia-h200-x2 host: every CPU
    ([32, 16], -1, [32, 16]),
    ([32, 16], 12, [8, 4]),          # n_jobs shared in proportion
    ([32, 16, 16], 2, [1, 1]),       # at least one on each node used, biggest first
    ([32, 0], 100, [32]),            # a node without CPUs gets none
])
def test_compile_slots_per_node(cpus, n_jobs, want):
    class Cluster:
        @staticmethod
        def nodes():
            return [{"NodeID": f"n{i}", "Alive": True, "Resources": {"CPU": float(c)}} for i, c in enumerate(cpus)]

    assert list(ray_cluster.host_slots(Cluster(), n_jobs).values()) == want


@needs_ray
def test_the_runtime_env_is_passed_unless_a_worker_already_imports_as_this_process(local_ray, monkeypatch):
    """Ray's own idle workers are used (no runtime env) only when one of them reports this process's import
    path and TileLang cache directory; pytest's test directories are not on a Ray worker's path."""
    monkeypatch.setattr(ray_cluster, "_NEEDS_ENV", {})
    assert ray_cluster.run_options(local_ray) == {"runtime_env": ray_cluster.worker_runtime_env()}

    def same_everywhere():
        return ["/nowhere"], None

    monkeypatch.setattr(ray_cluster, "_NEEDS_ENV", {})
    monkeypatch.setattr(ray_cluster, "_import_path", same_everywhere)
    assert ray_cluster.run_options(local_ray) == {}

    driver = os.getpid()

    def fails_on_workers():
        if os.getpid() != driver:
            raise ImportError("a worker that cannot import the probe")
        return ["/nowhere"], None

    monkeypatch.setattr(ray_cluster, "_NEEDS_ENV", {})
    monkeypatch.setattr(ray_cluster, "_import_path", fails_on_workers)
    assert ray_cluster.run_options(local_ray)["runtime_env"]["env_vars"]["PYTHONPATH"] == "/nowhere"


@needs_ray
def test_the_runtime_env_is_asked_about_again_once_the_import_path_changes(local_ray, monkeypatch):
    """A path this process adds between two runs (a notebook's ``sys.path.insert``) is one Ray's workers
    lack: the second run passes the runtime env again rather than reuse the first run's answer."""
    driver, mine = os.getpid(), ["/nowhere"]

    def worker_lacks_what_is_added():
        return (list(mine) if os.getpid() == driver else ["/nowhere"]), None

    monkeypatch.setattr(ray_cluster, "_NEEDS_ENV", {})
    monkeypatch.setattr(ray_cluster, "_import_path", worker_lacks_what_is_added)
    assert ray_cluster.run_options(local_ray) == {}
    mine.insert(0, "/added")
    assert ray_cluster.run_options(local_ray)["runtime_env"]["env_vars"]["PYTHONPATH"] == "/added:/nowhere"


@needs_ray
def test_what_an_earlier_ray_session_left_is_never_used(local_ray):
    """After ``ray.shutdown()`` and a new ``ray.init`` (a new local instance, whose first job has the same
    id as the last one's: 01000000), the earlier session's spare compile hosts and actors are left behind,
    closed without a call to Ray, and the compiles run on new hosts."""
    from kernels.c_kernels import add

    from autotuner import spares

    ray_cluster.prestart_compile_hosts(add, 2)
    old = ray_cluster._Spare(actor=object(), spawned=time.time(), job=ray_cluster._session(local_ray))
    assert old.alive() and spares.count(ray_cluster._spare_kind(2)) == 1
    local_ray.shutdown()
    local_ray.init(num_cpus=2, num_gpus=0, include_dashboard=False, log_to_driver=False)
    assert not old.alive()
    spares.keep(("ray", "test-kind"), old)
    assert spares.take(("ray", "test-kind")) is None  # closed as stale: old.close() did not touch Ray
    assert spares.count(ray_cluster._spare_kind(2)) == 0
    configs = [dict(block_M=m, block_N=n) for m in (16, 32) for n in (16, 64)]
    outcomes = list(_compile_on_ray(add, configs))
    assert sorted(o.index for o in outcomes) == [0, 1, 2, 3] and all(o.status == "ok" for o in outcomes), outcomes


def test_the_import_path_asked_about_does_not_change_when_tilelang_is_imported(monkeypatch):
    """TileLang puts its TVM and libraries on ``sys.path`` when imported, in this process halfway through a
    run's plan and in each worker when it first compiles: left out of the path compared, so that a run's
    compiles are not asked about again, and sent to new workers, after its warm-ups (seen 2026-11-22)."""
    own = ray_cluster._tilelang_dir()
    assert own is not None and os.path.isdir(os.path.join(own, "3rdparty"))
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.abspath(p or ".").startswith(own)])
    before = ray_cluster._import_path()  # as before TileLang's import
    monkeypatch.setattr(sys, "path", [*sys.path, os.path.join(own, "3rdparty", "tvm", "python"),
                                      os.path.join(own, "lib")])
    assert ray_cluster._import_path() == before
    monkeypatch.setattr(sys, "path", [*sys.path, "/elsewhere"])
    assert ray_cluster._import_path()[0] == [*before[0], "/elsewhere"]


def test_a_source_checkouts_tilelang_paths_are_left_out_too(monkeypatch, tmp_path):
    """In a source checkout TileLang adds its checkout's build/ and 3rdparty/ directories and
    TVM_IMPORT_PYTHON_PATH (tilelang/env.py), outside its package directory (found in review)."""
    root = tmp_path / "tilelang-src"
    (root / "tilelang").mkdir(parents=True)
    (root / "3rdparty" / "tvm" / "python").mkdir(parents=True)
    monkeypatch.setattr(ray_cluster, "_tilelang_dir", lambda: str(root / "tilelang"))
    monkeypatch.setenv("TVM_IMPORT_PYTHON_PATH", str(tmp_path / "tvm-elsewhere"))
    monkeypatch.setattr(sys, "path", ["/user/code"])
    before = ray_cluster._import_path()
    monkeypatch.setattr(sys, "path", ["/user/code", str(root / "build" / "lib"), str(root / "build" / "tvm"),
                                      str(root / "3rdparty" / "tvm" / "python"), str(tmp_path / "tvm-elsewhere")])
    assert ray_cluster._import_path() == before == (["/user/code"], os.environ.get("TILELANG_CACHE_DIR"))


@pytest.mark.parametrize("n_jobs", [0, -2, 1.5, True])
def test_compiling_refuses_an_n_jobs_that_is_not_a_count_of_workers(n_jobs):
    """Called directly (as ``set_tuning`` would have refused it): 0 or -2 made every config a compile error."""
    from kernels.c_kernels import add

    with pytest.raises((ValueError, TypeError), match="n_jobs must be"):
        _compile_on_ray(add, [dict(block_M=16)], n_jobs=n_jobs)


@needs_ray
def test_a_measuring_actor_no_job_takes_ends_itself(local_ray, monkeypatch):
    """As a compile host does: a measuring actor a plan started (holding a GPU, on a cluster with GPUs) ends
    itself when no job calls it in time."""
    from autotuner import spares

    monkeypatch.setattr(ray_cluster, "UNCLAIMED_EXIT_S", 2.0)
    ray_cluster.prestart_actors(1, "cpu")
    spare = spares.take(("ray", "cpu"))
    deadline = time.monotonic() + 90
    with pytest.raises(local_ray.exceptions.RayActorError):  # Ray's own ready call claims nothing
        while time.monotonic() < deadline:
            local_ray.get(spare.actor.__ray_ready__.remote(), timeout=60)
            time.sleep(0.5)
