"""The GEMV family: offline logic, compile-only for sm_90a (nvcc), and runs on a GPU (marker gpu)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from autotuner.config import kernel_name
from carver.arch import CUDA
from templates import gemv
from templates.gemv import GEMV, GemvConfig, GemvProblem
from templates.protocol import Template, TuneOptions

DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gemv-2026-11-21-h200"


# -------------------------------------------------------------------------------- offline logic
def test_problem_is_validated_with_value_and_fix():
    p = GemvProblem(3, 1000, 4100, "fp16")
    assert (p.dtype, p.out_dtype) == ("float16", "float16") and p.weight_bytes == 1000 * 4100 * 2
    with pytest.raises(ValueError, match=r"M must be at most 16, got 17.*templates\.matmul"):
        GemvProblem(17, 4096, 4096)
    from carver.templates import GEMVTemplate

    for make in (lambda: GemvProblem(0, 4096, 4096), lambda: GEMVTemplate(64, 64, M=0)):
        with pytest.raises(ValueError, match="M must be a positive int, got 0") as e:
            make()
        assert "GEMM" not in str(e.value)  # no rows is not "too many rows": the GEMM is no fix for it
    with pytest.raises(ValueError, match="K must be at most 2147483647"):
        GemvProblem(1, 4096, 2**31)
    with pytest.raises(ValueError, match=r"dtype must be one of \['float16', 'bfloat16'\], got 'float8_e4m3'"):
        GemvProblem(1, 64, 64, "float8_e4m3")
    with pytest.raises(ValueError, match="more than any GPU holds"):
        GemvProblem(1, 2**31 - 1, 2**31 - 1)
    assert GemvProblem(1, 64, 64, "bfloat16", "float32").out_dtype == "float32"


def test_config_is_validated_and_round_trips():
    c = GemvConfig.from_dict({"block_N": 4, "block_K": 1024, "thread_num": 128})
    assert c.to_dict() == {"block_N": 4, "block_K": 1024, "thread_num": 128} and c.reduce_threads == 32
    with pytest.raises(ValueError, match="vec must be 0"):
        GemvConfig(block_N=4, block_K=1024, thread_num=128, vec=3)
    with pytest.raises(ValueError, match="unknown config key"):
        GemvConfig.from_dict({"block_N": 4, "block_K": 1024, "thread_num": 128, "stages": 2})
    with pytest.raises(ValueError, match="path must be one of"):
        GemvConfig(block_N=4, block_K=1024, thread_num=128, path="wgmma")
    p = GemvProblem(1, 1000, 4100)  # K = 4100: 8-byte vectors at most in fp16
    assert gemv.resolved_vec(p, c) == 4
    (why,) = GEMV.check(p, GemvConfig(block_N=4, block_K=1024, thread_num=128, vec=8))
    assert "vec=8" in why and "use vec=0" in why
    why = GEMV.check(p, GemvConfig(block_N=4, block_K=96, thread_num=128))
    assert any("block_K must be a multiple of" in w and "use block_K=" in w for w in why)
    why = GEMV.check(p, GemvConfig(block_N=4, block_K=1024, thread_num=384))
    assert any("power of two up to 32" in w for w in why)
    with pytest.raises(ValueError, match="power of two up to 32"):
        GEMV.as_config(p, {"block_N": 2, "block_K": 1024, "thread_num": 256})
    # the carver's own rule names the type of a bad tma, as the config class's does
    from carver.templates import GEMVTemplate

    (bad,) = GEMVTemplate(M=1, N=1000, K=4100).with_arch(CUDA("H200")).rank(
        [{"block_N": 32, "block_K": 128, "thread_num": 128, "path": "mma", "num_stages": 4, "tma": 1}]).dropped
    assert "tma must be a bool, got 1 of type int" in bad.reasons[0] and "use True" in bad.reasons[0]


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 11008, 4096), (3, 1000, 4100), (1, 7, 1), (4, 128256, 4096)])
def test_space_is_legal_and_is_what_the_carver_ranks(shape):
    p = GemvProblem(*shape)
    space = GEMV.space(p)
    paths = {"simt", "mma"} if p.K % 2 == 0 else {"simt"}  # odd K: rows not on 4-byte boundaries, no mma
    assert len(space) <= 130 and len(set(space)) == len(space)  # the GPU grid measures all of them
    assert {c.path for c in space} == paths and sum(c.path == "simt" for c in space) == 72
    # the cp.async configs: the async grid less the one shared memory cannot hold (64x256, 8 stages)
    assert sum(not c.tma for c in space) == (11 if "mma" in paths else 0)
    assert all(c.split_k == 1 and c.path == "mma" for c in space if not c.tma)
    assert len(space) >= 80 or paths == {"simt"}
    assert all(GEMV.check(p, c) == [] and GEMV.check(p, c, CUDA("H100")) == [] for c in space)
    tmpl = gemv.carver_template(p, "H100")
    grid = [c.carver_dict() for c in space]
    assert sorted(map(str, tmpl.rank(grid).configs)) == sorted(map(str, grid))  # nothing dropped
    assert [h.to_config() for h in tmpl.recommend_hints(len(space))] == tmpl.rank(grid).configs


@pytest.mark.parametrize("arch", ["H100", "H200", "A100-80GB"])
def test_candidates_are_ranked_top_k_and_quick(arch):
    p = GemvProblem(4, 14336, 4096)
    t = time.perf_counter()
    cands = GEMV.candidates(p, CUDA(arch), 8)
    ms = (time.perf_counter() - t) * 1e3
    print(f"gemv candidates {arch}: {ms:.1f} ms")  # the benchmark reports time; the issue's bound is 50 ms
    top, variants = cands[:8], cands[8:]
    assert len(cands) == len(set(cands)) and all(c in GEMV.space(p) for c in cands)
    # the top-8 is the TMA and SIMT grid's; on a GPU with TMA two cp.async variants follow, one per block_N
    assert all(c.tma for c in top) and all(c.path == "mma" and not c.tma for c in variants)
    assert len(variants) == (2 if CUDA(arch).has_tma else 0) and len({c.block_N for c in variants}) == len(variants)
    assert GEMV.candidates(p, CUDA(arch), 8, variants=False) == top
    assert top[0] == GemvConfig(**gemv.carver_template(p, arch).recommend_hints(1)[0].to_config())
    assert max(sum((c.path, c.block_N) == pb for c in top) for pb in {(c.path, c.block_N) for c in top}) <= 2
    assert sum(c.path == "mma" for c in top) >= 2 and sum(c.path == "simt" for c in top) >= 2  # both measured
    with pytest.raises(ValueError, match="pass arch"):
        GEMV.candidates(p, None, 8)


def test_mma_path_needs_rows_on_4_byte_boundaries():
    odd = GemvProblem(4, 999, 4097)
    mma = GemvConfig(path="mma", block_N=32, block_K=128, thread_num=128, num_stages=2)
    assert not [c for c in GEMV.space(odd) if c.path == "mma"] and len(GEMV.space(odd)) == 72
    (why,) = GEMV.check(odd, mma)
    assert "K=4097" in why and "path='simt'" in why
    assert all(c.path == "simt" for c in GEMV.candidates(odd, CUDA("H100"), 8))
    assert GEMV.check(GemvProblem(4, 999, 4098), mma) == []  # 4-byte rows: offered (cp.async, not TMA)


def test_mma_path_is_checked_by_the_matmul_rules():
    p = GemvProblem(4, 999, 4098)
    mma = dict(path="mma", block_N=32, block_K=128, thread_num=128, num_stages=2)
    assert GEMV.check(p, GemvConfig(**mma)) == [] and GEMV.check(p, GemvConfig(**mma), CUDA("A100-80GB")) == []
    (why,) = GEMV.check(p, GemvConfig(**{**mma, "block_N": 24}), CUDA("H100"))
    assert "no warp partition for block 16x24" in why  # 4 warps need 8 columns each
    (why,) = GEMV.check(p, GemvConfig(**{**mma, "block_N": 128, "block_K": 512, "num_stages": 4}), CUDA("H100"))
    assert "shared memory" in why and "num_stages <= " in why
    assert any("split_k=80" in w for w in GEMV.check(p, GemvConfig(**mma, split_k=80)))
    (why,) = GEMV.check(p, GemvConfig(**mma, vec=4))
    assert "vec is a key of the simt path" in why
    (why,) = GEMV.check(p, GemvConfig(block_N=4, block_K=1024, thread_num=128, num_stages=2))
    assert "keys of the mma path" in why and "path='mma'" in why
    assert GemvConfig(**mma).carver_dict() == {**mma, "split_k": 1}
    assert GemvConfig.from_dict(GemvConfig(**mma).to_dict()) == GemvConfig(**mma)


def test_model_sees_simt_issue_bound_and_mma_memory_bound():
    """The fitted model: the SIMT kernel's time grows with rows of x (issue), the mma path's barely."""
    def best(M, path):
        tmpl = gemv.carver_template(GemvProblem(M, 4096, 4096), "H200")
        return next(h.prediction for h in tmpl.recommend_hints(200) if h.to_config().get("path", "simt") == path)

    assert best(16, "simt").latency_ms > 1.8 * best(1, "simt").latency_ms and best(16, "simt").bound == "compute"
    assert best(16, "mma").latency_ms < 1.1 * best(1, "mma").latency_ms
    assert best(16, "mma").latency_ms < best(16, "simt").latency_ms


def test_fitted_constants_rank_the_calibration_grids():
    """carver/gemv_model.py's constants against the grids they were fitted on (docs/gemv.md)."""
    pytest.importorskip("scipy")
    from carver.calibrate_gemv import load_grids, score
    from carver.gemv_model import gemv_constants_for

    grids = load_grids(str(DATA / "grid"), CUDA("H200"))
    scores = [score(g, gemv_constants_for(CUDA("H200"))) for g in grids]
    assert len(scores) == 4 and min(s["top8"] for s in scores) >= 0.96
    assert sum(s["spearman"] for s in scores) / 4 > 0.6  # 0.17 with the uncalibrated model before the fit


