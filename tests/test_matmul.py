"""templates.matmul without compiling: argument errors, the search space, the reference, the
split-K candidates, the glue to the carver and the autotuner, and that the plain path is exactly the
program behind the measured grids (so benchmarks/data/h200-gemm-grid stays valid for it)."""

from __future__ import annotations

import dataclasses

import pytest
import tilelang.language as T
import torch

from autotuner.target import ResolvedTarget, resolve_target
from carver.arch import CUDA
from templates import matmul as mm
from templates.protocol import carver_arch_name

BEST = dict(block_M=128, block_N=256, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
SMALL_M = dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128, enable_rasterization=True)
# tuner() needs a CUDA target: an explicit arch builds the tuner (compile-only) with or without a GPU.
SM90A = {"kind": "cuda", "arch": "sm_90a"}


def measured_gemm(M, N, K, block_M, block_N, block_K, num_stages, thread_num, enable_rasterization,
                  dtype="float16", accum_dtype="float"):
    """``gemm`` of benchmarks/measure_gemm_grid.py, verbatim: the program of the measured grids."""
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_N, block_K), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), dtype)
            T.use_swizzle(panel_size=10, enable=enable_rasterization)
            T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K], B_shared)
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])
    return main


# --------------------------------------------------------------------------------------------------
# the kernel program
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (4000, 4097, 1000), (64, 4096, 4096)])
@pytest.mark.parametrize("cfg", [BEST, dict(SMALL_M, num_stages=0, enable_rasterization=False)])
def test_plain_path_is_the_measured_program(shape, cfg):
    assert mm.kernel(*shape, **cfg).script() == measured_gemm(*shape, **cfg).script()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans_A,trans_B", [(False, True), (False, False), (True, False), (True, True)])
@pytest.mark.parametrize("split_k", [1, 3])
def test_layouts_build_with_the_right_buffers(dtype, trans_A, trans_B, split_k):
    M, N, K = 200, 4097, 1000
    func = mm.kernel(M, N, K, **SMALL_M, in_dtype=dtype, out_dtype="float32", trans_A=trans_A,
                     trans_B=trans_B, split_k=split_k)
    shapes = {str(buf.name): ([int(d) for d in buf.shape], str(buf.dtype)) for buf in func.buffer_map.values()}
    assert shapes["A"] == ([K, M] if trans_A else [M, K], dtype)
    assert shapes["B"] == ([N, K] if trans_B else [K, N], dtype)
    assert shapes["C"] == ([M, N], "float32")
    text = func.script()
    assert (f"T.bool({trans_A}), T.bool({trans_B})") in text  # the gemm's transpose flags
    assert ("blockIdx.z" in text) == (split_k > 1)


def test_split_k_sums_a_workspace_in_a_second_kernel():
    from autotuner import scratch

    func = mm.kernel(64, 4096, 4096, **SMALL_M, split_k=4)
    text = func.script()
    # fp32 partials, no atomics, no zero-fill; a scratch parameter before C, which the caller allocates
    # per call (not T.alloc_global, a block of TVM's per-thread pool that other streams share)
    names = [str(func.buffer_map[p].name) for p in func.params]
    assert names == ["A", "B", "W", "C"] and scratch.positions(func) == [2]
    assert "W = T.match_buffer(W_handle, (4, 64, 4096)" in text and "alloc_buffer((4, 64, 4096)" not in text
    assert text.count('thread="blockIdx.x"') == 2
    assert "atomic" not in text


def test_warp_policy_reaches_the_gemm():
    square = mm.kernel(4096, 4096, 4096, **BEST).script()
    full_row = mm.kernel(4096, 4096, 4096, **BEST, warp_policy="full_row").script()
    assert square != full_row
    assert square == mm.kernel(4096, 4096, 4096, **BEST, warp_policy="square").script()


