"""Dequantize kernel-layout weights to a dense fp16 / bf16 matrix on the GPU: ``D[N, K] = dequant(W)`` in real K order.

The large-M half of the two-kernel dequant GEMM (:class:`mmaemit.kernels.dequant_dispatch.DequantGemm`): at M in
the hundreds and above a GEMM is compute-bound, so decoding the weights once per call into a scratch matrix
(a bandwidth-bound pass: N K b / 8 bytes read, 2 N K written) and running the fp16 / bf16 Hopper GEMM
(:func:`mmaemit.kernels.gemm_hopper.make_gemm_hopper`) on it costs the GEMM plus a fixed few tens of microseconds.

Work unit: one warp, one n16 block x one 64-wide K chunk. Every lane loads its WPC = b words (16-byte
``ld.global.nc.v4`` for b >= 4), the scale (and zero) pairs of its B-fragment columns n = g and 8 + g, decodes the
words with ``decode_program(..., mode="scale")`` (or the zeros mode) into the 16 B-fragment registers of the chunk
(word u -> registers [u R, (u + 1) R), the decode-slice rule of :mod:`mmaemit.dequant.kernel_layout`), and stores
them: by the kernel layout's K permutation (real k = 16 c + 4 s + 2 h + e for logical k' = 16 s + 8 h + 2 c + e),
lane (g, c)'s registers of rows g and g + 8 are exactly the 32 contiguous bytes D[n, 64 j + 16 c : 64 j + 16 c + 16]
in register order (step s, half h). Stored straight to global memory, a warp instruction would half-fill 32 sectors
(8 rows x 4 lanes x 16 bytes); instead the warp stages its 16 x 64 tile in shared memory (16-byte chunks XOR-swizzled
by row: conflict-free both ways) and reads it back so that eight lanes write one full 128-byte row segment.
"""
from __future__ import annotations

from dataclasses import dataclass

from mmaemit.dequant.kernel_layout import CHUNK, words_per_chunk
from mmaemit.dtypes import canonical
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.kernels.dequant_parts import check_scheme, kernel_decode_program, pair_of_column

__all__ = ["DenseConfig", "make_dequant_to_dense"]


@dataclass(frozen=True)
class DenseConfig:
    """``warps`` per CTA; ``units`` (n16 x k64 blocks) per warp, their loads issued before any decode."""

    warps: int = 4
    units: int = 2


