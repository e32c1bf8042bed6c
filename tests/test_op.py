"""The drop-in matmul op (templates/matmul/op.py): ``Linear`` against ``torch.nn.Linear``, the CPU
fallback, the custom op's fake and autograd registrations, key and bucket routing; the kernels
compiled for sm_90a with a symbolic M (nvcc); outputs, torch.compile and the example on a GPU."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from carver.arch import CUDA
from templates import matmul as mm
from templates.gemv.api import GEMV
from templates.gemv.config import GemvProblem
from templates.matmul import op as mop

ROOT = Path(__file__).parents[1]
SM90 = {"kind": "cuda", "arch": "sm_90a"}


# ------------------------------------------------------------------------------------ the module
@pytest.mark.parametrize("bias", [True, False])
def test_linear_has_nn_linears_constructor_parameters_and_state_dict(bias):
    torch.manual_seed(0)
    ref = torch.nn.Linear(48, 24, bias=bias, dtype=torch.float64)
    torch.manual_seed(0)
    lin = mm.Linear(48, 24, bias=bias, dtype=torch.float64)
    assert isinstance(lin, torch.nn.Linear) and repr(lin) == repr(ref)
    assert list(lin.state_dict()) == list(ref.state_dict()) == (["weight", "bias"] if bias else ["weight"])
    for k, v in ref.state_dict().items():
        assert torch.equal(lin.state_dict()[k], v) and lin.state_dict()[k].dtype == torch.float64
    other = torch.nn.Linear(48, 24, bias=bias)
    other.load_state_dict(lin.state_dict())  # both ways
    lin.load_state_dict(torch.nn.Linear(48, 24, bias=bias, dtype=torch.float64).state_dict())
    assert mm.Linear(3, 5, device="meta").weight.device.type == "meta"


@pytest.mark.parametrize("shape", [(7, 48), (2, 3, 48), (48,), (0, 48)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_fallback_gives_nn_linears_outputs_and_gradients(shape, dtype):
    torch.manual_seed(1)
    ref = torch.nn.Linear(48, 24, dtype=dtype)
    lin = mm.Linear.from_linear(ref)
    assert lin.weight is ref.weight and lin.bias is ref.bias
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y, y_ref = lin(x), ref(x2)
    assert torch.equal(y, y_ref)
    if y.numel():
        w_grad_ref = torch.autograd.grad(y_ref.sum(), ref.weight)[0]
        y.sum().backward()
        y_ref2 = ref(x2)
        y_ref2.sum().backward()
        assert torch.equal(x.grad, x2.grad) and torch.allclose(ref.weight.grad, 2 * w_grad_ref)
    with torch.no_grad():  # the eager path without the dispatcher
        assert torch.equal(lin(x), ref(x))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        lin(torch.randn(3, 47, dtype=dtype))


@pytest.mark.parametrize("compiled", [False, True])
def test_an_in_place_op_on_the_output_of_a_batched_input_trains_as_with_nn_linear(compiled):
    """The op takes and returns 2-D tensors; the batch dims are a view made outside it, which autograd lets
    ReLU(inplace=True) change (a view made inside a custom op's output it would not). Compiled, the op runs."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(inplace=True), torch.nn.Linear(32, 8))
    mine = torch.nn.Sequential(mm.Linear.from_linear(ref[0]), torch.nn.ReLU(inplace=True),
                               mm.Linear.from_linear(ref[2]))
    x = torch.randn(2, 5, 16, requires_grad=True)
    run = torch.compile(mine, backend="aot_eager") if compiled else mine
    torch._dynamo.reset()
    y = run(x)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    (gx_ref,) = torch.autograd.grad(ref(x).square().sum(), x)
    torch.testing.assert_close(y, ref(x))
    torch.testing.assert_close(gx, gx_ref)


def test_torch_func_transforms_work_as_with_nn_linear():
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4)
    lin = mm.Linear.from_linear(ref)
    params = {k: v.detach() for k, v in ref.named_parameters()}
    x = torch.randn(5, 8)

    def loss(module, p, xs):
        return torch.func.functional_call(module, p, (xs,)).square().sum()

    for f in (lambda m: torch.func.grad(lambda p: loss(m, p, x))(params),
              lambda m: torch.func.vmap(torch.func.grad(lambda p, xi: loss(m, p, xi[None])), in_dims=(None, 0))(
                  params, x)):
        got, want = f(lin), f(ref)
        for k in want:
            torch.testing.assert_close(got[k], want[k])


