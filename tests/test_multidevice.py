"""Measuring on several devices (``set_tuning(devices=...)``, autotuner/devices.py).

On the C target each index is a CPU measuring process (a fake device), so the scheduler runs without
a GPU: one run (a module fixture) with a candidate that kills its measuring process and one that never
ends, among nine good ones, on three devices listed out of order. The GPU test at the end needs two.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import threading
import time

import pytest
import torch
from kernels import c_kernels
from kernels.c_kernels import ref_add

import autotuner.devices as devices_mod
from autotuner import AutoTuner
from autotuner.bench import MEASURING_PROCESS_NAME, IsolatedBench
from autotuner.cache import TuningDB
from autotuner.devices import Device, DeviceLost, DevicePool
from autotuner.errors import TuningError
from autotuner.timing import Timing
from autotuner.trial import Status, Trial

DEVICES = [2, 0, 1]  # the first listed, cpu:2, re-times the finalists
LABELS = {"cpu:0", "cpu:1", "cpu:2"}
CONFIGS = [dict(mode="abort"), dict(mode="spin")] + [dict(block_M=m, block_N=n) for m in (16, 32, 64)
                                                     for n in (16, 32, 64)]


def tuner(configs, **tuning):
    return (AutoTuner.from_kernel(c_kernels.add_crashing, configs)
            .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=2, progress=False, **tuning))


@pytest.fixture(scope="module")
def crash_run(tmp_path_factory):
    """The result, each device's sequence of process starts and call outcomes, and the database path."""
    os.environ.setdefault("TILELANG_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tilelang-cache"))
    db = tmp_path_factory.mktemp("multidevice") / "tuning.sqlite"
    events: list[tuple[str, str]] = []
    real_start, real_call = IsolatedBench._start, IsolatedBench._call

    def start(self):
        events.append((threading.current_thread().name, "start"))
        real_start(self)

    def call(self, msg, timeout):
        tag, reply = real_call(self, msg, timeout)
        events.append((threading.current_thread().name, tag))
        return tag, reply

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(IsolatedBench, "_start", start)
        mp.setattr(IsolatedBench, "_call", call)
        result = tuner(CONFIGS, run_timeout=15, devices=DEVICES, db_path=str(db)).run(1, 3)
    per_device: dict[str, list[str]] = {}
    for thread, what in events:
        per_device.setdefault(thread.removeprefix("tilecarve-measure-"), []).append(what)
    return result, per_device, db


def test_a_crash_and_a_hang_cost_one_candidate_each(crash_run):
    result, _, _ = crash_run
    status = [t.status for t in result.trials]
    assert status == ["runtime_error", "timeout"] + ["ok"] * 9, result.trials
    assert "died" in result.trials[0].error and "run_timeout=15" in result.trials[1].error
    torch.testing.assert_close(result.kernel(torch.ones(256, 256), torch.ones(256, 256)), torch.full((256, 256), 2.0))


def test_only_the_failing_devices_process_restarts(crash_run):
    result, per_device, _ = crash_run
    assert set(per_device) == LABELS, per_device
    failing = {result.trials[0].device, result.trials[1].device}
    for label, seq in per_device.items():
        assert seq[0] == "start", (label, seq)
        # a death restarts the process at once, inside the call that saw it (so its "start" is logged before
        # the call's outcome), not when (or if) the device takes another candidate
        for now, after in zip(seq[1:], seq[2:] + [None]):
            assert (now == "start") == (after in ("died", "timeout")), (label, seq)
        deaths = seq.count("died") + seq.count("timeout")
        assert seq.count("start") == 1 + deaths and (deaths > 0) == (label in failing), (label, seq)


def test_every_device_measured_candidates(crash_run):
    result, _, _ = crash_run
    assert {t.device for t in result.trials} == LABELS, [(t.config, t.device) for t in result.trials]


def test_finalists_are_retimed_on_the_first_listed_device(crash_run):
    result, _, _ = crash_run
    finalists = [t for t in result.trials if t.rounds]
    assert len(finalists) >= 2, result.trials
    assert {t.device for t in finalists} == {"cpu:2"}, finalists
    assert result.config in [t.config for t in finalists]


def test_the_device_of_every_trial_is_in_the_database(crash_run):
    result, _, db = crash_run
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT idx, device FROM trials ORDER BY idx").fetchall()
    assert [d for _, d in rows] == [t.device for t in result.trials]
    stored = TuningDB(db)
    try:
        (key,) = stored.keys()
        assert [t.device for t in stored.finished_run(key).trials.values()] == [t.device for t in result.trials]
    finally:
        stored.close()


