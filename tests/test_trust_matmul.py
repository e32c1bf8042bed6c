"""Hostile inputs to templates.matmul, offline: every entry point refuses shapes no GPU can hold (class
11), bad config values and bad targets up front with the carver's rules (class 12), and a machine with
no GPU is told so at once, with what works offline (class 13). Nothing here needs a GPU: the GPU check is
made deterministic by the ``no_gpu`` fixture (conftest.py), and "nothing compiled" by patching the
compilers to fail the test if they are called. The one test that compiles (nvcc, no GPU) is marked.
"""

from __future__ import annotations

import numpy as np
import pytest
import tilelang

from carver import MatmulProblem, MatmulTemplate, check_matmul_config
from carver.arch import CUDA
from templates import matmul as mm

BEST = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
SMALL_M = dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128, enable_rasterization=True)
SM90A = {"kind": "cuda", "arch": "sm_90a"}


@pytest.fixture
def nothing_compiles(monkeypatch):
    """Fail the test if anything reaches TileLang's compiler or the autotuner's run."""
    import autotuner

    def boom(*args, **kwargs):
        raise AssertionError("compiled or tuned although the arguments were refused")

    monkeypatch.setattr(tilelang, "compile", boom)
    monkeypatch.setattr(autotuner.AutoTuner, "run", boom)
    monkeypatch.setattr(autotuner.AutoTuner, "plan", boom)  # every run and job plans first


def _entry_points():
    """Every public function a problem enters templates.matmul through (target: compile-only, no GPU)."""
    return {
        "kernel": lambda M, N, K: mm.kernel(M, N, K, **BEST),
        "carver_template": lambda M, N, K: mm.carver_template(M, N, K, arch="H100"),
        "compile": lambda M, N, K: mm.compile(M, N, K, BEST, target=SM90A),
        "compile-carver": lambda M, N, K: mm.compile(M, N, K, target=SM90A),
        "tuner": lambda M, N, K: mm.tuner(M, N, K, arch="H100", target=SM90A),
        "tune": lambda M, N, K: mm.tune(M, N, K, arch="H100"),
        "default_space": lambda M, N, K: mm.default_space(M, N, K),
        "split_k_candidates": lambda M, N, K: mm.split_k_candidates([SMALL_M], M, N, K, 132),
        "hopper_variants": lambda M, N, K: mm.hopper_variants([BEST], M, N, K, 132, 227 * 1024),
    }


# ---------------------------------------------------------------------------------- class 11: shapes
@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize("dim", ["M", "N", "K"])
@pytest.mark.parametrize("value", [2**31, 2**40, 2**70, np.int64(2**40)])
def test_every_entry_point_refuses_a_dimension_past_int32(entry, dim, value, no_gpu, nothing_compiles):
    shape = {**dict(M=256, N=256, K=256), dim: value}
    with pytest.raises(ValueError) as e:  # a shape error even without a GPU: it is checked first
        _entry_points()[entry](**shape)
    assert f"{dim} must be at most 2147483647" in str(e.value) and str(int(value)) in str(e.value)


@pytest.mark.parametrize("entry", list(_entry_points()))
@pytest.mark.parametrize("value", [0, -1, 1.5, True, np.bool_(False), "256", None])
def test_every_entry_point_refuses_a_dimension_that_is_not_a_positive_int(entry, value, no_gpu, nothing_compiles):
    with pytest.raises(ValueError, match=f"K must be a positive int, got {value!r}"):
        _entry_points()[entry](256, 256, value)


@pytest.mark.parametrize("entry", [e for e in _entry_points() if e != "default_space"])
def test_every_entry_point_refuses_operands_no_gpu_holds(entry, no_gpu, nothing_compiles):
    with pytest.raises(ValueError, match="more than any GPU holds"):
        _entry_points()[entry](2**20, 2**20, 2**20)


def test_the_carver_template_refuses_operands_over_its_gpus_memory():
    with pytest.raises(ValueError, match="device memory of H100"):
        mm.carver_template(131072, 131072, 131072, arch="H100")
    assert mm.carver_template(131072, 131072, 131072, arch="H200").recommend_hints(1)


