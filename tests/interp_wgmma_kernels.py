"""Hand-written Hopper wgmma kernels (raw ``T.ptx`` calls) for the interpreter tests.

``wgmma_gemm`` generalizes the probe the lead ran on an H100 (/work/wg_probe_verified.py: wgmma RS m64nNk16 f16, B
K-major with the 128-byte swizzle, ldo=1, sdo=64, swizzle 3, +32 bytes per k16; max error 1e-5 vs torch for N = 64
and 256): C[64, N] (f32) = A[64, KC] @ X[N, KC]^T with one warpgroup. Every layout below is written out by hand from
the PTX ISA text, independently of ``mmaemit.ptx.wgmma``:

* accumulator: ``acc[4j + 2h + e] = C[16 warp + g + 8h, 8j + 2c + e]`` (g = lane / 4, c = lane % 4);
* A fragment (RS): ``a0 = A[16 warp + g, 2c..2c+1]``, ``a1`` rows + 8, ``a2`` columns + 8, ``a3`` both, low half first;
* B (and A in the SS form) K-major in shared memory, element (row, k) at the element offset ``tile_offset`` gives
  for each swizzle mode, and the descriptor start / LBO / SBO of k16 step ``s`` from ``step_descriptor``.

Fault switches (each breaks one rule the interpreter must report): ``fence`` ("each", "once": a single wgmma.fence
before the loop although the loop writes the A registers, "none"), ``proxy_fence=False`` (no fence.proxy.async
between the st.shared of B and the wgmma), ``wait`` ("each": commit + wait 0 per step; "end": one wait after the
loop; "pipelined": wait_group 1 after every commit; "late": the epilogue reads the accumulators before the wait;
"none": no wait at all), ``smem_overwrite=True`` (a st.shared into B between the last wgmma and its wait).
"""
from __future__ import annotations

from tvm.script import tirx as T

PTX_T = {"float16": "f16", "bfloat16": "bf16"}