def test_the_fallback_is_said_once_at_info(caplog):
    mop._SAID.clear()
    lin = mm.Linear(16, 8)
    with caplog.at_level(logging.INFO, logger="templates.matmul.op"):
        for _ in range(3):
            lin(torch.randn(4, 16))
    said = [r for r in caplog.records if "falling back to torch.nn.functional.linear" in r.getMessage()]
    assert len(said) == 1 and "not CUDA" in said[0].getMessage() and said[0].levelno == logging.INFO


class _FakeKeyed:
    """A keyed kernel whose kernels compute in fp64 on the CPU; counts what the op asks of it."""

    def __init__(self):
        self.asked: list[tuple] = []

    def kernel_for_values(self, values):
        self.asked.append(values)
        return self

    def launch_checked(self, x, w):  # what the op calls on a served kernel (autotuner.served.ServedKernel)
        return (x.double() @ w.double().T).to(x.dtype)


def test_a_call_signature_is_decided_once_and_its_kernel_asked_for_every_call(monkeypatch):
    """The op's short path (templates/matmul/op.py _forward): the checks run once per call signature, the
    keyed kernel is asked for its kernel on every call (so a table loaded later is seen), leading dims and
    a bias are handled, and another op (configure) or another weight layout is decided again."""
    decided, fake = [], _FakeKeyed()
    real_decide = mop._decide

    def decide(op, x, w, b):
        decided.append((tuple(x.shape), tuple(w.shape), w.is_contiguous(), b is not None))
        out = real_decide(op, x, w, b)  # on the CPU: a fallback reason
        if not isinstance(out, str) or "not CUDA" not in out:
            return out
        M, K = x.numel() // w.shape[1], w.shape[1]
        return fake, (M, w.shape[0], K, x.dtype)  # as a CUDA call would be decided

    monkeypatch.setattr(mop, "_decide", decide)
    monkeypatch.setattr(mop, "_DECIDED", {})
    before = mop.get_op()
    try:
        w, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(8, dtype=torch.float16)
        x2, x3 = torch.randn(4, 16, dtype=torch.float16), torch.randn(2, 3, 16, dtype=torch.float16)
        for _ in range(3):
            torch.testing.assert_close(mop._forward(x2, w, None), (x2.double() @ w.double().T).half())
            torch.testing.assert_close(mop._forward(x3, w, b), (x3.double() @ w.double().T).half() + b)
        assert decided == [((4, 16), (8, 16), True, False), ((2, 3, 16), (8, 16), True, True)]
        assert fake.asked == [(4, 8, 16, torch.float16), (6, 8, 16, torch.float16)] * 3
        torch.testing.assert_close(mop._forward(x2, w.T.contiguous().T, None), x2 @ w.T)  # non-contiguous weight
        mop.configure(topk=2)  # another op: decided again
        mop._forward(x2, w, None)
        assert decided[2:] == [((4, 16), (8, 16), False, False), ((4, 16), (8, 16), True, False)]
    finally:
        mop._OP[0] = before


# ------------------------------------------------------------------------------------ the custom op
def test_the_fake_impl_gives_shapes_and_dtypes_without_running():
    with FakeTensorMode():
        for lead, dtype in (((5,), torch.float16), ((2, 7), torch.bfloat16), ((), torch.float16)):
            x = torch.empty(*lead, 64, dtype=dtype, device="cuda")
            w = torch.empty(32, 64, dtype=dtype, device="cuda")
            y = torch.ops.tilecarve.matmul(x, w, torch.empty(32, dtype=dtype, device="cuda"))
            assert (tuple(y.shape), y.dtype, y.device.type) == ((*lead, 32), dtype, "cuda")


