"""The attention family's hand-scheduled Hopper program (``variant="ws"``): flash-attention forward with the
softmax overlapped with the tensor cores, in the style of FlashAttention-3, written warp by warp.

Roles (384 or 512 threads, one CTA per SM):

* **Producer** (the last 128 threads, ``setmaxnreg`` down to 40, or 32 beside three consumer warpgroups; its
  first warp runs the loop, ``PRODUCER_WARPS``): TMA-loads the CTA's Q tile once, then K and V tiles into a ring
  of ``num_stages`` stages. K and V have their own full and empty mbarriers, so a K stage is refilled as soon as
  ``Q K^T`` has read it, while ``P V`` may still read the V of that stage.
* **Two or three consumer warpgroups** (``threads`` 256 or 384; ``setmaxnreg`` up to 232, or 160 for three,
  FA3's split at head dim 64, where the softmax is twice the share of a step that it is at d128): one fragment
  of ``block_M = 64 x`` warpgroups rows split by ``T.GemmWarpPolicy.FullRow``, so warpgroup ``w`` owns rows
  ``64 w`` to ``64 w + 63`` and every wgmma, row reduction and cast it runs touches its own rows only. (At 256
  rows over two warpgroups TileLang 0.1.15 deals the ``Q K^T`` accumulator's rows 0-63 and 128-191 to
  warpgroup 0 but wants rows 0-127 of the ``P V`` operand there, a layout conflict; the carver's rules pair
  ``block_M`` with ``threads``.)

Per key step ``k`` a warpgroup does (FA3's intra-warpgroup overlap plus its ping-pong)::

    O *= scale(k-1)                          # CUDA cores, before the turn
    [wait for its turn]  S = Q K_k^T  ;  O += P(k-1) V(k-1)  [hand the turn to the next warpgroup]
    wait for S only (T.wait_wgmma(1)), release K_k
    softmax of S (mask where needed, row max, exp2, row sum)  # while P(k-1) V(k-1) and the other
    wait for P V (T.wait_wgmma(0)), release V(k-1), P(k) = cast(S)   # warpgroup's GEMMs run

The row max is TileLang's ``reduce_max`` with two consumer warpgroups and, with three (and 32 keys a step or
more), a tree over each thread's registers (``fastmath.row_max``: 7 dependent ``FMNMX`` at 128 keys, not 32),
which was faster there and slower with two (H200, docs/attention.md).

The turn is a named barrier a warpgroup (``bar.sync`` / ``bar.arrive``, 256 threads each: the waiting
warpgroup and the one handing over): warpgroup 0 starts, each warpgroup issues its two GEMMs in its turn and
passes it to the next (0 -> 1 -> 0, or 0 -> 1 -> 2 -> 0), so one warpgroup's softmax runs while the others'
GEMMs occupy the tensor cores. Every warpgroup takes the CTA's number of steps (a causal CTA's last query row
decides it; a step past a warpgroup's diagonal is fully masked for it), so the turns line up; the last
warpgroup skips its last hand-over, which no one waits for.
The last step's ``P V`` is issued outside the turns.

**Persistent form** (``persistent = n > 0``): ``n`` resident CTAs (the SM count) walk the ``B * H *
ceil(S / block_M)`` tiles in the order of ``tile_of`` (most work first, dealt in a snake). The ring's stages
and phases run on across a CTA's tiles (``base`` counts the ring iterations of its earlier ones); Q gets an
empty barrier, released once every ``Q K^T`` of the tile has completed, so the producer loads the next
tile's Q, K and V while the consumers finish this one; the last warpgroup hands its last turn to warpgroup 0's
next tile. O leaves through the staging tile as in the one-tile form.

**Tiles pipelined** (the persistent form wherever ``carver.attention.ws_tiles_pipelined`` holds: its extra
registers fit beside the fragments, which leaves out 160 keys at d128 with two consumer warpgroups and 128
keys at d64 or 64 at d128 with three): a tile's end overlaps the next tile's
start (cuDNN's 8-trip loop at 1k suggests it does the same). Q has two buffers (the round loop runs in pairs,
so each buffer's index is a constant), each with a full and an empty barrier. Step 0 of every tile after a
CTA's first also issues the previous tile's last ``P V`` in its turn; the previous tile's normalisation and
store then follow this tile's first softmax. (Only the normalisation overlaps the other warpgroups' GEMMs:
TileLang's barriers around the staging writes meet every consumer warpgroup there.) O is staged in the
previous tile's Q buffer (so the shared memory is the per-tile form's: two tiles of ``block_M x dim`` beside
the ring), which goes back to the producer only once the TMA store has read it. The store is issued and
committed in step 0 without a wait; the thread that issued it waits for the read after step 1's turn (step 1
is a copy apart from the loop over steps 2.., so that loop has no branch for it; after the tile's only step
if it has one), and its warp then releases the buffer: waiting in step 0 held warpgroup 0's next turn, and
the other warpgroups with it, 2-5% at 1k (H200). The CTA's last tile ends after the round loop. Round 0 is
peeled so that no wgmma issue hangs on a run-time branch: ptxas serializes every wgmma of a kernel where one
does (C7513 / C7514).

**Packed GQA** (``pack_gqa``, GQA only): a tile holds the rows of all ``groups`` query heads of one KV head, at
``rs = block_M / groups`` query positions each (head ``j``'s rows at ``j * rs`` to ``(j + 1) * rs - 1``), and the
tiles walk (batch, KV head, position block). Q arrives in one TMA box per query head (and per 64 columns at d128,
where a 128-column tile lies in shared memory as two 64-column halves), all on the tile's full barrier, and O leaves
the same way, one elected thread issuing every store; the mask and the causal step count take each row's position
(:func:`position`). Fewer rows lie past seq_len or past the diagonal (docs/attention.md, "Packed GQA").

Semantics as ``program.py`` (its docstring): keys ``>= seq_len`` and, when causal, keys after the query get -inf;
the mask is applied only on the steps that need it (the last one when no block divides seq_len, the diagonal ones
when causal), after ``Q K^T`` (``clear_accum``), replacing the scores as ``program.py`` does (``key_visible``; it
masks every step). A step fully masked for a row (with ``block_N=64``, warpgroup 0's rows see none of the CTA's
last step) leaves its running max unchanged, which step 0 made finite. TMA zero-fills K, V and Q rows past seq_len
and the O store clips them.

Registers after a wgmma issue are read only after ``T.wait_wgmma`` and a ``T.warpgroup_fence_operand`` on
them, so nvcc cannot hoist the softmax above the wait nor sink the write of P above the end of ``P V``.
"""

