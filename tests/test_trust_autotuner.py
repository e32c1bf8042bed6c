"""Trust: no fault may yield a wrong kernel, a hang or a misleading error (C target, so CI runs it).

Each test stands for a class of fault from the hostile-input review (issue "Trust"), with a
neighbour of the listed case where one exists.
"""

from __future__ import annotations

import logging
import math
import re
import sqlite3
import threading
import time
import warnings

import pytest
import torch
from kernels import trust_helper
from kernels.c_kernels import add, add_failing
from kernels.hostile_kernels import add_salted
from kernels.trust_kernels import (
    add_accumulate,
    add_by_process,
    add_clobber,
    add_helper,
    add_helper_work,
    add_loud,
    div_guarded,
    ref_add,
    ref_scale,
    scale_inplace,
    tril,
)

from autotuner import (
    AutoTuner,
    KernelFactoryWarning,
    Status,
    Trial,
    TuneResult,
    TuningCacheError,
    TuningError,
    TuningInputError,
)
from autotuner.cache import TuningCacheWarning, TuningDB, cache_dir, prim_hash
from autotuner.trial import error_headline, format_error

A64 = (64, 64)


def tuner(kernel, configs, isolate=False, **compile_args):
    compile_args.setdefault("out_idx", [-1])
    compile_args.setdefault("ref_prog", ref_add)
    compile_args.setdefault("target", "c")
    return (AutoTuner.from_kernel(kernel, configs).set_compile_args(**compile_args)
            .set_tuning(n_jobs=1, isolate=isolate, progress=False))


def db_rows(sql):
    return sqlite3.connect(cache_dir() / "tuning.sqlite").execute(sql).fetchall()


# ---------------------------------------------------------------------------------------------
# 1. a candidate that writes to its inputs; kernels that accumulate or update in place


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("victim", ["B", "A"])
def test_a_candidate_that_writes_an_input_is_a_mismatch_and_the_others_see_pristine_inputs(isolate, victim):
    configs = [dict(block_M=32, clobber=victim), dict(block_M=16), dict(block_M=64)]
    result = tuner(add_clobber, configs, isolate=isolate).run(1, 3)
    status = [t.status for t in result.trials]
    assert status == [Status.MISMATCH, Status.OK, Status.OK], result.trials
    err = result.trials[0].error
    assert f"({victim})" in err and "wrote to its input" in err and "restore_value" in err
    assert result.config.get("clobber", "") == ""
    a, b = torch.randn(A64), torch.randn(A64)
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_the_reference_may_change_its_inputs_without_harming_the_candidates():
    def ref_that_scribbles(A, B):
        out = A + B
        A.zero_()
        B.fill_(7.0)
        return out

    result = tuner(add_clobber, [dict(block_M=16), dict(block_M=32)], ref_prog=ref_that_scribbles).run(1, 3)
    assert [t.status for t in result.trials] == [Status.OK, Status.OK], result.trials


def test_a_reference_that_updates_its_input_in_place_and_returns_it_keeps_its_answer():
    """Its result aliases the input it updates, and timing the reference goes on updating that input: the
    outputs it is compared with are copies taken when it first ran."""
    result = tuner(scale_inplace, [dict(block_M=16), dict(block_M=32)], out_idx=[0], restore_value=["X"],
                   ref_prog=lambda X, Y: X.mul_(2).add_(Y)).run(1, 3)
    assert [t.status for t in result.trials] == [Status.OK, Status.OK], result.trials


def test_an_infinite_reference_is_matched_only_by_the_same_infinity():
    from autotuner.check import compare

    ref = torch.tensor([float("inf"), float("-inf"), 1.0])
    assert compare([ref.clone()], [ref], 1e-2, 1e-2, 0.0).ok
    for wrong in ([0.0, float("-inf"), 1.0], [float("inf"), float("inf"), 1.0], [float("nan"), float("-inf"), 1.0]):
        assert not compare([torch.tensor(wrong)], [ref], 1e-2, 1e-2, 0.0).ok, wrong

    def zeros_in_b(params):  # A / B has +-inf where B == 0
        g = torch.Generator().manual_seed(0)
        return [torch.rand(A64, generator=g) + 1, torch.randint(-2, 3, A64, generator=g).float()]

    def run(guard):
        return (AutoTuner.from_kernel(div_guarded, [dict(guard=guard)]).set_compile_args(out_idx=[-1], target="c")
                .set_profile_args(ref_prog=lambda A, B: A / B, supply_prog=zeros_in_b)
                .set_tuning(n_jobs=1, isolate=False, progress=False, cache=False).run(1, 3))

    assert [t.status for t in run(False).trials] == [Status.OK]
    with pytest.raises(TuningError, match="mismatch"):
        run(True)  # writes 0 where the reference is infinite


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_an_output_element_never_written_fails_whatever_the_right_value_is(dtype):
    """The kernel that skips the upper triangle, whose right value (0) is the first poison of unsigned
    integers, is a mismatch through the second poison; the one that writes it passes. (TileLang's C target
    compiles no bool buffers: bool's poisons are checked below.)"""
    ref = lambda A: torch.tril(A)  # noqa: E731
    ok = tuner(tril, [dict(dtype=dtype)], out_idx=[-1], ref_prog=ref, supply_type="integer").run(1, 3)
    assert [t.status for t in ok.trials] == [Status.OK]
    with pytest.raises(TuningError, match="mismatch") as e:
        tuner(tril, [dict(dtype=dtype, skip_zeros=True)], out_idx=[-1], ref_prog=ref, supply_type="integer").run(1, 3)
    assert ("with the second poison" in str(e.value)) == (dtype == "uint8"), str(e.value)  # signed: the first


def test_every_dtype_has_two_poisons_and_the_second_is_used_where_the_first_can_be_right():
    from autotuner.check import needs_second_poison, poison_

    for dtype in (torch.bool, torch.uint8, torch.int8, torch.int64, torch.float16, torch.bfloat16, torch.float32):
        first, second = poison_(torch.empty(3, dtype=dtype)), poison_(torch.empty(3, dtype=dtype), second=True)
        assert not bool((first == second).any()), dtype
        assert needs_second_poison([first], None) == (not dtype.is_floating_point), dtype
    floats = torch.zeros(3)
    assert not needs_second_poison([floats], [torch.ones(3)])
    assert needs_second_poison([floats], [torch.tensor([1.0, float("nan"), 0.0])])


def test_a_float_reference_with_nan_where_nothing_is_written_is_caught_by_the_second_poison():
    def ref(A):  # NaN in the upper triangle: the first poison would match it there
        return torch.tril(A) + torch.triu(torch.full_like(A, float("nan")), diagonal=1)

    with pytest.raises(TuningError, match="second poison"):
        tuner(tril, [dict(dtype="float32", skip_zeros=True)], out_idx=[-1], ref_prog=ref).run(1, 3)


@pytest.mark.parametrize("verdict", [False, "tensor", "numpy", "raises"])
def test_a_falsy_manual_check_verdict_of_any_type_is_a_mismatch(verdict):
    import numpy as np
    from kernels.c_kernels import add_buggy

    def check(outs, refs):
        same = torch.isclose(outs[0], refs[0], atol=1e-2)
        return {False: bool(same.all()), "tensor": same.all(), "numpy": np.all(same.numpy()), "raises": same}[verdict]

    with pytest.raises(TuningError, match="manual_check_prog"):  # block_N=16 computes A - B
        (AutoTuner.from_kernel(add_buggy, [dict(block_N=16)]).set_compile_args(out_idx=[-1], target="c")
         .set_profile_args(ref_prog=ref_add, manual_check_prog=check)
         .set_tuning(n_jobs=1, isolate=False, progress=False, cache=False).run(1, 3))


