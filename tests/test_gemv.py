"""The GEMV family: offline logic, compile-only for sm_90a (nvcc), and runs on a GPU (marker gpu)."""

from __future__ import annotations

import time

import pytest

from carver.arch import CUDA
from templates import gemv
from templates.gemv import GEMV, GemvConfig, GemvProblem
from templates.protocol import Template, TuneOptions


# -------------------------------------------------------------------------------- offline logic
def test_problem_is_validated_with_value_and_fix():
    p = GemvProblem(3, 1000, 4100, "fp16")
    assert (p.dtype, p.out_dtype) == ("float16", "float16") and p.weight_bytes == 1000 * 4100 * 2
    with pytest.raises(ValueError, match=r"M must be at most 16, got 17.*templates\.matmul"):
        GemvProblem(17, 4096, 4096)
    with pytest.raises(ValueError, match="M must be a positive int, got 0"):
        GemvProblem(0, 4096, 4096)
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


@pytest.mark.parametrize("shape", [(1, 4096, 4096), (16, 11008, 4096), (3, 1000, 4100), (1, 7, 1), (4, 128256, 4096)])
def test_space_is_legal_and_is_what_the_carver_ranks(shape):
    p = GemvProblem(*shape)
    space = GEMV.space(p)
    assert 80 <= len(space) <= 120 and len(set(space)) == len(space)  # the GPU grid measures all of them
    assert {c.path for c in space} == {"simt", "mma"} and sum(c.path == "simt" for c in space) == 72
    assert all(GEMV.check(p, c) == [] and GEMV.check(p, c, CUDA("H100")) == [] for c in space)
    tmpl = gemv.carver_template(p, "H100")
    grid = [c.carver_dict() for c in space]
    assert sorted(map(str, tmpl.rank(grid).configs)) == sorted(map(str, grid))  # nothing dropped
    assert [h.to_config() for h in tmpl.recommend_hints(len(space))] == tmpl.rank(grid).configs


@pytest.mark.parametrize("arch", ["H100", "H200", "A100-80GB"])
def test_candidates_are_ranked_top_k_and_quick(arch):
    p = GemvProblem(4, 14336, 4096)
    t = time.perf_counter()
    top = GEMV.candidates(p, CUDA(arch), 8)
    ms = (time.perf_counter() - t) * 1e3
    print(f"gemv candidates {arch}: {ms:.1f} ms")  # the benchmark reports time; the bound is 50 ms
    assert len(top) == len(set(top)) == 8 and all(c in GEMV.space(p) for c in top)
    assert top[0] == GemvConfig(**gemv.carver_template(p, arch).recommend_hints(1)[0].to_config())
    assert max(sum((c.path, c.block_N) == pb for c in top) for pb in {(c.path, c.block_N) for c in top}) <= 2
    assert sum(c.path == "mma" for c in top) >= 2 and sum(c.path == "simt" for c in top) >= 2  # both measured
    with pytest.raises(ValueError, match="pass arch"):
        GEMV.candidates(p, None, 8)


def test_template_protocol_and_no_gpu_path():
    assert isinstance(GEMV, Template)
    with pytest.raises(TypeError, match="GemvProblem"):
        GEMV.tune((1, 64, 64))
    with pytest.raises(ValueError, match="C target"):
        GEMV.resolve(GemvProblem(1, 64, 64), "c")
    tuner = GEMV.tuner(GemvProblem(1, 4096, 4096), TuneOptions(target="sm_90a", topk=4))
    assert len(tuner.configs) == 4


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
    vec_bits = 16 * gemv.resolved_vec(GemvProblem(M, N, K, dtype), GemvConfig.from_dict(config or {
        "block_N": 1, "block_K": 8, "thread_num": 32}))
    if vec_bits == 128:
        assert "uint4" in src  # 128-bit loads of W
    assert "__shfl_xor_sync" in src or "block_N" in str(config) and config["thread_num"] == config["block_N"]


# -------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("M,N,K,dtype", [(1, 1000, 4100, "float16"), (3, 1000, 4100, "bfloat16"),
                                         (16, 1000, 4100, "float16"), (16, 4096, 4097, "bfloat16")])
def test_runs_and_matches_the_fp32_product(M, N, K, dtype):
    import torch

    p = GemvProblem(M, N, K, dtype)
    x = torch.randn(M, K, device="cuda").to(getattr(torch, dtype))
    W = (torch.randn(N, K, device="cuda") / K ** 0.5).to(getattr(torch, dtype))
    ref = gemv.ref_program(x, W).float()
    for cfg in GEMV.candidates(p, CUDA("cuda"), 4) + GEMV.space(p)[::17]:
        y = GEMV.compile(p, cfg)(x, W)
        bad = int((~torch.isclose(y.float(), ref, atol=1e-2, rtol=1e-2)).sum())
        assert bad == 0, (cfg, bad)


@pytest.mark.gpu
def test_tune_end_to_end():
    import torch

    k = gemv.tune(4, 1000, 4100, topk=4, rep=5)
    x = torch.randn(4, 4100, device="cuda").half()
    W = torch.randn(1000, 4100, device="cuda").half() / 64
    assert torch.allclose(k(x, W).float(), gemv.ref_program(x, W).float(), atol=1e-2, rtol=1e-2)