def test_the_timeline_has_each_devices_start_and_candidates(crash_run):
    from test_timeline import assert_before, order_of

    result, per_device, _ = crash_run
    tl = result.timeline
    failing = {result.trials[0].device, result.trials[1].device}
    for label in LABELS:
        assert_before(tl, ("tune start", "job"), ("open", label), ("opened", label), ("first measured", label),
                      ("last measured", label), ("compile and measure done", "job"), ("job end", "job"))
        if label not in failing:  # a process that crashed or was killed took its stamps with it
            assert_before(tl, ("process spawned", label), ("job start", "job"), ("opened", label),
                          ("first measured", label))  # a forked process may have its imports before it is opened
            assert_before(tl, ("process spawned", label), ("imports done", label), ("inputs made #0", label),
                          ("first kernel loaded #0", label), ("first measured", label))
            assert_before(tl, ("process spawned", label), ("process up", label), ("imports done", label))
        assert order_of(tl, label).count("process up") <= per_device[label].count("start"), (label, tl.line())
    use = tl.devices()
    assert set(use) == LABELS and sum(d["measured"] for d in use.values()) == len(CONFIGS), use
    assert all(d["busy_s"] > 0 and d["idle_s"] >= 0 for d in use.values()), use
    plan = next(e.where for e in tl.events if e.what == "finalists start")
    assert_before(tl, ("compile and measure done", "job"), ("finalists start", plan), ("finalists end", plan),
                  ("job end", "job"))


