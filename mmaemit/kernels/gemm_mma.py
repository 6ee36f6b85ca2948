"""A fine-grained GEMM composed by hand from mmaemit's building blocks: C[M, N] = A @ B.

Pipeline per CTA (one ``block_m x block_n`` tile of C):

1. ``stages``-deep ``cp.async`` ring: every thread copies 16-byte chunks of the next A and B tiles from global into
   swizzled shared memory (``emitter.shared_swizzle``: ``make_mma_swizzle_layout`` with the XOR bits that keep
   the operand's ldmatrix phases conflict-free), one commit group per K tile.
2. Inner loop per K tile: ``emitter.ldmatrix_a`` / ``ldmatrix_b`` (ldmatrix, .trans where the operand is
   M/N-contiguous; 8/4-bit M/N-contiguous operands add prmt (+ shl/shr/lop3) register shuffles) and
   ``emitter.mma`` (mma.sync; m16n8k16 for 16-bit, k32 for 8-bit, k64 for 4-bit) for each K step of the tile.
3. Epilogue: ``emitter.stmatrix`` into a swizzled shared C tile (PTX stmatrix on sm_90+, vector stores below), then
   coalesced 16-byte stores to global. ``epilogue="global"`` stores the accumulators straight to global instead.

Layouts: ``trans_a=False`` means A is [M, K], ``True`` [K, M]; ``trans_b=False`` means B is [K, N], ``True`` [N, K].
NN/NT/TN/TT name (trans_a, trans_b). M, N, K must be multiples of the block tile.

Dtypes: float16/bfloat16 (f32 or f16 accumulators), int8/uint8 (s32 accumulators, int32 output), float8_e4m3fn /
float8_e5m2 (f32 accumulators, sm_89), int4/uint4 (s32; ``block_k`` a multiple of 64). ``b_dtype`` may differ from
``dtype`` among the 8-bit integer, the fp8 or the 4-bit integer types. 4-bit operands travel packed: the kernel's A/B
parameters are uint8 with half as many columns, element ``2i`` of a row in the low nibble of byte ``i``
(``pack_int4``).

    python -m mmaemit.kernels.gemm_mma --m 4096 --n 4096 --k 4096     # needs a GPU
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit import TensorCoreIntrinEmitter, make_mma_swizzle_layout
from mmaemit.arch import as_arch, device_sm_count
from mmaemit.dtypes import bits, canonical, is_float
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.layouts.raster import L2_BYTES, RASTER_ORDERS, choose_raster, raster_order
from mmaemit.pipeline.cp_async import CpAsyncTile, cp_async_commit, cp_async_wait

LAYOUTS = {"NN": (False, False), "NT": (False, True), "TN": (True, False), "TT": (True, True)}


@dataclass(frozen=True)
class GemmConfig:
    """The tile configuration (what an autotuner varies)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warp_m: int = 64
    warp_n: int = 64
    stages: int = 3
    epilogue: str = "shared"  # "shared" (stmatrix + coalesced stores) or "global" (vector stores from registers)
    panel: int = 8            # CTA rasterization: tile-rows per panel for L2 reuse (1 = row-major launch order)
    raster: str = "auto"      # tile order (mmaemit.layouts.raster): "row", "panel", "serpentine", "grouped", or
                              # "auto": row-major while one wave's operand panels fit in L2, else panel (measured)
    persistent: int = 0       # 0: one CTA per C tile; P > 0: min(P, tiles) CTAs, CTA c computes tiles c, c + P, ...
    n_tile: int = None        # mma micro tile width: 8 or 16 (None: the emitter's choice)
    reduce_k: int = 1         # warp groups splitting block_k (their partial sums are reduced through shared memory)
    warp_order: str = "m_fast"
    stmatrix_num: int = None  # stmatrix.x{1,2,4} for the shared epilogue on sm_90+ (None: widest)


def _default_accum(dtype):
    return "float32" if is_float(dtype) else "int32"


