"""templates.matmul on a real GPU: every layout and dtype, odd shapes, split-K, fp8 and the hand-scheduled
Hopper loop (``variant="ws"``: clusters, persistent; ``"pingpong"``) against torch;
the carver's top-1 without tuning; ``tune`` end to end, and its warm call from a new process.

Run on the GPU machine: ``python3 -m pytest -m gpu tests/test_matmul_gpu.py``. The kernels of the
correctness matrix are compiled once, in parallel threads, by a module fixture (about 40 compiles).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from autotuner import scratch
from carver.validity import C_ON_RING
from templates import matmul as mm

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
MID = dict(block_M=128, block_N=128, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
SMALL_M = dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128, enable_rasterization=True)
LAYOUTS = {"NT": (False, True), "NN": (False, False), "TN": (True, False), "TT": (True, True)}
SHAPES = {"even": (1024, 2048, 512), "odd": (4000, 4097, 1000)}
DTYPES = ("float16", "bfloat16")

CASES: dict[str, tuple] = {}
for _layout in LAYOUTS:
    for _dtype in DTYPES:
        for _shape in SHAPES:
            CASES[f"{_layout}-{_dtype}-{_shape}"] = (*SHAPES[_shape], MID, dict(
                trans_A=LAYOUTS[_layout][0], trans_B=LAYOUTS[_layout][1], in_dtype=_dtype, out_dtype=_dtype))
CASES["NT-fp16-splitk4"] = (64, 4096, 4096, SMALL_M, dict(split_k=4))
CASES["NN-bf16-splitk3-odd"] = (100, 4097, 4000, SMALL_M, dict(split_k=3, trans_B=False, in_dtype="bfloat16",
                                                               out_dtype="bfloat16"))
CASES["TN-fp16-splitk2-out-fp32"] = (256, 1000, 4097, SMALL_M, dict(split_k=2, trans_A=True, trans_B=False,
                                                                    out_dtype="float32"))
CASES["NT-fp16-out-fp32"] = (1000, 1000, 1000, MID, dict(out_dtype="float32"))
# Hopper variants: 7 and 13 CTAs walk 64-512 tiles, the last wave part-full, on odd shapes.
WIDE = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
CASES["NT-fp16-odd-persistent-full_row"] = (4000, 4097, 1000, WIDE, dict(persistent=7, warp_policy="full_row"))
CASES["TT-bf16-odd-persistent"] = (1000, 1000, 4097, MID, dict(persistent=13, trans_A=True, in_dtype="bfloat16",
                                                               out_dtype="bfloat16"))
CASES["NN-fp16-full_row"] = (1024, 2048, 512, WIDE, dict(warp_policy="full_row", trans_B=False))
# full_row on tiles as tall as wide or taller: each warpgroup owns whole rows (square deals it columns)
CASES["TN-bf16-odd-tall-full_row"] = (4000, 4097, 1000, dict(WIDE, block_M=256, block_N=128), dict(
    warp_policy="full_row", trans_A=True, trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))
CASES["TT-fp16-odd-square-full_row"] = (4000, 4097, 1000, MID, dict(warp_policy="full_row", trans_A=True))
if torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0):
    CASES["NT-fp8"] = (2048, 2048, 1024, MID, dict(in_dtype="float8_e4m3", out_dtype="float16"))
    # The hand-scheduled loop (variant="ws", Hopper only). TMA needs 16-byte row strides for A and B, so
    # the odd shape cuts every tile (M, N, K) while keeping M, N, K multiples of 8; C may be unaligned.
    WS = dict(WIDE, variant="ws")
    for _layout in LAYOUTS:
        for _dtype in DTYPES:
            CASES[f"ws-{_layout}-{_dtype}-odd"] = (1000, 2000, 1000, WS, dict(
                trans_A=LAYOUTS[_layout][0], trans_B=LAYOUTS[_layout][1], in_dtype=_dtype, out_dtype=_dtype))
    CASES["ws-NT-fp16-C-unaligned"] = (4001, 4097, 1000, dict(WS, warp_policy="full_row"), {})
    CASES["ws-NT-fp16-cluster1x2-padded"] = (1000, 2800, 1000, dict(WS, cluster="1x2"), {})  # 11 N tiles
    CASES["ws-TN-bf16-cluster2x1-padded"] = (600, 2800, 1000, dict(WS, cluster="2x1"), dict(
        trans_A=True, trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))  # 5 M tiles
    CASES["ws-NT-bf16-persistent-C-unaligned"] = (4001, 4097, 1000, dict(WS, persistent=7), dict(
        in_dtype="bfloat16", out_dtype="bfloat16"))
    CASES["ws-TT-fp16-persistent"] = (1000, 2000, 4000, dict(WS, persistent=13, warp_policy="full_row"),
                                      dict(trans_A=True))
    # C's staging tile on the ring (the aggressive shared-memory merge), one stage more than fits beside it
    RING = dict(pass_configs={C_ON_RING: True})
    CASES["ws-NT-fp16-ring-s4-odd"] = (1000, 2000, 1000, dict(WS, num_stages=4, warp_policy="full_row"), RING)
    CASES["ws-TN-bf16-ring-s4-cluster2x1-padded"] = (600, 2800, 1000, dict(WS, num_stages=4, cluster="2x1",
                                                                           warp_policy="full_row"), dict(
        RING, trans_A=True, trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))
    CASES["ws-NT-fp16-ring-s4-C-unaligned"] = (4001, 4097, 1000, dict(WS, num_stages=4), RING)
    CASES["ws-TN-fp16-ring-one-warpgroup-s7"] = (1000, 1000, 1000, dict(MID, thread_num=128, num_stages=7,
                                                                       variant="ws"), dict(RING, trans_A=True,
                                                                                           trans_B=False))
    CASES["ws-NN-bf16-tall-full_row-odd"] = (1000, 2000, 1000, dict(WS, block_M=256, block_N=128), dict(
        warp_policy="full_row", trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))
    CASES["ws-NN-fp16-one-warpgroup-out-fp32"] = (1000, 1000, 1000, dict(MID, thread_num=128, num_stages=4,
                                                                        variant="ws"),
                                                   dict(trans_B=False, out_dtype="float32"))
    # the sub-wave cluster forms (templates.matmul.space.subwave_cluster_variants_for): a 64-row tile on one
    # consumer warpgroup, its 3 M tiles padded to a pair; a 128-row full_row tile, 22 N tiles, the last cut
    SUBWAVE = dict(WS, block_M=64, block_N=224, num_stages=5, thread_num=128, warp_policy="square", cluster="2x1")
    CASES["ws-NT-fp16-subwave-64row-cluster2x1-odd"] = (150, 2800, 1000, SUBWAVE, {})
    CASES["ws-TN-bf16-subwave-full_row-cluster1x2-odd"] = (104, 2800, 1000, dict(
        MID, num_stages=6, variant="ws", warp_policy="full_row", cluster="1x2"), dict(
        trans_A=True, trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))
    # split-K summed in the cluster's shared memory (split_reduce="cluster"): every layout, both dtypes, M and
    # N tiles cut, a split whose last K range runs past K, 8 splits of 8 rows each, 128-row tiles on 256 threads
    CS = dict(SMALL_M, enable_rasterization=False, split_reduce="cluster")
    CASES["clustersplit-NT-fp16-s4"] = (64, 4096, 4096, CS, dict(split_k=4))
    CASES["clustersplit-NN-bf16-s2-odd"] = (100, 4097, 4000, CS, dict(split_k=2, trans_B=False, in_dtype="bfloat16",
                                                                      out_dtype="bfloat16"))
    CASES["clustersplit-TN-fp16-s8-out-fp32"] = (256, 1000, 4097, CS, dict(split_k=8, trans_A=True, trans_B=False,
                                                                           out_dtype="float32"))
    CASES["clustersplit-TT-bf16-s4-K-tail"] = (72, 1000, 1000, CS, dict(split_k=4, trans_A=True, in_dtype="bfloat16",
                                                                        out_dtype="bfloat16"))
    CASES["clustersplit-NT-fp16-128row-s4"] = (128, 4096, 14336, dict(MID, block_K=128, enable_rasterization=False,
                                                                      split_reduce="cluster"), dict(split_k=4))
    CASES["ws-NT-fp8"] = (2048, 2048, 1024, dict(WS, block_K=128), dict(in_dtype="float8_e4m3",
                                                                        out_dtype="float16"))
    # Ping-pong: two warpgroups alternate over a CTA's tiles. 13 CTAs on 128 tiles give some CTAs an even
    # and some an odd count (the last hand-over skipped); 132 CTAs on 64 tiles leave CTAs with none and
    # warpgroup 1 idle; K = 64 is one K step (no release inside the loop).
    PP = dict(MID, num_stages=4, variant="pingpong", persistent=13)
    for _layout in LAYOUTS:
        for _dtype in DTYPES:
            CASES[f"pingpong-{_layout}-{_dtype}-odd"] = (1000, 2000, 1000, PP, dict(
                trans_A=LAYOUTS[_layout][0], trans_B=LAYOUTS[_layout][1], in_dtype=_dtype, out_dtype=_dtype))
    CASES["pingpong-NT-fp16-C-unaligned"] = (4001, 4097, 1000, dict(PP, persistent=7), {})
    CASES["pingpong-NN-bf16-fewer-tiles-than-CTAs"] = (1000, 1000, 1000, dict(PP, persistent=132), dict(
        trans_B=False, in_dtype="bfloat16", out_dtype="bfloat16"))
    CASES["pingpong-NT-fp16-one-K-step-out-fp32"] = (1000, 2000, 64, dict(PP, num_stages=2), dict(
        out_dtype="float32"))  # two fp32 C tiles beside 2 stages: 193 KB
    CASES["pingpong-TN-fp16-128x192-s3"] = (4000, 4096, 1000, dict(PP, block_N=192, num_stages=3,
                                                                    persistent=132), dict(trans_A=True,
                                                                                          trans_B=False))
    CASES["pingpong-NT-bf16-64x256-odd"] = (1000, 4000, 2000, dict(PP, block_M=64, block_N=256), dict(
        in_dtype="bfloat16", out_dtype="bfloat16"))
    # the tile walk's panels (the scheduler's swizzle): narrow, wide, and wider than the grid
    for _panel in (1, 4, 16, 64):
        CASES[f"pingpong-NT-fp16-panel{_panel}-odd"] = (1000, 4000, 1000, dict(PP, panel_size=_panel, persistent=29),
                                                        {})
    CASES["pingpong-NT-fp8"] = (2048, 2048, 1024, dict(PP, block_K=128, persistent=132), dict(
        in_dtype="float8_e4m3", out_dtype="float16"))


def make_inputs(M, N, K, in_dtype="float16", trans_A=False, trans_B=True, seed=0):
    """Random A, B in the kernel's layouts, and the fp32 answer of op(A) @ op(B)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(M, K, device="cuda", generator=g)
    b = torch.randn(K, N, device="cuda", generator=g)
    a = a.to(mm.torch_dtype(in_dtype))
    b = b.to(mm.torch_dtype(in_dtype))
    A = a.T.contiguous() if trans_A else a
    B = b.T.contiguous() if trans_B else b
    return A, B, a.float() @ b.float()


