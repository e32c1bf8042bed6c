"""The trust fixes on a real GPU: input writes caught, accumulating kernels reset, and the finalist
rounds with sustained and CUDA-graph timing (run with ``python3 -m pytest -m gpu``)."""

from __future__ import annotations

import functools

import pytest
from kernels.trust_kernels import add_accumulate, add_clobber, add_trap, ref_add

from autotuner import AutoTuner, Status

pytestmark = pytest.mark.gpu


def _tuner(kernel, configs, **compile_args):
    return (AutoTuner.from_kernel(kernel, configs)
            .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="auto", **compile_args)
            .set_tuning(progress=False))


def test_a_gpu_candidate_that_writes_an_input_is_a_mismatch():
    import torch

    configs = [dict(block_M=32, threads=128, clobber="B"), dict(block_M=16, threads=128),
               dict(block_M=32, threads=128, clobber="A"), dict(block_M=64, threads=128)]
    result = _tuner(add_clobber, configs).run(2, 5)
    status = [t.status for t in result.trials]
    assert status == [Status.MISMATCH, Status.OK, Status.MISMATCH, Status.OK], result.summary()
    assert "(B)" in result.trials[0].error and "(A)" in result.trials[2].error
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_a_candidate_that_loses_the_cuda_context_costs_itself_only():
    """A failed device-side assert leaves the measuring process's CUDA context unusable (a sticky error, as
    an illegal address does, which TileLang's guards on T.Parallel stores make hard to write): that
    candidate is a runtime error and its process is replaced; the candidates after it are measured."""
    import torch

    configs = [dict(block_M=16), dict(block_M=32, trap=True), dict(block_M=32), dict(block_M=64),
               dict(block_M=16, block_N=16, trap=True), dict(block_M=16, block_N=64)]
    result = _tuner(add_trap, configs).set_tuning(progress=False, n_jobs=2).run(2, 5)
    status = [t.status for t in result.trials]
    assert status == [Status.OK, Status.RUNTIME_ERROR, Status.OK, Status.OK, Status.RUNTIME_ERROR, Status.OK], \
        result.summary()
    assert "CUDA context" in result.trials[1].error, result.trials[1].error
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    torch.testing.assert_close(result.kernel(a, b), a + b)


def test_an_accumulating_gpu_kernel_is_checked_and_timed_on_zeroed_outputs():
    import torch

    configs = [dict(block_M=16, threads=128), dict(block_M=32, threads=128)]
    result = _tuner(add_accumulate, configs, reset_to_zero=["C"]).run(3, 10)
    assert [t.status for t in result.trials] == [Status.OK, Status.OK], result.summary()
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    torch.testing.assert_close(result.kernel(a, b), a + b)
    again = _tuner(add_accumulate, configs, reset_to_zero=["C"]).run(3, 10)
    assert again.from_cache and again.config == result.config


@pytest.mark.parametrize("timing, backend", [("burst", "cudagraph"), ("sustained", "event"),
                                             ("sustained", "cudagraph"), ("batched", "event")])
def test_gemm_finalists_are_retimed_in_rounds_with_every_timing(timing, backend):
    import torch

    from templates.matmul import kernel as gemm
    from templates.matmul import ref_program

    M = N = K = 1024
    configs = [dict(block_M=bm, block_N=bn, block_K=64, num_stages=3, thread_num=thr, enable_rasterization=True)
               for bm, bn, thr in [(128, 128, 128), (128, 256, 256), (64, 128, 128)]]
    result = (AutoTuner.from_kernel(functools.partial(gemm, M, N, K), configs)
              .set_compile_args(out_idx=[-1], target="auto", ref_prog=ref_program)
              .set_tuning(timing=timing, timing_backend=backend, sustain_s=0.2, finalist_margin=1.0,
                          finalist_rounds=3, progress=False)
              .run(warmup=3, rep=10))
    assert all(t.status == Status.OK and t.rounds == 3 and t.spread is not None for t in result.trials), \
        result.summary()
    assert 0 < result.latency < 1.0
    assert result.latency == min(t.median_ms for t in result.trials)
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    b = torch.randn(N, K, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(result.kernel(a, b), (a.float() @ b.float().T).half(), atol=1e-1, rtol=1e-2)
