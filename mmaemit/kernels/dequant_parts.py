"""Pieces the dequant kernels share (:mod:`mmaemit.kernels.dequant_gemm` and
:mod:`mmaemit.kernels.dequant_gemm_wgmma`): the weight formats and zeros modes they take, the decode program they emit,
the {v, v} scale / zero operand pair of a B-fragment column, and their common PrimFunc signature on a 1-D grid."""
from __future__ import annotations

from mmaemit.dequant.decode import decode_program
from mmaemit.dequant.formats import get_format
from mmaemit.dequant.kernel_layout import CHUNK, KERNEL_FORMATS
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices

__all__ = ["WEIGHT_FORMATS", "ZEROS_FORMATS", "TABLE_FORMATS", "ZEROS_MODES", "kernel_decode_program", "check_scheme",
           "pair_of_column", "emit_pair_of_column", "grid_kernel", "symbolic_m"]

WEIGHT_FORMATS = KERNEL_FORMATS      # every per-element format with a per-(n, group) scale: one kernel layout
ZEROS_FORMATS = tuple(f for f in WEIGHT_FORMATS if get_format(f).kind == "uint")   # zero points: unsigned codes
TABLE_FORMATS = tuple(f for f in WEIGHT_FORMATS if get_format(f).kind == "lut")     # values from a table (nf4)
ZEROS_MODES = (None, "original", "rescale", "quantized")


def kernel_decode_program(weight_format, dtype, mode, arch, variant="shift"):
    """The decode program: the fast path where one exists on ``arch`` (``decode.FAST_DECODE``), else the exact
    reference converter (e.g. nf4 with a scale, e2m1 / e4m3 to bf16, e4m3 below sm_89 or with ``arch=None``)."""
    from mmaemit.errors import MmaemitError

    try:
        return decode_program(weight_format, dtype, mode=mode, arch=arch or "sm_80", variant=variant)
    except MmaemitError:
        if variant != "shift":   # an explicitly requested fast variant must not degrade silently
            raise
        return decode_program(weight_format, dtype, mode=mode, arch=arch or "sm_80", fast=False)


def check_scheme(weight_format, zeros_mode):
    """Validate the weight format / zeros mode; returns (bits, Z buffer dtype: None without zeros)."""
    if weight_format not in WEIGHT_FORMATS:
        raise UnsupportedConfigError(f"weight_format must be one of {choices(WEIGHT_FORMATS)}, not {weight_format!r} "
                                     f"(mxfp4 / nvfp4 carry block scale codes and have no kernel here)")
    if zeros_mode not in ZEROS_MODES:
        raise UnsupportedConfigError(f"zeros_mode must be one of {choices(m for m in ZEROS_MODES if m)} or None, "
                                     f"not {zeros_mode!r}")
    if zeros_mode is not None and weight_format not in ZEROS_FORMATS:
        raise UnsupportedConfigError(f"zero points apply to unsigned codes: weight_format must be one of "
                                     f"{choices(ZEROS_FORMATS)} with zeros_mode={zeros_mode!r}, not {weight_format!r}")
    bits = get_format(weight_format).bits
    return bits, (None if zeros_mode is None else ("int16" if zeros_mode == "quantized" else "act"))


def pair_of_column(word0, word1, g, h):
    """{v, v} (uint32) of the B-fragment column n = 8h + g from a lane's [h, e] quad of a kernel-layout row c' = g//2.

    ``word0``/``word1`` hold halves (h=0, e=0/1) and (h=1, e=0/1) of ``to_kernel_scales``' [nb, grp, g // 2, :]."""
    from tvm.script import tirx as T

    word = _column_word(word0, word1, h)
    return ((word >> T.Cast("uint32", 16 * (g % 2))) & T.uint32(0xFFFF)) * T.uint32(0x10001)


def _column_word(word0, word1, h):
    # the word of n8 half h (a build-time choice); the lane's half of it is g % 2
    if h not in (0, 1) or not isinstance(h, int):
        raise TypeError(f"h must be the Python int 0 or 1 (an n8 half chosen at build time), not {h!r}")
    return word0 if h == 0 else word1


def emit_pair_of_column(dst, word0, word1, g, h):
    """Store :func:`pair_of_column` into the register ``dst`` with one PRMT (the half chosen per lane by ``g`` % 2,
    :func:`mmaemit.dequant.decode.emit_broadcast_half`) instead of a shift, a mask and a multiply."""
    from mmaemit.dequant.decode import emit_broadcast_half

    emit_broadcast_half(dst, _column_word(word0, word1, h), g % 2 == 1)


def grid_kernel(body, M, N, K, G, WPC, dtype, z_dtype, ctas, warps):
    """The PrimFunc ``gemm(A, W, S, C)`` (``gemm(A, W, S, Z, C)`` when ``z_dtype`` is set) of a dequant kernel on a
    1-D grid of ``ctas`` CTAs x ``warps`` warps: buffers in the kernel layout (W int32 [N/16, K/64, 32, WPC],
    S / Z [N/16, K/G, 4, 4]); ``body(A, W, S, Z or None, C, pid, warp, lane)`` is an ``@T.inline``."""
    from tvm.script import tirx as T

    KT = K // CHUNK
    if z_dtype is None:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), C: T.Buffer((M, N), dtype)):
            T.device_entry()
            pid = T.cta_id([ctas])
            warp = T.warp_id([warps])
            lane = T.lane_id([32])
            body(A, W, S, None, C, pid, warp, lane)
    else:
        @T.prim_func
        def gemm(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, KT, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), Z: T.Buffer((N // 16, K // G, 4, 4), z_dtype),
                 C: T.Buffer((M, N), dtype)):
            T.device_entry()
            pid = T.cta_id([ctas])
            warp = T.warp_id([warps])
            lane = T.lane_id([32])
            body(A, W, S, Z, C, pid, warp, lane)
    return gemm


def symbolic_m(M, m_max=None, limit=None):
    """``(M expression, largest M)`` for a builder's ``M``: an int gives ``(M, M)``; None gives a fresh symbolic
    ``m`` (an int32 ``tvm.tirx.Var``: the buffers' row count, bound from A's shape at every call, so one compiled
    kernel serves every M up to ``m_max``) and ``m_max`` (default ``limit``)."""
    if M is None:
        import tvm

        top = m_max if m_max is not None else limit
        if top is None or not isinstance(top, int) or top < 1:
            raise TileShapeError(f"a symbolic M needs m_max, a positive int (got {top!r})")
        if limit is not None and top > limit:
            raise TileShapeError(f"m_max={top} exceeds this path's limit of {limit}")
        return tvm.tirx.Var("m", "int32"), top
    if not isinstance(M, int) or isinstance(M, bool):
        raise TileShapeError(f"M must be a positive int, or None for a symbolic M; got {M!r}")
    return M, M