@pytest.mark.parametrize("trans_A,trans_B", [(False, True), (True, False)])
def test_persistent_kernel_walks_the_tiles(trans_A, trans_B):
    """``persistent=n``: a 1-D grid of n CTAs, each looping over ceil(tiles / n) waves with a bounds check."""
    text = mm.kernel(4000, 4097, 1000, **BEST, persistent=132, trans_A=trans_A, trans_B=trans_B).script()
    assert 'T.thread_binding(132, thread="blockIdx.x")' in text and "blockIdx.y" not in text
    waves = -(-(32 * 17) // 132)  # ceil(4000/128) * ceil(4097/256) tiles over 132 CTAs
    assert f"for w in range({waves})" in text and f"if w * 132 + bx < {32 * 17}" in text  # the tile's index


def test_panel_size_reaches_the_swizzle():
    assert '"rasterization2DRow", 7' in mm.kernel(4096, 4096, 4096, **BEST, panel_size=7).script()


# --------------------------------------------------------------------------------------------------
# argument errors name the bad value and the fix
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(in_dtype="float64"), ValueError, r"in_dtype must be one of .*'float64'"),
    (dict(in_dtype="int8"), ValueError, "in_dtype"),
    (dict(out_dtype="float8_e4m3"), ValueError, "out_dtype"),
    (dict(accum_dtype="float16"), ValueError, "accum_dtype"),
    (dict(trans_A="yes"), TypeError, "trans_A must be a bool, got 'yes'"),
    (dict(trans_B=1), TypeError, "trans_B must be a bool"),
    (dict(in_dtype="float8_e4m3", trans_B=False), ValueError, r"float8_e4m3 needs .*trans_B=True"),
    (dict(in_dtype="float8_e4m3", trans_A=True), ValueError, "transpose the operands"),
    (dict(split_k=0), ValueError, "split_k must be a positive int, got 0"),
    (dict(split_k=2.0), ValueError, "split_k must be a positive int"),
    (dict(split_k=1000), ValueError, r"split_k=1000 leaves a split with no work .* use split_k <= 64"),
    (dict(thread_num=100), ValueError, "multiple of 32"),
    (dict(num_stages=-1), ValueError, "num_stages"),
    (dict(block_M=0), ValueError, "block_M must be a positive int, got 0"),
    (dict(enable_rasterization="True"), TypeError, "enable_rasterization must be a bool"),
    (dict(panel_size=-2), ValueError, "panel_size"),
    (dict(warp_policy="rows"), ValueError, r"warp_policy must be one of \['square', 'full_row', 'full_col'\]"),
    (dict(persistent=-1), ValueError, "persistent must be an int >= 0"),
    (dict(persistent=True), ValueError, "persistent must be an int >= 0"),
    (dict(persistent=132, split_k=2), ValueError, "persistent=132 and split_k=2 do not combine"),
    (dict(block_M=64, warp_policy="full_row"), ValueError, "block_M must be a multiple of 128, got 64"),
])
def test_bad_arguments_are_rejected_up_front(kwargs, exc, match):
    args = {**BEST, **kwargs}
    with pytest.raises(exc, match=match):
        mm.kernel(4096, 4096, 4096, **args)


@pytest.mark.parametrize("shape,name,value", [
    ((0, 4096, 4096), "M", 0), ((4096, -1, 4096), "N", -1), ((4096, 4096, 1.5), "K", 1.5),
    ((True, 4096, 4096), "M", True),
])
def test_non_positive_shapes_are_rejected(shape, name, value):
    with pytest.raises(ValueError, match=f"{name} must be a positive int, got {value!r}"):
        mm.kernel(*shape, **BEST)
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        mm.default_space(*shape)


def test_fp8_block_k_must_be_a_wgmma_step():
    with pytest.raises(ValueError, match=r"block_K must be a multiple of 32 for float8_e4m3 .*got 16"):
        mm.kernel(4096, 4096, 4096, **dict(BEST, block_K=16), in_dtype="fp8", out_dtype="float16")