def test_template_protocol_and_no_gpu_path():
    assert isinstance(GEMV, Template)
    with pytest.raises(TypeError, match="GemvProblem"):
        GEMV.tune((1, 64, 64))
    with pytest.raises(ValueError, match="C target"):
        GEMV.resolve(GemvProblem(1, 64, 64), "c")
    tuner = GEMV.tuner(GemvProblem(1, 4096, 4096), TuneOptions(target="sm_90a", topk=4))
    # the top-4, then two cp.async variants on a GPU with TMA and the first's narrower-step twin
    assert len(tuner.configs) == 4 + 3
    assert kernel_name(tuner.fn) == "templates.gemv"  # its name in logs and `tilecarve cache list`


# -------------------------------------------------------------------------------- nvcc, sm_90a
@pytest.mark.nvcc
@pytest.mark.parametrize("M,N,K,dtype,config", [
    (1, 1000, 4100, "float16", None),
    (16, 1000, 4100, "bfloat16", None),
    (3, 4096, 4096, "float16", {"block_N": 8, "block_K": 1024, "thread_num": 128}),
    (16, 999, 4097, "float16", {"block_N": 4, "block_K": 32, "thread_num": 32}),  # odd K: scalar loads
    (1, 64, 4096, "bfloat16", {"block_N": 1, "block_K": 2048, "thread_num": 32}),
])
def test_compiles_for_sm90a(M, N, K, dtype, config):
    k = gemv.compile(M, N, K, config, dtype=dtype, target="sm_90a")
    src = k.get_kernel_source()
    if "mma_sync" in src:  # the carver's top-1 may be the tensor-core path (tested below)
        assert config is None
        return
    vec_bits = 16 * gemv.resolved_vec(GemvProblem(M, N, K, dtype), GemvConfig.from_dict(config or {
        "block_N": 1, "block_K": 8, "thread_num": 32}))
    if vec_bits == 128:
        assert "uint4" in src  # 128-bit loads of W
    assert "__shfl_xor_sync" in src or "block_N" in str(config) and config["thread_num"] == config["block_N"]


