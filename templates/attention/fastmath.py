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

One more device function serves the hand-scheduled program with three consumer warpgroups: :func:`row_max`, a
warpgroup accumulator's row max as a tree rather than TileLang's chain of dependent ``FMNMX``. Nsight Compute's
per-instruction samples on an H200 (2026-11-29, head dim 64, 8 x 1k tokens, two consumer warpgroups) put a third of
the ws loop's warp time on its 64 back-to-back ``MUFU.EX2`` and a sixth on the row max's 32 dependent ``FMNMX``,
against a fifth on waiting for the tensor cores in cuDNN's kernel (docs/attention.md).
"""

from typing import Any

__all__ = ["FAST_EXP2", "ROW_MAX", "SOURCE", "declare", "exp2", "row_max"]

#: The device function's name, and its source, which :func:`declare` puts at the top of the kernel's file.
FAST_EXP2 = "tilecarve_ex2_ftz"
SOURCE = (f"__device__ __forceinline__ float {FAST_EXP2}(float x) "
           '{ float y; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x)); return y; }\n')
ROW_MAX = "tilecarve_row_max"
SOURCE += ("template <int G>\n"
           f"__device__ __forceinline__ void {ROW_MAX}(const float* s, float* m) {{\n"
           "  #pragma unroll\n"
           "  for (int r = 0; r < 2; ++r) {\n"
           "    float a[8];\n"
           "    #pragma unroll\n"
           "    for (int k = 0; k < 8; ++k) a[k] = s[(k >> 1) * 4 + r * 2 + (k & 1)];\n"
           "    #pragma unroll\n"
           "    for (int k = 8; k < 2 * G; ++k) a[k & 7] = fmaxf(a[k & 7], s[(k >> 1) * 4 + r * 2 + (k & 1)]);\n"
           "    float x = fmaxf(fmaxf(fmaxf(a[0], a[4]), fmaxf(a[1], a[5])),\n"
           "                    fmaxf(fmaxf(a[2], a[6]), fmaxf(a[3], a[7])));\n"
           "    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));\n"
           "    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));\n"
           "    m[r] = fmaxf(m[r], x);\n"
           "  }\n}\n")


def declare() -> Any:
    """Inside ``T.Kernel``, once per program: make :func:`exp2` callable in its body."""
    import tilelang.language as T

    return T.import_source(SOURCE)


def exp2(x: Any) -> Any:
    """``2 ** x`` for an fp32 expression, one ``MUFU.EX2`` (denormal results flushed to 0)."""
    import tilelang.language as T

    return T.call_extern("float32", FAST_EXP2, x)


def row_max(acc_s: Any, scores_max: Any, groups: int) -> Any:
    """``scores_max[i] = max(scores_max[i], max_j acc_s[i, j])`` for a warpgroup's wgmma accumulator (each thread:
    2 rows x ``groups`` column groups of 8 x 2 columns, element ``g * 4 + r * 2 + c``; a row across the 4 threads of
    a quad), as a tree (depth ``2 * groups / 8 + 3``, not ``2 * groups``) and two shuffles. Its eight chains need
    ``groups >= 4`` (32 columns)."""
    if groups < 4:
        raise ValueError(f"row_max reads 8 columns of a row per thread at least: groups >= 4, got {groups}")
    import tilelang.language as T

    return T.call_extern("handle", f"{ROW_MAX}<{groups}>", acc_s.data, scores_max.data)