def test_numpy_ints_work_everywhere():
    shape = (np.int64(4000), np.int32(4097), np.uint16(1000))
    assert mm.kernel(*shape, **SMALL_M).script() == mm.kernel(4000, 4097, 1000, **SMALL_M).script()
    cfg = {k: (np.int64(v) if type(v) is int else np.bool_(v)) for k, v in SMALL_M.items()}
    assert mm.kernel(4000, 4097, 1000, **cfg).script() == mm.kernel(4000, 4097, 1000, **SMALL_M).script()
    normalized = mm.normalize_config(cfg)
    assert normalized == SMALL_M and all(type(v) in (int, bool) for v in normalized.values())
    assert [h.to_config() for h in mm.carver_template(*shape, arch="H100").recommend_hints(3)] == \
        [h.to_config() for h in mm.carver_template(4000, 4097, 1000, arch="H100").recommend_hints(3)]
    assert len(mm.default_space(*shape)) == 288
    t = mm.tuner(*shape, arch="H100", topk=np.int64(2), target=SM90A)
    assert all(type(v) in (int, bool, str) for c in t.configs for v in c.values())


def test_a_grid_of_too_many_m_tiles_is_refused_by_the_kernel():
    M = 65535 * 128 + 1
    with pytest.raises(ValueError, match=r"launches 65536 rows of CTAs .* over CUDA's grid limit of 65535"):
        mm.kernel(M, 16, 16, **dict(BEST, block_N=16))
    mm.kernel(M, 16, 16, **dict(BEST, block_M=256, block_N=16))  # 32768 rows: fine


# --------------------------------------------------------------------------- class 12: config values
BAD_VALUES = [
    # (override, exception, fragment of the message)
    (dict(thread_num=4096), ValueError, "thread_num must be at most 1024, got 4096"),
    (dict(thread_num=1056), ValueError, "thread_num must be at most 1024, got 1056"),
    (dict(thread_num=100), ValueError, "thread_num must be a positive multiple of 32 (whole warps), got 100"),
    (dict(thread_num=0), ValueError, "thread_num must be a positive int, got 0"),
    (dict(thread_num=-128), ValueError, "thread_num must be a positive int, got -128"),
    (dict(thread_num=256.0), ValueError, "thread_num must be a positive int, got 256.0"),
    (dict(thread_num=True), ValueError, "thread_num must be a positive int, got True"),
    (dict(block_M=7), ValueError, "block_M must be a positive multiple of 16 (one MMA row slab), got 7"),
    (dict(block_M=-16), ValueError, "block_M must be a positive int, got -16"),
    (dict(block_M="128"), ValueError, "block_M must be a positive int, got '128'"),
    (dict(block_M=2**40), ValueError, "block_M must be at most 65536, got 1099511627776"),
    (dict(block_N=12), ValueError, "block_N must be a positive multiple of 8"),
    (dict(block_N=None), ValueError, "block_N must be a positive int, got None"),
    (dict(block_K=24), ValueError, "block_K must be a positive multiple of 16"),
    (dict(block_K=0), ValueError, "block_K must be a positive int, got 0"),
    (dict(block_M=4096, block_N=4096, block_K=16), ValueError, "shared memory"),
    (dict(num_stages=-1), ValueError, "num_stages must be >= 0"),
    (dict(num_stages=33), ValueError, "num_stages must be at most 32, got 33"),
    (dict(num_stages=10**9), ValueError, "num_stages must be at most 32"),
    (dict(num_stages=2.5), ValueError, "num_stages must be >= 0 and <= 32, got 2.5"),
    (dict(num_stages=False), ValueError, "num_stages must be >= 0 and <= 32, got False"),
    (dict(enable_rasterization="False"), TypeError, "enable_rasterization must be a bool, got 'False'"),
    (dict(enable_rasterization=0), TypeError, "enable_rasterization must be a bool, got 0"),
    (dict(panel_size=0), ValueError, "panel_size must be a positive int, got 0"),
    (dict(panel_size=10**7), ValueError, "panel_size must be at most 65535"),
    (dict(panel_size=True), ValueError, "panel_size must be a positive int, got True"),
    (dict(split_k=-2), ValueError, "split_k must be a positive int, got -2"),
    (dict(split_k=True), ValueError, "split_k must be a positive int, got True"),
    (dict(split_k=70000), ValueError, "split_k must be at most 65535"),
    (dict(split_k=65), ValueError, "split_k=65 leaves a split with no work for K=4096, block_K=64"),
    (dict(warp_policy="FullRow"), ValueError, "warp_policy must be one of ['square', 'full_row', 'full_col']"),
    (dict(warp_policy=None), ValueError, "warp_policy must be one of"),
    (dict(persistent=-132), ValueError, "persistent must be an int >= 0, got -132"),
    (dict(persistent=132.0), ValueError, "persistent must be an int >= 0, got 132.0"),
    (dict(persistent=2**31), ValueError, "persistent must be at most 2147483647"),
    (dict(persistent=1, split_k=2), ValueError, "persistent=1 and split_k=2 do not combine"),
    (dict(block_M=128, thread_num=512, warp_policy="full_row"), ValueError,
     "block_M must be a multiple of 256, got 128"),
]


