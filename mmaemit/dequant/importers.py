"""Importers for GPTQ- and BitBLAS-packed checkpoints into :class:`~.quantize.QuantizedWeight` (written from the
documented formats, no upstream code).

GPTQ (AutoGPTQ ``QuantLinear``, GPTQModel), bits in {2, 4, 8}:

* ``qweight`` int32 [K*b/32, N]: packed along K, code (k, n) at bits ``b*(k % (32/b))`` of ``qweight[k // (32/b), n]``
* ``qzeros``  int32 [G, N*b/32]: packed along N the same way
* ``scales``  fp16 [G, N]; ``g_idx`` int32 [K] (group of column k; ``k // g`` unless act-order / desc_act)
* dequantized weight: ``W[n, k] = (q[k, n] - z[g_idx[k], n]) * scales[g_idx[k], n]`` with
  ``z = stored + 1`` in the AutoGPTQ v1 format (it stores ``zero - 1``) and ``z = stored`` in GPTQ v2 (GPTQModel).
  In v1 a stored all-ones field reads as 2^b in AutoGPTQ's own kernels (no wrap); BitBLAS's repack wraps it to 0
  (``v1_zero_wrap=True``). Such a field only comes from a zero of 0, which v1 packing corrupts anyway.
* ``sym=True``: every zero must be 2^(b-1); the weight becomes offset-binary ``int{b}_ob`` with scales only
  (one operation less in the decode). ``sym=False``: ``uint{b}`` with ``zeros_mode`` original / rescale / quantized.

AWQ (AutoAWQ ``GEMM`` version, 4-bit; the published format, no upstream code):

* ``qweight`` int32 [K, N/8]: packed along **N** (not K): word ``qweight[k, w]`` holds the codes of the 8 output
  columns ``8 w .. 8 w + 7`` of input row k, column ``8 w + AWQ_PACK_ORDER[i]`` in nibble i (bits ``4 i``), with
  ``AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)`` (even columns in the low half-word: the interleave of AWQ's
  fp16 dequant kernel);
* ``qzeros`` int32 [K/g, N/8], packed the same way; ``scales`` fp16 [K/g, N];
* dequantized weight ``W[n, k] = (q[k, n] - z[k // g, n]) * scales[k // g, n]``: zeros stored as is (no GPTQ-v1
  style minus one), no act-order.

BitBLAS (``bitblas.Matmul`` weight, NonTransform layout, int8 storage):

* ``qweight`` int8 [N, K*b/8], packed along K little-endian within each byte
* ``source_format`` "uint" -> uint{b} (codes 0 .. 2^b - 1; for b = 8 that is what "uint" means, but BitBLAS itself
  stores uint8 codes as int8 bytes and its TIR reference and kernels decode them with a plain signed cast, so codes
  128 .. 255 come out as code - 256: ``uint8_signed_cast=True`` imports that reading instead, as format int8, and then
  reproduces BitBLAS's numbers; it takes no zeros, which mmaemit defines for unsigned formats only); "int" -> two's
  complement int8 for b = 8, offset binary int{b}_ob for b = 2, 4 (BitBLAS stores ``v + 2^(b-1)``), int1 for b = 1
  (the {-1, +1} meaning of BitBLAS's LOP3 path and docs; its TIR reference reads {0, -1} instead); "nf" -> nf4;
  "fp" (b = 4) -> OCP float4_e2m1fn (the codes' intended meaning; BitBLAS's own decode reads them as sign + 3-bit
  exponent, a bug); "fp_e4m3" / "fp_e5m2" -> float8.
* ``scales`` [N, G]; ``zeros`` [N, G] float ("original", "rescale") or int8 [G, N*b/8] packed along N
  ("quantized", the zero itself, GPTQ's +1 already applied by BitBLAS's repack). Zeros only with "uint".
* ``lop3_interleaved=True`` undoes BitBLAS's fp16 LOP3 permutation per 32-bit word (4 bytes along K): 4-bit element
  j sits at bit ``(j % 2)*16 + (j // 2)*4``; 2-bit: the same rule with 2-bit fields, then bytes 1 and 2 swapped.
  Ladder-permuted (``propagate_b``) weights are not supported.
"""
from __future__ import annotations

from ..errors import ArgumentError, UnsupportedConfigError, choices
from .interleave import deinterleave
from .packing import pack, to_torch, unpack
from .quantize import QuantizedWeight
from .scaling import QuantScheme, pack_zeros