def assert_matches(out, ref, in_dtype):
    assert not torch.isnan(out).any(), "NaN in the output: some element was never written"
    if in_dtype == "float8_e4m3":  # Hopper's fp8 wgmma accumulates with fewer bits: compare as a whole
        x, y = out.double(), ref.double()
        assert 1 - 2 * (x * y).sum() / (x * x + y * y).sum() < 1e-3
    else:  # one rounding of an fp32 sum: within half an ulp of the output dtype
        torch.testing.assert_close(out.float(), ref, atol=1e-2, rtol=1e-2)


@pytest.fixture(scope="module")
def compiled(request):
    """Every selected case (all, or those ``-k`` picks) compiled with all buffers as arguments, so the test can
    hand in a NaN-filled C."""
    import tilelang

    wanted = [item.callspec.params["name"] for item in request.session.items
              if getattr(item, "module", None) is request.module
              and getattr(item, "originalname", None) == "test_correct_against_torch"]

    def build(name):
        M, N, K, cfg, kw = CASES[name]
        kw = dict(kw)
        pass_configs = kw.pop("pass_configs", None)  # for the compiler, not the kernel
        try:
            return name, tilelang.compile(mm.kernel(M, N, K, **cfg, **kw), target="cuda", pass_configs=pass_configs)
        except Exception as e:  # noqa: BLE001 - reported by the test of that case, not the fixture
            return name, e

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 4) as pool:
        return dict(pool.map(build, wanted))


