"""Round-to-nearest (min-max) quantization of fp16 / bf16 / fp32 weights [N, K] into a :class:`QuantizedWeight`.

Per group (the columns k with the same gi(k), see :mod:`.scaling`), with the scale rounded to the stored dtype
*before* the codes are computed (so the codes are RTN with respect to the scale the kernel will read):

* unsigned ints with zeros (asymmetric, GPTQ's range convention): lo = min(min w, 0), hi = max(max w, 0),
  s = (hi - lo) / (2^b - 1), z = clamp(round(-lo / s), 0, 2^b - 1), q = clamp(round(w / s) + z, 0, 2^b - 1).
  Zeros are stored as z (fp "original", in the scale dtype), z * s (float32 "rescale", exact) or packed codes.
* signed ints (two's complement or offset binary, b >= 2; symmetric): s = max|w| / (2^(b-1) - 1),
  w_int = clamp(round(w / s), -2^(b-1), 2^(b-1) - 1).
* int1 ({-1, +1}): s = mean |w| (the L2-optimal scale of a sign code), code = (w >= 0).
* nf4 / float4_e2m1fn / float8_*: s = max|w| / max|format|, code = nearest(w / s) (ties to even code).
* mxfp4: scale = 2^(floor(log2 max|w|) - 2) as an E8M0 code (OCP MX: 2 = emax of E2M1), elements satfinite E2M1.
* nvfp4: scale = E4M3(max|w| / 6) (round to nearest even), elements satfinite E2M1.
* group_size=None (no scaling): code = nearest(w) in the format (e.g. a plain fp8 cast).

A zero-range group gets scale 1 (int1: 0), so its codes reproduce the zeros exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import ArgumentError, UnsupportedConfigError
from .formats import get_format
from .fragment_order import pack_for_mma
from .packing import check_storage, pack, to_torch, unpack
from .scaling import QuantScheme, dequantize_codes, group_index, pack_zeros

__all__ = ["QuantizedWeight", "quantize"]


@dataclass
class QuantizedWeight:
    """A packed weight and everything needed to dequantize it.

    packed  [N, K*b/storage_bits]  int32 / int8 / uint8, packed along K (little-endian, :mod:`.packing`)
    scales  [N, G] float (fp16 / bf16 / fp32), or uint8 scale codes for mxfp4 (E8M0) / nvfp4 (E4M3); None if unscaled
    zeros   [N, G] float ("original" / "rescale"), packed [G, N*b/storage_bits] ("quantized"), or None
    g_idx   [K] int32 group of each column (act-order) or None
    """

    packed: object
    scales: object
    zeros: object
    g_idx: object
    scheme: QuantScheme
    shape: tuple

    def codes(self):
        """uint8 codes [N, K]."""
        return unpack(self.packed, self.scheme.bits, axis=-1)

    def dequantize(self, out_dtype="float32"):
        """The reference dequantized weight [N, K] (float32 unless ``out_dtype``)."""
        return dequantize_codes(self.codes(), self.scheme, self.scales, self.zeros, self.g_idx, out_dtype)

    def mma_words(self):
        """int32 [N/BN, K/BK, 32]: the codes in mma B-fragment order, interleaved (:mod:`.fragment_order`)."""
        return pack_for_mma(self.codes(), self.scheme.bits)

    def to(self, device) -> "QuantizedWeight":
        mv = (lambda t: None if t is None else t.to(device))
        return replace(self, packed=mv(self.packed), scales=mv(self.scales), zeros=mv(self.zeros),
                       g_idx=mv(self.g_idx))


def _group_reduce(x, gi, groups: int, how: str):
    import torch

    idx = gi.unsqueeze(0).expand_as(x)
    out = torch.zeros((x.shape[0], groups), dtype=x.dtype, device=x.device)
    return out.scatter_reduce(1, idx, x, how, include_self=False)


def quantize(weight, scheme: QuantScheme, storage: str = "int32", g_idx=None) -> QuantizedWeight:
    """Quantize ``weight`` [N, K] (torch float16 / bfloat16 / float32, any device; numpy accepted) with ``scheme``.

    ``g_idx`` ([K] ints, act-order only) assigns each column to a group. Returns packed codes (``storage``), scales
    in the weight's dtype (codes for mxfp4 / nvfp4), zeros per ``scheme.zeros_mode``.
    """
    import torch

    if not isinstance(scheme, QuantScheme):
        raise ArgumentError(f"scheme must be a QuantScheme, got {type(scheme).__name__}")
    storage = check_storage(storage)
    w, _ = to_torch(weight)
    if w.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ArgumentError(f"weight must be float16, bfloat16 or float32, got {w.dtype}")
    if w.dim() != 2:
        raise ArgumentError(f"weight must be 2-D [N, K], got shape {tuple(w.shape)}")
    fmt = scheme.fmt
    n, k = w.shape
    wf = w.to(torch.float64)
    if not scheme.scaled:
        codes = fmt.encode(wf)
        return QuantizedWeight(pack(codes, fmt.bits, -1, storage), None, None, None, scheme, (n, k))
    groups = scheme.num_groups(k)
    gi = group_index(scheme, k, g_idx, w.device)
    sdtype = w.dtype
    zeros = None
    absmax = _group_reduce(wf.abs(), gi, groups, "amax")

    def stored(s):
        fi = torch.finfo(sdtype)
        s = torch.where(s == 0, torch.ones_like(s), s).clamp(max=fi.max).to(sdtype)
        return torch.where(s == 0, torch.full_like(s, fi.tiny), s)  # an underflowed scale would divide by 0

    if fmt.name == "mxfp4":
        e = torch.floor(torch.log2(torch.where(absmax > 0, absmax, torch.ones_like(absmax)))) - 2
        e = torch.where(absmax > 0, e, torch.full_like(e, -127)).clamp(-127, 127)
        scales = (e + 127).to(torch.uint8)
        codes = fmt.encode(wf / torch.exp2(e)[:, gi])
    elif fmt.name == "nvfp4":
        e4m3 = get_format("float8_e4m3fn")
        scales = e4m3.encode(absmax / fmt.max_value)
        sval = e4m3.decode(scales)
        codes = fmt.encode(wf / torch.where(sval > 0, sval, torch.ones_like(sval))[:, gi])
    elif fmt.kind == "uint":
        if scheme.zeros_mode is None:
            raise UnsupportedConfigError(f"{fmt.name} with scales but no zeros cannot represent negative weights; "
                                         f"use zeros_mode in ('original', 'rescale', 'quantized') or a signed "
                                         f"format (int{fmt.bits}, int{fmt.bits}_ob)")
        qmax = (1 << fmt.bits) - 1
        lo = _group_reduce(wf, gi, groups, "amin").clamp(max=0)
        hi = _group_reduce(wf, gi, groups, "amax").clamp(min=0)
        scales = stored((hi - lo) / qmax)
        s = scales.to(torch.float64)
        z = torch.round(-lo / s).clamp(0, qmax)
        codes = (torch.round(wf / s[:, gi]) + z[:, gi]).clamp(0, qmax).to(torch.uint8)
        if scheme.zeros_mode == "original":
            zeros = z.to(sdtype)
        elif scheme.zeros_mode == "rescale":
            zeros = (z * s).to(torch.float32)
        else:
            zeros = pack_zeros(z.to(torch.uint8), fmt.bits, storage)
    elif fmt.storage == "plus_minus_one":
        scales = _group_reduce(wf.abs(), gi, groups, "mean").to(sdtype)
        codes = fmt.encode(wf)
    else:
        top = (1 << (fmt.bits - 1)) - 1 if fmt.kind == "int" else fmt.max_value
        scales = stored(absmax / top)
        codes = fmt.encode(wf / scales.to(torch.float64)[:, gi])
    gsave = None if not scheme.act_order else gi.to(torch.int32)
    return QuantizedWeight(pack(codes, fmt.bits, -1, storage), scales, zeros, gsave, scheme, (n, k))
