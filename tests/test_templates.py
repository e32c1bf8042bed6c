"""The template protocol (templates/protocol.py): typed problems and configs, one TuneOptions, the target
resolved once, matmul as one family, and a second family, written here in a few lines, tuned end to end
on TileLang's C target through the shared flow (a new family is a directory with four functions)."""

# No `from __future__ import annotations`: TileLang reads the toy program's annotations as expressions.
import dataclasses
import inspect
import math
import types
from dataclasses import dataclass

import pytest
import tilelang
import tilelang.language as T
import torch

import autotuner
import autotuner.target
from autotuner.target import ResolvedTarget
from carver.arch import CUDA
from carver.problem import shape_dim
from templates import matmul as mm
from templates.protocol import CUDAUnavailableError, Template, TemplateBase, TemplateConfig, TuneOptions

BEST = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
SM90A = {"kind": "cuda", "arch": "sm_90a"}


# --------------------------------------------------------------------------------------------------
# a second family: C = A + B on a vector, C target, nothing but its types and four parts
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AddProblem:
    n: int
    dtype: str = "float32"

    def __post_init__(self):
        object.__setattr__(self, "n", shape_dim(self.n, "n"))


@dataclass(frozen=True, kw_only=True)
class AddConfig(TemplateConfig):
    block: int
    threads: int = 1


def add_reference(A, B):
    return A + B


class Add(TemplateBase):
    name = "add"
    problem_type = AddProblem
    config_type = AddConfig
    target_kinds = ("c", "cuda")

    @staticmethod
    def program(problem, config):
        n, dtype, block = problem.n, problem.dtype, config.block

        @T.prim_func
        def main(A: T.Tensor((n,), dtype), B: T.Tensor((n,), dtype), C: T.Tensor((n,), dtype)):
            with T.Kernel(T.ceildiv(n, block), threads=config.threads) as bx:
                for i in T.Parallel(block):
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

        return main

    @staticmethod
    def reference(problem):
        return add_reference

    @staticmethod
    def space(problem):
        return [AddConfig(block=b) for b in (32, 64, 128, 256) if problem.n % b == 0]

    @staticmethod
    def candidates(problem, arch, topk, variants=True):
        return sorted(Add.space(problem), key=lambda c: -c.block)[:topk]  # a stand-in ranking: big blocks first


ADD = Add()


def test_a_second_family_tunes_end_to_end_on_the_c_target():
    problem = AddProblem(1024)
    options = TuneOptions(target="c", topk=2, n_jobs=2, warmup=1, rep=3, progress=False)
    tuner = ADD.tuner(problem, options)
    assert tuner.configs == [{"block": 256}, {"block": 128}]
    result = tuner.run(warmup=1, rep=3)
    assert [t.status for t in result.trials] == ["ok", "ok"] and not result.from_cache
    a, b = torch.randn(1024), torch.randn(1024)
    assert torch.equal(result.kernel(a, b), a + b)
    kern = ADD.tune(problem, options)  # the same problem again: served from the tuning database
    assert torch.equal(kern(a, b), a + b)
    exhaustive = ADD.tuner(problem, dataclasses.replace(options, configs=ADD.space(problem)))
    assert len(exhaustive.configs) == 4


def test_compile_hands_tilelang_the_resolved_target_never_auto(monkeypatch, no_gpu):
    seen = []
    real = tilelang.compile

    def spy(func, *args, **kwargs):
        seen.append(kwargs["target"])
        return real(func, *args, **kwargs)

    monkeypatch.setattr(tilelang, "compile", spy)
    jit = ADD.compile(AddProblem(256), target="auto")  # no GPU: the CPU; no config: the top candidate
    a, b = torch.randn(256), torch.randn(256)
    assert torch.equal(jit(a, b), a + b)
    assert len(seen) == 1 and str(seen[0].kind) == "c"


def test_both_families_satisfy_the_protocol():
    assert isinstance(mm.MATMUL, Template) and isinstance(ADD, Template)
    assert mm.MATMUL.problem_type is mm.MatmulProblem and mm.MATMUL.config_type is mm.MatmulConfig
    assert not isinstance(object(), Template)


def test_a_family_checks_the_type_of_its_problem():
    with pytest.raises(TypeError, match="takes a AddProblem, got"):
        ADD.tuner((1024,), TuneOptions(target="c"))
    with pytest.raises(TypeError, match="MatmulProblem"):
        mm.MATMUL.tuner(AddProblem(1024), TuneOptions(target=SM90A))
    with pytest.raises(ValueError, match="n must be a positive int, got 0"):
        AddProblem(0)