@pytest.mark.parametrize("override,exc,fragment", BAD_VALUES)
def test_kernel_refuses_every_bad_config_value_up_front(override, exc, fragment):
    with pytest.raises(exc) as e:
        mm.kernel(4096, 4096, 4096, **{**BEST, **override})
    assert fragment in str(e.value), str(e.value)


@pytest.mark.parametrize("override,exc,fragment", BAD_VALUES)
def test_the_template_raises_exactly_the_carvers_messages(override, exc, fragment):
    """The rules live in carver/validity.py only: the kernel's message is the carver's, word for word."""
    config = {**BEST, **override}
    carver_says = check_matmul_config(MatmulProblem(4096, 4096, 4096), config, kernel_keys=True)
    assert carver_says and any(fragment in m for m in carver_says), carver_says
    with pytest.raises(exc) as e:
        mm.kernel(4096, 4096, 4096, **config)
    assert str(e.value) == "; ".join(carver_says)
    # validate (the autotuner's pre-compile filter) asks the same table, with the GPU's own limits, and
    # returns the reasons instead of raising
    tmpl = mm.carver_template(4096, 4096, 4096, arch="H100")
    on_h100 = check_matmul_config(MatmulProblem(4096, 4096, 4096), config, CUDA("H100"), kernel_keys=True)
    assert on_h100 and mm.validate(tmpl, 4096, "float16", config) == on_h100


@pytest.mark.parametrize("override,exc,fragment", BAD_VALUES)
def test_compile_and_tuner_refuse_bad_configs_before_compiling(override, exc, fragment, nothing_compiles):
    config = {**BEST, **override}
    with pytest.raises(exc, match=None) as e:
        mm.compile(4096, 4096, 4096, config, target=SM90A)
    assert fragment in str(e.value)
    with pytest.raises(exc) as e:
        mm.tuner(4096, 4096, 4096, arch="H100", configs=[BEST, config], target=SM90A)
    assert str(e.value).startswith("configs[1]: ") and fragment in str(e.value)
    with pytest.raises(exc) as e:  # the exhaustive baseline skips the arch's rules, never these
        mm.tuner(4096, 4096, 4096, arch="H100", configs=[config], target=SM90A, validate_configs=False)
    assert fragment in str(e.value)


def test_fp8_rules_come_from_the_carver_too():
    with pytest.raises(ValueError, match="thread_num a multiple of 128"):
        mm.kernel(4096, 4096, 4096, **dict(BEST, thread_num=192), in_dtype="fp8", out_dtype="float16")
    with pytest.raises(ValueError, match="block_M >= 64"):
        mm.kernel(4096, 4096, 4096, **dict(BEST, block_M=32, thread_num=128), in_dtype="fp8", out_dtype="float16")