@pytest.mark.parametrize("bias", [True, False])
def test_opcheck(bias):
    w = torch.randn(24, 48, requires_grad=True)
    b = torch.randn(24, requires_grad=True) if bias else None
    for x in (torch.randn(5, 48, requires_grad=True), torch.randn(2, 3, 48)):
        result = torch.library.opcheck(torch.ops.tilecarve.matmul.default, (x, w, b))
        assert set(result.values()) == {"SUCCESS"}, result


def test_torch_compile_traces_the_op_without_a_graph_break():
    torch._dynamo.reset()
    block = torch.nn.Sequential(mm.Linear(32, 64, bias=False), torch.nn.SiLU(), mm.Linear(64, 32)).requires_grad_(False)
    x = torch.randn(6, 32)
    explain = torch._dynamo.explain(block)(x)
    assert explain.graph_break_count == 0 and explain.graph_count == 1, explain.break_reasons
    ops = [n.target for g in explain.graphs for n in g.graph.nodes if n.op == "call_function"]
    mine = (torch.ops.tilecarve.matmul, torch.ops.tilecarve.matmul.default)
    assert sum(t in mine for t in ops) == 2, ops
    torch.testing.assert_close(torch.compile(block)(x), block(x))


# ------------------------------------------------------------------------------------ keys and buckets
def test_routing_keys_buckets_and_fallback_configs():
    op = mop.MatmulOp(target=SM90)
    assert [op.kernel(m).name for m in (1, 16, 17, 4096)] == [mop.GEMV_NAME] * 2 + [mop.GEMM_NAME] * 2
    assert mop.MatmulOp(target=SM90, gemv_max_m=0).kernel(1).name == mop.GEMM_NAME
    assert op.gemm.dynamic == ("M",) and op.gemv.dynamic == ()
    key = {"M": 100, "N": 14336, "K": 4096, "dtype": torch.float16}
    assert op.gemm.make_key(key) == {**key, "M": 128, "dtype": "float16"}
    assert op.gemv.make_key({**key, "M": 3})["M"] == 4 and op.gemm.make_key({**key, "M": 10**6})["M"] == 65536
    arch = CUDA("sm_90a")
    top1 = mm.MATMUL.candidates(mm.MatmulProblem(128, 14336, 4096), arch, 1)[0].to_dict()
    assert op.gemm.config_for(key) == (top1, "fallback")  # the carver's top-1 at the bucket's edge
    gtop1 = GEMV.candidates(GemvProblem(4, 14336, 4096), arch, 4)[0].to_dict()
    assert op.gemv.config_for({**key, "M": 3}) == (gtop1, "fallback")
    assert op.refusal(128, 14336, 4096, "float16") is None
    assert "2**31 - 1" in op.refusal(2**31, 8, 8, "float16")
    with pytest.raises(ValueError, match="gemv_max_m must be 0"):
        mop.MatmulOp(gemv_max_m=3)
    with pytest.raises(ValueError, match="topk must be a positive int, got 0"):
        mop.configure(topk=0)


def test_the_ops_kernels_time_candidates_in_groups_back_to_back_unless_told_otherwise():
    key = {"M": 128, "N": 4096, "K": 14336, "dtype": "float16"}
    op = mop.MatmulOp(target=SM90)
    for kk in (op.gemm, op.gemv):
        t = kk.tuner(kk.make_key({**key, "M": 128 if kk is op.gemm else 4})).timing_settings
        assert (t.timing, t.sustain_s) == ("batched", 0.05)
        assert (t.candidate_mode, t.finalist_mode) == ("batched", "batched")
        assert (t.finalist_margin, t.max_finalists) == (mop.FINALIST_MARGIN, mop.MAX_FINALISTS) == (0.08, 6)
    t = mop.MatmulOp(target=SM90, tuning_args={"timing": "burst", "finalist_margin": 0.03}).gemm.tuner(
        op.gemm.make_key(key)).timing_settings
    assert (t.timing, t.finalist_margin, t.max_finalists) == ("burst", 0.03, 6)


