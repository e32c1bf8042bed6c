"""Split-K summed in the cluster's shared memory (``split_reduce="cluster"``): its rules, where the space proposes
it, its program, and (marker ``nvcc``) its build for sm_90a. On a GPU: the ``clustersplit-*`` cases of
tests/test_matmul_gpu.py and its symbolic-M test."""

from __future__ import annotations

import math
import re

import pytest

from carver.arch import CUDA
from carver.validity import MAX_CLUSTER_SIZE, check_matmul_config, cluster_split_smem_bytes, cluster_splits
from templates import matmul as mm
from templates.matmul import space
from templates.matmul.config import MatmulConfig
from templates.matmul.program import program

H200, A100 = CUDA("H200"), CUDA("A100")
CS = dict(block_M=64, block_N=64, block_K=128, num_stages=7, thread_num=256, enable_rasterization=False, split_k=2,
          split_reduce="cluster")


def problems_of(cfg, M=64, N=4096, K=14336, arch=H200):
    """The rules' messages for ``cfg`` (a value no key takes is refused when the config is made: its message)."""
    try:
        config = MatmulConfig(**cfg)
    except ValueError as e:
        return [str(e)]
    return mm.check(mm.make_problem(M, N, K), config, arch)


def test_a_legal_form_passes_and_defaults_to_the_workspace():
    assert problems_of(CS) == []
    assert MatmulConfig(**{**CS, "split_reduce": "workspace", "enable_rasterization": True}).split_reduce == "workspace"
    assert MatmulConfig(**{k: v for k, v in CS.items() if k != "split_reduce"}).split_reduce == "workspace"
    assert "split_reduce" not in MatmulConfig(**{k: v for k, v in CS.items() if k != "split_reduce"}).to_dict()
    assert MatmulConfig.from_dict(MatmulConfig(**CS).to_dict()) == MatmulConfig(**CS)


@pytest.mark.parametrize("change,words", [
    ({"split_k": 1}, ["split_k=1", "split_k in [2, 4, 8]", "split_reduce='workspace'"]),
    ({"split_k": MAX_CLUSTER_SIZE + 1}, [f"split_k={MAX_CLUSTER_SIZE + 1}", "2 to 8"]),
    # the fix lists the splits that divide the tile, not a fixed 2, 4 or 8
    ({"block_M": 48, "thread_num": 128, "split_k": 1}, ["split_k in [2, 3, 4, 6, 8]"]),
    ({"split_k": 3}, ["block_M=64", "split_k=3", "split_k in [2, 4, 8]"]),
    ({"enable_rasterization": True}, ["enable_rasterization=False"]),
    ({"variant": "ws", "thread_num": 128}, ["variant='ws'", "split_reduce='workspace'"]),
    ({"split_reduce": "atomic"}, ["split_reduce must be one of", "'atomic'", "'workspace'", "'cluster'"]),
])
def test_each_rule_names_the_value_and_the_fix(change, words):
    msg = " ".join(problems_of({**CS, **change}))
    assert msg, change
    for w in words:
        assert w in msg, (w, msg)


#: (block_M, block_N, thread_num, split_k): tiles whose band of block_M / split_k rows TileLang cannot lay over the
#: threads ("no available layout found", tilelang 0.1.15), and their neighbours, which it can
BANDS_REFUSED = [(192, 128, 384, 3), (128, 24, 256, 8), (64, 24, 128, 8)]
BANDS_TAKEN = [(192, 128, 256, 3), (192, 128, 384, 2), (128, 24, 256, 4), (64, 24, 128, 4), (64, 24, 128, 2),
               (64, 8, 128, 8), (128, 8, 128, 8), (64, 40, 128, 2)]


def _band_cfg(bm, bn, t, s):
    return {**CS, "block_M": bm, "block_N": bn, "thread_num": t, "split_k": s, "block_K": 64, "num_stages": 2}


@pytest.mark.parametrize("bm,bn,t,s", BANDS_REFUSED)
def test_a_band_the_threads_cannot_share_out_is_refused_with_splits_that_can(bm, bn, t, s):
    (msg,) = problems_of(_band_cfg(bm, bn, t, s))
    band = bm // s * bn
    assert f"{band} elements" in msg and f"block_N={bn}" in msg and f"thread_num={t}" in msg, msg
    fits = cluster_splits(bm, bn, t)
    assert fits and s not in fits and f"split_k in {fits}" in msg
    for ok in fits:  # every split the fix names passes the rule
        assert not any("band" in m for m in problems_of(_band_cfg(bm, bn, t, ok))), ok