# No `from __future__ import annotations`: TileLang reads the T.prim_func's annotations as expressions.
from typing import TYPE_CHECKING

from carver.attention import WS_PRODUCER_THREADS, tile_positions, ws_regs, ws_tiles_pipelined

from . import fastmath
from .config import AttentionConfig, AttentionProblem

if TYPE_CHECKING:
    from tvm.tirx import PrimFunc

__all__ = ["PRODUCER_WARPS", "TURN_BARRIERS", "ws_program"]

#: Named barrier ids of the consumer warpgroups' turns, clear of the ids TileLang takes for its own syncs.
TURN_BARRIERS = (8, 9, 10)

#: Warps of the producer warpgroup that run its loop (FlashAttention-3's: one; the other three idle to the end of
#: the kernel). All four used to wait on every empty barrier and arrive on every full one: 0.1-1.2% slower in 17
#: of 18 pairs at head dim 64 (H200, 2026-11-29; docs/attention.md), their polling taking the consumers' issue slots.
PRODUCER_WARPS = 1


def ws_program(problem: AttentionProblem, config: AttentionConfig) -> "PrimFunc":
    """The ``T.prim_func`` of the hand-scheduled loop (checked by the caller, ``program.program``)."""
    import tilelang.language as T

    from .program import key_steps, key_visible  # program.py imports this module
    from .space import require

    B, H, S, D = problem.batch, problem.heads, problem.seq_len, problem.dim
    groups, causal, dtype, accum = problem.groups, problem.causal, problem.dtype, "float32"
    bm, bn, st = config.block_M, config.block_N, config.num_stages
    require(problem, config)  # the carver's rules (a caller may have skipped them): 64 rows a consumer warpgroup
    ct = config.threads  # 256 or 384: two or three consumer warpgroups of 64 rows
    nwg = ct // 128
    wg_rows = bm // nwg
    producer_regs, consumer_regs = ws_regs(ct)
    scale = (1.0 / D) ** 0.5 * 1.44269504  # 1/sqrt(D) and log2(e): the softmax in exp2
    q_shape = (B, S, H, D)
    kv_shape = (B, S, problem.kv_heads, D)
    cwarps = ct // 32
    # per-thread 32-bit registers of the fragments the fences name (a warpgroup's 128 threads share its rows)
    s_regs, p_regs, o_regs = wg_rows * bn // 128, wg_rows * bn // 256, wg_rows * D // 128
    tail = S % bn != 0
    # the carver's tiles (its model counts the same ones): `rs` query positions of each of `gq` query heads, and the
    # tiles' head index `th`; pack_gqa: all `groups` query heads of one KV head, head j's rows at j * rs to
    # (j + 1) * rs - 1 (one TMA box each), else one query head's `bm` positions
    rs, th = tile_positions(problem, config.kernel_kwargs())
    gq = bm // rs
    nq = -(-S // rs)
    tiles = B * th * nq
    # n resident CTAs walking the tiles (never more than there are tiles); 0: one CTA per tile
    persistent = min(config.persistent, tiles)
    turn0, turn1, turn2 = TURN_BARRIERS
    pt = 32 * PRODUCER_WARPS  # producer threads that run its loop and arrive on the full barriers
    # the row max as a tree over each thread's registers (fastmath.row_max) with three consumer warpgroups;
    # TileLang's reduce_max, a chain of bn / 4 dependent FMNMX per row, with two (the tree lost there, measured)
    # and below 32 keys (a chain of at most 4: nothing to shorten, and row_max's eight chains need 32)
    tree_max = nwg == 3 and bn >= 32

    def position(bx, i):
        """The query position of row ``i`` of tile ``bx``."""
        return bx * rs + (i % rs if gq > 1 else i)

    def kv_head(by):
        """The KV head a tile of head index ``by`` reads."""
        return by if gq > 1 else by // groups

    @T.macro
    def mask(acc_s, bx, k):
        """-inf on keys past seq_len and, when causal, after the query (only on steps that need it)."""
        if causal:
            if (k + 1) * bn > bx * rs + 1:  # the step reaches past the CTA's first query position
                for i, j in T.Parallel(bm, bn):
                    acc_s[i, j] = T.if_then_else(key_visible(S, bn, position(bx, i), k, j, True), acc_s[i, j],
                                                 -T.infinity(accum))
        elif tail:
            if (k + 1) * bn > S:
                for i, j in T.Parallel(bm, bn):
                    acc_s[i, j] = T.if_then_else(key_visible(S, bn, position(bx, i), k, j, False), acc_s[i, j],
                                                 -T.infinity(accum))

    def rows(buf, qb, lo, hi, c0=0, c1=D):
        """Rows ``lo`` to ``hi - 1`` (columns ``c0`` to ``c1 - 1``) of a tile: of ``buf`` itself, or of its buffer
        ``qb`` (a Python int) where ``buf`` holds two (the tiles-pipelined form's Q buffers)."""
        return buf[lo:hi, c0:c1] if qb < 0 else buf[qb, lo:hi, c0:c1]

    # pack_gqa's boxes: per query head, and per 64 columns (128 bytes), since a tile of 128 columns lies in shared
    # memory as two 64-column halves, so a head's rows of all 128 are not one contiguous box (TileLang refuses it)
    halves = D // 64

    @T.macro
    def load_q(Q, Q_s, qb, bars, bi, bx, by, bz):
        """Q's tile by TMA onto barrier ``bars[bi]``: one box, or (packed) one per query head of the KV head and
        64 columns."""
        if gq > 1:
            for j in T.unroll(gq):
                for c in T.unroll(halves):
                    T.tma_copy(Q[bz, bx * rs:(bx + 1) * rs, by * gq + j, c * 64:(c + 1) * 64],
                               rows(Q_s, qb, j * rs, (j + 1) * rs, c * 64, (c + 1) * 64), barrier=bars[bi])
        else:
            T.tma_copy(Q[bz, bx * bm:(bx + 1) * bm, by, :], rows(Q_s, qb, 0, bm), barrier=bars[bi])

    @T.macro
    def store_tile(O_s, qb, Output, bx, by, bz, wait):
        """O's staging tile out by TMA (rows past seq_len clipped). ``wait`` (a Python bool): the elected thread
        waits for the store's read of ``O_s`` here; else later, in :func:`release_stored`."""
        if gq > 1:
            for j in T.unroll(gq):  # store and commit only; the wait, where asked, once for all of them
                for c in T.unroll(halves):
                    T.tma_copy(rows(O_s, qb, j * rs, (j + 1) * rs, c * 64, (c + 1) * 64),
                               Output[bz, bx * rs:(bx + 1) * rs, by * gq + j, c * 64:(c + 1) * 64])
            if wait:
                if T.shuffle_elect(ct):  # the thread TileLang elects for the stores
                    T.tma_store_wait(0)
        elif wait:
            T.copy(rows(O_s, qb, 0, bm), Output[bz, bx * bm:(bx + 1) * bm, by, :])
        else:
            T.tma_copy(rows(O_s, qb, 0, bm), Output[bz, bx * bm:(bx + 1) * bm, by, :])  # store and commit only

    @T.macro
    def softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum):
        T.copy(scores_max, scores_max_prev)
        if tree_max:
            fastmath.row_max(acc_s, scores_max, bn // 8)
        else:
            T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(bm):
            scores_scale[i] = fastmath.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(bm, bn):
            acc_s[i, j] = fastmath.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(bm):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]

    @T.macro
    def wait_turn(wg):
        if wg == 0:
            T.sync_threads(turn0, 256)
        elif nwg == 2:
            T.sync_threads(turn1, 256)
        elif wg == 1:
            T.sync_threads(turn1, 256)
        else:
            T.sync_threads(turn2, 256)

    @T.macro
    def pass_turn(wg, more):
        """Hand the tensor cores to the next warpgroup (the last warpgroup's last hand-over has no taker)."""
        if wg == 0:
            T.named_barrier_arrive(turn1, 256)
        elif nwg == 2:
            if more:
                T.named_barrier_arrive(turn0, 256)
        elif wg == 1:
            T.named_barrier_arrive(turn2, 256)
        elif more:
            T.named_barrier_arrive(turn0, 256)

    def either(a, b):
        """``a or b`` where either may be a TIR condition (``b`` is 0 outside the persistent loop)."""
        return T.Or(a, b) if persistent else a

    @T.macro
    def release(bars, s, tx):
        """One arrival per consumer warp on an empty barrier of stage ``s``."""
        if tx % 32 == 0:
            T.mbarrier_arrive(bars[s])

    @T.macro
    def produce(Q, K, V, Q_s, K_s, V_s, q_bar, k_full, v_full, k_empty, v_empty, bx, by, bz, steps,
                base, j):
        """Producer, one tile: Q once (after the previous tile's consumers are done with it), then K and V
        for ring iterations ``base`` to ``base + steps - 1``."""
        if persistent:
            T.mbarrier_wait_parity(q_bar[1], (j & 1) ^ 1)
        load_q(Q, Q_s, -1, q_bar, 0, bx, by, bz)
        T.mbarrier_arrive(q_bar[0])
        for k in T.serial(steps):
            s, ph = (base + k) % st, ((base + k) // st) & 1
            T.mbarrier_wait_parity(k_empty[s], ph ^ 1)
            T.tma_copy(K[bz, k * bn:(k + 1) * bn, kv_head(by), :], K_s[s, :, :], barrier=k_full[s])
            T.mbarrier_arrive(k_full[s])
            T.mbarrier_wait_parity(v_empty[s], ph ^ 1)
            T.tma_copy(V[bz, k * bn:(k + 1) * bn, kv_head(by), :], V_s[s, :, :], barrier=v_full[s])
            T.mbarrier_arrive(v_full[s])

    @T.macro
    def release_stored(q_empty, qs, tx):
        """Q buffer ``qs`` back to the producer once the TMA store of the O staged in it has read it: the
        thread that issued the store (the same election) waits for the read, then its warp arrives."""
        if T.shuffle_elect(ct):  # TileLang's own election for the store: one thread of all the consumers'
            T.tma_store_wait(0)
        T.sync_warp()
        release(q_empty, qs, tx)

    @T.macro
    def key_step(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum, logsum,
                 k_full, v_full, k_empty, v_empty, bx, k, steps, base, more, wg, tx, q_empty, stored):
        """Step ``k >= 1``: Q K_k^T and P(k-1) V(k-1) in one turn, the softmax of k while P V runs. ``stored`` (a
        Python int): the Q buffer from which the previous tile's O store is in flight, released after the turn;
        -1: none."""
        s, sp = (base + k) % st, (base + k - 1) % st
        for i, j2 in T.Parallel(bm, D):
            acc_o[i, j2] *= scores_scale[i]
        T.mbarrier_wait_parity(k_full[s], ((base + k) // st) & 1)
        T.mbarrier_wait_parity(v_full[sp], ((base + k - 1) // st) & 1)
        wait_turn(wg)
        T.wgmma_gemm(Q_s, K_s[s, :, :], acc_s, transpose_B=True, clear_accum=True,
                     policy=T.GemmWarpPolicy.FullRow)
        T.wgmma_gemm(acc_p, V_s[sp, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
        pass_turn(wg, either(k < steps - 1, more))
        if stored >= 0:
            release_stored(q_empty, stored, tx)
        T.wait_wgmma(1)
        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
        release(k_empty, s, tx)
        mask(acc_s, bx, k)
        softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
        T.warpgroup_fence_operand(acc_p, num_regs=p_regs)
        release(v_empty, sp, tx)
        T.copy(acc_s, acc_p)

    @T.macro
    def key_steps_1on(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum,
                      logsum, k_full, v_full, k_empty, v_empty, bx, steps, base, more, wg, tx, q_empty, stored):
        """Steps 1.. (:func:`key_step`). With a buffer ``stored`` (a Python int), step 1 is a loop of its own (no
        branch in the loop of the others) that releases it, or the release follows a tile's only step."""
        if stored >= 0:
            for k in T.serial(1, T.min(steps, 2)):
                key_step(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum,
                         logsum, k_full, v_full, k_empty, v_empty, bx, k, steps, base, more, wg, tx, q_empty, stored)
            for k in T.serial(2, T.max(steps, 2)):
                key_step(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum,
                         logsum, k_full, v_full, k_empty, v_empty, bx, k, steps, base, more, wg, tx, q_empty, -1)
            if steps == 1:
                release_stored(q_empty, stored, tx)
        else:
            for k in T.serial(1, steps):
                key_step(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum,
                         logsum, k_full, v_full, k_empty, v_empty, bx, k, steps, base, more, wg, tx, q_empty, -1)

    @T.macro
    def step0_alone(Q_s, K_s, acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum, k_empty, s0, bx,
                    steps, more, wg, tx):
        """Step 0 with no P V in flight: Q K_0^T alone in its turn, then its softmax."""
        wait_turn(wg)
        T.wgmma_gemm(Q_s, K_s[s0, :, :], acc_s, transpose_B=True, clear_accum=True,
                     policy=T.GemmWarpPolicy.FullRow)
        pass_turn(wg, either(steps > 1, more))
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
        release(k_empty, s0, tx)
        mask(acc_s, bx, 0)
        softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)

    @T.macro
    def store_o(Output, O_s, qb, acc_o, scores_sum, logsum, bx, by, bz, wait):
        """O / row sum (one division per row, not per element), through a staging tile (``O_s``, or its buffer
        ``qb`` where it holds two) and TMA stores (one, or one per packed query head):
        measured faster than each warpgroup storing its own rows from registers, which writes 4-byte pieces,
        or from the staging tile (H200, 2026-11-24 and 2026-11-29). ``wait`` (a Python bool): the elected
        thread waits for the store's read of ``O_s`` here; else later, in :func:`release_stored`."""
        for i in T.Parallel(bm):
            scores_sum[i] = 1.0 / logsum[i]
        for i, j2 in T.Parallel(bm, D):
            acc_o[i, j2] *= scores_sum[i]
        T.copy(acc_o, rows(O_s, qb, 0, bm))
        store_tile(O_s, qb, Output, bx, by, bz, wait)

    @T.macro
    def consume(Output, Q_s, K_s, V_s, O_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale,
                scores_sum, logsum, q_bar, k_full, v_full, k_empty, v_empty, bx, by, bz, steps, base, j,
                more, wg, tx):
        """Consumers, one tile over ring iterations ``base`` to ``base + steps - 1``; ``more``: this CTA has
        another tile, so the last warpgroup hands its last turn on to warpgroup 0's next tile."""
        T.fill(acc_o, 0)
        T.fill(logsum, 0)
        T.fill(scores_max, -T.infinity(accum))
        T.mbarrier_wait_parity(q_bar[0], j & 1)
        # step 0: Q K_0^T alone
        s0 = base % st
        T.mbarrier_wait_parity(k_full[s0], (base // st) & 1)
        step0_alone(Q_s, K_s, acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum, k_empty, s0, bx,
                    steps, more, wg, tx)
        T.copy(acc_s, acc_p)
        key_steps_1on(Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale, scores_sum,
                      logsum, k_full, v_full, k_empty, v_empty, bx, steps, base, more, wg, tx, q_bar, -1)
        if persistent:
            release(q_bar, 1, tx)  # every Q K^T of the tile has completed: the producer may load the next Q
        # the last step's P V, outside the turns
        sl = (base + steps - 1) % st
        for i, j2 in T.Parallel(bm, D):
            acc_o[i, j2] *= scores_scale[i]
        T.mbarrier_wait_parity(v_full[sl], ((base + steps - 1) // st) & 1)
        T.wgmma_gemm(acc_p, V_s[sl, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
        release(v_empty, sl, tx)
        store_o(Output, O_s, -1, acc_o, scores_sum, logsum, bx, by, bz, True)

    def tile_of(w, ids):
        """The tile (bx, head, batch) that the CTA with block indices ``ids`` takes in round ``w``, and whether
        it exists. One tile per CTA: its own. Persistent: tiles are ordered most work first (causal: the last
        query blocks, which see the most keys), dealt in a snake (round w forwards, round w + 1 backwards) so
        each CTA's sum of work evens out. Within a round, neighbouring CTAs share K and V: without the mask
        they take adjacent query blocks of one head; causal, the same query block of adjacent heads (one GQA
        group reads one K and V)."""
        if not persistent:
            bx, by, bz = ids
            return bx, by, bz, True
        cta = ids
        t = w * persistent + T.if_then_else(w % 2 == 0, cta, persistent - 1 - cta)
        if causal:  # query block major, descending: rounds of equal work
            bx, bh = nq - 1 - t // (B * th), t % (B * th)
        else:
            bx, bh = t % nq, t // nq
        return bx, bh % th, bh // th, t < tiles

    def ring(base):
        """Ring iterations of the CTA's tiles before this one: 0 in the one-tile form, a constant the index
        arithmetic folds."""
        return base if persistent else 0

    rounds = -(-tiles // persistent) if persistent else 1
    grid = (persistent,) if persistent else (nq, th, B)

    # --------------------------------------------------------- persistent, tiles pipelined (module docstring)
    @T.macro
    def produce_pipelined(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, v_full, k_empty, v_empty, w, qb, ids,
                          ring_p):
        """Producer, round ``w``: Q into buffer ``qb = w % 2`` (a constant: the round loop is unrolled by two)
        once the consumers have stored O from it, then K and V."""
        bx, by, bz, live = tile_of(w, ids)
        if live:
            steps = key_steps(S, rs, bn, bx, causal)
            T.mbarrier_wait_parity(q_empty[qb], ((w // 2) & 1) ^ 1)
            load_q(Q, Q_s, qb, q_full, qb, bx, by, bz)
            T.mbarrier_arrive(q_full[qb])
            for k in T.serial(steps):
                s, ph = (ring_p[0] + k) % st, ((ring_p[0] + k) // st) & 1
                T.mbarrier_wait_parity(k_empty[s], ph ^ 1)
                T.tma_copy(K[bz, k * bn:(k + 1) * bn, kv_head(by), :], K_s[s, :, :], barrier=k_full[s])
                T.mbarrier_arrive(k_full[s])
                T.mbarrier_wait_parity(v_empty[s], ph ^ 1)
                T.tma_copy(V[bz, k * bn:(k + 1) * bn, kv_head(by), :], V_s[s, :, :], barrier=v_full[s])
                T.mbarrier_arrive(v_full[s])
            ring_p[0] = ring_p[0] + steps

    @T.macro
    def consume_pipelined(Output, Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale,
                          scores_sum, logsum, l_prev, last, q_full, q_empty, k_full, v_full, k_empty, v_empty, w,
                          qb, first, ids, wg, tx, ring_p):
        """Consumers, round ``w`` (``first``, a Python bool: round 0, peeled). After round 0, step 0's turn
        also issues the previous tile's last ``P V``, whose normalisation and store follow this tile's first
        softmax; O is staged in the previous tile's Q buffer, released to the producer once the
        TMA store has read it. No branch of the loop's wgmma issue depends on a run-time value: ptxas
        serializes every wgmma of a kernel where it does (C7513/C7514)."""
        bx, by, bz, live = tile_of(w, ids)
        if live:
            steps = key_steps(S, rs, bn, bx, causal)
            more = tile_of(w + 1, ids)[3]
            base = ring_p[0]
            T.mbarrier_wait_parity(q_full[qb], (w // 2) & 1)
            s0 = base % st
            T.mbarrier_wait_parity(k_full[s0], (base // st) & 1)
            if first:
                step0_alone(Q_s[qb, :, :], K_s, acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum,
                            k_empty, s0, bx, steps, more, wg, tx)
            else:
                sl = (base + st - 1) % st  # the previous tile's last ring iteration, base - 1
                for i, j2 in T.Parallel(bm, D):
                    acc_o[i, j2] *= scores_scale[i]
                T.mbarrier_wait_parity(v_full[sl], ((base + st - 1) // st - 1) & 1)
                wait_turn(wg)
                T.wgmma_gemm(Q_s[qb, :, :], K_s[s0, :, :], acc_s, transpose_B=True, clear_accum=True,
                             policy=T.GemmWarpPolicy.FullRow)
                T.wgmma_gemm(acc_p, V_s[sl, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                pass_turn(wg, T.Or(steps > 1, more))
                T.wait_wgmma(1)
                T.warpgroup_fence_operand(acc_s, num_regs=s_regs)
                release(k_empty, s0, tx)
                T.copy(logsum, l_prev)
                T.fill(logsum, 0)
                T.fill(scores_max, -T.infinity(accum))
                mask(acc_s, bx, 0)
                softmax(acc_s, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                T.wait_wgmma(0)
                T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
                T.warpgroup_fence_operand(acc_p, num_regs=p_regs)
                release(v_empty, sl, tx)
                px, py, pz, _ = tile_of(w - 1, ids)
                # the store's read is waited for after this tile's next turn (key_steps_1on)
                store_o(Output, Q_s, 1 - qb, acc_o, scores_sum, l_prev, px, py, pz, False)
                T.fence_proxy_async()
                T.fill(acc_o, 0)
            T.copy(acc_s, acc_p)
            key_steps_1on(Q_s[qb, :, :], K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev, scores_scale,
                          scores_sum, logsum, k_full, v_full, k_empty, v_empty, bx, steps, base, more, wg, tx,
                          q_empty, -1 if first else 1 - qb)
            last[0] = w
            ring_p[0] = base + steps

    @T.macro
    def finish_pipelined(Output, Q_s, V_s, acc_p, acc_o, scores_scale, scores_sum, logsum, v_empty, v_full, last,
                         ids, tx, ring_p):
        """The CTA's last tile: its last ``P V``, outside the turns, and its store from its own Q buffer."""
        sl = (ring_p[0] + st - 1) % st
        for i, j2 in T.Parallel(bm, D):
            acc_o[i, j2] *= scores_scale[i]
        T.mbarrier_wait_parity(v_full[sl], ((ring_p[0] + st - 1) // st - 1) & 1)
        T.wgmma_gemm(acc_p, V_s[sl, :, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
        T.wait_wgmma(0)
        T.warpgroup_fence_operand(acc_o, num_regs=o_regs)
        release(v_empty, sl, tx)
        lx, ly, lz, _ = tile_of(last[0], ids)
        if last[0] % 2 == 0:
            store_o(Output, Q_s, 0, acc_o, scores_sum, logsum, lx, ly, lz, True)
        else:
            store_o(Output, Q_s, 1, acc_o, scores_sum, logsum, lx, ly, lz, True)

    def main_pipelined(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                       Output: T.Tensor(q_shape, dtype)):
        with T.Kernel(persistent, threads=ct + WS_PRODUCER_THREADS) as ids:
            fastmath.declare()
            Q_s = T.alloc_shared((2, bm, D), dtype)  # two Q buffers, each also its tile's O staging tile
            K_s = T.alloc_shared((st, bn, D), dtype)
            V_s = T.alloc_shared((st, bn, D), dtype)
            acc_s = T.alloc_fragment((bm, bn), accum)
            acc_p = T.alloc_fragment((bm, bn), dtype)
            acc_o = T.alloc_fragment((bm, D), accum)
            scores_max = T.alloc_fragment((bm,), accum)
            scores_max_prev = T.alloc_fragment((bm,), accum)
            scores_scale = T.alloc_fragment((bm,), accum)
            scores_sum = T.alloc_fragment((bm,), accum)
            logsum = T.alloc_fragment((bm,), accum)
            l_prev = T.alloc_fragment((bm,), accum)  # the previous tile's row sums, for its store
            q_full = T.alloc_barrier([pt] * 2)
            q_empty = T.alloc_barrier([cwarps] * 2)
            k_full = T.alloc_barrier([pt] * st)
            v_full = T.alloc_barrier([pt] * st)
            k_empty = T.alloc_barrier([cwarps] * st)
            v_empty = T.alloc_barrier([cwarps] * st)
            # buffers, not T.alloc_var: macros write them (a macro's assignment to a var would rebind a name)
            ring_p = T.alloc_local((1,), "int32")  # ring iterations of the CTA's tiles so far
            ring_p[0] = 0
            last = T.alloc_local((1,), "int32")  # the round of the CTA's last tile so far
            tx = T.get_thread_binding()
            if tx >= ct:  # the producer warpgroup
                T.set_max_nreg(producer_regs, 0)
                if tx < ct + pt:
                    for w2 in T.serial(-(-rounds // 2)):  # in pairs: each Q buffer's index a constant
                        produce_pipelined(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, v_full, k_empty,
                                          v_empty, 2 * w2, 0, ids, ring_p)
                        produce_pipelined(Q, K, V, Q_s, K_s, V_s, q_full, q_empty, k_full, v_full, k_empty,
                                          v_empty, 2 * w2 + 1, 1, ids, ring_p)
            else:  # the consumer warpgroups
                T.set_max_nreg(consumer_regs, 1)
                wg = tx // 128
                if wg == 0:
                    T.named_barrier_arrive(turn0, 256)  # warpgroup 0 takes the first turn
                T.fill(acc_o, 0)  # (no T.fill of acc_p: a non-wgmma write of the P V operand serializes them)
                T.fill(logsum, 0)
                T.fill(scores_max, -T.infinity(accum))
                consume_pipelined(Output, Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev,
                                  scores_scale, scores_sum, logsum, l_prev, last, q_full, q_empty, k_full, v_full,
                                  k_empty, v_empty, 0, 0, True, ids, wg, tx, ring_p)
                for w2 in T.serial(-(-(rounds - 1) // 2)):  # rounds 1, 2, ... in pairs (Q buffers 1, 0)
                    consume_pipelined(Output, Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev,
                                      scores_scale, scores_sum, logsum, l_prev, last, q_full, q_empty, k_full,
                                      v_full, k_empty, v_empty, 2 * w2 + 1, 1, False, ids, wg, tx, ring_p)
                    consume_pipelined(Output, Q_s, K_s, V_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev,
                                      scores_scale, scores_sum, logsum, l_prev, last, q_full, q_empty, k_full,
                                      v_full, k_empty, v_empty, 2 * w2 + 2, 0, False, ids, wg, tx, ring_p)
                finish_pipelined(Output, Q_s, V_s, acc_p, acc_o, scores_scale, scores_sum, logsum, v_empty, v_full,
                                 last, ids, tx, ring_p)

    if persistent and ws_tiles_pipelined(problem, config.kernel_kwargs()):
        return T.prim_func(main_pipelined)

    @T.prim_func
    def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
             Output: T.Tensor(q_shape, dtype)):
        with T.Kernel(*grid, threads=ct + WS_PRODUCER_THREADS) as ids:
            fastmath.declare()
            Q_s = T.alloc_shared((bm, D), dtype)
            K_s = T.alloc_shared((st, bn, D), dtype)
            V_s = T.alloc_shared((st, bn, D), dtype)
            O_s = T.alloc_shared((bm, D), dtype)
            acc_s = T.alloc_fragment((bm, bn), accum)
            acc_p = T.alloc_fragment((bm, bn), dtype)
            acc_o = T.alloc_fragment((bm, D), accum)
            scores_max = T.alloc_fragment((bm,), accum)
            scores_max_prev = T.alloc_fragment((bm,), accum)
            scores_scale = T.alloc_fragment((bm,), accum)
            scores_sum = T.alloc_fragment((bm,), accum)
            logsum = T.alloc_fragment((bm,), accum)
            # Q's full barrier, and (persistent) its empty one: the one-tile form loads Q once
            q_bar = T.alloc_barrier([pt] + [cwarps] * (persistent > 0))
            k_full = T.alloc_barrier([pt] * st)
            v_full = T.alloc_barrier([pt] * st)
            k_empty = T.alloc_barrier([cwarps] * st)
            v_empty = T.alloc_barrier([cwarps] * st)
            base = T.alloc_var("int32", init=0)  # ring iterations of the CTA's tiles before this one
            tx = T.get_thread_binding()
            if tx >= ct:  # the producer warpgroup
                T.set_max_nreg(producer_regs, 0)
                if tx < ct + pt:
                    for w in T.serial(rounds):
                        bx, by, bz, live = tile_of(w, ids)
                        if live:
                            steps = key_steps(S, rs, bn, bx, causal)
                            produce(Q, K, V, Q_s, K_s, V_s, q_bar, k_full, v_full, k_empty, v_empty,
                                    bx, by, bz, steps, ring(base), w)
                            if persistent:
                                base = base + steps
            else:  # the consumer warpgroups
                T.set_max_nreg(consumer_regs, 1)
                wg = tx // 128
                if wg == 0:
                    T.named_barrier_arrive(turn0, 256)  # warpgroup 0 takes the first turn
                for w in T.serial(rounds):
                    bx, by, bz, live = tile_of(w, ids)
                    if live:
                        steps = key_steps(S, rs, bn, bx, causal)
                        consume(Output, Q_s, K_s, V_s, O_s, acc_s, acc_p, acc_o, scores_max, scores_max_prev,
                                scores_scale, scores_sum, logsum, q_bar, k_full, v_full, k_empty, v_empty,
                                bx, by, bz, steps, ring(base), w, persistent and tile_of(w + 1, ids)[3], wg, tx)
                        if persistent:
                            base = base + steps

    return main
