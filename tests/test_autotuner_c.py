"""The autotuner end to end on TileLang's C target: real compilation, checking, timing, caching.

Each test compiles a handful of tiny kernels (about half a second each on one core)."""

from __future__ import annotations

import linecache
import sqlite3
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
import torch
from kernels import c_kernels
from kernels.c_kernels import add, add_buggy, add_failing, ref_add

from autotuner import AutoTuner, TuningError
from autotuner.cache import cache_dir

GRID = [dict(block_M=bm, block_N=bn) for bm in (32, 64) for bn in (16, 32, 64)]


def tune(kernel, configs, backend=None, **compile_args):
    compile_args.setdefault("out_idx", [-1])
    compile_args.setdefault("ref_prog", ref_add)
    compile_args.setdefault("target", "c")
    return (AutoTuner.from_kernel(kernel, configs).set_compile_args(**compile_args)
            .set_tuning(n_jobs=2, backend=backend).run(1, 5))


def by_cfg(result):
    return {tuple(sorted(t.config.items())): t for t in result.trials}


def test_parallel_tuning_picks_the_fastest_correct_config():
    result = tune(add_buggy, GRID)
    trials = by_cfg(result)
    assert len(result.trials) == len(GRID)
    for t in result.trials:
        expected = {16: "mismatch", 32: "ok", 64: "mismatch"}[t.config["block_N"]]
        assert t.status == expected, t
        assert t.compile_s is not None and t.compile_s > 0
    unwritten = trials[(("block_M", 32), ("block_N", 64))]
    assert "NaN" in unwritten.error  # the half of C it never wrote is caught by the poison
    ok = [t for t in result.trials if t.status == "ok"]
    assert all(t.median_ms > 0 and t.min_ms <= t.median_ms and t.iqr_ms >= 0 for t in ok)
    assert result.latency == min(t.median_ms for t in ok)
    assert result.config["block_N"] == 32
    assert result.ref_latency is not None and result.ref_latency > 0
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(result.kernel(a, b), a + b)
    assert not result.from_cache
    assert "ok" in result.summary()


def test_max_mismatched_ratio_takes_effect():
    cfg = [dict(block_M=32, block_N=64)]  # leaves exactly half of C unwritten
    with pytest.raises(TuningError, match="1 mismatch"):
        tune(add_buggy, cfg)
    assert tune(add_buggy, cfg, max_mismatched_ratio=0.6).trials[0].status == "ok"


def test_compile_failures_are_recorded_and_never_fatal():
    configs = [dict(block_M=32), dict(block_M=0), dict(block_M=48), dict(block_M=64)]
    result = tune(add_failing, configs)
    status = {t.config["block_M"]: t for t in result.trials}
    assert status[0].status == "compile_error" and "block_M must be positive" in status[0].error
    assert status[48].status == "compile_error" and status[48].error
    assert status[32].status == status[64].status == "ok"


@pytest.mark.parametrize("backend", ["multiprocessing", "loky"])
def test_hung_compile_is_killed_at_its_timeout(backend):
    configs = [dict(block_M=32), dict(block_M=64, hang=True)]
    t0 = time.perf_counter()
    result = tune(add_failing, configs, compile_timeout=10, backend=backend)
    assert time.perf_counter() - t0 < 60
    hung = [t for t in result.trials if t.config.get("hang")][0]
    assert hung.status == "timeout" and "compile_timeout=10" in hung.error
    assert 10 <= hung.compile_s < 40
    assert result.config == dict(block_M=32)