# --------------------------------------------------------------------------------------------------
# problems and configs: frozen, hashable, validated once
# --------------------------------------------------------------------------------------------------
def test_problems_and_configs_are_frozen_and_hashable():
    p = mm.MatmulProblem(4096, 4096, 4096)
    c = mm.MatmulConfig(**BEST)
    for obj, field in ((p, "M"), (c, "block_M"), (AddConfig(block=64), "block")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 1)
    assert len({p, mm.MatmulProblem(4096, 4096, 4096), mm.MatmulProblem(4096, 4096, 2048)}) == 2
    assert len({c, mm.MatmulConfig(**BEST), mm.MatmulConfig(**BEST, split_k=2)}) == 2
    assert hash(mm.MatmulConfig(**BEST, pass_configs={"tl.disable_warp_specialized": True}))


def test_a_config_has_every_key_with_its_default_and_round_trips_as_a_dict():
    c = mm.MatmulConfig(**BEST)
    assert mm.MatmulConfig.keys() == mm.CONFIG_KEYS
    assert mm.MatmulConfig.defaults() == mm.EXTRA_DEFAULTS
    assert c.kernel_kwargs() == {**BEST, **mm.EXTRA_DEFAULTS}
    assert c.to_dict() == BEST  # defaults are left out: the dict reads as it was written
    for d in (BEST, dict(BEST, split_k=4), dict(BEST, pass_configs={"tl.disable_warp_specialized": True})):
        assert mm.MatmulConfig.from_dict(d).to_dict() == d
    assert mm.MatmulConfig.from_dict(dict(BEST, split_k=1)) == c
    assert AddConfig.from_dict({"block": 64}) == AddConfig(block=64, threads=1)


@pytest.mark.parametrize("override,exc,fragment", [
    (dict(block_M=7), None, None),  # legal per key; the problem's rules are the template's check
    (dict(thread_num=4096), ValueError, "thread_num must be at most 1024, got 4096 (CUDA's limit of "
                                                  "threads per block); use 128 or 256"),
    (dict(block_M="128"), ValueError, "block_M must be a positive int, got '128'"),
    (dict(enable_rasterization="False"), TypeError, "enable_rasterization must be a bool, got 'False'"),
    (dict(warp_policy="rows"), ValueError, "warp_policy must be one of ['square', 'full_row', 'full_col'], "
                                           "got 'rows'; 'square' is TileLang's default"),
    (dict(persistent=-1), ValueError, "persistent must be an int >= 0, got -1"),
])
def test_config_values_are_checked_on_construction_with_the_key_value_and_fix(override, exc, fragment):
    if exc is None:
        cfg = mm.MatmulConfig(**{**BEST, **override})
        (reason,) = mm.MATMUL.check(mm.MatmulProblem(4096, 4096, 4096), cfg)
        assert "block_M must be a positive multiple of 16" in reason
        return
    with pytest.raises(exc) as e:
        mm.MatmulConfig(**{**BEST, **override})
    assert fragment in str(e.value)
    with pytest.raises(exc) as e:
        mm.MatmulConfig.from_dict({**BEST, **override})
    assert fragment in str(e.value)


def test_config_keys_are_named_when_unknown_or_missing():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['blockM'\]"):
        mm.MatmulConfig.from_dict(dict(BEST, blockM=1))
    with pytest.raises(ValueError, match=r"lacks \['thread_num'\]"):
        mm.MatmulConfig.from_dict({k: v for k, v in BEST.items() if k != "thread_num"})
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['blok'\]; a AddConfig takes \['block', 'thr"):
        AddConfig.from_dict({"blok": 64})
    with pytest.raises(ValueError, match=r"lacks \['block'\]"):
        AddConfig.from_dict({})
    with pytest.raises(ValueError, match="threads must be an int, got 1.5"):
        AddConfig(block=64, threads=1.5)
    with pytest.raises(TypeError, match="pass_configs must be a dict"):
        AddConfig.from_dict({"block": 64, "pass_configs": "fast"})


# --------------------------------------------------------------------------------------------------
# TuneOptions: one dataclass, one default per setting
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,exc,fragment", [
    (dict(topk=0), ValueError, "topk must be a positive int, got 0; use e.g. topk=8"),
    (dict(topk=2.5), ValueError, "topk must be a positive int, got 2.5"),
    (dict(split_k="yes"), TypeError, "split_k must be a bool, got 'yes'"),
    (dict(variants=1), TypeError, "variants must be a bool, got 1"),
    (dict(validate_configs=None), TypeError, "validate_configs must be a bool"),
    (dict(atol=float("nan")), ValueError, "atol must be a finite number (an absolute tolerance such as 1e-2, or "),
    (dict(atol=float("nan")), ValueError, "or None for the default), got nan"),
    (dict(rtol=-1), ValueError, "rtol must be >= 0"),
    (dict(compile_timeout=0), ValueError, "compile_timeout must be > 0 (seconds, e.g. 300), got 0"),
    (dict(warmup=-1), ValueError, "warmup must be >= 0"),
    (dict(rep=0), ValueError, "rep must be >= 1"),
    (dict(n_jobs=True), TypeError, "n_jobs must be a number"),
    (dict(cache="no"), TypeError, "cache must be True or False, got 'no'"),
    (dict(timing="fast"), ValueError,
     "timing must be one of ['burst', 'sustained', 'back_to_back', 'batched'], got 'fast'"),
    (dict(arch=90), TypeError, "arch must be None, a GPU name such as 'H100' or a carver.arch.GPUArch, got 90"),
    (dict(configs=[]), ValueError, "configs is empty; pass None for the carver's ranked candidates"),
    (dict(configs=BEST), TypeError, "configs must be a list of config dicts"),
])
def test_tune_options_refuse_bad_values_naming_the_value_and_fix(kwargs, exc, fragment):
    with pytest.raises(exc) as e:
        TuneOptions(**kwargs)
    assert fragment in str(e.value), str(e.value)