def make_gemm(M, N, K, dtype="float16", out_dtype=None, accum_dtype=None, trans_a=False, trans_b=False,
              config: GemmConfig = GemmConfig(), arch=None, b_dtype=None):
    """Build the GEMM PrimFunc ``gemm(A, B, C)`` for fixed M, N, K. Returns (prim_func, emitter).

    ``dtype`` is A's element type, ``b_dtype`` B's (default: ``dtype``). ``accum_dtype`` defaults to float32 for
    float operands and int32 for integer ones; ``out_dtype`` to ``dtype`` for 16-bit operands, else the accumulator
    type.
    """
    from tvm.script import tirx as T

    dtype = canonical(dtype)
    b_dtype = canonical(b_dtype or dtype)
    accum_dtype = canonical(accum_dtype or _default_accum(dtype))
    out_dtype = canonical(out_dtype or (dtype if bits(dtype) == 16 else accum_dtype))
    cfg = config
    for name, size, tile in (("M", M, cfg.block_m), ("N", N, cfg.block_n), ("K", K, cfg.block_k)):
        if size <= 0 or size % tile:
            raise TileShapeError(f"{name}={size} is not a positive multiple of the block tile {tile}; pad it or "
                                 f"choose a config whose block divides it")
    if cfg.stages < 2:
        raise UnsupportedConfigError(f"stages must be >= 2, not {cfg.stages}")
    if cfg.epilogue not in ("shared", "global"):
        raise UnsupportedConfigError(f"epilogue must be one of {choices(['shared', 'global'])}")
    if cfg.raster not in RASTER_ORDERS + ("auto",):
        raise UnsupportedConfigError(f"raster must be one of {choices(RASTER_ORDERS + ('auto',))}, not "
                                     f"{cfg.raster!r}")
    if not isinstance(cfg.persistent, int) or cfg.persistent < 0:
        raise UnsupportedConfigError(f"persistent must be 0 (one CTA per tile) or a positive CTA count, not "
                                     f"{cfg.persistent!r}")
    em = TensorCoreIntrinEmitter(dtype, b_dtype, accum_dtype, a_transposed=trans_a, b_transposed=trans_b,
                                 block_row_warps=cfg.block_m // cfg.warp_m, block_col_warps=cfg.block_n // cfg.warp_n,
                                 warp_row_tiles=cfg.warp_m, warp_col_tiles=cfg.warp_n, chunk=cfg.block_k, arch=arch,
                                 n_tile=cfg.n_tile, reduce_k=cfg.reduce_k, warp_order=cfg.warp_order)
    BM, BN, S, THREADS, NW = em.block_m, em.block_n, cfg.stages, em.threads, em.num_warps
    KT = K // cfg.block_k
    # shared tiles as stored: 4-bit operands packed in uint8 (the emitter reads packed tiles), others as their dtype
    (a_tile, a_sdtype, A_PACK), (b_tile, b_sdtype, B_PACK) = (_packed_operand(em.a_shared_shape, dtype),
                                                              _packed_operand(em.b_shared_shape, b_dtype))
    swz_a = em.shared_swizzle("A", (S, *a_tile), a_sdtype)   # conflict-free for the operand's load pattern
    swz_b = em.shared_swizzle("B", (S, *b_tile), b_sdtype)
    swz_c = make_mma_swizzle_layout((BM, BN), out_dtype)
    C_EPC = 128 // bits(out_dtype)
    C_CPR = BN // C_EPC
    C_ITERS = BM * C_CPR // THREADS
    if C_ITERS * THREADS != BM * C_CPR:
        raise TileShapeError(f"the C tile does not split evenly into 16-byte chunks over {THREADS} threads")
    a_shape, a_gdtype, _ = _packed_operand((K, M) if trans_a else (M, K), dtype)
    b_shape, b_gdtype, _ = _packed_operand((N, K) if trans_b else (K, N), b_dtype)
    # 16-byte cp.async copies of each stage's tiles into the swizzled stages (mmaemit.pipeline.CpAsyncTile)
    a_copy = CpAsyncTile(a_shape, a_sdtype, a_tile, THREADS, swz_a)
    b_copy = CpAsyncTile(b_shape, b_sdtype, b_tile, THREADS, swz_b)
    use_smem_epilogue = cfg.epilogue == "shared"
    REDUCE = cfg.reduce_k > 1
    scratch_shape = em.reduce_scratch_shape if REDUCE else (1,)
    GM, GN = M // BM, N // BN
    TILES = GM * GN
    raster, panel = cfg.raster, cfg.panel
    if raster == "auto":
        # one wave = (SMs x 1 CTA) consecutive tiles; the rule and its measurement: mmaemit.layouts.raster
        sm_major = as_arch(arch or "sm_90a").number // 10
        wave = min(cfg.persistent, TILES) if cfg.persistent else device_sm_count(132 if sm_major >= 9 else 108)
        raster, panel = choose_raster(GM, GN, BM, BN, K, wave, L2_BYTES.get(sm_major, L2_BYTES[9]),
                                      bits(dtype) / 8, bits(b_dtype) / 8, cfg.panel)
    order = raster_order(raster, GM, GN, panel)
    CTAS = min(cfg.persistent, TILES) if cfg.persistent else TILES
    ROUNDS = -(-TILES // CTAS)

    @T.inline
    def tile(A, B, C, As, Bs, Scratch, Cs, A_frag, B_frag, C_frag, t, warp, lane):
        # one C tile: linear tile id t, placed by the raster order
        bm = T.meta_var(order.forward(t)[0])
        bn = T.meta_var(order.forward(t)[1])
        tid = T.meta_var(warp * 32 + lane)
        em.fill_accumulators(C_frag)

        @T.inline
        def load_tiles(stage, kt):
            # 16-byte cp.async pieces; tile rows follow the operand's storage major
            if trans_a:
                a_copy.load(As, stage, A, (kt * a_tile[0], bm * BM // A_PACK), tid)
            else:
                a_copy.load(As, stage, A, (bm * BM, kt * a_tile[1]), tid)
            if trans_b:
                b_copy.load(Bs, stage, B, (bn * BN, kt * b_tile[1]), tid)
            else:
                b_copy.load(Bs, stage, B, (kt * b_tile[0], bn * BN // B_PACK), tid)

        for s in T.unroll(S - 1):
            if s < KT:
                load_tiles(s, s)
            cp_async_commit()
        for ko in T.serial(KT):
            # tile ko has landed once at most S-2 younger groups are pending; the barrier also tells every warp
            # that the stage about to be overwritten ((ko - 1) % S) is no longer read
            cp_async_wait(S - 2)
            T.cuda.cta_sync()
            if ko + S - 1 < KT:
                load_tiles((ko + S - 1) % S, ko + S - 1)
            cp_async_commit()  # unconditional: keeps the group count uniform
            for ki in T.unroll(em.k_steps):
                em.ldmatrix_a(A_frag, As[ko % S, 0:a_tile[0], 0:a_tile[1]], ki, warp=warp, lane=lane, layout=swz_a)
                em.ldmatrix_b(B_frag, Bs[ko % S, 0:b_tile[0], 0:b_tile[1]], ki, warp=warp, lane=lane, layout=swz_b)
                em.mma(A_frag, B_frag, C_frag)
        cp_async_wait(0)
        if use_smem_epilogue or REDUCE:
            T.cuda.cta_sync()  # every warp is done reading the A/B stages that Scratch and Cs overlay
        if REDUCE:
            em.reduce_accumulators(C_frag, Scratch, warp=warp, lane=lane)
        if use_smem_epilogue:
            em.stmatrix(C_frag, Cs, warp=warp, lane=lane, layout=swz_c, num=cfg.stmatrix_num)
            T.cuda.cta_sync()
            for t in T.unroll(C_ITERS):
                q = T.meta_var(tid + t * THREADS)
                r = T.meta_var(q // C_CPR)
                c = T.meta_var(q % C_CPR * C_EPC)
                v = T.alloc_local((4,), "uint32")
                T.ptx["ld.shared.v4.b32"](v[0], v[1], v[2], v[3], Cs.ptr_to(swz_c(r, c)))
                T.ptx["st.global.v4.b32"](C.ptr_to([bm * BM + r, bn * BN + c]), v[0], v[1], v[2], v[3])
        else:
            em.stmatrix(C_frag, C, warp=warp, lane=lane, block_row=bm, block_col=bn)

    @T.prim_func
    def gemm(A: T.Buffer(a_shape, a_gdtype), B: T.Buffer(b_shape, b_gdtype), C: T.Buffer((M, N), out_dtype)):
        T.device_entry()
        pid = T.cta_id([CTAS])
        warp = T.warp_id([NW])
        lane = T.lane_id([32])
        pool = T.SMEMPool()
        As = pool.alloc((S, *a_tile), a_sdtype, align=1024)
        Bs = pool.alloc((S, *b_tile), b_sdtype, align=1024)
        pool.move_base_to(0)  # the split-K scratch and the C staging tile reuse the pipeline's memory after the loop
        Scratch = pool.alloc(scratch_shape, em.c_fragment_dtype, align=1024)
        Cs = pool.alloc((BM, BN), out_dtype, align=1024)
        pool.commit()
        A_frag, B_frag, C_frag = em.alloc_fragments()
        if CTAS == TILES:
            tile(A, B, C, As, Bs, Scratch, Cs, A_frag, B_frag, C_frag, pid, warp, lane)
        else:
            # persistent: a grid-stride loop over tiles; the barrier keeps the next tile's first copies from
            # overwriting shared memory (the pipeline stages, the C staging tile) that slower warps still read
            for rnd in T.serial(ROUNDS):
                if pid + rnd * CTAS < TILES:
                    tile(A, B, C, As, Bs, Scratch, Cs, A_frag, B_frag, C_frag, pid + rnd * CTAS, warp, lane)
                    T.cuda.cta_sync()

    return gemm, em


def _packed_operand(shape, dtype):
    """(shape, dtype, operand elements per stored element) of a stored operand (kernel parameter or shared tile):
    4-bit operands are packed two per uint8."""
    if bits(dtype) == 4:
        return (shape[0], shape[1] // 2), "uint8", 2
    return shape, dtype, 1


def pack_int4(values):
    """Pack a torch integer tensor of 4-bit values (last dim even; -8..7 or 0..15) into uint8, two per byte
    (element 2i in the low nibble of byte i)."""
    import torch

    v = values.to(torch.int64) & 0xF
    return (v[..., 0::2] | (v[..., 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed, signed):
    """Inverse of ``pack_int4``: int64 tensor with twice the columns, sign-extended when ``signed``."""
    import torch

    p = packed.to(torch.int64)
    v = torch.stack([p & 0xF, (p >> 4) & 0xF], dim=-1).reshape(*p.shape[:-1], 2 * p.shape[-1])
    return v - 16 * (v >= 8).long() if signed else v


def reference(A, B, trans_a=False, trans_b=False, dtype=None, b_dtype=None):
    """torch reference of the GEMM: float32 for float inputs; exact int64 (computed on the CPU) for integer inputs.
    4-bit operands (packed uint8) need ``dtype`` (and ``b_dtype`` if it differs) to be unpacked."""
    if dtype is not None and bits(dtype) == 4:
        A = unpack_int4(A.cpu(), canonical(dtype) == "int4")
    bd = b_dtype or dtype
    if bd is not None and bits(bd) == 4:
        B = unpack_int4(B.cpu(), canonical(bd) == "int4")
    if A.is_floating_point():
        a = A.float().T if trans_a else A.float()
        b = B.float().T if trans_b else B.float()
        return a @ b
    a = A.cpu().long().T if trans_a else A.cpu().long()
    b = B.cpu().long().T if trans_b else B.cpu().long()
    return a @ b


def random_inputs(M, N, K, dtype="float16", trans_a=False, trans_b=False, device="cuda", seed=None, b_dtype=None):
    """Random A, B in their storage layouts: floats normal, scaled so that C has unit-order magnitude; integers
    uniform over their whole range (4-bit: packed by ``pack_int4``)."""
    import torch

    from mmaemit.dtypes import torch_dtype

    g = torch.Generator(device=device)
    if seed is not None:
        g.manual_seed(seed)
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)

    def make(shape, dt):
        if bits(dt) == 4:
            lo = -8 if dt == "int4" else 0
            return pack_int4(torch.randint(lo, lo + 16, shape, generator=g, device=device))
        td = torch_dtype(dt)
        if is_float(dt):
            return (torch.randn(shape, generator=g, device=device) / K ** 0.25).to(td)
        info = torch.iinfo(td)
        return torch.randint(info.min, info.max + 1, shape, generator=g, device=device, dtype=td)

    return make(a_shape, canonical(dtype)), make(b_shape, canonical(b_dtype or dtype))


def main(argv=None):
    import argparse

    import torch

    import mmaemit

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--k", type=int, default=4096)
    p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "int8", "uint8", "float8_e4m3fn",
                                                          "float8_e5m2", "int4", "uint4"])
    p.add_argument("--layout", default="NN", choices=sorted(LAYOUTS))
    args = p.parse_args(argv)
    ta, tb = LAYOUTS[args.layout]
    cfg = GemmConfig(block_k=64 if bits(args.dtype) == 4 else 32)
    func, em = make_gemm(args.m, args.n, args.k, args.dtype, trans_a=ta, trans_b=tb, config=cfg)
    kernel = mmaemit.compile(func)
    A, B = random_inputs(args.m, args.n, args.k, args.dtype, ta, tb)
    out = {"int32": torch.int32, "float32": torch.float32}.get(em.accum_dtype if bits(args.dtype) < 16 else "", A.dtype)
    C = torch.full((args.m, args.n), -1 if not out.is_floating_point else float("nan"), dtype=out, device="cuda")
    kernel(A, B, C)
    ref = reference(A, B, ta, tb, dtype=args.dtype)
    if not out.is_floating_point:
        ok = torch.equal(C.cpu().long(), ref)
        print("bit-exact" if ok else "MISMATCH")
        return 0 if ok else 1
    rel = ((C.float() - ref).norm() / ref.norm()).item()
    print(f"relative error {rel:.2e}")
    return 0 if rel < 1e-2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