@pytest.mark.nvcc
@pytest.mark.parametrize("M,N,K,split,copy", [(4, 999, 4098, 1, "cp_async"), (16, 1000, 4104, 2, "tma_load")])
def test_mma_path_compiles_for_sm90a(M, N, K, split, copy):
    """Odd N and K: tensor cores (mma.sync), a pipelined copy (cp.async when rows are not 16-byte
    aligned, else TMA), guards on the tails, and split-K's second kernel."""
    cfg = dict(path="mma", block_N=32, block_K=128, thread_num=128, num_stages=2, split_k=split)
    src = gemv.compile(M, N, K, cfg, target="sm_90a").get_kernel_source()
    assert "mma_sync" in src and "ldmatrix" in src and copy in src
    assert f"< {N}" in src or f"< {N // 8}" in src or f"< {-(-N // 8)}" in src  # rows of W past N
    assert ("main_kernel_1" in src) == (split > 1)  # the fp32 partials' sum, no atomics
    assert "atomic" not in src.lower()


@pytest.mark.nvcc
@pytest.mark.parametrize("M,N,K,stages", [(4, 999, 4098, 4), (16, 1000, 4104, 8), (1, 4096, 4096, 4)])
def test_mma_path_without_tma_compiles_for_sm90a(M, N, K, stages):
    """``tma=False``: cp.async copies in a plain pipeline, no TMA and no producer warpgroup (no mbarrier,
    no register hand-over), tensor cores, and y stored inside (M, N) only on odd shapes."""
    cfg = dict(path="mma", block_N=32, block_K=128, thread_num=128, num_stages=stages, tma=False)
    src = gemv.compile(M, N, K, cfg, target="sm_90a").get_kernel_source()
    assert "mma_sync" in src and "cp_async" in src
    assert "tma_load" not in src and "mbarrier" not in src.lower() and "set_max_nreg" not in src
    assert "__launch_bounds__(128" in src  # the config's threads, no producer warpgroup added
    if N % 32:
        assert f"< {N}" in src or f"< {N // 8}" in src or f"< {-(-N // 8)}" in src or f"< {N // 2}" in src
    tma = dict(cfg, tma=True, num_stages=4)
    assert "tma_load" in gemv.compile(M, N, K, tma, target="sm_90a").get_kernel_source() or K * 2 % 16


