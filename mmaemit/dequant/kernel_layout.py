"""The weight layout the dequant GEMM/GEMV kernels read: fragment order + a K permutation + per-lane word groups.

One layout serves every M (the small-M GEMV path and the tiled GEMM path read the same tensor) and every bit width
b in {1, 2, 4, 8}. Built on top of :mod:`.fragment_order` (each lane's 32-bit word = its mma m16n8k16 B-fragment
registers of one BN x BK block; 8-bit 8 x 16, 4-bit 16 x 16, 2-bit 16 x 32, 1-bit 16 x 64):

1. **K permutation inside every 64-wide chunk.** The mma contracts over k in any order as long as A and B agree, so
   the kernel uses logical index ``k'`` and real index ``k = perm(k')`` with, for ``k' = 16 s + 2 c + 8 h + e``
   (s = k16 step 0..3, c = lane % 4, h = b0/b1 half, e = element 0/1)::

       perm(k') = 16 c + 4 s + 2 h + e

   Then lane c's A-fragment registers over the 4 steps of a chunk (a0/a2 of every step) hold A[m, 16c .. 16c+15] in
   order: two 16-byte loads per A row instead of eight 4-byte loads. The weights are packed with the same
   permutation, ``Wp[n, 64 j + k'] = W[n, 64 j + perm(k')]``. Groups of ``g`` (a multiple of 64, or K) are unchanged.
2. **Lane word groups.** ``fragment_order`` gives ``words[nb, kb, lane]`` (shape [N/BN, K/BK, 32]); here the words
   of one n16 x k64 block of a lane are adjacent: with hn = 16/BN n-blocks and kn = 64/BK k-blocks per n16 x k64,
   ``kernel_words[n16, kq, lane, kn_i * hn + hn_i] = words[n16 * hn + hn_i, kq * kn + kn_i, lane]``,
   shape [N/16, K/64, 32, WPC] with WPC = b words per lane (32 lanes x b words x 4 B = 16 x 64 x b / 8 bytes).

**Decode-slice rule.** A lane's 16 B-fragment registers of one n16 x k64 block, in order (k16 step s = 0..3, then
register r = 0..3 = [n0 b0, n0 b1, n1 b0, n1 b1] of ``mma.sync m16n8k16`` with the two n8 halves n0, n1), are the
concatenated ``decode_program`` outputs of its WPC words in order: word w gives registers [w R, (w + 1) R) with
R = 16 / b. So 8-bit word 2s + h is step s registers 2h, 2h + 1; 4-bit word s is step s; 2-bit word t is steps 2t,
2t + 1; the 1-bit word is all four steps.

:func:`to_kernel_layout` builds it from codes [N, K]; :func:`from_kernel_layout` is its exact inverse.
"""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, TileShapeError
from .fragment_order import pack_for_mma, tiling, unpack_from_mma
from .packing import check_bits

CHUNK = 64


def k_permutation(K: int) -> np.ndarray:
    """``perm`` over ``range(K)``: logical k' -> real k (applied per 64-wide chunk). K must be a multiple of 64."""
    if K % CHUNK:
        raise TileShapeError(f"K={K} must be a multiple of {CHUNK} for the kernel layout")
    kp = np.arange(CHUNK)
    s, rem = kp // 16, kp % 16
    h, rem = rem // 8, rem % 8
    c, e = rem // 2, rem % 2
    local = 16 * c + 4 * s + 2 * h + e
    return (np.arange(0, K, CHUNK)[:, None] + local[None, :]).reshape(-1)


def words_per_chunk(bits: int) -> int:
    """WPC: 32-bit words per lane per n16 block and 64-wide K chunk (= ``bits``)."""
    return 16 * CHUNK * check_bits(bits) // 8 // 32 // 4


def _blocks(bits: int):
    tl = tiling(bits)
    return 16 // tl["BN"], CHUNK // tl["BK"]          # hn (n-blocks per n16), kn (k-blocks per 64-wide chunk)