def test_dtype_aliases():
    a = mm.kernel(256, 256, 256, **SMALL_M, in_dtype="bf16", out_dtype="fp32").script()
    b = mm.kernel(256, 256, 256, **SMALL_M, in_dtype="bfloat16", out_dtype="float32").script()
    assert a == b
    assert mm.kernel(256, 256, 256, **SMALL_M, in_dtype=torch.float16).script() == \
        mm.kernel(256, 256, 256, **SMALL_M).script()


def test_normalize_config():
    assert mm.normalize_config(dict(BEST, split_k=2)) == dict(BEST, split_k=2)
    pc = {"pass_configs": {"tl.disable_warp_specialized": True}}
    assert mm.normalize_config(dict(BEST, **pc)) == dict(BEST, **pc)  # handed to the compiler, not the kernel
    with pytest.raises(TypeError, match="pass_configs must be a dict"):
        mm.normalize_config(dict(BEST, pass_configs="fast"))
    with pytest.raises(ValueError, match=r"unknown config key\(s\) \['block_m'\]"):
        mm.normalize_config(dict(BEST, block_m=64))
    with pytest.raises(ValueError, match=r"lacks \['thread_num'\]"):
        mm.normalize_config({k: v for k, v in BEST.items() if k != "thread_num"})
    with pytest.raises(TypeError, match="a config must be a dict"):
        mm.normalize_config([("block_M", 64)])


# --------------------------------------------------------------------------------------------------
# the space, the reference, the split-K candidates
# --------------------------------------------------------------------------------------------------
def test_default_space_is_tilelangs_288_grid():
    space = mm.default_space(4096, 4096, 4096)
    assert len(space) == 288
    assert len({tuple(sorted(c.items())) for c in space}) == 288
    assert all(tuple(c) == mm.TUNABLE_KEYS for c in space)
    assert BEST in space and dict(BEST, block_M=256, block_N=128) in space  # the large-shape winners
    assert space[0] == dict(block_M=64, block_N=64, block_K=32, num_stages=0, thread_num=128,
                            enable_rasterization=True)