@pytest.mark.parametrize("name", list(CASES))
def test_correct_against_torch(name, compiled):
    M, N, K, cfg, kw = CASES[name]
    jit = compiled[name]
    if isinstance(jit, Exception):
        raise jit
    in_dtype = kw.get("in_dtype", "float16")
    A, B, ref = make_inputs(M, N, K, in_dtype, kw.get("trans_A", False), kw.get("trans_B", True))
    C = torch.full((M, N), float("nan"), device="cuda", dtype=mm.torch_dtype(kw.get("out_dtype", "float16")))
    # a split-K config's workspace W is a scratch parameter (autotuner.scratch) before C: NaN, as given
    # (split_reduce="cluster" sums in shared memory: no workspace)
    workspace = kw.get("split_k", 1) > 1 and cfg.get("split_reduce", "workspace") == "workspace"
    W = [torch.full((kw["split_k"], M, N), float("nan"), device="cuda")] if workspace else []
    assert scratch.positions(jit) == ([2] if W else [])
    jit(A, B, *W, C)
    torch.cuda.synchronize()
    assert_matches(C, ref, in_dtype)
    # ref_program agrees on the layout and dtype it returns
    out = mm.ref_program(A, B, trans_A=kw.get("trans_A", False), trans_B=kw.get("trans_B", True),
                         out_dtype=kw.get("out_dtype"))
    assert out.dtype == C.dtype and out.shape == C.shape
    if "split_k" in kw:  # twice the same answer: no atomics, so bit-identical
        C2 = torch.full_like(C, float("nan"))
        jit(A, B, *W, C2)
        assert torch.equal(C, C2)


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="the hand-scheduled loop needs Hopper")
@pytest.mark.parametrize("form", ["pingpong", "cluster2x1", "cluster1x2", "clustersplit"])
def test_the_hopper_loop_with_a_symbolic_m_is_right_at_every_m(form):
    """One kernel with M symbolic, as the op compiles one per bucket of M (templates/matmul/op.py). Ping-pong
    runs at Ms whose 128x128 tiles give the 132 CTAs none or one (M = 1, 100), one or two (1000), four or five
    (2049: odd and even counts a CTA) and seven or eight (4096); the sub-wave cluster forms at 1 to 64 M tiles,
    odd counts padded to a pair (2x1: along M) or N tiles paired (1x2); the cluster-summed split-K with a
    last row band cut at M (M = 1, 100)."""
    import tilelang
    import tilelang.language as T

    from templates.matmul import op as mop

    cfg = {"pingpong": dict(MID, num_stages=4, variant="pingpong", persistent=132),
           "cluster2x1": dict(MID, block_M=64, block_N=224, num_stages=5, thread_num=128, variant="ws",
                              cluster="2x1"),
           "cluster1x2": dict(MID, num_stages=6, variant="ws", warp_policy="full_row", cluster="1x2"),
           "clustersplit": dict(SMALL_M, enable_rasterization=False, split_k=4, split_reduce="cluster")}[form]
    jit = tilelang.compile(mop.gemm(T.dynamic("M"), 4096, 4096, "float16", **cfg), target="cuda")
    for M in (1, 100, 1000, 2049, 4096):
        A, B, ref = make_inputs(M, 4096, 4096)
        C = torch.full((M, 4096), float("nan"), device="cuda", dtype=torch.float16)
        jit(A, B, C)
        torch.cuda.synchronize()
        assert_matches(C, ref, "float16")


