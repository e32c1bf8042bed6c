"""Tuning jobs (autotuner/job.py): many problems in one call, one compile pool, one measuring process,
one progress bar; on TileLang's C target. Three keys of one keyed kernel (tests/kernels/job_kernels.py),
three configs each, one of which fails for one key only. Where winners are compared, timings are
replaced by latencies that depend only on the key and the config (every candidate is still compiled,
loaded and checked), so that no timing noise can decide the comparison."""

from __future__ import annotations

import sqlite3
import sys
from types import SimpleNamespace

import pytest
import torch
from kernels.c_kernels import add, ref_add
from kernels.job_kernels import CONFIGS, KEYS, make_keyed, ref_none

import autotuner
import autotuner.bench as bench_mod
import autotuner.job as job_mod
from autotuner import AutoTuner, TuneResult, TuningError, TuningInputError, record, tune_all, tune_keys
from autotuner.timing import Timing
from autotuner.trial import Status, Trial

N_CANDIDATES = len(KEYS) * len(CONFIGS)


def fake_ms(bench: bench_mod.Bench, cfg: dict) -> float:
    """The key's winner is the block_M nearest M / 2: 8 for M=8, 16 for M=64."""
    return abs(cfg["block_M"] - bench.spec.kernel.keywords["M"] / 2) + 1.0


@pytest.fixture
def counted(monkeypatch):
    """Measure with fake_ms (isolate=False jobs) and count compile pools, compiled and measured candidates."""
    seen = SimpleNamespace(pools=0, compiled=[], measured=[], stop_after=None, events=[], benches=set())
    real_measure, real_retime, real_release = bench_mod.Bench.measure, bench_mod.Bench.retime, bench_mod.Bench.release
    real_many = job_mod.compile_many

    def event(bench, what):
        """(what, key, how many keys have inputs on the measuring side now)."""
        seen.benches.add(bench)
        key = (bench.spec.kernel.keywords["M"], bench.spec.kernel.keywords["N"])
        seen.events.append((what, key, sum(bool(b._cases) for b in seen.benches)))

    def measure(self, index, cfg, compile_s, prim=None):
        if seen.stop_after is not None and len(seen.measured) == seen.stop_after:
            raise KeyboardInterrupt  # the user's Ctrl-C in the middle of the job
        trial = real_measure(self, index, cfg, compile_s, prim)  # really loaded and checked
        seen.measured.append((self.spec.kernel.keywords["M"], self.spec.kernel.keywords["N"], index))
        event(self, "measure")
        if trial.status != Status.OK:
            return trial
        ms = fake_ms(self, cfg)
        return Trial(trial.config, trial.status, None, trial.compile_s, ms, ms, 0.0)

    def retime(self, index, cfg, prim=None):
        real_retime(self, index, cfg, prim)  # loads the kernel and makes the inputs as a real re-timing does
        event(self, "retime")
        ms = fake_ms(self, cfg)
        return Timing(ms, ms, 0.0, 3)

    def release(self):
        real_release(self)
        event(self, "release")

    def many(batches, **kwargs):
        seen.pools += 1
        seen.compiled.extend((b.kernel.keywords["M"], b.kernel.keywords["N"], i) for b in batches for i in b.indices)
        return real_many(batches, **kwargs)

    monkeypatch.setattr(bench_mod.Bench, "measure", measure)
    monkeypatch.setattr(bench_mod.Bench, "retime", retime)
    monkeypatch.setattr(bench_mod.Bench, "release", release)
    monkeypatch.setattr(job_mod, "compile_many", many)
    return seen


def statuses(result: TuneResult) -> list[str]:
    return [str(t.status) for t in result.trials]


def test_a_job_gives_the_winners_per_key_tuning_gives(tmp_path, counted):
    kk = make_keyed(tmp_path / "one-by-one.sqlite", isolate=False)
    one_by_one = [kk.tune(k) for k in KEYS]
    assert counted.pools == 3
    kk2 = make_keyed(tmp_path / "job.sqlite", isolate=False)
    counted.events.clear()
    counted.benches.clear()
    job = tune_keys([(kk2, k) for k in KEYS], load_kernels=True)
    assert counted.pools == 4  # the whole job went through one compile pool
    for a, b in zip(one_by_one, job):
        assert (b.config, b.latency, statuses(b)) == (a.config, a.latency, statuses(a))
        assert [t.median_ms for t in b.trials] == [t.median_ms for t in a.trials]
        assert not b.from_cache and b.key == a.key
    assert [r.config["block_M"] for r in job] == [8, 16, 16]
    # one bad config in one key: a trial of that key, the job goes on
    assert statuses(job[0]) == ["ok", "ok", "compile_error"] and "more than four times M=8" in job[0].trials[2].error
    assert statuses(job[1]) == statuses(job[2]) == ["ok"] * 3
    assert [kk2.config_for(k) for k in KEYS] == [(r.config, "tuned") for r in job]
    # inputs: freed after each key's last candidate; made again for its finalists, one key at a time
    ev, keys = counted.events, [(k["M"], k["N"]) for k in KEYS]
    first_retime = min(i for i, e in enumerate(ev) if e[0] == "retime")
    for k in keys:
        last_measure = max(i for i, e in enumerate(ev) if e[:2] == ("measure", k))
        assert last_measure < next(i for i, e in enumerate(ev) if e[:2] == ("release", k)) < first_retime, ev
    assert {e[1] for e in ev if e[0] == "retime"} == set(keys) and all(e[2] == 1 for e in ev if e[0] == "retime")
    a, b = torch.randn(64, 32), torch.randn(64, 32)
    torch.testing.assert_close(job[2].kernel(a, b), 2 * a + b)


