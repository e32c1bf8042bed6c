"""``benchmarks/gemv_fixed_cost.py``'s programs: each kind builds and compiles for sm_90a (nvcc), and its
spaces keep only configs the programs can run (so the benchmark stays rerunnable)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import gemv_fixed_cost as gfc  # noqa: E402


def test_spaces_divide_k_and_fit_the_gpu():
    for c in gfc.reg_space(4096):
        assert 4096 % (c["wk"] * 32 * c["U"]) == 0 and 32 * c["wk"] * c["wn"] <= 512 and c["R"] * c["U"] <= 16
    for c in gfc.sm_space(4096):
        assert c["block_N"] // (c["threads"] // 32) >= 8
        assert c["stages"] * (16 + c["block_N"]) * c["block_K"] * 2 <= 200 * 1024
    assert all(4096 % (c["rt"] * 8 * c["unroll"]) == 0 for c in gfc.xs_space(4, 4096))
    assert gfc.xs_space(16, 8192) == []  # x (16 x 8192 fp16, 256 KB) would not fit in shared memory


@pytest.mark.nvcc
@pytest.mark.parametrize("M", [4, 16])
def test_programs_compile_for_sm90a(M):
    import tilelang

    target = {"kind": "cuda", "arch": "sm_90a"}
    progs = {"reg": gfc.regmma(M, 256, 512, R=2, U=2, wk=2, wn=2, unroll_steps=False),
             "xs": gfc.simt_xs(M, 256, 512, block_N=4, rt=32, unroll=2),
             "sm": gfc.smem_mma(M, 256, 512, block_N=32, block_K=256, threads=64, stages=2)}
    for name, prog in progs.items():
        src = tilelang.compile(prog, out_idx=[-1], target=target).get_kernel_source()
        assert "main_kernel" in src, name
        if name == "reg":  # its mma is issued on register operands, with no shared-memory tile of W
            assert "mma_sync" in src and "W_shared" not in src