def _measuring_children() -> list[int]:
    """Live child processes of this one that serve as measuring processes."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:  # spawned, before it names itself
                serving = b"_serve(" in f.read()
            with open(f"/proc/{entry}/comm") as f:  # named (forked or spawned)
                serving = serving or f.read().strip() == MEASURING_PROCESS_NAME
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and serving:
            found.append(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; Linux only")
def test_no_measuring_thread_or_process_outlives_the_run(crash_run):
    deadline = time.time() + 15
    while time.time() < deadline and ([t for t in threading.enumerate() if t.name.startswith("tilecarve-measure")]
                                      or _measuring_children()):
        time.sleep(0.1)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("tilecarve-measure")]
    assert not _measuring_children()


def test_mixed_models_are_refused_unless_allowed(monkeypatch):
    monkeypatch.setattr(devices_mod, "device_name", lambda kind, i: "Model A" if i == 0 else "Model B")
    configs = [dict(block_M=m) for m in (16, 32, 64)]
    with pytest.raises(ValueError, match=r"different models \(0: Model A, 1: Model B\).*allow_mixed_devices=True"):
        tuner(configs, devices=[0, 1]).run(1, 3)
    result = tuner(configs, devices=[0, 1], allow_mixed_devices=True).run(1, 3)
    assert [t.status for t in result.trials] == ["ok"] * 3
    assert {t.device for t in result.trials} <= {"cpu:0 (Model A)", "cpu:1 (Model B)"}, result.trials
    assert {t.device for t in result.trials if t.rounds} == {"cpu:0 (Model A)"}


@pytest.mark.parametrize("value, exc, match", [
    ("some", ValueError, '"all", or a list of device indices'), (1, TypeError, r"a list of one: \[1\]"),
    ([0, 0], ValueError, "each once"), ([], ValueError, "at least one"), ([-1], ValueError, ">= 0"),
    ([0, True], ValueError, ">= 0"), (1.5, TypeError, "device indices")])
def test_the_devices_setting_is_checked(value, exc, match):
    with pytest.raises(exc, match=match):
        tuner([dict(block_M=16)], devices=value)


def test_devices_need_isolated_measuring():
    with pytest.raises(ValueError, match="needs isolate=True"):
        tuner([dict(block_M=16)], devices="all", isolate=False)


def test_gpus_are_pinned_through_cuda_visible_devices(monkeypatch):
    monkeypatch.setattr(devices_mod, "device_count", lambda kind: 2)
    monkeypatch.setattr(devices_mod, "device_name", lambda kind, i: "NVIDIA H200")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    got = devices_mod.resolve_devices("all", "cuda", allow_mixed=False)
    assert [(d.label, d.env) for d in got] == [("cuda:0", {"CUDA_VISIBLE_DEVICES": "3"}),
                                               ("cuda:1", {"CUDA_VISIBLE_DEVICES": "5"})]
    with pytest.raises(ValueError, match=r"sees 2 GPU\(s\).*\[2\] cannot be used"):
        devices_mod.resolve_devices([0, 2], "cuda", allow_mixed=False)


class FakeBench:
    """A measuring side whose device is lost when ``lost`` names it (a Ray node gone): it raises
    :class:`DeviceLost` before running the job, as :class:`autotuner.ray_cluster.RayBench` does."""

    lost: set[int] = set()

    def __init__(self, specs, run_timeout, device):
        self.index = device.index
        self.released = []

    def _check(self):
        if self.index in self.lost:
            raise DeviceLost(f"node of device {self.index} gone")

    def measure(self, sid, index, cfg, compile_s, prim=None):
        self._check()
        time.sleep(0.02)  # the other device takes jobs meanwhile
        return Trial(cfg, Status.OK, None, compile_s, 1.0 + index, 1.0, 0.0)

    def retime(self, sid, index, cfg, prim=None):
        self._check()
        return Timing(float(self.index), 0.0, 0.0, 1)

    def fetch_ref_latency(self, sid):
        return None

    def measured_hash(self, sid, index):
        return None

    def take_stamps(self):
        return []

    def release(self, sid):
        self._check()
        self.released.append(sid)

    def abort(self):
        pass

    def close(self):
        pass


def fake_pool(monkeypatch, lost):
    monkeypatch.setattr(FakeBench, "lost", set(lost))
    return DevicePool([None], 10, [Device(1, "cpu:1", "cpu"), Device(0, "cpu:0", "cpu")], open_bench=FakeBench)


def test_a_lost_device_hands_its_job_on_and_the_rest_finish(monkeypatch):
    pool = fake_pool(monkeypatch, lost={1})
    try:
        futures = [pool.submit(0, i, {"block_M": i}, 0.5) for i in range(6)]
        results = sorted((f.result(timeout=30) for f in futures), key=lambda t: t.config["block_M"])
        assert [t.config["block_M"] for t in results] == list(range(6))  # not one candidate lost with the device
        assert {t.device for t in results} == {"cpu:0"}
        assert pool.finalist_device == "cpu:0"  # the first listed is gone: the next one re-times the finalists
        assert pool.retime(0, 0, {"block_M": 0}).median_ms == 0.0  # cpu:0's timing
        pool.release(0)  # only the device left frees the problem's inputs
        pool.retime(0, 1, {"block_M": 1})  # runs after the release on the same thread
        assert [w.bench.released for w in pool._workers if w.bench.index == 0] == [[0]]
    finally:
        pool.close()


def test_when_every_device_is_lost_the_run_fails_with_the_reason(monkeypatch):
    pool = fake_pool(monkeypatch, lost={0, 1})
    try:
        futures = [pool.submit(0, i, {"block_M": i}, 0.5) for i in range(3)]
        for f in futures:
            with pytest.raises(TuningError, match="every measuring device was lost.*node of device"):
                f.result(timeout=30)
        with pytest.raises(TuningError, match="every measuring device was lost"):
            pool.submit(0, 3, {"block_M": 3}, 0.5)
    finally:
        pool.close()


class SlowBench(FakeBench):
    """A measuring side whose release and measure take a while, and which records aborts and closes."""

    def __init__(self, specs, run_timeout, device):
        super().__init__(specs, run_timeout, device)
        self.aborted = self.closed = False
        self.busy = threading.Event()  # set when a release or a candidate has begun

    def release(self, sid):
        self.busy.set()
        time.sleep(0.5)
        super().release(sid)

    def measure(self, sid, index, cfg, compile_s, prim=None):
        self.busy.set()
        time.sleep(2.0)
        return super().measure(sid, index, cfg, compile_s, prim)

    def abort(self):
        self.aborted = True

    def close(self):
        self.closed = True


def test_closing_lets_a_release_end_and_aborts_a_candidate(monkeypatch):
    """A run that ends while a device frees a problem's inputs lets it end (its Ray actor is kept for the next
    run); a device busy with a candidate (a run stopping early) is aborted; close(wait) returns once every
    device's thread has closed its side."""
    monkeypatch.setattr(FakeBench, "lost", set())
    pool = DevicePool([None], 10, [Device(1, "cpu:1", "cpu"), Device(0, "cpu:0", "cpu")], open_bench=SlowBench)
    pool.release(0)
    assert all(w.bench.busy.wait(30) for w in pool._workers)  # both devices are freeing the inputs
    pool.close(wait=10)
    assert [(w.bench.released, w.bench.aborted, w.bench.closed, w.is_alive()) for w in pool._workers] == \
        [([0], False, True, False)] * 2

    pool = DevicePool([None], 10, [Device(0, "cpu:0", "cpu")], open_bench=SlowBench)
    pool.submit(0, 0, {"block_M": 0}, 0.5)
    assert pool._workers[0].bench.busy.wait(30)  # the device is measuring the candidate
    pool.close(wait=10)
    assert [(w.bench.aborted, w.bench.closed) for w in pool._workers] == [(True, True)]


