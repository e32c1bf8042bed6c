"""``import tilecarve.tilelang as tilelang``: TileLang's namespace whose autotuner is tilecarve's
(docs/dropin.md), and ``set_autotune_inputs``. C target, except one nvcc compile-only test."""

from __future__ import annotations

import logging
import pickle
import sys
import threading
from pathlib import Path

import pytest
import tilelang
import torch
from kernels import dropin_module_kernels as mk
from kernels.c_kernels import add, add_buggy, ref_add

import autotuner
import tilecarve.tilelang as tc
from autotuner import AutoTuner, TunedKernel, TuningInputError, get_autotune_inputs, set_autotune_inputs
from autotuner.cache import TuningDB

REPO = Path(__file__).resolve().parents[1]
BUGGY = [dict(block_M=32, block_N=bn) for bn in (16, 32, 64)]  # 16: A - B; 32: right; 64: half unwritten


def statuses(result):
    return {t.config["block_N"]: str(t.status) for t in result.trials}


def stored_runs(kernel_name):
    db = TuningDB()
    try:
        return [r for r in db.runs() if r.kernel.endswith(kernel_name)]
    finally:
        db.close()


def tuner(configs=BUGGY, kernel=add_buggy, **profile):
    return (AutoTuner.from_kernel(kernel=kernel, configs=configs).set_compile_args(out_idx=[-1], target="c")
            .set_profile_args(ref_prog=ref_add, **profile).set_tuning(n_jobs=2))


# ------------------------------------------------------------------------------- the namespace

def test_the_module_is_tilelangs_namespace_with_tilecarves_autotuner():
    for name in ("jit", "compile", "language", "Profiler", "PassConfigKey", "TensorSupplyType", "layout",
                 "__version__"):
        assert getattr(tc, name) is getattr(tilelang, name), name
    assert tc.autotune is autotuner.autotune
    assert tc.autotuner.AutoTuner is AutoTuner and tc.autotuner.autotune is autotuner.autotune
    assert tc.autotuner.set_autotune_inputs is set_autotune_inputs
    assert tc.autotuner.get_autotune_inputs is get_autotune_inputs
    from tilecarve.tilelang import PassConfigKey, autotune, jit  # from-imports resolve the same way
    assert (jit, PassConfigKey, autotune) == (tilelang.jit, tilelang.PassConfigKey, autotuner.autotune)
    assert {"autotune", "autotuner", "jit", "language"} <= set(dir(tc)) and "jit" in tc.__all__
    # the real module is untouched: its autotuner is still TileLang's own
    assert tilelang.autotune.__module__ == "tilelang.autotuner.tuner"
    assert tilelang.autotuner.AutoTuner.__module__ == "tilelang.autotuner.tuner"


def test_names_neither_has_raise_a_clear_attribute_error():
    with pytest.raises(AttributeError, match=r"has no attribute 'no_such_name': neither tilecarve nor TileLang 0\.1"):
        tc.no_such_name  # noqa: B018
    assert "tilelang.autodd" not in sys.modules  # a submodule nothing imported yet
    with pytest.raises(AttributeError, match=r"tilelang\.autodd is a TileLang submodule not imported yet: put "
                                             r"`import tilelang\.autodd` before"):
        tc.autodd  # noqa: B018
    with pytest.raises(AttributeError, match="belongs to TileLang's own autotuner"):
        tc.autotuner.capture  # noqa: B018 - TileLang's module, not mixed into tilecarve's tuner
    with pytest.raises(AttributeError, match="neither tilecarve's autotuner"):
        tc.autotuner.no_such_name  # noqa: B018


# ------------------------------------------------------------------------------- tuning through the module

def test_module_attribute_decorator_tunes_with_tilecarve():
    kernel = mk.scale_add(128, 64)  # @tilelang.autotune over @tilelang.jit(..., pass_configs=...)
    assert isinstance(mk.scale_add, autotuner.AutoTuneImpl) and isinstance(kernel, TunedKernel)
    assert kernel.config in mk.CONFIGS and kernel.latency > 0  # TileLang's kernel.config / .latency
    a, b = torch.randn(128, 64), torch.randn(128, 64)
    torch.testing.assert_close(kernel(a, b), 2 * a + b)
    runs = stored_runs("scale_add")
    assert len(runs) == 1 and runs[0].n_trials == 3 and runs[0].best_config == kernel.config  # tilecarve's database