@pytest.mark.parametrize("isolate", [False, True])
def test_an_accumulating_kernel_is_checked_and_timed_on_zeroed_outputs(isolate):
    cfgs = [dict(block_M=16), dict(block_M=32)]
    with pytest.raises(TuningError, match="2 mismatch"):  # on NaN-poisoned outputs it cannot pass
        tuner(add_accumulate, cfgs).run(1, 3)
    result = tuner(add_accumulate, cfgs, isolate=isolate, reset_to_zero=["C"]).run(2, 5)
    assert [t.status for t in result.trials] == [Status.OK, Status.OK], result.trials
    a, b = torch.randn(A64), torch.randn(A64)
    torch.testing.assert_close(result.kernel(a, b), a + b)  # the returned kernel zeroes its output too
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_an_in_place_kernel_is_checked_on_restored_arguments():
    cfgs = [dict(block_M=16), dict(block_M=32)]
    result = tuner(scale_inplace, cfgs, out_idx=[0], ref_prog=ref_scale, restore_value=["X"]).run(2, 5)
    assert [t.status for t in result.trials] == [Status.OK, Status.OK], result.trials
    x, y = torch.randn(A64), torch.randn(A64)
    want = 2 * x + y
    torch.testing.assert_close(result.kernel(x, y), want)
    # without restore_value, an argument updated in place is an input the kernel wrote to
    bad = tuner(scale_inplace, cfgs, out_idx=[], ref_prog=None, skip_check=True)
    with pytest.raises(TuningError, match=r"wrote to its input argument 0 \(X\)"):
        bad.run(1, 2)


def test_reset_and_restore_name_real_arguments():
    with pytest.raises(TuningInputError, match="reset_to_zero names 'D'"):
        tuner(add_accumulate, [dict(block_M=16)], reset_to_zero=["D"]).run(1, 2)
    with pytest.raises(TypeError, match="reset_to_zero entries"):
        tuner(add_accumulate, [dict(block_M=16)], reset_to_zero=[1.5])


# ---------------------------------------------------------------------------------------------
# 2. a stale warm hit when code the kernel calls changes; 3. damaged or tampered rows


def _tune_helper(**kw):
    return tuner(add_helper, [dict(block_M=16), dict(block_M=32), dict(block_M=64)], **kw).run(1, 3)


def test_a_helper_edited_for_the_winner_only_is_not_served_from_the_cache(monkeypatch):
    first = _tune_helper()
    assert _tune_helper().from_cache
    winner = first.config["block_M"]
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 1.0 if block_M == winner else 0.0)
    with pytest.warns(TuningCacheWarning, match="elaborates to a different PrimFunc"):
        again = _tune_helper()
    assert not again.from_cache and again.config["block_M"] != winner
    assert {t.config["block_M"]: t.status for t in again.trials}[winner] == Status.MISMATCH
    a, b = torch.randn(A64), torch.randn(A64)
    torch.testing.assert_close(again.kernel(a, b), a + b)


@pytest.mark.parametrize("isolate", [False, True])
def test_a_resumed_trial_whose_code_changed_since_is_checked_before_it_can_win(monkeypatch, isolate):
    """An interrupted run is resumed from its recorded trials; a helper edited meanwhile makes its winner
    wrong. Its trial was checked in the earlier run only, so it is checked again before the finalist rounds
    time it, and fails: the winner is a correct config, in this run and (cached) in the next."""
    def tune():
        configs = [dict(work=1), dict(work=20), dict(work=40)]  # work=1 is by far the fastest
        return tuner(add_helper_work, configs, isolate=isolate).run(1, 5)

    assert tune().config == dict(work=1)
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    db.execute("UPDATE runs SET finished=NULL, best_config=NULL")  # as if interrupted in its finalist rounds
    db.commit()
    monkeypatch.setattr(trust_helper, "bias", lambda work: 1.0 if work == 1 else 0.0)
    for attempt in range(2):
        again = tune()
        assert again.config["work"] != 1 and again.from_cache == (attempt == 1), (attempt, again.trials)
        a, b = torch.randn(A64), torch.randn(A64)
        torch.testing.assert_close(again.kernel(a, b), a + b)


def test_a_warm_hit_is_checked_against_the_reference_once(monkeypatch):
    """The key covers the reference; what it cannot see (here the database is told a different
    winner's hash matches) the one check on the warm path still catches."""
    _tune_helper()
    import autotuner.compile as compile_mod
    import autotuner.tuner as tuner_mod

    for mod in (tuner_mod, compile_mod):  # the tuner hashes what it elaborates; build() what it compiles
        monkeypatch.setattr(mod, "prim_hash", lambda func: "same")
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    db.execute("UPDATE runs SET best_prim='same'")
    db.commit()
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 1.0)  # every config is now wrong
    with pytest.warns(TuningCacheWarning, match="fails its check again"), pytest.raises(TuningError, match="mismatch"):
        _tune_helper()


TAMPER = [
    ("UPDATE runs SET best_config='{\"block_M\": 999}'", "not one of the configs"),
    ("UPDATE runs SET best_config='not json'", "damaged row"),
    ("UPDATE runs SET best_config='[1, 2]'", "damaged row"),
    ("UPDATE runs SET best_latency_ms=-1", "damaged row"),
    ("UPDATE trials SET status='mismatch' WHERE median_ms=(SELECT best_latency_ms FROM runs)", "not ok"),
    ("UPDATE trials SET status='splendid'", "damaged row"),
    ("UPDATE trials SET median_ms=0.0001 WHERE median_ms=(SELECT best_latency_ms FROM runs)", "not ok at the stored"),
    ("UPDATE trials SET config='{\"block_M\": 64}' WHERE idx=0", "not configs[0]"),
    ("DELETE FROM trials WHERE idx=1", "trials cover configs"),
    ("UPDATE runs SET best_prim=NULL", "without the winner's PrimFunc hash"),
]


@pytest.mark.parametrize("sql, why", TAMPER)
def test_a_tampered_row_is_ignored_with_a_warning_and_the_problem_retuned(sql, why):
    first = _tune_helper()
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    db.execute(sql)
    db.commit()
    with pytest.warns(TuningCacheWarning, match=re.escape(why)):
        again = _tune_helper()
    assert not again.from_cache and again.key == first.key
    assert [t.status for t in again.trials] == [Status.OK] * 3
    assert _tune_helper().from_cache  # the re-tune stored a sound run again


def test_configs_that_differ_only_in_value_type_are_told_apart_by_the_warm_path():
    """64.0 and 64 are two configs to the database (their canonical JSON), though ``==`` says one: the stored
    winner is found by its text, so the second run is a warm hit on the int config that won."""
    cfgs = [dict(block_M=64.0), dict(block_M=64)]  # the float one does not compile
    first = tuner(add, cfgs).run(1, 2)
    second = tuner(add, cfgs).run(1, 2)
    assert [t.status for t in first.trials] == [Status.COMPILE_ERROR, Status.OK]
    assert second.from_cache and type(second.config["block_M"]) is int, second


def test_resumed_trials_for_other_configs_are_measured_again():
    cfgs = [dict(block_M=16), dict(block_M=32)]
    r = tuner(add, cfgs).run(1, 2)
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    db.execute("UPDATE runs SET finished=NULL")  # as if interrupted
    db.execute("UPDATE trials SET config='{\"block_M\": 8}' WHERE idx=1")
    db.commit()
    with pytest.warns(TuningCacheWarning, match=r"trials \[1\]"):
        again = tuner(add, cfgs).run(1, 2)
    assert [t.config for t in again.trials] == cfgs and again.config in cfgs and not again.from_cache
    assert r.key == again.key


