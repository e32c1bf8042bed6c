"""A job's timeline (autotuner/timeline.py): the per-device arithmetic on made-up spans, and a real job of
two problems on the C target with one isolated measuring process. Devices: tests/test_multidevice.py
and tests/test_ray.py check theirs on their own runs."""

from __future__ import annotations

import logging

import pytest
from kernels.c_kernels import add, ref_add

from autotuner import AutoTuner, tune_all
from autotuner.job import MEASURER
from autotuner.timeline import Timeline


def order_of(timeline: Timeline, where: str) -> list[str]:
    return [e.what for e in timeline.sorted_events() if e.where == where]


def assert_before(timeline: Timeline, *steps: tuple[str, str]) -> None:
    """Each ``(what, where)`` recorded, in this order (the first of each, by time)."""
    events = timeline.sorted_events()
    times = []
    for what, where in steps:
        found = [e.t for e in events if (e.what, e.where) == (what, where)]
        assert found, f"no {what!r} at {where!r} in {[(e.what, e.where) for e in events]}"
        times.append(found[0])
    assert times == sorted(times), list(zip(steps, times))


def test_busy_and_idle_count_from_the_device_being_up():
    tl = Timeline(start=100.0)
    tl.mark("imports done", "d", at=102.0)
    for b, e in [(100.5, 102.5), (103.0, 104.0), (104.0, 104.5)]:  # the first call waited for the process
        tl.measured("d", b, e)
    assert tl.devices()["d"] == {"measured": 3, "ready_s": 2.0, "busy_s": 2.0, "idle_s": 0.5, "first_s": 2.5,
                                 "last_s": 4.5}
    assert [(e.what, e.t) for e in tl.sorted_events()] == [("imports done", 2.0), ("first measured", 2.5),
                                                             ("last measured", 4.5)]
    tl.once("first compiled", "compile")
    tl.once("first compiled", "compile")
    assert order_of(tl, "compile") == ["first compiled"]
    assert "d[n=3 busy=2.00 idle=0.50]" in tl.line()


@pytest.fixture(scope="module")
def job_results():
    plans = [AutoTuner.from_kernel(add, [dict(block_M=m, block_N=n) for m in (16, 32)])
             .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
             .set_tuning(n_jobs=2, progress=False, cache=False).plan(1, 3, label=f"add{n}") for n in (16, 32)]
    return tune_all(plans)


def test_a_job_has_one_timeline_from_the_plan_to_its_end(job_results):
    tl = job_results[0].timeline
    assert tl is not None and all(r.timeline is tl for r in job_results)
    assert tl.sorted_events()[0].what == "plan" and tl.sorted_events()[0].t == 0.0
    assert_before(tl, ("process spawned", MEASURER), ("job start", "job"), ("tune start", "job"), ("open", MEASURER),
                  ("opened", MEASURER), ("first config elaborated #0", MEASURER),
                  ("inputs made #0", MEASURER), ("reference timed #0", MEASURER), ("first kernel loaded #0", MEASURER),
                  ("first measured", MEASURER), ("last measured", MEASURER),
                  ("compile and measure done", "job"), ("finalists start", "add16"), ("finalists end", "add16"),
                  ("winner loaded", "add16"), ("finalists start", "add32"), ("job end", "job"))
    # the measuring process is forked and imports on its own, so "imports done" may come before "opened"
    assert_before(tl, ("process spawned", MEASURER), ("process up", MEASURER), ("torch imported", MEASURER),
                  ("device ready", MEASURER), ("tilelang imported", MEASURER), ("imports done", MEASURER),
                  ("first config elaborated #0", MEASURER))
    assert_before(tl, ("devices found", "add16"), ("measuring started", "add16"), ("key hashed", "add16"),
                  ("job start", "job"))
    assert order_of(tl, MEASURER).count("inputs made #0") == 1  # the first candidate used those made ahead
    assert_before(tl, ("pool start", "compile"), ("pool ready", "compile"), ("first compiled", "compile"),
                  ("last compiled", "compile"), ("compile and measure done", "job"))
    assert "inputs made #1" in order_of(tl, MEASURER)  # the second problem's inputs, in the same process
    use = tl.devices()[MEASURER]
    assert use["measured"] == 4 and 0 < use["busy_s"] <= use["last_s"] - use["ready_s"] + 1e-3, use
    d = tl.as_dict()
    assert [e[0] for e in d["events"]] == sorted(e[0] for e in d["events"]) and d["devices"][MEASURER] == use


def test_the_timeline_is_logged_in_one_line(caplog):
    with caplog.at_level(logging.INFO, logger="autotuner.job"):
        AutoTuner.from_kernel(add, [dict(block_M=16)]).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c") \
            .set_tuning(progress=False, cache=False, isolate=False).run(1, 3)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("timeline")]
    assert len(lines) == 1 and "measurer:imports done" not in lines[0], lines  # in this process: no start
    assert "compile:first compiled@" in lines[0] and "measurer[n=1 " in lines[0], lines