def test_configure_replaces_the_process_op():
    before = mop.get_op()
    try:
        new = mop.configure(topk=2, target=SM90)
        assert mop.get_op() is new and new is not before and new.topk == 2
    finally:
        mop._OP[0] = before


@pytest.mark.parametrize("kwargs, says", [(dict(gemv_max_m=True), "gemv_max_m must be"),
                                          (dict(gemv_max_m=5), "gemv_max_m must be"),
                                          (dict(dynamic="no"), "dynamic must be True"),
                                          (dict(topk=0), "topk must be")])
def test_op_settings_are_refused_naming_the_value(kwargs, says):
    with pytest.raises(ValueError, match=says):
        mop.MatmulOp(target=SM90, **kwargs)


def test_inside_a_bucket_the_op_steps_off_a_wave_cliff_to_the_carvers_config_for_that_m():
    """The down projection at 1088 tokens: the bucket's config (the carver's top-1 at 2048) puts 144 128x256
    tiles on 132 SMs, two waves for 1.09 of work (0.54x cuBLAS on an H200); the op serves the carver's config
    for 1088 instead. At the edge itself, and with refine=False, the bucket's config serves."""
    op = mop.MatmulOp(target=SM90)
    key = {"M": 1088, "N": 4096, "K": 14336, "dtype": torch.float16}
    bucket_cfg, source = op.gemm.config_for(key)
    served, why = op.gemm.served_config(key)
    assert source == "fallback" and served != bucket_cfg and "refined" in why and "fallback" in why
    arch, here = CUDA("sm_90a"), mm.MatmulProblem(1088, 4096, 14336)
    assert served == mm.MATMUL.candidates(here, arch, 1, variants=False, split_k=False)[0].to_dict()
    gain = (mm.space.predicted_ms(here, arch, mm.MatmulConfig.from_dict(bucket_cfg))
            / mm.space.predicted_ms(here, arch, mm.MatmulConfig.from_dict(served)))
    assert gain > mop.REFINE_MIN_GAIN
    assert op.gemm.served_config({**key, "M": 2048}) == (bucket_cfg, "fallback")
    assert mop.MatmulOp(target=SM90, refine=False).gemm.served_config(key) == (bucket_cfg, "fallback")
    with pytest.raises(ValueError, match="refine must be True"):
        mop.MatmulOp(target=SM90, refine="yes")


def test_refine_keeps_a_tuned_config_the_carver_underrates_at_the_edge(monkeypatch):
    """A bucket's config predicted 1.6x its top-1 at the edge, yet tuned there (it won, measured): at M the
    carver must predict it more than 1.6 * REFINE_MIN_GAIN slower before another config replaces it."""
    tuned = {"block_M": 256, "block_N": 128, "block_K": 64, "num_stages": 3, "thread_num": 256,
             "enable_rasterization": True}
    exact, bucket = ({"M": m, "N": 4096, "K": 14336, "dtype": "float16"} for m in (1024, 2048))
    for at_edge, refined in ((1.6, False), (1.0, True)):
        def fake(problem, arch, config, at_edge=at_edge):
            mine = config.carver_dict() == mm.MatmulConfig.from_dict(tuned).carver_dict()
            if problem.M == 2048:
                return at_edge if mine else 1.0
            return 0.8 if mine else 0.5  # at M: 1.6x the carver's top-1 there, 1.6x the edge's line (0.5)

        monkeypatch.setattr(mop, "predicted_ms", fake)
        got = mop.MatmulOp(target=SM90).refine_config(exact, bucket, tuned)
        assert (got is not None) is refined and (got is None or got != tuned)


