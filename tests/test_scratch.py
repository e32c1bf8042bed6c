"""Scratch parameters (autotuner.scratch): working memory a program takes as a parameter, allocated by
every caller per call, on the current stream, instead of from TVM's per-thread workspace pool. On
TileLang's C target here; the split-K matmul on two streams and in a CUDA graph is in test_matmul_gpu."""

from __future__ import annotations

import pytest
import torch
from kernels.c_kernels import add_staged, ref_add

from autotuner import AutoTuner, KeyedKernel, TuningError, TuningInputError, scratch
from autotuner.compile import tl_compile
from autotuner.served import ServedKernel


def tune(configs, **tuning):
    return (AutoTuner.from_kernel(add_staged, configs)
            .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c")
            .set_tuning(n_jobs=2, **tuning).run(1, 3))


def test_mark_names_the_parameters_and_refuses_an_unknown_one():
    func = add_staged()
    assert scratch.positions(func) == [2]
    assert scratch.positions(add_staged(staged=False)) == []
    with pytest.raises(ValueError, match=r"\['X'\] are not parameters.*'A', 'B', 'W', 'C'"):
        scratch.mark(func, "X")
    assert scratch.positions(scratch.mark(add_staged(staged=False), "A")) == [0]
    assert scratch.positions(scratch.mark(scratch.mark(add_staged(staged=False), "A"), "B")) == [0, 1]  # adds
    assert scratch.input_positions(4, [-1], [2]) == [0, 1]


def test_the_tuner_allocates_scratch_passes_it_to_no_reference_and_returns_the_outputs_alone():
    # ref_add takes (A, B): were W passed to it, or W's writes taken for writes to an input, no config
    # would pass; the unstaged config (no scratch) runs in the same job on a signature of its own
    result = tune([dict(block_M=32), dict(block_M=64), dict(block_M=32, staged=False)])
    assert [t.status for t in result.trials] == ["ok", "ok", "ok"], result.trials
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    k = result.kernel
    if result.config.get("staged", True):
        assert k.scratch == [2]
        w, c = torch.empty(2, 256, 256), torch.empty(256, 256)
        assert k(a, b, w, c) is None  # every buffer passed: as before, scratch included
        torch.testing.assert_close(c, a + b)
    torch.testing.assert_close(k(a, b), a + b)  # the inputs alone: an output, not [output, scratch]
    k.get_profiler().assert_allclose(ref_add)  # TileLang's profiler makes inputs for A and B only


def test_restore_value_naming_scratch_is_refused_naming_it():
    with pytest.raises(TuningInputError, match=r"restore_value names \['W'\], a scratch parameter"):
        (AutoTuner.from_kernel(add_staged, [dict(block_M=32)])
         .set_compile_args(out_idx=[-1], ref_prog=ref_add, target="c", restore_value=["W"])
         .set_tuning(n_jobs=1).run(1, 3))


def test_a_kernel_that_reads_scratch_it_never_wrote_is_a_mismatch():
    with pytest.raises(TuningError, match="mismatch"):
        tune([dict(block_M=32, reads_unwritten=True)])


def test_a_kernel_compiled_with_out_idx_allocates_its_scratch_and_returns_the_outputs():
    jit = tl_compile(add_staged(), "c", out_idx=[-1])
    assert isinstance(jit, ServedKernel) and jit.out_idx == [3] and jit.scratch == [2]
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(jit(a, b), a + b)
    assert jit.get_kernel_source()  # the JITKernel's own attributes come through
    jit.get_profiler().assert_allclose(ref_add)  # inputs for A and B, C compared, W neither
    plain = tl_compile(add_staged(staged=False), "c", out_idx=[-1])
    assert not isinstance(plain, ServedKernel)  # nothing to hide, and not handed to a user (serve=False)
    served = tl_compile(add_staged(staged=False), "c", out_idx=[-1], serve=True)
    assert isinstance(served, ServedKernel) and served.scratch == [] and served.out_idx == plain.out_idx == [2]


def staged_keyed(M: int, staged: bool = True):
    assert M == 256  # the C kernels' fixed size: the key only selects the entry
    return add_staged(staged=staged)


def test_a_keyed_kernel_serves_and_checks_a_kernel_with_scratch():
    kk = KeyedKernel(staged_keyed, ["M"], [dict(staged=True)], name="staged",
                     compile_args=dict(out_idx=[-1], ref_prog=ref_add, target="c"),
                     tuning_args=dict(n_jobs=1, progress=False))
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(kk.kernel_for({"M": 256})(a, b), a + b)
    assert kk.stats["served checks"] == 1


def test_the_decorator_serves_scratch_kernels_alike_tuned_or_with_the_tunables_given():
    from kernels.c_kernels import staged_decorated

    staged = staged_decorated()
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    torch.testing.assert_close(staged()(a, b), a + b)  # tuned
    given = staged(block_M=32)  # tilelang.jit's way to skip tuning: the same call, A and B only
    torch.testing.assert_close(given(a, b), a + b)
    assert staged(block_M=32) is given