def test_a_recorded_model_is_one_job_with_one_measuring_process(tmp_path, monkeypatch):
    """Real isolated measuring and timing: Recording.tune starts one measuring process and one compile
    pool for every key, and writes a table whose winners passed their checks."""
    starts, pools = [], []
    real_start, real_many = bench_mod.IsolatedBench._start, job_mod.compile_many
    monkeypatch.setattr(bench_mod.IsolatedBench, "_start", lambda self: (starts.append(1), real_start(self)))
    monkeypatch.setattr(job_mod, "compile_many", lambda batches, **k: (pools.append(len(batches)),
                                                                      real_many(batches, **k))[1])
    kk = make_keyed(tmp_path / "tuning.sqlite")
    with record() as rec:
        for k in KEYS:
            kk.kernel_for(k)
    path = rec.tune(tmp_path / "table.json")
    assert starts == [1] and pools == [len(KEYS)]
    entries = {tuple(e.key.values()): e.config for e in autotuner.load_table(path, "c").kernels[kk.name].entries}
    assert len(entries) == len(KEYS) and entries[8, 64, "float32"]["block_M"] != 64
    assert all(kk.config_for(k)[1] == "tuned" for k in KEYS)


def test_a_wrong_problem_fails_alone(tmp_path):
    """A reference that returns nothing is its problem's TuningInputError; the other problem is tuned
    and stored, the wrong one's run discarded, and the error raised (or returned) once both are done."""
    db = tmp_path / "tuning.sqlite"

    def plans(*refs, isolate=False):
        return [AutoTuner.from_kernel(add, [dict(block_M=32), dict(block_M=64)])
                .set_compile_args(out_idx=[-1], ref_prog=ref, target="c")
                .set_tuning(n_jobs=2, progress=False, db_path=str(db), isolate=isolate)
                .plan(1, 3, label=f"add/{ref.__name__}") for ref in refs]

    good, bad = tune_all(plans(ref_add, ref_none, isolate=True), errors="return")  # the error crosses processes
    assert isinstance(bad, TuningInputError) and "returned None" in str(bad)
    assert isinstance(good, TuneResult) and statuses(good) == ["ok", "ok"] and not good.from_cache
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs WHERE finished IS NOT NULL").fetchone() == (1,)
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone() == (1,)  # the wrong one left nothing
    with pytest.raises(TuningInputError, match="returned None"):
        tune_all(plans(ref_add, ref_none))  # one failure: raised as it is
    with pytest.raises(TuningError, match=r"2 of 3 problems failed to tune:\n  add/ref_none: TuningInputError"):
        tune_all(plans(ref_none, ref_add, ref_none))


def test_an_interrupted_job_resumes_without_measuring_again(tmp_path, counted):
    db = tmp_path / "tuning.sqlite"
    pairs = lambda: [(make_keyed(db, isolate=False), k) for k in KEYS]  # noqa: E731 - a fresh kernel per run
    counted.stop_after = 4
    with pytest.raises(KeyboardInterrupt):
        tune_keys(pairs())
    first = list(counted.measured)
    with sqlite3.connect(db) as conn:
        recorded = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    assert len(first) == 4 and 4 <= recorded < N_CANDIDATES
    counted.stop_after, counted.compiled, counted.measured = None, [], []
    results = tune_keys(pairs())
    assert len(counted.compiled) == N_CANDIDATES - recorded  # only what has no trial yet
    assert not set(first) & set(counted.measured)  # nothing measured twice
    assert [r.config["block_M"] for r in results] == [8, 16, 16] and not any(r.from_cache for r in results)
    assert sum(len(r.trials) for r in results) == N_CANDIDATES
    counted.pools = 0
    again = tune_keys(pairs())
    assert counted.pools == 0 and all(r.from_cache for r in again)  # finished: every key a warm hit
    assert [r.config for r in again] == [r.config for r in results]


