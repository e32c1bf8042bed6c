"""The attention family: offline logic, compile-only for sm_90a and sm_80 (nvcc), runs on a GPU (gpu)."""

from __future__ import annotations

import dataclasses
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from carver.arch import CUDA
from carver.attention import AttentionTemplate, check_attention_config
from templates import attention
from templates.attention import ATTENTION, AttentionConfig, AttentionProblem
from templates.attention.fastmath import FAST_EXP2
from templates.attention.space import PER_BLOCK, WS_TOP, ws_space
from templates.protocol import CUDAUnavailableError, Template, TuneOptions

LLAMA = dict(batch=2, heads=32, seq_len=4096, dim=128, kv_heads=8)


def cfg(bm: int, bn: int, stages: int, threads: int) -> AttentionConfig:
    return AttentionConfig(block_M=bm, block_N=bn, num_stages=stages, threads=threads)


# -------------------------------------------------------------------------------- offline logic
def test_problem_is_validated_with_value_and_fix():
    p = AttentionProblem(2, 32, 1000, 128, kv_heads=8, causal=True, dtype="bf16")
    assert (p.kv_heads, p.groups, p.dtype) == (8, 4, "bfloat16")
    assert AttentionProblem(1, 4, 10, 64).kv_heads == 4
    with pytest.raises(ValueError, match=r"dim must be one of \[64, 128\].*got 96.*pad the head dim"):
        AttentionProblem(1, 4, 1000, 96)
    for dim in (64.0, True, "64"):  # a head dim is an int like every other size, not something equal to one
        with pytest.raises(ValueError, match=r"dim must be a positive int, got .*it must be an int"):
            AttentionProblem(1, 4, 1000, dim)
    with pytest.raises(ValueError, match="heads=32 must be a multiple of kv_heads=5"):
        AttentionProblem(1, 32, 1000, 64, kv_heads=5)
    with pytest.raises(ValueError, match=r"dtype must be one of \['float16', 'bfloat16'\], got 'float32'"):
        AttentionProblem(1, 4, 1000, 64, dtype="float32")
    with pytest.raises(ValueError, match="seq_len must be a positive int, got 0"):
        AttentionProblem(1, 4, 0, 64)
    with pytest.raises(ValueError, match="batch must be at most 65535"):
        AttentionProblem(70000, 1, 16, 64)
    with pytest.raises(TypeError, match="causal must be a bool"):
        AttentionProblem(1, 4, 16, 64, causal="yes")


