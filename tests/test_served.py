"""What a served kernel checks before it launches (autotuner.served), on TileLang's C target: a tensor that
does not start on a 16-byte boundary is refused by name, by every kind of kernel tilecarve hands out (a
TileLang kernel faults on one, and on a GPU that ends the process's CUDA context); a view at an offset
that keeps the boundary runs. The current-device guard needs two GPUs: tests/test_multidevice.py."""

from __future__ import annotations

import pytest
import torch
from kernels.c_kernels import add, ref_add

from autotuner import AutoTuner, KeyedKernel
from autotuner.compile import tl_compile
from autotuner.served import ServedKernel, launch

SHAPE = (256, 256)


def at_offset(elements: int, seed: int = 0) -> torch.Tensor:
    """A (256, 256) float32 view that starts ``elements`` elements (4 bytes each) into its storage."""
    g = torch.Generator().manual_seed(seed)
    flat = torch.randn(SHAPE[0] * SHAPE[1] + 16, generator=g)
    return flat[elements:elements + SHAPE[0] * SHAPE[1]].view(SHAPE)


MISALIGNED = r"argument 1 'B' starts 4 bytes past a 16-byte boundary \(a view 1 elements into its storage"


def keyed(M: int):
    assert M == 256  # the C kernel's fixed size: the key selects the entry
    return add()


@pytest.fixture(scope="module")
def tuned():
    return (AutoTuner.from_kernel(add, [dict(block_M=32)])
            .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=1, progress=False).run(1, 2).kernel)


def kinds(tuned):
    """Every kind of kernel tilecarve hands out, each computing C = A + B from (A, B)."""
    kk = KeyedKernel(keyed, ["M"], [dict()], name="served-add", key_of=lambda a, b: {"M": a.shape[0]},
                     compile_args=dict(out_idx=[-1], ref_prog=ref_add, target="c"),
                     tuning_args=dict(n_jobs=1, progress=False))
    return {"tuned": tuned, "compiled": tl_compile(add(), "c", out_idx=[-1], serve=True), "keyed": kk}


@pytest.mark.parametrize("kind", ["tuned", "compiled", "keyed"])
def test_every_served_kernel_refuses_a_tensor_off_the_boundary_by_name(tuned, kind):
    kernel = kinds(tuned)[kind]
    a = at_offset(0)
    with pytest.raises(ValueError, match=MISALIGNED):
        kernel(a, at_offset(1))
    ok = at_offset(4, seed=1)  # 16 bytes in: on the boundary, so it runs
    assert ok.storage_offset() == 4
    torch.testing.assert_close(kernel(a, ok), a + ok)


def test_all_buffers_passed_are_checked_too(tuned):
    a, b = at_offset(0), at_offset(0, seed=1)
    with pytest.raises(ValueError, match=r"argument 2 'C' starts 8 bytes past"):
        tuned(a, b, at_offset(2))
    c = torch.empty(SHAPE)
    assert tuned(a, b, c) is None
    torch.testing.assert_close(c, a + b)


def test_the_decorators_untuned_kernel_is_served():
    """A call that fixes the tunables gets TileLang's kernel behind the same check, once per kernel."""
    import tilelang

    from autotuner import autotune

    dec = autotune(configs=[dict(block_M=32), dict(block_M=64)], warmup=1, rep=2, ref_prog=ref_add)(
        tilelang.jit(out_idx=[-1], target="c")(add))
    given = dec(block_M=32)
    assert isinstance(given, ServedKernel) and dec(block_M=32) is given
    with pytest.raises(ValueError, match=MISALIGNED):
        given(at_offset(0), at_offset(1))
    a, b = at_offset(0), at_offset(4)
    torch.testing.assert_close(given(a, b), a + b)


def test_launch_passes_other_arguments_and_an_empty_tensor():
    seen = []
    launch(lambda *xs: seen.append(xs), [3, "x", torch.empty(0)])
    assert seen[0][:2] == (3, "x")
    with pytest.raises(ValueError, match=r"argument 0 starts 2 bytes"):  # no names: the position alone
        launch(lambda *xs: None, [torch.zeros(9, dtype=torch.float16)[1:]])


def test_an_eager_style_call_and_compile_are_checked_too():
    """TileLang's eager style runs the kernel on the call's tensors: the same check first; its compile is
    served like any other kernel."""
    from kernels import dropin_module_kernels as mk

    a, b = at_offset(0), at_offset(1)
    with pytest.raises(ValueError, match=MISALIGNED):
        mk.eager_add(a, b, block_M=16, block_N=32)
    for call in (dict(A=a, B=b), dict(B=b, A=a)):  # keywords are checked too, named as the factory names them
        with pytest.raises(ValueError, match=r"argument \d 'B' starts 4 bytes past"):
            mk.eager_add(**call, block_M=16, block_N=32)
    kernel = mk.eager_add.compile(M=256, N=256, block_M=16, block_N=32)
    assert isinstance(kernel, ServedKernel)
    with pytest.raises(ValueError, match=MISALIGNED):
        kernel(a, b)
    torch.testing.assert_close(kernel(a, b.clone()), a + b)


def test_a_non_tensor_where_the_kernel_takes_a_buffer_is_refused_not_a_crash(tuned):
    """TileLang's C-target adapter takes None or a number for a tensor and crashes the process."""
    for kernel in (kinds(tuned)["compiled"], tuned):
        for bad in (None, 3):
            with pytest.raises(TypeError, match=r"argument 1 .*not a torch.Tensor"):
                kernel(at_offset(0), bad)


def test_memory_that_starts_off_the_boundary_is_not_called_a_view():
    raw = torch.frombuffer(bytearray(4 * 17 + 16), dtype=torch.float32, offset=4, count=16)
    if raw.data_ptr() % 16 == 0:  # the bytearray itself may start anywhere: use the 4 bytes after it
        raw = torch.frombuffer(bytearray(4 * 17 + 16), dtype=torch.float32, offset=8, count=16)
    assert raw.storage_offset() == 0 and raw.data_ptr() % 16
    with pytest.raises(ValueError, match=r"its memory itself starts there \(not a view"):
        launch(lambda *xs: None, [raw])