def test_one_progress_bar_counts_every_candidate_of_the_job(tmp_path, counted, monkeypatch):
    import tqdm

    bars = []

    class Bar:
        def __init__(self, total, **kwargs):
            self.total, self.kwargs, self.updates, self.postfixes = total, kwargs, [], []
            bars.append(self)

        def update(self, n=1):
            self.updates.append(n)

        def set_postfix_str(self, s, refresh=True):
            self.postfixes.append(s)

        def close(self):
            pass

    monkeypatch.setattr(tqdm, "tqdm", Bar)
    kk = make_keyed(tmp_path / "tuning.sqlite", isolate=False)
    tune_keys([(kk, k) for k in KEYS], progress=True)
    (bar,) = bars
    assert bar.total == N_CANDIDATES and sum(bar.updates) == N_CANDIDATES and not bar.kwargs["disable"]
    assert bar.kwargs["desc"] == "tuning" and bar.kwargs["file"] is sys.stderr
    for k in KEYS:  # the postfix names each key as it is measured
        label = f"{kk.name} M={k['M']},N={k['N']},dtype=float32"
        assert any(label in p for p in bar.postfixes), (label, bar.postfixes)
    assert bar.postfixes[-1].startswith(f"{len(KEYS)}/{len(KEYS)} done")


def test_a_job_measures_on_several_devices(tmp_path):
    """devices=[1, 0] (two CPU measuring processes on the C target): one process per device for the
    whole job, every key's finalists re-timed on the first listed."""
    plans = [AutoTuner.from_kernel(add, [dict(block_M=m, block_N=n) for m in (16, 32)])
             .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
             .set_tuning(n_jobs=2, progress=False, devices=[1, 0], db_path=str(tmp_path / "db.sqlite"))
             .plan(1, 3) for n in (16, 32, 64)]
    results = tune_all(plans)
    assert len({r.key for r in results}) == 3
    for r in results:
        assert statuses(r) == ["ok", "ok"] and {t.device for t in r.trials if t.rounds} == {"cpu:1"}
        a, b = torch.randn(256, 256), torch.randn(256, 256)
        torch.testing.assert_close(r.kernel(a, b), a + b)


def test_a_template_tunes_a_list_of_problems_as_one_job(monkeypatch):
    from templates import matmul as mm

    planned, jobs = [], []

    def plan(self, warmup=None, rep=None, timeout=None, label="", **kw):
        planned.append((warmup, rep, label, len(self.configs)))
        return label

    def fake_tune_all(plans, progress=None, **kw):
        jobs.append((list(plans), progress))
        return [SimpleNamespace(kernel=f"kernel for {p}") for p in plans]

    monkeypatch.setattr(AutoTuner, "plan", plan)
    monkeypatch.setattr(autotuner, "tune_all", fake_tune_all)
    problems = [mm.MatmulProblem(m, 14336, 4096) for m in (512, 2048)]
    kernels = mm.MATMUL.tune_many(problems, mm.TuneOptions(arch="H100", target="sm_90a", topk=2, variants=False,
                                                            warmup=5, rep=7))
    assert kernels == ["kernel for matmul 512x14336x4096", "kernel for matmul 2048x14336x4096"]
    assert [(w, r, n) for w, r, _, n in planned] == [(5, 7, 2), (5, 7, 2)]
    assert jobs == [(["matmul 512x14336x4096", "matmul 2048x14336x4096"], True)]  # one job for both


@pytest.mark.gpu
def test_a_list_of_matmul_problems_is_one_job_on_the_gpu(monkeypatch):
    """MATMUL.tune_many on a CUDA GPU: one measuring process for three problems, each kernel right."""
    from templates import matmul as mm

    starts = []
    real_start = bench_mod.IsolatedBench._start
    monkeypatch.setattr(bench_mod.IsolatedBench, "_start", lambda self: (starts.append(1), real_start(self)))
    problems = [mm.MatmulProblem(m, 1024, 512) for m in (64, 256, 1024)]
    kernels = mm.MATMUL.tune_many(problems, mm.TuneOptions(topk=2, variants=False, split_k=False, progress=False))
    assert starts == [1]
    for p, k in zip(problems, kernels):
        a = torch.randn(p.M, p.K, device="cuda", dtype=torch.float16)
        b = torch.randn(p.N, p.K, device="cuda", dtype=torch.float16)
        torch.testing.assert_close(k(a, b).float(), a.float() @ b.float().T, atol=1e-2, rtol=1e-2)
