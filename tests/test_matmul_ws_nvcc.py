"""The hand-scheduled Hopper loop (``variant="ws"``) compiled for sm_90a with nvcc, without a GPU: every
layout, both dtypes, odd shapes, one and two consumer warpgroups, clusters, the persistent form, fp8 and
a symbolic M. The generated CUDA must have the intended structure (a silent fallback would compile and
run, only slower) and ptxas must neither spill nor serialise the wgmma (it does both when the consumers'
setmaxnreg budget does not cover the accumulator). Ten compiles of 6-20 s on one core.
"""

from __future__ import annotations

import logging
import re

import pytest

from carver.validity import C_ON_RING, ws_smem_bytes
from templates import matmul as mm

pytestmark = pytest.mark.nvcc

WIDE = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True,
            variant="ws")
ONE_WG = dict(block_M=128, block_N=128, block_K=64, num_stages=4, thread_num=128, enable_rasterization=False,
              variant="ws")
BF16 = dict(in_dtype="bfloat16", out_dtype="bfloat16")

CASES = {
    # name: (M, N, K, config, kernel keyword arguments). Odd shapes: tiles cut at M, N and K.
    "NT-fp16-4096-full_row": (4096, 4096, 4096, dict(WIDE, warp_policy="full_row"), {}),
    "NN-fp16-odd": (4001, 4000, 1000, WIDE, dict(trans_B=False)),
    "TN-bf16-odd": (1000, 1000, 4001, WIDE, dict(trans_A=True, trans_B=False, **BF16)),
    "TT-bf16-odd-C-unaligned": (1000, 4001, 1000, WIDE, dict(trans_A=True, **BF16)),  # C rows: no TMA store
    "NT-fp16-one-warpgroup-out-fp32": (1000, 1000, 1000, ONE_WG, dict(out_dtype="float32")),
    "NT-fp16-cluster1x2-odd": (1000, 2800, 1000, dict(WIDE, cluster="1x2"), {}),  # 11 N tiles: padded to 12
    "TN-bf16-cluster2x1-odd": (600, 2800, 1000, dict(WIDE, cluster="2x1"), dict(trans_A=True, trans_B=False,
                                                                                 **BF16)),  # 5 M tiles
    "NT-fp16-persistent": (8192, 8192, 512, dict(WIDE, warp_policy="full_row", persistent=132), {}),
    # 256 tiles on 132 CTAs, rasterized in panels of 10: TileLang's ThreadSync failed on this one grid while the
    # loop tested a tile's decoded coordinates (2026-12-07); the loop now tests its index
    "NT-fp16-persistent-256-tiles": (2048, 4096, 4096, dict(WIDE, warp_policy="full_row", persistent=132), {}),
    "NT-fp8": (2048, 2048, 1024, dict(WIDE, block_K=128), dict(in_dtype="float8_e4m3", out_dtype="float16")),
}


@pytest.fixture(scope="module")
def sm90a():
    import tilelang  # noqa: F401 - puts its bundled tvm on the path
    from tvm.target import Target

    return Target({"kind": "cuda", "arch": "sm_90a"})


def compile_with_ptxas_log(func, target, monkeypatch):
    """Compile with TileLang's verbose nvcc (``--ptxas-options=--verbose``) and no kernel cache, so ptxas
    runs and its report reaches TileLang's logger; returns the kernel and the report."""
    import tilelang

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    monkeypatch.setenv("TILELANG_VERBOSE", "1")
    handler, logger = Keep(), tilelang.logger
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    was_enabled = tilelang.is_cache_enabled()
    tilelang.disable_cache()
    try:
        jit = tilelang.compile(func, out_idx=[-1], target=target)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        if was_enabled:
            tilelang.enable_cache()
    return jit, "\n".join(records)