@pytest.mark.parametrize("bm,bn,t,s", BANDS_TAKEN)
def test_bands_that_divide_or_are_divided_by_the_threads_pass(bm, bn, t, s):
    assert problems_of(_band_cfg(bm, bn, t, s)) == []


@pytest.mark.nvcc
@pytest.mark.parametrize("bm,bn,t,s", BANDS_REFUSED + BANDS_TAKEN)
def test_the_band_rule_is_tilelangs(bm, bn, t, s, monkeypatch):
    """The rule refuses what TileLang's layout inference refuses, and no more (lowered for sm_90a; the program
    is built past the rules for the refused ones)."""
    import tilelang
    from tvm.target import Target

    from templates.matmul import program as program_module

    monkeypatch.setattr(program_module, "require_matmul_config", lambda *args, **kwargs: None)
    problem = mm.make_problem(2 * bm, 4 * bn, 64 * s * 2)
    func = program(problem, MatmulConfig(**_band_cfg(bm, bn, t, s)))
    with Target({"kind": "cuda", "arch": "sm_90a"}):
        if (bm, bn, t, s) in BANDS_TAKEN:
            tilelang.lower(func)
        else:
            with pytest.raises(Exception, match="no available layout found"):
                tilelang.lower(func)


def test_the_workspace_rules_do_not_bind_the_cluster_sum():
    """The cluster form writes no workspace and launches no reduction grid: the rules on those pass it, and their
    fixes name it."""
    cfg = {**CS, "block_K": 64, "num_stages": 3}
    for M, N, K, words in [(2_000_000, 4096, 14336, "125000 rows of CTAs"),  # the reduction grid's rows
                           (131072, 131072, 1024, "fp32 workspace of 2 partial C's")]:  # 64 GiB a split
        assert problems_of(cfg, M, N, K) == [], (M, N, K)
        (msg,) = problems_of({**cfg, "split_reduce": "workspace"}, M, N, K)
        assert words in msg and "split_reduce='cluster'" in msg, msg
    (msg,) = problems_of({**cfg, "split_reduce": "workspace", "split_k": 3}, 131072, 131072, 1024)
    assert "use split_k=1" in msg  # the largest split whose workspace fits the H200 is 1


def test_the_gpu_rules_clusters_and_shared_memory():
    msg = " ".join(problems_of(CS, arch=A100))
    assert "sm_80" in msg and "split_reduce='workspace'" in msg
    # two fp32 128x256 tiles: 256 KB, over Hopper's 227 KB whatever the stages
    big = {**CS, "block_M": 128, "block_N": 256, "block_K": 64, "num_stages": 2}
    msg = " ".join(problems_of(big))
    assert "263168" in msg and str(H200.smem_per_block) in msg and "smaller tile" in msg and "num_stages <=" not in msg
    # the stages too many: the fix names the most that fit, and the message is the cluster rule's alone
    (msg,) = problems_of({**CS, "num_stages": 14})
    assert "num_stages=14" in msg and "num_stages <= 7" in msg and "two fp32 64x64 tiles" in msg
    assert problems_of({**CS, "num_stages": 7}) == []
    assert cluster_split_smem_bytes(mm.make_problem(64, 4096, 14336), big) == 2 * 128 * 256 * 4 + 1024
    # the stages when they are the larger
    assert cluster_split_smem_bytes(mm.make_problem(64, 4096, 14336), CS) == 7 * 128 * 128 * 2 + 1024
    # the N tiles go on the grid's y axis
    msg = " ".join(check_matmul_config(mm.make_problem(64, 65536 * 64 + 64, 256), {**CS, "block_K": 64},
                                       kernel_keys=True))
    assert "y axis" in msg and "65535" in msg