def test_flops_count_the_unmasked_pairs():
    full = AttentionProblem(2, 8, 1000, 64)
    causal = AttentionProblem(2, 8, 1000, 64, causal=True)
    assert full.flops == 4 * 2 * 8 * 1000 * 1000 * 64
    assert causal.flops == 4 * 2 * 8 * (1000 * 1001 // 2) * 64
    assert causal.flops / full.flops == pytest.approx(0.5, abs=1e-3)


def test_config_is_validated_and_round_trips():
    c = AttentionConfig.from_dict({"block_M": 128, "block_N": 64, "num_stages": 2, "threads": 256})
    assert c.to_dict() == {"block_M": 128, "block_N": 64, "num_stages": 2, "threads": 256}
    assert AttentionConfig.from_dict(c.to_dict()) == c and hash(AttentionConfig.from_dict(c.to_dict())) == hash(c)
    with pytest.raises(ValueError, match=r"threads must be a multiple of 32, got 100; use 128 or 256"):
        cfg(64, 64, 2, 100)
    with pytest.raises(ValueError, match="block_M must be a multiple of 16, got 40"):
        cfg(40, 64, 2, 128)
    with pytest.raises(ValueError, match="num_stages must be at most 4"):
        cfg(64, 64, 9, 128)
    with pytest.raises(ValueError, match="unknown config key"):
        AttentionConfig.from_dict({**c.to_dict(), "block_K": 32})
    with pytest.raises(ValueError, match="unknown config key"):  # the removed overlap knob (docs/attention.md)
        AttentionConfig.from_dict({**c.to_dict(), "overlap": True})
    assert "unknown key(s) ['overlap']" in check_attention_config(AttentionProblem(**LLAMA), {**c.to_dict(),
                                                                                              "overlap": False})[0]


def test_check_names_the_rule_and_the_fix():
    p = AttentionProblem(**LLAMA)
    h100, a100 = CUDA("H100"), CUDA("A100-80GB")
    (why,) = ATTENTION.check(p, cfg(64, 64, 2, 256))
    assert "block_M must be a multiple of 128" in why and "use threads=128" in why
    why = ATTENTION.check(p, cfg(128, 128, 4, 256), a100)  # 32 KB of Q + 4 x 64 KB of K and V
    assert any("KB of shared memory" in w and "over the 163 KB" in w and "fewer num_stages" in w for w in why)
    why = ATTENTION.check(p, cfg(128, 128, 2, 128), h100)
    assert any("registers per thread" in w and "more threads" in w for w in why)
    causal = AttentionProblem(**LLAMA, causal=True)
    assert any("use num_stages=1" in w for w in ATTENTION.check(causal, cfg(64, 64, 2, 128), a100))
    assert ATTENTION.check(causal, cfg(64, 64, 1, 128), a100) == []
    assert ATTENTION.check(causal, cfg(64, 64, 2, 128), h100) == []  # TMA: no cp.async pipeline
    with pytest.raises(ValueError, match="block_M must be a multiple of 128"):
        ATTENTION.as_config(p, {"block_M": 64, "block_N": 64, "num_stages": 2, "threads": 256})
    assert check_attention_config(p, {"block_M": 64}) and "missing" in check_attention_config(p, {"block_M": 64})[0]


@pytest.mark.parametrize("shape", [dict(LLAMA), dict(LLAMA, causal=True, dim=64), dict(batch=1, heads=4, seq_len=1,
                                                                                         dim=64)])
def test_space_is_legal_and_is_what_the_carver_ranks(shape):
    p = AttentionProblem(**shape)
    space = ATTENTION.space(p)
    assert len(space) == 27 and len(set(space)) == len(space)  # 36, less block_M=64 with 8 warps
    assert all(ATTENTION.check(p, c) == [] for c in space)
    assert {c.block_N for c in space} == {32, 64, 128} and {c.num_stages for c in space} == {1, 2, 3}
    for arch in ("H100", "A100-80GB"):
        tmpl = attention.carver_template(p, arch)
        ranking = tmpl.rank(c.kernel_kwargs() for c in space)
        legal = [c for c in space if not ATTENTION.check(p, c, CUDA(arch))]
        assert sorted(map(str, ranking.configs)) == sorted(str(c.kernel_kwargs()) for c in legal)
        assert len(ranking.dropped) == len(space) - len(legal)


@pytest.mark.parametrize("arch", ["H100", "H200", "A100-80GB"])
def test_candidates_are_ranked_deterministic_and_quick(arch):
    p = AttentionProblem(**LLAMA, causal=True)
    tmpl = AttentionTemplate(p).with_arch(arch)
    t = time.perf_counter()
    hints = tmpl.recommend_hints(8)
    ms = (time.perf_counter() - t) * 1e3
    print(f"attention recommend_hints(8) {arch}: {ms:.1f} ms")  # the bound is 50 ms on a workstation
    assert ms < 200
    top = ATTENTION.candidates(p, CUDA(arch), 8, variants=False)  # the ws variant's: test_attention_ws.py
    assert top == ATTENTION.candidates(p, CUDA(arch), 8, variants=False)
    legal = [c for c in ATTENTION.space(p) if not ATTENTION.check(p, c, CUDA(arch))]
    assert len(top) == min(8, len(legal)) == len(set(top)) and all(c in legal for c in top)
    assert all(ATTENTION.check(p, c, CUDA(arch)) == [] for c in top)
    assert top[0] == AttentionConfig(**hints[0].to_config())
    assert [h.predicted_ms for h in hints] == sorted(h.predicted_ms for h in hints)
    shapes = [(c.block_M, c.block_N) for c in top]
    assert max(shapes.count(s) for s in shapes) <= PER_BLOCK
    with pytest.raises(ValueError, match="pass arch"):
        ATTENTION.candidates(p, None, 8, variants=False)


def test_model_is_monotone_where_physics_says_so():
    h100 = CUDA("H100")
    c = cfg(128, 128, 2, 256).kernel_kwargs()
    full = AttentionTemplate(AttentionProblem(**LLAMA)).with_arch(h100).predict(c)
    causal = AttentionTemplate(AttentionProblem(**LLAMA, causal=True)).with_arch(h100).predict(c)
    longer = AttentionTemplate(AttentionProblem(**dict(LLAMA, seq_len=8192))).with_arch(h100).predict(c)
    assert 0.4 < causal.latency_ms / full.latency_ms < 0.65
    assert 3.0 < longer.latency_ms / full.latency_ms < 5.0
    assert 100 < full.tflops < 989 and full.warp_specialized and full.errors == ()
    a100 = AttentionTemplate(AttentionProblem(**LLAMA)).with_arch("A100-80GB")
    bad = a100.predict(cfg(128, 128, 4, 256).kernel_kwargs())
    assert bad.errors and bad.latency_ms > 0


def test_stages_pay_off_only_where_loads_are_exposed():
    """The producer's separate K and V barriers hide the loads of a long step at num_stages=1 (kv_lead);
    a short step (dim 64, 32 keys) is latency-bound there, so a second stage pays for its rotation cost."""
    tmpl = AttentionTemplate(AttentionProblem(4, 32, 2048, 64)).with_arch("H200")
    big = [tmpl.predict(cfg(128, 128, s, 256).kernel_kwargs()) for s in (1, 2)]
    assert big[0].pipeline_us < big[0].step_us and big[0].latency_ms <= big[1].latency_ms
    small = [tmpl.predict(cfg(64, 32, s, 128).kernel_kwargs()) for s in (1, 2)]
    assert small[1].latency_ms < 0.97 * small[0].latency_ms


DATA = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "attention-2026-11-21-h200"


def test_calibrated_constants_order_the_h200_grids():
    """The shipped Hopper constants are calibrate_attention's fit of grid/ and rank holdout/ (never fitted)
    with the best config first; the removed overlap configs in the files are skipped and counted."""
    pytest.importorskip("scipy", reason="the calibration tool needs scipy")
    from carver import calibrate_attention as ca
    from carver.attention import ATTENTION_CONSTANTS

    h200 = CUDA("H200")
    grid, held = ca.load_grids(f"{DATA}/grid", h200), ca.load_grids(f"{DATA}/holdout", h200)
    assert (len(grid), len(held)) == (4, 2) and all(g.unknown == 9 and len(g.configs) >= 21 for g in grid + held)
    shipped = ATTENTION_CONSTANTS["hopper"]
    for g in grid + held:
        s = ca.score(g, h200, shipped)
        assert s["top1"] == 1.0 and s["top8"] == 1.0 and s["spearman"] > 0.9, (g.name, s)
    refit = ca.fit(grid, h200, shipped)
    for name in ca.FREE:
        assert getattr(refit, name) == pytest.approx(getattr(shipped, name), rel=0.05, abs=1e-3), name


def _naive(Q, K, V, causal):
    import torch

    g = Q.shape[2] // K.shape[2]
    k, v = K.float().repeat_interleave(g, dim=2), V.float().repeat_interleave(g, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", Q.float(), k) / Q.shape[-1] ** 0.5
    if causal:
        S = Q.shape[1]
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bhqk,bkhd->bqhd", s.softmax(-1), v)


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_chunked_sdpa_math(causal, monkeypatch):
    import torch

    from templates.attention import reference as ref_mod

    monkeypatch.setattr(ref_mod, "CHUNK_BYTES", 4 * 33 * 2 * 4)  # 2 query heads per KV head: 4 rows a chunk
    gen = torch.Generator().manual_seed(0)
    Q = torch.randn(2, 33, 4, 64, generator=gen).to(torch.bfloat16)
    K, V = (torch.randn(2, 33, 2, 64, generator=gen).to(torch.bfloat16) for _ in range(2))
    out = attention.ref_program(Q, K, V, causal=causal)
    assert out.dtype == torch.bfloat16 and out.shape == Q.shape
    torch.testing.assert_close(out.float(), _naive(Q, K, V, causal), atol=4e-3, rtol=4e-3)
    assert ATTENTION.reference(AttentionProblem(2, 4, 33, 64, 2, causal)).keywords == {"causal": causal}


def test_template_protocol_and_no_gpu_path():
    import torch

    assert isinstance(ATTENTION, Template)
    p = AttentionProblem(**LLAMA)
    with pytest.raises(TypeError, match="AttentionProblem"):
        ATTENTION.tune((1, 4, 16, 64))
    with pytest.raises(ValueError, match="C target"):
        ATTENTION.resolve(p, "c")
    tuner = ATTENTION.tuner(p, TuneOptions(target="sm_90a", topk=4))
    assert len(tuner.configs) == 4 + WS_TOP  # the carver's top 4, then the ws variant's best on Hopper
    assert [c.get("variant", "pipelined") for c in tuner.configs] == ["pipelined"] * 4 + ["ws"] * WS_TOP
    plain = ATTENTION.tuner(p, TuneOptions(target="sm_90a", topk=4, variants=False))
    assert len(plain.configs) == 4
    func = attention.kernel(1, 4, 100, 64, 64, 32, 2, 128, causal=True)  # builds, compiles nothing
    assert [str(b.dtype) for b in func.buffer_map.values()] == ["float16"] * 4
    with pytest.raises(ValueError, match="use threads=128"):
        attention.kernel(1, 4, 100, 64, 64, 32, 2, 256)
    if not torch.cuda.is_available():
        with pytest.raises(CUDAUnavailableError, match="sm_90a"):
            attention.tune(1, 4, 1000, 64, topk=2)


@pytest.mark.parametrize("causal, seq_len, masked", [(True, 300, True), (False, 300, True), (False, 256, False)])
def test_the_plain_programs_mask_replaces_the_score_after_the_product(causal, seq_len, masked):
    """The mask keeps ``Q K^T``'s score or puts -inf in its place, after a product that starts from zero
    (``clear_accum``). It once seeded the tile with 0 or -inf for the product to accumulate onto, and -inf + NaN is
    NaN: a NaN in a key a causal row does not see made the row NaN (the GPU test below). Without a tail or the
    causal mask nothing is masked."""
    p = AttentionProblem(1, 4, seq_len, 64, kv_heads=2, causal=causal)
    script = ATTENTION.program(p, cfg(128, 128, 2, 256)).script()
    qk = next(line for line in script.splitlines() if "T.gemm(" in line and "Q_shared" in line)
    assert re.search(r"T\.bool\(True\), 0, 0, 0\)$", qk.strip()), qk  # clear_accum
    masks = [line.strip() for line in script.splitlines() if "acc_s[i, j] = T.if_then_else(" in line]
    assert len(masks) == masked
    assert all(", acc_s[i, j], T.infinity(" in m for m in masks), masks  # keep the score or put -inf


# -------------------------------------------------------------------------------- nvcc: sm_90a, sm_80
def assert_fast_softmax(src: str) -> None:
    """The softmax's exponentials are the one-instruction ``ex2.approx.ftz`` (CUDA's ``exp2f`` adds a
    denormal fix-up of three instructions per score), and O is normalised by one reciprocal per row, not
    by a division per element: every division left divides the constant 1."""
    assert "ex2.approx.ftz.f32" in src and src.count(f"{FAST_EXP2}(") >= 3 and "exp2f(" not in src
    code = re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", src, flags=re.S))
    ones = set(re.findall(r"(\w+) = 0x1p\+0f;", code))
    numerators = re.findall(r"\((\w+)\.[xy]\s*/", code)
    assert numerators, "no division at all: how is O normalised?"
    for v in numerators:  # float2 v = make_float2(one, one);
        m = re.search(rf"float2 {v} = make_float2\((\w+), \1\);", code)
        assert m and m.group(1) in ones, f"{v} divides something other than 1"


@pytest.mark.nvcc
def test_compiles_for_sm90a_mha_tail():
    """MHA, dim 64, seq_len 1001 (no block divides it): TMA loads (zero-filled past the end), the -inf
    mask on keys >= 1001, the TMA store that drops rows past the end."""
    k = attention.compile(1, 4, 1001, 64, config=cfg(128, 64, 2, 256).to_dict(), target="sm_90a")
    src = k.get_kernel_source()
    assert "tma_load(K_desc" in src and "tma_load(V_desc" in src and "tma_store(Output_desc" in src
    assert "wgmma" in src and "-CUDART_INF_F" in src and "< 1001)" in src
    assert_fast_softmax(src)


@pytest.mark.nvcc
def test_compiles_for_sm90a_gqa_causal_bf16():
    k = attention.compile(1, 32, 1000, 128, kv_heads=8, causal=True, dtype="bfloat16",
                          config=cfg(128, 128, 2, 256).to_dict(), target="sm_90a")
    src = k.get_kernel_source()
    assert "kBFloat16" in src and "wgmma" in src and "tma_load(K_desc" in src
    assert "((int)blockIdx.y) >> 2)" in src  # query head h reads KV head h // 4
    assert_fast_softmax(src)


@pytest.mark.nvcc
def test_compiles_for_sm80_causal():
    """Ampere: mma.sync and cp.async with zero-filled tail loads; the output store is guarded."""
    k = attention.compile(1, 4, 1001, 64, causal=True, config=cfg(64, 64, 1, 128).to_dict(), target="sm_80")
    src = k.get_kernel_source()
    assert "tl::mma_sync" in src and "tl::wgmma" not in src and "cp_async_gs_conditional" in src
    assert re.search(r"< 1001\)+ \{\s*\*\(uint4\*\)\(Output \+", src), "the O store is not guarded"
    assert_fast_softmax(src)


# -------------------------------------------------------------------------------- on a GPU
GPU_SHAPES = [
    dict(batch=1, heads=4, seq_len=1000, dim=64),
    dict(batch=2, heads=8, seq_len=777, dim=128, kv_heads=2, causal=True, dtype="bfloat16"),
    dict(batch=1, heads=32, seq_len=1025, dim=128, kv_heads=8, causal=True),
    dict(batch=2, heads=4, seq_len=513, dim=64, causal=False, dtype="bfloat16"),
    dict(batch=1, heads=2, seq_len=40, dim=64, causal=True),  # shorter than every block
    dict(batch=1, heads=4, seq_len=1024, dim=128, kv_heads=2),  # no mask at all: only clear_accum starts the scores
]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: AttentionProblem(**s).describe().replace(" ", "-"))
def test_runs_and_matches_the_fp32_reference(shape):
    import torch

    p = AttentionProblem(**shape)
    arch = CUDA("cuda")
    dt = getattr(torch, p.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    Q = torch.randn(p.batch, p.seq_len, p.heads, p.dim, device="cuda", generator=gen).to(dt)
    K, V = (torch.randn(p.batch, p.seq_len, p.kv_heads, p.dim, device="cuda", generator=gen).to(dt) for _ in "KV")
    ref = attention.ref_program(Q, K, V, causal=p.causal).float()
    configs = ATTENTION.candidates(p, arch, 2)
    configs += [c for c in ATTENTION.space(p)[::12] if not ATTENTION.check(p, c, arch) and c not in configs]
    for c in configs:
        out = ATTENTION.compile(p, c)(Q, K, V)
        bad = int((~torch.isclose(out.float(), ref, atol=1e-2, rtol=1e-2)).sum())
        assert bad == 0, (str(c), bad, float((out.float() - ref).abs().max()))


HOSTILE_SHAPES = [
    dict(batch=1, heads=4, seq_len=300, dim=64, kv_heads=2, causal=True),
    dict(batch=1, heads=4, seq_len=300, dim=128, kv_heads=2, causal=False),
    dict(batch=2, heads=4, seq_len=300, dim=128, kv_heads=2, causal=True, dtype="bfloat16"),
]


def attention_by_definition(Q, K, V, causal):
    """softmax(Q K^T / sqrt(D)) V in fp32, with the causal mask *replacing* the scores of the keys a row does not
    see: the definition, whatever those keys hold. (torch's SDPA math path adds its mask, -inf + NaN = NaN, so a NaN
    in a key a causal row does not see makes that row NaN there too; measured on an H200, torch 2.11.)"""
    import torch

    groups = Q.shape[2] // K.shape[2]
    q, k, v = Q.float(), K.float().repeat_interleave(groups, 2), V.float().repeat_interleave(groups, 2)
    s = torch.einsum("bihd,bjhd->bhij", q, k) / Q.shape[3] ** 0.5
    if causal:
        S = Q.shape[1]
        s = s.masked_fill(~torch.ones(S, S, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", HOSTILE_SHAPES, ids=lambda s: AttentionProblem(**s).describe().replace(" ", "-"))
def test_nan_and_inf_in_the_inputs_reach_exactly_the_outputs_that_see_them(shape):
    """A NaN in Q, K or V, or an inf in Q or K, makes NaN the outputs whose rows see it, in both programs, and no
    other output: a causal query row that does not see a key (the key's block's earlier rows; in a preallocated
    cache, the future keys hold whatever memory holds) stays finite, as attention is defined
    (:func:`attention_by_definition`). The plain program once added its mask onto the product (-inf + NaN = NaN) and
    made those rows NaN; it now replaces the score, as the ws program does. (A NaN in V at a key a causal row does not
    see is left out: 0 x NaN = NaN in every ``P V`` that multiplies the key's block, the kernels' for the CTAs that
    visit it, the reference's dense one for every row.) Without NaN and inf, the definition is the fp32 reference
    tuning checks against."""
    import torch

    p = AttentionProblem(**shape)
    dt = getattr(torch, p.dtype)
    gen = torch.Generator(device="cuda").manual_seed(1)
    Q = torch.randn(p.batch, p.seq_len, p.heads, p.dim, device="cuda", generator=gen).to(dt)
    K, V = (torch.randn(p.batch, p.seq_len, p.kv_heads, p.dim, device="cuda", generator=gen).to(dt) for _ in "KV")
    clean = attention_by_definition(Q, K, V, p.causal)
    assert torch.allclose(clean, attention.ref_program(Q, K, V, causal=p.causal).float(), atol=1e-2, rtol=1e-2)
    K[0, 70, 0, 3] = float("nan")  # with 64 or 128 keys a block, rows 64-69 or 0-69 share its block and do not see it
    K[0, 200, 1, 5] = float("inf")  # +inf or -inf scores, by the sign of each query's element 5
    Q[0, 33, 2, 0] = float("inf")  # a row of a head reading KV head 1, before key 200
    if not p.causal:
        V[0, 150, 1, 7] = float("nan")
    want = attention_by_definition(Q, K, V, p.causal)
    nan = torch.isnan(want)
    assert nan.any() and not nan.all() and not torch.isinf(want).any()
    if p.causal:  # the rows before key 70 of the heads reading KV head 0 are finite, those after are NaN
        assert not nan[0, :70, :p.groups].any() and nan[0, 70:, :p.groups].all()
    configs = [cfg(128, 128, 2, 256), cfg(64, 64, 1, 128)]
    if torch.cuda.get_device_capability() == (9, 0):  # the ws program: two and three consumer warpgroups, persistent
        ws = dict(variant="ws", num_stages=2)
        configs += [AttentionConfig(block_M=128, block_N=128, threads=256, **ws),
                    AttentionConfig(block_M=128, block_N=64, threads=256, persistent=3, **ws),
                    AttentionConfig(block_M=192, block_N=64 if p.dim == 128 else 128, threads=384, **ws),
                    AttentionConfig(block_M=192, block_N=64, threads=384, persistent=2, **ws)]
        # pack_gqa: both query heads of a KV head in one tile, so a masked key's rows come from two heads
        configs += [dataclasses.replace(c, pack_gqa=True) for c in configs if c.variant == "ws"]
    configs = [c for c in configs if not ATTENTION.check(p, c, CUDA("cuda"))]  # a GPU with less shared memory
    assert configs
    with ThreadPoolExecutor(len(configs)) as pool:  # nvcc runs in subprocesses: the compiles overlap
        kernels = list(pool.map(lambda c: ATTENTION.compile(p, c), configs))
    for c, kern in zip(configs, kernels):
        out = kern(Q, K, V).float()
        assert torch.equal(torch.isnan(out), nan), (str(c), int((torch.isnan(out) != nan).sum()))
        ok = ~nan
        bad = int((~torch.isclose(out[ok], want[ok], atol=1e-2, rtol=1e-2)).sum())
        assert bad == 0, (str(c), bad)


@pytest.mark.gpu
def test_tune_end_to_end():
    import torch

    k = attention.tune(1, 8, 1000, 128, kv_heads=2, causal=True, topk=3, rep=5)
    Q = torch.randn(1, 1000, 8, 128, device="cuda").half()
    K, V = (torch.randn(1, 1000, 2, 128, device="cuda").half() for _ in "KV")
    ref = attention.ref_program(Q, K, V, causal=True).float()
    assert torch.allclose(k(Q, K, V).float(), ref, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("topk", [0, -1, True, 2.5])
def test_candidates_refuse_a_topk_that_is_not_a_positive_int_as_matmul_does(topk):
    with pytest.raises(ValueError, match=f"topk must be a positive int, got {topk!r}"):
        ATTENTION.candidates(AttentionProblem(**LLAMA), CUDA("H100"), topk)


def test_a_gpu_name_is_taken_wherever_an_arch_is():
    p = AttentionProblem(**LLAMA, causal=True)
    assert ATTENTION.candidates(p, "H100", 8) == ATTENTION.candidates(p, CUDA("H100"), 8)
    c = cfg(64, 64, 2, 128)
    assert ATTENTION.check(p, c, "A100-80GB") == ATTENTION.check(p, c, CUDA("A100-80GB")) != []
    assert ws_space(p, "H100") == ws_space(p, CUDA("H100"))