# -------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("group", ["candidates", "simt", "mma", "cp.async"])
@pytest.mark.parametrize("M,N,K,dtype", [(1, 1000, 4100, "float16"), (3, 1000, 4100, "bfloat16"),
                                         (4, 999, 4097, "float16"), (4, 999, 4098, "float16"),
                                         (16, 1000, 4104, "bfloat16"), (16, 32000, 14337, "float16")])
def test_runs_and_matches_the_fp32_product(M, N, K, dtype, group):
    """Both paths on odd N and K: the carver's top-4, SIMT configs across the grid, mma ones (split-K and
    the cp.async program too). One group of configs per test, since each compiles one after another and
    a shape's ~15 configs in one test outlasted the rest of the GPU suite run 4 at a time."""
    import torch

    p = GemvProblem(M, N, K, dtype)
    simt = [c for c in GEMV.space(p) if c.path == "simt"]
    mma = [c for c in GEMV.space(p) if c.path == "mma"]
    assert len(simt) == 72 and (any(c.split_k > 1 for c in mma[::11]) if K % 2 == 0 else not mma)
    configs = {"candidates": GEMV.candidates(p, CUDA("cuda"), 4), "simt": simt[::23], "mma": mma[::11],
               "cp.async": [c for c in mma if not c.tma][1::4]}[group]
    if not configs:
        assert group in ("mma", "cp.async") and K % 2, "only an odd K leaves the mma path no config"
        return
    x = torch.randn(M, K, device="cuda").to(getattr(torch, dtype))
    W = (torch.randn(N, K, device="cuda") / K ** 0.5).to(getattr(torch, dtype))
    ref = gemv.ref_program(x, W).float()
    for cfg in configs:
        y = GEMV.compile(p, cfg)(x, W)
        bad = int((~torch.isclose(y.float(), ref, atol=1e-2, rtol=1e-2)).sum())
        assert bad == 0, (cfg, bad)


