"""The softmax's exponential as one instruction: ``exp2`` through PTX ``ex2.approx.ftz.f32`` (one
``MUFU.EX2``), for both attention programs.

``T.exp2`` lowers to CUDA's ``exp2f``, which nvcc (without ``--use_fast_math``) compiles to ``ex2.approx.f32``
plus a denormal fix-up: ``FSETP`` and two ``FMUL`` around the ``MUFU.EX2``, per element of every score tile.
Nsight Compute on an H200 (2026-11-29, ``benchmarks/ncu_profile.py``) counted 718 instructions per warp per
key step in the ws loop against cuDNN's 576, the difference mostly that fix-up; with it gone the ws loop
gained 2-10% per shape (``benchmarks/attention_race.py``, docs/attention.md). Flushing denormal results to zero costs
the softmax nothing: a probability under 2^-126 of the row's largest adds nothing to a row sum of at
least 1, and ``ex2(-inf)`` is still exactly 0. FlashAttention builds with ``--use_fast_math`` for the same
reason; a program-level function keeps the rest of the kernel (and every other family) IEEE, and needs no
pass config in each config.
"""

from typing import Any

__all__ = ["FAST_EXP2", "SOURCE", "declare", "exp2"]

#: The device function's name, and its source, which :func:`declare` puts at the top of the kernel's file.
FAST_EXP2 = "tilecarve_ex2_ftz"
SOURCE = (f"__device__ __forceinline__ float {FAST_EXP2}(float x) "
           '{ float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }\n')


def declare() -> Any:
    """Inside ``T.Kernel``, once per program: make :func:`exp2` callable in its body."""
    import tilelang.language as T

    return T.import_source(SOURCE)


def exp2(x: Any) -> Any:
    """``2 ** x`` for an fp32 expression, one ``MUFU.EX2`` (denormal results flushed to 0)."""
    import tilelang.language as T

    return T.call_extern("float32", FAST_EXP2, x)