def test_tune_options_are_frozen_and_normalised():
    opts = TuneOptions(atol=0, configs=[BEST], arch=CUDA("H100"))
    assert opts.atol == 0.0 and isinstance(opts.atol, float) and opts.configs == (BEST,)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.topk = 4
    assert hash(TuneOptions()) == hash(TuneOptions())


def test_tuner_and_tune_share_one_default_per_option():
    defaults = TuneOptions()
    tuner_params = inspect.signature(mm.tuner).parameters
    tune_params = inspect.signature(mm.tune).parameters
    assert set(tuner_params) - {"M", "N", "K", "dtype", "trans_A", "trans_B", "out_dtype"} <= set(tune_params)
    for name in set(tuner_params) & set(tune_params):
        assert tuner_params[name].default == tune_params[name].default, name
        if hasattr(defaults, name):
            assert tune_params[name].default == getattr(defaults, name), name
    assert tune_params["compile_timeout"].default == tuner_params["compile_timeout"].default \
        == defaults.compile_timeout
    t = mm.tuner(4096, 4096, 4096, arch="H100", target=SM90A)
    assert t.compile_settings.compile_timeout == defaults.compile_timeout


def test_tune_hands_its_options_to_the_tuner_and_the_run(monkeypatch):
    calls = {}

    def fake_run(self, warmup=None, rep=None):
        calls.update(warmup=warmup, rep=rep, timeout=self.compile_settings.compile_timeout, configs=self.configs,
                     cache=self.run_settings.cache)
        return type("Result", (), {"kernel": "the kernel"})()

    monkeypatch.setattr(autotuner.AutoTuner, "run", fake_run)
    out = mm.tune(4096, 4096, 4096, arch="H100", target=SM90A, warmup=5, rep=7, compile_timeout=33, topk=2,
                  variants=False)
    assert out == "the kernel"
    assert calls == dict(warmup=5, rep=7, timeout=33.0, configs=calls["configs"], cache=True)
    assert len(calls["configs"]) == 2
    typed = mm.MATMUL.tune(mm.MatmulProblem(4096, 4096, 4096), TuneOptions(arch="H100", target=SM90A, topk=2,
                                                                            variants=False, cache=False))
    assert typed == "the kernel" and calls["configs"] == mm.tuner(4096, 4096, 4096, arch="H100", target=SM90A,
                                                                   topk=2, variants=False).configs
    assert calls["cache"] is False


# --------------------------------------------------------------------------------------------------
# the target: resolved once, the carver's arch derived from it
# --------------------------------------------------------------------------------------------------
@pytest.fixture
def count_resolutions(monkeypatch):
    """How often a target is resolved (a ResolvedTarget handed on is not resolved again)."""
    counts = []
    real = autotuner.target.resolve_target

    def counting(target, prefetch_tilelang=True):
        if not isinstance(target, ResolvedTarget):
            counts.append(target)
        return real(target, prefetch_tilelang)

    monkeypatch.setattr(autotuner.target, "resolve_target", counting)
    return counts


def test_the_target_is_resolved_once_per_call(count_resolutions, monkeypatch):
    t = mm.tuner(4096, 4096, 4096, target=SM90A)
    assert count_resolutions == [SM90A]
    assert isinstance(t.compile_settings.target, ResolvedTarget) and t.compile_settings.target.arch == "sm_90a"
    count_resolutions.clear()
    monkeypatch.setattr(autotuner.AutoTuner, "run", lambda self, warmup=None, rep=None: type("R", (), {"kernel": 1}))
    mm.tune(4096, 4096, 4096, target="sm_90a")
    assert count_resolutions == [SM90A]
    count_resolutions.clear()
    monkeypatch.setattr(tilelang, "compile", _compiled_target)
    assert str(mm.compile(4096, 4096, 4096, BEST, target="sm_90a").target.attrs["arch"]) == "sm_90a"
    assert count_resolutions == [SM90A]