def make_dequant_to_dense(N, K, group_size=128, dtype="float16", config: DenseConfig = DenseConfig(), arch=None, *,
                          weight_format="int4", zeros_mode=None):
    """Build ``dense(W, S, D)`` (``dense(W, S, Z, D)`` with zeros): W int32 [N/16, K/64, 32, b]
    (``to_kernel_layout``), S / Z [N/16, K/G, 4, 4] (``to_kernel_scales``), D [N, K] of ``dtype`` (float16 /
    bfloat16) = the dequantized weights ``s * value(q)`` (zeros modes as :func:`make_dequant_gemv`), each rounded
    once to ``dtype`` (the decode program's fused multiply). sm_80+."""
    from tvm.script import tirx as T

    bits, z_kind = check_scheme(weight_format, zeros_mode)
    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"dtype must be one of {choices(['float16', 'bfloat16'])}, not {dtype!r}")
    G = K if group_size in (None, -1) else group_size
    if N % 16 or K % CHUNK or G % CHUNK or K % G:
        raise TileShapeError(f"N={N} must be a multiple of 16, K={K} and group_size={group_size} multiples of "
                             f"{CHUNK}, the group dividing K")
    WPC = words_per_chunk(bits)
    V = min(WPC, 4)
    program = kernel_decode_program(weight_format, dtype, "scale" if zeros_mode is None else zeros_mode, arch)
    R = program.registers
    HAS_Z = z_kind is not None
    ZD = dtype if z_kind in (None, "act") else z_kind
    KC, GC = K // CHUNK, G // CHUNK
    UNITS = N // 16 * KC
    NW, UW = config.warps, config.units
    if NW < 1 or UW < 1:
        raise UnsupportedConfigError(f"warps and units must be >= 1, got {NW}, {UW}")
    CTAS = -(-UNITS // (NW * UW))

    def decode_unit(wb, af, sv, zv, u, g):
        # word w -> chunk registers [w R, (w + 1) R); register i belongs to n8 half i % 4 // 2
        for w in range(WPC):
            idx = [w * R + r for r in range(R)]
            program.emit(wb[u, w], [af[i] for i in idx],
                         scale_pair=[pair_of_column(sv[u, 0], sv[u, 1], g, i % 4 // 2) for i in idx],
                         zero_pair=([pair_of_column(zv[u, 0], zv[u, 1], g, i % 4 // 2) for i in idx]
                                    if HAS_Z else None))

    @T.inline
    def body(W, S, Z, D, cta, warp, lane):
        wb = T.alloc_local((UW, WPC), "uint32")
        sv = T.alloc_local((UW, 2), "uint32")
        zv = T.alloc_local((UW, 2), "uint32")
        af = T.alloc_local((16,), "uint32")
        ov = T.alloc_local((4,), "uint32")
        pool = T.SMEMPool()
        Stage = pool.alloc((NW, UW, 16, CHUNK), dtype, align=128)     # per warp and unit: 16 rows x 128 bytes
        pool.commit()
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        for u in T.unroll(UW):
            unit = T.meta_var((cta * NW + warp) * UW + u)
            nb = T.meta_var(unit // KC)
            kc = T.meta_var(unit % KC)
            if unit < UNITS:
                for p in T.unroll(WPC // V):
                    if V == 4:
                        T.ptx["ld.global.nc.v4.b32"](wb[u, 4 * p], wb[u, 4 * p + 1], wb[u, 4 * p + 2],
                                                     wb[u, 4 * p + 3], W.ptr_to([nb, kc, lane, 4 * p]))
                    elif V == 2:
                        T.ptx["ld.global.nc.v2.b32"](wb[u, 0], wb[u, 1], W.ptr_to([nb, kc, lane, 0]))
                    else:
                        T.ptx["ld.global.nc.b32"](wb[u, 0], W.ptr_to([nb, kc, lane, 0]))
                T.ptx["ld.global.nc.v2.b32"](sv[u, 0], sv[u, 1], S.ptr_to([nb, kc // GC, g // 2, 0]))
                if HAS_Z:
                    T.ptx["ld.global.nc.v2.b32"](zv[u, 0], zv[u, 1], Z.ptr_to([nb, kc // GC, g // 2, 0]))
        for u in T.unroll(UW):
            unit = T.meta_var((cta * NW + warp) * UW + u)
            nb = T.meta_var(unit // KC)
            kc = T.meta_var(unit % KC)
            if unit < UNITS:
                decode_unit(wb, af, sv, zv, u, g)
                # row g + 8 h: registers 4 s + 2 h + b (step s, b-half b) are in k order; 16-byte piece q (steps
                # 2 q, 2 q + 1) is 16-byte column chunk 2 c + q of the row, stored XOR-swizzled by the row
                for h in T.unroll(2):
                    for q in T.unroll(2):
                        T.ptx["st.shared.v4.b32"](Stage.ptr_to([warp, u, g + 8 * h, ((2 * c + q) ^ g) * 8]),
                                                  af[8 * q + 2 * h], af[8 * q + 2 * h + 1],
                                                  af[8 * q + 4 + 2 * h], af[8 * q + 4 + 2 * h + 1])
        T.cuda.warp_sync()
        for u in T.unroll(UW):
            unit = T.meta_var((cta * NW + warp) * UW + u)
            nb = T.meta_var(unit // KC)
            kc = T.meta_var(unit % KC)
            if unit < UNITS:
                for i in T.unroll(4):         # rows 4 i .. 4 i + 3, eight lanes per 128-byte row: full lines
                    r = T.meta_var(4 * i + lane // 8)
                    T.ptx["ld.shared.v4.b32"](ov[0], ov[1], ov[2], ov[3],
                                              Stage.ptr_to([warp, u, r, ((lane % 8) ^ (r % 8)) * 8]))
                    T.ptx["st.global.v4.b32"](D.ptr_to([nb * 16 + r, kc * CHUNK + lane % 8 * 8]),
                                              ov[0], ov[1], ov[2], ov[3])

    if HAS_Z:
        @T.prim_func
        def dense(W: T.Buffer((N // 16, KC, 32, WPC), "int32"), S: T.Buffer((N // 16, K // G, 4, 4), dtype),
                  Z: T.Buffer((N // 16, K // G, 4, 4), ZD), D: T.Buffer((N, K), dtype)):
            T.device_entry()
            cta = T.cta_id([CTAS])
            warp = T.warp_id([NW])
            lane = T.lane_id([32])
            body(W, S, Z, D, cta, warp, lane)
    else:
        @T.prim_func
        def dense(W: T.Buffer((N // 16, KC, 32, WPC), "int32"), S: T.Buffer((N // 16, K // G, 4, 4), dtype),
                  D: T.Buffer((N, K), dtype)):
            T.device_entry()
            cta = T.cta_id([CTAS])
            warp = T.warp_id([NW])
            lane = T.lane_id([32])
            body(W, S, None, D, cta, warp, lane)
    return dense