# ------------------------------------------------------------------------------------ nvcc, no GPU
@pytest.mark.nvcc
def test_one_symbolic_gemm_kernel_per_bucket_and_gemv_per_exact_m():
    op = mop.MatmulOp(target=SM90)
    key = {"N": 4096, "K": 4096, "dtype": torch.float16}
    k = op.gemm.kernel_for({**key, "M": 100})
    assert op.gemm.kernel_for({**key, "M": 65}) is k and op.gemm.stats["compiles"] == 1
    assert "int M" in k.get_kernel_source()  # M is a runtime argument: one kernel serves the bucket
    op.gemv.kernel_for({**key, "M": 3})
    op.gemv.kernel_for({**key, "M": 4})
    assert op.gemv.stats["compiles"] == 2  # the GEMV unrolls over M: one kernel per exact M


@pytest.mark.nvcc
@pytest.mark.parametrize("extra", [{"split_k": 4}, {"persistent": 132, "warp_policy": "full_row"}])
def test_split_k_and_persistent_programs_compile_with_a_symbolic_m(extra):
    import tilelang
    import tilelang.language as T

    cfg = dict(block_M=128, block_N=128, block_K=64, num_stages=3, thread_num=256, enable_rasterization=True)
    k = tilelang.compile(mop.gemm(T.dynamic("M"), 4096, 4096, "float16", **cfg, **extra), out_idx=[-1], target=SM90)
    assert "int M" in k.get_kernel_source()


# ------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_an_m_past_cudas_grid_limit_for_the_served_config_goes_to_f_linear(caplog):
    """An M beyond the last bucket (65536) whose config would launch more rows of CTAs than CUDA's 65535
    (9,000,000 rows with block_M 128): F.linear answers, said once, instead of a launch error."""
    w = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    before = mop.get_op()
    op = mop.configure()
    try:
        cfg = op.gemm.config_for({"M": 1 << 20, "N": 64, "K": 64, "dtype": torch.float16})[0]  # the last bucket's
        m = (65535 + 100) * cfg["block_M"]
        x = torch.randn(m, 64, device="cuda", dtype=torch.float16)
        with torch.no_grad(), caplog.at_level(logging.INFO, logger=mop.logger.name):
            y = mop.matmul(x, w)
        torch.testing.assert_close(y, torch.nn.functional.linear(x, w))
        assert "cannot run at" in caplog.text and "grid limit" in caplog.text, caplog.text
    finally:
        mop._OP[0] = before


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_outputs_match_nn_linear_on_the_gpu(dtype):
    torch.manual_seed(0)
    ref = torch.nn.Linear(512, 768, device="cuda", dtype=dtype)
    lin = mm.Linear.from_linear(ref)
    before = mop.get_op()
    op = mop.configure()
    try:
        with torch.no_grad():
            for m in (1, 3, 16, 17, 100, 128, 300):
                for lead in ((m,), (1, m)):
                    x = torch.randn(*lead, 512, device="cuda", dtype=dtype)
                    torch.testing.assert_close(lin(x), ref(x), atol=2e-2, rtol=2e-2)
    finally:
        mop._OP[0] = before
    # one symbolic kernel per bucket, 32 (M=17), 128 (100, 128) and 512 (300), and one per config a refinement
    # serves beside a bucket's own
    served = {(op.gemm.make_key(k)["M"], json.dumps(op.gemm.served_config(k)[0], sort_keys=True)) for k in
              ({"M": m, "N": 768, "K": 512, "dtype": dtype} for m in (17, 100, 128, 300))}
    assert op.gemm.stats["compiles"] == len(served) >= 3
    assert op.gemv.stats["compiles"] == 3  # one per exact M: 1, 3, 16
    x = torch.randn(5, 512, device="cuda", dtype=dtype, requires_grad=True)
    lin(x).float().sum().backward()
    assert x.grad is not None and ref.weight.grad is not None