def test_the_carvers_arch_comes_from_the_resolved_target():
    where = mm.MATMUL.resolve(None, "sm_80")
    assert where.target.arch == "sm_80" and where.arch == CUDA("sm_80") and where.arch.name.startswith("A100")
    assert mm.MATMUL.resolve(None, SM90A, arch="H200").arch == CUDA("H200")
    assert mm.MATMUL.resolve(None, "sm_89", arch=CUDA("L40S")).arch.name == "L40S"
    assert ADD.resolve(AddProblem(8), "c").arch is None


def test_no_gpu_and_wrong_kinds_are_said_per_family(no_gpu):
    problem = mm.MatmulProblem(4096, 4096, 4096)
    with pytest.raises(CUDAUnavailableError, match="carver_template"):
        mm.MATMUL.tuner(problem)
    assert CUDAUnavailableError is mm.CUDAUnavailableError
    assert ADD.resolve(AddProblem(8), "auto").target.kind == "c"  # a family with a CPU lowering falls back
    with pytest.raises(CUDAUnavailableError):
        ADD.resolve(AddProblem(8), "cuda")  # asked for the GPU by name: no fallback
    with pytest.raises(ValueError, match="C target on the CPU, which cannot lower the GEMM's T.gemm"):
        mm.MATMUL.resolve(problem, "c")
    with pytest.raises(ValueError, match=r"it takes 'auto' \(the local CUDA GPU, else the CPU\), 'c'"):
        ADD.resolve(AddProblem(8), "nonsense")


def test_the_matmul_family_ranks_with_the_carver_and_is_the_same_as_the_loose_api():
    problem = mm.MatmulProblem(64, 4096, 4096)
    h100 = CUDA("H100")
    ranked = mm.MATMUL.candidates(problem, h100, 4)
    assert all(isinstance(c, mm.MatmulConfig) for c in ranked)
    assert [c.to_dict() for c in ranked] == mm.tuner(64, 4096, 4096, arch="H100", topk=4, target=SM90A).configs
    assert [c.to_dict() for c in mm.MATMUL.candidates(problem, h100, 1, variants=False)][0] == ranked[0].to_dict()
    assert [c.to_dict() for c in mm.MATMUL.space(problem)] == mm.default_space(64, 4096, 4096)
    assert all(mm.MATMUL.check(problem, c, h100) == [] for c in ranked)
    func = mm.MATMUL.program(problem, ranked[0])
    assert func.script() == mm.kernel(64, 4096, 4096, **ranked[0].to_dict()).script()
    ref = mm.MATMUL.reference(mm.MatmulProblem(8, 6, 4, "bfloat16", "float32", trans_B=False))
    out = ref(torch.ones(8, 4, dtype=torch.bfloat16), torch.ones(4, 6, dtype=torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == (8, 6) and math.isclose(out[0, 0].item(), 4.0)


def _compiled_target(func, out_idx, target, pass_configs):
    """Stands in for ``tilelang.compile``: a kernel that only says what it was compiled for."""
    return types.SimpleNamespace(target=target, out_idx=out_idx, params=[])


def test_compile_checks_a_given_config_on_the_gpu_it_compiles_for(monkeypatch):
    monkeypatch.setattr(tilelang, "compile", _compiled_target)
    problem = mm.make_problem(4096, 4096, 4096)
    big = dict(BEST, block_M=256, block_K=128, num_stages=4)  # legal on no GPU, too big for H100's smem
    assert mm.MATMUL.check(problem, mm.MatmulConfig(**big)) == []  # the rules no GPU escapes pass it
    with pytest.raises(ValueError, match="shared memory, over H100's"):
        mm.MATMUL.compile(problem, big, target=SM90A)
    with pytest.raises(ValueError, match="shared memory, over A100"):
        mm.MATMUL.compile(problem, dict(BEST, num_stages=4), target="sm_80")  # 192 KB: fits H100, not A100
    assert str(mm.MATMUL.compile(problem, BEST, target=SM90A).target.attrs["arch"]) == "sm_90a"


def test_an_arch_that_is_not_the_targets_gpu_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"arch 'H100' \(sm_90\) and target 'sm_80' \(compiles for sm_80\) name "
                                         r"different GPUs; pass the target of that GPU .*'sm_90a'"):
        mm.MATMUL.resolve(None, "sm_80", arch="H100")
    with pytest.raises(ValueError, match="name different GPUs"):
        mm.MATMUL.tuner(mm.MatmulProblem(4096, 4096, 4096), TuneOptions(arch="A100-80GB", target=SM90A))
    assert mm.MATMUL.resolve(None, SM90A, arch="H100").arch == CUDA("H100")  # sm_90 and sm_90a: one GPU
