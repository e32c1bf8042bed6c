"""``benchmarks/benchlib.py`` (no GPU): a benchmark's check starts the output as poison, so a kernel that leaves
elements unwritten fails it even where ``torch.empty`` hands back memory that held the right answer."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def lazy_kernel(x):
    """Allocates its output with torch.empty (as TileLang's launchers do) and never writes its last row."""
    out = torch.empty(x.shape, dtype=x.dtype)
    out[:-1] = x[:-1] * 2
    return out


def full_kernel(x):
    out = torch.empty(x.shape, dtype=x.dtype)
    out[:] = x * 2
    return out


def test_a_kernel_that_leaves_a_row_unwritten_fails_the_check_it_would_pass_on_reused_memory():
    from benchlib import mismatches, poisoned_call

    x = torch.arange(64.0).reshape(8, 8)
    ref = x * 2
    # where the memory torch.empty hands back held the right answer, a plain call passes the lazy kernel
    plain = lazy_kernel(x)
    plain[-1] = ref[-1]  # what reused memory can hold (the allocator's reuse, made deterministic here)
    assert mismatches(plain, ref) == 0
    # with the output poisoned its last row is caught: NaN, whatever the allocator handed back
    out = poisoned_call(lazy_kernel, (x,))
    assert torch.isnan(out[-1]).all() and mismatches(out, ref) == 8
    # a kernel that writes everything passes, and so do both of a pair of outputs
    assert mismatches(poisoned_call(full_kernel, (x,)), ref) == 0
    a, b = poisoned_call(lambda x: (full_kernel(x), lazy_kernel(x)), (x,))
    assert (mismatches(a, ref), mismatches(b, ref)) == (0, 8)


def test_an_output_the_poison_cannot_reach_is_refused():
    from benchlib import poisoned_call

    keep = torch.zeros(4)
    with pytest.raises(RuntimeError, match="not allocated from the poisoned pool"):
        poisoned_call(lambda x: keep, (torch.ones(4),))  # returns memory it did not allocate
    with pytest.raises(RuntimeError, match="not allocated from the poisoned pool"):
        poisoned_call(lambda x: x * 2, (torch.ones(4),))  # on the CPU only torch.empty's memory is poisoned


def test_interleaved_rounds_rotate_who_goes_first():
    """A kernel timed right after another meets a GPU the other has just heated: no arm may always come second."""
    from types import SimpleNamespace

    import attention
    from benchlib import round_order, whole_rotations

    assert [round_order("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert round_order([], 3) == []
    assert [whole_rotations(3, 2), whole_rotations(3, 3), whole_rotations(4, 3), whole_rotations(1, 1)] == [4, 3, 6, 1]
    seen: list[str] = []
    bench = attention.Bench.__new__(attention.Bench)  # no GPU: only the rounds, with a clock that runs the call
    bench.args, bench.clock = SimpleNamespace(rounds=2), SimpleNamespace(time=lambda fn: fn() or 1.0)
    times = bench.interleaved({n: (lambda n=n: seen.append(n)) for n in ("ours", "flash", "cudnn")})
    assert seen == ["ours", "flash", "cudnn", "flash", "cudnn", "ours"]
    assert times == {"ours": [1.0, 1.0], "flash": [1.0, 1.0], "cudnn": [1.0, 1.0]}