@pytest.mark.parametrize("M,N,K", [(64, 4096, 14336), (32, 4096, 14336), (128, 4096, 14336), (64, 4096, 4096)])
def test_the_space_proposes_the_best_ranked_two_way_splits_under_a_wave(M, N, K):
    problem = mm.make_problem(M, N, K)
    got = space.candidates(problem, H200, 4)
    forms = [c for c in got if c.split_reduce == "cluster"]
    assert 1 <= len(forms) <= space.CLUSTER_SPLIT_MAX_FORMS
    assert got[0].split_reduce == "workspace"  # the carver's top-1 stays first
    for c in forms:
        assert c.split_k == space.CLUSTER_SPLIT and not c.enable_rasterization
        assert space.CLUSTER_SPLIT * math.ceil(M / c.block_M) * math.ceil(N / c.block_N) <= H200.sm_count
        assert space.check(problem, c, H200) == []
    # the forms of the carver's best-ranked such configs, in its order
    ranked = [MatmulConfig.from_dict(c) for c in space.hint_configs(space._carver_for(problem, H200), 32)]
    twins = [MatmulConfig(**{**c.to_dict(), "split_reduce": "workspace", "enable_rasterization": True}) for c in forms]
    positions = [next(i for i, r in enumerate(ranked) if r.carver_dict() | {"enable_rasterization": True}
                      == t.carver_dict()) for t in twins]
    assert positions == sorted(positions)


@pytest.mark.parametrize("M,N,K,arch", [
    (512, 4096, 14336, H200),   # no split-2 config of the ranking fits under a wave with its two fp32 tiles
    (64, 4096, 14336, A100),    # no clusters
    (4096, 4096, 4096, H200),   # many waves: no split at all
])
def test_the_space_proposes_none_where_it_cannot_pay_or_run(M, N, K, arch):
    assert not [c for c in space.candidates(mm.make_problem(M, N, K), arch, 4) if c.split_reduce == "cluster"]


def test_the_program_takes_no_workspace():
    from autotuner import scratch

    func = program(mm.make_problem(100, 4097, 4000, trans_B=False), MatmulConfig(**CS))
    assert len(func.params) == 3 and scratch.positions(func) == []  # A, B, C
    workspace = program(mm.make_problem(100, 4097, 4000, trans_B=False),
                        MatmulConfig(**{**CS, "split_reduce": "workspace"}))
    assert len(workspace.params) == 4 and scratch.positions(workspace) == [2]


@pytest.mark.nvcc
@pytest.mark.parametrize("M,N,K,cfg,kw", [
    (64, 4096, 14336, CS, {}),
    (100, 4097, 4000, {**CS, "block_M": 128, "block_N": 128, "block_K": 64, "num_stages": 3, "split_k": 4},
     dict(trans_A=True, trans_B=False, in_dtype="bfloat16")),
])
def test_it_compiles_for_sm90a_as_one_cluster_kernel(M, N, K, cfg, kw):
    import tilelang
    from tvm.target import Target

    problem = mm.make_problem(M, N, K, **kw)
    jit = tilelang.compile(program(problem, MatmulConfig(**cfg)), out_idx=[-1],
                           target=Target({"kind": "cuda", "arch": "sm_90a"}))
    src, host = jit.get_kernel_source(), jit.get_host_source()
    assert len(re.findall(r"__global__ void __launch_bounds__", src)) == 1  # one kernel: the sum is in it
    assert src.count("tl::tma_store_cluster(") == 1 and src.count("tl::cluster_sync()") == 3
    assert f"landed[0].init({cfg['split_k']});" in src  # one arrival per split on each CTA
    # waits for the kernel before it on the stream (programmatic serialization) before its first load
    load = "tma_load" if "tma_load" in src else "cp_async_gs"  # A's rows of 200 bytes: no TMA
    assert src.index("cudaGridDependencySynchronize()") < src.index(load)
    # its shared memory is what the rule counts: the reduction's two tiles sit on the pipeline's stages
    smem = [int(x) for x in re.findall(r"\(int64_t\)(\d+)\)", host)]
    assert cluster_split_smem_bytes(problem, {**cfg}) - 1024 in smem, smem


@pytest.mark.nvcc
def test_it_compiles_for_sm90a_with_a_symbolic_m():
    """The drop-in op compiles one kernel per bucket of M with M symbolic (templates/matmul/op.py): the last row
    band is cut at M by the store's predication."""
    import tilelang
    import tilelang.language as T
    from tvm.target import Target

    from templates.matmul import op as mop

    jit = tilelang.compile(mop.gemm(T.dynamic("M"), 4096, 4096, "float16", **CS), out_idx=[-1],
                           target=Target({"kind": "cuda", "arch": "sm_90a"}))
    src = jit.get_kernel_source()
    assert "int M" in src and src.count("tl::tma_store_cluster(") == 1