def test_tl_alias_and_module_autotuner_reject_an_unwritten_output():
    kernel = mk.add_half_unwritten(256, 256)  # tl.autotune(...)(tl.jit(...)(factory))
    assert kernel.config == dict(block_M=32, block_N=32)
    result = mk.tune_with_module_autotuner()  # tl.autotuner.AutoTuner.from_kernel(...)...run()
    assert [str(t.status) for t in result.trials] == ["ok", "mismatch"]
    assert "32768 NaN (never written" in result.trials[1].error  # tilecarve's check: outputs start as NaN


def test_eager_style_kernels_compile_with_fixed_tunables_and_refuse_to_tune():
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    kernel = mk.eager_add.compile(M=64, N=64, block_M=16, block_N=32)  # TileLang's jit, as TileLang does
    torch.testing.assert_close(kernel(a, b), a + b)
    torch.testing.assert_close(mk.eager_add(a, b, block_M=16, block_N=32), a + b)  # an eager call runs it
    with pytest.raises(NotImplementedError, match=r"eager_add is a TileLang eager-style kernel .* fix its tunables "
                                                  r"\['block_M', 'block_N'\] in the call"):
        mk.eager_add.compile(M=64, N=64)


@pytest.mark.nvcc
def test_module_decorated_gemm_compiles_for_sm90a_with_its_jit_pass_configs():
    from autotuner.compile import tl_compile

    t = mk.gemm.tuner(1024, 1024, 1024)  # the AutoTuner the call would run, not run
    pass_configs = t.compile_settings.pass_config_dict
    assert pass_configs == {tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True}
    jit = tl_compile(t.fn(**t.configs[0]), {"kind": "cuda", "arch": "sm_90a"}, pass_configs)
    assert "wgmma" in jit.get_kernel_source()


# ------------------------------------------------------------------------------- set_autotune_inputs

def test_autotune_inputs_context_nests_per_thread():
    a, b = torch.zeros(2), torch.ones(2)
    assert get_autotune_inputs() is None
    with set_autotune_inputs(a, b):
        assert get_autotune_inputs() == [a, b]
        with set_autotune_inputs([b]):
            assert get_autotune_inputs() == [b]
            seen = []
            other = threading.Thread(target=lambda: seen.append(get_autotune_inputs()))
            other.start()
            other.join()
            assert seen == [None]  # another thread has no context
        assert get_autotune_inputs() == [a, b]
    assert get_autotune_inputs() is None


def test_autotune_inputs_replace_the_generated_ones_and_key_the_database_by_content():
    a, zeros = torch.randn(256, 256), torch.zeros(256, 256)
    kept = a.clone()
    assert statuses(tuner().run(1, 3)) == {16: "mismatch", 32: "ok", 64: "mismatch"}
    with set_autotune_inputs(a, zeros):  # B = 0 makes A - B right: the candidates ran on these inputs
        t = tuner()
    first = t.run(1, 3)  # read at set_profile_args, as in TileLang
    assert statuses(first) == {16: "ok", 32: "ok", 64: "mismatch"} and not first.from_cache
    assert torch.equal(a, kept) and not zeros.any()  # the caller's tensors are never written
    with set_autotune_inputs(a.clone(), zeros.clone()):  # same content: a database hit
        assert tuner().run(1, 3).from_cache
    with set_autotune_inputs(a, torch.ones(256, 256)):  # other content: tuned again
        assert statuses(tuner().run(1, 3)) == {16: "mismatch", 32: "ok", 64: "mismatch"}


def test_autotune_inputs_at_run_time_and_over_a_supply_prog(caplog):
    from kernels.dropin_kernels import supply_zero_b

    a, ones = torch.randn(256, 256), torch.ones(256, 256)
    t = tuner(supply_prog=supply_zero_b)
    with caplog.at_level(logging.WARNING, logger="autotuner.tuner"), set_autotune_inputs(a, ones):
        result = t.run(1, 3)  # the context at run() also counts; it wins over supply_prog
    assert statuses(result) == {16: "mismatch", 32: "ok", 64: "mismatch"}
    assert "supply_prog supply_zero_b is ignored" in caplog.text


