"""The attention family's program: flash-attention forward (online softmax), BSHD, MHA or GQA.

One CTA owns ``block_M`` query rows of one (batch, query head) and walks the keys in steps of
``block_N``: ``S = Q K^T`` (tensor cores, fp32), the running row max and sum (exp2 with the scale
folded in, one instruction each: ``fastmath.py``), ``O = O * rescale + P V``; at the end ``O * (1 / rowsum)``
is stored in the input dtype. This is TileLang's ``examples/flash_attention/example_gqa_fwd_bshd.py``.
(The explicit per-statement ``T.Pipelined(order=, stage=)`` schedule of its
``example_gqa_fwd_bshd_wgmma_pipelined.py`` was tried as an ``overlap`` knob and removed: written for
TileLang 0.1.15 it gave wrong results on every shape measured on an H200, docs/attention.md.)

Sequence lengths that are not multiples of the blocks:

* keys at positions >= seq_len get a score of -inf before the row max: the mask *replaces* the product's
  score after ``Q K^T`` (as in ``ws_program.py``). It used to start the score tile at 0 or -inf and accumulate
  the product onto it, so a NaN or inf in a masked key's K row (a causal query's future keys: in a
  preallocated cache, whatever memory holds) gave -inf + NaN = NaN, and the query rows of that key's block,
  which must not see it, came out NaN where attention by definition is finite (torch's SDPA math path, the
  family's fp32 reference, adds its boolean mask and is NaN there too: ``reference.py``). K/V rows past seq_len
  are loaded as zeros (TileLang
  guards the copy: TMA fills out-of-range rows with zeros, cp.async copies are predicated with zero
  fill), so ``P V`` multiplies exact zeros, never garbage;
* query rows past seq_len are computed on zero-filled Q and never stored (the output copy is guarded);
* no row ever sees a whole first step masked (key 0 is visible to every query, causal or not), so the
  running max is finite after step 0 and ``exp2(-inf - max)`` is 0, never ``-inf - -inf`` = NaN.

Causal: the loop stops at the last key block the CTA's last query row can see.
"""

# No `from __future__ import annotations` here: TileLang reads the T.prim_func's annotations.
from typing import TYPE_CHECKING, Any

from . import fastmath
from .config import AttentionConfig, AttentionProblem, make_problem
from .ws_program import ws_program

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

__all__ = ["kernel", "key_steps", "key_visible", "program"]


def key_visible(S: int, block_N: int, q: Any, k: Any, j: Any, causal: bool) -> Any:
    """Whether the query at position ``q`` sees key ``j`` of key step ``k``: no key at or past ``S``, and (causal)
    none after the query. Both programs' masks keep the score where it holds and put -inf in its place elsewhere
    (never add to it: -inf + NaN is NaN)."""
    seen = k * block_N + j < S
    return (q >= k * block_N + j) & seen if causal else seen


def key_steps(S: int, positions: int, block_N: int, bx: Any, causal: bool) -> Any:
    """The key blocks CTA ``bx`` visits: all of them, or (causal) up to the last one its last query sees, the
    CTA covering query positions ``bx * positions`` to ``(bx + 1) * positions - 1`` (``positions`` is
    ``block_M``, or ``block_M / groups`` where a ws tile packs a KV head's query heads)."""
    import tilelang.language as T

    if causal:
        return T.min(T.ceildiv(S, block_N), T.ceildiv((bx + 1) * positions, block_N))
    return T.ceildiv(S, block_N)


def program(problem: AttentionProblem, config: AttentionConfig) -> "PrimFunc":
    """Build the attention ``T.prim_func`` for one config (nothing is compiled here): ``O = k(Q, K, V)``.
    The config must pass ``templates.attention.space.check``; the template checks before calling.
    ``variant="ws"`` is the hand-scheduled Hopper loop of ``ws_program.py``."""
    import tilelang.language as T

    if config.variant == "ws":
        return ws_program(problem, config)

    B, H, S, D = problem.batch, problem.heads, problem.seq_len, problem.dim
    groups, causal, dtype, accum = problem.groups, problem.causal, problem.dtype, "float32"
    block_M, block_N = config.block_M, config.block_N
    scale = (1.0 / D) ** 0.5 * 1.44269504  # 1/sqrt(D) and log2(e): the softmax in exp2
    q_shape = (B, S, H, D)
    kv_shape = (B, S, problem.kv_heads, D)
    num_stages = config.num_stages

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
             Output: T.Tensor(q_shape, dtype)):
        with T.Kernel(T.ceildiv(S, block_M), H, B, threads=config.threads) as (bx, by, bz):
            fastmath.declare()
            Q_shared = T.alloc_shared((block_M, D), dtype)
            K_shared = T.alloc_shared((block_N, D), dtype)
            V_shared = T.alloc_shared((block_N, D), dtype)
            O_shared = T.alloc_shared((block_M, D), dtype)
            acc_s = T.alloc_fragment((block_M, block_N), accum)
            acc_s_cast = T.alloc_fragment((block_M, block_N), dtype)
            acc_o = T.alloc_fragment((block_M, D), accum)
            scores_max = T.alloc_fragment((block_M,), accum)
            scores_max_prev = T.alloc_fragment((block_M,), accum)
            scores_scale = T.alloc_fragment((block_M,), accum)
            scores_sum = T.alloc_fragment((block_M,), accum)
            logsum = T.alloc_fragment((block_M,), accum)

            T.copy(Q[bz, bx * block_M:(bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum))
            steps = key_steps(S, block_M, block_N, bx, causal)

            for k in T.Pipelined(steps, num_stages=num_stages):
                T.copy(K[bz, k * block_N:(k + 1) * block_N, by // groups, :], K_shared)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, clear_accum=True,
                       policy=T.GemmWarpPolicy.FullRow)
                if causal or S % block_N:  # the mask replaces the score: a masked key's NaN or inf never reaches it
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(key_visible(S, block_N, bx * block_M + i, k, j, causal),
                                                     acc_s[i, j], -T.infinity(accum))

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = fastmath.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = fastmath.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, D):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, k * block_N:(k + 1) * block_N, by // groups, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i in T.Parallel(block_M):
                scores_sum[i] = 1.0 / logsum[i]  # one division per row, not per element
            for i, j in T.Parallel(block_M, D):
                acc_o[i, j] *= scores_sum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M:(bx + 1) * block_M, by, :])

    return main


def kernel(batch: int, heads: int, seq_len: int, dim: int, block_M: int, block_N: int, num_stages: int,
           threads: int, kv_heads: int | None = None, causal: bool = False,
           dtype: str = "float16", variant: str = "pipelined") -> "PrimFunc":
    """:func:`program` with loose arguments (the kernel function with reserved parameters), checked by
    the rules no GPU escapes first."""
    from .space import require

    problem = make_problem(batch, heads, seq_len, dim, kv_heads, causal, dtype)
    config = AttentionConfig(block_M=block_M, block_N=block_N, num_stages=num_stages, threads=threads,
                             variant=variant)
    require(problem, config)
    return program(problem, config)