OLD_TRIALS = """CREATE TABLE runs (key TEXT PRIMARY KEY, kernel TEXT NOT NULL, target TEXT NOT NULL,
    created REAL NOT NULL, finished REAL, best_config TEXT, best_latency_ms REAL, ref_latency_ms REAL,
    n_configs INTEGER NOT NULL, meta TEXT NOT NULL, best_prim TEXT);
CREATE TABLE trials (key TEXT NOT NULL, idx INTEGER NOT NULL, config TEXT NOT NULL, status TEXT NOT NULL,
    error TEXT, compile_s REAL, median_ms REAL, min_ms REAL, iqr_ms REAL, recorded REAL NOT NULL, rounds INTEGER,
    spread REAL, PRIMARY KEY (key, idx));"""


def test_a_database_from_before_the_device_column_is_read_and_extended(tmp_path):
    path, key = tmp_path / "old.sqlite", "a" * 64
    with sqlite3.connect(path) as conn:
        conn.executescript(OLD_TRIALS)
        conn.execute("INSERT INTO runs VALUES (?, 'k', 'c', 1.0, NULL, NULL, NULL, NULL, 2, '{}', NULL)", (key,))
        conn.execute("INSERT INTO trials VALUES (?, 0, '{\"block_M\": 16}', 'ok', NULL, 1.0, 0.5, 0.4, 0.1, 1.0, "
                     "NULL, NULL)", (key,))
    db = TuningDB(path)
    try:
        assert db.trials(key)[0].device is None
        db.record_trial(key, 1, Trial({"block_M": 32}, Status.OK, None, 1.0, 0.6, 0.5, 0.1, device="cuda:1"))
        assert db.trials(key)[1].device == "cuda:1"
        exported = db.export_runs([key])
        assert [t["device"] for t in exported[0]["trials"]] == [None, "cuda:1"]
        for t in exported[0]["trials"]:  # a file exported before the column imports too
            del t["device"]
        exported[0]["created"] = 2.0
        assert db.import_runs(json.loads(json.dumps(exported))).replaced == [key]
    finally:
        db.close()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs in this process "
                    "(an nvidia-h200-x2 machine: python3 -m pytest -m gpu tests/test_multidevice.py)")
def test_a_matmul_tuned_on_every_gpu_is_measured_on_each():
    from templates import matmul as mm

    problem = mm.MatmulProblem(2048, 2048, 2048)
    configs = mm.MATMUL.space(problem)[::6]  # 48 of the 288
    result = (mm.MATMUL.tuner(problem, mm.TuneOptions(configs=configs, validate_configs=False))
              .set_tuning(cache=False, progress=False, devices="all").run(3, 20))
    n = torch.cuda.device_count()
    labels = {f"cuda:{i}" for i in range(n)}
    # every GPU's measuring process came up; the queue is shared, so one still starting when the others have
    # drained it may take no candidate (an H200 x4 host, 2026-11-28: 24 candidates, cuda:2 took none), but
    # the candidates were spread, and each was measured once, on a GPU of this host
    ready = {e.where for e in result.timeline.events if e.what == "imports done"}
    assert labels <= ready, (ready, result.timeline.devices())
    ok = [t for t in result.trials if t.status == Status.OK]
    assert len(ok) == len(configs) and {t.device for t in ok} <= labels, [(t.status, t.device) for t in ok]
    assert len({t.device for t in ok}) >= min(n, 2), [(t.status, t.device) for t in ok]
    per_device = result.timeline.devices()
    assert sum(d["measured"] for w, d in per_device.items() if w in labels) == len(ok), per_device
    assert {t.device for t in result.trials if t.rounds} == {"cuda:0"}
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(result.kernel(a, b).float(), (a @ b.T).float(), atol=1.0, rtol=1e-2)