def test_autotune_inputs_through_the_module_decorator():
    a, zeros = torch.randn(64, 64), torch.zeros(64, 64)  # a shape no other test tunes in this process
    with set_autotune_inputs(a, zeros):
        kernel = mk.scale_add(64, 64)
        assert mk.scale_add(64, 64) is kernel  # kept in the process per arguments and inputs
    assert mk.scale_add(64, 64) is not kernel
    torch.testing.assert_close(kernel(a, zeros), 2 * a)
    assert len(stored_runs("scale_add")) == 2  # the inputs are part of what keys the run


@pytest.mark.parametrize("inputs, message", [
    (lambda: [torch.randn(256, 256)], r"set_autotune_inputs got 1 tensors, the kernel has 2 inputs .*pass one per"),
    (lambda: [torch.randn(256, 256), torch.randn(8, 8)],
     r"set_autotune_inputs got input 1 as \(8, 8\) torch.float32 on cpu; the kernel takes \(256, 256\)"),
    (lambda: [torch.randn(256, 256, dtype=torch.float16), torch.randn(256, 256)],
     r"input 0 as .* torch.float16 on cpu"),
    (lambda: [torch.randn(256, 256), torch.empty(256, 256, device="meta")], r"input 1 as .* on meta; .* on cpu"),
    (lambda: [torch.randn(256, 256), 1.0], r"set_autotune_inputs got a float for input 1; pass tensors"),
])
def test_wrong_autotune_inputs_are_a_tuning_input_error_naming_the_input(inputs, message):
    with set_autotune_inputs(*inputs()), pytest.raises(TuningInputError, match=message):
        tuner([dict(block_M=32, block_N=32)], kernel=add).run(1, 3)


@pytest.mark.gpu
def test_autotune_inputs_on_the_gpu():
    """CUDA inputs reach the isolated measuring process; host inputs for a CUDA kernel are refused."""
    a, b = (torch.randn(1024, 1024, dtype=torch.float16, device="cuda") for _ in range(2))  # B is (N, K)
    with set_autotune_inputs(a, b):
        kernel = mk.gemm(1024, 1024, 1024)  # tilecarve's GEMM via @tilelang.autotune, target: the GPU
    torch.testing.assert_close(kernel(a, b), a @ b.T, atol=1e-1, rtol=1e-2)
    with set_autotune_inputs(a.cpu(), b.cpu()), pytest.raises(TuningInputError, match=r"input 0 as .* on cpu; "
                                                                                      r"the kernel takes .* on cuda"):
        mk.gemm(1024, 1024, 1024)


def test_autotune_inputs_cross_to_the_measuring_process_by_value():
    a = torch.randn(4, 4)
    inputs = set_autotune_inputs(a, torch.zeros(4, 4))
    back = pickle.loads(pickle.dumps(inputs))
    assert torch.equal(back.tensors[0], a) and back.digest() == inputs.digest()
    assert repr(back) == repr(inputs) and inputs.digest() != set_autotune_inputs(a, torch.ones(4, 4)).digest()


# ------------------------------------------------------------------------------- the example script

def test_import_rewrite_binds_the_module_to_tilecarve_and_notes_what_it_cannot():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from tilelang_examples import attribute_note, rewrite

    src = ("import tilelang\nimport tilelang as tl  # short\nimport tilelang.language as T\n"
           "from tilelang import tvm as tvm\n@tilelang.autotune(configs=[])\n@tl.jit(out_idx=[-1])\n")
    out, n = rewrite(src)
    assert n == 2 and out.splitlines()[:4] == [
        "import tilecarve.tilelang as tilelang", "import tilecarve.tilelang as tl  # short",
        "import tilelang.language as T", "from tilelang import tvm as tvm"]
    assert attribute_note(out) == "reaches the autotuner as tilelang.autotune: now tilecarve's"
    assert "rebinds tilelang" in attribute_note(out + "import tilelang.testing\n")
    unbound = rewrite("import tilelang.testing\n@tl.autotune(configs=[])\n")[0]
    assert "no import line binds tl" in attribute_note(unbound)
