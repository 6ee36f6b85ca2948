"""Hopper (sm_90a) GEMM: TMA + mbarrier ring + warp-specialized persistent wgmma, C[M, N] = A @ B^T.

Composed from ``mmaemit.pipeline`` blocks (TmaTile, MbarrierRing, WarpgroupRoles, PersistentTileScheduler) and
wgmma. Per CTA (one per SM, persistent), per output tile of ``64 * consumers`` x ``block_n``:

* producer warpgroup (40 registers): one elected thread walks the CTA's tiles and K blocks, waits for a free ring
  stage (empty barrier), arms the full barrier with the stage's bytes and issues two TMA box loads (A: 64*consumers
  rows x 128 bytes, B: block_n rows x 128 bytes, both 128-byte swizzled; B multicast over a cluster of
  ``cluster_m`` CTAs that share the tile column, each CTA loading 1/cluster_m of it);
* consumer warpgroups (232 registers), each owning 64 rows of the tile: wait for the stage (full barrier), issue
  128 / 32 wgmma.m64n{block_n}k{16|32} (SS: both operands from the swizzled stage through matrix descriptors), commit,
  wait, release the stage (empty barrier, one arrival per warpgroup and cluster CTA);
* epilogue per consumer: accumulators -> output dtype -> a 128-byte-swizzled staging buffer (stmatrix for 16-bit
  outputs, st.shared.v2 for 32-bit) -> TMA box stores (asynchronous: the next tile's main loop starts while the
  store drains; the staging buffer is reused only after ``cp.async.bulk.wait_group.read``).

Operands: A [M, K] and B [N, K] (both K-contiguous: ``trans_a=False, trans_b=True``, the layout of
``torch.nn.Linear`` weights; 16-bit inputs may also be M / N-contiguous: ``trans_a=True`` A [K, M],
``trans_b=False`` B [K, N], read MN-major by wgmma), M, N, K any sizes whose rows are 16-byte multiples (the
contiguous dimension of each operand a multiple of 8 for 16-bit, 16 for 8-bit inputs, N likewise for the output):
ragged edges are handled by TMA bounds (zero fill on load, clipped stores), not by padding. Dtypes: float16 /
bfloat16 (f32 accumulators; out f16, bf16 or f32), float8_e4m3fn / float8_e5m2 (f32 accumulators; out bf16, f16
or f32; optional per-tensor scales ``scale_a * scale_b`` applied in the epilogue), int8 / uint8 (s32 accumulators,
int32 out).

    python -m mmaemit.kernels.gemm_hopper --m 4096 --n 4096 --k 4096       # needs an H100
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit import isa
from mmaemit.arch import as_arch, device_sm_count
from mmaemit.dtypes import bits, canonical
from mmaemit.emitters.wgmma import WgmmaIntrinEmitter
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.layouts.wgmma import make_wgmma_layout
from mmaemit.pipeline import MbarrierRing, PersistentTileScheduler, TmaTile, WarpgroupRoles, bulk_commit, bulk_wait

#: input dtype -> (accumulator dtype, valid output dtypes); the wgmma facts (K, legal N) come from isa.WGMMA_TABLE
DTYPES = {
    "float16": ("float32", ("float16", "bfloat16", "float32")),
    "bfloat16": ("float32", ("bfloat16", "float16", "float32")),
    "float8_e4m3fn": ("float32", ("bfloat16", "float16", "float32")),
    "float8_e5m2": ("float32", ("bfloat16", "float16", "float32")),
    "int8": ("int32", ("int32",)),
    "uint8": ("int32", ("int32",)),
}
#: largest dynamic shared memory per block on sm_90 (227 KB)
SMEM_LIMIT = 232448
SPAN = 128          # bytes per shared row: one 128-byte swizzle span (BK = 128 / element bytes)
EPI_ROWS = 64       # rows of a staging box (one consumer warpgroup)


@dataclass(frozen=True)
class HopperGemmConfig:
    """Tile configuration. ``block_n``: the wgmma N (multiple of 16 up to 256); the CTA tile is
    ``64 * consumers`` x ``block_n`` x (128 bytes of K). ``stages``: ring depth. ``epilogue_boxes``: 64 x 128-byte
    staging boxes per consumer and round (the output row block is ``block_n * out bytes / 128`` boxes).
    ``panel``: tile rows per rasterization panel. ``cluster_m``: CTAs per cluster sharing (multicasting) B.
    ``num_sms``: persistent grid size (None: the visible GPU's SM count, 132 without one). ``in_flight``: wgmma
    groups a consumer leaves running when it moves to the next K block (0: wait for each block before releasing
    its stage; 1: release the previous block's stage once the current one is issued). ``epilogue``: ``"overlap"``
    (16-bit outputs: pack a tile's outputs into registers and store them while the next tile's first K blocks run)
    or ``"after"`` (store from the accumulators before the next tile starts)."""

    block_n: int = 256
    consumers: int = 2
    stages: int = 4
    epilogue_boxes: int = 2
    panel: int = 16
    cluster_m: int = 1
    producer_regs: int = 40
    consumer_regs: int = 232
    num_sms: int | None = None
    in_flight: int = 1
    epilogue: str = "after"


def default_out_dtype(dtype) -> str:
    """The output dtype when none is given: the input's for 16-bit, bfloat16 for fp8, int32 for int8."""
    dtype = canonical(dtype)
    if dtype not in DTYPES:
        raise UnsupportedConfigError(f"input dtype {dtype!r} is not supported by the Hopper GEMM; valid: "
                                     f"{choices(DTYPES)}")
    return dtype if bits(dtype) == 16 else DTYPES[dtype][1][0]


def smem_bytes(dtype, out_dtype, config: HopperGemmConfig) -> int:
    """Dynamic shared memory of the kernel: the ring, the staging boxes and the barriers."""
    bm = 64 * config.consumers
    ring = config.stages * (bm + config.block_n) * SPAN
    staging = config.consumers * config.epilogue_boxes * EPI_ROWS * SPAN
    return ring + staging + 16 * config.stages


def make_gemm_hopper(M, N, K, dtype="float16", out_dtype=None, trans_a=False, trans_b=True,
                     config: HopperGemmConfig = HopperGemmConfig(), arch="sm_90a", *, scaled=None):
    """Build ``gemm(A, B, C)`` (``gemm(A, B, C, scale_a, scale_b)`` for scaled fp8: float32 tensors of shape [1])
    computing ``C = A @ B^T`` (times ``scale_a * scale_b``). Returns ``(prim_func, config)``.

    ``trans_a=False``: A is [M, K]; ``trans_b=True``: B is [N, K] (both K-contiguous). 16-bit inputs also take
    ``trans_a=True`` (A is [K, M], M-contiguous) and ``trans_b=False`` (B is [K, N]): wgmma reads them MN-major
    through the descriptor's transpose bit, from 128-byte-swizzled tiles of 64 M / N by ``BK`` K that TMA loads one
    box per 64 columns; 8-bit inputs must be K-contiguous.
    ``out_dtype`` None: the input dtype for 16-bit inputs, bfloat16 for fp8, int32 for int8.
    ``scaled`` (fp8 only; default True for fp8): take the two per-tensor scales.
    ``M=None``: a symbolic M (an int32 variable bound from A's shape at every call; the tensor maps of A and C are
    encoded from the arguments' shapes at every launch): one compiled kernel for every M >= 1, on ``num_sms``
    persistent CTAs (those without a tile return at once); needs ``cluster_m=1``.
    """
    from tvm.script import tirx as T

    arch = as_arch(arch or "sm_90a")
    isa.require_feature("wgmma", arch)
    isa.require_feature("cp.async.bulk", arch)
    dtype = canonical(dtype)
    if dtype not in DTYPES:
        raise UnsupportedConfigError(f"input dtype {dtype!r} is not supported by the Hopper GEMM; valid: "
                                     f"{choices(DTYPES)}")
    acc_dtype, outs = DTYPES[dtype]
    out_dtype = canonical(out_dtype) if out_dtype is not None else default_out_dtype(dtype)
    if out_dtype not in outs:
        raise UnsupportedConfigError(f"{dtype} inputs give {choices(outs)} outputs, not {out_dtype!r}")
    a_major, b_major = ("MN" if trans_a else "K"), ("K" if trans_b else "MN")
    if "MN" in (a_major, b_major) and bits(dtype) != 16:
        raise UnsupportedConfigError(
            f"trans_a={trans_a}, trans_b={trans_b}: wgmma reads {dtype} operands K-major only, so this kernel takes "
            f"them K-contiguous: A [M, K] (trans_a=False) and B [N, K] (trans_b=True); transpose the other operand "
            f"once (x.T.contiguous()). M/N-contiguous operands work for float16 / bfloat16")
    if trans_a and M is None:
        raise UnsupportedConfigError("trans_a=True (A [K, M]) needs a static M: M is A's contiguous dimension, "
                                     "which the tensor map must know is a multiple of 16 bytes; pass M")
    is_fp8 = dtype.startswith("float8")
    if scaled is None:
        scaled = is_fp8
    if scaled and not is_fp8:
        raise UnsupportedConfigError(f"scaled=True is for fp8 inputs; {dtype} has no per-tensor scales")
    cfg = config
    BN, NC, ST, EB = cfg.block_n, cfg.consumers, cfg.stages, cfg.epilogue_boxes
    valid_n = isa_wgmma_n(dtype)                   # isa.WGMMA_TABLE's legal N
    # one wgmma per k step covers block_n columns, or two of block_n / 2 (int8 has no N above 224)
    NSPLIT = 1 if BN in valid_n else 2
    if BN % NSPLIT or BN // NSPLIT not in valid_n:
        raise TileShapeError(f"block_n={BN} is neither a wgmma N for {dtype} nor twice one; valid N: "
                             f"{choices(valid_n)}")
    if cfg.in_flight not in (0, 1):
        raise UnsupportedConfigError(f"in_flight={cfg.in_flight}; valid: 0, 1")
    if NC not in (1, 2):
        raise UnsupportedConfigError(f"consumers={NC}; valid: 1, 2 (64 output rows each)")
    roles = WarpgroupRoles(1, NC, cfg.producer_regs, cfg.consumer_regs)
    if BN // 2 + 40 > cfg.consumer_regs:
        raise UnsupportedConfigError(f"block_n={BN} needs {BN // 2} accumulator registers per thread; "
                                     f"consumer_regs={cfg.consumer_regs} leaves too few for the rest")
    DYN = M is None
    if DYN:
        import tvm

        if cfg.cluster_m != 1:
            raise UnsupportedConfigError(f"a symbolic M (M=None) takes cluster_m=1, not {cfg.cluster_m}")
        M = tvm.tirx.Var("m", "int32")
    elif not isinstance(M, int) or M < 1 or N < 1 or K < 1:
        raise TileShapeError(f"M, N, K must be >= 1; got {M}, {N}, {K}")
    eb_in, eb_out = bits(dtype) // 8, bits(out_dtype) // 8
    BK = SPAN // eb_in
    BM = 64 * NC
    OUT_COLS = SPAN // eb_out                      # output columns per staging box
    if BN % OUT_COLS:
        raise TileShapeError(f"block_n={BN} must be a multiple of {OUT_COLS} ({out_dtype} staging boxes of 128 B)")
    NBOX = BN // OUT_COLS
    if EB < 1 or NBOX % EB:
        raise UnsupportedConfigError(f"epilogue_boxes={EB} must divide the {NBOX} boxes of a {BN}-column row block")
    smem = smem_bytes(dtype, out_dtype, cfg)
    if smem > SMEM_LIMIT:
        raise UnsupportedConfigError(f"{smem} bytes of shared memory > {SMEM_LIMIT}: lower stages ({ST}), "
                                     f"epilogue_boxes ({EB}) or block_n ({BN})")
    CL = cfg.cluster_m
    if CL not in (1, 2):
        raise UnsupportedConfigError(f"cluster_m={CL}; valid: 1, 2")
    if BN % CL or (BN // CL) % 8:
        raise TileShapeError(f"block_n={BN} must split into {CL} multicast pieces of a multiple of 8 rows")
    NI = BN // NSPLIT                              # N of one wgmma instruction
    # the wgmma emitter owns the operand tiles: 128-byte swizzle; K-major: one K atom (BK = 128 bytes) per stage,
    # MN-major: BM / 64 (A) or BN / 64 (B) atoms of 64 M / N columns by BK K rows. The TMA boxes are built from the
    # same layout objects (one source for the swizzle): one box per atom
    em = WgmmaIntrinEmitter(dtype, dtype, acc_dtype, NI, form="ss", a_major=a_major, b_major=b_major, block_m=BM,
                            block_n=BN, block_k=BK, swizzle_bytes=SPAN, stages=(ST,), arch=arch)
    a_lay, b_lay = em.a_layout, em.b_layout
    A_SHAPE = (K, M) if trans_a else (M, K)
    B_SHAPE = (N, K) if trans_b else (K, N)
    a_map_t = TmaTile.for_layout(A_SHAPE, em.shared_layout("A"))
    if b_major == "K":
        b_map_t = TmaTile.for_layout(B_SHAPE, make_wgmma_layout(BN // CL, BK, dtype, swizzle_bytes=SPAN),
                                     multicast=CL)
    else:
        if (BN // CL) % b_lay.span:
            raise TileShapeError(f"block_n={BN}: an N-contiguous B loads {b_lay.span}-column boxes, so each of the "
                                 f"{CL} cluster CTAs needs a multiple of {b_lay.span} columns")
        b_map_t = TmaTile.for_layout(B_SHAPE, em.shared_layout("B"), multicast=CL)
    c_map_t = TmaTile((M, N), out_dtype, (EPI_ROWS, OUT_COLS), SPAN)
    GN, KT = -(-N // BN), -(-K // BK)
    sms = cfg.num_sms if cfg.num_sms is not None else device_sm_count()
    if DYN:
        GM = (M + (BM - 1)) // BM
        sched = PersistentTileScheduler(GM, GN, sms, cfg.panel, 1)
    else:
        GM = -(-M // BM)
        GM = -(-GM // CL) * CL
        sched = PersistentTileScheduler(GM, GN, max(1, min(sms // CL, GM // CL * GN)), cfg.panel, CL)
    NW = sched.workers
    ring = MbarrierRing(ST, NC, CL)
    STAGE_BYTES = (BM + BN) * SPAN
    A_BYTES, B_BYTES = BM * SPAN, BN * SPAN
    NACC = em.local_size_c                         # BN / 2 accumulator registers per thread
    acc_buf_dtype = em.c_fragment_dtype
    NB8 = OUT_COLS // 8                            # n8 accumulator blocks per staging box
    ROUNDS = NBOX // EB                            # staging rounds per output row block
    if cfg.epilogue not in ("overlap", "after"):
        raise UnsupportedConfigError(f"epilogue={cfg.epilogue!r}; valid: 'after', 'overlap'")
    # overlap needs the packed tile in registers (16-bit outputs) and a K loop of at least ROUNDS blocks
    OVERLAP = cfg.epilogue == "overlap" and eb_out == 2 and KT >= ROUNDS
    out16 = eb_out == 2

    def cvt2(d, hi, lo):
        if out_dtype == "float16":
            return T.ptx.cvt.rn.f16x2.f32(d, hi, lo)
        return T.ptx.cvt.rn.bf16x2.f32(d, hi, lo)


    @T.inline
    def mma_block(acc, da, db, it, kt, c):
        s = T.meta_var(ring.stage(it))
        ring.consumer_wait(it)
        em.fence()
        # BK / K steps x NSPLIT instructions; N tile h covers accumulator registers [h * NI / 2, (h + 1) * NI / 2)
        em.mma_block(acc, da, db, stage=(s,), m0=c * 64, scale_d=kt > 0)
        em.commit_group()

    def load_a(As, a_map, s, tm, kt, bar):
        # K-major: one box of BM rows x BK; MN-major: one box of BK K rows x 64 M columns per atom
        if a_major == "K":
            a_map_t.load(As.ptr_to([s, 0, 0]), a_map, (tm * BM, kt * BK), bar)
            return
        for j in range(a_lay.atoms):
            a_map_t.load(As.ptr_to(list(a_lay.index(j * a_lay.span, 0, s))), a_map,
                         (kt * BK, tm * BM + j * a_lay.span), bar)

    def load_b(Bs, b_map, s, tn, kt, rank, bar):
        # this CTA's 1 / CL of the B tile (multicast to the cluster); MN-major: its atoms of 64 N columns
        mask = None if CL == 1 else (1 << CL) - 1
        if b_major == "K":
            if CL == 1:
                b_map_t.load(Bs.ptr_to([s, 0, 0]), b_map, (tn * BN, kt * BK), bar)
            else:
                b_map_t.load(Bs.ptr_to([s, rank * (BN // CL), 0]), b_map, (tn * BN + rank * (BN // CL), kt * BK),
                             bar, multicast_mask=mask)
            return
        per = b_lay.atoms // CL
        for j in range(per):
            n0 = (rank * per + j) * b_lay.span
            b_map_t.load(Bs.ptr_to(list(b_lay.index(n0, 0, s))), b_map, (kt * BK, tn * BN + n0), bar,
                         multicast_mask=mask)

    @T.inline
    def retire(it, kt, tid):
        if cfg.in_flight == 0:
            em.wait_group(0)
            ring.consumer_release(it, pred=tid == 0)
        else:
            em.wait_group(1)
            ring.consumer_release(it + ST - 1, pred=T.And(tid == 0, kt > 0))

    def pack2(d, hi, lo, sc):
        if scaled:
            return cvt2(d, hi * sc[0], lo * sc[0])
        return cvt2(d, hi, lo)

    @T.inline
    def stmatrix_box(pk, base, Cs, c, e, jj, tid):
        # 16 output columns (two n8 accumulator blocks, registers pk[base .. base + 3]) of one warp's 16 rows
        warp = T.meta_var(tid // 32)
        mi = T.meta_var(tid % 32 // 8)
        rr = T.meta_var(tid % 8)
        T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(
            Cs.ptr_to([c, e, 16 * warp + rr + 8 * (mi % 2), ((2 * jj + mi // 2) ^ rr) * 8]),
            pk[base], pk[base + 1], pk[base + 2], pk[base + 3])

    @T.inline
    def store_round(pk, Cs, c_map, rnd, row0, col0, c, tid, live):
        # stage EB boxes of the packed outputs (pk[2 j + h], n8 block j, row half h) and store them with TMA
        bulk_wait(0, read=True)                        # the previous store has read the staging boxes
        T.ptx.bar.sync(T.uint32(1 + c), T.uint32(128))
        for e in T.unroll(EB):
            for jj in T.unroll(NB8 // 2):
                stmatrix_box(pk, 2 * ((rnd * EB + e) * NB8 + 2 * jj), Cs, c, e, jj, tid)
        T.ptx.fence.proxy.async_.shared__cta()
        T.ptx.bar.sync(T.uint32(1 + c), T.uint32(128))
        for e in T.unroll(EB):
            c_map_t.store(c_map, (row0, col0 + (rnd * EB + e) * OUT_COLS), Cs.ptr_to([c, e, 0, 0]),
                          pred=T.And(tid == 0, live))
        bulk_commit()

    def store2(ptr, x, y, sc):
        if acc_dtype == "int32":
            return T.ptx["st.shared.v2.b32"](ptr, x, y)
        if scaled:
            return T.ptx["st.shared.v2.f32"](ptr, x * sc[0], y * sc[0])
        return T.ptx["st.shared.v2.f32"](ptr, x, y)

    @T.inline
    def store_round_acc(acc, pk, sc, Cs, c_map, rnd, row0, col0, c, tid):
        # the same from the accumulators directly (32-bit outputs, or no overlap)
        bulk_wait(0, read=True)
        T.ptx.bar.sync(T.uint32(1 + c), T.uint32(128))
        for e in T.unroll(EB):
            for jj in T.unroll(NB8 // 2):
                j = T.meta_var((rnd * EB + e) * NB8 + 2 * jj)
                if out16:
                    for u in T.unroll(2):
                        for h in T.unroll(2):
                            pack2(pk[2 * u + h], acc[4 * (j + u) + 2 * h + 1], acc[4 * (j + u) + 2 * h], sc)
                    stmatrix_box(pk, 0, Cs, c, e, jj, tid)
                else:
                    for u in T.unroll(2):
                        for h in T.unroll(2):
                            r = T.meta_var(16 * (tid // 32) + tid % 32 // 4 + 8 * h)
                            ch = T.meta_var(((2 * jj + u) * 2 + tid % 4 // 2) ^ (r % 8))
                            store2(Cs.ptr_to([c, e, r, ch * 4 + (tid % 2) * 2]), acc[4 * (j + u) + 2 * h],
                                   acc[4 * (j + u) + 2 * h + 1], sc)
        T.ptx.fence.proxy.async_.shared__cta()
        T.ptx.bar.sync(T.uint32(1 + c), T.uint32(128))
        for e in T.unroll(EB):
            c_map_t.store(c_map, (row0, col0 + (rnd * EB + e) * OUT_COLS), Cs.ptr_to([c, e, 0, 0]), pred=tid == 0)
        bulk_commit()

    @T.inline
    def body(A, B, C, SA, SB, a_map, b_map, c_map):
        T.attr(WarpgroupRoles.launch_attr())
        if CL == 1:
            worker = T.cta_id([NW])
            rank = T.meta_var(0)
        else:
            worker = T.cluster_id([NW])
            rank = T.cta_id_in_cluster([CL])
        wg = T.warpgroup_id([roles.warpgroups])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        As = pool.alloc(em.a_shared_shape, dtype, align=em.a_layout.alignment)        # (ST, BM, BK)
        Bs = pool.alloc(em.b_shared_shape, dtype, align=em.b_layout.alignment)        # (ST, BN, BK)
        Cs = pool.alloc((NC, EB, EPI_ROWS, OUT_COLS), out_dtype, align=1024)
        bars = ring.alloc(pool)  # noqa: F841
        pool.commit()
        ring.init(T.And(wg == 0, tid == 0))
        if CL == 1:
            T.cuda.cta_sync()
        else:
            T.ptx.barrier.cluster.arrive.release()
            T.ptx.barrier.cluster.wait.acquire()
        if wg == 0:
            roles.producer_setup()
            if tid == 0:
                tile = T.alloc_local((2,), "int32")
                for t in T.serial(sched.count(worker)):
                    tmn = T.meta_var(sched.tile_into(tile, worker, t, rank))
                    tm = T.meta_var(tmn[0])
                    tn = T.meta_var(tmn[1])
                    for kt in T.serial(KT):
                        it = T.meta_var(t * KT + kt)
                        s = T.meta_var(ring.stage(it))
                        ring.producer_acquire(it)
                        ring.producer_expect(it, A_BYTES + B_BYTES)
                        load_a(As, a_map, s, tm, kt, ring.full_ptr(it))
                        load_b(Bs, b_map, s, tn, kt, rank, ring.full_ptr(it))
        else:
            roles.consumer_setup()
            c = T.meta_var(roles.consumer_index(wg))
            acc = T.alloc_local((NACC,), acc_buf_dtype)
            pk = T.alloc_local((NACC // 2 if OVERLAP else 4,), "uint32")
            da = em.alloc_descriptor()
            db = em.alloc_descriptor()
            sc = T.alloc_local((1,), "float32")
            if scaled:
                sc[0] = SA[0] * SB[0]
            em.init_descriptor(da, As, "A")
            em.init_descriptor(db, Bs, "B")
            count = T.meta_var(sched.count(worker))
            for t in T.serial(count):
                tm = T.meta_var(sched.tile(worker, t, rank)[0])
                tn = T.meta_var(sched.tile(worker, t, rank)[1])
                if OVERLAP:
                    # the previous tile's packed outputs go out while this tile's first K blocks run on the tensor
                    # cores (no branch between wgmma commit and wait: the stores of tile -1 are predicated off)
                    pm = T.meta_var(sched.tile(worker, t - 1, rank)[0])
                    pn = T.meta_var(sched.tile(worker, t - 1, rank)[1])
                    for kt0 in T.unroll(ROUNDS):
                        mma_block(acc, da, db, t * KT + kt0, kt0, c)
                        store_round(pk, Cs, c_map, kt0, pm * BM + c * 64, pn * BN, c, tid, t > 0)
                        retire(t * KT + kt0, kt0, tid)
                    for kt1 in T.serial(KT - ROUNDS):
                        mma_block(acc, da, db, t * KT + kt1 + ROUNDS, kt1 + ROUNDS, c)
                        retire(t * KT + kt1 + ROUNDS, kt1 + ROUNDS, tid)
                else:
                    for kt in T.serial(KT):
                        mma_block(acc, da, db, t * KT + kt, kt, c)
                        retire(t * KT + kt, kt, tid)
                if cfg.in_flight == 1:
                    em.wait_group(0)
                    ring.consumer_release(t * KT + KT - 1, pred=tid == 0)
                # pin the accumulators after the last wait: nvcc does not know the wait writes them
                em.pin_accumulators(acc)
                if OVERLAP:
                    for j in T.unroll(BN // 8):
                        for h in T.unroll(2):
                            pack2(pk[2 * j + h], acc[4 * j + 2 * h + 1], acc[4 * j + 2 * h], sc)
                else:
                    for rnd in T.unroll(ROUNDS):
                        store_round_acc(acc, pk, sc, Cs, c_map, rnd, tm * BM + c * 64, tn * BN, c, tid)
            if OVERLAP:
                lm = T.meta_var(sched.tile(worker, count - 1, rank)[0])
                ln = T.meta_var(sched.tile(worker, count - 1, rank)[1])
                for rnd in T.unroll(ROUNDS):
                    store_round(pk, Cs, c_map, rnd, lm * BM + c * 64, ln * BN, c, tid, count > 0)
            bulk_wait(0, read=False)
        if CL > 1:
            T.ptx.barrier.cluster.arrive.release()
            T.ptx.barrier.cluster.wait.acquire()

    if scaled:
        @T.prim_func
        def gemm(A: T.Buffer(A_SHAPE, dtype), B: T.Buffer(B_SHAPE, dtype), C: T.Buffer((M, N), out_dtype),
                 scale_a: T.Buffer((1,), "float32"), scale_b: T.Buffer((1,), "float32")):
            a_map = a_map_t.encode(A)
            b_map = b_map_t.encode(B)
            c_map = c_map_t.encode(C)
            T.device_entry()
            body(A, B, C, scale_a, scale_b, a_map, b_map, c_map)
    else:
        @T.prim_func
        def gemm(A: T.Buffer(A_SHAPE, dtype), B: T.Buffer(B_SHAPE, dtype), C: T.Buffer((M, N), out_dtype)):
            a_map = a_map_t.encode(A)
            b_map = b_map_t.encode(B)
            c_map = c_map_t.encode(C)
            T.device_entry()
            body(A, B, C, None, None, a_map, b_map, c_map)
    return gemm, cfg


def isa_wgmma_n(dtype):
    """Legal wgmma N for an input dtype (``isa.WGMMA_TABLE``: 8..256 step 8 for 16-bit and fp8; s8/u8: 8, 16, 24,
    then steps of 16 up to 224)."""
    d = canonical(dtype)
    return isa.select_wgmma(d, d, DTYPES[d][0] if d in DTYPES else "float32").n_values