@pytest.mark.gpu
def test_a_refined_kernel_serves_between_two_edges_and_matches_nn_linear():
    """The down projection at 1088 tokens, where the bucket's config falls off a wave cliff on a 132-SM GPU:
    the refined kernel serves it, is checked against the reference first, and matches nn.Linear."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(14336, 4096, bias=False, device="cuda", dtype=torch.float16)
    lin = mm.Linear.from_linear(ref)
    before = mop.get_op()
    op = mop.configure()
    try:
        key = {"M": 1088, "N": 4096, "K": 14336, "dtype": torch.float16}
        served, why = op.gemm.served_config(key)
        if torch.cuda.get_device_properties(0).multi_processor_count == 132:
            assert "refined" in why, (served, why)
        with torch.no_grad():
            x = torch.randn(1088, 14336, device="cuda", dtype=torch.float16)
            torch.testing.assert_close(lin(x), ref(x), atol=2e-2, rtol=2e-2)
    finally:
        mop._OP[0] = before
    assert op.gemm.stats["served checks"] >= 1 and not op.gemm._refused


@pytest.mark.gpu
def test_a_cuda_graph_holds_only_checked_kernels():
    """A shape first met inside a CUDA-graph capture is compiled there but cannot be checked (nothing may
    run), so the graph gets F.linear for it; after one call outside the capture (the check), a graph holds
    the tuned kernel. Either graph replays the right answer for new inputs."""
    torch.manual_seed(0)
    ref = torch.nn.Linear(512, 768, device="cuda", dtype=torch.float16)
    lin = mm.Linear.from_linear(ref)
    before = mop.get_op()
    op = mop.configure()
    try:
        with torch.no_grad():
            x = torch.randn(48, 512, device="cuda", dtype=torch.float16)
            for warmed in (False, True):
                if warmed:
                    lin(x)  # the warm-up, outside any capture: the kernel is checked here
                    assert op.gemm.stats["served checks"] == 1
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    y = lin(x)
                assert op.gemm.stats["compiles"] == 1 and op.gemm.stats["served checks"] == int(warmed)
                x.copy_(torch.randn_like(x))
                graph.replay()
                torch.cuda.synchronize()
                torch.testing.assert_close(y, ref(x), atol=2e-2, rtol=2e-2)
    finally:
        mop._OP[0] = before


@pytest.mark.gpu
def test_torch_compile_on_the_gpu_same_outputs_no_graph_breaks():
    torch._dynamo.reset()
    torch.manual_seed(0)
    block = torch.nn.Sequential(mm.Linear(256, 512, bias=False), torch.nn.SiLU(), mm.Linear(512, 256)).to(
        "cuda", torch.float16).requires_grad_(False)
    x = torch.randn(40, 256, device="cuda", dtype=torch.float16)
    explain = torch._dynamo.explain(block)(x)
    assert explain.graph_break_count == 0, explain.break_reasons
    torch.testing.assert_close(torch.compile(block)(x), block(x))


@pytest.mark.gpu
def test_the_example_records_tunes_and_serves_in_a_fresh_process(tmp_path):
    out = Path(os.environ.get("OUT", tmp_path))
    env = {**os.environ, "TILECARVE_CACHE_DIR": str(tmp_path / "tc")}
    small = ["--hidden", "256", "--intermediate", "512", "--tokens", "1", "16", "128", "--topk", "2"]
    table = out / "example_mlp_table.json"
    example = str(ROOT / "examples" / "model" / "mlp.py")
    p = subprocess.run([sys.executable, example, "record-tune", "--table", str(table), *small], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=580)
    assert p.returncode == 0, p.stderr[-3000:]
    tuned = json.loads(p.stdout.strip().splitlines()[-1])
    assert tuned["keys"] == 6 and table.exists()  # gate and up share keys: 2 shapes x 3 counts
    assert not list(tmp_path.glob("*.json"))  # nothing in the working directory
    p = subprocess.run([sys.executable, example, "serve", "--table", str(table), *small], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    served = json.loads(p.stdout.strip().splitlines()[-1])
    assert {c[3] for c in served["configs"].values()} == {"table"} and served["untuned"] == []