@pytest.mark.parametrize("config,exc,fragment", [
    ([("block_M", 64)], TypeError, "a config must be a dict"),
    ({**BEST, "blockM": 64}, ValueError, "unknown config key(s) ['blockM']"),
    ({**BEST, "pass_configs": "fast"}, TypeError, "pass_configs must be a dict"),
    ({k: v for k, v in BEST.items() if k != "block_K"}, ValueError, "lacks ['block_K']"),
    ({**BEST, "thread_num": 4096}, ValueError, "thread_num must be at most 1024"),
    ({**BEST, "block_M": 0}, ValueError, "block_M must be a positive int, got 0"),
])
def test_normalize_config_refuses_bad_keys_and_values(config, exc, fragment):
    with pytest.raises(exc) as e:
        mm.normalize_config(config)
    assert fragment in str(e.value)


@pytest.mark.parametrize("bad", [dict(block_M=0), dict(block_N=0), dict(block_K=0), dict(thread_num=0),
                                 dict(block_M=7), dict(thread_num=4096), dict(num_stages=-1), dict(split_k=0)])
def test_split_k_candidates_and_hopper_variants_refuse_bad_configs(bad):
    """``split_k_candidates`` divided by zero on block_M=0."""
    key = next(iter(bad))
    with pytest.raises(ValueError, match=rf"configs\[0\]: {key}"):
        mm.split_k_candidates([{**SMALL_M, **bad}], 64, 4096, 4096, 132)
    with pytest.raises(ValueError, match=rf"configs\[0\]: {key}"):
        mm.hopper_variants([{**BEST, **bad}], 8192, 8192, 512, 132, 227 * 1024)


def test_split_k_candidates_and_hopper_variants_check_their_numbers():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_sms"):
            mm.split_k_candidates([SMALL_M], 64, 4096, 4096, bad)
        with pytest.raises(ValueError, match="num_sms"):
            mm.hopper_variants([BEST], 8192, 8192, 512, bad, 227 * 1024)
        with pytest.raises(ValueError, match="smem_per_block"):
            mm.hopper_variants([BEST], 8192, 8192, 512, 132, bad)
    with pytest.raises(ValueError, match="top"):
        mm.split_k_candidates([SMALL_M], 64, 4096, 4096, 132, top=-1)
    with pytest.raises(TypeError, match="list of config dicts"):
        mm.split_k_candidates(SMALL_M, 64, 4096, 4096, 132)
    assert mm.split_k_candidates([SMALL_M], np.int64(64), 4096, 4096, np.int32(132)) == \
        mm.split_k_candidates([SMALL_M], 64, 4096, 4096, 132)


def test_tuner_flags_are_bools():
    with pytest.raises(TypeError, match="split_k must be a bool"):
        mm.tuner(4096, 4096, 4096, arch="H100", split_k=4, target=SM90A)
    with pytest.raises(TypeError, match="variants must be a bool"):
        mm.tuner(4096, 4096, 4096, arch="H100", variants="no", target=SM90A)
    with pytest.raises(ValueError, match="topk must be a positive int"):
        mm.tuner(4096, 4096, 4096, arch="H100", topk=0, target=SM90A)


# --------------------------------------------------------------------------------- class 12: targets
ACCEPTED = "{'kind': 'cuda', 'arch': 'sm_90a'}"
BAD_TARGETS = [
    "nonsense", "gpu", "CUDA", "sm90a", "sm_9x", "llvm", 5, 3.0, ["cuda"], ("cuda",), b"cuda", True,
    {"arch": "sm_90a"}, {"kind": "rocm", "arch": "gfx942"}, {"kind": "cuda", "arch": "nonsense"},
    {"kind": "cuda", "arch": 90}, {"kind": "cuda", "arch": "sm_90a", "bogus": 1}, {"kind": "cuda"}, {},
]


