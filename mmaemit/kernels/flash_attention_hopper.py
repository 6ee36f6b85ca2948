"""FlashAttention forward for Hopper (sm_90a): TMA + mbarrier rings + warp-specialized wgmma.

Same contract as :mod:`mmaemit.kernels.flash_attention` (Q / K / V ``[total, heads * d]`` packed, ``cu_seqlens``,
GQA, bottom-right causal, O and LSE), composed from ``mmaemit.pipeline`` (TmaTile, MbarrierRing, WarpgroupRoles)
and wgmma. One CTA = 128 query rows of one (batch, head), three warpgroups:

* producer (warpgroup 0, few registers): one thread issues the TMA loads (Q once; K and V blocks into 2-stage rings
  guarded by full / empty mbarriers). wgmma reads V [keys, d] as an N-major B operand; with ``v_major="k"`` V lands
  in a staging tile instead and the whole warpgroup transposes it into a K-major ring (ldmatrix.trans + stmatrix,
  both 128-byte swizzled);
* two consumer warpgroups, 64 query rows each: ``S = Q K^T`` with wgmma m64n{block_n}k16 SS, online softmax in
  fp32 on the accumulators (exp2, running max, quad shfl), ``O += P V`` with wgmma m64n{d}k16 RS.

Every wgmma fact comes from two ``WgmmaIntrinEmitter``s (``em_s``: SS, A = the Q tile, B = the K ring; ``em_o``: RS,
B = the V ring, N-major or K-major): the shared tiles are their operand layouts (``mmaemit.layouts.wgmma``), the TMA
boxes are built from the same layouts (``TmaTile.for_layout``), the descriptors and their per-K-step offsets come from
``init_descriptor`` / ``mma``; the softmax's row slots, its shuffle partners, the mask columns and the epilogue's
(row, column) pairs come from the accumulator layout; P goes from the S accumulators into the RS A registers by
``warpgroup_accumulator_as_operand`` (proven thread by thread over the warpgroup).

By default each consumer issues block n's Q K^T together with block n - 1's P V and the two consumers take turns
(named barriers), so one's softmax runs under the other's wgmmas, and V is read N-major straight from its TMA tile
(``HopperAttentionConfig``: ``overlap=False`` / ``v_major="k"`` give the other schedules).
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit import isa
from mmaemit.arch import as_arch
from mmaemit.emitters.builder import emit, only_if, ptx, store
from mmaemit.emitters.wgmma import WgmmaIntrinEmitter
from mmaemit.errors import TileShapeError, UnsupportedConfigError
from mmaemit.kernels.attention_spec import LN2, LOG2E, KeyBlocks, check_problem
from mmaemit.layouts.accumulator_operand import warpgroup_accumulator_as_operand
from mmaemit.layouts.wgmma import wgmma_operand_layout
from mmaemit.pipeline import MbarrierRing, TmaTile, WarpgroupRoles, mbarrier_arrive, mbarrier_expect_tx
from mmaemit.pipeline import mbarrier_init, mbarrier_wait

PANEL = 64          # 16-bit elements per 128-byte swizzled row
SMEM_LIMIT = 232448


@dataclass(frozen=True)
class HopperAttentionConfig:
    """``block_n`` keys per K / V block (a multiple of 64; the wgmma N of ``Q K^T``); register budgets per role.

    ``overlap``: each consumer issues block n's ``Q K^T`` and block n - 1's ``P V`` as one wgmma group and the two
    consumers take turns issuing (named barriers); False: ``Q K^T``, softmax, ``P V`` in sequence per block, the two
    consumers interleaving freely. ``v_major="mn"``: V goes from TMA straight to wgmma as an N-major B operand
    (``imm-trans-b`` = 1; LBO / SBO from the emitter's MN-major 128-byte layout); ``"k"``: the producer warpgroup transposes each V block into a K-major tile (ldmatrix.trans + stmatrix).
    The default (mn, overlap) is the fastest combination measured on the H100 (563 / 537 TFLOP/s at d = 128, seq
    8192; (k, overlap) 509 / 469, (k, no overlap) 529 / 494; docs/perf-notes.md); (mn, no overlap) is not measured.
    """

    block_n: int = 128
    producer_regs: int = 40
    consumer_regs: int = 232
    overlap: bool = True      # issue S_n = Q K_n^T and O += P_{n-1} V_{n-1} together, consumers taking turns
    v_major: str = "mn"       # "mn": wgmma reads V N-major from the TMA tile; "k": the producer transposes V first


def output_pairs(em, row_slots):
    """Per row slot of ``em``'s accumulators, the registers ``i`` (ascending) whose element ``i + 1`` is the next
    column of the same row in every thread: the pairs the epilogue packs into one 32-bit store."""
    pairs = [[] for _ in range(max(row_slots) + 1)]
    for i in range(0, em.local_elems_c, 2):
        for t in range(128):
            (m0, n0), (m1, n1) = em.accumulator_coords(t, i), em.accumulator_coords(t, i + 1)
            if (m1, n1) != (m0, n0 + 1):
                raise UnsupportedConfigError(f"{em.ptx()}: accumulators {i}, {i + 1} of thread {t} are not two "
                                             f"adjacent columns of one row")
        pairs[row_slots[i]].append(i)
    return pairs


def row_periodic(layout, index) -> list:
    """``layout(*index)`` (a ``SwizzleLayout``, logical -> physical) with the XOR taken from ``row % 8``: every
    swizzle of mmaemit repeats every 8 rows (checked here on ints), so for a row such as ``8 q + r`` this yields the
    short XOR operand ``r`` instead of ``(8 q + r) & 7``."""
    *lead, row, col = index
    for r in range(16):
        for c in range(0, layout.cols, 8):
            if layout(*((0,) * len(lead)), r, c)[-1] != layout(*((0,) * len(lead)), r % 8, c)[-1]:
                raise UnsupportedConfigError(f"{layout!r}: the swizzle does not repeat every 8 rows")
    *_, r8, c8 = layout(*lead, row % 8, col)
    return [*lead, row - row % 8 + r8, c8]


def default_hopper_config(head_dim) -> HopperAttentionConfig:
    return HopperAttentionConfig(block_n=64 if head_dim == 256 else 128)


def hopper_smem_bytes(head_dim, config: HopperAttentionConfig) -> int:
    """Q tile + 2-stage K ring + V staging tile (v_major "k") + 2-stage V ring (bytes, barriers excluded)."""
    return 2 * head_dim * (128 + (4 if config.v_major == "mn" else 5) * config.block_n)


def make_flash_attention_hopper(batch, max_seqlen_q, total_q, total_k, heads, kv_heads, head_dim, dtype="float16",
                                causal=False, softmax_scale=None, config: HopperAttentionConfig = None,
                                arch="sm_90a"):
    """Build ``attn(Q, K, V, O, LSE, cu_seqlens_q, cu_seqlens_k)`` (the arguments of ``make_flash_attention``).
    Returns ``(prim_func, config)``."""
    from tvm.script import tirx as T
    from tvm.tirx.script.builder import ir as IRB

    arch = as_arch(arch or "sm_90a")
    isa.require_feature("wgmma", arch)
    isa.require_feature("cp.async.bulk", arch)
    dtype, scale = check_problem(dtype, head_dim, heads, kv_heads, softmax_scale)
    cfg = config or default_hopper_config(head_dim)
    D, BN, BM, ST = head_dim, cfg.block_n, 128, 2
    if BN % PANEL or not 64 <= BN <= 256:
        raise TileShapeError(f"block_n={BN} must be a multiple of 64 in [64, 256]")
    if hopper_smem_bytes(D, cfg) + 128 > SMEM_LIMIT:
        raise UnsupportedConfigError(f"block_n={BN} with head_dim={D} needs {hopper_smem_bytes(D, cfg)} bytes of "
                                     f"shared memory (> {SMEM_LIMIT}); lower block_n")
    roles = WarpgroupRoles(1, 2, cfg.producer_regs, cfg.consumer_regs)
    OVERLAP = bool(cfg.overlap)
    if cfg.v_major not in ("k", "mn"):
        raise UnsupportedConfigError(f"v_major={cfg.v_major!r}; valid: 'k', 'mn'")
    VMN = cfg.v_major == "mn"
    SL2 = scale * LOG2E
    H, HK, GROUP = heads, kv_heads, heads // kv_heads
    MB = -(-max_seqlen_q // BM)
    # S = Q K^T: SS, A = the Q tile [BM, d] (no stages; each consumer reads its 64 rows), B = the K ring [ST, BN, d];
    # O += P V: RS, A = P from S's accumulators, B = the V ring: [keys, d] as loaded (N-major) or Vt [d, keys]
    em_s = WgmmaIntrinEmitter(dtype, dtype, "float32", BN, form="ss", block_m=BM, block_k=D, swizzle_bytes=128,
                              a_stages=(), b_stages=(ST,), arch=arch)
    em_o = WgmmaIntrinEmitter(dtype, dtype, "float32", D, form="rs", b_major="MN" if VMN else "K", block_k=BN,
                              swizzle_bytes=128, stages=(ST,), arch=arch)
    q_lay, k_lay, v_lay = em_s.a_layout, em_s.b_layout, em_o.b_layout
    vr_lay = wgmma_operand_layout(BN, D, dtype, swizzle_bytes=128)   # v_major "k": the V staging tile [keys, d]
    # Q, K and V rows of d elements arrive as one TMA box per 128-byte swizzle atom (DP atoms of SPAN columns)
    SPAN, DP = q_lay.span, D // q_lay.span
    if any(lay.span != SPAN for lay in (k_lay, v_lay, vr_lay)):
        raise UnsupportedConfigError("the Q, K and V tiles must share one swizzle atom width")
    # the P packing: K step ks of P V takes S's accumulators (register for register, proven over the warpgroup)
    P_PACK = warpgroup_accumulator_as_operand(em_s.c_layout, em_o.a_fragment_layout, em_o.k_steps)
    S_ROW, O_ROW = em_s.accumulator_row_slots(), em_o.accumulator_row_slots()   # per register: its row slot
    O_PAIRS = output_pairs(em_o, O_ROW)         # per row slot: the first registers of (col, col + 1) pairs
    ROW_SHFL = em_s.accumulator_row_shuffles()   # row max / sum: butterfly over the threads sharing a row
    if em_o.accumulator_row_shuffles() != ROW_SHFL or em_o.accumulator_row_slots()[:2] != S_ROW[:2]:
        raise UnsupportedConfigError("S and O accumulators hold their rows differently")   # one softmax state
    ROW_GROUP = 2 * max(ROW_SHFL)                # threads per row: lanes 0 .. ROW_GROUP - 1 of a row group
    CVT = "cvt.rn.f16x2.f32" if dtype == "float16" else "cvt.rn.bf16x2.f32"
    NS, NO = em_s.local_size_c, em_o.local_size_c   # accumulator registers per thread
    NEG_INF = float("-inf")
    q_map_t = TmaTile.for_layout((total_q, H * D), em_s.shared_layout("A"))
    k_map_t = TmaTile.for_layout((total_k, HK * D), em_s.shared_layout("B"))
    v_map_t = TmaTile.for_layout((total_k, HK * D), (v_lay if VMN else vr_lay).layout)
    Q_BYTES, KV_BYTES = BM * D * 2, BN * D * 2
    ring_k = MbarrierRing(ST, 2)
    ring_vt = MbarrierRing(ST, 2)

    blocks = KeyBlocks(causal, BM, BN)          # which key blocks each CTA visits and masks (both kernels)
    keys_end, needs_mask = blocks.keys_end, blocks.needs_mask

    def qk_issue(S, dq, dk, c, stage):
        """S = Q[64 c .. 64 c + 63] K[stage]^T: every K step of d (the first one overwrites S)."""
        for ki in range(em_s.k_steps):
            em_s.mma(S, dq, dk, ki, a_stage=(), b_stage=(stage,), m0=64 * c, scale_d=ki > 0)

    def pv_issue(O, P, dv, stage):
        """O += P V[stage]: every K step of the block's keys, A = P's registers of that step."""
        for ks in range(em_o.k_steps):
            em_o.mma(O, [P[ks, a] for a in range(em_o.local_size_a)], dv, ks, stage=(stage,))

    def wgmma_group(issues, pins):
        """fence, the wgmmas, commit, wait for them, pin their accumulators."""
        em_s.fence()
        for issue in issues:
            issue()
        em_s.commit_group()
        em_s.wait_group(0)
        for em, acc in pins:
            em.pin_accumulators(acc)

    def qk(S, dq, dk, c, stage):
        wgmma_group([lambda: qk_issue(S, dq, dk, c, stage)], [(em_s, S)])

    def pv(O, P, dv, stage):
        wgmma_group([lambda: pv_issue(O, P, dv, stage)], [(em_o, O)])

    def turn_wait(c):
        """Named barrier 2 + c: this consumer's turn to issue (the other consumer arrived)."""
        emit(T.ptx.bar.sync(T.Cast("uint32", 2 + c), T.uint32(256)))

    def turn_pass(c):
        emit(T.ptx.bar.arrive(T.Cast("uint32", 3 - c), T.uint32(256)))

    def mask(S, lim, tid, q_row0, seq_q, seq_k, k0, c):
        for r in range(2):
            limit = seq_k - k0
            if causal:
                row = q_row0 + em_s.m * c + em_s.accumulator_row(tid, r)
                limit = T.min(limit, row + 1 + seq_k - seq_q - k0)
            store(lim, limit, (r,))
        for i in range(NS):
            col = em_s.accumulator_coords(tid, i)[1]
            store(S, T.Select(col >= lim[S_ROW[i]], T.float32(NEG_INF), S[i]), (i,))

    def softmax(S, O, P, m_i, l_i, mx, tmp):
        for r in range(2):
            store(mx, T.float32(NEG_INF), (r,))
        for i in range(NS):
            r = S_ROW[i]
            store(mx, T.max(mx[r], S[i]), (r,))
        for r in range(2):
            for d in ROW_SHFL:
                emit(T.ptx.shfl_sync.bfly.b32(tmp[0], mx[r], T.uint32(d), T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                store(mx, T.max(mx[r], tmp[0]), (r,))
            store(mx, T.max(m_i[r], mx[r] * T.float32(SL2)), (r,))
            store(tmp, T.Select(mx[r] == T.float32(NEG_INF), T.float32(0), mx[r]), (3 + r,))   # m used for exp2
            store(tmp, T.exp2(m_i[r] - tmp[3 + r]), (1 + r,))
            store(m_i, mx[r], (r,))
            store(l_i, l_i[r] * tmp[1 + r], (r,))
        for i in range(NO):
            store(O, O[i] * tmp[1 + O_ROW[i]], (i,))
        for i in range(NS):
            r = S_ROW[i]
            store(S, T.exp2(S[i] * T.float32(SL2) - tmp[3 + r]), (i,))
            store(l_i, l_i[r] + S[i], (r,))
        for ks, step in enumerate(P_PACK):
            for a, ((lo, _), (hi, _)) in enumerate(step):
                emit(ptx(CVT)(P[ks, a], S[hi], S[lo]))

    def epilogue(O, Og, LSE, m_i, l_i, tmp, tid, h, q_start, q_row0, seq_q, c):
        lane = tid % 32
        for r in range(2):
            for d in ROW_SHFL:
                emit(T.ptx.shfl_sync.bfly.b32(tmp[0], l_i[r], T.uint32(d), T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                store(l_i, l_i[r] + tmp[0], (r,))
            store(tmp, T.Select(l_i[r] == T.float32(0), T.float32(0), T.float32(1) / l_i[r]), (1 + r,))
        pk = T.alloc_local((1,), "uint32")
        for r in range(2):
            row = q_row0 + em_o.m * c + em_o.accumulator_row(tid, r)
            with only_if(row < seq_q):
                for i in O_PAIRS[r]:                       # registers i, i + 1: row slot r, columns col, col + 1
                    emit(ptx(CVT)(pk[0], O[i + 1] * tmp[1 + r], O[i] * tmp[1 + r]))
                    emit(T.ptx["st.global.b32"](Og.ptr_to([q_start + row, h * D + em_o.accumulator_coords(tid, i)[1]]),
                                                pk[0]))
                with only_if(lane % ROW_GROUP == 0):          # one thread per row writes its LSE
                    store(LSE, T.Select(l_i[r] == T.float32(0), T.float32(NEG_INF),
                                        m_i[r] * T.float32(LN2) + T.log(l_i[r])), (h, q_start + row))

    def transpose_v(Vr, Vt, stage, tid):
        """Vt[stage] (panels of 64 keys: [d, 64] K-major) = Vr ([keys, d] in d panels)^T, 8x8 blocks through
        ldmatrix.trans (4 key blocks of one d block per x4) and stmatrix (4 rows of Vt blocks)."""
        warp, lane = tid // 32, tid % 32
        groups = (BN // 32) * (D // 8)            # (4 key blocks) x (1 d block) per instruction pair
        regs = T.alloc_local((4,), "uint32")
        mi, rr = lane // 8, lane % 8
        with IRB.serial(groups // 4) as it:
            g = warp + 4 * it
            kb4, db = g // (D // 8), g % (D // 8)
            key = 32 * kb4 + 8 * mi + rr            # ldmatrix.trans row address: matrix mi, row rr
            d0 = 8 * db
            emit(T.ptx.ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16(
                regs[0], regs[1], regs[2], regs[3], Vr.ptr_to(row_periodic(vr_lay.layout, vr_lay.index(key, d0)))))
            key0 = 32 * kb4 + 8 * mi                # stmatrix: matrix mi = Vt rows d0 .. d0+7, keys key0 .. key0+7
            emit(T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
                Vt.ptr_to(row_periodic(v_lay.layout, v_lay.index(d0 + rr, key0, stage))),
                regs[0], regs[1], regs[2], regs[3]))

    @T.prim_func
    def flash_attention_hopper(Q: T.Buffer((total_q, H * D), dtype), K: T.Buffer((total_k, HK * D), dtype),
                               V: T.Buffer((total_k, HK * D), dtype), O: T.Buffer((total_q, H * D), dtype),
                               LSE: T.Buffer((H, total_q), "float32"), CuQ: T.Buffer((batch + 1,), "int32"),
                               CuK: T.Buffer((batch + 1,), "int32")):
        q_map = q_map_t.encode(Q)
        k_map = k_map_t.encode(K)
        v_map = v_map_t.encode(V)
        T.device_entry()
        T.attr(WarpgroupRoles.launch_attr())
        bx, h, b = T.cta_id([MB, H, batch])
        wg = T.warpgroup_id([3])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        Qs = pool.alloc(em_s.a_shared_shape, dtype, align=q_lay.alignment)
        Ks = pool.alloc(em_s.b_shared_shape, dtype, align=k_lay.alignment)
        Vr = pool.alloc((8,) if VMN else vr_lay.layout.shape, dtype, align=vr_lay.alignment)
        Vt = pool.alloc(em_o.b_shared_shape, dtype, align=v_lay.alignment)      # the V ring wgmma reads
        kbars = ring_k.alloc(pool)  # noqa: F841
        vbars = ring_vt.alloc(pool)  # noqa: F841
        qv = pool.alloc((2,), "uint64", align=8)          # Q loaded, V staging tile loaded
        pool.commit()
        q_start: T.let[T.int32] = CuQ[b]
        seq_q: T.let[T.int32] = CuQ[b + 1] - CuQ[b]
        k_start: T.let[T.int32] = CuK[b]
        seq_k: T.let[T.int32] = CuK[b + 1] - CuK[b]
        mb = T.meta_var(MB - 1 - bx)
        q_row0 = T.meta_var(mb * BM)
        hk = T.meta_var(h // GROUP)
        if q_row0 < seq_q:
            n_end: T.let[T.int32] = keys_end(q_row0, seq_q, seq_k)
            nb: T.let[T.int32] = (n_end + BN - 1) // BN
            ring_k.init(T.And(wg == 0, tid == 0))
            ring_vt.init(T.And(wg == 0, tid == 0))
            if T.And(wg == 0, tid == 0):
                mbarrier_init(qv.ptr_to([0]), 1)
                mbarrier_init(qv.ptr_to([1]), 1)
                T.ptx.fence.mbarrier_init.release.cluster()
            T.cuda.cta_sync()
            if wg == 0:
                roles.producer_setup()
                if nb > 0:
                    if tid == 0:
                        mbarrier_expect_tx(qv.ptr_to([0]), Q_BYTES)
                        for p in T.unroll(DP):
                            q_map_t.load(Qs.ptr_to(list(q_lay.index(0, p * SPAN))), q_map,
                                         (q_start + q_row0, h * D + p * SPAN), qv.ptr_to([0]))
                for n in T.serial(nb):
                    if tid == 0:
                        ring_k.producer_acquire(n)
                        ring_k.producer_expect(n, KV_BYTES)
                        for p in T.unroll(DP):
                            k_map_t.load(Ks.ptr_to(list(k_lay.index(0, p * SPAN, n % ST))), k_map,
                                         (k_start + n * BN, hk * D + p * SPAN), ring_k.full_ptr(n))
                        if VMN:
                            ring_vt.producer_acquire(n)
                            ring_vt.producer_expect(n, KV_BYTES)
                            for p in T.unroll(DP):
                                v_map_t.load(Vt.ptr_to(list(v_lay.index(p * SPAN, 0, n % ST))), v_map,
                                             (k_start + n * BN, hk * D + p * SPAN), ring_vt.full_ptr(n))
                        else:
                            mbarrier_expect_tx(qv.ptr_to([1]), KV_BYTES)
                            for p in T.unroll(DP):
                                v_map_t.load(Vr.ptr_to(list(vr_lay.index(0, p * SPAN))), v_map,
                                             (k_start + n * BN, hk * D + p * SPAN), qv.ptr_to([1]))
                    if not VMN:
                        mbarrier_wait(qv.ptr_to([1]), n % 2)        # V block n staged
                        ring_vt.producer_acquire(n)                 # its transposed stage is free
                        transpose_v(Vr, Vt, n % ST, tid)
                        T.ptx.fence.proxy.async_.shared__cta()      # stmatrix writes -> wgmma (async proxy) reads
                        T.ptx.bar.sync(T.uint32(1), T.uint32(128))  # every producer thread done with Vr and Vt
                        mbarrier_arrive(ring_vt.full_ptr(n), pred=tid == 0)
            else:
                roles.consumer_setup()
                c = T.meta_var(wg - 1)
                S = em_s.alloc_accumulators()
                Oa = em_o.alloc_accumulators()
                P = em_o.alloc_a_fragment()                      # [BN / 16 K steps, 4] packed P
                m_i = T.alloc_local((2,), "float32")
                l_i = T.alloc_local((2,), "float32")
                mx = T.alloc_local((2,), "float32")
                tmp = T.alloc_local((5,), "float32")
                lim = T.alloc_local((2,), "int32")
                dq = em_s.alloc_descriptor()
                dk = em_s.alloc_descriptor()
                dv = em_o.alloc_descriptor()
                em_s.init_descriptor(dq, Qs, "A")
                em_s.init_descriptor(dk, Ks, "B")
                em_o.init_descriptor(dv, Vt, "B")
                for r in T.unroll(2):
                    m_i[r] = T.float32(NEG_INF)
                    l_i[r] = T.float32(0)
                for i in T.unroll(NO):
                    Oa[i] = T.float32(0)
                if nb > 0:
                    mbarrier_wait(qv.ptr_to([0]), 0)
                if OVERLAP:
                    if T.And(c == 1, nb > 0):
                        turn_pass(c)                            # consumer 0 issues first
                    for n in T.serial(nb):
                        ring_k.consumer_wait(n)
                        if n > 0:
                            ring_vt.consumer_wait(n - 1)
                        turn_wait(c)
                        em_s.fence()
                        qk_issue(S, dq, dk, c, n % ST)
                        if n > 0:
                            pv_issue(Oa, P, dv, (n - 1) % ST)
                        em_s.commit_group()
                        if T.Or(c == 0, n + 1 < nb):            # consumer 0 waits exactly nb turns
                            turn_pass(c)
                        em_s.wait_group(0)
                        em_s.pin_accumulators(S)
                        em_o.pin_accumulators(Oa)
                        ring_k.consumer_release(n, pred=tid == 0)
                        if n > 0:
                            ring_vt.consumer_release(n - 1, pred=tid == 0)
                        if needs_mask(n, q_row0, seq_q, seq_k):
                            mask(S, lim, tid, q_row0, seq_q, seq_k, n * BN, c)
                        softmax(S, Oa, P, m_i, l_i, mx, tmp)
                    if nb > 0:
                        ring_vt.consumer_wait(nb - 1)
                        pv(Oa, P, dv, (nb - 1) % ST)
                        ring_vt.consumer_release(nb - 1, pred=tid == 0)
                else:
                    for n in T.serial(nb):
                        ring_k.consumer_wait(n)
                        qk(S, dq, dk, c, n % ST)
                        ring_k.consumer_release(n, pred=tid == 0)
                        if needs_mask(n, q_row0, seq_q, seq_k):
                            mask(S, lim, tid, q_row0, seq_q, seq_k, n * BN, c)
                        softmax(S, Oa, P, m_i, l_i, mx, tmp)
                        ring_vt.consumer_wait(n)
                        pv(Oa, P, dv, n % ST)
                        ring_vt.consumer_release(n, pred=tid == 0)
                epilogue(Oa, O, LSE, m_i, l_i, tmp, tid, h, q_start, q_row0, seq_q, c)

    return flash_attention_hopper, cfg