@pytest.mark.parametrize("trans_A,trans_B", [(False, True), (False, False), (True, False), (True, True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ref_program_honours_layouts(trans_A, trans_B, dtype):
    g = torch.Generator().manual_seed(0)
    a = torch.randint(-3, 4, (24, 40), generator=g).to(dtype)   # logical (M, K)
    b = torch.randint(-3, 4, (40, 16), generator=g).to(dtype)   # logical (K, N)
    A = a.T.contiguous() if trans_A else a
    B = b.T.contiguous() if trans_B else b
    want = a.float() @ b.float()
    out = mm.ref_program(A, B, trans_A=trans_A, trans_B=trans_B)
    assert out.dtype == dtype and out.shape == (24, 16)
    assert torch.equal(out.float(), want)  # small integers: exact in every dtype
    out32 = mm.ref_program(A, B, trans_A=trans_A, trans_B=trans_B, out_dtype="float32")
    assert out32.dtype == torch.float32 and torch.equal(out32, want)


def test_ref_program_fp8_returns_fp16():
    a = torch.randint(-3, 4, (8, 32)).to(torch.float8_e4m3fn)
    b = torch.randint(-3, 4, (16, 32)).to(torch.float8_e4m3fn)
    out = mm.ref_program(a, b)
    assert out.dtype == torch.float16
    assert torch.equal(out.float(), a.float() @ b.float().T)


def test_split_k_candidates_only_for_few_waves():
    assert mm.split_k_candidates([BEST], 4096, 4096, 4096, 132) == []  # 512 tiles: plenty of waves
    cands = mm.split_k_candidates([SMALL_M], 64, 4096, 4096, 132)      # 32 tiles on 132 SMs
    assert [c["split_k"] for c in cands] == [2, 4, 8]
    assert all(dict(c, split_k=1) == dict(SMALL_M, split_k=1) for c in cands)
    for c in cands:  # every candidate builds
        mm.kernel(64, 4096, 4096, **c)
    # short K caps the split: K=128 with block_K=64 has 2 K tiles
    assert [c["split_k"] for c in mm.split_k_candidates([SMALL_M], 64, 4096, 128, 132)] == [2]
    assert mm.split_k_candidates([SMALL_M], 64, 4096, 64, 132) == []


def test_row_tile_hedge_measures_the_other_tile_height_at_few_rows():
    """At M = 128 the carver ranks 64x96 tiles first for 128x6144x4096; measured, 128-row tiles are 27%
    faster (benchmarks/data/few-rows-2026-11-23b-h200), so tune() also measures the best other height."""
    from templates.matmul import space
    from templates.matmul.config import make_problem

    few = make_problem(128, 6144, 4096, "float16")
    ranked = space.candidates(few, CUDA("H200"), space.ROW_HEDGE_DEPTH, variants=False, split_k=False)
    (hedge,) = space.row_tile_hedge(few, ranked)
    assert hedge.block_M != ranked[0].block_M and hedge.split_k == 1
    assert hedge == next(c for c in ranked if c.block_M != ranked[0].block_M and c.split_k == 1)
    tuned = space.candidates(few, CUDA("H200"), 4)
    assert hedge in tuned and tuned[:4] == ranked[:4]
    # a split-K config never serves as the hedge; one height alone, or many tile rows, need none
    other = 128 if ranked[0].block_M != 128 else 64
    assert space.row_tile_hedge(few, [ranked[0], dataclasses.replace(ranked[0], block_M=other, split_k=2)]) == []
    assert space.row_tile_hedge(few, ranked[:1]) == [] and space.row_tile_hedge(few, []) == []
    many = make_problem(4096, 4096, 4096, "float16")
    assert space.row_tile_hedge(many, space.candidates(many, CUDA("H200"), 8, variants=False)) == []


def test_hopper_variants():
    """full_row wherever every consumer warpgroup can take whole rows (wide, square and tall blocks);
    persistent only past one wave and for short K, with stages cut until C's tile fits beside them."""
    tall = dict(BEST, block_M=256, block_N=128)
    four = dict(BEST, num_stages=4)
    smem = 227 * 1024
    short_k = mm.hopper_variants([four, tall], 8192, 8192, 512, 132, smem)
    assert short_k == [
        dict(four, num_stages=3, persistent=132),  # 4 stages + C = 257 KB > 227 KB
        dict(four, warp_policy="full_row"),
        dict(four, num_stages=3, warp_policy="full_row", persistent=132),
        dict(tall, persistent=132),
        dict(tall, warp_policy="full_row"),  # square gives each warpgroup 64 of the 128 columns (m64n64)
        dict(tall, warp_policy="full_row", persistent=132),
    ]
    square = dict(BEST, block_N=128)
    assert mm.hopper_variants([square], 8192, 8192, 8192, 132, smem) == [dict(square, warp_policy="full_row")]
    # 192 rows cannot be dealt to 8 warps of 16 rows each (one warpgroup would own a partial m64 block)
    assert mm.hopper_variants([dict(square, block_M=192)], 8192, 8192, 8192, 132, smem) == []
    assert all(mm.separate_c_smem_bytes(c, "float16", "float16") <= smem for c in short_k if c.get("persistent"))
    long_k = mm.hopper_variants([four, tall], 8192, 8192, 8192, 132, smem)
    # persistent measured slower at K >= 4096
    assert long_k == [dict(four, warp_policy="full_row"), dict(tall, warp_policy="full_row")]
    assert mm.hopper_variants([four], 256, 512, 512, 132, smem) == [dict(four, warp_policy="full_row")]  # 4 tiles
    assert mm.hopper_variants([dict(four, split_k=2), dict(SMALL_M, thread_num=256)], 8192, 8192, 512, 132,
                              smem) == [dict(SMALL_M, thread_num=256, persistent=132)]  # 64 rows, 2 groups: no full_row
    assert mm.hopper_variants([four], 8192, 8192, 512, 132, smem, top=0) == []
    # 192x256 fits C beside only 2 stages, which measured 3.4x slower: no persistent variant
    assert mm.hopper_variants([dict(BEST, block_M=192, num_stages=4)], 8192, 8192, 512, 132, smem) == []
    assert mm.hopper_variants([dict(BEST, num_stages=2)], 8192, 8192, 512, 132, smem) == [
        dict(BEST, num_stages=2, warp_policy="full_row")]


def test_validate_checks_the_persistent_kernels_shared_memory():
    carver = pytest.importorskip("carver")
    tmpl = carver.MatmulTemplate(M=8192, N=8192, K=512).with_arch(carver.arch.CUDA("H100"))
    assert mm.validate(tmpl, 512, "float16", dict(BEST, num_stages=4)) == []  # C reuses the stages' memory
    assert mm.validate(tmpl, 512, "float16", dict(BEST, num_stages=3, persistent=132)) == []
    (reason,) = mm.validate(tmpl, 512, "float16", dict(BEST, num_stages=4, persistent=132))
    assert "persistent 128x256x64 with num_stages=4 needs 263168 bytes" in reason and "fewer stages" in reason
    auto_ws = {"pass_configs": {mm.AUTO_WS: "role_based"}}
    assert "role-based" in mm.validate(tmpl, 512, "float16", dict(BEST, num_stages=4, **auto_ws))[0]


def test_split_k_limit():
    for K, bk in ((4096, 64), (4000, 64), (1000, 32), (100, 64), (130, 64)):
        s = mm.split_k_limit(K, bk)
        mm.check_config(K, "float16", 64, 64, bk, 2, 128, True, 10, s)  # the limit is legal
        with pytest.raises(ValueError):
            mm.check_config(K, "float16", 64, 64, bk, 2, 128, True, 10, s + 1)


# --------------------------------------------------------------------------------------------------
# glue: carver hints -> configs -> AutoTuner (a stand-in carver, nothing compiles)
# --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class FakeHint:
    config: dict

    def to_config(self):
        return dict(self.config)


class FakeTemplate:
    """The carver contract: recommend_hints(topk) -> hints with to_config(); validate(config) -> reasons."""

    arch = dataclasses.make_dataclass("Arch", [("num_sms", int)])(132)

    def __init__(self, hints):
        self.hints = hints
        self.validated = []

    def recommend_hints(self, topk):
        return [FakeHint(c) for c in self.hints[:topk]]

    def validate(self, config):
        self.validated.append(config)
        return ["too much shared memory"] if config["block_M"] == 256 else []


def test_validate_adds_template_rules_to_the_carvers():
    tmpl = FakeTemplate([])
    assert mm.validate(tmpl, 4096, "float16", SMALL_M) == []
    assert mm.validate(tmpl, 4096, "float16", dict(SMALL_M, block_M=256)) == ["too much shared memory"]
    (reason,) = mm.validate(tmpl, 128, "float16", dict(SMALL_M, split_k=4))
    assert "use split_k <= 2" in reason
    assert mm.validate(tmpl, 4096, "float16", dict(SMALL_M, blockM=1))[0].startswith("unknown config key")


def test_tuner_wires_carver_hints_into_the_autotuner(monkeypatch):
    pytest.importorskip("autotuner")
    fake = FakeTemplate([SMALL_M, dict(SMALL_M, block_N=64), BEST])
    seen = {}

    def fake_carver_template(M, N, K, in_dtype, out_dtype, accum_dtype, trans_A, trans_B, arch):
        seen.update(M=M, N=N, K=K, in_dtype=in_dtype, out_dtype=out_dtype, trans_A=trans_A, arch=arch)
        return fake

    monkeypatch.setattr(mm.space, "carver_template", fake_carver_template)  # where hints are ranked
    t = mm.tuner(64, 4096, 4096, dtype="bf16", trans_A=True, trans_B=False, topk=2, arch="H100", target=SM90A)
    assert seen == dict(M=64, N=4096, K=4096, in_dtype="bfloat16", out_dtype="bfloat16", trans_A=True,
                        arch=CUDA("H100"))  # the arch resolved once, to the carver's description
    hints = [SMALL_M, dict(SMALL_M, block_N=64)]
    assert t.configs[:2] == hints
    assert t.configs[2] == BEST  # the row-tile hedge: 64 rows span one 64-row tile, BEST is 128 rows high
    assert [c.get("split_k") for c in t.configs[3:]] == [2, 4, 8, 2, 4]  # 32 and 64 tiles on 132 SMs
    func = t.fn(**t.configs[0])  # the partial builds the right problem
    assert [int(d) for d in func.buffer_map[func.params[0]].shape] == [4096, 64]
    assert t.validate(dict(SMALL_M, block_M=256)) == ["too much shared memory"]
    a, b = torch.ones(8, 4, dtype=torch.bfloat16), torch.ones(8, 6, dtype=torch.bfloat16)
    assert t.check_settings.ref_prog(a, b).shape == (4, 6)  # A is (K, M), B is (K, N)

    exhaustive = mm.tuner(4096, 4096, 4096, configs=mm.default_space(4096, 4096, 4096), arch="H100",
                          validate_configs=False, target=SM90A)
    assert len(exhaustive.configs) == 288 and exhaustive.validate is None  # the grid as TileLang runs it
    with pytest.raises(ValueError, match="configs is empty"):
        mm.tuner(4096, 4096, 4096, configs=[], arch="H100", target=SM90A)


def test_tuner_adds_hopper_variants_only_on_hopper():
    pytest.importorskip("autotuner")
    pytest.importorskip("carver")
    hopper = mm.tuner(8192, 8192, 512, arch="H100", topk=4, target=SM90A).configs
    extra = hopper[4:]
    assert extra and all(c.get("persistent") == 132 or c.get("warp_policy") == "full_row" for c in extra)
    assert any(c.get("persistent") for c in extra) and any(c.get("warp_policy") for c in extra)
    assert mm.tuner(8192, 8192, 512, arch="H100", topk=4, variants=False, target=SM90A).configs == hopper[:4]
    ampere = mm.tuner(8192, 8192, 512, arch="A100-40GB", topk=4, target="sm_80").configs
    assert not any(c.get("persistent") or c.get("warp_policy") for c in ampere)


def test_carver_arch_follows_a_compile_only_target():
    compile_only = resolve_target(SM90A)
    local = ResolvedTarget(SM90A, "cuda", "sm_90a", "NVIDIA H100 80GB HBM3", True)
    assert carver_arch_name(None, "sm_90a", compile_only) == "sm_90a"
    assert carver_arch_name(None, "auto", local) == "cuda"
    assert carver_arch_name("H200", "sm_90a", compile_only) == "H200"
    assert mm.MATMUL.resolve(None, "sm_90a").arch == CUDA("sm_90a")
    assert mm.MATMUL.resolve(None, "sm_90a", "H200").arch == CUDA("H200")


@pytest.mark.parametrize("shape", [(4096, 4096, 4096), (64, 4096, 4096), (4000, 4097, 1000)])
@pytest.mark.parametrize("trans_A,trans_B", [(False, True), (True, False)])
def test_real_carver_hints_build(shape, trans_A, trans_B):
    """The carver's hints (and our split-K variants) are configs this kernel accepts, offline."""
    carver = pytest.importorskip("carver")
    if not hasattr(carver, "MatmulTemplate"):
        pytest.skip("carver.MatmulTemplate is not there yet")
    t = mm.tuner(*shape, dtype="bfloat16", trans_A=trans_A, trans_B=trans_B, arch="H100", target=SM90A)
    assert 8 <= len(t.configs) <= 18  # the top-8 and their variants (two ping-pong configs where K <= 4096)
    for cfg in t.configs:
        assert t.validate(cfg) == [], cfg
        t.fn(**cfg)  # builds the TIR


def test_candidates_refuse_a_topk_that_is_not_a_positive_int():
    """The hedge ranks at least ROW_HEDGE_DEPTH hints, so candidates() checks topk itself (0 returned the
    hedge alone, first, before it did)."""
    from templates.matmul import space
    from templates.matmul.config import make_problem

    p = make_problem(128, 14336, 4096, "float16")
    for bad in (0, -2, 2.0, True):
        with pytest.raises((TypeError, ValueError), match="topk"):
            space.candidates(p, CUDA("H100"), bad)
    assert space.candidates(p, CUDA("H100"), 1)[0] == space.candidates(p, CUDA("H100"), 8)[0]


def test_a_problems_out_dtype_defaults_to_its_inputs_as_make_problem_does():
    # a bf16 GEMM's answer can exceed fp16's 65504: an fp16 C would be inf, and so would the reference's
    for in_dtype, out in (("float16", "float16"), ("bfloat16", "bfloat16"), ("float8_e4m3", "float16")):
        problem = mm.MatmulProblem(64, 64, 64, in_dtype)
        assert problem.out_dtype == out == mm.make_problem(64, 64, 64, in_dtype).out_dtype
    assert mm.MatmulProblem(64, 64, 64, "bf16", "float32").out_dtype == "float32"  # given: kept
    assert mm.MatmulProblem(64, 64, 64) == mm.MatmulProblem(64, 64, 64, "float16", "float16")
    from carver import MatmulTemplate

    assert MatmulTemplate(64, 64, 64, in_dtype="bfloat16").problem.out_dtype == "bfloat16"


def test_candidates_take_a_gpu_name_as_check_and_the_gemv_family_do():
    p = mm.MatmulProblem(4096, 4096, 4096)
    assert mm.MATMUL.candidates(p, "H100", 4) == mm.MATMUL.candidates(p, CUDA("H100"), 4)
    assert mm.MATMUL.candidates(p, "A100-80GB", 2) == mm.MATMUL.candidates(p, CUDA("A100-80GB"), 2)


def test_a_split_k_below_the_limit_that_leaves_a_split_empty_is_neither_proposed_nor_advised():
    """K=1000 in 128-wide tiles splits 2, 3, 4 and 8 ways, not 5-7 (each split takes ceil(K / s) rounded up to
    whole tiles): the rule's fix names a split that works, and the candidates hold none of the gap (A100,
    1x1000x1000 proposed split_k=6 before)."""
    from carver.arch import CUDA
    from carver.validity import split_has_work
    from templates.matmul.space import candidates

    assert [s for s in range(1, 10) if split_has_work(1000, 128, s)] == [1, 2, 3, 4, 8]
    with pytest.raises(ValueError, match=r"split_k=6 leaves a split with no work .* use split_k=4 or 8"):
        mm.check_config(1000, "float16", 64, 64, 128, 2, 128, True, 10, 6)
    with pytest.raises(ValueError, match=r"split_k=9 leaves a split with no work .* use split_k <= 8"):
        mm.check_config(1000, "float16", 64, 64, 128, 2, 128, True, 10, 9)
    for arch in ("A100-80GB", "H200"):
        p = mm.make_problem(1, 1000, 1000)
        for c in candidates(p, CUDA(arch), 4):
            assert not mm.check(p, c, CUDA(arch)), c


@pytest.mark.parametrize("M,N,variant", [(1664, 4096, "pipelined"), (2304, 7168, "pipelined"),
                                         (2560, 14336, "pipelined"), (2048, 4096, "ws")])
def test_persistent_loops_lower_where_tilelangs_threadsync_failed(M, N, variant):
    """128x256 tiles on 132 persistent CTAs, grids on which TileLang 0.1.15's ThreadSync could not lower C's store
    sync ("... inside a divergent region with N participating threads") while the loops tested each tile's decoded
    coordinates. They test its index now (the same tiles); a sweep of 88 grids x 3 persistent loops lowered
    (2026-12-07). Lowered for sm_90a without nvcc."""
    from tilelang.engine.lower import lower
    from tvm.target import Target

    cfg = dict(BEST, warp_policy="full_row", persistent=132, variant=variant)
    target = Target(SM90A)
    with target:
        artifact = lower(mm.kernel(M, N, 1024, **cfg), target=target)
    assert "main_kernel" in artifact.kernel_source
