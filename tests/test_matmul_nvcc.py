"""templates.matmul compiled for sm_90a with nvcc, without a GPU: layouts, dtypes, odd shapes, split-K,
the row-wise warp split and the persistent kernel.

Twelve compiles of about 3-6 s each on one core. Hopper kernels with 128 or more threads per 64 rows must
lower to wgmma with TMA loads; the test checks the source says so, since a silent fallback to mma.sync
would compile and still be 2x slower. TMA needs 16-byte-aligned row strides, so an odd leading
dimension (4097) falls back to cp.async loads; the test checks that too.
"""

from __future__ import annotations

import pytest

from templates import matmul as mm

pytestmark = pytest.mark.nvcc

BIG = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
MID = dict(block_M=128, block_N=128, block_K=64, num_stages=3, thread_num=256, enable_rasterization=False)
SMALL_M = dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128, enable_rasterization=True)
TINY = dict(block_M=64, block_N=32, block_K=128, num_stages=2, thread_num=128, enable_rasterization=True)

CASES = {
    # name: (M, N, K, config, kernel keyword arguments)
    "NT-fp16-4096": (4096, 4096, 4096, BIG, {}),
    "NN-fp16-odd": (4000, 4097, 4000, BIG, dict(trans_B=False)),
    "TN-bf16": (2048, 4096, 1024, MID, dict(trans_A=True, trans_B=False, in_dtype="bfloat16",
                                            out_dtype="bfloat16")),
    "TT-bf16-odd": (4097, 4000, 4097, MID, dict(trans_A=True, in_dtype="bfloat16", out_dtype="bfloat16")),
    "NT-bf16-odd-4097": (4097, 4097, 4097, MID, dict(in_dtype="bfloat16", out_dtype="bfloat16")),
    "NT-fp16-M64-tiny": (64, 4096, 4096, TINY, {}),
    "NT-fp16-splitk4": (64, 4096, 4096, SMALL_M, dict(split_k=4)),
    "NN-bf16-splitk3-odd": (100, 4097, 4000, SMALL_M, dict(split_k=3, trans_B=False, in_dtype="bfloat16",
                                                           out_dtype="bfloat16")),
    "NT-fp8": (4096, 4096, 4096, MID, dict(in_dtype="float8_e4m3", out_dtype="float16")),
    "NT-fp16-out-fp32": (1000, 1000, 1000, MID, dict(out_dtype="float32")),
    "NT-fp16-persistent-full_row": (8192, 8192, 512, BIG, dict(persistent=132, warp_policy="full_row")),
    "TN-bf16-odd-persistent": (4000, 4097, 1000, MID, dict(persistent=132, trans_A=True, trans_B=False,
                                                           in_dtype="bfloat16", out_dtype="bfloat16")),
    # a tall tile dealt by rows: each warpgroup 128 rows of all 128 columns (square: m64n64 on half of them)
    "NT-fp16-tall-full_row": (4096, 4096, 4096, dict(BIG, block_M=256, block_N=128), dict(warp_policy="full_row")),
    "NT-fp16-square-tile-full_row-odd": (4000, 4097, 4096, MID, dict(warp_policy="full_row")),
}


@pytest.fixture(scope="module")
def sm90a():
    import tilelang  # noqa: F401 - puts its bundled tvm on the path
    from tvm.target import Target

    return Target({"kind": "cuda", "arch": "sm_90a"})


@pytest.mark.parametrize("name", list(CASES))
def test_compiles_for_sm90a(name, sm90a):
    import tilelang

    M, N, K, cfg, kw = CASES[name]
    jit = tilelang.compile(mm.kernel(M, N, K, **cfg, **kw), out_idx=[-1], target=sm90a)
    src = jit.get_kernel_source()
    assert "__global__" in src
    if cfg["thread_num"] >= 128 and cfg["block_M"] >= 64:
        assert "wgmma" in src, f"{name}: no wgmma in the sm_90a kernel"
        # TMA needs 16-byte-aligned row strides: an odd leading dimension (K=4097 for A (M, K))
        # falls back to cp.async, which compiles and runs, only slower.
        esize = 1 if kw.get("in_dtype") == "float8_e4m3" else 2
        strides = {"A": M if kw.get("trans_A") else K, "B": K if kw.get("trans_B", True) else N}
        for operand, stride in strides.items():
            tma = f"tma_load({operand}_desc" in src
            assert tma == (stride * esize % 16 == 0), f"{name}: {operand} row stride {stride}, TMA {tma}"
    if kw.get("split_k", 1) > 1:
        assert src.count("__global__ void __launch_bounds__") == 2  # partial GEMM + reduction
        assert "atomic" not in src.lower()
        # the partials are a parameter (autotuner.scratch), not a block of TVM's per-thread pool
        assert "TVMBackendAllocWorkspace" not in jit.get_host_source()
    if kw.get("in_dtype") == "float8_e4m3":
        assert "kFloat8_e4m3" in src
    n_inst = cfg["block_N"] if kw.get("warp_policy") == "full_row" else None
    if n_inst:  # each warpgroup owns whole rows: one m64nN wgmma per k-step
        assert f"kFloat32, 64, {n_inst}, 16" in src, f"{name}: no m64n{n_inst} wgmma"
        assert f"kFloat32, 64, {n_inst // 2}, 16" not in src, f"{name}: a warpgroup takes half the columns"
    if kw.get("persistent"):  # the producer warpgroup carries its pipeline phase across tiles
        assert "for (int w = 0;" in src and "producer_phase_cnt" in src


def test_compile_api_for_a_compile_only_target():
    """``templates.matmul.compile`` with an explicit config and target "sm_90a" (no GPU needed)."""
    jit = mm.compile(256, 8192, 8192, config=dict(MID, split_k=2), dtype="bf16", target="sm_90a")
    assert "wgmma" in jit.get_kernel_source()


def test_split_k_compiled_to_serve_has_torch_allocate_its_workspace_per_call():
    """What templates.matmul.compile (and every served kernel) hands out for split-K: TileLang allocates the
    workspace W per call, as it does the output, through torch's allocator on the current stream
    (TVMFFIEnvTensorAlloc), and the call returns C alone."""
    from autotuner.served import ServedKernel

    jit = mm.compile(64, 4096, 4096, dict(SMALL_M, split_k=4), target={"kind": "cuda", "arch": "sm_90a"})
    assert isinstance(jit, ServedKernel)
    assert (jit.out_idx, jit.scratch, jit.jit_kernel.out_idx) == ([3], [2], [3, 2])
    host = jit.get_host_source()
    assert "TVMBackendAllocWorkspace" not in host
    assert "W_allocation_status = TVMFFIEnvTensorAlloc" in host
