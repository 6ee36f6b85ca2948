"""Hand-written Hopper pipeline kernels (raw ``T.ptx`` in the forms verified on the H100, notes section 16) for the
interpreter tests: host-encoded tensor maps, ``cp.async.bulk.tensor`` loads / stores, mbarriers with expect-tx and
phase parity, ``setmaxnreg``, ``elect.sync``, warpgroup roles and wgmma SS on 128-byte-swizzled TMA tiles.

Layouts are written out from the PTX ISA / CUDA driver text, independently of ``mmaemit.ptx.tma``:

* a TMA box lands densely in shared memory (dimension 0 fastest), then its 16-byte chunks are permuted by
  ``Swizzle<b,4,3>`` on the absolute shared address (``swizzled`` below); elements outside the tensor read as 0;
* the wgmma K-major 128-byte-swizzle operand is 8-row atoms of 128-byte rows, which is exactly what a TMA box of
  64 f16 (128 bytes) per row with the 128-byte swizzle writes: descriptor LBO 1 (unused), SBO 64 (1024 bytes), start
  + 32 bytes per k16 step.

Fault switches break one rule each (the tests check that exactly that diagnostic fires).
"""
from __future__ import annotations

import numpy as np
from tvm.script import tirx as T

SWIZZLE_SPAN = {0: 0, 1: 32, 2: 64, 3: 128}


def swizzled(addr, span):
    """``Swizzle<b,4,3>`` on byte addresses: bits [4, 4 + b) ^= bits [7, 7 + b), b = log2(span / 16)."""
    addr = np.asarray(addr, np.int64)
    if span == 0:
        return addr
    b = {32: 1, 64: 2, 128: 3}[span]
    return addr ^ (((addr >> 7) & ((1 << b) - 1)) << 4)