@pytest.mark.gpu
def test_tune_end_to_end_measures_both_paths():
    import torch

    tuner = gemv.tuner(16, 1000, 4104, topk=8)
    assert {GemvConfig.from_dict(c).path for c in tuner.configs} == {"simt", "mma"}
    k = gemv.tune(16, 1000, 4104, topk=8, rep=5)
    x = torch.randn(16, 4104, device="cuda").half()
    W = torch.randn(1000, 4104, device="cuda").half() / 64
    assert torch.allclose(k(x, W).float(), gemv.ref_program(x, W).float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_tune_end_to_end():
    import torch

    k = gemv.tune(4, 1000, 4100, topk=4, rep=5)
    x = torch.randn(4, 4100, device="cuda").half()
    W = torch.randn(1000, 4100, device="cuda").half() / 64
    assert torch.allclose(k(x, W).float(), gemv.ref_program(x, W).float(), atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
def test_tuning_the_cp_async_program_finds_the_factory_depends_on_its_arguments_only():
    """The cp.async program's compile renames its thread index (TileLang lowers in place); before the
    compile lowered a copy, tuning it warned that the factory gave another PrimFunc in the tuning process
    than in the worker (the MLP block's M = 16 keys, H200, 2026-11-23). A shape no other test compiles."""
    import warnings

    import torch

    from autotuner import KernelFactoryWarning

    p = GemvProblem(16, 1002, 4104, "float16")
    configs = [c.to_dict() for c in GEMV.space(p) if c.path == "mma" and not c.tma][:3]
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelFactoryWarning)
        k = gemv.tune(16, 1002, 4104, configs=configs, rep=5)
    x = torch.randn(16, 4104, device="cuda").half()
    W = torch.randn(1002, 4104, device="cuda").half() / 64
    assert torch.allclose(k(x, W).float(), gemv.ref_program(x, W).float(), atol=1e-2, rtol=1e-2)


def test_cp_async_variants_keep_at_most_a_quarter_of_k_in_flight():
    """Measured at K = 4096 (H100 and H200), cp.async pipelines 1024 columns deep streamed fastest and
    2048 deep 3-40% slower; the model prefers depth, so the variants are capped (where any config fits)."""
    import importlib

    space = importlib.import_module("templates.gemv.space")  # the package's `space` is the function
    for M, N, K in ((4, 4096, 4096), (16, 4096, 4096), (4, 14336, 4096)):
        extra = [c for c in GEMV.candidates(GemvProblem(M, N, K), CUDA("H100"), 8) if not c.tma]
        assert len({c.block_N for c in extra}) == 2 and len(extra) in (2, 3)
        assert all(c.num_stages * c.block_K <= K * space._ASYNC_MAX_DEPTH for c in extra)
    # K = 1024: no cp.async config of the grid is 256 or fewer columns deep; the model's order stands
    extra = [c for c in GEMV.candidates(GemvProblem(4, 4096, 1024), CUDA("H100"), 8) if not c.tma]
    assert len(extra) == 2 and len({c.block_N for c in extra}) == 2
    assert max(c.num_stages * c.block_K for c in extra) > 1024 * space._ASYNC_MAX_DEPTH


def test_the_first_cp_async_variant_is_measured_with_its_narrower_k_step_twin():
    """At equal depth the model ranks the wider K step first; measured (32 MB weight, M = 4 and 16, H100
    and H200) 32x128 with 8 stages beat 32x256 with 4. So the first variant's twin of the same block_N and
    depth with a narrower step joins the candidates, where the grid has one."""
    for M in (4, 16):
        extra = [c for c in GEMV.candidates(GemvProblem(M, 4096, 4096), CUDA("H200"), 8) if not c.tma]
        first, twin = extra[0], extra[-1]
        assert len(extra) == 3 and (twin.block_N, twin.block_K, twin.num_stages) == (32, 128, 8)
        assert twin.block_N == first.block_N and twin.block_K < first.block_K
        assert twin.block_K * twin.num_stages == first.block_K * first.num_stages
    # 14336 x 4096: the first variant is 128 columns wide, and the grid has no narrower step: no twin
    extra = [c for c in GEMV.candidates(GemvProblem(4, 14336, 4096), CUDA("H200"), 8) if not c.tma]
    assert len(extra) == 2 and extra[0].block_K == 128


@pytest.mark.parametrize("topk", [0, -1, True, 2.5])
def test_candidates_refuse_a_topk_that_is_not_a_positive_int_as_matmul_does(topk):
    with pytest.raises(ValueError, match=f"topk must be a positive int, got {topk!r}"):
        GEMV.candidates(GemvProblem(4, 4096, 4096), CUDA("H100"), topk)


def test_compile_checks_a_given_config_on_the_gpu_and_refuses_an_arch_not_the_targets():
    p = GemvProblem(16, 4096, 4096)
    with pytest.raises(ValueError, match=r"arch 'H100' \(sm_90\) and target .*sm_80.* name different GPUs"):
        GEMV.compile(p, None, target={"kind": "cuda", "arch": "sm_80"}, arch="H100")
    deep = GemvConfig(path="mma", block_N=32, block_K=256, thread_num=128, num_stages=8)  # 192 KB of smem
    assert GEMV.check(p, deep) == []  # the rules no GPU escapes (H100's 227 KB) pass it; A100's 163 KB do not
    with pytest.raises(ValueError, match="shared memory, over A100.*use num_stages <= 6"):
        GEMV.compile(p, deep, target="sm_80")
