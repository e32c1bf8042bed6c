"""Hostile inputs to the carver, offline: sizes no GPU can hold, config values no GPU accepts, and
latencies that must stay finite and positive for every legal shape, however extreme.

Issue classes: 11 (huge / malformed shapes: refused with the value and the fix, never an int64 overflow
or a negative latency) and 12 (the rule table in carver/validity.py refuses every bad config value up
front, naming the key, the value and the fix).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from carver import (
    CUDA,
    ElementwiseTemplate,
    GEMVTemplate,
    GeneralReductionTemplate,
    GPUArch,
    MatmulProblem,
    MatmulTemplate,
    check_matmul_config,
)
from carver.arch import ARCHS
from carver.problem import INT32_MAX, MAX_DEVICE_BYTES
from carver.validity import (
    MAX_NUM_STAGES,
    legal_mask,
    normalize_config,
    require_matmul_config,
    split_k_limit,
)

BIG = 2**31 - 1


def cfg(bm=128, bn=256, bk=64, s=3, t=256, r=True, **kw):
    return dict(block_M=bm, block_N=bn, block_K=bk, num_stages=s, thread_num=t, enable_rasterization=r, **kw)


def _finite_positive(values) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


# --------------------------------------------------------------------------------------- class 11: shapes
@pytest.mark.parametrize("dim", ["M", "N", "K"])
@pytest.mark.parametrize("value", [2**31, 2**40, 2**63, 2**70, np.int64(2**40), np.uint64(2**63)])
def test_a_dimension_past_int32_is_refused_with_the_value_and_the_fix(dim, value):
    shape = {**dict(M=64, N=64, K=64), dim: value}
    for build in (lambda: MatmulProblem(**shape), lambda: MatmulTemplate(**shape),
                  lambda: MatmulTemplate(**shape).with_arch("H100")):
        with pytest.raises(ValueError) as e:  # never an OverflowError from deep inside the model
            build()
        msg = str(e.value)
        assert f"{dim} must be at most {INT32_MAX}" in msg and str(int(value)) in msg and "split" in msg, msg


@pytest.mark.parametrize("dim", ["M", "N", "K"])
@pytest.mark.parametrize("value", [0, -1, -(2**70), 1.5, 64.0, True, False, np.bool_(True), "64", None, 1j])
def test_a_dimension_that_is_not_a_positive_int_is_refused(dim, value):
    shape = {**dict(M=64, N=64, K=64), dim: value}
    with pytest.raises(ValueError, match=f"{dim} must be a positive int, got {value!r}"):
        MatmulProblem(**shape)


@pytest.mark.parametrize("np_int", [np.int8, np.int16, np.int32, np.int64, np.uint16, np.uint32, np.uint64])
def test_numpy_ints_are_sizes(np_int):
    p = MatmulProblem(np_int(64), np_int(100), np_int(120))
    assert (p.M, p.N, p.K) == (64, 100, 120) and all(type(v) is int for v in (p.M, p.N, p.K))
    a = MatmulTemplate(np_int(64), np_int(100), np_int(120)).with_arch("H100").recommend_hints(np_int(4))
    b = MatmulTemplate(64, 100, 120).with_arch("H100").recommend_hints(4)
    assert [h.to_config() for h in a] == [h.to_config() for h in b]


def test_the_2_40_cube_is_refused_not_ranked():
    """The issue's case: a 2**40 cube used to rank with negative latencies."""
    with pytest.raises(ValueError, match="M must be at most 2147483647"):
        MatmulTemplate(2**40, 2**40, 2**40).with_arch("H100").recommend_hints()
    with pytest.raises(ValueError, match="M must be at most 2147483647"):
        MatmulTemplate(2**70, 64, 64)


@pytest.mark.parametrize("shape", [(2**20, 2**20, 2**20), (1, 2**20, 2**20), (2**20, 2**20, 1), (2**20, 1, 2**20)])
def test_operands_beyond_any_gpu_are_refused_without_an_arch(shape):
    with pytest.raises(ValueError) as e:
        MatmulProblem(*shape)
    msg = str(e.value)
    assert "more than any GPU holds" in msg and "GiB" in msg and "split the problem" in msg, msg
    assert MAX_DEVICE_BYTES == 2**40  # the documented bound