# ---------------------------------------------------------------------------------------------
# 4. no user code in the parent without a bound


def test_a_factory_that_hangs_for_the_first_config_costs_one_trial():
    t0 = time.perf_counter()
    result = tuner(add_failing, [dict(block_M=64, hang=True), dict(block_M=32)], out_idx=[-1],
                   compile_timeout=10).run(1, 2)
    assert time.perf_counter() - t0 < 60
    assert [t.status for t in result.trials] == [Status.TIMEOUT, Status.OK]


def test_a_factory_that_hangs_on_the_warm_path_ends_in_an_error_not_a_hang(monkeypatch):
    first = _tune_helper(compile_timeout=6)
    winner = first.config["block_M"]
    monkeypatch.setattr(trust_helper, "hang_for", lambda block_M: block_M == winner)
    t0 = time.perf_counter()
    with pytest.raises(TuningError, match=r"did not return within 6 s"):
        _tune_helper(compile_timeout=6)
    assert time.perf_counter() - t0 < 40


# ---------------------------------------------------------------------------------------------
# 7. a broken reference is the reference's fault


def _raises(*a):
    return 1 / 0


BAD_REFS = [
    (_raises, ZeroDivisionError, "raised ZeroDivisionError"),
    (lambda A, B: None, type(None), "returned None"),
    (lambda A, B: (A + B, A - B), type(None), "returned 2 outputs"),
    (lambda A, B: (A + B)[:3], type(None), r"output 0 of shape \(3, 64\)"),
    (lambda A: A, TypeError, "raised TypeError"),
]


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize("ref, cause, match", BAD_REFS)
def test_a_broken_reference_is_one_input_error_and_nothing_is_cached(isolate, ref, cause, match):
    t = tuner(add_clobber, [dict(block_M=16), dict(block_M=32)], isolate=isolate, ref_prog=ref)
    with pytest.raises(TuningInputError, match=match) as e:
        t.run(1, 2)
    assert "reference program" in str(e.value)
    if cause is not type(None):
        assert isinstance(e.value.__cause__, cause)
    assert db_rows("SELECT COUNT(*) FROM trials") == [(0,)]
    assert db_rows("SELECT COUNT(*) FROM runs") == [(0,)]


def test_out_idx_out_of_range_is_refused_not_wrapped():
    for out_idx in ([5], [-4], [0, -3]):
        with pytest.raises(TuningInputError, match=r"out_idx|names parameter"):
            tuner(add_clobber, [dict(block_M=16)], out_idx=out_idx).run(1, 2)
    assert db_rows("SELECT COUNT(*) FROM trials") == [(0,)]


# ---------------------------------------------------------------------------------------------
# 8, 9. errors that name the real fault


def test_tuning_error_keeps_the_exception_message_whole():
    with pytest.raises(TuningError) as e:
        tuner(add_loud, [dict(block_M=16), dict(block_M=32)]).run(1, 2)
    text = str(e.value)
    assert "2 compile_error" in text
    assert "ValueError: block_M=16 cannot work: the first line names the fault." in text
    assert "^^^" not in text and 'File "' not in text


def test_error_headline_finds_the_compilers_own_line():
    tvm_style = ("InternalError: Traceback (most recent call last):\n  5: tvm::codegen::Build\n  0: foo\n"
                 "  File \"/src/codegen.cc\", line 12\nInternalError: Check failed: (x) is false: bad tile 48")
    assert error_headline(tvm_style).endswith("InternalError: Check failed: (x) is false: bad tile 48")
    nvcc_style = ("RuntimeError: Compilation error:\n/tmp/k.cu(41): error: identifier \"foo\" is undefined\n"
                  "1 error detected")
    head = error_headline(nvcc_style)
    assert head.startswith("RuntimeError: Compilation error:") and 'error: identifier "foo" is undefined' in head
    try:
        raise ValueError("x" * 50000)
    except ValueError as exc:
        kept = format_error(exc)
    assert kept.startswith("ValueError: xxx") and "characters cut" in kept and len(kept) < 25000
    for blank in ("", "   ", "\n\n", None):
        assert error_headline(blank) == ""


def test_summary_survives_blank_and_odd_errors():
    trials = [Trial(dict(block_M=16), Status.OK, None, 0.1, 1.0, 1.0, 0.0),
              Trial(dict(block_M=32), Status.COMPILE_ERROR, "   ", 0.2),
              Trial(dict(block_M=64), Status.MISMATCH, "\n\n", 0.2),
              Trial(dict(block_M=8), Status.RUNTIME_ERROR, "", 0.2)]
    r = TuneResult(None, dict(block_M=16), 1.0, None, trials, False, "k", 1.0, "c")
    text = r.summary(file=open("/dev/null", "w"))
    assert "compile_error" in text and "mismatch" in text


# ---------------------------------------------------------------------------------------------
# 10. settings refused up front, the same way through every setter


BAD_SETTINGS = [
    ("set_compile_args", dict(atol=math.nan), ValueError, "atol must be a finite number"),
    ("set_compile_args", dict(rtol=-1e-3), ValueError, "rtol must be >= 0"),
    ("set_compile_args", dict(atol="0.1"), TypeError, "atol must be a number"),
    ("set_compile_args", dict(compile_timeout=math.inf), ValueError, "compile_timeout must be a finite"),
    ("set_compile_args", dict(skip_check="no"), TypeError, "skip_check must be True or False"),
    ("set_compile_args", dict(out_idx=[-1, -1]), ValueError, "names an output twice"),
    ("set_compile_args", dict(out_idx=[1.0]), TypeError, "out_idx entries must be ints"),
    ("set_compile_args", dict(out_idx="C"), TypeError, "out_idx must be an int or a list"),
    ("set_compile_args", dict(target="nonsense"), ValueError, "unknown target 'nonsense'"),
    ("set_compile_args", dict(target={"kind": "cuda", "arch": "sm_9x"}), ValueError, "not a CUDA architecture"),
    ("set_compile_args", dict(target={"kind": "cuda", "arch": "sm_90a", "bogus": 1}), ValueError, "option 'bogus'"),
    ("set_compile_args", dict(target={"arch": "sm_90a"}), ValueError, "add 'kind': 'cuda'"),
    ("set_compile_args", dict(target=5), TypeError, "target must be 'auto', 'cuda', 'c'"),
    ("set_compile_args", dict(pass_configs=["tl.disable_tma_lower"]), TypeError, "pass_configs must be a dict"),
    ("set_profile_args", dict(timeout=0), ValueError, "timeout must be > 0"),
    ("set_profile_args", dict(timeout=-5), ValueError, "timeout must be > 0"),
    ("set_profile_args", dict(atol=math.nan), ValueError, "atol must be a finite number"),
    ("set_profile_args", dict(warmup=-1), ValueError, "warmup must be >= 0"),
    ("set_profile_args", dict(rep=2.5), TypeError, "rep must be an int"),
    ("set_profile_args", dict(backend="cupti"), ValueError, "backend='cupti'"),
    ("set_tuning", dict(n_jobs=True), TypeError, "n_jobs must be a number"),
    ("set_tuning", dict(n_jobs=0), ValueError, "n_jobs must be a positive"),
    ("set_tuning", dict(n_jobs=-2), ValueError, "n_jobs must be >= -1"),
    ("set_tuning", dict(n_jobs=2.0), TypeError, "n_jobs must be an int"),
    ("set_tuning", dict(run_timeout=0), ValueError, "run_timeout must be > 0"),
    ("set_tuning", dict(run_timeout=math.nan), ValueError, "run_timeout must be a finite"),
    ("set_tuning", dict(timing="fast"), ValueError, "timing must be one of"),
    ("set_tuning", dict(timing_backend="cupti"), ValueError, "timing_backend must be one of"),
    ("set_tuning", dict(finalist_margin=-0.1), ValueError, "finalist_margin must be >= 0"),
    ("set_tuning", dict(finalist_rounds=0), ValueError, "finalist_rounds must be >= 1"),
    ("set_tuning", dict(cache="yes"), TypeError, "cache must be True or False"),
]