def to_kernel_layout(codes, bits: int = 4):
    """Codes [N, K] (uint8, one b-bit code per element) -> int32 kernel words [N/16, K/64, 32, WPC], WPC = ``bits``.

    ``bits`` in 1, 2, 4, 8; N a multiple of 16, K a multiple of 64."""
    import torch

    hn, kn = _blocks(bits)
    was_np = isinstance(codes, np.ndarray)
    t = torch.as_tensor(codes)
    if t.dim() != 2:
        raise ArgumentError(f"codes must be a 2-D [N, K] tensor, got shape {tuple(t.shape)}")
    N, K = t.shape
    if N % 16:
        raise TileShapeError(f"N={N} must be a multiple of 16 for the kernel layout")
    perm = torch.as_tensor(k_permutation(K), device=t.device)
    words = pack_for_mma(t[:, perm], bits)                      # [N/BN, K/BK, 32]
    out = (words.reshape(N // 16, hn, K // CHUNK, kn, 32).permute(0, 2, 4, 3, 1)
           .reshape(N // 16, K // CHUNK, 32, kn * hn).contiguous())
    return out.numpy() if was_np else out


def from_kernel_layout(kernel_words, bits: int = 4):
    """Exact inverse of :func:`to_kernel_layout`: int32 [N/16, K/64, 32, WPC] -> uint8 codes [N, K]."""
    import torch

    hn, kn = _blocks(bits)
    was_np = isinstance(kernel_words, np.ndarray)
    t = torch.as_tensor(kernel_words)
    if t.dim() != 4 or t.shape[2] != 32:
        raise ArgumentError(f"kernel words must have shape [N/16, K/64, 32, WPC], got {tuple(t.shape)}")
    n16, kq, _, wpc = t.shape
    if wpc != words_per_chunk(bits):
        raise ArgumentError(f"kernel words of shape {tuple(t.shape)} hold {wpc} words per lane and chunk, but "
                            f"{bits}-bit weights have {words_per_chunk(bits)} (WPC = bits; valid bits: 1, 2, 4, 8)")
    words = (t.reshape(n16, kq, 32, kn, hn).permute(0, 4, 1, 3, 2)
             .reshape(n16 * hn, kq * kn, 32).contiguous())
    codes_p = torch.as_tensor(unpack_from_mma(words, bits))
    K = codes_p.shape[1]
    inv = torch.empty(K, dtype=torch.long, device=codes_p.device)
    inv[torch.as_tensor(k_permutation(K), device=codes_p.device)] = torch.arange(K, device=codes_p.device)
    out = codes_p[:, inv]
    return out.numpy() if was_np else out


def to_kernel_scales(scales):
    """Per-(n, group) scales [N, K/g] -> [N/16, K/g, 4, 4] in the order the GEMV's accumulators need them.

    The mma accumulator of lane (g, c) holds columns n = 2c, 2c+1 of each n8 half h of an n16 block, so
    ``out[nb, grp, c, 2h + e] = scales[16 nb + 8 h + 2 c + e, grp]``: one 8-byte load per lane per block and group.
    """
    import torch

    was_np = isinstance(scales, np.ndarray)
    s = torch.as_tensor(scales)
    N, G = s.shape
    if N % 16:
        raise TileShapeError(f"N={N} must be a multiple of 16")
    out = s.reshape(N // 16, 2, 4, 2, G).permute(0, 4, 2, 1, 3).reshape(N // 16, G, 4, 4).contiguous()
    return out.numpy() if was_np else out


def from_kernel_scales(kernel_scales):
    """Exact inverse of :func:`to_kernel_scales`."""
    import torch

    was_np = isinstance(kernel_scales, np.ndarray)
    t = torch.as_tensor(kernel_scales)
    nb, G, _, _ = t.shape
    out = t.reshape(nb, G, 4, 2, 2).permute(0, 3, 2, 4, 1).reshape(nb * 16, G).contiguous()
    return out.numpy() if was_np else out


#: weight formats the dequant kernels (W8A16 / W4A16 / W2A16 / W1A16) decode: every per-element format of
#: :mod:`.formats` with one scale per (n, group). Not mxfp4 / nvfp4 (block scale codes) or float8_e8m0fnu (a scale
#: format, not an element format).
KERNEL_FORMATS = ("uint1", "uint2", "uint4", "uint8", "int1", "int2", "int2_ob", "int4", "int4_ob", "int8", "int8_ob",
                  "nf4", "float4_e2m1fn", "float8_e4m3fn", "float8_e5m2")


def kernel_arguments(qw):
    """A :class:`~mmaemit.dequant.quantize.QuantizedWeight` (from ``quantize`` or an importer) -> the kernel's
    weight arguments ``(W, S)`` or ``(W, S, Z)`` and the keyword arguments that build the matching kernel.

    Returns ``(tensors, kwargs)``: ``tensors`` are ``to_kernel_layout(codes, bits)`` (bits of the format),
    ``to_kernel_scales(scales)`` and, with zero points, ``to_kernel_scales(zeros)`` (values in the scales' dtype for
    "original"/"rescale", int16 codes for "quantized"); ``kwargs`` = ``group_size``, ``weight_format``,
    ``zeros_mode`` for ``make_dequant_gemm``.
    Act-order weights (``g_idx`` that is not the identity grouping) are refused: the kernels read groups in order.
    """
    import torch

    from ..errors import UnsupportedConfigError, choices
    from .scaling import unpack_zeros

    scheme = qw.scheme
    fmt = scheme.format
    if fmt not in KERNEL_FORMATS:
        raise UnsupportedConfigError(f"the dequant kernels take {choices(KERNEL_FORMATS)} weights, not {fmt!r}")
    if scheme.group_size is None:
        raise UnsupportedConfigError("the dequant kernels need scales (group_size -1 for per-channel, or a group size)")
    N, K = qw.shape
    G = K if scheme.group_size in (-1, K) else scheme.group_size
    if qw.g_idx is not None:
        g = torch.as_tensor(qw.g_idx).cpu()
        if not torch.equal(g.to(torch.int64), torch.arange(K) // G):
            raise UnsupportedConfigError("act-order (g_idx) weights must be reordered along K first "
                                         "(mmaemit.dequant.act_order_permutation) before they go to the kernels")
    scales = torch.as_tensor(qw.scales)
    tensors = [to_kernel_layout(torch.as_tensor(qw.codes()).cpu(), scheme.bits), to_kernel_scales(scales.cpu())]
    mode = scheme.zeros_mode
    if mode == "quantized":
        tensors.append(to_kernel_scales(torch.as_tensor(unpack_zeros(qw.zeros, scheme.bits)).to(torch.int16).cpu()))
    elif mode is not None:
        tensors.append(to_kernel_scales(torch.as_tensor(qw.zeros).to(scales.dtype).cpu()))
    return tensors, {"group_size": G, "weight_format": fmt, "zeros_mode": mode}