@pytest.mark.parametrize("target", BAD_TARGETS, ids=repr)
def test_a_bad_target_is_a_value_error_listing_what_is_accepted(target, no_gpu, nothing_compiles):
    for call in (lambda: mm.compile(4096, 4096, 4096, BEST, target=target),
                 lambda: mm.compile(4096, 4096, 4096, target=target),
                 lambda: mm.tuner(4096, 4096, 4096, arch="H100", target=target)):
        with pytest.raises(ValueError) as e:  # raised by tilecarve, never a TileLang AssertionError
            call()
        assert type(e.value) is ValueError and ACCEPTED in str(e.value) and "'auto'" in str(e.value), str(e.value)


@pytest.mark.parametrize("target", ["c", {"kind": "c"}], ids=repr)
def test_the_c_target_is_refused_for_a_gemm(target, nothing_compiles):
    for call in (lambda: mm.compile(4096, 4096, 4096, BEST, target=target),
                 lambda: mm.tuner(4096, 4096, 4096, arch="H100", target=target)):
        with pytest.raises(ValueError, match="C target on the CPU, which cannot lower the GEMM"):
            call()


def test_a_tvm_target_object_is_judged_too(no_gpu, nothing_compiles):
    from tvm.target import Target

    with pytest.raises(ValueError, match="not supported"):
        mm.compile(4096, 4096, 4096, BEST, target=Target("llvm"))
    assert mm.MATMUL.resolve(None, Target({"kind": "cuda", "arch": "sm_80"})).arch == CUDA("sm_80")
    assert mm.MATMUL.resolve(None, {"kind": "cuda", "arch": "sm_89"}).arch == CUDA("sm_89")


# ---------------------------------------------------------------------------- class 13: no GPU at all
def _assert_no_gpu_error(e: pytest.ExceptionInfo, M: int, N: int, K: int) -> None:
    msg = str(e.value)
    assert isinstance(e.value, mm.CUDAUnavailableError) and isinstance(e.value, RuntimeError)
    assert "needs a CUDA GPU" in msg and "torch.cuda.is_available() is False" in msg
    assert f"carver_template({M}, {N}, {K}, arch=carver.arch.CUDA('H100')).recommend_hints(8)" in msg
    assert f"compile({M}, {N}, {K}, config, target={{'kind': 'cuda', 'arch': 'sm_90a'}})" in msg


@pytest.mark.parametrize("call", [
    lambda: mm.tune(4096, 4096, 4096),
    lambda: mm.tune(4096, 4096, 4096, arch="H100"),
    lambda: mm.tune(4096, 4096, 4096, arch="H100", configs=mm.default_space(4096, 4096, 4096)),
    lambda: mm.tuner(4096, 4096, 4096),
    lambda: mm.tuner(4096, 4096, 4096, arch="H100"),
    lambda: mm.tuner(4096, 4096, 4096, arch="H100", target="cuda"),
    lambda: mm.tuner(4096, 4096, 4096, arch="H100", target=None),
    lambda: mm.compile(4096, 4096, 4096),
    lambda: mm.compile(4096, 4096, 4096, BEST),
    lambda: mm.compile(4096, 4096, 4096, BEST, target="cuda"),
])
def test_without_a_gpu_tune_says_so_at_once_and_what_works_offline(call, no_gpu, nothing_compiles):
    with pytest.raises(mm.CUDAUnavailableError) as e:
        call()
    _assert_no_gpu_error(e, 4096, 4096, 4096)


def test_the_offline_paths_the_message_names_work_without_a_gpu(no_gpu):
    hints = mm.carver_template(4096, 4096, 4096, arch=CUDA("H100")).recommend_hints(8)
    assert len(hints) == 8
    assert MatmulTemplate(4096, 4096, 4096).with_arch(CUDA("H100")).recommend_hints(8) == hints
    # a compile-only target builds a tuner (candidates to inspect or compile), but it cannot run them
    t = mm.tuner(4096, 4096, 4096, target=SM90A)
    assert t.configs[:8] == [h.to_config() for h in hints]


@pytest.mark.nvcc
@pytest.mark.parametrize("config", [None, SMALL_M])
def test_compile_for_a_compile_only_target_works_without_a_gpu(config, no_gpu):
    jit = mm.compile(1000, 1000, 1000, config, target=SM90A)
    assert "wgmma" in jit.get_kernel_source()