def tile_offset(swizzle, rows, kc, r, k):
    """Element offset of K-major element (r, k) of a [rows, kc] 16-bit tile stored with ``swizzle`` (TVM argument:
    0 none, 1 = 32B, 2 = 64B, 3 = 128B). Swizzled rows are 8-row atoms of W-byte rows (W = 32/64/128) whose 16-byte
    chunk j is stored at j ^ (row phase); K beyond W bytes continues in the next [rows, W] column block."""
    if swizzle == 0:            # 8x8 core matrices (128 contiguous bytes), K-adjacent core matrices 128 B apart
        return (r // 8) * (8 * kc) + (k // 8) * 64 + (r % 8) * 8 + k % 8
    w = {1: 16, 2: 32, 3: 64}[swizzle]          # row width in elements
    phase = {1: (r % 8) // 4, 2: (r % 8) // 2, 3: r % 8}[swizzle]
    return (k // w) * (rows * w) + r * w + (((k % w) // 8) ^ phase) * 8 + k % 8


def step_descriptor(swizzle, rows, s):
    """(start element offset, ldo, sdo) of k16 step ``s`` (LBO/SBO in 16-byte units)."""
    if swizzle == 0:
        # k16 = 2 core matrices (2 x 128 B); LBO 128 B; SBO = 8-row groups 1024 B apart (KC = 64: 8 core matrices)
        return s * 128, 8, 64
    w = {1: 16, 2: 32, 3: 64}[swizzle]
    sdo = {1: 16, 2: 32, 3: 64}[swizzle]        # 8 rows x W bytes, >> 4
    return ((16 * s) // w) * (rows * w) + (16 * s) % w, 1, sdo


def wgmma_gemm(N=64, KC=64, dtype="float16", *, form="rs", swizzle=3, fence="each", proxy_fence=True, wait="each",
               commit=True, smem_overwrite=False, desc_math=False, neg_b=False, zero_init=True, reuse_a=False,
               a_via_ptx=False, desc_extra=0, static_smem=False, trans_b=0, warpgroups=1, desc_warp_skew=False,
               guard_warps=False, b_cp_async=False):
    """C[64, N] (f32) = A[64, KC] @ X[N, KC]^T (x -1 with ``neg_b``), one warpgroup, KC // 16 wgmma k16 steps.

    ``form``: "rs" (A from registers) or "ss" (A from shared memory, K-major 128-byte swizzle). ``desc_math``: the
    descriptor is encoded once and advanced by uint64 additions in a serial (not unrolled) k loop.
    ``zero_init=False``: the accumulators are never initialized; the first step passes scale-d = false.
    ``reuse_a``: every step loads its A fragment into the same 4 registers (with ``wait="end"`` that overwrites the
    registers of a wgmma in flight); ``a_via_ptx``: the fragment is written by ``mov.b32`` instead of a plain store.
    ``commit=False`` drops the commit_group (wait_group then retires nothing). ``desc_extra``: a uint64 added to
    every B descriptor (to forge fields). ``static_smem``: a static shared buffer precedes the dynamic pool.
    ``trans_b``: the imm-trans-b operand. ``warpgroups``: CTA of 4 x ``warpgroups`` warps, warpgroup i computes rows
    64 i .. 64 i + 63 (A and C have 64 x ``warpgroups`` rows). ``desc_warp_skew``: warp w adds w to its B descriptor
    (a non-uniform operand). ``guard_warps``: only warps 0 and 1 run the k loop (a divergent warpgroup).
    ``b_cp_async``: B is staged by 16-byte cp.async copies (commit, wait_group 0) instead of plain stores.
    """
    WG = warpgroups
    M = 64 * WG
    t = PTX_T[dtype]
    steps = KC // 16
    mma = T.ptx[f"wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{t}.{t}"]
    sb = -1 if neg_b else 1
    a0 = 0 if reuse_a else 4          # A fragment of step s in af[a0 * s .. a0 * s + 3]
    if swizzle == 0:
        assert KC * 2 * 8 == 1024           # step_descriptor's SBO (64 x 16 B) assumes KC = 64

    # plain Python helpers run at parse time and return the one call they build (it becomes a statement)
    def b_desc(Bs, desc, s):
        start, ldo, sdo = step_descriptor(swizzle, N, s)
        return T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]), Bs.ptr_to([start]), ldo, sdo, swizzle)

    def issue(acc, af, adesc, bdesc, s, scale):
        if form == "rs":
            return mma(*[acc[i] for i in range(N // 2)], af[a0 * s], af[a0 * s + 1], af[a0 * s + 2],
                       af[a0 * s + 3], bdesc[0], scale, 1, sb, trans_b)
        return mma(*[acc[i] for i in range(N // 2)], adesc[0], bdesc[0], scale, 1, sb, 0, trans_b)

    @T.prim_func
    def wg_gemm(A: T.Buffer((M, KC), dtype), X: T.Buffer((N, KC), dtype), C: T.Buffer((M, N), "float32")):
        T.device_entry()
        _cta = T.cta_id([1])
        warp = T.warp_id([4 * WG])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        As = pool.alloc((M * KC,), dtype, align=1024)
        Bs = pool.alloc((N * KC,), dtype, align=1024)
        pool.commit()
        tid = T.meta_var(warp * 32 + lane)
        if static_smem:
            St = T.alloc_buffer((8,), "float16", scope="shared")
            if tid < 8:
                St[tid] = X[0, 0]
        if b_cp_async:
            for i in T.serial((N * KC) // (8 * 128 * WG)):
                q = T.meta_var(i * 128 * WG + tid)           # 16-byte chunk q: row q // (KC / 8), k 8 (q % (KC / 8))
                T.ptx["cp.async.cg.shared.global"](
                    Bs.ptr_to([tile_offset(swizzle, N, KC, q // (KC // 8), 8 * (q % (KC // 8)))]),
                    X.ptr_to([q // (KC // 8), 8 * (q % (KC // 8))]), 16)
            T.ptx["cp.async.commit_group"]()
            T.ptx["cp.async.wait_group"](0)
        else:
            for i in T.serial((N * KC) // (128 * WG)):
                q = T.meta_var(i * 128 * WG + tid)
                Bs[tile_offset(swizzle, N, KC, q // KC, q % KC)] = X[q // KC, q % KC]
        for i in T.serial((M * KC) // (128 * WG)):
            q = T.meta_var(i * 128 * WG + tid)
            As[tile_offset(3, M, KC, q // KC, q % KC)] = A[q // KC, q % KC]
        if proxy_fence:
            T.ptx.fence.proxy.async_()
        T.cuda.cta_sync()
        acc = T.alloc_local((N // 2,), "float32")
        if zero_init:
            for i in T.unroll(N // 2):
                acc[i] = T.float32(0)
        af = T.alloc_local((4 * steps,), "uint32")        # one A fragment per k16 step
        bdesc = T.alloc_local((1,), "uint64")
        adesc = T.alloc_local((1,), "uint64")
        bdesc0 = T.alloc_local((1,), "uint64")
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        r0 = T.meta_var(warp * 16 + g)           # = 64 (warp // 4) + 16 (warp % 4) + g
        a_row0 = T.meta_var((warp // 4) * 64 * KC)   # this warpgroup's 64 rows of the SW128 A tile
        if fence == "once":
            T.ptx.wgmma.fence.sync.aligned()
        if desc_math:
            b_desc(Bs, bdesc0, 0)
            for s in T.serial(steps):
                for q in T.unroll(4):
                    row = T.meta_var(r0 + 8 * (q % 2))
                    col = T.meta_var(16 * s + 2 * c + 8 * (q // 2))
                    af[4 * s + q] = (T.Cast("uint32", T.reinterpret("uint16", A[row, col]))
                                     | (T.Cast("uint32", T.reinterpret("uint16", A[row, col + 1])) << T.uint32(16)))
                # step s starts (16 s) elements = 32 s bytes further into the 128-byte swizzle rows
                bdesc[0] = bdesc0[0] + T.Cast("uint64", (32 * s) >> 4)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(adesc[0]), As.ptr_to([a_row0 + s * 16]), 1, 64, 3)
                T.ptx.wgmma.fence.sync.aligned()
                issue(acc, af, adesc, bdesc, s, True)
                T.ptx.wgmma.commit_group.sync.aligned()
                T.ptx.wgmma.wait_group.sync.aligned(0)
        elif guard_warps:
            if warp < 2:
                T.ptx.wgmma.fence.sync.aligned()
                b_desc(Bs, bdesc, 0)
                issue(acc, af, adesc, bdesc, 0, True)
        else:
            for s in T.unroll(steps):
                if form == "rs":
                    for q in T.unroll(4):
                        row = T.meta_var(r0 + 8 * (q % 2))
                        col = T.meta_var(16 * s + 2 * c + 8 * (q // 2))
                        v = T.meta_var(T.Cast("uint32", T.reinterpret("uint16", A[row, col]))
                                       | (T.Cast("uint32", T.reinterpret("uint16", A[row, col + 1])) << T.uint32(16)))
                        if a_via_ptx:
                            T.ptx["mov.b32"](af[a0 * s + q], v)
                        else:
                            af[a0 * s + q] = v
                b_desc(Bs, bdesc, s)
                if desc_extra != 0:
                    bdesc[0] = bdesc[0] + T.uint64(desc_extra)
                if desc_warp_skew:
                    bdesc[0] = bdesc[0] + T.Cast("uint64", warp)
                T.cuda.wgmma.encode_matrix_descriptor(T.address_of(adesc[0]), As.ptr_to([a_row0 + s * 16]), 1, 64, 3)
                if fence == "each":
                    T.ptx.wgmma.fence.sync.aligned()
                issue(acc, af, adesc, bdesc, s, True if zero_init else s > 0)
                if commit:
                    T.ptx.wgmma.commit_group.sync.aligned()
                if wait == "each":
                    T.ptx.wgmma.wait_group.sync.aligned(0)
                if wait == "pipelined":
                    T.ptx.wgmma.wait_group.sync.aligned(1)
        if smem_overwrite:
            Bs[tid] = X[0, 0]
        if wait == "end" or wait == "pipelined":
            T.ptx.wgmma.wait_group.sync.aligned(0)
        for j in T.unroll(N // 8):
            for q in T.unroll(4):
                C[r0 + 8 * (q // 2), 8 * j + 2 * c + q % 2] = acc[4 * j + q]
        if wait == "late":
            T.ptx.wgmma.wait_group.sync.aligned(0)

    return wg_gemm


def wgmma_two_groups(read_pending=False):
    """Two m64n8k16 groups on separate accumulators, then ``wait_group 1``: the older group (acc0) is complete and
    may be read, the newer one (acc1) is in flight until ``wait_group 0``. C0 = A[:, :16] @ X[:, :16]^T,
    C1 = A[:, 16:] @ X[:, 16:]^T; X [8, 32] K-major without swizzle (four 8x8 core matrices 128 B apart: LBO 128 B,
    one 8-row group). scale-d is false: the accumulators are never initialized. ``read_pending`` reads acc1
    between the two waits (a fault)."""

    @T.prim_func
    def two_groups(A: T.Buffer((64, 32), "float16"), X: T.Buffer((8, 32), "float16"),
                   C0: T.Buffer((64, 8), "float32"), C1: T.Buffer((64, 8), "float32")):
        T.device_entry()
        _cta = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        Bs = pool.alloc((8 * 32,), "float16", align=1024)
        pool.commit()
        tid = T.meta_var(warp * 32 + lane)
        for i in T.serial(2):
            q = T.meta_var(i * 128 + tid)
            # core matrix k // 8 of the single 8-row group: (k // 8) * 64 + row * 8 + k % 8
            Bs[(q % 32) // 8 * 64 + (q // 32) * 8 + q % 8] = X[q // 32, q % 32]
        T.ptx.fence.proxy.async_()
        T.cuda.cta_sync()
        acc0 = T.alloc_local((4,), "float32")
        acc1 = T.alloc_local((4,), "float32")
        af0 = T.alloc_local((4,), "uint32")
        af1 = T.alloc_local((4,), "uint32")
        desc = T.alloc_local((2,), "uint64")
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        for q in T.unroll(4):
            row = T.meta_var(warp * 16 + g + 8 * (q % 2))
            col = T.meta_var(2 * c + 8 * (q // 2))
            af0[q] = (T.Cast("uint32", T.reinterpret("uint16", A[row, col]))
                      | (T.Cast("uint32", T.reinterpret("uint16", A[row, col + 1])) << T.uint32(16)))
            af1[q] = (T.Cast("uint32", T.reinterpret("uint16", A[row, col + 16]))
                      | (T.Cast("uint32", T.reinterpret("uint16", A[row, col + 17])) << T.uint32(16)))
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]), Bs.ptr_to([0]), 8, 32, 0)
        T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[1]), Bs.ptr_to([128]), 8, 32, 0)
        T.ptx.wgmma.fence.sync.aligned()
        T.ptx.wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16(acc0[0], acc0[1], acc0[2], acc0[3], af0[0], af0[1],
                                                                 af0[2], af0[3], desc[0], False, 1, 1, 0)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16(acc1[0], acc1[1], acc1[2], acc1[3], af1[0], af1[1],
                                                                 af1[2], af1[3], desc[1], False, 1, 1, 0)
        T.ptx.wgmma.commit_group.sync.aligned()
        T.ptx.wgmma.wait_group.sync.aligned(1)
        for q in T.unroll(4):
            C0[warp * 16 + g + 8 * (q // 2), 2 * c + q % 2] = acc0[q]
        if read_pending:
            C1[0, 0] = acc1[0]
        T.ptx.wgmma.wait_group.sync.aligned(0)
        for q in T.unroll(4):
            C1[warp * 16 + g + 8 * (q // 2), 2 * c + q % 2] = acc1[q]

    return two_groups
