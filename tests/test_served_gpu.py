"""What a served kernel checks before it launches (autotuner.served), on the GPU: a view off a 16-byte
boundary is refused by name and the process's CUDA context lives on; a call with tensors on another GPU
leaves the caller's current device as it was (TileLang's host code sets it and does not restore it).

Run on the GPU machine: ``python3 -m pytest -m gpu tests/test_served_gpu.py`` (the second test needs two
GPUs: an nvidia-h200-x2 machine)."""

from __future__ import annotations

import pytest
import torch

from templates import matmul as mm

pytestmark = pytest.mark.gpu

SMALL = dict(block_M=64, block_N=128, block_K=64, num_stages=3, thread_num=128, enable_rasterization=True)
N = 512


def operands(device: str, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    flat = torch.randn(N * N + 8, device=device, dtype=torch.float16, generator=g)
    a = flat[offset:offset + N * N].view(N, N)
    return a, torch.randn(N, N, device=device, dtype=torch.float16, generator=g)


def expect(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float() @ b.float().T).half()


def test_a_view_off_the_boundary_is_refused_and_the_context_lives():
    kernel = mm.compile(N, N, N, config=SMALL)  # A (M, K), B (N, K)
    a, b = operands("cuda", offset=1)  # 2 bytes past the boundary: TMA and cp.async need 16
    assert a.data_ptr() % 16 == 2
    with pytest.raises(ValueError, match=r"argument 0 'A' starts 2 bytes past a 16-byte boundary"):
        kernel(a, b)
    torch.cuda.synchronize()  # the context is whole: nothing was launched
    a8, _ = operands("cuda", offset=8)  # 16 bytes in: runs
    torch.testing.assert_close(kernel(a8, b), expect(a8, b), atol=0.5, rtol=1e-2)
    torch.testing.assert_close(kernel(a.clone(), b), expect(a, b), atol=0.5, rtol=1e-2)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 or more GPUs in this process "
                    "(an nvidia-h200-x2 machine: python3 -m pytest -m gpu tests/test_served_gpu.py)")
def test_a_call_on_another_gpu_keeps_the_callers_current_device():
    compiled = mm.compile(N, N, N, config=SMALL)
    tuned = (mm.MATMUL.tuner(mm.MatmulProblem(N, N, N), mm.TuneOptions(configs=[SMALL], validate_configs=False))
             .set_tuning(cache=False, progress=False).run(1, 3).kernel)
    a, b = operands("cuda:1")
    torch.cuda.set_device(0)
    compiled.jit_kernel(a, b)  # TileLang's own call: the premise, its host code leaves cuda:1 current
    assert torch.cuda.current_device() == 1
    for kernel in (compiled, tuned):
        torch.cuda.set_device(0)
        y = kernel(a, b)
        assert torch.cuda.current_device() == 0, kernel
        assert y.device == a.device
        torch.testing.assert_close(y, expect(a, b), atol=0.5, rtol=1e-2)