@pytest.mark.parametrize("setter, kwargs, exc, match", BAD_SETTINGS)
def test_bad_settings_are_refused_naming_the_value(setter, kwargs, exc, match):
    t = AutoTuner.from_kernel(add, [dict(block_M=32)])
    with pytest.raises(exc, match=match):
        getattr(t, setter)(**kwargs)


def test_run_counts_are_checked_by_the_same_validator():
    t = AutoTuner.from_kernel(add, [dict(block_M=32)]).set_compile_args(target="c")
    with pytest.raises(TypeError, match="warmup must be a number"):
        t.run(warmup=True, rep=3)
    with pytest.raises(ValueError, match="cudagraph"):
        t.set_compile_args(target="c", reset_to_zero=["C"]).set_tuning(timing_backend="cudagraph").run(1, 2)
    with pytest.raises(ValueError, match="timing='batched' .* use timing='back_to_back' with reset_to_zero"):
        t.set_tuning(timing_backend="event", timing="batched").run(1, 2)


# ---------------------------------------------------------------------------------------------
# 14. a damaged database or an unusable cache directory


def _garbage(path):
    path.write_bytes(b"this is not a database, it only has its name" * 100)


def _truncated(path):
    TuningDB(path).close()
    good = tuner(add, [dict(block_M=16), dict(block_M=32)], ).set_tuning(n_jobs=1, isolate=False, progress=False,
                                                                         db_path=str(path))
    good.run(1, 2)
    data = path.read_bytes()
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        wal.unlink()
    path.write_bytes(data[: len(data) // 2 + 100])


def test_a_run_deleted_while_it_runs_is_opened_again_by_its_next_trial(tmp_path):
    """``tilecarve cache clear`` in another process while a run records its trials."""
    path = tmp_path / "tuning.sqlite"
    db, other = TuningDB(path), TuningDB(path)
    db.open_run("k" * 64, "add", "c", 2, {})
    db.record_trial("k" * 64, 0, Trial(dict(block_M=16), Status.OK, None, 0.1, 1.0, 1.0, 0.0))
    other.delete(["k" * 64])
    db.record_trial("k" * 64, 1, Trial(dict(block_M=32), Status.OK, None, 0.1, 2.0, 2.0, 0.0))
    assert list(db.trials("k" * 64)) == [1]
    db.close()
    other.close()


@pytest.mark.parametrize("where", ["record_trial", "finish_run", "open_run"])
def test_a_database_that_fails_mid_run_costs_the_record_not_the_run(tmp_path, monkeypatch, where):
    """Locked past its timeout by another process, a full disk: a warning, and the run returns its result."""
    real = getattr(TuningDB, where)
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(where)
        if len(calls) == 2 or where != "record_trial":
            raise sqlite3.OperationalError("database is locked")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(TuningDB, where, failing)
    with pytest.warns(TuningCacheWarning, match="database is locked.*not stored"):
        result = tuner(add, [dict(block_M=16), dict(block_M=32), dict(block_M=64)]).set_tuning(
            db_path=str(tmp_path / "tuning.sqlite")).run(1, 2)
    assert [t.status for t in result.trials] == [Status.OK] * 3 and len(calls) <= 2
    a, b = torch.randn(256, 256), torch.randn(256, 256)  # c_kernels.add's shape
    torch.testing.assert_close(result.kernel(a, b), a + b)


@pytest.mark.parametrize("damage", [_garbage, _truncated])
def test_a_damaged_database_is_moved_aside_and_a_new_one_started(tmp_path, damage):
    path = tmp_path / "tuning.sqlite"
    damage(path)
    before = path.read_bytes()
    with pytest.warns(TuningCacheWarning, match="damaged") as w:
        r = tuner(add, [dict(block_M=16)]).set_tuning(n_jobs=1, isolate=False, progress=False,
                                                     db_path=str(path)).run(1, 2)
    assert r.trials[0].status == Status.OK
    aside = [p for p in tmp_path.iterdir() if ".damaged-" in p.name and not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == before  # kept, byte for byte
    msg = next(str(x.message) for x in w if issubclass(x.category, TuningCacheWarning))
    assert str(path) in msg and str(aside[0]) in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error", TuningCacheWarning)
        assert tuner(add, [dict(block_M=16)]).set_tuning(n_jobs=1, isolate=False, progress=False,
                                                        db_path=str(path)).run(1, 2).from_cache


def test_an_unusable_cache_directory_names_it_and_the_ways_out(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TILECARVE_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(TuningCacheError) as e:
        tuner(add, [dict(block_M=16)]).run(1, 2)
    assert str(blocker / "cache") in str(e.value) and "TILECARVE_CACHE_DIR" in str(e.value)
    assert "cache=False" in str(e.value)
    (tmp_path / "dir-db").mkdir()
    with pytest.raises(TuningCacheError, match="dir-db"):
        TuningDB(tmp_path / "dir-db")
    r = tuner(add, [dict(block_M=16)]).set_tuning(n_jobs=1, isolate=False, progress=False, cache=False).run(1, 2)
    assert r.trials[0].status == Status.OK


# ---------------------------------------------------------------------------------------------
# measurement fidelity: finalists re-timed in interleaved rounds, the pick made on them


def test_finalists_are_retimed_in_interleaved_rounds_and_the_pick_is_made_on_them(monkeypatch):
    import autotuner.bench as bench_mod
    from autotuner.timing import Timing

    order: list[int] = []
    real_measure = bench_mod.Bench.measure

    def fake_measure(self, index, cfg, compile_s, prim=None):  # all equally fast in the first pass
        t = real_measure(self, index, cfg, compile_s, prim)
        return Trial(t.config, t.status, t.error, t.compile_s, 1.0, 1.0, 0.0)

    def fake_retime(self, index, cfg, prim=None):  # in rounds, config 2 is the fastest
        order.append(index)
        return Timing({0: 1.02, 1: 1.05, 2: 0.99, 3: 1.01}[index] + 0.001 * len(order) % 3, 0.9, 0.01, 5)

    monkeypatch.setattr(bench_mod.Bench, "measure", fake_measure)
    monkeypatch.setattr(bench_mod.Bench, "retime", fake_retime)
    cfgs = [dict(block_M=bm) for bm in (8, 16, 32, 64)]
    r = tuner(add, cfgs).set_tuning(n_jobs=1, isolate=False, progress=False, finalist_rounds=3).run(1, 2)
    assert r.config == dict(block_M=32)
    assert len(order) == 12 and order[:4] != order[4:8]  # every finalist each round, in rotated order
    assert all(t.rounds == 3 and t.spread is not None and t.spread >= 0 for t in r.trials)
    assert r.spread == next(t.spread for t in r.trials if t.config == r.config)
    assert r.latency == min(t.median_ms for t in r.trials)
    assert list(r.phases) == ["start", "compile and measure", "finalist rounds", "load the winner",
                              "check the winner"]
    assert all(v >= 0 for v in r.phases.values()) and sum(r.phases.values()) <= r.seconds
    warm = tuner(add, cfgs).set_tuning(n_jobs=1, isolate=False, progress=False, finalist_rounds=3).run(1, 2)
    assert warm.from_cache and warm.config == r.config and warm.trials[2].rounds == 3


def test_the_three_fastest_are_finalists_even_when_one_timing_leads_by_more_than_the_margin(monkeypatch):
    """One timing per candidate drifts between the first and last of a job: a candidate 5% behind the
    first pass's fastest (outside the 3% margin) still goes to the rounds, and wins there."""
    import autotuner.bench as bench_mod
    from autotuner.job import MIN_FINALISTS
    from autotuner.timing import Timing

    first = {0: 1.00, 1: 1.05, 2: 1.06, 3: 1.20}  # in the first pass config 0 looks 5% ahead
    rounds = {0: 1.03, 1: 1.01, 2: 1.04, 3: 0.5}  # in rounds config 1 is the fastest; 3 never gets there
    real_measure = bench_mod.Bench.measure
    retimed: list[int] = []

    def fake_measure(self, index, cfg, compile_s, prim=None):
        t = real_measure(self, index, cfg, compile_s, prim)
        return Trial(t.config, t.status, t.error, t.compile_s, first[index], first[index], 0.0)

    def fake_retime(self, index, cfg, prim=None):
        retimed.append(index)
        return Timing(rounds[index], rounds[index], 0.0, 5)

    monkeypatch.setattr(bench_mod.Bench, "measure", fake_measure)
    monkeypatch.setattr(bench_mod.Bench, "retime", fake_retime)
    cfgs = [dict(block_M=bm) for bm in (8, 16, 32, 64)]
    r = tuner(add, cfgs).set_tuning(n_jobs=1, isolate=False, progress=False, cache=False,
                                    finalist_rounds=2).run(1, 2)
    assert MIN_FINALISTS == 3 and set(retimed) == {0, 1, 2}
    assert r.config == dict(block_M=16)
    retimed.clear()
    tuner(add, cfgs).set_tuning(n_jobs=1, isolate=False, progress=False, cache=False, finalist_rounds=2,
                                max_finalists=2).run(1, 2)
    assert set(retimed) == {0, 1}  # max_finalists still caps the rounds


# ---------------------------------------------------------------------------------------------
# 6. a run's temporary files go with it


@pytest.mark.parametrize("isolate", [False, True])
def test_a_run_leaves_no_temporary_files(tmp_path, monkeypatch, isolate):
    import tempfile

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    salt = time.time_ns()  # kernels TileLang's cache has never seen, so they really compile here
    cfgs = [dict(block_M=16, salt=salt), dict(block_M=32, salt=salt)]
    r = tuner(add_salted, cfgs, isolate=isolate).set_tuning(n_jobs=2, isolate=isolate, progress=False).run(1, 2)
    assert [t.status for t in r.trials] == [Status.OK, Status.OK], r.trials
    assert all(t.compile_s > 0 for t in r.trials)
    assert list(tmp.iterdir()) == []
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(r.kernel(a, b), a + b)  # the winner does not live in the removed directory


def test_the_winner_is_rechecked_in_the_parent_only_when_it_was_not_checked_as_loaded(monkeypatch):
    """After isolated measuring the parent loads the winner again; when it is the very PrimFunc the
    measuring process checked, a second check is skipped; a winner from a resumed run is checked."""
    calls = []
    real = AutoTuner._verified

    def counting(self, jit, spec):
        calls.append(1)
        return real(self, jit, spec)

    monkeypatch.setattr(AutoTuner, "_verified", counting)
    cfgs = [dict(block_M=16), dict(block_M=32)]
    r = tuner(add, cfgs, isolate=True).run(1, 2)
    assert not r.from_cache and calls == []
    db = sqlite3.connect(cache_dir() / "tuning.sqlite")
    db.execute("UPDATE runs SET finished=NULL")  # as if interrupted after every trial was measured
    db.commit()
    again = tuner(add, cfgs, isolate=True).run(1, 2)
    assert not again.from_cache and calls == [1]
    assert tuner(add, cfgs, isolate=True).run(1, 2).from_cache and calls == [1, 1]  # the warm path checks


# ---------------------------------------------------------------------------------------------
# the kernel returned, and every finalist re-timed, is the PrimFunc a compile worker built: the one checked


@pytest.mark.parametrize("isolate", [False, True])
def test_the_kernel_returned_is_the_one_timed_when_the_factory_elaborates_otherwise_here(isolate, monkeypatch):
    """A factory that gives another program outside a compile worker: the kernel returned is the worker's,
    checked and timed, and the user is told; a later run does not serve the stored result, and says why."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    cfgs = [dict(block_M=16), dict(block_M=32), dict(block_M=64)]
    with pytest.warns(KernelFactoryWarning, match=r"add_by_process\(M=\d+\) elaborates to a different "
                      r"PrimFunc in this process .*hash \w{12} here, \w{12} there.*CUDA_VISIBLE_DEVICES"):
        result = tuner(add_by_process, cfgs, isolate=isolate).set_tuning(n_jobs=2).run(1, 3)
    here = prim_hash(add_by_process(**result.config))
    assert here != _worker_hash(result.config, monkeypatch) == prim_hash(result.kernel.jit_kernel.prim_func)
    a, b = torch.randn(A64), torch.randn(A64)
    torch.testing.assert_close(result.kernel(a, b), a + b)
    with pytest.warns(KernelFactoryWarning), pytest.warns(TuningCacheWarning, match="depends on the process it runs"):
        again = tuner(add_by_process, cfgs, isolate=isolate).set_tuning(n_jobs=2).run(1, 3)
    assert not again.from_cache
    assert prim_hash(again.kernel.jit_kernel.prim_func) == _worker_hash(again.config, monkeypatch)


def test_a_job_that_loads_no_winner_still_says_when_the_factory_differs_here(monkeypatch):
    """``tune_all(load_kernels=False)`` (model code's jobs): the winner is built later, here, by a keyed
    kernel, so the factory's difference matters all the more."""
    from autotuner import tune_all

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plan = tuner(add_by_process, [dict(block_M=16), dict(block_M=32)], isolate=True).set_tuning(n_jobs=2).plan(1, 3)
    with pytest.warns(KernelFactoryWarning, match="where a keyed kernel or a table builds the winner"):
        (result,) = tune_all([plan], progress=False, load_kernels=False)
    assert result.kernel is None and result.config in plan.configs


def _worker_hash(cfg, monkeypatch):
    """What ``add_by_process`` elaborates to for ``cfg`` in a compile worker."""
    with monkeypatch.context() as mp:
        mp.setenv("CUDA_VISIBLE_DEVICES", "")
        return prim_hash(add_by_process(**cfg))


def test_finalists_re_timed_on_another_device_and_the_winner_load_what_the_worker_built(monkeypatch):
    """Two fake devices: a finalist that one measured is re-timed on the other, and the winner is loaded
    here, both from the compile worker's PrimFunc; the factory, which fails outside a compile worker, is
    not asked again (before, either step elaborated the config where it ran)."""
    from autotuner.bench import IsolatedBench

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    calls: list[tuple[str, str, int]] = []
    real_call = IsolatedBench._call

    def call(self, msg, timeout):
        where = threading.current_thread().name.removeprefix("tilecarve-measure-")
        if msg[0] == "measure" and where == "cpu:0" and not any(c[0] == "cpu:0" for c in calls):
            time.sleep(5)  # so that cpu:1 measures the others, and finalists it measured move to cpu:0
        calls.append((where, msg[0], msg[2] if msg[0] in ("measure", "retime") else -1))
        return real_call(self, msg, timeout)

    monkeypatch.setattr(IsolatedBench, "_call", call)
    cfgs = [dict(block_M=m, block_N=n, elsewhere="raise") for m in (16, 32, 64) for n in (16, 32)]
    t = (AutoTuner.from_kernel(add_by_process, cfgs).set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
         .set_tuning(n_jobs=2, devices=[0, 1], max_finalists=6, finalist_margin=1.0, progress=False))
    with pytest.warns(KernelFactoryWarning, match="here it fails: RuntimeError: this factory only elaborates"):
        result = t.run(1, 3)
    assert [t.status for t in result.trials] == [Status.OK] * 6, result.trials
    on_1 = {i for where, op, i in calls if where == "cpu:1" and op == "measure"}
    assert on_1 & {i for where, op, i in calls if where == "cpu:0" and op == "retime"}, calls
    a, b = torch.randn(A64), torch.randn(A64)
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_a_measuring_side_that_never_measured_a_candidate_re_times_it_from_its_primfunc(monkeypatch, caplog):
    from autotuner.bench import Bench
    from autotuner.compile import compile_all

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    t = tuner(add_by_process, [dict(block_M=m, elsewhere="raise") for m in (16, 32)])
    outs = sorted(compile_all(add_by_process, t.configs, [0, 1], "c", timeout=120, n_jobs=2), key=lambda o: o.index)
    assert [o.status for o in outs] == [Status.OK, Status.OK], outs
    bench = Bench(t.plan(1, 3).spec)
    with caplog.at_level(logging.WARNING, logger="autotuner.bench"):
        assert bench.retime(0, t.configs[0]) is None  # no PrimFunc (a trial resumed from an earlier run)
    assert "could not be re-timed: RuntimeError: this factory only elaborates in a compile worker" in caplog.text
    assert bench.retime(1, t.configs[1], outs[1].prim).median_ms > 0


# ---------------------------------------------------------------------------------------------
# a candidate that leaves its process's CUDA context unusable (simulated here; on a GPU in test_trust_gpu.py)

_LOST = {"by": None}  # in each measuring process its own copy (forked): which config broke its context


def _losing_measure(real):
    def measure(self, index, cfg, compile_s, prim=None):
        if _LOST["by"] is not None:  # every CUDA call fails once the context is gone
            raise RuntimeError("CUDA error: device-side assert triggered")
        if cfg["block_M"] == 32:
            _LOST["by"] = cfg
            self.launched = True  # its kernel ran, and broke the context
            return Trial(cfg, Status.RUNTIME_ERROR, "CUDA error: device-side assert triggered", compile_s)
        return real(self, index, cfg, compile_s, prim)

    return measure


@pytest.mark.parametrize("isolate", [True, False])
def test_a_candidate_that_loses_the_cuda_context_costs_its_own_trial_only(monkeypatch, isolate):
    """Isolated, the measuring process exits (its context probed after the failure) and is replaced: the
    candidate that did it is a runtime error, the ones after it are measured (before, the next one's first
    CUDA call failed and stopped the whole run as "a tilecarve bug"). In the tuning process itself the run
    cannot go on, and the error says why and what to do."""
    from autotuner import CudaContextLost
    from autotuner import bench as bench_mod

    monkeypatch.setitem(_LOST, "by", None)
    monkeypatch.setattr(bench_mod.Bench, "measure", _losing_measure(bench_mod.Bench.measure))
    monkeypatch.setattr(bench_mod.Benches, "_context_lost",
                        lambda self: None if _LOST["by"] is None else "AcceleratorError: device-side assert triggered")
    cfgs = [dict(block_M=16), dict(block_M=32), dict(block_M=64), dict(block_M=16, block_N=16)]
    t = tuner(add, cfgs, isolate=isolate).set_tuning(n_jobs=1, isolate=isolate, progress=False, cache=False)
    if not isolate:
        with pytest.raises(CudaContextLost, match=r"config M=32 left its process's CUDA context unusable "
                           r"\(AcceleratorError.*its own failure: CUDA error.*isolate=True \(the default\)"):
            t.run(1, 3)
        return
    result = t.run(1, 3)
    assert [t.status for t in result.trials] == [Status.OK, Status.RUNTIME_ERROR, Status.OK, Status.OK], result.trials
    assert "CUDA context unusable (AcceleratorError" in result.trials[1].error, result.trials[1].error
    assert "its own failure: CUDA error" in result.trials[1].error and "replaced" in result.trials[1].error
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_a_context_broken_by_the_reference_is_the_problems_error_not_a_candidates(monkeypatch):
    """No kernel of the candidate ran (the reference, run at its first check, broke the context): the
    problem is wrong, and says so; no candidate is blamed for the context."""
    from autotuner import bench as bench_mod

    def measure(self, index, cfg, compile_s, prim=None):
        _LOST["by"] = cfg
        raise TuningInputError("ref_prog raised: CUDA error: device-side assert triggered")

    monkeypatch.setitem(_LOST, "by", None)
    monkeypatch.setattr(bench_mod.Bench, "measure", measure)
    monkeypatch.setattr(bench_mod.Benches, "_context_lost", lambda self: "AcceleratorError: device-side assert")
    with pytest.raises(TuningInputError, match="ref_prog raised"):
        tuner(add, [dict(block_M=16), dict(block_M=32)], isolate=True).set_tuning(n_jobs=1, progress=False,
                                                                               cache=False).run(1, 3)


# ---------------------------------------------------------------------------------------------
# the check's tolerances: per output, per dtype, per scale; the setters in either order


def test_integer_outputs_must_equal_the_reference_by_default():
    """A tolerance of 1e-2 + 1e-2*|ref| passed 5005 for 5000; integers are exact unless a tolerance is given."""
    from kernels.trust_kernels import affine

    ref = lambda A, B: A * 1000 + B  # noqa: E731
    ok = tuner(affine, [dict()], ref_prog=ref, supply_type="integer").run(1, 3)
    assert [t.status for t in ok.trials] == [Status.OK]
    with pytest.raises(TuningError, match=r"mismatch.*atol=0, rtol=0"):
        tuner(affine, [dict(extra=1)], ref_prog=ref, supply_type="integer").run(1, 3)
    # a tolerance given is used as given (|A| <= 2 on integer supply)
    loose = tuner(affine, [dict(extra=1)], ref_prog=ref, supply_type="integer", atol=2, rtol=0).run(1, 3)
    assert [t.status for t in loose.trials] == [Status.OK]


def test_the_default_atol_scales_down_to_small_outputs():
    """A fixed atol of 1e-2 passed a kernel writing zeros against a reference of 1e-3 values."""
    from kernels.trust_kernels import small_sum

    from autotuner.check import compare, tolerances

    ref = lambda A, B: (A + B) * 1e-3  # noqa: E731
    assert [t.status for t in tuner(small_sum, [dict()], ref_prog=ref).run(1, 3).trials] == [Status.OK]
    with pytest.raises(TuningError, match="mismatch"):
        tuner(small_sum, [dict(zero=True)], ref_prog=ref).run(1, 3)
    r = torch.tensor([1e-3, -4e-3, float("nan")])
    assert tolerances(r, r, None, None) == pytest.approx((4e-5, 1e-2))
    assert tolerances(r * 1e4, r * 1e4, None, None) == pytest.approx((1e-2, 1e-2))  # large outputs: as before
    assert tolerances(r, r, 0.5, None) == pytest.approx((0.5, 1e-2))  # given: as given
    # 16-bit outputs: a tenth of the largest value (their own rounding is a larger share of a small output)
    assert tolerances(r.bfloat16(), r, None, None) == pytest.approx((4e-4, 1e-2))
    assert tolerances(r.half() * 100, r * 100, None, None) == pytest.approx((1e-2, 1e-2))
    assert not compare([torch.zeros(3)], [torch.tensor([1e-3, 2e-3, 3e-3])], None, None, 0.0).ok
    assert compare([torch.zeros(3)], [torch.tensor([1e-3, 2e-3, 3e-3])], 1e-2, None, 0.0).ok  # the user's choice


def test_the_mismatch_ratio_bounds_each_output_not_the_pool():
    """One wrong element of a one-element output hid behind 4096 right ones with max_mismatched_ratio=0.01."""
    from kernels.trust_kernels import add_and_corner

    ref = lambda A, B: (A + B, A[0, 0].reshape(1))  # noqa: E731
    ok = tuner(add_and_corner, [dict()], out_idx=[-2, -1], ref_prog=ref, max_mismatched_ratio=0.01).run(1, 3)
    assert [t.status for t in ok.trials] == [Status.OK]
    with pytest.raises(TuningError, match="output 1: 1/1 mismatched"):
        tuner(add_and_corner, [dict(wrong_corner=True)], out_idx=[-2, -1], ref_prog=ref,
              max_mismatched_ratio=0.01).run(1, 3)


@pytest.mark.parametrize("ref,match", [
    (lambda A, B: A * float("nan"), "every element NaN"),
    (lambda A, B: torch.where(A > 0, float("inf"), float("nan")) + B * 0, "every element NaN or infinite"),
])
def test_a_reference_that_cannot_check_anything_is_an_input_error(ref, match):
    with pytest.raises(TuningInputError, match=match):
        tuner(add, [dict()], ref_prog=ref).run(1, 3)


@pytest.mark.parametrize("how", ["no reference", "skip_check"])
def test_unwritten_integer_outputs_are_caught_without_a_reference(how):
    """Without a reference only NaN was looked for, so an integer output half written passed; an element
    holding the first poison after one run and the second after the other was never written."""
    args = dict(ref_prog=None) if how == "no reference" else dict(skip_check=True)
    ok = (AutoTuner.from_kernel(tril, [dict(dtype="int32")]).set_compile_args(out_idx=[-1], target="c", **args)
          .set_tuning(n_jobs=1, isolate=False, progress=False).run(1, 3))
    assert [t.status for t in ok.trials] == [Status.OK]
    with pytest.raises(TuningError, match="never written"):
        (AutoTuner.from_kernel(tril, [dict(dtype="int32", skip_zeros=True)])
         .set_compile_args(out_idx=[-1], target="c", **args).set_tuning(n_jobs=1, isolate=False, progress=False)
         .run(1, 3))


@pytest.mark.parametrize("order", ["compile first", "profile first"])
def test_the_setters_in_either_order_keep_each_others_check_arguments(order):
    """Each setter rebuilt atol, rtol, supply_type... from its own defaults, undoing the other's."""
    t = AutoTuner.from_kernel(add, [dict()])
    compile_args = dict(out_idx=[-1], target="c", atol=0.0, rtol=0.0, supply_type="integer", restore_value=[0])
    profile_args = dict(warmup=1, rep=3, ref_prog=ref_add, max_mismatched_ratio=0.25)
    if order == "compile first":
        t.set_compile_args(**compile_args).set_profile_args(**profile_args)
    else:
        t.set_profile_args(**profile_args).set_compile_args(**compile_args)
    c = t.check_settings
    assert (c.atol, c.rtol, c.max_mismatched_ratio, c.ref_prog, c.restore_value) == (0.0, 0.0, 0.25, ref_add, (0,))
    assert c.supply_type.name.lower() == "integer" and c.out_idx == (-1,)
    t.set_profile_args(atol=1e-3)  # given again: replaced, the rest kept
    assert (t.check_settings.atol, t.check_settings.rtol) == (1e-3, 0.0)


@pytest.mark.parametrize("isolate", [False, True])
def test_a_factory_that_returns_no_prim_func_is_named_as_that_configs_error(isolate):
    """It was "'NoneType' object has no attribute 'script'"; now the factory and the fix are named, and the
    configs that do return one are tuned."""
    from kernels.trust_kernels import add_forgetting_return

    result = tuner(add_forgetting_return, [dict(forget=True), dict()], isolate=isolate).run(1, 3)
    bad = [t for t in result.trials if t.config == dict(forget=True)]
    assert [t.status for t in result.trials if t.config == {}] == [Status.OK]
    assert bad and bad[0].status == Status.COMPILE_ERROR, bad
    assert "add_forgetting_return returned NoneType" in bad[0].error and "return main" in bad[0].error


def test_numpy_config_values_are_taken_as_python_values():
    import numpy as np

    from autotuner.config import normalize_configs

    (cfg,) = normalize_configs(None, [dict(block_M=np.int64(32), enable=np.bool_(True), x=np.float32(0.5))])
    assert cfg == dict(block_M=32, enable=True, x=0.5)
    assert [type(v) for v in cfg.values()] == [int, bool, float]
    result = tuner(add, [dict(block_M=np.int64(16))]).run(1, 3)
    assert [t.status for t in result.trials] == [Status.OK] and type(result.config["block_M"]) is int


def test_a_kernel_writing_its_last_argument_without_out_idx_is_told_to_pass_out_idx():
    with pytest.raises(TuningError, match=r"out_idx names no output; pass the outputs' indices, e.g. out_idx=\[-1\]"):
        (AutoTuner.from_kernel(add, [dict()]).set_compile_args(target="c")
         .set_tuning(n_jobs=1, isolate=False, progress=False).run(1, 3))


def test_a_reference_slower_than_run_timeout_is_named_in_the_timeout():
    """The first candidate of a measuring process also runs and times the reference: a slow reference made
    every config time out, blamed on the kernels alone."""

    def slow_ref(A, B):
        time.sleep(3)
        return A + B

    with pytest.raises(TuningError) as e:
        (AutoTuner.from_kernel(add, [dict()]).set_compile_args(out_idx=[-1], target="c", ref_prog=slow_ref)
         .set_tuning(n_jobs=1, isolate=True, progress=False, run_timeout=1.5).run(1, 3))
    assert "reference program (ref_prog)" in str(e.value) and "run_timeout" in str(e.value), str(e.value)


def test_a_tuned_kernel_refuses_what_is_not_a_tensor_and_copies_and_pickles():
    """None for a tensor crashed the process (TileLang's C adapter); copy and pickle recursed forever."""
    import copy
    import pickle

    k = tuner(add, [dict()]).run(1, 3).kernel
    A = torch.randn(*k._specs[0][0])
    with pytest.raises(TypeError, match="argument 1 is NoneType"):
        k(A, None)
    with pytest.raises(TypeError, match="argument 2 is NoneType"):
        k(A, A, None)
    assert torch.equal(copy.copy(k)(A, A), A + A)
    with pytest.raises(Exception) as e:  # a compiled library does not pickle; it must say so, not recurse
        pickle.dumps(k)
    assert not isinstance(e.value, RecursionError)


def test_tensors_that_disagree_on_a_shared_symbolic_dimension_are_refused():
    from types import SimpleNamespace as NS

    from autotuner.check import check_shared_dims

    class Var:  # a tir.Var stands in: named, no value
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return self.name

    params = [NS(shape=[Var("M"), 64]), NS(shape=[Var("M"), 64]), NS(shape=[Var("M"), 64])]
    check_shared_dims(params, [torch.empty(8, 64)] * 3)
    with pytest.raises(ValueError, match="argument 1 has 4 in dimension 0 and argument 0 8 in dimension 0.*size M"):
        check_shared_dims(params, [torch.empty(8, 64), torch.empty(4, 64), torch.empty(8, 64)])


def test_a_symbolic_kernel_on_the_c_target_refuses_tensors_that_disagree_on_m(tmp_path):
    """TileLang's C adapter bound M from A and read 64 rows of an 8-row B (garbage, silently)."""
    from kernels.keyed_kernels import make_keyed

    kk = make_keyed(db_path=str(tmp_path / "db.sqlite"))
    A = torch.ones(64, 64)
    torch.testing.assert_close(kk(A, torch.ones(64, 64)), torch.full((64, 64), 3.0))
    with pytest.raises(ValueError, match="argument 1 has 8 in dimension 0 and argument 0 64"):
        kk(A, torch.ones(8, 64))


def test_a_served_keyed_kernel_is_checked_once_and_refused_when_wrong(tmp_path, monkeypatch):
    """What a keyed kernel serves is not what was tuned (a symbolic-M compile, a table's entry, the untimed
    fallback): with a ref_prog it is checked once, at its first call, before it is served."""
    from kernels import trust_helper
    from kernels.keyed_kernels import make_keyed, scale_add_helper

    from autotuner.errors import KeyRefused

    A = torch.ones(8, 64)
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 0.5)  # the fallback config now computes 2A + B + 0.5
    wrong = make_keyed(db_path=str(tmp_path / "db.sqlite"), fn=scale_add_helper)
    with pytest.raises(KeyRefused, match="the fallback config .* does not match the reference"):
        wrong(A, A)
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 0.0)
    right = make_keyed(db_path=str(tmp_path / "db.sqlite"), fn=scale_add_helper)
    for _ in range(3):
        torch.testing.assert_close(right(A, A), 3 * A)
    assert right.stats["served checks"] == 1  # once per compiled kernel, not per call



def test_a_served_kernel_that_leaves_elements_unwritten_is_refused_whatever_its_memory_held(tmp_path, monkeypatch):
    """TileLang allocates a served kernel's outputs with ``torch.empty``, which hands back memory as it was
    freed: here it holds the right answer (as a block the reference freed can), and a kernel that never writes
    its last row was served. The check's outputs now start as poison."""
    from kernels.keyed_kernels import make_keyed, scale_add_skipping_last_row

    from autotuner.errors import KeyRefused

    A = torch.ones(8, 64)
    real = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: real(*a, **k).fill_(3.0))  # what 2A + B is here
    kk = make_keyed(db_path=str(tmp_path / "db.sqlite"), fn=scale_add_skipping_last_row)
    with pytest.raises(KeyRefused, match=r"does not match the reference .*64/512 mismatched"):
        kk(A, A)


def test_the_poison_reaches_what_a_launcher_allocates_and_says_when_it_did():
    from autotuner.check import poisoned_allocations

    with poisoned_allocations([((4, 4), torch.float32)], "cpu") as verified:
        inside = torch.empty(4, 4)
        integers = torch.empty(3, dtype=torch.int32)
    outside = torch.empty(4, 4)
    assert torch.isnan(inside).all() and (integers == torch.iinfo(torch.int32).min).all()
    assert verified([inside, integers]) and not verified([outside]) and not verified([inside, outside])
    with poisoned_allocations([((4,), torch.int8)], "cpu", second=True):
        assert (torch.empty(4, dtype=torch.int8) == 127).all()
    assert torch.empty is not None and "poisoned" not in repr(torch.empty)


def test_a_float8_reference_is_checked_for_finite_values_without_crashing():
    from autotuner.check import run_reference

    nan8 = torch.full((4,), float("nan")).to(torch.float8_e4m3fn)
    with pytest.raises(TuningInputError, match="every element NaN"):
        run_reference(lambda a: nan8, [torch.ones(4)], 1, [(4,)])
    ok = torch.ones(4).to(torch.float8_e4m3fn)
    assert run_reference(lambda a: ok, [torch.ones(4)], 1, [(4,)])[0] is ok


def test_the_served_check_takes_an_int_out_idx_honours_skip_check_and_remembers_a_refusal(tmp_path, monkeypatch):
    from kernels import trust_helper
    from kernels.keyed_kernels import make_keyed, scale_add_helper

    from autotuner import keyed
    from autotuner.errors import KeyRefused

    A = torch.ones(8, 64)
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 0.5)  # wrong by 0.5

    def build(**compile_args):
        kk = make_keyed(db_path=str(tmp_path / "db.sqlite"), fn=scale_add_helper)
        kk.compile_args.update(compile_args)
        return kk

    kk = build(out_idx=-1)  # TileLang's int form
    for _ in range(2):  # refused, and remembered: not compiled or checked again
        with pytest.raises(KeyRefused, match="does not match the reference"):
            kk(A, A)
    assert kk.stats["served checks"] == 1 and kk.stats["compiles"] == 1
    skipping = build(skip_check=True)  # the user's own choice, as in AutoTuner
    torch.testing.assert_close(skipping(A, A), 3 * A + 0.5)
    assert skipping.stats["served checks"] == 0
    # compiled during a CUDA-graph capture: refused while capturing (a graph would replay it unchecked),
    # checked at the next call outside it, and never served if wrong
    captured = build()
    monkeypatch.setattr(keyed, "capturing", lambda: True)
    for _ in range(2):
        with pytest.raises(KeyRefused, match="not checked against the reference yet.*CUDA graph") as e:
            captured(A, A)
        assert e.value.transient
    assert captured.stats["compiles"] == 1 and captured.stats["served checks"] == 0
    monkeypatch.setattr(keyed, "capturing", lambda: False)
    for _ in range(2):
        with pytest.raises(KeyRefused, match="does not match the reference"):
            captured(A, A)
    monkeypatch.setattr(trust_helper, "bias", lambda block_M: 0.0)  # right: served once checked outside
    right = build()
    monkeypatch.setattr(keyed, "capturing", lambda: True)
    with pytest.raises(KeyRefused, match="not checked"):
        right(A, A)
    monkeypatch.setattr(keyed, "capturing", lambda: False)
    torch.testing.assert_close(right(A, A), 3 * A)  # the warm-up: checked now
    monkeypatch.setattr(keyed, "capturing", lambda: True)
    torch.testing.assert_close(right(A, A), 3 * A)  # and served in a capture from then on
    assert right.stats["served checks"] == 1 and right.stats["compiles"] == 1


def test_device_code_put_in_with_import_source_is_part_of_the_primfunc_hash():
    """A stored winner is served warm only while the config elaborates to the same PrimFunc (its hash). Device
    code put in with ``T.import_source`` (the attention programs' exponential) is in the PrimFunc's metadata
    only: an edit to it must change the hash, so the winner is checked again rather than served. A PrimFunc
    without metadata hashes as before, so stored rows keep matching."""
    import hashlib

    from kernels.c_kernels import add, copy_with_device_source

    from autotuner.cache import prim_hash
    from templates.attention import fastmath

    real = fastmath.SOURCE  # long enough that the script names it only by its metadata index
    one, two = (copy_with_device_source(s) for s in (real, real.replace(".ftz", "")))
    assert one.script() == two.script()  # what the hash used to see
    again = copy_with_device_source(real)
    assert prim_hash(one) != prim_hash(two) and prim_hash(again) == prim_hash(one)
    plain = add(block_M=64)
    assert prim_hash(plain) == hashlib.sha256(plain.script().encode()).hexdigest()