def test_validate_rejects_before_compiling():
    def validate(cfg):
        return [f"block_M={cfg['block_M']} too large; use <= 32"] if cfg["block_M"] > 32 else []

    result = (AutoTuner.from_kernel(add, [dict(block_M=32), dict(block_M=64)], validate=validate)
              .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c").set_tuning(n_jobs=1).run(1, 3))
    rejected = [t for t in result.trials if t.config["block_M"] == 64][0]
    assert rejected.status == "resource_error" and rejected.compile_s is None and "too large" in rejected.error


@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_a_config_validate_cannot_judge_costs_that_config_only(fault):
    """validate runs in the tuning process: one that raises for a config, or does not return within
    compile_timeout, refuses that config (a resource_error saying so); the other plans of the job go on."""
    from autotuner import tune_all

    def validate(cfg):
        if cfg["block_M"] == 64:
            if fault == "hang":
                time.sleep(3600)
            return {16: []}[cfg["block_M"] * 2]  # a KeyError, as a table lookup that misses
        return []

    def tuner(configs, v=None):
        return (AutoTuner.from_kernel(add, configs, validate=v)
                .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c", compile_timeout=6)
                .set_tuning(n_jobs=1, progress=False))

    good, bad = tune_all([tuner([dict(block_M=16), dict(block_M=32)]),
                          tuner([dict(block_M=32), dict(block_M=64)], validate)], errors="return")
    assert good.config in (dict(block_M=16), dict(block_M=32)) and bad.config == dict(block_M=32)
    refused = bad.trials[1]
    assert refused.status == "resource_error" and refused.compile_s is None, refused
    assert ("within 6 s" if fault == "hang" else "KeyError") in refused.error, refused.error


def test_nothing_survives_says_what_failed():
    with pytest.raises(TuningError) as e:
        tune(add_failing, [dict(block_M=0), dict(block_M=48)])
    assert "2 compile_error" in str(e.value) and "block_M must be positive" in str(e.value)


def test_second_run_is_served_from_the_database(monkeypatch):
    first = tune(add, GRID[:3])
    import autotuner.job as job_mod

    def no_compile(*a, **k):
        raise AssertionError("a warm run must not compile candidates")

    monkeypatch.setattr(job_mod, "compile_many", no_compile)
    second = tune(add, GRID[:3])
    assert second.from_cache and second.config == first.config and second.latency == first.latency
    assert [t.status for t in second.trials] == [t.status for t in first.trials]
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(second.kernel(a, b), a + b)
    db = cache_dir() / "tuning.sqlite"
    n = sqlite3.connect(db).execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    assert n == 3  # every trial is stored, not only the winner


def test_changing_a_global_or_closure_value_misses_the_cache(monkeypatch):
    cfg = [dict(block_M=32, block_N=32)]
    assert not tune(add, cfg).from_cache
    assert tune(add, cfg).from_cache
    monkeypatch.setattr(c_kernels, "M", 128)  # a global the kernel reads: 256 -> 128 rows
    r = tune(add, cfg, ref_prog=ref_add)
    assert not r.from_cache
    a, b = torch.randn(128, 256), torch.randn(128, 256)
    torch.testing.assert_close(r.kernel(a, b), a + b)

    def make(scale):
        def k(block_M=32, block_N=32):
            return add(block_M, block_N, dtype="float32" if scale else "float32")
        return k

    assert not tune(make(1), cfg).from_cache
    assert not tune(make(0), cfg).from_cache  # same source, other closure value


@pytest.mark.parametrize("backend", ["multiprocessing", "loky"])
def test_kernel_from_a_notebook_cell_tunes_with_process_workers(monkeypatch, backend):
    """As in Jupyter: the cell runs in ``__main__``, its source lives only in the parent's linecache,
    and ``from __future__ import annotations`` makes TileLang resolve annotations in ``__main__``.
    Forked workers inherit all that; loky's spawned workers get it shipped with the job."""
    cell = textwrap.dedent('''
        from __future__ import annotations
        import tilelang.language as T
        SIZE = 64

        def cell_add(block_M=32, block_N=32):
            @T.prim_func
            def main(A: T.Tensor((SIZE, SIZE), "float32"), B: T.Tensor((SIZE, SIZE), "float32"),
                     C: T.Tensor((SIZE, SIZE), "float32")):
                with T.Kernel(T.ceildiv(SIZE, block_N), T.ceildiv(SIZE, block_M), threads=1) as (bx, by):
                    for i, j in T.Parallel(block_M, block_N):
                        C[by * block_M + i, bx * block_N + j] = (A[by * block_M + i, bx * block_N + j]
                                                                 + B[by * block_M + i, bx * block_N + j])
            return main
    ''')
    filename = "<ipython-input-7-0123456789ab>"
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    notebook_main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", notebook_main)
    exec(compile(cell, filename, "exec"), notebook_main.__dict__)
    result = tune(notebook_main.cell_add, [dict(block_M=16), dict(block_M=32)], backend=backend)
    assert [t.status for t in result.trials] == ["ok", "ok"], result.trials


BAD_ARGS = [
    ([], {}, ValueError, "configs is empty"),
    ([dict(block_M=32), 5], {}, TypeError, r"configs\[1\] must be a dict"),
    ([dict(block_X=32)], {}, ValueError, "unknown key 'block_X'"),
    ([dict(block_M=[32])], {}, TypeError, "config values must be"),
    ([dict(block_M=32)], dict(target="tpu"), ValueError, "unknown target 'tpu'"),
    ([dict(block_M=32)], dict(supply_type="gaussianish"), ValueError, "supply_type 'gaussianish'"),
    ([dict(block_M=32)], dict(atol=-1), ValueError, "atol must be"),
    ([dict(block_M=32)], dict(max_mismatched_ratio=2), ValueError, "max_mismatched_ratio"),
    ([dict(block_M=32)], dict(compile_timeout=0), ValueError, "compile_timeout"),
]


@pytest.mark.parametrize("configs, args, exc, match", BAD_ARGS)
def test_bad_arguments_are_rejected_up_front(configs, args, exc, match):
    with pytest.raises(exc, match=match):
        AutoTuner.from_kernel(add, configs).set_compile_args(**args).run(1, 1)


def test_run_counts_must_be_counts():
    t = AutoTuner.from_kernel(add, [dict(block_M=32)]).set_compile_args(target="c")
    with pytest.raises(ValueError, match=r"rep must be >= 1 \(a number of calls"):
        t.run(warmup=1, rep=0)


def test_an_unknown_l2_flush_is_refused_by_name():
    from autotuner.timing import time_callable

    with pytest.raises(ValueError, match=r"flush must be 'write' or 'read', got 'zero'"):
        time_callable(lambda: None, 0, 1, "cpu", flush="zero")
    assert time_callable(lambda: None, 0, 2, "cpu", flush="read").reps == 2


def test_batched_timing_times_groups_of_calls_with_nothing_between_them():
    """``mode="batched"``: one sample per group of ``BATCH_CALLS`` calls (the last group what is left), each the
    group's time per call; an unknown mode and a ``prepare`` (it would run inside a group) are refused."""
    from autotuner.timing import BATCH_CALLS, MIN_GROUPS, batch_groups, time_callable

    calls: list[float] = []
    rep = MIN_GROUPS * BATCH_CALLS + 3
    t = time_callable(lambda: (calls.append(time.perf_counter()), time.sleep(0.002)), 1, rep, "cpu", mode="batched")
    assert len(calls) == 1 + rep and t.reps == MIN_GROUPS + 1 == len(batch_groups(rep))
    assert 2.0 <= t.min_ms <= t.median_ms < 20.0  # per call, not per group (a group of 10 sleeps is >= 20 ms)
    assert batch_groups(rep) == [BATCH_CALLS] * MIN_GROUPS + [3]
    assert batch_groups(20) == [5, 5, 5, 5] and batch_groups(3) == [1, 1, 1] and batch_groups(1) == [1]
    assert time_callable(lambda: None, 0, 3, "cpu", mode="batched").reps == 3
    with pytest.raises(ValueError, match=r"mode must be one of \['burst', 'sustained', 'batched'\], got 'grouped'"):
        time_callable(lambda: None, 0, 1, "cpu", mode="grouped")
    with pytest.raises(ValueError, match="mode='batched' times calls back to back with nothing between them"):
        time_callable(lambda: None, 0, 1, "cpu", mode="batched", prepare=lambda: None)
    with pytest.raises(ValueError, match="backend='cudagraph' replays captured calls"):
        time_callable(lambda: None, 0, 1, "cpu", mode="batched", backend="cudagraph")


def test_batched_timing_has_a_key_of_its_own_and_refuses_the_cudagraph_backend():
    """A result timed per call is never served for ``timing="batched"`` (nor one grouped otherwise); the other
    modes' keys do not carry the grouping."""
    t = AutoTuner.from_kernel(add, [dict(block_M=32)]).set_compile_args(target="c")
    keys = {m: t.set_tuning(timing=m)._key_settings() for m in ("burst", "back_to_back", "batched")}
    assert keys["batched"] != keys["back_to_back"] and keys["batched"]["timing_batches"]
    assert "timing_batches" not in keys["burst"] and "timing_batches" not in keys["back_to_back"]
    with pytest.raises(ValueError, match="timing='batched' groups calls between events, and timing_backend="):
        t.set_tuning(timing="batched", timing_backend="cudagraph")  # refused as it is set, not at run()


def test_set_profile_args_newer_signature():
    t = (AutoTuner.from_kernel(add, [dict(block_M=32, block_N=32)])
         .set_compile_args(out_idx=[-1], target="c")
         .set_profile_args(warmup=1, rep=3, timeout=30, supply_type="integer", ref_prog=ref_add, atol=0, rtol=0))
    assert t.compile_settings.compile_timeout == 30 and t.check_settings.atol == 0
    result = t.set_tuning(n_jobs=1).run()
    assert result.trials[0].status == "ok"  # integers add exactly: zero tolerance passes
    with pytest.raises(TypeError, match="supply_prog must be callable"):  # supply_prog: tests/test_dropin.py
        t.set_profile_args(supply_prog=[])


def test_two_processes_tuning_at_once_share_the_database(tmp_path):
    script = tmp_path / "tune_one.py"
    script.write_text(textwrap.dedent(f'''
        import sys
        sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parent.parent)!r}]
        from autotuner import AutoTuner
        from kernels.c_kernels import add, ref_add
        cfgs = [dict(block_M=bm, block_N=int(sys.argv[1])) for bm in (16, 32, 64)]
        r = (AutoTuner.from_kernel(add, cfgs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
             .set_tuning(n_jobs=1, progress=False).run(1, 3))
        print("OK", r.config)
    '''))
    procs = [subprocess.Popen([sys.executable, str(script), str(bn)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for bn in (16, 32)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
        assert "OK" in out
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert db.execute("SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL").fetchone()[0] == 2
    assert db.execute("SELECT COUNT(*) FROM trials").fetchone()[0] == 6


def test_a_crashing_or_endless_kernel_costs_one_trial_not_the_run():
    """Measuring runs in its own process: a kernel that kills it is a runtime_error, an endless one a timeout,
    and the configs after them are still measured (in a restarted process)."""
    configs = [dict(mode="abort"), dict(mode="ok"), dict(mode="spin"), dict(mode="ok", block_M=64)]
    result = (AutoTuner.from_kernel(c_kernels.add_crashing, configs)
              .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
              .set_tuning(n_jobs=2, run_timeout=20).run(1, 3))
    status = [t.status for t in result.trials]
    assert status == ["runtime_error", "ok", "timeout", "ok"], result.trials
    assert "died" in result.trials[0].error and "run_timeout=20" in result.trials[2].error


def test_an_interrupted_run_resumes_without_measuring_again(monkeypatch):
    import autotuner.bench as bench_mod
    import autotuner.job as job_mod

    configs = [dict(block_M=bm, block_N=32) for bm in (16, 32, 64)]
    real_measure = bench_mod.Bench.measure
    calls = []

    def interrupted(self, index, cfg, compile_s, prim=None):
        calls.append(index)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the user's Ctrl-C, after one candidate was measured
        return real_measure(self, index, cfg, compile_s, prim)

    def run():
        return (AutoTuner.from_kernel(add, configs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
                .set_tuning(n_jobs=1, isolate=False).run(1, 3))

    monkeypatch.setattr(bench_mod.Bench, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(bench_mod.Bench, "measure", real_measure)
    compiled = []
    real_compile_many = job_mod.compile_many

    def counting(batches, **k):
        compiled.extend(i for b in batches for i in b.indices)
        return real_compile_many(batches, **k)

    monkeypatch.setattr(job_mod, "compile_many", counting)
    result = run()
    assert not result.from_cache
    assert sorted(compiled) == sorted(set(range(3)) - {calls[0]})  # the measured one is not redone
    assert [t.status for t in result.trials] == ["ok"] * 3
    torch.testing.assert_close(result.kernel(torch.ones(256, 256), torch.ones(256, 256)), torch.full((256, 256), 2.0))


def test_a_config_may_carry_its_own_pass_configs():
    """As in TileLang's AutoTuner: ``pass_configs`` in a config reach the compiler for that config
    only (here an unknown key makes just that config fail), and never reach the kernel."""
    configs = [dict(block_M=32, block_N=32),
               dict(block_M=64, block_N=32, pass_configs={"tl.disable_warp_specialized": True}),
               dict(block_M=16, block_N=32, pass_configs={"tl.no_such_pass_option": True})]
    result = tune(add, configs)
    status = [t.status for t in result.trials]
    assert status == ["ok", "ok", "compile_error"], result.trials
    assert result.trials[1].config["pass_configs"] == {"tl.disable_warp_specialized": True}
    assert "tl.no_such_pass_option" in result.trials[2].error
    with pytest.raises(TypeError, match="pass_configs"):
        AutoTuner.from_kernel(add, [dict(block_M=32, pass_configs=["tl.disable_vectorize"])])


@pytest.mark.parametrize("timing, first, finalists", [("burst", "burst", "burst"), ("sustained", "burst", "sustained"),
                                                      ("back_to_back", "sustained", "sustained"),
                                                      ("batched", "batched", "batched")])
def test_the_timing_setting_says_how_candidates_and_finalists_are_timed(tmp_path, monkeypatch, timing, first,
                                                                        finalists):
    """``back_to_back`` times every candidate as ``sustained`` times the finalists: calls back to back, no flush
    between them, as a model's forward runs them; ``batched`` (the matmul op's default) both in groups of calls."""
    import autotuner.bench as bench_mod

    modes: list[str] = []
    real = bench_mod.Bench._time

    def spy(self, jit, case, mode):
        modes.append(mode)
        return real(self, jit, case, mode)

    monkeypatch.setattr(bench_mod.Bench, "_time", spy)
    configs = [dict(block_M=m, block_N=16) for m in (16, 32)]
    result = (AutoTuner.from_kernel(add, configs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
              .set_tuning(n_jobs=1, isolate=False, cache=False, progress=False, timing=timing, sustain_s=0.0)
              .run(1, 3))
    assert result.config in configs
    assert modes[:2] == [first, first] and set(modes[2:]) == {finalists} and len(modes) > 2