@pytest.mark.parametrize("arch_name", sorted(ARCHS))
def test_operands_beyond_the_arch_memory_are_refused_when_bound(arch_name):
    arch = CUDA(arch_name)
    assert arch.memory_bytes and arch.memory_bytes >= 24 * 2**30
    side = 1 << 16  # 65536^3 fp16: A, B and C are 8 GiB each
    while 3 * side * side * 2 <= arch.memory_bytes:
        side *= 2
    MatmulProblem(side, side, side)  # fits the documented bound: only the arch refuses it
    with pytest.raises(ValueError) as e:
        MatmulTemplate(side, side, side).with_arch(arch)
    assert arch.name in str(e.value) and "device memory" in str(e.value)
    with pytest.raises(ValueError, match="device memory"):
        MatmulTemplate(side, side, side, arch=arch)


def test_the_arch_knows_its_memory_and_the_local_device_overlays_it(monkeypatch):
    assert CUDA("H200").memory_bytes > CUDA("H100").memory_bytes > CUDA("RTX4090").memory_bytes
    with pytest.raises(ValueError, match="memory_bytes"):
        dataclasses.replace(CUDA("H100"), memory_bytes=0)
    with pytest.raises(ValueError, match="memory_bytes"):
        dataclasses.replace(CUDA("H100"), memory_bytes=True)
    mine = dataclasses.replace(CUDA("H100"), name="H100-unknown-memory", memory_bytes=None)
    assert MatmulTemplate(4096, 4096, 4096).with_arch(mine).recommend_hints(2)
    from autotuner import forking

    reported = [dict(name="NVIDIA H100 80GB HBM3", major=9, minor=0, capability=[9, 0], multi_processor_count=132,
                     total_memory=85_029_158_912)]  # what the driver reports, asked in a forked child
    monkeypatch.setattr(forking, "local_gpus", lambda prefetch_tilelang=False: reported)
    local = CUDA("cuda")
    assert local.memory_bytes == 85_029_158_912
    with pytest.raises(ValueError, match="device memory"):
        MatmulTemplate(131072, 131072, 131072).with_arch(local)  # 96 GiB: over the 79.2 GiB reported
    assert MatmulTemplate(131072, 131072, 131072).with_arch("H200").recommend_hints(1)