__all__ = ["from_gptq", "from_awq", "from_bitblas", "AWQ_PACK_ORDER"]

GPTQ_BITS = (2, 4, 8)


def _int_tensor(x, name, dtypes):
    t, _ = to_torch(x)
    if str(t.dtype).replace("torch.", "") not in dtypes:
        raise ArgumentError(f"{name} must have dtype {' or '.join(dtypes)}, got {t.dtype}")
    return t


def _gptq_act_order(g_idx, k, g, device):
    import torch

    if g_idx is None:
        return None
    gi, _ = to_torch(g_idx)
    if gi.dtype.is_floating_point or tuple(gi.shape) != (k,):
        raise ArgumentError(f"g_idx must be an integer tensor of shape [{k}], got {gi.dtype} {tuple(gi.shape)}")
    gi = gi.to(device=device, dtype=torch.int64)
    if torch.equal(gi, torch.arange(k, device=device) // g):
        return None  # the trivial grouping GPTQ stores without desc_act
    return gi.to(torch.int32)


def from_gptq(qweight, qzeros, scales, g_idx=None, *, bits: int, group_size: int, sym: bool = False,
              version: int = 1, zeros_mode: str = "quantized", storage: str = "int32",
              v1_zero_wrap: bool = False) -> QuantizedWeight:
    """GPTQ tensors -> QuantizedWeight [N, K] (see the module docstring for the format and conventions)."""
    import torch

    if bits not in GPTQ_BITS:
        raise UnsupportedConfigError(f"GPTQ bits={bits} is not supported (3-bit words straddle int32 boundaries); "
                                     f"valid: {choices(GPTQ_BITS)}")
    if version not in (1, 2):
        raise UnsupportedConfigError(f"GPTQ version={version!r}; valid: 1 (AutoGPTQ, zeros stored minus 1), "
                                     f"2 (GPTQModel v2, zeros as is)")
    qweight = _int_tensor(qweight, "qweight", ("int32",))
    qzeros = _int_tensor(qzeros, "qzeros", ("int32",))
    sc, _ = to_torch(scales)
    if qweight.dim() != 2:
        raise ArgumentError(f"qweight must be 2-D [K*bits/32, N], got {tuple(qweight.shape)}")
    k = qweight.shape[0] * 32 // bits
    n = qweight.shape[1]
    g, _ = _check_group_tensors(k, n, bits, group_size, qzeros, sc)
    dev = qweight.device
    codes = unpack(qweight, bits, axis=0).transpose(0, 1).contiguous()          # [N, K]
    fields = unpack(qzeros, bits, axis=-1).to(torch.int64).transpose(0, 1)      # [N, G]
    if version == 1:
        z = fields + 1
        if v1_zero_wrap:
            z = z & ((1 << bits) - 1)
    else:
        z = fields
    gi = _gptq_act_order(g_idx, k, g, dev)
    act = gi is not None
    scales_ng = sc.transpose(0, 1).contiguous()
    if sym:
        if bool((z != (1 << (bits - 1))).any()):
            raise ArgumentError(f"sym=True but not every zero is {1 << (bits - 1)}; import with sym=False")
        scheme = QuantScheme(f"int{bits}_ob", group_size, None, act)
        return QuantizedWeight(pack(codes, bits, -1, storage), scales_ng, None, gi, scheme, (n, k))
    scheme = QuantScheme(f"uint{bits}", group_size, zeros_mode, act)
    if zeros_mode == "original":
        zeros = z.to(sc.dtype)
    elif zeros_mode == "rescale":
        zeros = (z.to(torch.float64) * scales_ng.to(torch.float64)).to(torch.float32)  # exact: <= 9 x 11 bits
    else:
        if bool((z > (1 << bits) - 1).any()):
            raise ArgumentError(f"a v1 zero field of all ones means zero {1 << bits}, which {bits}-bit quantized "
                                f"zeros cannot hold; use zeros_mode='original' or v1_zero_wrap=True")
        zeros = pack_zeros(z.to(torch.uint8), bits, storage)
    return QuantizedWeight(pack(codes, bits, -1, storage), scales_ng, zeros, gi, scheme, (n, k))


#: nibble i of an AWQ word holds column ``8 w + AWQ_PACK_ORDER[i]`` of its group of 8 output columns
AWQ_PACK_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _unpack_awq_words(words, bits):
    """int32 [R, N*b/32] packed along N in AWQ's order -> int64 codes [R, N] in column order."""
    import torch

    per = 32 // bits
    w = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, bits, device=w.device)
    nib = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)             # [R, N/8, 8]: nibble i
    cols = torch.empty_like(nib)
    cols[..., list(AWQ_PACK_ORDER)] = nib                                # column AWQ_PACK_ORDER[i] <- nibble i
    return cols.reshape(w.shape[0], w.shape[1] * per)


