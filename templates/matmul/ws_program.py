"""The matmul family's hand-scheduled Hopper program (``variant="ws"``): ``C = op(A) @ op(B)`` with the main
loop written out warp by warp instead of left to ``T.Pipelined``.

What TileLang's automatic pipeline does not do, and this program does:

* **One wgmma batch in flight.** ``T.Pipelined`` waits for every batch (``warpgroup_wait<0>``) before it
  releases the batch's stage, so the tensor pipe drains every K step. Here the consumers issue batch k,
  wait for batch k-1 only (``T.wait_wgmma(1)``) and then release k-1's stage: the next batch is queued
  while the previous one finishes.
* **A ring guarded by mbarriers.** A producer warpgroup (the last 128 threads) waits for a stage to be
  empty, issues the TMA loads of A and B into it (``T.tma_copy``: expect-tx plus the load, no wait) and
  arrives on its full barrier; consumer warps wait for full and each arrives once on empty.
* **Registers rebalanced.** The producer drops to 40 registers (``setmaxnreg.dec``), the consumers rise to
  240 (one warpgroup) or 232 (two).
* **Thread-block clusters** (``cluster="1x2"`` or ``"2x1"``, CTAs along M x along N): the two CTAs of a
  cluster share one operand tile (A for 1x2, B for 2x1); the leader loads it once with a TMA multicast into
  both CTAs' rings, so L2 serves it once. The empty barriers are cluster barriers: every consumer warp
  arrives on both CTAs' (the leader may not overwrite the peer's stage before the peer has read it).
  TileLang adds the cluster sync after the barriers are initialised; the one at the end keeps each CTA's
  shared memory alive until its peer has stopped arriving on it. The grid is padded to whole clusters; a
  padding CTA loads zeros and stores nothing (TMA clips at the tensor's edge). The cluster runs along the
  grid's x axis (N tiles for 1x2, M tiles for 2x1), the only axis TileLang's rasterization takes clusters on.
* **Persistent** (``persistent=n``, no cluster): n CTAs walk the tiles with one ring whose phases run on
  across tiles, so the producer loads the next tile while the consumers store this one, and C leaves by a
  TMA store that is waited for only before the next tile's C overwrites the staging buffer.

* **Ping-pong** (``variant="pingpong"``, persistent, two consumer warpgroups): the warpgroups take the CTA's
  tiles in turn (warpgroup 0 the even ones, 1 the odd ones), each with a whole ``block_M x block_N`` accumulator
  and staging tile of its own, and hand the tensor cores to each other through two named barriers
  (:data:`PINGPONG_TURNS`): one's epilogue runs under the other's main loop. The ring is the persistent form's,
  in tile order; a warpgroup waits on its tile's stages only after the other has passed every full barrier of
  the tile before, so no parity wait runs a phase ahead. A stage's empty barrier counts one warpgroup's warps.

Tails need no code: TMA loads zero-fill past the tensor's edge (and still count the whole box towards the
barrier's transaction bytes) and TMA stores skip what lies past it. TMA needs 16-byte row strides for A and
B; ``carver.validity`` refuses the variant otherwise, and where C's rows are not 16-byte aligned the C store
falls back to ``T.copy``'s predicated stores.

The epilogue (C to shared memory, then to global) stays inside the consumer branch: outside it ptxas no
longer credits the consumers' setmaxnreg budget and spills the accumulator (sm_90a, 128x256 tile: "840 bytes
stack frame, 1380 bytes spill stores", "wgmma.mma_async instructions are serialized"). So TileLang's default
shared-memory planner, which sees both live in one branch, puts C's staging tile beside the ring;
``carver.validity.ws_smem_bytes`` counts it. A config whose ``pass_configs`` turn on the aggressive merge
(``carver.validity.C_ON_RING``) gets C on the ring instead, which the loop has finished with when C is
written (the named barrier after ``T.wait_wgmma(0)`` orders it after both warpgroups' last wgmma, and every
TMA load has landed before the last full barrier is passed); not with ``persistent``, whose producer is
already loading the next tile.
"""

# No `from __future__ import annotations`: TileLang reads the T.prim_func's annotations as expressions.
import math
from typing import TYPE_CHECKING

from carver.validity import WS_PRODUCER_THREADS, cluster_shape

from .config import MatmulConfig, MatmulProblem

if TYPE_CHECKING:  # heavy imports stay lazy (STYLE.md 2)
    from tvm.tirx import PrimFunc, Var

__all__ = ["CONSUMER_REGS", "PINGPONG_TURNS", "PRODUCER_REGS", "ws_program"]