EXTREME = [(1, 1, 1), (1, BIG, 1), (1, 1, BIG), (1, BIG, 8), (16, BIG, 1), (BIG // 256, 1, 1),
           (65535 * 256, 1, 1), (1, 1, 2**30), (2**15, 2**15, 2**15), (3, 5, 7), (2**16, 2**16, 16)]


@pytest.mark.parametrize("shape", EXTREME)
@pytest.mark.parametrize("arch_name", sorted(ARCHS))
def test_extreme_legal_shapes_rank_with_finite_positive_latencies(shape, arch_name):
    arch = CUDA(arch_name)
    try:
        tmpl = MatmulTemplate(*shape).with_arch(arch)
    except ValueError as e:  # some strips do not fit the smaller GPUs' memory: that is the only refusal
        assert "device memory" in str(e)
        return
    hints = tmpl.recommend_hints(8)
    assert hints
    preds = [h.prediction for h in hints]
    assert _finite_positive([p.latency_ms for p in preds]), preds
    assert _finite_positive([p.tflops for p in preds])
    assert all(math.isfinite(v) and v >= 0 for p in preds for v in p.terms.values())
    ranking = tmpl.rank([h.to_config() for h in hints] + [cfg(64, 64, 32, 2, 128)])
    assert _finite_positive([r.prediction.latency_ms for r in ranking.ranked])
    assert _finite_positive([tmpl.predict(cfg(64, 64, 32, 2, 128)).latency_ms])


@pytest.mark.parametrize("M", [65535 * 256 + 1, 2**30, BIG])
def test_m_past_the_grid_limit_has_no_legal_config_and_says_how_to_fix_it(M):
    """C's rows of tiles run along gridDim.y, which CUDA caps at 65535."""
    tmpl = MatmulTemplate(M, 1, 1).with_arch("H100")
    with pytest.raises(ValueError) as e:
        tmpl.recommend_hints()
    msg = str(e.value)
    assert "65535" in msg and str(M) in msg and "swap M and N" in msg, msg
    (why,) = tmpl.validate(cfg(256, 16, 64, 3, 256))
    assert "grid limit" in why and "block_M >=" in why
    assert MatmulTemplate(1, M, 1).with_arch("H100").recommend_hints(2)  # the swapped problem ranks


def test_split_k_workspace_counts_against_device_memory():
    p = MatmulProblem(32768, 32768, 65536)  # 10 GiB of operands; the fp32 workspace is 4 GiB per split
    assert check_matmul_config(p, cfg(128, 128, 64, 3, 256, split_k=16), CUDA("H100")) == []
    (why,) = check_matmul_config(p, cfg(128, 128, 64, 3, 256, split_k=32), CUDA("H100"))
    assert "split_k=32" in why and "H100" in why and "device memory" in why
    assert check_matmul_config(p, cfg(128, 128, 64, 3, 256, split_k=32), CUDA("H200")) == []


@pytest.mark.parametrize("build,name", [
    (lambda v: ElementwiseTemplate(v), "numel"), (lambda v: GEMVTemplate(v, 64), "N"),
    (lambda v: GEMVTemplate(64, v), "K"), (lambda v: GeneralReductionTemplate(v, 64), "M"),
    (lambda v: GeneralReductionTemplate(64, v), "N"),
])
def test_memory_bound_templates_refuse_the_same_shapes(build, name):
    for bad in (2**31, 2**70, np.int64(2**40)):
        with pytest.raises(ValueError, match=f"{name} must be at most 2147483647"):
            build(bad)
    for bad in (0, -3, 2.0, True, "8"):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            build(bad)
    assert build(np.int32(4096)).with_arch("H100").recommend_hints(1)


def test_memory_bound_templates_check_bytes():
    with pytest.raises(ValueError, match="more than any GPU holds"):
        ElementwiseTemplate(2**30, num_inputs=2**20)
    with pytest.raises(ValueError, match="more than any GPU holds"):
        GeneralReductionTemplate(2**20, 2**30)
    with pytest.raises(ValueError, match="device memory of RTX4090"):
        ElementwiseTemplate(2**31 - 1, num_inputs=8, dtype="float32").with_arch("RTX4090")
    with pytest.raises(ValueError, match="num_inputs must be a positive int"):
        ElementwiseTemplate(64, num_inputs=0)


@pytest.mark.parametrize("tmpl", [
    ElementwiseTemplate(BIG), ElementwiseTemplate(1), GEMVTemplate(1, BIG), GEMVTemplate(BIG, 1), GEMVTemplate(1, 1),
    GeneralReductionTemplate(BIG, 1), GeneralReductionTemplate(1, BIG), ElementwiseTemplate(BIG, num_inputs=4),
])
@pytest.mark.parametrize("arch_name", sorted(ARCHS))
def test_memory_bound_extremes_rank_with_finite_positive_latencies(tmpl, arch_name):
    try:
        t = tmpl.with_arch(arch_name)
    except ValueError as e:
        assert "device memory" in str(e)
        return
    hints = t.recommend_hints(8)
    assert hints and _finite_positive([h.prediction.latency_ms for h in hints])
    assert _finite_positive([r.prediction.latency_ms for r in t.rank([h.to_config() for h in hints]).ranked])


def test_memory_bound_config_values_are_checked():
    t = GEMVTemplate(4096, 4096).with_arch("H100")
    for bad in (0, -1, 2.5, True, 2**40):
        errs = t.validate({"block_N": 4, "block_K": bad, "thread_num": 128})
        assert any("block_K" in e and repr(bad) in e for e in errs), (bad, errs)
    assert t.validate({"block_N": np.int64(4), "block_K": np.int64(512), "thread_num": np.int32(128)}) == []
    errs = t.validate({"block_N": 4, "block_K": 512, "thread_num": 4096})
    assert any("thread_num" in e and "4096" in e for e in errs)
    with pytest.raises(ValueError, match="topk"):
        t.recommend_hints(0)


# -------------------------------------------------------------------------------- class 12: config values
INT_KEYS = ["block_M", "block_N", "block_K", "num_stages", "thread_num", "panel_size", "split_k"]


@pytest.mark.parametrize("key", INT_KEYS)
@pytest.mark.parametrize("value", [1.5, 64.0, "64", None, True, False, np.bool_(True), [64], -1, -(2**70), 2**70])
def test_every_int_key_refuses_every_bad_value_naming_key_and_value(key, value):
    config = {**cfg(), key: value}
    got, problems = normalize_config(config)
    assert got is None and problems, (key, value)
    assert any(key in p and repr(value) in p for p in problems), problems
    # ... and so does every entry point that takes a config
    t = MatmulTemplate(4096, 4096, 4096).with_arch("H100")
    assert any(key in p for p in t.validate(config))
    with pytest.raises(ValueError, match=key):
        t.predict(config)
    assert not t.rank([config]).ranked and t.rank([config]).dropped
    with pytest.raises(ValueError, match=key):
        require_matmul_config(t.problem, config)


@pytest.mark.parametrize("key", ["block_M", "block_N", "block_K", "thread_num", "panel_size", "split_k"])
def test_zero_is_not_a_size(key):
    (why,) = normalize_config({**cfg(), key: 0})[1]
    assert why.startswith(f"{key} must be a positive int, got 0") and "use" in why


@pytest.mark.parametrize("config,fragment", [
    (cfg(bm=7), "block_M must be a positive multiple of 16"),
    (cfg(bm=72), "block_M must be a positive multiple of 16"),
    (cfg(bn=12), "block_N must be a positive multiple of 8"),
    (cfg(bk=24), "block_K must be a positive multiple of 16"),
    (cfg(t=100), "thread_num must be a positive multiple of 32"),
    (cfg(t=4096), "thread_num must be at most 1024, got 4096"),
    (cfg(t=1056), "thread_num must be at most 1024"),
    (cfg(s=MAX_NUM_STAGES + 1), f"num_stages must be at most {MAX_NUM_STAGES}"),
    (cfg(s=10**9), "num_stages must be at most"),
    (cfg(s=-1), "num_stages must be >= 0"),
    (cfg(bm=2**16 + 16), "block_M must be at most"),
    (cfg(bm=4096, bn=4096, bk=16), "shared memory"),
    (cfg(split_k=100), "split_k=100 leaves a split with no work"),
    (cfg(split_k=70000), "split_k must be at most 65535"),
    (cfg(panel_size=0), "panel_size must be a positive int"),
    (cfg(panel_size=10**6), "panel_size must be at most 65535"),
    (cfg(r="True"), "enable_rasterization must be a bool"),
    (cfg(r=1), "enable_rasterization must be a bool"),
    (dict(cfg(), blockM=64), "unknown config key(s) ['blockM']"),
    (dict(cfg(), warp_policy="square"), "unknown config key(s) ['warp_policy']"),  # the carver ranks without it
])
def test_the_rule_table_refuses_what_no_gpu_accepts(config, fragment):
    p = MatmulProblem(4096, 4096, 4096)
    without_arch = check_matmul_config(p, config)
    assert any(fragment in e for e in without_arch), without_arch
    with_arch = check_matmul_config(p, config, CUDA("H100"))
    assert with_arch, config  # what no GPU accepts, this one refuses too


def test_fp8_needs_the_wgmma_path_on_every_gpu():
    p = MatmulProblem(4096, 4096, 4096, in_dtype="float8_e4m3")
    assert any("block_K must be a multiple of 32 for float8_e4m3" in e for e in check_matmul_config(p, cfg(bk=16)))
    assert any("thread_num a multiple of 128" in e for e in check_matmul_config(p, cfg(t=192)))
    assert any("block_M >= 64" in e for e in check_matmul_config(p, cfg(bm=32, t=128)))
    nn = MatmulProblem(4096, 4096, 4096, in_dtype="float8_e4m3", trans_B=False)
    assert any("trans_B=True" in e for e in check_matmul_config(nn, cfg()))
    assert check_matmul_config(p, cfg(bk=128)) == []


@pytest.mark.parametrize("config,exc,fragment", [
    (cfg(warp_policy="rows"), ValueError, "warp_policy must be one of ['square', 'full_row', 'full_col']"),
    (cfg(warp_policy=None), ValueError, "warp_policy must be one of"),
    (cfg(warp_policy=1), ValueError, "warp_policy must be one of"),
    (cfg(persistent=-1), ValueError, "persistent must be an int >= 0, got -1"),
    (cfg(persistent=True), ValueError, "persistent must be an int >= 0, got True"),
    (cfg(persistent=1.0), ValueError, "persistent must be an int >= 0, got 1.0"),
    (cfg(persistent=2**31), ValueError, "persistent must be at most 2147483647"),
    (cfg(persistent=132, split_k=2), ValueError, "persistent=132 and split_k=2 do not combine"),
    (cfg(bm=64, warp_policy="full_row"), ValueError, "block_M must be a multiple of 128, got 64"),
    (cfg(r="yes"), TypeError, "enable_rasterization must be a bool"),
    ([("block_M", 64)], TypeError, "must be a dict"),
])
def test_kernel_keys_are_checked_by_the_same_table(config, exc, fragment):
    p = MatmulProblem(4096, 4096, 4096)
    with pytest.raises(exc) as e:
        require_matmul_config(p, config, kernel_keys=True)
    assert fragment in str(e.value)
    assert any(fragment in m for m in check_matmul_config(p, config, kernel_keys=True))


def test_require_returns_plain_ints_and_defaults():
    got = require_matmul_config(MatmulProblem(4096, 4096, 4096),
                                {**cfg(bm=np.int64(128), t=np.int32(256), r=np.bool_(True))}, kernel_keys=True)
    assert got == {**cfg(), "panel_size": 10, "split_k": 1, "warp_policy": "square", "persistent": 0,
                   "variant": "pipelined", "cluster": "1x1", "split_reduce": "workspace"}
    assert all(type(v) in (int, bool, str) for v in got.values())


def test_split_k_limit_is_exact():
    for K in (1, 63, 64, 65, 100, 130, 1000, 4000, 4096, 4097, 65536):
        for bk in (16, 32, 64, 128):
            s = split_k_limit(K, bk)
            p = MatmulProblem(64, 64, K)
            assert check_matmul_config(p, cfg(64, 64, bk, 2, 128, split_k=s)) == [], (K, bk, s)
            if s + 1 <= 65535:
                bad = check_matmul_config(p, cfg(64, 64, bk, 2, 128, split_k=s + 1))
                assert any(f"use split_k <= {s}" in e for e in bad), (K, bk, bad)


@pytest.mark.parametrize("arch_name", ["H100", "A100-80GB", "L40S"])
def test_the_search_space_passes_every_rule_no_gpu_escapes(arch_name):
    """The carver never recommends what the arch-less check (templates.matmul.kernel's) would refuse."""
    arch = CUDA(arch_name)
    for shape in [(4096, 4096, 4096), (17, 33, 4097), (1, BIG, 1)]:
        tmpl = MatmulTemplate(*shape).with_arch(arch)
        space = tmpl.search_space()
        from carver.lowering import lower

        mask = legal_mask(tmpl.problem, arch, lower(tmpl.problem, arch, space))
        for i in np.flatnonzero(mask)[::97]:
            assert check_matmul_config(tmpl.problem, space.config(int(i))) == []


def test_user_gpu_arch_without_memory_uses_the_documented_bound():
    arch = GPUArch("mine", compute_capability=(9, 0), sm_count=10, smem_per_block=227 * 1024,
                   smem_per_sm=228 * 1024, l2_bytes=2**20, dram_bandwidth=1e12,
                   tensor_peak=(("float16", 1e14),), clock_mhz=1000)
    assert arch.memory_bytes is None
    assert MatmulTemplate(2**17, 2**17, 2**17).with_arch(arch).recommend_hints(1)  # 96 GiB: under 1 TiB