@pytest.mark.parametrize("M,N,K,dtype,trans_A,trans_B", [
    (2048, 2048, 2048, "float16", False, True),
    (4000, 4097, 1000, "bfloat16", True, False),
])
def test_carver_top1_without_tuning(M, N, K, dtype, trans_A, trans_B):
    kern = mm.compile(M, N, K, dtype=dtype, trans_A=trans_A, trans_B=trans_B)
    A, B, ref = make_inputs(M, N, K, dtype, trans_A, trans_B)
    assert_matches(kern(A, B), ref, dtype)


def test_tune_end_to_end_and_warm_in_a_new_process():
    M, N, K = 2048, 2048, 2048
    result = mm.tuner(M, N, K, dtype="float16", topk=8).run(warmup=3, rep=20)
    assert not result.from_cache
    assert any(t.status == "ok" for t in result.trials)
    A, B, ref = make_inputs(M, N, K)
    assert_matches(result.kernel(A, B), ref, "float16")
    assert_matches(mm.tune(M, N, K, dtype="float16")(A, B), ref, "float16")  # same process: cached

    script = textwrap.dedent(f"""
        import json, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import torch
        from templates import matmul as mm
        torch.zeros(1, device="cuda")  # CUDA context up before the clock starts, as in any app
        t = time.perf_counter()
        result = mm.tuner({M}, {N}, {K}, dtype="float16", topk=8).run(warmup=3, rep=20)
        seconds = time.perf_counter() - t
        a = torch.randn({M}, {K}, device="cuda", dtype=torch.float16)
        b = torch.randn({N}, {K}, device="cuda", dtype=torch.float16)
        err = (result.kernel(a, b).float() - (a.float() @ b.float().T)).abs().max().item()
        print(json.dumps(dict(seconds=seconds, from_cache=result.from_cache, config=result.config, err=err)))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=os.environ.copy(),
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    warm = json.loads(proc.stdout.strip().splitlines()[-1])
    assert warm["from_cache"], warm
    assert warm["config"] == result.config
    assert warm["err"] < 0.5
    # how long it took is a benchmark figure (benchmarks/gemm.py reports it), not a unit-test assertion
    print(f"warm tune in a new process: {warm['seconds']:.2f} s")


def test_split_k_is_right_on_two_streams_at_once_and_in_a_cuda_graph():
    """The split-K workspace is allocated per call on the caller's stream (autotuner.scratch). From TVM's
    per-thread pool, as it was, a call on a second stream took the block the first call's kernels were
    still using, and a captured graph kept a block the pool freed when a larger split-K call came."""
    M, N, K = 64, 4096, 8192
    kernel = mm.compile(M, N, K, dict(SMALL_M, split_k=4))
    kernel.get_profiler().assert_allclose(lambda A, B: mm.ref_program(A, B))  # inputs for A and B only
    inputs = [make_inputs(M, N, K, seed=s) for s in range(2)]
    streams = [torch.cuda.Stream() for _ in inputs]
    torch.cuda.synchronize()
    for _ in range(30):  # the two calls' kernels overlap on the GPU: each stream waits for nothing
        outs = []
        for stream, (A, B, _) in zip(streams, inputs):
            with torch.cuda.stream(stream):
                outs.append(kernel(A, B))
        torch.cuda.synchronize()
        for out, (_, _, ref) in zip(outs, inputs):
            assert_matches(out, ref, "float16")

    A, B, _ = inputs[0]
    A_new, _, _ = make_inputs(M, N, K, seed=5)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        kernel(A, B)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        C = kernel(A, B)
    bigger = mm.compile(2 * M, 2 * N, K, dict(SMALL_M, split_k=8))  # 4x the workspace: the old pool grew
    A2, B2, ref2 = make_inputs(2 * M, 2 * N, K, seed=6)
    assert_matches(bigger(A2, B2), ref2, "float16")
    A.copy_(A_new)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(C, A_new.float() @ B.float().T, "float16")


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                    reason="thread-block clusters need Hopper (sm_90)")
@pytest.mark.parametrize("cluster", ["1x2", "2x1"])
def test_a_cluster_gemm_waits_for_a_kernel_that_triggers_its_dependents_early(cluster):
    """TileLang launches cluster kernels with programmatic stream serialization: one that did not wait
    (griddepcontrol) read A before the kernel ahead of it, which triggered early, had written it (H200,
    2026-11-28: 1.4 M wrong elements of 10.5 M over 20 runs)."""
    from kernels.pdl_kernels import late_writer

    from autotuner.compile import tl_compile

    M, N, K = 256, 2048, 4096
    writer = tl_compile(late_writer(M, K), "cuda")
    gemm = mm.compile(M, N, K, dict(MID, variant="ws", cluster=cluster))
    A = torch.zeros(M, K, dtype=torch.float16, device="cuda")
    B = torch.ones(N, K, dtype=torch.float16, device="cuda")
    wrong = 0
    for _ in range(20):
        A.zero_()
        writer(A)  # A = 1 everywhere, written after the trigger
        C = gemm(A, B)  # launched right behind it on the same stream
        wrong += int((C != K).sum())
    torch.cuda.synchronize()
    assert wrong == 0, f"{wrong} of {20 * M * N} elements read A before it was written"


def test_tune_small_m_tries_split_k_and_is_correct():
    M, N, K = 64, 4096, 4096
    result = mm.tuner(M, N, K, dtype="bfloat16", trans_B=False, topk=4).run(warmup=3, rep=20)
    split = [t for t in result.trials if t.config.get("split_k", 1) > 1]
    assert split, "few-wave shape: split-K candidates should have been tried"
    assert all(t.status in ("ok", "resource_error") for t in split), [(t.config, t.error) for t in split]
    A, B, ref = make_inputs(M, N, K, "bfloat16", False, False)
    assert_matches(result.kernel(A, B), ref, "bfloat16")
    result.summary()
