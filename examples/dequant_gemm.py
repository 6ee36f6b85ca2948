"""W4A16 dequant GEMV / small-M GEMM composed from mmaemit's building blocks: C[M, N] = A[M, K] @ dequant(W)[N, K]^T.

Weights: 4-bit codes with a per-(n, group) scale, packed once by :func:`mmaemit.dequant.kernel_layout.to_kernel_layout`
(mma B-fragment order, a K permutation inside each 64-wide chunk, 16 bytes per lane per chunk). Small-M path
(M <= 16) per CTA: ``k_slices`` warps each own a K slice of the same ``16 * n_blocks`` output columns.

* weights: one 16-byte ``cp.async`` per lane per n16 block and 64-wide K chunk into a ``stages``-deep per-thread ring
  in shared memory (each thread reads back only the bytes it copied, so the ring needs no barrier);
* activations: the K permutation makes a lane's A-fragment registers of a chunk 16 consecutive halfs of one row, so
  two 16-byte loads per row fetch them (rows >= M are zero and never loaded);
* decode: magic-number fast path (``lop3`` into 0x6400, exact ``sub.f16x2``) of the integer codes straight into the
  mma B-fragment registers; ``mma.sync m16n8k16`` through ``TensorCoreIntrinEmitter.mma`` accumulates the group's
  integer-weight products in fp32 (exact products), and at the end of every group the fp32 partials are scaled,
  ``acc += s[n, group] * partial`` (one FFMA per accumulator per group instead of one HMUL2 per weight pair, and
  the scale is applied in fp32 instead of rounding every dequantized weight to fp16);
* epilogue: every warp writes its partial sums of rows < M to shared memory; after one barrier all threads sum the
  ``k_slices`` partials of the M x (16 n_blocks) outputs in parallel and store them coalesced.

    python -m examples.dequant_gemm         # needs a GPU
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit import TensorCoreIntrinEmitter
from mmaemit.dequant.decode import decode_program
from mmaemit.dequant.kernel_layout import CHUNK
from mmaemit.dtypes import canonical
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices


@dataclass(frozen=True)
class GemvConfig:
    """Tile configuration of the small-M path."""

    n_blocks: int = 4    # n16 blocks per warp: the warp's C tile is M x (16 * n_blocks)
    k_slices: int = 16   # warps per CTA, each a K slice; partial sums reduced through shared memory
    stages: int = 4      # depth of the per-thread cp.async weight ring (chunks in flight)
    min_blocks_per_sm: int = 1   # __launch_bounds__ minimum: 2 asks nvcc to fit two CTAs per SM in registers


def make_dequant_gemv(M, N, K, group_size=128, dtype="float16", config: GemvConfig = GemvConfig(), arch=None):
    """Build ``gemv(A, W, S, C)``: A [M, K], W int32 [N/16, K/64, 32, 4] (``to_kernel_layout``), S [N/16, K/group, 4,
    4] (``to_kernel_scales``, A's dtype), C [M, N]. Codes are int4 (two's complement, value = scale * q)."""
    from tvm.script import tirx as T

    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}")
    if not 1 <= M <= 16:
        raise TileShapeError(f"the small-M path takes 1 <= M <= 16, not M={M}")
    NB, KS = config.n_blocks, config.k_slices
    BN = 16 * NB
    G = K if group_size in (None, -1) else group_size
    if N % BN:
        raise TileShapeError(f"N={N} must be a multiple of 16 * n_blocks = {BN}")
    ST = config.stages
    if K % (CHUNK * KS * 2):
        raise TileShapeError(f"K={K} must be a multiple of 64 * k_slices * 2 = {CHUNK * KS * 2}")
    if ST < 2:
        raise UnsupportedConfigError(f"stages must be >= 2, not {ST}")
    if G % CHUNK or K % G:
        raise TileShapeError(f"group_size={group_size} must divide K and be a multiple of {CHUNK}")
    CH = K // CHUNK // KS
    em = TensorCoreIntrinEmitter(dtype, dtype, "float32", b_transposed=True, block_row_warps=1, block_col_warps=1,
                                 warp_row_tiles=16, warp_col_tiles=BN, chunk=16, n_tile=16, arch=arch)
    TWO_ROWS = M > 8
    THREADS = 32 * KS
    GC = G // CHUNK                      # chunks per scale group
    ROWS = 2 if TWO_ROWS else 1          # A rows a lane holds: g (and g + 8 when M > 8)
    MINB = config.min_blocks_per_sm
    OUT_ITERS = (M * BN + THREADS - 1) // THREADS

    # 8 nibbles e0 e2 e4 e6 | e1 e3 e5 e7 -> 4 f16x2 B registers (lop3 into 0x6400, exact sub): mmaemit.dequant.decode
    program = decode_program("int4", dtype, mode="none", arch=arch or "sm_80")

    def decode_int4(word, out):
        program.emit(word, out)  # appends the ops; returns nothing to the parser

    def scale_to_f32(word, e):
        return T.Cast("float32", T.reinterpret(dtype, T.Cast("uint16", (word >> T.uint32(16 * e)) & T.uint32(0xFFFF))))

    @T.prim_func
    def gemv(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, K // CHUNK, 32, 4), "int32"),
             S: T.Buffer((N // 16, K // G, 4, 4), dtype), C: T.Buffer((M, N), dtype)):
        T.device_entry()
        T.attr({"tirx.launch_bounds_min_blocks_per_sm": MINB})
        cta = T.cta_id([N // BN])
        warp = T.warp_id([KS])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        Ring = pool.alloc((ST, NB, KS * 32, 4), "uint32", align=128)   # [stage, block, thread, word]
        pool.move_base_to(0)
        Part = pool.alloc((KS, M, BN), "float32", align=128)           # partial sums (after the ring is drained)
        pool.commit()
        A_frag, B_frag, C_frag = em.alloc_fragments()
        P_frag = T.alloc_local((1, NB, em.local_size_c), "float32")    # this group's unscaled partial sums
        em.fill_accumulators(C_frag)
        em.fill_accumulators(P_frag)
        wb = T.alloc_local((NB, 4), "uint32")
        ab = T.alloc_local((2, ROWS, 8), "uint32")
        sreg = T.alloc_local((NB, 2), "uint32")
        for q in T.unroll(16 * ROWS):
            ab[q // (8 * ROWS), q // 8 % ROWS, q % 8] = T.uint32(0)
        for q in T.unroll(4):
            A_frag[0, q] = T.uint32(0)
        tid = T.meta_var(warp * 32 + lane)
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)

        @T.inline
        def issue_weights(j):
            # chunk j of this warp's K slice -> ring stage j % ST (16 bytes per lane and n16 block)
            for nb in T.unroll(NB):
                T.ptx["cp.async.cg.shared.global"](Ring.ptr_to([j % ST, nb, tid, 0]),
                                                   W.ptr_to([cta * NB + nb, warp * CH + j, lane, 0]), 16)

        @T.inline
        def load_a(buf, j):
            # activation rows < M for chunk j, one chunk ahead in registers
            kc = T.meta_var(warp * CH + j)
            for r in T.unroll(ROWS):
                if g + 8 * r < M:
                    for half in T.unroll(2):
                        T.ptx["ld.global.nc.v4.b32"](ab[buf, r, 4 * half], ab[buf, r, 4 * half + 1],
                                                     ab[buf, r, 4 * half + 2], ab[buf, r, 4 * half + 3],
                                                     A.ptr_to([g + 8 * r, kc * CHUNK + 16 * c + 8 * half]))

        @T.inline
        def compute(buf, j):
            kc = T.meta_var(warp * CH + j)
            T.ptx["cp.async.wait_group"](ST - 2)   # chunk j has landed (this thread's own bytes: no barrier)
            for nb in T.unroll(NB):
                T.ptx["ld.shared.v4.b32"](wb[nb, 0], wb[nb, 1], wb[nb, 2], wb[nb, 3],
                                          Ring.ptr_to([j % ST, nb, tid, 0]))
            if j + ST - 1 < CH:
                issue_weights(j + ST - 1)
            T.ptx["cp.async.commit_group"]()       # unconditional: keeps the group count uniform
            # a K slice may start or end inside a scale group: its share of the group is scaled on its own
            if kc % GC == 0 or j == 0:             # first chunk of a group (in this slice): fetch its scales
                for nb in T.unroll(NB):
                    T.ptx["ld.global.nc.v2.b32"](sreg[nb, 0], sreg[nb, 1], S.ptr_to([cta * NB + nb, kc // GC, c, 0]))
            for s in T.unroll(4):
                for r in T.unroll(ROWS):
                    A_frag[0, r] = ab[buf, r, 2 * s]
                    A_frag[0, 2 + r] = ab[buf, r, 2 * s + 1]
                for nb in T.unroll(NB):
                    decode_int4(wb[nb, s], [B_frag[nb, i] for i in range(4)])
                em.mma(A_frag, B_frag, P_frag)
            if kc % GC == GC - 1 or j == CH - 1:   # last chunk of the group (in this slice): acc += s * partial
                for nb in T.unroll(NB):
                    for q in T.unroll(em.local_size_c):
                        e = T.meta_var(em.c_layout.forward(lane, q % 4, 0)[1] % 2)
                        C_frag[0, nb, q] = C_frag[0, nb, q] + scale_to_f32(sreg[nb, q // 4], e) * P_frag[0, nb, q]
                        P_frag[0, nb, q] = T.float32(0)

        for j in T.unroll(ST - 1):
            if j < CH:
                issue_weights(j)
            T.ptx["cp.async.commit_group"]()
        load_a(0, 0)
        for jj in T.serial(CH // 2):
            load_a(1, 2 * jj + 1)
            compute(0, 2 * jj)
            if 2 * jj + 2 < CH:
                load_a(0, 2 * jj + 2)
            compute(1, 2 * jj + 1)
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()                          # the ring is drained everywhere before Part overwrites it
        for j in T.unroll(em.warp_cols):
            for r in T.unroll(em.local_size_c):
                rc = T.meta_var(em.c_layout.forward(lane, r % 4, 0))
                if rc[0] < M:
                    Part[warp, rc[0], j * 16 + r // 4 * 8 + rc[1]] = C_frag[0, j, r]
        T.cuda.cta_sync()
        for t in T.unroll(OUT_ITERS):
            o = T.meta_var(tid + t * THREADS)
            if o < M * BN:
                acc = T.alloc_local((1,), "float32")
                acc[0] = T.float32(0)
                for w in T.unroll(KS):
                    acc[0] = acc[0] + Part[w, o // BN, o % BN]
                C[o // BN, cta * BN + o % BN] = T.Cast(dtype, acc[0])

    return gemv, em