@pytest.mark.parametrize("name", list(CASES))
def test_ws_compiles_for_sm90a_with_the_intended_structure(name, sm90a, monkeypatch):
    M, N, K, cfg, kw = CASES[name]
    problem = mm.make_problem(M, N, K, **kw)
    jit, ptxas = compile_with_ptxas_log(mm.kernel(M, N, K, **cfg, **kw), sm90a, monkeypatch)
    src = jit.get_kernel_source()
    consumers = cfg["thread_num"] // 128
    cm, cn = (int(x) for x in cfg.get("cluster", "1x1").split("x"))
    # launch: the consumers plus the 128-thread producer, one CTA per SM; registers re-split
    assert f"__launch_bounds__({cfg['thread_num'] + 128}, 1)" in src
    assert "warpgroup_reg_dealloc<40>()" in src and f"warpgroup_reg_alloc<{232 if consumers == 2 else 240}>()" in src
    producer, consumer = src.split("warpgroup_reg_dealloc<40>()")[1].split("warpgroup_reg_alloc<")
    # the producer: wait for an empty stage, expect-tx + TMA for A and B, arrive on full; no wgmma
    assert "empty[" in producer and ".wait(" in producer and "expect_transaction(" in producer
    for op in "AB":
        shared = (op == "A" and cn > 1) or (op == "B" and cm > 1)
        assert (f"tma_load_multicast({op}_desc" in producer) == shared, f"{name}: {op} multicast {shared}"
        assert f"tma_load({op}_desc" in producer  # unicast: always, or outside the cluster mask
    assert "wgmma" not in producer
    # the consumers: one batch in flight inside the K loop, the full drain only after it
    assert src.count("wait_wgmma<1>") == 1 and consumer.index("wait_wgmma<1>") < consumer.index("wait_wgmma<0>")
    loop = consumer[:consumer.index("wait_wgmma<0>")]
    assert "wgmma_ss<" in loop and "full[" in loop and ".arrive(" in loop and "tma_load" not in loop
    warps = consumers * 4 * cm * cn
    assert f"empty[0].init({warps});" in src  # one arrival per consumer warp (of every CTA in the cluster)
    if cm * cn > 1:
        assert src.count("tl::cluster_sync()") == 2  # after the barriers' init and before exit
        # launched with programmatic stream serialization (TileLang does so for every cluster kernel): it
        # waits for the kernel before it on the stream before its first load
        assert src.count("cudaGridDependencySynchronize()") == 1
        assert src.index("cudaGridDependencySynchronize()") < src.index("tma_load")
        assert re.search(r"empty\[[^]]+\]\.arrive\(r\)", loop)  # remote arrivals on both CTAs' barriers
    else:
        assert "cluster" not in src and "cudaGridDependencySynchronize" not in src
    c_aligned = N * problem.out_bytes % 16 == 0
    assert ("tma_store(C_desc" in src) == c_aligned, f"{name}: C rows aligned {c_aligned}"
    if cfg.get("persistent"):  # the store is waited for before the next tile's C (and once before exit)
        epilogue = consumer[consumer.index("wait_wgmma<0>"):]
        assert epilogue.index("tma_store_wait<0, true>") < epilogue.index("tma_store(C_desc")
        assert "tma_store_wait<0, true>" in epilogue[epilogue.rindex("tma_store_arrive()"):]
    if kw.get("in_dtype") == "float8_e4m3":
        assert "kFloat8_e4m3" in src
    # ptxas: the accumulator stays in registers and the wgmma are not serialised
    assert "ptxas info" in ptxas, "no ptxas report: TileLang's verbose compile did not log it"
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas and "serialized" not in ptxas, ptxas[-600:]
    # the shared memory the rule counts is what the kernel asks for (the rule adds 1 KB for barriers)
    need = ws_smem_bytes(problem, mm.MatmulConfig(**cfg).kernel_kwargs())
    assert f"(int64_t){need - 1024})" in jit.get_host_source(), f"{name}: dynamic smem is not {need - 1024}"


@pytest.mark.parametrize("extra", [{}, {"cluster": "2x1"}, {"persistent": 132}])
def test_ws_compiles_with_a_symbolic_m(extra, sm90a):
    """The drop-in op compiles one kernel per bucket of M with M symbolic (templates/matmul/op.py)."""
    import tilelang
    import tilelang.language as T

    from templates.matmul import op as mop

    cfg = dict(ONE_WG, thread_num=256, enable_rasterization=True, **extra)
    k = tilelang.compile(mop.gemm(T.dynamic("M"), 4096, 4096, "float16", **cfg), out_idx=[-1], target=sm90a)
    src = k.get_kernel_source()
    assert "int M" in src and src.count("wait_wgmma<1>") == 1


@pytest.mark.parametrize("extra", [{}, {"cluster": "2x1"}])
def test_c_on_the_ring_reaches_the_compiler_and_frees_a_stage(extra, sm90a):
    """A config's C_ON_RING pass config goes through the family's compile (as the autotuner's and the op's
    do): the C staging tile starts where the ring does, and the kernel asks for the ring alone (4 stages of
    128x256x64, which beside C would need 263168 bytes)."""
    import re

    cfg = dict(WIDE, warp_policy="full_row", num_stages=4, pass_configs={C_ON_RING: True}, **extra)
    problem = mm.make_problem(4096, 4096, 4096)
    assert ws_smem_bytes(problem, mm.MatmulConfig(**cfg).kernel_kwargs()) == 263168
    jit = mm.compile(4096, 4096, 4096, cfg, target="sm_90a")
    src = jit.get_kernel_source()
    offsets = dict(re.findall(r"void\* (\w+)_s = \(\(void\*\)\(\(char\*\)buf_dyn_shmem \+ (\d+)\)\)", src))
    ring_start = min(int(offsets["A"]), int(offsets["B"]))
    assert int(offsets["C"]) == ring_start, offsets
    need = ws_smem_bytes(problem, mm.MatmulConfig(**cfg).kernel_kwargs(), c_on_ring=True)
    assert f"(int64_t){need - 1024})" in jit.get_host_source()
    assert src.count("wait_wgmma<1>") == 1