def from_awq(qweight, qzeros, scales, *, bits: int = 4, group_size: int = 128, zeros_mode: str = "quantized",
             storage: str = "int32") -> QuantizedWeight:
    """AWQ (AutoAWQ GEMM) tensors -> QuantizedWeight [N, K] ``uint4`` with zeros (see the module docstring)."""
    import torch

    if bits != 4:
        raise UnsupportedConfigError(f"AWQ bits={bits}: the AWQ GEMM format packs 4-bit codes; valid: 4")
    if zeros_mode not in ("quantized", "original", "rescale"):
        raise UnsupportedConfigError(f"zeros_mode={zeros_mode!r}; valid: 'quantized', 'original', 'rescale'")
    qweight = _int_tensor(qweight, "qweight", ("int32",))
    qzeros = _int_tensor(qzeros, "qzeros", ("int32",))
    sc, _ = to_torch(scales)
    if qweight.dim() != 2:
        raise ArgumentError(f"qweight must be 2-D [K, N*bits/32], got {tuple(qweight.shape)}")
    k, n = qweight.shape[0], qweight.shape[1] * 32 // bits
    _check_group_tensors(k, n, bits, group_size, qzeros, sc)
    codes = _unpack_awq_words(qweight, bits).transpose(0, 1).to(torch.uint8).contiguous()     # [N, K]
    z = _unpack_awq_words(qzeros, bits).transpose(0, 1)                                        # [N, G]
    scales_ng = sc.transpose(0, 1).contiguous()
    scheme = QuantScheme(f"uint{bits}", group_size, zeros_mode)
    if zeros_mode == "original":
        zeros = z.to(sc.dtype)
    elif zeros_mode == "rescale":
        zeros = (z.to(torch.float64) * scales_ng.to(torch.float64)).to(torch.float32)
    else:
        zeros = pack_zeros(z.to(torch.uint8), bits, storage)
    return QuantizedWeight(pack(codes, bits, -1, storage), scales_ng, zeros, None, scheme, (n, k))


_BITBLAS_FORMATS = {
    ("uint", 1): "uint1", ("uint", 2): "uint2", ("uint", 4): "uint4", ("uint", 8): "uint8",
    ("int", 1): "int1", ("int", 2): "int2_ob", ("int", 4): "int4_ob", ("int", 8): "int8",
    ("nf", 4): "nf4", ("fp", 4): "float4_e2m1fn", ("fp_e4m3", 8): "float8_e4m3fn", ("fp_e5m2", 8): "float8_e5m2",
}


def _undo_bitblas_lop3(qweight, bits):
    import torch

    if bits not in (2, 4):
        raise UnsupportedConfigError(f"lop3_interleaved import exists for bits 2 and 4 only, not {bits} (BitBLAS's "
                                     f"1-bit fp16 permutation is broken upstream; 8-bit has none); valid: 2, 4")
    if qweight.shape[-1] % 4:
        raise ArgumentError("an interleaved BitBLAS weight needs whole 32-bit words (K*bits/8 % 4 == 0)")
    words = qweight.contiguous().view(torch.int32)          # 4 bytes along K, little-endian
    if bits == 2:
        u = words.to(torch.int64) & 0xFFFFFFFF
        b1, b2 = (u >> 8) & 0xFF, (u >> 16) & 0xFF
        u = (u & 0xFF0000FF) | (b1 << 16) | (b2 << 8)
        words = (u - ((u >> 31) & 1) * (1 << 32)).to(torch.int32)
    return deinterleave(words, bits).view(torch.int8)


