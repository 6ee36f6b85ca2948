"""FlashAttention forward for Hopper (sm_90a): TMA + mbarrier rings + warp-specialized wgmma.

Same contract as :mod:`mmaemit.kernels.flash_attention` (Q / K / V ``[total, heads * d]`` packed, ``cu_seqlens``,
GQA, bottom-right causal, O and LSE), composed from ``mmaemit.pipeline`` (TmaTile, MbarrierRing, WarpgroupRoles)
and wgmma. One CTA = 128 query rows of one (batch, head), three warpgroups:

* producer (warpgroup 0, few registers): one thread issues the TMA loads (Q once; K and V blocks into 2-stage rings
  guarded by full / empty mbarriers). wgmma reads V [keys, d] as an N-major B operand; with ``v_major="k"`` V lands
  in a staging tile instead and the whole warpgroup transposes it into a K-major ring (ldmatrix.trans + stmatrix,
  both 128-byte swizzled);
* two consumer warpgroups, 64 query rows each: ``S = Q K^T`` with wgmma m64n{block_n}k16 SS (Q and K through matrix
  descriptors), online softmax in fp32 on the accumulators (exp2, running max, quad shfl), ``O += P V`` with wgmma
  m64n{d}k16 RS: P goes from the S accumulators into the A registers by ``accumulator_as_operand`` — per warp the
  wgmma accumulator of an n8 block is the m16n8 C fragment and the RS A operand the m16n8k16 A fragment, so the
  proven mma.sync map applies unchanged.

By default each consumer issues block n's Q K^T together with block n - 1's P V and the two consumers take turns
(named barriers), so one's softmax runs under the other's wgmmas, and V is read N-major straight from its TMA tile
(``HopperAttentionConfig``: ``overlap=False`` / ``v_major="k"`` give the other schedules).
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit import isa
from mmaemit.arch import as_arch
from mmaemit.emitters.builder import emit, only_if, ptx, store
from mmaemit.errors import TileShapeError, UnsupportedConfigError
from mmaemit.kernels.attention_spec import LN2, LOG2E, check_problem
from mmaemit.layouts import make_mma_swizzle_layout, mma_fragment
from mmaemit.layouts.accumulator_operand import accumulator_as_operand
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
    (``imm-trans-b`` = 1, LBO = the 64-column panel stride, SBO = 1024 B: the PTX ISA canonical MN-major 128-byte
    layout); ``"k"``: the producer warpgroup transposes each V block into a K-major tile (ldmatrix.trans + stmatrix).
    The default (mn, overlap) is the fastest combination measured on the H100 (563 / 537 TFLOP/s at d = 128, seq
    8192; (k, overlap) 509 / 469, (k, no overlap) 529 / 494; docs/perf-notes.md); (mn, no overlap) is not measured.
    """

    block_n: int = 128
    producer_regs: int = 40
    consumer_regs: int = 232
    overlap: bool = True      # issue S_n = Q K_n^T and O += P_{n-1} V_{n-1} together, consumers taking turns
    v_major: str = "mn"       # "mn": wgmma reads V N-major from the TMA tile; "k": the producer transposes V first


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
    V_LBO = BN * 128 // 16 if VMN else 1      # N-major: the stride between 64-column panels (16-byte units)
    SL2 = scale * LOG2E
    H, HK, GROUP = heads, kv_heads, heads // kv_heads
    MB = -(-max_seqlen_q // BM)
    DP, NP = D // PANEL, BN // PANEL            # 128-byte panels of a d-wide row / of a block_n-wide row
    ins = isa.select_mma(dtype, dtype, "float32", k=16)
    cfrag = mma_fragment(ins, "C")              # per warp and n8 block, the wgmma accumulator layout
    reuse = accumulator_as_operand(dtype, "float32")
    tok = "f16" if dtype == "float16" else "bf16"
    WG_S = f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{tok}.{tok}"
    WG_O = f"wgmma.mma_async.sync.aligned.m64n{D}k16.f32.{tok}.{tok}"
    CVT = "cvt.rn.f16x2.f32" if dtype == "float16" else "cvt.rn.bf16x2.f32"
    NS, NO = BN // 2, D // 2                    # accumulator registers per thread
    NEG_INF = float("-inf")
    q_map_t = TmaTile((total_q, H * D), dtype, (BM, PANEL), 128)
    k_map_t = TmaTile((total_k, HK * D), dtype, (BN, PANEL), 128)
    swz = make_mma_swizzle_layout((8, PANEL), dtype)      # the 128-byte swizzle TMA writes and wgmma reads
    Q_BYTES, KV_BYTES = BM * D * 2, BN * D * 2
    ring_k = MbarrierRing(ST, 2)
    ring_vt = MbarrierRing(ST, 2)

    def panel_index(row, col):
        """Element offset of (row, col) inside a [rows, 64] 128-byte-swizzled panel."""
        r, c = swz(row % 8, col)
        return (row - row % 8 + r) * PANEL + c

    def desc_add(base, byte_offset):
        return base[0] + T.Cast("uint64", byte_offset // 16)

    def keys_end(q_row0, seq_q, seq_k):
        if not causal:
            return seq_k
        return T.max(T.min(seq_k, T.min(seq_q, q_row0 + BM) + seq_k - seq_q), 0)

    def needs_mask(n, q_row0, seq_q, seq_k):
        past_end = (n + 1) * BN > seq_k
        if not causal:
            return past_end
        return T.Or(past_end, (n + 1) * BN - 1 > q_row0 + seq_k - seq_q)

    def pin(acc, n):
        # after wgmma.wait_group: the wait writes the accumulators, which nvcc cannot see
        for i in range(n):
            emit(T.ptx.mov.b32(acc[i], acc[i]))

    def qk_issue(S, dq, dk, c, stage):
        for k in range(D // 16):
            a = desc_add(dq, (k // 4) * BM * 128 + c * 64 * 128 + (k % 4) * 32)
            b = desc_add(dk, stage * KV_BYTES + (k // 4) * BN * 128 + (k % 4) * 32)
            emit(T.ptx[WG_S](*[S[i] for i in range(NS)], a, b, k > 0, 1, 1, 0, 0))

    def pv_issue(O, P, dv, stage):
        for ks in range(BN // 16):
            if VMN:   # V [keys, d] panels as loaded: k-step ks = 16 rows further
                b = desc_add(dv, stage * KV_BYTES + ks * 16 * 128)
            else:     # Vt [d, keys] panels of 64 keys
                b = desc_add(dv, stage * KV_BYTES + (ks // 4) * D * 128 + (ks % 4) * 32)
            emit(T.ptx[WG_O](*[O[i] for i in range(NO)], *[P[4 * ks + a] for a in range(4)], b, True, 1, 1,
                             1 if VMN else 0))

    def wgmma_group(issues, pins):
        """fence, the wgmmas, commit, wait for them, pin their accumulators."""
        emit(T.ptx.wgmma.fence.sync.aligned())
        for issue in issues:
            issue()
        emit(T.ptx.wgmma.commit_group.sync.aligned())
        emit(T.ptx.wgmma.wait_group.sync.aligned(0))
        for acc, n in pins:
            pin(acc, n)

    def qk(S, dq, dk, c, stage):
        wgmma_group([lambda: qk_issue(S, dq, dk, c, stage)], [(S, NS)])

    def pv(O, P, dv, stage):
        wgmma_group([lambda: pv_issue(O, P, dv, stage)], [(O, NO)])

    def turn_wait(c):
        """Named barrier 2 + c: this consumer's turn to issue (the other consumer arrived)."""
        emit(T.ptx.bar.sync(T.Cast("uint32", 2 + c), T.uint32(256)))

    def turn_pass(c):
        emit(T.ptx.bar.arrive(T.Cast("uint32", 3 - c), T.uint32(256)))

    def slot(i, lane):
        """(row slot 0/1, column in the block) of accumulator register i (n8 block i // 4, fragment reg i % 4)."""
        r, col = cfrag.forward(lane, i % 4)
        return cfrag.forward(0, i % 4)[0] // 8, 8 * (i // 4) + col

    def mask(S, lim, tid, q_row0, seq_q, seq_k, k0, c):
        for r in range(2):
            limit = seq_k - k0
            if causal:
                row = q_row0 + 64 * c + 16 * (tid // 32) + (tid % 32) // 4 + 8 * r
                limit = T.min(limit, row + 1 + seq_k - seq_q - k0)
            store(lim, limit, (r,))
        lane = tid % 32
        for i in range(NS):
            r, col = slot(i, lane)
            store(S, T.Select(col >= lim[r], T.float32(NEG_INF), S[i]), (i,))

    def softmax(S, O, P, m_i, l_i, mx, tmp, lane):
        for r in range(2):
            store(mx, T.float32(NEG_INF), (r,))
        for i in range(NS):
            r = slot(i, lane)[0]
            store(mx, T.max(mx[r], S[i]), (r,))
        for r in range(2):
            for d in (1, 2):
                emit(T.ptx.shfl_sync.bfly.b32(tmp[0], mx[r], T.uint32(d), T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                store(mx, T.max(mx[r], tmp[0]), (r,))
            store(mx, T.max(m_i[r], mx[r] * T.float32(SL2)), (r,))
            store(tmp, T.Select(mx[r] == T.float32(NEG_INF), T.float32(0), mx[r]), (3 + r,))   # m used for exp2
            store(tmp, T.exp2(m_i[r] - tmp[3 + r]), (1 + r,))
            store(m_i, mx[r], (r,))
            store(l_i, l_i[r] * tmp[1 + r], (r,))
        for i in range(NO):
            store(O, O[i] * tmp[1 + slot(i, lane)[0]], (i,))
        for i in range(NS):
            r = slot(i, lane)[0]
            store(S, T.exp2(S[i] * T.float32(SL2) - tmp[3 + r]), (i,))
            store(l_i, l_i[r] + S[i], (r,))
        for ks in range(BN // 16):
            for a, ((h0, c0, _), (h1, c1, _)) in enumerate(reuse.pack_order()):
                emit(ptx(CVT)(P[4 * ks + a], S[4 * (2 * ks + h1) + c1], S[4 * (2 * ks + h0) + c0]))

    def epilogue(O, Og, LSE, m_i, l_i, tmp, tid, h, q_start, q_row0, seq_q, c):
        lane = tid % 32
        for r in range(2):
            for d in (1, 2):
                emit(T.ptx.shfl_sync.bfly.b32(tmp[0], l_i[r], T.uint32(d), T.uint32(0x1F), T.uint32(0xFFFFFFFF)))
                store(l_i, l_i[r] + tmp[0], (r,))
            store(tmp, T.Select(l_i[r] == T.float32(0), T.float32(0), T.float32(1) / l_i[r]), (1 + r,))
        pk = T.alloc_local((1,), "uint32")
        for r in range(2):
            row = q_row0 + 64 * c + 16 * (tid // 32) + lane // 4 + 8 * r
            with only_if(row < seq_q):
                for j in range(D // 8):
                    i = 4 * j + 2 * r                      # fragment regs 2 r, 2 r + 1: row half r, columns 2t, 2t+1
                    emit(ptx(CVT)(pk[0], O[i + 1] * tmp[1 + r], O[i] * tmp[1 + r]))
                    emit(T.ptx["st.global.b32"](Og.ptr_to([q_start + row, h * D + slot(i, lane)[1]]), pk[0]))
                with only_if(lane % 4 == 0):
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
                regs[0], regs[1], regs[2], regs[3],
                Vr.ptr_to([(d0 // PANEL) * BN * PANEL + panel_index(key, d0 % PANEL)])))
            key0 = 32 * kb4 + 8 * mi                # stmatrix: matrix mi = Vt rows d0 .. d0+7, keys key0 .. key0+7
            emit(T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
                Vt.ptr_to([stage * BN * D + (key0 // PANEL) * D * PANEL + panel_index(d0 + rr, key0 % PANEL)]),
                regs[0], regs[1], regs[2], regs[3]))

    @T.prim_func
    def flash_attention_hopper(Q: T.Buffer((total_q, H * D), dtype), K: T.Buffer((total_k, HK * D), dtype),
                               V: T.Buffer((total_k, HK * D), dtype), O: T.Buffer((total_q, H * D), dtype),
                               LSE: T.Buffer((H, total_q), "float32"), CuQ: T.Buffer((batch + 1,), "int32"),
                               CuK: T.Buffer((batch + 1,), "int32")):
        q_map = q_map_t.encode(Q)
        k_map = k_map_t.encode(K)
        v_map = k_map_t.encode(V)
        T.device_entry()
        T.attr(WarpgroupRoles.launch_attr())
        bx, h, b = T.cta_id([MB, H, batch])
        wg = T.warpgroup_id([3])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        Qs = pool.alloc((BM * D,), dtype, align=1024)
        Ks = pool.alloc((ST * BN * D,), dtype, align=1024)
        Vr = pool.alloc((8 if VMN else BN * D,), dtype, align=1024)
        Vt = pool.alloc((ST * BN * D,), dtype, align=1024)
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
                            q_map_t.load(Qs.ptr_to([p * BM * PANEL]), q_map, (q_start + q_row0, h * D + p * PANEL),
                                         qv.ptr_to([0]))
                for n in T.serial(nb):
                    if tid == 0:
                        ring_k.producer_acquire(n)
                        ring_k.producer_expect(n, KV_BYTES)
                        for p in T.unroll(DP):
                            k_map_t.load(Ks.ptr_to([(n % ST) * BN * D + p * BN * PANEL]), k_map,
                                         (k_start + n * BN, hk * D + p * PANEL), ring_k.full_ptr(n))
                        if VMN:
                            ring_vt.producer_acquire(n)
                            ring_vt.producer_expect(n, KV_BYTES)
                            for p in T.unroll(DP):
                                k_map_t.load(Vt.ptr_to([(n % ST) * BN * D + p * BN * PANEL]), v_map,
                                             (k_start + n * BN, hk * D + p * PANEL), ring_vt.full_ptr(n))
                        else:
                            mbarrier_expect_tx(qv.ptr_to([1]), KV_BYTES)
                            for p in T.unroll(DP):
                                k_map_t.load(Vr.ptr_to([p * BN * PANEL]), v_map,
                                             (k_start + n * BN, hk * D + p * PANEL), qv.ptr_to([1]))
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
                S = T.alloc_local((NS,), "float32")
                Oa = T.alloc_local((NO,), "float32")
                P = T.alloc_local((2 * BN // 4,), "uint32")
                m_i = T.alloc_local((2,), "float32")
                l_i = T.alloc_local((2,), "float32")
                mx = T.alloc_local((2,), "float32")
                tmp = T.alloc_local((5,), "float32")
                lim = T.alloc_local((2,), "int32")
                dq = T.alloc_local((1,), "uint64")
                dk = T.alloc_local((1,), "uint64")
                dv = T.alloc_local((1,), "uint64")
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(dq[0]), Qs.ptr_to([0]), 1, 64, 3)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(dk[0]), Ks.ptr_to([0]), 1, 64, 3)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(dv[0]), Vt.ptr_to([0]), V_LBO, 64, 3)
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
                        T.ptx.wgmma.fence.sync.aligned()
                        qk_issue(S, dq, dk, c, n % ST)
                        if n > 0:
                            pv_issue(Oa, P, dv, (n - 1) % ST)
                        T.ptx.wgmma.commit_group.sync.aligned()
                        if T.Or(c == 0, n + 1 < nb):            # consumer 0 waits exactly nb turns
                            turn_pass(c)
                        T.ptx.wgmma.wait_group.sync.aligned(0)
                        pin(S, NS)
                        pin(Oa, NO)
                        ring_k.consumer_release(n, pred=tid == 0)
                        if n > 0:
                            ring_vt.consumer_release(n - 1, pred=tid == 0)
                        if needs_mask(n, q_row0, seq_q, seq_k):
                            mask(S, lim, tid, q_row0, seq_q, seq_k, n * BN, c)
                        softmax(S, Oa, P, m_i, l_i, mx, tmp, tid % 32)
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
                        softmax(S, Oa, P, m_i, l_i, mx, tmp, tid % 32)
                        ring_vt.consumer_wait(n)
                        pv(Oa, P, dv, n % ST)
                        ring_vt.consumer_release(n, pred=tid == 0)
                epilogue(Oa, O, LSE, m_i, l_i, tmp, tid, h, q_start, q_row0, seq_q, c)

    return flash_attention_hopper, cfg