#: setmaxnreg budgets: the producer only issues TMA; the consumers hold the accumulator.
PRODUCER_REGS = 40
CONSUMER_REGS = {1: 240, 2: 232}  # per consumer warpgroup count: 128*40 + 256*232 <= 64K registers
#: Named barrier ids of the ping-pong consumers' turns, clear of the ids TileLang takes for its own syncs.
PINGPONG_TURNS = (8, 9)


def ws_program(problem: MatmulProblem, config: MatmulConfig, M_var: "Var | None" = None) -> "PrimFunc":
    """The ``T.prim_func`` of the hand-scheduled loop for one config (checked by the caller,
    ``program.program``, against the carver's rules). ``M_var``: a symbolic M, as in ``program``."""
    import tilelang.language as T

    M, N, K, trans_A, trans_B = problem.M, problem.N, problem.K, problem.trans_A, problem.trans_B
    if M_var is not None:
        M = M_var
    in_dtype, out_dtype, accum_dtype = problem.in_dtype, problem.out_dtype, problem.accum_dtype
    bM, bN, bK, S = config.block_M, config.block_N, config.block_K, config.num_stages
    policy = {"square": T.GemmWarpPolicy.Square, "full_row": T.GemmWarpPolicy.FullRow,
              "full_col": T.GemmWarpPolicy.FullCol}[config.warp_policy]
    ct = config.thread_num  # consumer threads; the producer warpgroup comes on top
    pingpong = config.variant == "pingpong"
    cwarps = 4 if pingpong else ct // 32  # the warps that release one stage: one warpgroup's in ping-pong
    creg = CONSUMER_REGS[ct // 128]
    cm, cn = cluster_shape(config.cluster)
    csize = cm * cn
    persistent = config.persistent
    k_tiles = math.ceil(K / bK)
    m_tiles = math.ceil(M / bM) if M_var is None else T.ceildiv(M, bM)
    n_tiles = math.ceil(N / bN)
    A_shape = (K, M) if trans_A else (M, K)
    B_shape = (N, K) if trans_B else (K, N)
    A_ring = (S, bK, bM) if trans_A else (S, bM, bK)
    B_ring = (S, bN, bK) if trans_B else (S, bK, bN)
    tma_store = N * problem.out_bytes % 16 == 0  # else T.copy's predicated stores
    # Multicast: 1x2 pairs N tiles (grid x) sharing A; 2x1 pairs M tiles (grid x) sharing B.
    mask_A = (1 << csize) - 1 if cn > 1 else None
    mask_B = (1 << csize) - 1 if cm > 1 else None
    if cm > 1:
        grid = (T.ceildiv(m_tiles, cm) * cm, n_tiles)
    else:
        grid = (math.ceil(n_tiles / cn) * cn, m_tiles)

    @T.macro
    def load(A, B, A_s, B_s, full, empty, it, ko, tm, tn):
        """Producer, K step ``ko`` of tile (tm, tn), ring iteration ``it``: wait for the stage to be empty,
        TMA A and B into it (the leader multicasts the shared one), arrive on its full barrier."""
        s = it % S
        T.mbarrier_wait_parity(empty[s], ((it // S) & 1) ^ 1)
        a0 = ko * bK if trans_A else tm * bM  # the tile's origin in A's and B's own layouts
        a1 = tm * bM if trans_A else ko * bK
        b0 = tn * bN if trans_B else ko * bK
        b1 = ko * bK if trans_B else tn * bN
        T.tma_copy(A[a0:a0 + A_ring[1], a1:a1 + A_ring[2]], A_s[s, :, :], barrier=full[s], cluster_mask=mask_A)
        T.tma_copy(B[b0:b0 + B_ring[1], b1:b1 + B_ring[2]], B_s[s, :, :], barrier=full[s], cluster_mask=mask_B)
        T.mbarrier_arrive(full[s])

    @T.macro
    def release(empty, it, tx):
        """One arrival per consumer warp on ring iteration ``it``'s empty barrier (every CTA's, in a cluster)."""
        if tx % 32 == 0:
            if csize > 1:
                for r in T.unroll(csize):
                    T.mbarrier_arrive(empty[it % S], r)
            else:
                T.mbarrier_arrive(empty[it % S])

    @T.macro
    def mma(A_s, B_s, C_local, full, empty, it, ko, tx):
        """Consumers, K step ``ko`` (ring iteration ``it``): issue this stage's wgmma batch, wait for the
        previous batch only, and hand the previous batch's stage back to the producer."""
        s = it % S
        T.mbarrier_wait_parity(full[s], (it // S) & 1)
        T.wgmma_gemm(A_s[s, :, :], B_s[s, :, :], C_local, transpose_A=trans_A, transpose_B=trans_B, policy=policy)
        T.wait_wgmma(1)
        if ko > 0:
            release(empty, it + S - 1, tx)

    if persistent:
        tiles = m_tiles * n_tiles  # a CTA's w-th tile is w * persistent + cta, while that is below this
        waves = math.ceil(tiles / persistent) if M_var is None else T.ceildiv(tiles, persistent)
        swizzle = config.panel_size if config.enable_rasterization else 1

    @T.macro
    def mainloop(A_s, B_s, C_local, full, empty, base, tx):
        """Consumers: every K step of one tile, from ring iteration ``base``; returns with the last batch in flight."""
        T.clear(C_local)
        for ko in T.serial(k_tiles):
            mma(A_s, B_s, C_local, full, empty, base + ko, ko, tx)

    @T.macro
    def epilogue(C, C_local, C_s, empty, last, tm, tn, tx):
        """Consumers: drain the last batch, release its stage, and store C (by TMA, waited for only before the
        next tile's C overwrites the staging tile)."""
        T.wait_wgmma(0)
        release(empty, last, tx)  # the ring runs on into the next tile
        if tma_store:
            T.tma_store_wait(0)  # the previous tile's store has read C_s
            T.copy(C_local, C_s)
            T.tma_copy(C_s, C[tm * bM:(tm + 1) * bM, tn * bN:(tn + 1) * bN])
        else:
            T.copy(C_local, C_s)
            T.copy(C_s, C[tm * bM, tn * bN])

    @T.macro
    def walk_loads(A, B, A_s, B_s, full, empty, sched, cta):
        """The persistent forms' producer: every K step of this CTA's tiles (w * persistent + cta), in turn."""
        T.set_max_nreg(PRODUCER_REGS, 0)
        for w in T.serial(waves):
            tm, tn = sched.coord(w * persistent + cta)
            if w * persistent + cta < tiles:  # the consumers' test: see the persistent form's
                for ko in T.serial(k_tiles):
                    load(A, B, A_s, B_s, full, empty, w * k_tiles + ko, ko, tm, tn)

    if pingpong:
        @T.macro
        def take_turns(C, A_s, B_s, C_local, C_s, full, empty, sched, cta, tx, p):
            """Ping-pong warpgroup ``p``: the CTA's tiles ``w = 2 h + p``, each main loop in its turn (waited for
            on ``PINGPONG_TURNS[p]``, but for warpgroup 0's first), the turn handed to the other warpgroup where
            a tile follows, then the epilogue while the other computes."""
            T.set_max_nreg(creg, 1)
            for h in T.serial(T.ceildiv(waves - p, 2)):
                if (2 * h + p) * persistent + cta < tiles:
                    tm, tn = sched.coord((2 * h + p) * persistent + cta)
                    if p == 1:
                        T.sync_threads(PINGPONG_TURNS[1], 256)  # warpgroup 0 has issued its tile's last batch
                    elif h > 0:
                        T.sync_threads(PINGPONG_TURNS[0], 256)
                    mainloop(A_s, B_s, C_local, full, empty, (2 * h + p) * k_tiles, tx)
                    if (2 * h + p + 1) * persistent + cta < tiles:
                        T.named_barrier_arrive(PINGPONG_TURNS[1 - p], 256)  # the tensor cores to the other
                    epilogue(C, C_local, C_s, empty, (2 * h + p) * k_tiles + k_tiles - 1, tm, tn, tx)
            T.tma_store_wait(0)

        @T.prim_func
        def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
                 C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(persistent, threads=ct + WS_PRODUCER_THREADS) as (cta,):
                A_s = T.alloc_shared(A_ring, in_dtype)
                B_s = T.alloc_shared(B_ring, in_dtype)
                full = T.alloc_barrier([WS_PRODUCER_THREADS] * S)
                empty = T.alloc_barrier([cwarps] * S)  # a stage's reader: one warpgroup, 4 warps
                C0 = T.alloc_fragment((bM, bN), accum_dtype)  # warpgroup 0's tile
                C1 = T.alloc_fragment((bM, bN), accum_dtype)  # warpgroup 1's
                C_s0 = T.alloc_shared((bM, bN), out_dtype)  # and their staging tiles: two stores may overlap
                C_s1 = T.alloc_shared((bM, bN), out_dtype)
                sched = T.PersistentTileScheduler(m_tiles, n_tiles, num_workers=persistent, swizzle_size=swizzle,
                                                  stateful=False)
                tx = T.get_thread_binding()
                if tx >= ct:  # the producer warpgroup: this CTA's tiles in turn, as in the persistent form
                    walk_loads(A, B, A_s, B_s, full, empty, sched, cta)
                elif tx < 128:  # warpgroup 0: the CTA's even tiles
                    take_turns(C, A_s, B_s, C0, C_s0, full, empty, sched, cta, tx, 0)
                else:  # warpgroup 1: the odd tiles
                    take_turns(C, A_s, B_s, C1, C_s1, full, empty, sched, cta, tx, 1)

        return main

    if persistent:

        @T.prim_func
        def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
                 C: T.Tensor((M, N), out_dtype)):
            with T.Kernel(persistent, threads=ct + WS_PRODUCER_THREADS) as (cta,):
                A_s = T.alloc_shared(A_ring, in_dtype)
                B_s = T.alloc_shared(B_ring, in_dtype)
                C_local = T.alloc_fragment((bM, bN), accum_dtype)
                C_s = T.alloc_shared((bM, bN), out_dtype)
                full = T.alloc_barrier([WS_PRODUCER_THREADS] * S)
                empty = T.alloc_barrier([cwarps] * S)
                sched = T.PersistentTileScheduler(m_tiles, n_tiles, num_workers=persistent, swizzle_size=swizzle,
                                                  stateful=False)
                tx = T.get_thread_binding()
                if tx >= ct:  # the producer warpgroup
                    walk_loads(A, B, A_s, B_s, full, empty, sched, cta)
                else:  # the consumer warpgroups
                    T.set_max_nreg(creg, 1)
                    for w in T.serial(waves):
                        tm, tn = sched.coord(w * persistent + cta)
                        # the tile's index, not its coordinates (the scheduler maps [0, tiles) onto the grid, so
                        # the two tests agree): on the coordinates, TileLang 0.1.15's ThreadSync failed to lower
                        # C's store sync at 16x16 tiles on 132 CTAs ("176 participating threads")
                        if w * persistent + cta < tiles:
                            mainloop(A_s, B_s, C_local, full, empty, w * k_tiles, tx)
                            epilogue(C, C_local, C_s, empty, w * k_tiles + k_tiles - 1, tm, tn, tx)
                    T.tma_store_wait(0)

        return main

    @T.prim_func
    def main(A: T.Tensor(A_shape, in_dtype), B: T.Tensor(B_shape, in_dtype),
             C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(grid[0], grid[1], threads=ct + WS_PRODUCER_THREADS,
                      cluster_dims=(csize, 1, 1) if csize > 1 else None) as (bx, by):
            A_s = T.alloc_shared(A_ring, in_dtype)
            B_s = T.alloc_shared(B_ring, in_dtype)
            C_local = T.alloc_fragment((bM, bN), accum_dtype)
            C_s = T.alloc_shared((bM, bN), out_dtype)
            full = T.alloc_barrier([WS_PRODUCER_THREADS] * S)
            if csize > 1:
                empty = T.alloc_cluster_barrier([cwarps * csize] * S)
            else:
                empty = T.alloc_barrier([cwarps] * S)
            T.use_swizzle(panel_size=config.panel_size, enable=config.enable_rasterization)
            if csize > 1:
                # TileLang's runtime launches every cluster kernel with programmatic stream serialization, so
                # it may start as soon as the kernel before it on the stream triggers its dependents: wait for
                # that kernel's memory before reading A or B or writing C (a no-op after an ordinary kernel)
                T.pdl_sync()
            tm = bx if cm > 1 else by
            tn = by if cm > 1 else bx
            tx = T.get_thread_binding()
            if tx >= ct:  # the producer warpgroup
                T.set_max_nreg(PRODUCER_REGS, 0)
                for ko in T.serial(k_tiles):
                    load(A, B, A_s, B_s, full, empty, ko, ko, tm, tn)
            else:  # the consumer warpgroups
                T.set_max_nreg(creg, 1)
                T.clear(C_local)
                for ko in T.serial(k_tiles):
                    mma(A_s, B_s, C_local, full, empty, ko, ko, tx)
                T.wait_wgmma(0)
                T.copy(C_local, C_s)
                T.copy(C_s, C[tm * bM, tn * bN])
            if csize > 1:
                T.cluster_sync()  # no CTA leaves while its peer may still arrive on its barriers

    return main