def reference_box(glob, dims, strides, box, es, coords, elem, span, fill_nan=False):
    """The shared-memory bytes (relative to a 1024-aligned destination) a TMA load of the box at ``coords`` writes:
    an independent loop over box elements. ``glob``: the global tensor as bytes; ``strides``: byte strides of
    dimensions 1..rank-1."""
    ext = [-(-b // e) for b, e in zip(box, es)]
    n = int(np.prod(ext))
    out = np.zeros(n * elem, np.uint8)
    byte_strides = [elem] + list(strides)
    for flat in range(n):
        idx, rem = [], flat
        for e in ext:
            idx.append(rem % e)
            rem //= e
        c = [coords[d] + idx[d] * es[d] for d in range(len(dims))]
        dst = int(swizzled(flat * elem, span))
        if all(0 <= c[d] < dims[d] for d in range(len(dims))):
            off = sum(c[d] * byte_strides[d] for d in range(len(dims)))
            out[dst:dst + elem] = glob[off:off + elem]
        elif fill_nan:
            out[dst:dst + elem] = np.frombuffer({2: b"\xff\x7f", 4: b"\xff\xff\xff\x7f"}[elem], np.uint8)
    return out


def tma_roundtrip(dims, strides, box, es, coords, store_coords, *, dtype="float16", swizzle=0, oob_fill=0,
                  smem_offset=0, read_before_wait=False, no_store_wait=False, store_without_fence=False, nelem=None,
                  never_wait=False):
    """One CTA of 128 threads: thread 0 TMA-loads the box at ``coords`` into shared memory (at ``smem_offset`` from a
    1024-aligned pool) through an mbarrier (expect-tx of the box bytes), every thread waits on it (try_wait.parity in
    a while loop) and copies the raw shared bytes to ``O``; then the tile is TMA-stored at ``store_coords`` into
    ``C`` (``fence.proxy.async`` first because the threads also rewrite the tile with the same bytes).

    ``G`` and ``C``: the global tensor as a 1-D buffer of ``dtype`` (the map's dims / byte strides say how it is
    laid out; ``nelem`` overrides their size). Faults: ``read_before_wait`` (the issuing warp reads the tile right
    after issuing the copy, before waiting), ``no_store_wait`` (no
    ``cp.async.bulk.wait_group.read`` before the CTA ends), ``store_without_fence`` (no ``fence.proxy.async``
    between the threads' rewrite and the TMA store), ``never_wait`` (the CTA ends right after issuing the load)."""
    rank = len(dims)
    elem = {"float16": 2, "bfloat16": 2, "float32": 4, "uint8": 1, "int32": 4}[dtype]
    byte_strides = [elem] + list(strides)
    if nelem is None:
        nelem = (sum((d - 1) * s for d, s in zip(dims, byte_strides)) + elem) // elem
    ext = [-(-b // e) for b, e in zip(box, es)]
    box_bytes = int(np.prod(ext)) * elem
    pool_bytes = smem_offset + box_bytes
    load = T.ptx[f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"]
    store = T.ptx[f"cp.async.bulk.tensor.{rank}d.global.shared::cta.tile.bulk_group"]

    def encode(m, data):
        return T.tensormap_encode_tiled(m, data, *dims, *strides, *box, *es, descriptor_dtype=dtype, rank=rank,
                                        swizzle=swizzle, l2_promotion=2, oob_fill=oob_fill)

    def issue_load(tile, m, bar):
        return load(tile.ptr_to([smem_offset]), T.address_of(m), *[T.int32(c) for c in coords], bar.ptr_to([0]))

    def issue_store(m, tile):
        return store(T.address_of(m), *[T.int32(c) for c in store_coords], tile.ptr_to([smem_offset]))

    @T.prim_func
    def roundtrip(G: T.Buffer((nelem,), dtype), O: T.Buffer((box_bytes,), "uint8"), C: T.Buffer((nelem,), dtype)):
        G_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        encode(G_map, G.data)
        C_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        encode(C_map, C.data)
        T.device_entry()
        _bx = T.cta_id([1])
        tx = T.thread_id([128])
        pool = T.SMEMPool()
        tile = pool.alloc((pool_bytes,), "uint8", align=1024)
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        done = T.local_scalar("uint32")
        if tx == 0:
            T.ptx.mbarrier.init.shared__cta.b64(bar.ptr_to([0]), T.uint32(1))
            T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()
        if tx == 0:
            T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bar.ptr_to([0]), T.uint32(box_bytes))
            issue_load(tile, G_map, bar)
        if read_before_wait and tx < 32:
            O[tx] = tile[smem_offset + tx]
        if not never_wait:
            done = T.uint32(0)
            while done == T.uint32(0):
                T.ptx.mbarrier.try_wait.parity.shared__cta.b64(done, bar.ptr_to([0]), T.uint32(0))
            for i in T.serial((box_bytes + 127) // 128):
                if i * 128 + tx < box_bytes:
                    O[i * 128 + tx] = tile[smem_offset + i * 128 + tx]
            T.cuda.cta_sync()
            for i in T.serial((box_bytes + 127) // 128):
                if i * 128 + tx < box_bytes:
                    tile[smem_offset + i * 128 + tx] = O[i * 128 + tx]
            if not store_without_fence:
                T.ptx.fence.proxy.async_.shared__cta()
            T.cuda.cta_sync()
            if tx == 0:
                issue_store(C_map, tile)
                T.ptx.cp.async_.bulk.commit_group()
                if not no_store_wait:
                    T.ptx.cp.async_.bulk.wait_group.read(0)

    return roundtrip


def mbarrier_counts(arrive_count=2, arrivals="all", phases=2, parity_of_wait=None, expect_bytes=0,
                    arrive_form="nocount"):
    """4 warps, per-warp contexts: barrier initialized with ``arrive_count``; in each of ``phases`` rounds every warp
    whose lane 0 is in ``arrivals`` ("all" or a tuple of warp ids) arrives (lane 0, ``arrive_form``: "nocount" plain arrive,
    "count" arrive with a count of 1, "expect_tx" arrive.expect_tx of ``expect_bytes`` never delivered), then every
    warp waits on the round's parity (``parity_of_wait`` overrides it) and warp 3 records ``round + 1`` in
    ``O[round]``."""

    def arrives(warp):
        if arrivals == "all":
            return warp >= 0
        cond = warp == arrivals[0]
        for a in arrivals[1:]:
            cond = T.Or(cond, warp == a)
        return cond

    @T.prim_func
    def counts(O: T.Buffer((8,), "int32")):
        T.device_entry()
        _bx = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        bar = pool.alloc((1,), "uint64", align=8)
        pool.commit()
        if warp == 0 and lane == 0:
            T.ptx.mbarrier.init.shared__cta.b64(bar.ptr_to([0]), T.uint32(arrive_count))
            T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()
        for r in T.serial(phases):
            if lane == 0 and arrives(warp):
                if arrive_form == "count":
                    T.ptx.mbarrier.arrive.shared__cta.b64(bar.ptr_to([0]), T.uint32(1))
                elif arrive_form == "expect_tx":
                    T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bar.ptr_to([0]), T.uint32(expect_bytes))
                else:
                    T.ptx.mbarrier.arrive.shared__cta.b64(bar.ptr_to([0]))
            T.cuda.mbarrier_wait(bar.ptr_to([0]), r % 2 if parity_of_wait is None else parity_of_wait)
            if warp == 3 and lane == 0:
                O[r] = r + 1

    return counts


def ws_gemm(M, N, K, *, consumers=2, stages=3, BN=64, epilogue="direct", producer_elect="tid0",
            consumer_wait="ptx", regs=(40, 232), no_full_wait=False, b_swizzle=3, producer_parity_bug=False,
            dtype="float16"):
    """Warp-specialized GEMM C[M, N] (f32) = A[M, K] @ B[N, K]^T with TMA, an mbarrier ring and wgmma SS.

    CTA tile (64 ``consumers``) x ``BN`` x 64; warpgroup 0 is the producer (``setmaxnreg.dec``, one elected thread
    issues the loads: ``producer_elect`` "tid0" or "elect" (``T.cuda.elect_sync`` in warp 0)), warpgroups 1..``consumers``
    consume (``setmaxnreg.inc``; each computes 64 rows with m64n``BN``k16 wgmma from the 128-byte-swizzled tiles).
    Ring of ``stages`` stages with full barriers (count 1, expect-tx of both boxes) and empty barriers (count
    128 ``consumers``, one arrive per consumer thread). Ragged M / N / K: the tensor maps' out-of-bounds fill gives
    zeros, stores are masked (``epilogue="direct"``) or clipped by a TMA store of the C tile staged in shared memory
    (``epilogue="tma"``: ``fence.proxy.async``, a named barrier over the consumer threads, one thread stores).
    ``consumer_wait``: "ptx" (``try_wait.parity`` in a while loop) or "cuda" (``T.cuda.mbarrier_wait``).

    Faults: ``regs`` (the setmaxnreg counts; e.g. (40, 248) is over the 64K budget with 2 consumers),
    ``no_full_wait`` (consumers read the stage without waiting for its full barrier), ``b_swizzle=2`` (B arrives as
    two 64-byte-swizzled half-boxes per stage while the descriptor assumes the 128-byte swizzle),
    ``producer_parity_bug`` (the producer waits on the empty barriers with the consumers' parity: a deadlock).
    """
    t = {"float16": "f16", "bfloat16": "bf16"}[dtype]
    BM = 64 * consumers
    S = stages
    KT = -(-K // 64)
    GM, GN = -(-M // BM), -(-N // BN)
    bytes_stage = (BM + BN) * 64 * 2
    mma = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{BN}k16.f32.{t}.{t}"]
    load2d = T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"]
    store2d = T.ptx["cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group"]
    b_box_k = 64 if b_swizzle == 3 else 32
    tma_c = epilogue == "tma"
    c_elems = BM * BN if tma_c else 8

    def issue_mma(acc, adesc, bdesc):
        return mma(*[acc[i] for i in range(BN // 2)], adesc[0], bdesc[0], True, 1, 1, 0, 0)

    @T.prim_func
    def gemm(A: T.Buffer((M, K), dtype), B: T.Buffer((N, K), dtype), C: T.Buffer((M, N), "float32")):
        A_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(A_map, A.data, K, M, K * 2, 64, BM, 1, 1, descriptor_dtype=dtype, rank=2,
                                 swizzle=3, l2_promotion=2, oob_fill=0)
        B_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(B_map, B.data, K, N, K * 2, b_box_k, BN, 1, 1, descriptor_dtype=dtype, rank=2,
                                 swizzle=b_swizzle, l2_promotion=2, oob_fill=0)
        C_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(C_map, C.data, N, M, N * 4, BN, BM, 1, 1, descriptor_dtype="float32", rank=2,
                                 swizzle=0, l2_promotion=2, oob_fill=0)
        T.device_entry()
        bm, bn = T.cta_id([GM, GN])
        wg = T.warpgroup_id([1 + consumers])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        As = pool.alloc((S * BM * 64,), dtype, align=1024)
        Bs = pool.alloc((S * BN * 64,), dtype, align=1024)
        Cs = pool.alloc((c_elems,), "float32", align=128)
        bars = pool.alloc((2 * S,), "uint64", align=8)
        pool.commit()
        if wg == 0 and tid == 0:
            for s in T.unroll(S):
                T.ptx.mbarrier.init.shared__cta.b64(bars.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared__cta.b64(bars.ptr_to([S + s]), T.uint32(128 * consumers))
            T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()
        if wg == 0:
            T.ptx.setmaxnreg.dec.sync.aligned.u32(regs[0])
            leader = T.alloc_local((1,), "uint32")
            leader[0] = T.uint32(0)
            if tid < 32:
                if producer_elect == "elect":
                    leader[0] = T.cuda.elect_sync()
                elif tid == 0:
                    leader[0] = T.uint32(1)
            if leader[0] == T.uint32(1):
                for kt in T.serial(KT):
                    s = T.meta_var(kt % S)
                    if producer_parity_bug:
                        T.cuda.mbarrier_wait(bars.ptr_to([S + s]), (kt // S) % 2)
                    else:
                        T.cuda.mbarrier_wait(bars.ptr_to([S + s]), ((kt // S) % 2) ^ 1)
                    T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(bars.ptr_to([s]), T.uint32(bytes_stage))
                    load2d(As.ptr_to([s * BM * 64]), T.address_of(A_map), T.Cast("int32", kt * 64),
                           T.Cast("int32", bm * BM), bars.ptr_to([s]))
                    for h in T.unroll(64 // b_box_k):
                        load2d(Bs.ptr_to([s * BN * 64 + h * BN * b_box_k]), T.address_of(B_map),
                               T.Cast("int32", kt * 64 + h * b_box_k), T.Cast("int32", bn * BN), bars.ptr_to([s]))
        else:
            T.ptx.setmaxnreg.inc.sync.aligned.u32(regs[1])
            cw = T.meta_var(wg - 1)
            acc = T.alloc_local((BN // 2,), "float32")
            adesc = T.alloc_local((1,), "uint64")
            bdesc = T.alloc_local((1,), "uint64")
            done = T.alloc_local((1,), "uint32")
            for i in T.unroll(BN // 2):
                acc[i] = T.float32(0)
            for kt in T.serial(KT):
                s = T.meta_var(kt % S)
                if not no_full_wait:
                    if consumer_wait == "cuda":
                        T.cuda.mbarrier_wait(bars.ptr_to([s]), (kt // S) % 2)
                    else:
                        done[0] = T.uint32(0)
                        while done[0] == T.uint32(0):
                            T.ptx.mbarrier.try_wait.parity.shared__cta.b64(
                                done[0], bars.ptr_to([s]), T.Cast("uint32", (kt // S) % 2))
                T.ptx.wgmma.fence.sync.aligned()
                for ks in T.unroll(4):
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(adesc[0]),
                                                          As.ptr_to([s * BM * 64 + cw * 64 * 64 + ks * 16]), 1, 64, 3)
                    T.cuda.wgmma.encode_matrix_descriptor(T.address_of(bdesc[0]), Bs.ptr_to([s * BN * 64 + ks * 16]),
                                                          1, 64, 3)
                    issue_mma(acc, adesc, bdesc)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
                T.ptx.mbarrier.arrive.shared__cta.b64(bars.ptr_to([S + s]))
            warp = T.meta_var(tid // 32)
            g = T.meta_var((tid % 32) // 4)
            c = T.meta_var(tid % 4)
            if tma_c:
                for j in T.unroll(BN // 8):
                    for q in T.unroll(4):
                        Cs[(cw * 64 + warp * 16 + g + 8 * (q // 2)) * BN + 8 * j + 2 * c + q % 2] = acc[4 * j + q]
                T.ptx.fence.proxy.async_.shared__cta()
                T.ptx.bar.sync(1, 128 * consumers)
                if wg == 1 and tid == 0:
                    store2d(T.address_of(C_map), T.Cast("int32", bn * BN), T.Cast("int32", bm * BM), Cs.ptr_to([0]))
                    T.ptx.cp.async_.bulk.commit_group()
                    T.ptx.cp.async_.bulk.wait_group.read(0)
            else:
                for j in T.unroll(BN // 8):
                    for q in T.unroll(4):
                        row = T.meta_var(bm * BM + cw * 64 + warp * 16 + g + 8 * (q // 2))
                        col = T.meta_var(bn * BN + 8 * j + 2 * c + q % 2)
                        if row < M and col < N:
                            C[row, col] = acc[4 * j + q]

    return gemm


def named_barrier_handoff(arrive=True, sync_before_read=True):
    """Warp 0 writes ``S[lane]`` then ``bar.arrive 1, 64`` (it does not wait); warp 1 ``bar.sync 1, 64`` and reads
    ``S``: the named barrier orders the read after the write. ``sync_before_read=False`` reads first (a race);
    ``arrive=False`` drops the producer's arrival (warp 1 then waits forever: a deadlock)."""

    @T.prim_func
    def handoff(X: T.Buffer((32,), "float32"), O: T.Buffer((32,), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        warp = T.warp_id([2])
        lane = T.lane_id([32])
        S = T.alloc_buffer((32,), "float32", scope="shared")
        if warp == 0:
            S[lane] = X[lane] * T.float32(2)
            if arrive:
                T.ptx.bar.arrive(1, 64)
        else:
            if not sync_before_read:
                O[lane] = S[lane]
            T.ptx.bar.sync(1, 64)
            if sync_before_read:
                O[lane] = S[lane]

    return handoff


def elect_lanes(first_active=3):
    """Two warps; lanes >= ``first_active`` execute ``elect.sync d|p, 0xFFFFFFFF`` and store ``100 d + p``."""

    @T.prim_func
    def elect(O: T.Buffer((64,), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        tx = T.thread_id([64])
        d = T.local_scalar("uint32")
        p = T.local_scalar("uint32")
        if tx % 32 >= first_active:
            T.ptx.elect_sync(d, p, T.uint32(0xFFFFFFFF))
            O[tx] = d * T.uint32(100) + p

    return elect


def round_robin_ring(units, stages, consumers=2):
    """One CTA of 1 + ``consumers`` warps: thread 0 TMA-loads row u of ``G`` [units, 64] (float32) into ring stage
    u % ``stages`` (full / empty mbarrier pairs, expect-tx of the row's 256 bytes), and consumer warp c takes the
    units c, c + consumers, ... (stages dealt round robin, as the fused dequant kernel's ``k_split``): it waits for
    the stage's full barrier by the parity of round u // stages, adds the row into its lanes' sums and releases the
    stage (32 arrivals on empty); ``O[c, j]`` = sum of ``G[u, j]`` over its units. With ``stages`` not a multiple of
    ``consumers`` the stage's previous round belongs to another consumer, and a parity wait passes on that round's
    phase while its copy is in flight (H100: an unspecified launch failure in the producer's expect-tx arrive)."""
    row = 64 * 4

    @T.prim_func
    def ring(G: T.Buffer((units * 64,), "float32"), O: T.Buffer((consumers * 64,), "float32")):
        G_map: T.let[T.TensorMap()] = T.tvm_stack_alloca("tensormap", 1)
        T.tensormap_encode_tiled(G_map, G.data, 64, units, row, 64, 1, 1, 1, descriptor_dtype="float32", rank=2,
                                 swizzle=0, l2_promotion=2, oob_fill=0)
        T.device_entry()
        _bx = T.cta_id([1])
        tx = T.thread_id([32 * (1 + consumers)])
        pool = T.SMEMPool()
        tile = pool.alloc((stages, 64), "float32", align=1024)
        full = pool.alloc((stages,), "uint64", align=8)
        empty = pool.alloc((stages,), "uint64", align=8)
        pool.commit()
        done = T.local_scalar("uint32")
        acc = T.alloc_local((2,), "float32")
        if tx == 0:
            for s in T.serial(stages):
                T.ptx.mbarrier.init.shared__cta.b64(full.ptr_to([s]), T.uint32(1))
                T.ptx.mbarrier.init.shared__cta.b64(empty.ptr_to([s]), T.uint32(32))
            T.ptx.fence.mbarrier_init.release.cluster()
        T.cuda.cta_sync()
        if tx == 0:
            for u in T.serial(units):
                done = T.uint32(0)
                while done == T.uint32(0):
                    T.ptx.mbarrier.try_wait.parity.shared__cta.b64(done, empty.ptr_to([u % stages]),
                                                                   T.Cast("uint32", (u // stages) % 2 ^ 1))
                T.ptx.mbarrier.arrive.expect_tx.shared__cta.b64(full.ptr_to([u % stages]), T.uint32(row))
                T.ptx["cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"](
                    tile.ptr_to([u % stages, 0]), T.address_of(G_map), T.int32(0), T.Cast("int32", u),
                    full.ptr_to([u % stages]))
        if tx >= 32:
            c = T.meta_var(tx // 32 - 1)
            lane = T.meta_var(tx % 32)
            acc[0] = T.float32(0)
            acc[1] = T.float32(0)
            for j in T.serial((units - c + consumers - 1) // consumers):
                u = T.meta_var(c + consumers * j)
                done = T.uint32(0)
                while done == T.uint32(0):
                    T.ptx.mbarrier.try_wait.parity.shared__cta.b64(done, full.ptr_to([u % stages]),
                                                                   T.Cast("uint32", (u // stages) % 2))
                acc[0] = acc[0] + tile[u % stages, lane]
                acc[1] = acc[1] + tile[u % stages, lane + 32]
                T.ptx.mbarrier.arrive.shared__cta.b64(empty.ptr_to([u % stages]))
            O[c * 64 + lane] = acc[0]
            O[c * 64 + lane + 32] = acc[1]

    return ring
