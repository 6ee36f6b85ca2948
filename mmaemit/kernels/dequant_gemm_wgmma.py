"""Hopper (sm_90a) dequant GEMM with ``wgmma``: C[M, N] = A[M, K] @ dequant(W)[N, K]^T for large M.

Same weight layout as the mma.sync kernels (:func:`mmaemit.dequant.kernel_layout.to_kernel_layout`, scales by
``to_kernel_scales``). ``wgmma`` takes only its A operand from registers, so the kernel computes the transpose,
``C^T = W @ A^T``: the decoded weights are the register-sourced A operand (64 weight rows per wgmma, 16 per warp),
the activations the shared-memory B operand, read once per warpgroup by the tensor cores.

Why the same packed weights work: a lane's decoded n16 x k16 B-fragment registers of ``mma.m16n8k16`` are
[(n=g, k lo), (n=g, k hi), (n=8+g, k lo), (n=8+g, k hi)]; wgmma's A fragment of 16 rows is [(g, lo), (g+8, lo),
(g, hi), (g+8, hi)] (``mmaemit.layouts.mma_fragment``): the same registers in the order 0, 2, 1, 3.

Per CTA (``warpgroups`` x ``m64_per_wg`` x 64 weight rows, ``block_t`` activation rows) and 64-wide K chunk:

* activations: 4-byte ``cp.async`` pieces into a ``stages``-deep ring, each pair of halfs put at its LOGICAL k
  position (the kernel layout permutes K inside every 64-chunk; wgmma reads B rows in logical order), with the
  128-byte swizzle that the wgmma descriptor names (``make_mma_swizzle_layout`` of a 64-half row is that swizzle);
  rows >= M are zero-filled;
* weights and scales: every lane copies its own 16-byte word group and 8 bytes of scales per n16 block (cp.async);
* decode: ``decode_program(..., mode="scale")`` (or the zeros mode) straight into the A registers (two register
  buffers: the next chunk decodes while the previous chunk's wgmma still reads its registers);
* ``wgmma.mma_async m64n{block_t}k16`` x 4 per chunk and m64, one commit group per chunk; ``wgmma.wait_group 0``
  and one barrier before the ring stage of the previous chunk is refilled;
* epilogue: accumulators -> shared (transposed, padded rows) -> 16-byte coalesced stores of rows < M.
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit.dequant.kernel_layout import CHUNK
from mmaemit.dtypes import canonical
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices


def wgmma_a_order(dtype="float16") -> tuple:
    """For wgmma A register j (rows = weight rows n, cols = k; ``mmaemit.layouts.wgmma_a_layout``): the index of the
    decoded n16 x k16 B-fragment register of ``mma.sync m16n8k16`` ([n0 b0, n0 b1, n1 b0, n1 b1]) that holds the same
    elements, derived from the two fragment maps."""
    from mmaemit import isa
    from mmaemit.layouts import mma_fragment, wgmma_a_layout

    A = wgmma_a_layout(isa.select_wgmma(dtype, dtype, "float32"))
    B = mma_fragment(isa.select_mma(dtype, dtype, "float32", k=16), "B")
    order = []
    for j in range(4):
        row, k = A.forward(0, j, 0)
        hits = [r for r in range(4) if (B.forward(0, r % 2, 0)[1] + 8 * (r // 2), B.forward(0, r % 2, 0)[0]) == (row, k)]
        if len(hits) != 1:
            raise AssertionError(f"wgmma A register {j} has no unique B-fragment source: {hits}")
        order.append(hits[0])
    return tuple(order)


def logical_k_of_pair(p):
    """Logical k' (kernel-layout order) of the real pair ``p`` (halfs 2p, 2p + 1) of a 64-wide chunk: the inverse of
    :func:`mmaemit.dequant.kernel_layout.k_permutation` on pairs (real 16c + 4s + 2h -> logical 16s + 8h + 2c); works
    on ints and TIR expressions."""
    return 16 * (p % 8 // 2) + 8 * (p % 2) + 2 * (p // 8)


@dataclass(frozen=True)
class WgmmaConfig:
    """Tile configuration of the wgmma path."""

    block_t: int = 128      # activation rows per CTA = the wgmma N (multiple of 8, <= 256)
    warpgroups: int = 4     # warpgroups per CTA, each 64 weight rows (one n16 block per warp)
    m64_per_wg: int = 1     # m64 weight tiles per warpgroup: > 1 is correct but ptxas serializes the wgmmas
    stages: int = 4         # cp.async ring depth (chunks; >= 3, prefetch distance stages - 2)
    panel: int = 8          # CTA rasterization panel (mmaemit.layouts.raster.panel_swizzle)


def make_dequant_gemm_wgmma(M, N, K, group_size=128, dtype="float16", config: WgmmaConfig = WgmmaConfig(),
                            arch="sm_90a", *, weight_format="int4", zeros_mode=None, m_max=None):
    """Build ``gemm(A, W, S, C)`` (``gemm(A, W, S, Z, C)`` with zeros) for sm_90a; arguments and layouts as
    :func:`mmaemit.kernels.dequant_gemm.make_dequant_gemv` (A [M, K], W int32 kernel layout, S / Z [N/16, K/G, 4, 4],
    C [M, N]). Emits ``wgmma.mma_async.sync.aligned.m64n{block_t}k16.f32.{f16,bf16}.{f16,bf16}`` (A from registers,
    B from a 128-byte-swizzled K-major shared tile), ``cp.async`` 4/8/16 bytes, the decode program's lop3/prmt/
    half2 ops and ``fence.proxy.async``. ``M=None``: a symbolic M (one kernel for every M >= 1)."""
    from tvm.script import tirx as T

    from mmaemit import isa
    from mmaemit.arch import as_arch
    from mmaemit.emitters.wgmma import WgmmaIntrinEmitter
    from mmaemit.dequant.kernel_layout import words_per_chunk
    from mmaemit.kernels.dequant_parts import check_scheme, grid_kernel, kernel_decode_program, pair_of_column
    from mmaemit.layouts.raster import panel_swizzle

    arch = as_arch(arch or "sm_90a")
    isa.require_feature("wgmma", arch)
    bits, z_kind = check_scheme(weight_format, zeros_mode)
    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}")
    cfg = config
    BT, WG, MW, ST = cfg.block_t, cfg.warpgroups, cfg.m64_per_wg, cfg.stages
    if BT % 8 or not 8 <= BT <= 256:
        raise TileShapeError(f"block_t={BT} must be a multiple of 8 in [8, 256] (the wgmma N)")
    if WG not in (1, 2, 3, 4) or MW not in (1, 2, 3, 4) or ST < 3:
        raise UnsupportedConfigError(f"warpgroups and m64_per_wg must be 1..4 and stages >= 3; got {WG}, {MW}, {ST}")
    if MW > 1:
        import warnings

        from mmaemit.errors import PerformanceWarning
        warnings.warn(f"m64_per_wg={MW}: ptxas serializes every wgmma of this kernel (C7514: it gives all m64 tiles "
                      f"the same A registers); use more warpgroups instead", PerformanceWarning, stacklevel=2)
    if MW * BT // 2 > 128:
        raise TileShapeError(f"m64_per_wg * block_t / 2 = {MW * BT // 2} accumulator registers per thread exceed 128")
    BW = 64 * WG * MW                      # weight rows (output columns) per CTA
    G = K if group_size in (None, -1) else group_size
    if N % BW:
        raise TileShapeError(f"N={N} must be a multiple of 64 * warpgroups * m64_per_wg = {BW}")
    if K % CHUNK or G % CHUNK or K % G:
        raise TileShapeError(f"K={K} and group_size={group_size} must be multiples of {CHUNK}, the group dividing K")
    if M is not None and (not isinstance(M, int) or M < 1):
        raise TileShapeError(f"M must be >= 1, not {M}")
    from mmaemit.kernels.dequant_parts import symbolic_m

    DYN = M is None          # a symbolic M: one kernel for every M >= 1 (the activation-tile order m-fastest)
    M, _ = symbolic_m(M, m_max if m_max is not None else (1 << 31) - 1)
    WPC = words_per_chunk(bits)            # words per lane per n16 block and 64-wide chunk (kernel_layout)
    THREADS = 128 * WG
    NW = 4 * WG
    NBC = BW // 16                         # n16 blocks per CTA: warp w of warpgroup wg, m64 tile mi -> block below
    GT, GN = (M + BT - 1) // BT, N // BW
    KT = K // CHUNK
    X_PAIRS = BT * 32                      # 4-byte pieces of one activation chunk
    if X_PAIRS % THREADS:
        raise TileShapeError(f"block_t * 32 = {X_PAIRS} must be a multiple of the {THREADS} threads")
    X_IT = X_PAIRS // THREADS
    # RS wgmma: A = decoded weights in registers, B = the activation ring (K-major, 128-byte rows = the 128-byte
    # swizzle); the emitter's B layout is the ring's swizzle (the copy writes through it, the descriptor reads it)
    em = WgmmaIntrinEmitter(dtype, dtype, "float32", BT, form="rs", block_k=CHUNK, swizzle_bytes=128, stages=(ST,),
                            arch=arch)
    swz = em.shared_layout("B")
    program = kernel_decode_program(weight_format, dtype, "scale" if zeros_mode is None else zeros_mode, arch.name)
    HAS_Z = z_kind is not None
    ZD = dtype if z_kind in (None, "act") else z_kind
    R = program.registers                  # B registers per word
    PIECES = BT * BW // 8                  # 16-byte pieces of the C tile
    CPAD = BW + 8                          # epilogue row pitch (halfs): conflict-free transposed writes

    def decode(word, out, scales, zeros):
        program.emit(word, out, scale_pair=scales, zero_pair=zeros)

    A_ORDER = wgmma_a_order(dtype)

    def decode_chunk(wb, af, sp, zp, mi):
        # word u decodes B registers [u R, (u + 1) R) of the chunk (4 steps x [n0b0, n0b1, n1b0, n1b1]); they land
        # in wgmma A order (A_ORDER) inside each step; register r's scale / zero is that of its n8 half (r % 4) // 2
        for u in range(WPC):
            idx = [u * R + r for r in range(R)]
            regs = [af[mi, i // 4 * 4 + A_ORDER.index(i % 4)] for i in idx]
            decode(wb[mi, u], regs, [sp[mi, i % 4 // 2] for i in idx],
                   [zp[mi, i % 4 // 2] for i in idx] if HAS_Z else None)

    @T.inline
    def body(A, W, S, Z, C, pid, warp, lane):
        tile = T.alloc_local((2,), "int32")      # symbolic M: the tile once, in registers (no divisions per use)
        if DYN:
            tile[0] = pid % GT
            tile[1] = pid // GT
        bt = T.meta_var(tile[0] if DYN else panel_swizzle(pid, GT, GN, cfg.panel)[0])
        bn = T.meta_var(tile[1] if DYN else panel_swizzle(pid, GT, GN, cfg.panel)[1])
        tid = T.meta_var(warp * 32 + lane)
        wg = T.meta_var(warp // 4)
        wi = T.meta_var(warp % 4)
        g = T.meta_var(lane // 4)
        pool = T.SMEMPool()
        Xs = pool.alloc(em.b_shared_shape, dtype, align=em.b_layout.alignment)    # (ST, BT, CHUNK)
        Wr = pool.alloc((ST, MW, THREADS, WPC), "uint32", align=128)    # per-thread rings (own bytes only)
        Sr = pool.alloc((ST, MW, THREADS, 2), "uint32", align=128)
        Zr = pool.alloc((ST, MW, THREADS, 2), "uint32", align=128)
        pool.move_base_to(0)
        Cs = pool.alloc((BT, CPAD), dtype, align=1024)                 # epilogue, after the ring is drained
        pool.commit()
        acc = T.alloc_local((MW, BT // 2), "float32")
        af = T.alloc_local((MW, 16), "uint32")        # [m64 tile, 4 steps x 4 registers] decoded weights
        wb = T.alloc_local((MW, WPC), "uint32")
        sv = T.alloc_local((MW, 2), "uint32")
        zv = T.alloc_local((MW, 2), "uint32")
        sp = T.alloc_local((MW, 2), "uint32")
        zp = T.alloc_local((MW, 2), "uint32")
        desc = em.alloc_descriptor()
        # no zero-fill: the first chunk's first wgmma runs with scale-d false (D = A B). A fill would be movs that
        # read accumulator registers, and ptxas then serializes every wgmma (C7514)
        em.init_descriptor(desc, Xs, "B")

        @T.inline
        def issue(kt0):
            # chunk kt0 (>= KT: a zero-size copy from a valid address, so the loop body has no branch: a branch
            # between wgmma commit and wait makes ptxas serialize every wgmma, C7514)
            kt = T.meta_var(T.min(kt0, KT - 1))
            live = T.meta_var(kt0 < KT)
            st = T.meta_var(kt0 % ST)
            for i in T.unroll(X_IT):
                q = T.meta_var(tid + i * THREADS)
                t = T.meta_var(q // 32)
                p = T.meta_var(q % 32)     # real pair 16c + 4s + 2h -> logical k' = 16s + 8h + 2c
                row = T.meta_var(bt * BT + t)
                T.ptx["cp.async.ca.shared.global"](
                    Xs.ptr_to(swz(st, t, logical_k_of_pair(p))),
                    A.ptr_to([T.min(row, M - 1), kt * CHUNK + 2 * p]), 4,
                    T.Select(T.And(row < M, live), T.uint32(4), T.uint32(0)))
            for mi in T.unroll(MW):
                nb = T.meta_var(bn * NBC + (wg * MW + mi) * 4 + wi)   # this warp's n16 block of m64 tile mi
                if WPC >= 4:
                    for u in T.unroll(WPC // 4):
                        T.ptx["cp.async.cg.shared.global"](Wr.ptr_to([st, mi, tid, 4 * u]),
                                                           W.ptr_to([nb, kt, lane, 4 * u]), 16,
                                                           T.Select(live, T.uint32(16), T.uint32(0)))
                else:
                    T.ptx["cp.async.ca.shared.global"](Wr.ptr_to([st, mi, tid, 0]), W.ptr_to([nb, kt, lane, 0]),
                                                       4 * WPC, T.Select(live, T.uint32(4 * WPC), T.uint32(0)))
                T.ptx["cp.async.ca.shared.global"](Sr.ptr_to([st, mi, tid, 0]),
                                                   S.ptr_to([nb, kt * CHUNK // G, g // 2, 0]), 8,
                                                   T.Select(live, T.uint32(8), T.uint32(0)))
                if HAS_Z:
                    T.ptx["cp.async.ca.shared.global"](Zr.ptr_to([st, mi, tid, 0]),
                                                       Z.ptr_to([nb, kt * CHUNK // G, g // 2, 0]), 8,
                                                       T.Select(live, T.uint32(8), T.uint32(0)))

        @T.inline
        def step(kt):
            st = T.meta_var(kt % ST)
            T.ptx["cp.async.wait_group"](ST - 3)       # this thread's pieces of chunk kt have landed
            T.ptx.fence.proxy.async_()                 # ... and are visible to the tensor cores' async proxy
            for mi in T.unroll(MW):
                for u in T.unroll(WPC):
                    wb[mi, u] = Wr[st, mi, tid, u]
                sv[mi, 0] = Sr[st, mi, tid, 0]
                sv[mi, 1] = Sr[st, mi, tid, 1]
                sp[mi, 0] = pair_of_column(sv[mi, 0], sv[mi, 1], g, 0)
                sp[mi, 1] = pair_of_column(sv[mi, 0], sv[mi, 1], g, 1)
                if HAS_Z:
                    zv[mi, 0] = Zr[st, mi, tid, 0]
                    zv[mi, 1] = Zr[st, mi, tid, 1]
                    zp[mi, 0] = pair_of_column(zv[mi, 0], zv[mi, 1], g, 0)
                    zp[mi, 1] = pair_of_column(zv[mi, 0], zv[mi, 1], g, 1)
                # groups retire in order: this leaves only the MW - 1 groups issued after (kt - 1, mi) pending,
                # so af[mi] is free; decoding overlaps the tensor cores' work on those groups
                em.wait_group(MW - 1)
                decode_chunk(wb, af, sp, zp, mi)
                if mi == 0:
                    # every thread's chunk-kt pieces are visible, and every warp retired chunk kt - 2: refill its
                    # stage (prefetch distance ST - 2 chunks)
                    T.cuda.cta_sync()
                    issue(kt + ST - 2)
                    T.ptx["cp.async.commit_group"]()
                em.fence()
                for s in T.unroll(em.k_steps):
                    em.mma([acc[mi, i] for i in range(em.local_size_c)], [af[mi, 4 * s + q] for q in range(4)],
                           desc, s, stage=(st,), scale_d=kt > 0 if s == 0 else True)
                em.commit_group()

        for s0 in T.unroll(ST - 2):
            if s0 < KT:
                issue(s0)
            T.ptx["cp.async.commit_group"]()
        for kt in T.serial(KT):
            step(kt)
        em.wait_group(0)
        # pin the accumulators after the wait (WgmmaIntrinEmitter.pin_accumulators): nvcc does not know the wait
        # writes them and would hoist the epilogue's reads above it
        for mi in T.unroll(MW):
            em.pin_accumulators(acc, (mi,))
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()
        # accumulator (mi, i) = C^T[weight row m of tile mi, activation row n], (m, n) = accumulator_coords
        for mi in T.unroll(MW):
            for i in T.unroll(BT // 2):
                rc = T.meta_var(em.accumulator_coords(wi * 32 + lane, i))
                Cs[rc[1], (wg * MW + mi) * 64 + rc[0]] = T.Cast(dtype, acc[mi, i])
        T.cuda.cta_sync()
        for i in T.unroll((PIECES + THREADS - 1) // THREADS):
            q = T.meta_var(tid + i * THREADS)
            r = T.meta_var(q // (BW // 8))
            col = T.meta_var(q % (BW // 8) * 8)
            if q < PIECES:
                if bt * BT + r < M:
                    v = T.alloc_local((4,), "uint32")
                    T.ptx["ld.shared.v4.b32"](v[0], v[1], v[2], v[3], Cs.ptr_to([r, col]))
                    T.ptx["st.global.v4.b32"](C.ptr_to([bt * BT + r, bn * BW + col]), v[0], v[1], v[2], v[3])

    gemm = grid_kernel(body, M, N, K, G, WPC, dtype, ZD if HAS_Z else None, GT * GN, NW)
    return gemm, cfg


def default_wgmma_config(M: int) -> WgmmaConfig:
    """The measured best configuration by M (H100, 8192 x 8192, BENCHMARKS.md)."""
    return WgmmaConfig(128, 4, 1, 4) if M >= 1024 else WgmmaConfig(64, 2, 1, 4)