PINGPONG = dict(ONE_WG, thread_num=256, enable_rasterization=True, variant="pingpong", persistent=132)
PINGPONG_CASES = {
    # name: (M, N, K, config, kernel keyword arguments)
    "NT-fp16-4096-128x128-s4": (4096, 4096, 4096, PINGPONG, {}),
    "TN-bf16-odd-128x192-s3": (1000, 4000, 1000, dict(PINGPONG, block_N=192, num_stages=3, persistent=13),
                               dict(trans_A=True, trans_B=False, **BF16)),
    "NT-fp16-odd-64x256-C-unaligned": (1000, 4001, 2000, dict(PINGPONG, block_M=64, block_N=256, persistent=13),
                                       {}),
}


@pytest.mark.parametrize("name", list(PINGPONG_CASES))
def test_pingpong_compiles_for_sm90a_with_two_warpgroups_taking_turns(name, sm90a, monkeypatch):
    """``variant="pingpong"``: each consumer warpgroup runs a whole tile's main loop on its own (one wgmma of
    the tile's width per 64 rows, over its 128 threads), in turns handed over by two named barriers, and
    stores through its own staging tile; ptxas neither spills nor serialises."""
    M, N, K, cfg, kw = PINGPONG_CASES[name]
    problem = mm.make_problem(M, N, K, **kw)
    jit, ptxas = compile_with_ptxas_log(mm.kernel(M, N, K, **cfg, **kw), sm90a, monkeypatch)
    src = jit.get_kernel_source()
    assert "__launch_bounds__(384, 1)" in src
    assert src.count("warpgroup_reg_dealloc<40>()") == 1 and src.count("warpgroup_reg_alloc<232>()") == 2
    producer, wg0, wg1 = src.split("warpgroup_reg_dealloc<40>()")[1].split("warpgroup_reg_alloc<232>()")
    assert "wgmma" not in producer and "tma_load(A_desc" in producer and "tma_load(B_desc" in producer
    assert "empty[0].init(4);" in src  # a stage is released by the 4 warps of the warpgroup that read it
    bm, bn = cfg["block_M"], cfg["block_N"]
    for wg, (wait, give) in ((wg0, (8, 9)), (wg1, (9, 8))):
        # its turn: wait for the other warpgroup's hand-over, run the main loop, hand over, then store
        loop = wg[:wg.index("wait_wgmma<0>")]
        assert f"__sync_thread_partial({wait}, 256)" in loop and f"__named_barrier_arrive({give}, 256)" in loop
        assert loop.index(f"__sync_thread_partial({wait}, 256)") < loop.index("wgmma_ss<")
        assert loop.index("wait_wgmma<1>") < loop.index(f"__named_barrier_arrive({give}, 256)")
        # one warpgroup's wgmma spans the tile's width: m64nN with N = block_N, block_M / 64 of them a k16 step
        assert re.search(rf"wgmma_ss<[^>]*, 64, {bn}, (16|8), ", loop), f"{name}: not m64n{bn}"
        assert "tma_load" not in wg
    assert src.count("wait_wgmma<1>") == 2
    c_aligned = N * problem.out_bytes % 16 == 0
    assert src.count("tma_store(C_desc") == (2 if c_aligned else 0)
    assert "0 bytes spill stores, 0 bytes spill loads" in ptxas and "serialized" not in ptxas, ptxas[-600:]
    need = ws_smem_bytes(problem, mm.MatmulConfig(**cfg).kernel_kwargs())  # the ring and two C tiles
    assert need == ((cfg["num_stages"] * (bm + bn) * 64 * 2 + 1023) // 1024 + 2 * (bm * bn * 2 // 1024)) * 1024 + 1024
    assert f"(int64_t){need - 1024})" in jit.get_host_source(), f"{name}: dynamic smem is not {need - 1024}"


def test_pingpong_compiles_with_a_symbolic_m(sm90a):
    """The op's one kernel per bucket of M: the ping-pong loop with M symbolic."""
    import tilelang
    import tilelang.language as T

    from templates.matmul import op as mop

    k = tilelang.compile(mop.gemm(T.dynamic("M"), 4096, 4096, "float16", **PINGPONG), out_idx=[-1], target=sm90a)
    src = k.get_kernel_source()
    assert "int M" in src and src.count("wait_wgmma<1>") == 2 and src.count("__named_barrier_arrive(") == 2