def from_bitblas(qweight, scales=None, zeros=None, *, bits: int, source_format: str = "uint", group_size: int = -1,
                 zeros_mode: str | None = None, lop3_interleaved: bool = False,
                 uint8_signed_cast: bool = False) -> QuantizedWeight:
    """BitBLAS weight tensors -> QuantizedWeight [N, K] with int8 storage (see the module docstring).

    ``source_format="uint", bits=8`` reads codes 0 .. 255 (the format's meaning) by default; with
    ``uint8_signed_cast=True`` each byte is cast to int8 as BitBLAS's own decode does (codes 128 .. 255 become
    code - 256; the weight's format is then int8), which reproduces BitBLAS's numbers.
    """
    import torch

    key = (source_format, bits)
    if key not in _BITBLAS_FORMATS:
        raise UnsupportedConfigError(f"BitBLAS source_format={source_format!r} with bits={bits} is not supported; "
                                     f"valid: {choices(f'{f}/{b}' for f, b in _BITBLAS_FORMATS)}")
    fmt_name = _BITBLAS_FORMATS[key]
    if uint8_signed_cast:
        if key != ("uint", 8):
            raise UnsupportedConfigError(f"uint8_signed_cast applies to source_format='uint' with bits=8 only, not "
                                         f"{source_format!r} with bits={bits}")
        if zeros is not None or zeros_mode is not None:
            raise UnsupportedConfigError(
                "uint8_signed_cast=True gives signed (int8) codes, and zeros are defined for unsigned formats only; "
                "import BitBLAS uint8 weights with zeros with uint8_signed_cast=False (codes 0 .. 255)")
        fmt_name = "int8"
    qw = _int_tensor(qweight, "qweight", ("int8", "uint8"))
    if qw.dim() != 2:
        raise ArgumentError(f"qweight must be 2-D [N, K*bits/8], got {tuple(qw.shape)}")
    qw = qw.view(torch.int8)
    n, k = qw.shape[0], qw.shape[1] * 8 // bits
    if lop3_interleaved:
        qw = _undo_bitblas_lop3(qw, bits)
    if scales is None:
        if zeros is not None or zeros_mode is not None:
            raise ArgumentError("zeros need scales")
        scheme = QuantScheme(fmt_name, None)
        return QuantizedWeight(qw.contiguous(), None, None, None, scheme, (n, k))
    if zeros_mode is not None and source_format != "uint":
        raise UnsupportedConfigError(f"BitBLAS zeros exist for source_format 'uint' only, not {source_format!r}")
    scheme = QuantScheme(fmt_name, group_size, zeros_mode)
    groups = scheme.num_groups(k)
    sc, _ = to_torch(scales)
    if tuple(sc.shape) != (n, groups) or not sc.dtype.is_floating_point:
        raise ArgumentError(f"scales must be float [{n}, {groups}], got {sc.dtype} {list(sc.shape)}")
    if zeros_mode == "quantized":
        zt = _int_tensor(zeros, "zeros", ("int8", "uint8")).view(torch.int8)
        if tuple(zt.shape) != (groups, n * bits // 8):
            raise ArgumentError(f"quantized zeros must be int8 [{groups}, {n * bits // 8}] packed along N, "
                                f"got {list(zt.shape)}")
        zeros = zt
    elif zeros_mode is not None:
        zt, _ = to_torch(zeros)
        if tuple(zt.shape) != (n, groups) or not zt.dtype.is_floating_point:
            raise ArgumentError(f"zeros must be float [{n}, {groups}], got {zt.dtype} {list(zt.shape)}")
        zeros = zt
    return QuantizedWeight(qw.contiguous(), sc, zeros, None, scheme, (n, k))


def _check_group_tensors(k, n, bits, group_size, qzeros, sc):
    """GPTQ / AWQ share this: the group size divides K, qzeros is [groups, N * bits / 32] int32 words, scales are
    float [groups, N]. Returns (group size, groups)."""
    g = k if group_size == -1 else group_size
    if not isinstance(g, int) or g <= 0 or k % g:
        raise ArgumentError(f"group_size={group_size} must be -1 or a positive divisor of K={k}")
    groups = k // g
    if tuple(qzeros.shape) != (groups, n * bits // 32) or tuple(sc.shape) != (groups, n):
        raise ArgumentError(f"for K={k}, N={n}, bits={bits}, group_size={g}: qzeros must be [{groups}, "
                            f"{n * bits // 32}] and scales [{groups}, {n}]; got {list(qzeros.shape)}, {list(sc.shape)}")
    if not sc.dtype.is_floating_point:
        raise ArgumentError(f"scales must be float, got {sc.dtype}")
    return g, groups
