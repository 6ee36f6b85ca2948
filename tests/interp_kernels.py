"""Hand-written tirx kernels (raw ``T.ptx`` calls) used to test ``mmaemit.interpret``; reusable by other tests.

Every factory returns a fresh ``@T.prim_func`` (Python parameters are captured when the decorator runs).
Index conventions are the PTX ISA fragment layouts (g = lane // 4, t = lane % 4):

* A row-major [M, K] through ``ldmatrix.x4``: lane l addresses row ``l % 16``, 16-byte column ``l // 16``;
* B row-major [K, N] through ``ldmatrix.x4.trans`` (lanes address k rows), or K-major [N, K] through
  non-transposed ``ldmatrix`` (lanes address n rows);
* accumulator element j of lane l: row ``g + 8 * (j // 2)``, column ``2 * t + j % 2``.
"""
from __future__ import annotations

from tvm.script import tirx as T

# ----------------------------------------------------------------------------------------------------------------------
# (a) one warp, one m16n8k16 tile: ldmatrix.x4 (A) + ldmatrix.x2.trans (B) + mma
# ----------------------------------------------------------------------------------------------------------------------


def mma_tile_f16(a_dtype="float16"):
    """C[16, 8] (f32) = A[16, 16] @ B[16, 8] with one warp; A/B staged in shared memory with plain stores."""
    ptx_t = {"float16": "f16", "bfloat16": "bf16"}[a_dtype]
    mma = T.ptx[f"mma.sync.aligned.m16n8k16.row.col.f32.{ptx_t}.{ptx_t}.f32"]

    @T.prim_func
    def mma_tile(A: T.Buffer((16, 16), a_dtype), B: T.Buffer((16, 8), a_dtype), C: T.Buffer((16, 8), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        As = T.alloc_buffer((16, 16), a_dtype, scope="shared")
        Bs = T.alloc_buffer((16, 8), a_dtype, scope="shared")
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        acc = T.alloc_local((4,), "float32")
        for i in T.unroll(8):
            As[(lane * 8 + i) // 16, (lane * 8 + i) % 16] = A[(lane * 8 + i) // 16, (lane * 8 + i) % 16]
        for i in T.unroll(4):
            Bs[(lane * 4 + i) // 8, (lane * 4 + i) % 8] = B[(lane * 4 + i) // 8, (lane * 4 + i) % 8]
        T.cuda.cta_sync()
        for i in T.unroll(4):
            acc[i] = T.float32(0)
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(a[0], a[1], a[2], a[3], As.ptr_to([lane % 16, 8 * (lane // 16)]))
        T.ptx.ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16(b[0], b[1], Bs.ptr_to([lane % 16, 0]))
        mma(acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3], b[0], b[1], acc[0], acc[1], acc[2], acc[3])
        for j in T.unroll(4):
            C[lane // 4 + 8 * (j // 2), 2 * (lane % 4) + j % 2] = acc[j]

    return mma_tile


# ----------------------------------------------------------------------------------------------------------------------
# (b)-(d) the 4-warp GEMM: cp.async ring into XOR-swizzled shared memory, ldmatrix + mma.sync, fp32 epilogue
# ----------------------------------------------------------------------------------------------------------------------


def gemm_fp16(M=128, N=128, K=64, stages=3, *, barrier=True, frag_bug=False, swizzle=True):
    """C[M, N] (f32) = A[M, K] @ B[K, N] (f16, row-major). CTA tile 128x128x32, 4 warps of 64x64, ``stages``-deep
    cp.async ring. A stage (128x32, 64-B rows): 16-B chunk ``c ^ ((row >> 1) & 3)``; B stage (32x128, 256-B rows):
    chunk ``c ^ (row & 7)``.

    Faults on purpose: ``barrier=False`` drops the ``__syncthreads`` after the cp.async wait (a shared-memory race);
    ``frag_bug=True`` passes A fragment registers 1 and 2 to the mma swapped (a wrong fragment index).
    """
    BM, BN, BK = 128, 128, 32
    KT = K // BK
    A1, A2 = (2, 1) if frag_bug else (1, 2)
    sa = 3 if swizzle else 0        # masks applied to the XOR term (0 disables the swizzle)
    sb = 7 if swizzle else 0

    def sync():
        return T.cuda.cta_sync() if barrier else T.int32(0)

    @T.prim_func
    def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((K, N), "float16"), C: T.Buffer((M, N), "float32")):
        T.device_entry()
        bm, bn = T.cta_id([M // BM, N // BN])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        As = pool.alloc((stages, BM, BK), "float16", align=128)
        Bs = pool.alloc((stages, BK, BN), "float16", align=128)
        pool.commit()
        acc = T.alloc_local((4, 8, 4), "float32")
        af = T.alloc_local((4, 4), "uint32")
        bf = T.alloc_local((8, 2), "uint32")
        tid = T.meta_var(warp * 32 + lane)
        wm = T.meta_var(warp // 2)
        wn = T.meta_var(warp % 2)
        for i in T.unroll(4):
            for j in T.unroll(8):
                for r in T.unroll(4):
                    acc[i, j, r] = T.float32(0)
        for s in T.unroll(stages - 1):
            if s < KT:
                for i in T.unroll(4):
                    T.ptx["cp.async.cg.shared.global"](
                        As.ptr_to([s, (i * 128 + tid) // 4,
                                   (((i * 128 + tid) % 4) ^ ((((i * 128 + tid) // 4) >> 1) & sa)) * 8]),
                        A.ptr_to([bm * BM + (i * 128 + tid) // 4, s * BK + ((i * 128 + tid) % 4) * 8]), 16)
                    T.ptx["cp.async.cg.shared.global"](
                        Bs.ptr_to([s, (i * 128 + tid) // 16,
                                   (((i * 128 + tid) % 16) ^ (((i * 128 + tid) // 16) & sb)) * 8]),
                        B.ptr_to([s * BK + (i * 128 + tid) // 16, bn * BN + ((i * 128 + tid) % 16) * 8]), 16)
            T.ptx["cp.async.commit_group"]()
        for ko in T.serial(KT):
            T.ptx["cp.async.wait_group"](stages - 2)
            sync()
            if ko + stages - 1 < KT:
                for i in T.unroll(4):
                    T.ptx["cp.async.cg.shared.global"](
                        As.ptr_to([(ko + stages - 1) % stages, (i * 128 + tid) // 4,
                                   (((i * 128 + tid) % 4) ^ ((((i * 128 + tid) // 4) >> 1) & sa)) * 8]),
                        A.ptr_to([bm * BM + (i * 128 + tid) // 4, (ko + stages - 1) * BK + ((i * 128 + tid) % 4) * 8]),
                        16)
                    T.ptx["cp.async.cg.shared.global"](
                        Bs.ptr_to([(ko + stages - 1) % stages, (i * 128 + tid) // 16,
                                   (((i * 128 + tid) % 16) ^ (((i * 128 + tid) // 16) & sb)) * 8]),
                        B.ptr_to([(ko + stages - 1) * BK + (i * 128 + tid) // 16, bn * BN + ((i * 128 + tid) % 16) * 8]),
                        16)
            T.ptx["cp.async.commit_group"]()
            for kk in T.unroll(BK // 16):
                for i in T.unroll(4):
                    T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(
                        af[i, 0], af[i, 1], af[i, 2], af[i, 3],
                        As.ptr_to([ko % stages, wm * 64 + i * 16 + lane % 16,
                                   ((kk * 2 + lane // 16) ^ (((wm * 64 + i * 16 + lane % 16) >> 1) & sa)) * 8]))
                for j in T.unroll(4):
                    T.ptx.ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16(
                        bf[2 * j, 0], bf[2 * j, 1], bf[2 * j + 1, 0], bf[2 * j + 1, 1],
                        Bs.ptr_to([ko % stages, kk * 16 + lane % 16,
                                   ((wn * 8 + j * 2 + lane // 16) ^ ((kk * 16 + lane % 16) & sb)) * 8]))
                for i in T.unroll(4):
                    for j in T.unroll(8):
                        T.ptx.mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32(
                            acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3],
                            af[i, 0], af[i, A1], af[i, A2], af[i, 3], bf[j, 0], bf[j, 1],
                            acc[i, j, 0], acc[i, j, 1], acc[i, j, 2], acc[i, j, 3])
        for i in T.unroll(4):
            for j in T.unroll(8):
                for r in T.unroll(4):
                    C[bm * BM + wm * 64 + i * 16 + lane // 4 + 8 * (r // 2),
                      bn * BN + wn * 64 + j * 8 + 2 * (lane % 4) + r % 2] = acc[i, j, r]

    return gemm


# ----------------------------------------------------------------------------------------------------------------------
# (f) one-warp tiles for the other mma dtypes; operands staged with cp.async, K-major B
# ----------------------------------------------------------------------------------------------------------------------


def mma_tile_k32_8bit(a_dtype="int8", b_dtype="int8"):
    """One m16n8k32 mma with 8-bit operands: C[16, 8] = A[16, 32] @ Bt[8, 32]^T (+ C0).

    int8/uint8 -> int32 (``mma...s32.s8.s8.s32``, result in an int32 buffer) or e4m3/e5m2 -> f32 (sm_89).
    A via ldmatrix.x4, Bt (K-major) via ldmatrix.x2; both tiles copied with one 16-byte cp.async per lane.
    """
    tok = {"int8": "s8", "uint8": "u8", "float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
    is_int = a_dtype in ("int8", "uint8")
    acc_t, acc_tok = ("int32", "s32") if is_int else ("float32", "f32")
    mma = T.ptx[f"mma.sync.aligned.m16n8k32.row.col.{acc_tok}.{tok[a_dtype]}.{tok[b_dtype]}.{acc_tok}"]
    reg_t = "uint32" if is_int else "float32"

    def to_reg(v):      # integer accumulators live in uint32 registers (the T.ptx rule for .s32)
        return T.reinterpret(reg_t, v) if is_int else v

    def from_reg(v):
        return T.reinterpret(acc_t, v) if is_int else v

    @T.prim_func
    def mma_8bit(A: T.Buffer((16, 32), a_dtype), Bt: T.Buffer((8, 32), b_dtype), C0: T.Buffer((16, 8), acc_t),
                 C: T.Buffer((16, 8), acc_t)):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        As = T.alloc_buffer((16, 32), "uint8", scope="shared", align=128)
        Bs = T.alloc_buffer((8, 32), "uint8", scope="shared", align=128)
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        acc = T.alloc_local((4,), reg_t)
        T.ptx["cp.async.cg.shared.global"](As.ptr_to([lane // 2, (lane % 2) * 16]),
                                           A.ptr_to([lane // 2, (lane % 2) * 16]), 16)
        if lane < 16:
            T.ptx["cp.async.cg.shared.global"](Bs.ptr_to([lane // 2, (lane % 2) * 16]),
                                               Bt.ptr_to([lane // 2, (lane % 2) * 16]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        for j in T.unroll(4):
            acc[j] = to_reg(C0[lane // 4 + 8 * (j // 2), 2 * (lane % 4) + j % 2])
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(a[0], a[1], a[2], a[3], As.ptr_to([lane % 16, 16 * (lane // 16)]))
        T.ptx.ldmatrix.sync.aligned.m8n8.x2.shared.b16(b[0], b[1], Bs.ptr_to([lane % 8, 16 * ((lane // 8) % 2)]))
        mma(acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3], b[0], b[1], acc[0], acc[1], acc[2], acc[3])
        for j in T.unroll(4):
            C[lane // 4 + 8 * (j // 2), 2 * (lane % 4) + j % 2] = from_reg(acc[j])

    return mma_8bit


def mma_tile_tf32(round_inputs=True):
    """One m16n8k8 tf32 mma: C[16, 8] = A[16, 8] @ Bt[8, 8]^T, f32 inputs rounded with ``cvt.rna.tf32.f32``
    (``round_inputs=False`` feeds the raw f32 bits: the mma then ignores the low 13 bits)."""

    @T.prim_func
    def mma_tf32(A: T.Buffer((16, 8), "float32"), Bt: T.Buffer((8, 8), "float32"), C: T.Buffer((16, 8), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        As = T.alloc_buffer((16, 8), "float32", scope="shared", align=128)
        Bs = T.alloc_buffer((8, 8), "float32", scope="shared", align=128)
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        acc = T.alloc_local((4,), "float32")
        T.ptx["cp.async.cg.shared.global"](As.ptr_to([lane // 2, (lane % 2) * 4]),
                                           A.ptr_to([lane // 2, (lane % 2) * 4]), 16)
        if lane < 16:
            T.ptx["cp.async.cg.shared.global"](Bs.ptr_to([lane // 2, (lane % 2) * 4]),
                                               Bt.ptr_to([lane // 2, (lane % 2) * 4]), 16)
        T.ptx["cp.async.commit_group"]()
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()
        for j in T.unroll(4):
            acc[j] = T.float32(0)
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(a[0], a[1], a[2], a[3], As.ptr_to([lane % 16, 4 * (lane // 16)]))
        T.ptx.ldmatrix.sync.aligned.m8n8.x2.shared.b16(b[0], b[1], Bs.ptr_to([lane % 8, 4 * ((lane // 8) % 2)]))
        if round_inputs:
            for r in T.unroll(4):
                T.ptx.cvt.rna.tf32.f32(a[r], T.reinterpret("float32", a[r]))
            for r in T.unroll(2):
                T.ptx.cvt.rna.tf32.f32(b[r], T.reinterpret("float32", b[r]))
        T.ptx.mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32(
            acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3], b[0], b[1], acc[0], acc[1], acc[2], acc[3])
        for j in T.unroll(4):
            C[lane // 4 + 8 * (j // 2), 2 * (lane % 4) + j % 2] = acc[j]

    return mma_tf32


def mma_tile_f16_acc():
    """One m16n8k16 mma with an f16 accumulator: D = A @ B + C0, all f16. C0 and D travel as uint32 [16, 4]
    (two halves per register, the lower column in bits 15:0), exactly the f16x2 accumulator registers."""

    @T.prim_func
    def mma_f16acc(A: T.Buffer((16, 16), "float16"), B: T.Buffer((16, 8), "float16"), C0: T.Buffer((16, 4), "uint32"),
                   D: T.Buffer((16, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        As = T.alloc_buffer((16, 16), "float16", scope="shared", align=128)
        Bs = T.alloc_buffer((16, 8), "float16", scope="shared", align=128)
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        acc = T.alloc_local((2,), "uint32")
        T.ptx["cp.async.cg.shared.global"](As.ptr_to([lane // 2, (lane % 2) * 8]),
                                           A.ptr_to([lane // 2, (lane % 2) * 8]), 16)
        if lane < 16:
            T.ptx["cp.async.cg.shared.global"](Bs.ptr_to([lane, 0]), B.ptr_to([lane, 0]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        acc[0] = C0[lane // 4, lane % 4]
        acc[1] = C0[lane // 4 + 8, lane % 4]
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(a[0], a[1], a[2], a[3], As.ptr_to([lane % 16, 8 * (lane // 16)]))
        T.ptx.ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16(b[0], b[1], Bs.ptr_to([lane % 16, 0]))
        T.ptx.mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16(acc[0], acc[1], a[0], a[1], a[2], a[3], b[0], b[1],
                                                                acc[0], acc[1])
        D[lane // 4, lane % 4] = acc[0]
        D[lane // 4 + 8, lane % 4] = acc[1]

    return mma_f16acc


# ----------------------------------------------------------------------------------------------------------------------
# stmatrix round trip (sm_90+)
# ----------------------------------------------------------------------------------------------------------------------


def stmatrix_roundtrip(trans=False):
    """Out[16, 16] = four 8x8 blocks of In moved ldmatrix.x4 -> registers -> stmatrix.x4{.trans} -> shared."""

    @T.prim_func
    def st_roundtrip(In: T.Buffer((16, 16), "float16"), Out: T.Buffer((16, 16), "float16")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        Xs = T.alloc_buffer((16, 16), "float16", scope="shared", align=128)
        Ys = T.alloc_buffer((16, 16), "float16", scope="shared", align=128)
        r = T.alloc_local((4,), "uint32")
        T.ptx["cp.async.cg.shared.global"](Xs.ptr_to([lane // 2, (lane % 2) * 8]),
                                           In.ptr_to([lane // 2, (lane % 2) * 8]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(r[0], r[1], r[2], r[3], Xs.ptr_to([lane % 16, 8 * (lane // 16)]))
        if trans:
            T.ptx.stmatrix.sync.aligned.m8n8.x4.trans.shared.b16(Ys.ptr_to([lane % 16, 8 * (lane // 16)]),
                                                                 r[0], r[1], r[2], r[3])
        else:
            T.ptx.stmatrix.sync.aligned.m8n8.x4.shared.b16(Ys.ptr_to([lane % 16, 8 * (lane // 16)]),
                                                           r[0], r[1], r[2], r[3])
        T.cuda.cta_sync()
        for i in T.unroll(8):
            Out[(lane * 8 + i) // 16, (lane * 8 + i) % 16] = Ys[(lane * 8 + i) // 16, (lane * 8 + i) % 16]

    return st_roundtrip


# ----------------------------------------------------------------------------------------------------------------------
# (e) deliberate faults
# ----------------------------------------------------------------------------------------------------------------------


def oob_read(n=128, shift=1):
    """Out[i] = In[i + shift] for 128 threads: the last ``shift`` threads read past the end of In."""

    @T.prim_func
    def oob(In: T.Buffer((n,), "float32"), Out: T.Buffer((128,), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        Out[warp * 32 + lane] = In[warp * 32 + lane + shift]

    return oob


def uninitialized_shared_read():
    """Only the first 64 threads fill the 128-element shared buffer, then everybody reads its own element."""

    @T.prim_func
    def uninit(In: T.Buffer((128,), "float32"), Out: T.Buffer((128,), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        S = T.alloc_buffer((128,), "float32", scope="shared")
        if warp < 2:
            S[warp * 32 + lane] = In[warp * 32 + lane]
        T.cuda.cta_sync()
        Out[warp * 32 + lane] = S[warp * 32 + lane]

    return uninit


def cp_async_without_wait(wait=False):
    """cp.async a 16x16 f16 tile into shared, commit, barrier and ldmatrix it; ``wait=False`` omits the
    ``cp.async.wait_group 0`` (the data has not landed when ldmatrix reads it)."""

    def maybe_wait():
        return T.ptx["cp.async.wait_group"](0) if wait else T.int32(0)

    @T.prim_func
    def no_wait(In: T.Buffer((16, 16), "float16"), Out: T.Buffer((32, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        Xs = T.alloc_buffer((16, 16), "float16", scope="shared", align=128)
        r = T.alloc_local((4,), "uint32")
        T.ptx["cp.async.cg.shared.global"](Xs.ptr_to([lane // 2, (lane % 2) * 8]),
                                           In.ptr_to([lane // 2, (lane % 2) * 8]), 16)
        T.ptx["cp.async.commit_group"]()
        maybe_wait()
        T.cuda.cta_sync()
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(r[0], r[1], r[2], r[3], Xs.ptr_to([lane % 16, 8 * (lane // 16)]))
        for i in T.unroll(4):
            Out[lane, i] = r[i]

    return no_wait


def divergent_mma():
    """An mma executed by half of the warp (lanes 0-15): undefined for ``.sync.aligned``."""

    @T.prim_func
    def div_mma(Out: T.Buffer((32, 4), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        a = T.alloc_local((4,), "uint32")
        b = T.alloc_local((2,), "uint32")
        acc = T.alloc_local((4,), "float32")
        for i in T.unroll(4):
            a[i] = T.uint32(0x3C003C00)
            acc[i] = T.float32(0)
        for i in T.unroll(2):
            b[i] = T.uint32(0x3C003C00)
        if lane < 16:
            T.ptx.mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32(
                acc[0], acc[1], acc[2], acc[3], a[0], a[1], a[2], a[3], b[0], b[1], acc[0], acc[1], acc[2], acc[3])
        for i in T.unroll(4):
            Out[lane, i] = acc[i]

    return div_mma


def divergent_barrier():
    """``__syncthreads`` inside ``if warp == 0`` with 2 warps: the other warp never arrives."""

    @T.prim_func
    def div_bar(Out: T.Buffer((64,), "float32")):
        T.device_entry()
        _bx = T.cta_id([1])
        warp = T.warp_id([2])
        lane = T.lane_id([32])
        if warp == 0:
            T.cuda.cta_sync()
        Out[warp * 32 + lane] = T.float32(1)

    return div_bar


def masked_scale(n):
    """Out[i] = 2 * In[i] for i < n (divergent guard), 128 threads over ``ceil(len / 128)`` CTAs of a 256 array."""

    @T.prim_func
    def masked(In: T.Buffer((256,), "float32"), Out: T.Buffer((256,), "float32")):
        T.device_entry()
        bx = T.cta_id([2])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        if bx * 128 + warp * 32 + lane < n:
            Out[bx * 128 + warp * 32 + lane] = In[bx * 128 + warp * 32 + lane] * T.float32(2)

    return masked


# ----------------------------------------------------------------------------------------------------------------------
# (h) bank conflicts: ldmatrix.x4 over a 64x64 f16 tile (128-byte rows), plain or XOR-swizzled
# ----------------------------------------------------------------------------------------------------------------------


def ldmatrix_banks(swizzle):
    """Fill a 64x64 f16 shared tile (row r, 16-byte chunk c stored at chunk ``c ^ (r & 7)`` when swizzled), then
    ldmatrix.x4 the 16x16 block at (row 16, col 16). Out receives the fragments (32 lanes x 4 registers)."""
    sw = 7 if swizzle else 0

    @T.prim_func
    def banks(In: T.Buffer((64, 64), "float16"), Out: T.Buffer((32, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        S = T.alloc_buffer((64, 64), "float16", scope="shared", align=128)
        r = T.alloc_local((4,), "uint32")
        for it in T.unroll(16):
            T.ptx["cp.async.cg.shared.global"](
                S.ptr_to([(it * 32 + lane) // 8, (((it * 32 + lane) % 8) ^ (((it * 32 + lane) // 8) & sw)) * 8]),
                In.ptr_to([(it * 32 + lane) // 8, ((it * 32 + lane) % 8) * 8]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(
            r[0], r[1], r[2], r[3], S.ptr_to([16 + lane % 16, ((2 + lane // 16) ^ ((16 + lane % 16) & sw)) * 8]))
        for i in T.unroll(4):
            Out[lane, i] = r[i]

    return banks


# ----------------------------------------------------------------------------------------------------------------------
# (g) the dequant fast path's instructions inside a kernel: int4 -> f16 with lop3 + sub.f16x2 + fma.rn.f16x2
# ----------------------------------------------------------------------------------------------------------------------


def int4_to_f16x2():
    """For each packed word w (8 unsigned nibbles), lane l produces 4 f16x2 words: nibble pairs (0,4), (1,5), ...
    via ``lop3 (w >> 4k) & 0x000F000F | 0x64006400`` (f16 1024 + q), ``sub.f16x2`` 1024 and
    ``fma.rn.f16x2 x * scale + bias``. Out[l, k] holds the f16x2 result for pair k."""

    @T.prim_func
    def dequant(W: T.Buffer((32,), "uint32"), SB: T.Buffer((2,), "uint32"), Out: T.Buffer((32, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        t = T.alloc_local((4,), "uint32")
        x = T.alloc_local((4,), "uint32")
        y = T.alloc_local((4,), "uint32")
        for k in T.unroll(4):
            T.ptx.lop3.b32(t[k], W[lane] >> T.uint32(4 * k), T.uint32(0x000F000F), T.uint32(0x64006400), 0xEA)
            T.ptx.sub.f16x2(x[k], t[k], T.uint32(0x64006400))
            T.ptx.fma.rn.f16x2(y[k], x[k], SB[0], SB[1])
            Out[lane, k] = y[k]

    return dequant


# ----------------------------------------------------------------------------------------------------------------------
# assorted PTX families inside one kernel (st/ld.shared, shfl.sync, prmt, cvt, mov, ldmatrix.x1)
# ----------------------------------------------------------------------------------------------------------------------


def ptx_assortment():
    """One warp. Out[l, 0] = W[(l + 1) % 32] (st.shared / ld.shared), Out[l, 1] = that value from lane l ^ 1
    (shfl.sync.bfly), Out[l, 2] = prmt.f4e(Out[l,0], Out[l,1], l), Out[l, 3] = cvt.rn.f16x2.f32(X[l,0], X[l,1]),
    Out[l, 4] = cvt.rn.f16x2.e4m3x2(low 16 bits of W[l]), Out[l, 5] = mov.b32 {lo, hi} of W[l] halves swapped,
    Out[l, 6] = ldmatrix.x1 of the 8x8 f16 tile H (lanes 0-7 give the rows)."""

    @T.prim_func
    def assortment(W: T.Buffer((32,), "uint32"), X: T.Buffer((32, 2), "float32"), H: T.Buffer((8, 8), "float16"),
                   Out: T.Buffer((32, 7), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _warp = T.warp_id([1])
        lane = T.lane_id([32])
        S = T.alloc_buffer((32,), "uint32", scope="shared", align=128)
        Hs = T.alloc_buffer((8, 8), "float16", scope="shared", align=128)
        r = T.alloc_local((7,), "uint32")
        h = T.alloc_local((2,), "uint16")
        T.ptx["st.shared.b32"](S.ptr_to([lane]), W[lane])
        if lane < 8:
            T.ptx["cp.async.ca.shared.global"](Hs.ptr_to([lane, 0]), H.ptr_to([lane, 0]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        T.ptx["ld.shared.b32"](r[0], S.ptr_to([(lane + 1) % 32]))
        T.ptx.shfl_sync.bfly.b32(r[1], r[0], T.uint32(1), T.uint32(0x1F), T.uint32(0xFFFFFFFF))
        T.ptx.prmt.b32.f4e(r[2], r[0], r[1], T.Cast("uint32", lane))
        T.ptx.cvt.rn.f16x2.f32(r[3], X[lane, 0], X[lane, 1])
        T.ptx.cvt.rn.f16x2.e4m3x2(r[4], T.Cast("uint16", W[lane] & T.uint32(0xFFFF)))
        h[0] = T.Cast("uint16", W[lane] >> T.uint32(16))
        h[1] = T.Cast("uint16", W[lane] & T.uint32(0xFFFF))
        T.ptx["mov.b32"](r[5], h[0], h[1])
        T.ptx.ldmatrix.sync.aligned.m8n8.x1.shared.b16(r[6], Hs.ptr_to([lane % 8, 0]))
        for i in T.unroll(7):
            Out[lane, i] = r[i]

    return assortment


# ----------------------------------------------------------------------------------------------------------------------
# kernel styles the emitters use: raw uint8 dyn-smem pool + T.let shared base + T.ptx.addr immediates; vectorized
# copies; symbolic shapes
# ----------------------------------------------------------------------------------------------------------------------


def let_base_ptx_addr():
    """16x16 f16 tile -> a raw uint8 ``shared.dyn`` pool at byte 512 (cp.async through ``T.ptx.addr(sbase, 512)``),
    then ldmatrix.x4 from the same base: Out[l, m] = ldmatrix register m of lane l."""

    @T.prim_func
    def let_base(A: T.Buffer((16, 16), "float16"), Out: T.Buffer((32, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _w = T.warp_id([1])
        lane = T.lane_id([32])
        smem = T.alloc_buffer((1024,), "uint8", scope="shared.dyn", align=1024)
        r = T.alloc_local((4,), "uint32")
        sbase: T.let[T.uint32] = T.cuda.cvta_generic_to_shared(smem.ptr_to([0]))
        T.ptx["cp.async.cg.shared.global"](T.ptx.addr(sbase + T.uint32(lane * 16), 512),
                                           A.ptr_to([lane // 2, (lane % 2) * 8]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        for _i in T.unroll(1):
            T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(
                r[0], r[1], r[2], r[3], T.ptx.addr(sbase + T.uint32((lane % 16) * 32 + (lane // 16) * 16), 512))
        for i in T.unroll(4):
            Out[lane, i] = r[i]

    return let_base


def vectorized_rows(n):
    """C[r, :] = 3 * A[r', :] (f16 -> f32) with r' the next row of the same 128-row block; 16-byte vector copies
    into shared and vectorized fp32 stores."""

    @T.prim_func
    def vec_rows(A: T.Buffer((n, 8), "float16"), C: T.Buffer((n, 8), "float32")):
        T.device_entry()
        bx = T.cta_id([n // 128])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        S = T.alloc_buffer((128, 8), "float16", scope="shared")
        acc = T.alloc_local((8,), "float32")
        tid = T.meta_var(warp * 32 + lane)
        for v in T.vectorized(8):
            S[tid, v] = A[bx * 128 + tid, v]
        T.cuda.cta_sync()
        for v in T.unroll(8):
            acc[v] = T.Cast("float32", S[(tid + 1) % 128, v]) * T.float32(3)
        for v in T.vectorized(8):
            C[bx * 128 + tid, v] = acc[v]

    return vec_rows


def symbolic_add_one():
    """B[i] = A[i] + 1 for a symbolic length n over ceil(n / 128) CTAs (guarded tail)."""

    @T.prim_func
    def add_one(a: T.handle, b: T.handle):
        n = T.int32()
        A = T.match_buffer(a, (n,), "float32")
        B = T.match_buffer(b, (n,), "float32")
        T.device_entry()
        bx = T.cta_id([T.ceildiv(n, 128)])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        if bx * 128 + warp * 32 + lane < n:
            B[bx * 128 + warp * 32 + lane] = A[bx * 128 + warp * 32 + lane] + T.float32(1)

    return add_one


def thread_dependent_loops():
    """Out[l, 0] = 1 + 2 + ... + (l % 5) (a loop whose trip count differs per lane); Out[l, 1] = sum of
    range(3, 20, 5) (a stepped loop)."""

    @T.prim_func
    def loops(Out: T.Buffer((32, 2), "int32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _w = T.warp_id([1])
        lane = T.lane_id([32])
        acc = T.alloc_local((2,), "int32")
        acc[0] = 0
        acc[1] = 0
        for i in T.serial(lane % 5):
            acc[0] = acc[0] + i + 1
        for i in T.serial(3, 20, step=5):
            acc[1] = acc[1] + i
        Out[lane, 0] = acc[0]
        Out[lane, 1] = acc[1]

    return loops


def cp_async_sizes():
    """Per lane: a 16-byte cp.async with src-size N[l] (bytes past N[l] are zero-filled) into row l of S, and an
    8-byte cp.async.ca of A[l, 0:2] into row l of R. Out[l, 0:4] = S[l, :], Out[l, 4:6] = R[l, :]."""

    @T.prim_func
    def sizes(A: T.Buffer((32, 4), "uint32"), N: T.Buffer((32,), "uint32"), Out: T.Buffer((32, 6), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _w = T.warp_id([1])
        lane = T.lane_id([32])
        S = T.alloc_buffer((32, 4), "uint32", scope="shared", align=128)
        R = T.alloc_buffer((32, 2), "uint32", scope="shared", align=128)
        T.ptx["cp.async.cg.shared.global"](S.ptr_to([lane, 0]), A.ptr_to([lane, 0]), 16, N[lane])
        T.ptx["cp.async.ca.shared.global"](R.ptr_to([lane, 0]), A.ptr_to([lane, 0]), 8)
        T.ptx["cp.async.commit_group"]()
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()
        for i in T.unroll(4):
            Out[lane, i] = S[lane, i]
        for i in T.unroll(2):
            Out[lane, 4 + i] = R[lane, i]

    return sizes


def shifted_tile(off):
    """cp.async a 16x16 f16 tile from rows ``off..off+15`` of A (past its end when off > 0) and ldmatrix it at
    element offset (off, off) of the 16x16 shared tile: misaligned and out of bounds when off > 0."""

    @T.prim_func
    def shifted(A: T.Buffer((16, 16), "float16"), Out: T.Buffer((32, 4), "uint32")):
        T.device_entry()
        _bx = T.cta_id([1])
        _w = T.warp_id([1])
        lane = T.lane_id([32])
        Xs = T.alloc_buffer((16, 16), "float16", scope="shared", align=128)
        r = T.alloc_local((4,), "uint32")
        T.ptx["cp.async.cg.shared.global"](Xs.ptr_to([lane // 2, (lane % 2) * 8]),
                                           A.ptr_to([lane // 2 + off, (lane % 2) * 8]), 16)
        T.ptx["cp.async.wait_all"]()
        T.cuda.cta_sync()
        T.ptx.ldmatrix.sync.aligned.m8n8.x4.shared.b16(r[0], r[1], r[2], r[3],
                                                       Xs.ptr_to([lane % 16 + off, 8 * (lane // 16) + off]))
        for i in T.unroll(4):
            Out[lane, i] = r[i]

    return shifted
