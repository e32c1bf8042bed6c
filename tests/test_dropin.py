"""TileLang's autotuning surface on tilecarve (docs/dropin.md): the carver's TileLang names, duplicate
configs, supply_prog / manual_check_prog, the result kernel's profiler, the decorator form (C target),
and examples/gemm/example_gemm_dropin.py (nvcc compile-only, and on the GPU)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import tilelang
import torch
from kernels import dropin_kernels as dk
from kernels.c_kernels import add, add_buggy, ref_add

from autotuner import AutoTuner, DuplicateConfigWarning, TunedKernel, TuningError, TuningInputError, autotune

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "gemm" / "example_gemm_dropin.py"
BUGGY = [dict(block_M=32, block_N=bn) for bn in (16, 32, 64)]  # 16: A - B; 32: right; 64: half unwritten


def tuner(kernel, configs, **profile):
    return (AutoTuner.from_kernel(kernel=kernel, configs=configs).set_compile_args(out_idx=[-1], target="c")
            .set_profile_args(**profile).set_tuning(n_jobs=2))


def statuses(result):
    return {t.config["block_N"]: str(t.status) for t in result.trials}


def load_example():
    spec = importlib.util.spec_from_file_location("example_gemm_dropin", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------- the carver's names

def test_carver_answers_to_tilelang_import_paths_and_hint_attributes():
    import tilelang.language as T

    from carver.arch import CDNA, CUDA
    from carver.roller.rasterization import NoRasterization
    from carver.template import MatmulTemplate

    tmpl = MatmulTemplate(M=4096, N=4096, K=4096, in_dtype=T.float16, out_dtype=T.float16,
                          accum_dtype=T.float32).with_arch(CUDA("H100"))
    hints = tmpl.recommend_hints(topk=8)
    for h in hints:  # TileLang's example derives thread_num from block and warp: it must agree with ours
        (bm, bn), (wm, wn) = h.block, h.warp
        assert (bm // wm) * (bn // wn) * 32 == h.threads == h.to_config()["thread_num"]
        assert h.rstep[0] == h.to_config()["block_K"] and h.pipeline_stage == h.to_config()["num_stages"]
        assert isinstance(h.rasterization_plan, NoRasterization) != h.to_config()["enable_rasterization"]
    with pytest.raises(NotImplementedError, match="NVIDIA GPUs only"):
        CDNA("hip")


@pytest.mark.parametrize("trans_A, trans_B", [(False, True), (True, False)])
def test_equivalent_function_is_the_gemm_with_its_layouts(trans_A, trans_B):
    from carver.template import MatmulTemplate

    func = MatmulTemplate(M=64, N=32, K=16, out_dtype="float32", trans_A=trans_A, trans_B=trans_B).equivalent_function()
    buffers = [func.buffer_map[p] for p in func.params]
    assert [tuple(map(int, b.shape)) for b in buffers] == [(16, 64) if trans_A else (64, 16),
                                                          (32, 16) if trans_B else (16, 32), (64, 32)]
    assert [str(b.dtype) for b in buffers] == ["float16", "float16", "float32"]


# ------------------------------------------------------------------------------- the AutoTuner

def test_duplicate_configs_collapse_with_one_warning():
    configs = [dict(block_M=32), dict(block_M=16), dict(block_M=32), dict(block_M=16), dict(block_M=64)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = AutoTuner.from_kernel(kernel=add, configs=configs)
    dup = [w for w in caught if issubclass(w.category, DuplicateConfigWarning)]
    assert len(dup) == 1 and "dropped 2 duplicate configs of 5" in str(dup[0].message)
    assert dup[0].filename == __file__  # it points at the caller's line
    assert t.configs == [dict(block_M=32), dict(block_M=16), dict(block_M=64)]


def test_tilelang_setter_order_and_run_options():
    t = (AutoTuner.from_kernel(kernel=add, configs=[dict(block_M=32)])
         .set_profile_args(ref_prog=ref_add, supply_prog=dk.supply_zero_b, manual_check_prog=dk.exact_check)
         .set_compile_args(out_idx=[-1], target="c", execution_backend="auto", verbose=False))
    c = t.check_settings  # TileLang's order (profile, then compile) keeps the check
    assert (c.ref_prog, c.supply_prog, c.manual_check_prog) == (ref_add, dk.supply_zero_b, dk.exact_check)
    with pytest.raises(NotImplementedError, match="execution_backend='cython'"):
        t.set_compile_args(execution_backend="cython")
    with pytest.raises(ValueError, match="needs|pass ref_prog"):
        AutoTuner.from_kernel(kernel=add, configs=[dict(block_M=32)]).set_profile_args(manual_check_prog=dk.exact_check)
    with pytest.raises(TypeError, match="unexpected keyword argument 'early_stopp'"):
        t.run(1, 2, early_stopp=True)
    with pytest.raises(ValueError, match="early_stop_factor"):
        t.run(1, 2, early_stop=True, early_stop_factor=0.5)


def test_supply_prog_inputs_are_the_ones_every_candidate_is_checked_on():
    generated = tuner(add_buggy, BUGGY, ref_prog=ref_add).run(1, 3)
    supplied = tuner(add_buggy, BUGGY, ref_prog=ref_add, supply_prog=dk.supply_zero_b).run(1, 3)
    assert statuses(generated) == {16: "mismatch", 32: "ok", 64: "mismatch"}
    # B = 0 makes A - B right: the candidates ran on the supplied inputs; the unwritten half still fails
    assert statuses(supplied) == {16: "ok", 32: "ok", 64: "mismatch"}
    with pytest.raises(TuningInputError, match=r"supply_prog .*supply_wrong_shape returned input 0 as \(8, 8\)"):
        tuner(add, [dict(block_M=32)], ref_prog=ref_add, supply_prog=dk.supply_wrong_shape).run(1, 3)


def test_manual_check_prog_replaces_the_comparison_for_every_candidate():
    exact = tuner(add_buggy, BUGGY, ref_prog=ref_add, manual_check_prog=dk.exact_check).run(1, 3)
    assert statuses(exact) == {16: "mismatch", 32: "ok", 64: "mismatch"}
    wrong = next(t for t in exact.trials if t.config["block_N"] == 16)
    assert "manual_check_prog rejected the outputs" in wrong.error
    lax = tuner(add_buggy, BUGGY, ref_prog=ref_add, manual_check_prog=dk.accept_all).run(1, 3)
    assert statuses(lax) == {16: "ok", 32: "ok", 64: "mismatch"}  # unwritten elements fail whatever it says
    assert "NaN poison" in next(t for t in lax.trials if t.config["block_N"] == 64).error


def test_result_kernel_profiler_has_the_out_idx():
    result = tuner(add, [dict(block_M=32), dict(block_M=64)], ref_prog=ref_add).run(1, 3)
    profiler = result.kernel.get_profiler(tilelang.TensorSupplyType.Auto)
    assert profiler.result_idx == [2] and len(profiler._get_inputs()) == 2
    profiler.assert_allclose(ref_add, atol=1e-2, rtol=1e-2)
    assert profiler.do_bench() > 0 and profiler.do_bench(ref_add, backend="event") > 0
    with pytest.raises(AssertionError, match="differ"):
        profiler.assert_allclose(lambda A, B: A - B, max_mismatched_ratio=0.0)
    profiler.manual_assert_close(ref_add, manual_check_prog=dk.exact_check)


def test_set_compile_args_takes_tilelangs_positional_order_and_never_a_check_argument_by_position():
    """TileLang's order is (out_idx, target, execution_backend, target_host, verbose, pass_configs): its fifth
    positional argument, verbose=True, once landed in skip_check here and let a wrong kernel win."""
    r = (AutoTuner.from_kernel(kernel=add_buggy, configs=BUGGY).set_compile_args([-1], "c", None, None, True)
         .set_profile_args(ref_prog=ref_add).set_tuning(n_jobs=2).run(1, 3))
    assert statuses(r) == {16: "mismatch", 32: "ok", 64: "mismatch"} and r.config["block_N"] == 32
    t = AutoTuner.from_kernel(kernel=add, configs=[dict(block_M=32)])
    t.set_compile_args([-1], "c", None, None, False, {"tl.disable_tma_lower": True})
    assert dict(t.compile_settings.pass_configs) == {"tl.disable_tma_lower": True}
    with pytest.raises(TypeError, match="verbose must be True, False or None.*keyword-only"):
        t.set_compile_args([-1], "c", None, None, 1e-3)
    with pytest.raises(TypeError):
        t.set_compile_args([-1], "c", None, None, None, None, "normal")  # supply_type is keyword-only


def test_a_target_left_unset_is_tilelangs_default_target(monkeypatch):
    from autotuner.target import resolve_target

    t = AutoTuner.from_kernel(kernel=add, configs=[dict(block_M=32)])
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", "c")
    assert t.set_compile_args(out_idx=[-1]).compile_settings.target == "c"
    assert resolve_target(None).kind == "c"
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", '{"kind": "cuda", "arch": "sm_90a"}')
    assert t.set_compile_args(out_idx=[-1]).compile_settings.target == {"kind": "cuda", "arch": "sm_90a"}
    monkeypatch.setenv("TILELANG_DEFAULT_TARGET", "{kind: cuda}")
    with pytest.raises(ValueError, match="TILELANG_DEFAULT_TARGET.*not JSON"):
        t.set_compile_args(out_idx=[-1])
    monkeypatch.delenv("TILELANG_DEFAULT_TARGET")
    assert t.set_compile_args(out_idx=[-1]).compile_settings.target == "auto"


# ------------------------------------------------------------------------------- the decorator

def test_decorator_form_tunes_once_per_shape_and_returns_a_checked_kernel():
    kernel = dk.scale_add(128, 64)
    assert isinstance(kernel, TunedKernel) and len(dk.scale_add.tuner(128, 64).configs) == 3
    a, b = torch.randn(128, 64), torch.randn(128, 64)
    torch.testing.assert_close(kernel(a, b), 2 * a + b)
    assert dk.scale_add(128, 64) is kernel  # kept per call arguments in the process
    assert kernel.get_profiler().result_idx == [2]
    fixed = dk.scale_add(128, 64, block_M=16, block_N=32)  # tunables given: TileLang's jit, no tuning
    assert not isinstance(fixed, TunedKernel)
    torch.testing.assert_close(fixed(a, b), 2 * a + b)


def test_decorator_form_rejects_wrong_candidates():
    jitted = tilelang.jit(out_idx=[-1], target="c")(add_buggy)
    tuned = autotune(configs=BUGGY, warmup=1, rep=3, ref_prog=ref_add)(jitted)
    kernel = tuned()
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(kernel(a, b), a + b)  # only block_N=32 is right
    with pytest.raises(TypeError, match="tilelang.jit"):
        autotune(configs=BUGGY)(add_buggy)


def test_decorator_refuses_jit_options_it_would_not_apply():
    """compile_flags, debug_root_path and a non-default execution_backend given to @tilelang.jit were dropped
    without a word; they are refused, naming the option."""
    for jit_kwargs, match in ((dict(compile_flags=["-O0"]), "compile_flags"),
                              (dict(debug_root_path="/tmp/x"), "debug_root_path"),
                              (dict(execution_backend="cython"), "execution_backend='cython'")):
        tuned = autotune(configs=BUGGY, warmup=1, rep=3, ref_prog=ref_add)(
            tilelang.jit(out_idx=[-1], target="c", **jit_kwargs)(add_buggy))
        with pytest.raises(NotImplementedError, match=match):
            tuned()


def test_decorator_without_a_right_candidate_raises():
    tuned = autotune(configs=[dict(block_M=32, block_N=16)], warmup=1, rep=3, ref_prog=ref_add)(
        tilelang.jit(out_idx=[-1], target="c")(add_buggy))
    with pytest.raises(TuningError, match="1 mismatch"):
        tuned()


# ------------------------------------------------------------------------------- the example and the script

def test_example_takes_tilelang_flags_and_makes_configs_offline():
    ex = load_example()
    args = ex.parse_args(["--m", "1024", "--n", "2048", "--k", "512", "--use_autotune", "--with_roller"])
    assert (args.m, args.n, args.k, args.use_autotune, args.with_roller) == (1024, 2048, 512, True, True)
    assert len(ex.get_configs(4096, 4096, 4096)) == 288
    hints = ex.get_configs(4096, 4096, 4096, with_roller=True, topk=6, arch="H100")
    assert len(hints) == 6 and all(c["thread_num"] in (128, 256, 384) for c in hints)


def test_import_rewrite_changes_only_import_lines():
    sys.path.insert(0, str(REPO / "benchmarks"))
    from tilelang_examples import rewrite

    src = ("import tilelang\nfrom tilelang.autotuner import AutoTuner, autotune\n"
           "    from tilelang.carver.roller.rasterization import NoRasterization\n"
           "x = 'from tilelang.carver.arch import CUDA'\n@tilelang.autotune(configs=[])\n")
    out, n = rewrite(src)
    assert n == 3 and out.splitlines() == [
        "import tilecarve.tilelang as tilelang", "from autotuner import AutoTuner, autotune",
        "    from carver.roller.rasterization import NoRasterization",
        "x = 'from tilelang.carver.arch import CUDA'", "@tilelang.autotune(configs=[])"]


@pytest.mark.nvcc
def test_example_kernel_compiles_for_sm90a_with_the_carvers_top_config():
    ex = load_example()
    config = ex.get_configs(4096, 4096, 4096, with_roller=True, topk=1, arch="H100")[0]
    kernel = tilelang.compile(ex.matmul(4096, 4096, 4096, **config), out_idx=[-1],
                              target={"kind": "cuda", "arch": "sm_90a"})
    assert "wgmma" in kernel.get_kernel_source()  # Hopper's tensor-core path, not an mma.sync fallback


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["api", "decorator"])
def test_example_runs_on_the_gpu(mode, tmp_path):
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--m", "2048", "--n", "2048", "--k", "2048",
                           "--use_autotune", "--with_roller", "--mode", mode], capture_output=True, text=True,
                          timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tflops = [float(line.split(":")[1]) for line in proc.stdout.splitlines() if line.startswith("TileLang TFlops")]
    assert len(tflops) == 1 and tflops[0] > 50, proc.stdout  # a tuned fp16 GEMM, not a fallback
