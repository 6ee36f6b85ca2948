"""Quantization schemes (format x scaling x zeros x act-order) and the float reference ``dequantize``.

Notation: W[n, k] is the dequantized weight (n < N output row, k < K reduction index), q = q[n, k] the raw code,
w = format.decode(q) its value, g the group size, G = K / g the number of groups, and gi(k) the group of column k:
``gi(k) = k // g``, or ``g_idx[k]`` with act-order. S = scales[n, gi(k)], Z = zeros[n, gi(k)].

==============  =========================  ====================================================================
scaling         group_size                 W[n, k]
==============  =========================  ====================================================================
none            None                       w
per-channel     -1  (g = K, G = 1)         w * S                       (or a zeros mode below)
per-group       g > 0, K % g == 0          w * S                       (32/64/128 or any divisor of K)
block (MX/NV)   the format's block (32/16) w * decode(S) with S a code of the scale format (e8m0 / e4m3)
==============  =========================  ====================================================================

==============  =============================  ========================================================================
zeros_mode      zeros tensor                   W[n, k]
==============  =============================  ========================================================================
None            -                              w * S
"original"      float [N, G]                   (w - Z) * S          (GPTQ/AWQ integer zeros stored as floats)
"rescale"       float [N, G]                   w * S - Z            (Z is the zero pre-multiplied by the scale)
"quantized"     packed codes [G, N*b/sb]       (q - qz[n, gi(k)]) * S, qz the b-bit zero code; the zeros are
                                               packed along N (little-endian, like GPTQ's qzeros without its +1)
==============  =============================  ========================================================================

Zeros are defined for the unsigned integer formats (uint1/2/4/8) only; signed and float formats carry their own
sign. Scales are [N, G] (fp16 / bf16 / fp32) for all non-block formats.

The reference evaluates the formula in float64 and rounds once to the requested output dtype (float32 by default;
float16 / bfloat16 with correct round-to-nearest-even). The result is the correctly rounded exact value in every
mode except "original" with bf16/fp32 zeros many binades smaller than the codes (then w - z may round in float64);
products w * S are always exact (<= 24 x 24 significant bits) and "rescale" is corrected with an exact TwoSum.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ArgumentError, TileShapeError, UnsupportedConfigError, choices
from .formats import Format, get_format
from .packing import STORAGE_BITS, pack, storage_of, to_numpy, to_torch, unpack
from .rounding import round_sum_torch, round_torch

__all__ = ["ZEROS_MODES", "QuantScheme", "dequantize", "dequantize_codes", "pack_zeros", "unpack_zeros",
           "group_index", "act_order_permutation"]

ZEROS_MODES = ("original", "rescale", "quantized")


def _divisors(k: int) -> list:
    return [d for d in range(1, k + 1) if k % d == 0]


@dataclass(frozen=True)
class QuantScheme:
    """Format + scaling. ``group_size``: None (no scaling), -1 (per-channel), g > 0 (per-group; must divide K),
    "auto" (the block size of mxfp4/nvfp4, else 128). ``zeros_mode``: None, "original", "rescale", "quantized".
    ``act_order``: the group of column k is ``g_idx[k]`` (GPTQ desc_act) instead of ``k // g``."""

    format: str
    group_size: int | str | None = "auto"
    zeros_mode: str | None = None
    act_order: bool = False

    def __post_init__(self):
        fmt = get_format(self.format)
        object.__setattr__(self, "format", fmt.name)
        g = self.group_size
        if g == "auto":
            g = fmt.block_size or 128
        if g is not None and (isinstance(g, bool) or not isinstance(g, int) or (g <= 0 and g != -1)):
            raise UnsupportedConfigError(f"group_size={self.group_size!r} is invalid; valid: None (no scaling), "
                                         f"-1 (per-channel), a positive divisor of K, 'auto'")
        object.__setattr__(self, "group_size", g)
        if self.zeros_mode is not None and self.zeros_mode not in ZEROS_MODES:
            raise UnsupportedConfigError(f"zeros_mode={self.zeros_mode!r} is unknown; valid: None, "
                                         f"{choices(ZEROS_MODES)}")
        if fmt.block_size is not None:
            if g != fmt.block_size or self.zeros_mode is not None or self.act_order:
                raise UnsupportedConfigError(
                    f"{fmt.name} has one {fmt.scale_format} scale per {fmt.block_size} elements: use "
                    f"group_size={fmt.block_size} (or 'auto'), zeros_mode=None, act_order=False")
        if self.zeros_mode is not None:
            if fmt.kind != "uint":
                raise UnsupportedConfigError(f"zeros are defined for unsigned integer formats only, not {fmt.name}; "
                                             f"valid: uint1, uint2, uint4, uint8")
            if g is None:
                raise UnsupportedConfigError("a zeros mode needs scales: set group_size to -1 or a group size")
        if self.act_order and (g is None or g == -1):
            raise UnsupportedConfigError("act_order needs per-group scaling (group_size > 0)")

    @property
    def fmt(self) -> Format:
        return get_format(self.format)

    @property
    def bits(self) -> int:
        return self.fmt.bits

    @property
    def scaled(self) -> bool:
        return self.group_size is not None

    def group(self, k: int) -> int:
        """The group size for reduction length ``k`` (k itself for per-channel); raises if it does not divide k."""
        if self.group_size is None:
            raise UnsupportedConfigError("this scheme has no scaling (group_size=None)")
        g = k if self.group_size == -1 else self.group_size
        if k % g:
            raise TileShapeError(f"group size {g} does not divide K={k}; valid group sizes: -1 (per-channel) or "
                                 f"{choices(_divisors(k))}")
        return g

    def num_groups(self, k: int) -> int:
        return k // self.group(k)


def group_index(scheme: QuantScheme, k: int, g_idx=None, device=None):
    """int64 tensor [K]: the scale/zero column used by reduction index k (validates ``g_idx`` against the scheme)."""
    import torch

    g = scheme.group(k)
    if scheme.act_order:
        if g_idx is None:
            raise ArgumentError("act_order=True needs g_idx (int tensor [K], the group of each column)")
        gi, _ = to_torch(g_idx)
        if gi.dtype.is_floating_point or tuple(gi.shape) != (k,):
            raise ArgumentError(f"g_idx must be an integer tensor of shape [{k}], got {gi.dtype} {tuple(gi.shape)}")
        gi = gi.to(device=device, dtype=torch.int64)
        if k and (int(gi.min()) < 0 or int(gi.max()) >= k // g):
            raise ArgumentError(f"g_idx values must lie in [0, {k // g - 1}]")
        return gi
    if g_idx is not None:
        raise ArgumentError("g_idx was given but the scheme has act_order=False; pass act_order=True to use it")
    return torch.arange(k, device=device) // g


def act_order_permutation(g_idx, group_size: int):
    """Column permutation ``perm`` (int64 [K]) with ``g_idx[perm] == arange(K) // group_size``: applying it to the
    weight's K axis (and to the activations' K axis) turns an act-order weight into a plain per-group one."""
    import torch

    gi, was_np = to_torch(g_idx)
    gi = gi.to(torch.int64)
    k = gi.numel()
    if group_size <= 0 or k % group_size:
        raise TileShapeError(f"group size {group_size} does not divide K={k}; valid: {choices(_divisors(k))}")
    counts = torch.bincount(gi, minlength=k // group_size)
    if counts.numel() != k // group_size or bool((counts != group_size).any()):
        raise ArgumentError(f"every group must hold exactly {group_size} columns for a contiguous regrouping")
    perm = torch.sort(gi, stable=True).indices
    return perm.numpy() if was_np else perm


def pack_zeros(zero_codes, bits: int, storage: str = "int32"):
    """Zero codes [N, G] -> packed [G, N*bits/storage_bits], packed along N (the "quantized" zeros layout)."""
    t, was_np = to_torch(zero_codes)
    out = pack(t.transpose(0, 1), bits, axis=-1, storage=storage)
    return to_numpy(out) if was_np else out


def unpack_zeros(qzeros, bits: int):
    """Inverse of :func:`pack_zeros`: packed [G, N*bits/sb] -> zero codes [N, G] (uint8)."""
    t, was_np = to_torch(qzeros)
    out = unpack(t, bits, axis=-1).transpose(0, 1)
    return to_numpy(out) if was_np else out


def _float_tensor(x, name, shape, device):
    import torch

    t, _ = to_torch(x)
    if not t.dtype.is_floating_point:
        raise ArgumentError(f"{name} must be a float tensor (float16 / bfloat16 / float32), got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.to(device=device, dtype=torch.float64)


def _code_tensor(x, name, shape, device):
    import torch

    t, _ = to_torch(x)
    if t.dtype in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e8m0fnu", None)):
        t = t.view(torch.uint8)
    if t.dtype.is_floating_point:
        raise ArgumentError(f"{name} must hold scale codes (uint8 or a torch float8 dtype), got {t.dtype}")
    if tuple(t.shape) != tuple(shape):
        raise ArgumentError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.to(device=device, dtype=torch.int64)


def dequantize_codes(codes, scheme: QuantScheme, scales=None, zeros=None, g_idx=None, out_dtype="float32"):
    """Reference dequantization of unpacked codes [N, K] (see the module docstring for every formula)."""
    import torch

    if not isinstance(scheme, QuantScheme):
        raise ArgumentError(f"scheme must be a QuantScheme, got {type(scheme).__name__}")
    q, was_np = to_torch(codes)
    if q.dim() != 2:
        raise ArgumentError(f"codes must be 2-D [N, K], got shape {tuple(q.shape)}")
    fmt = scheme.fmt
    n, k = q.shape
    dev = q.device
    w = fmt.decode(q)
    if not scheme.scaled:
        if scales is not None or zeros is not None or g_idx is not None:
            raise ArgumentError("group_size=None means no scaling: pass no scales, zeros or g_idx")
        out = round_torch(w, out_dtype)
        return to_numpy(out) if was_np else out
    groups = scheme.num_groups(k)
    if scales is None:
        raise ArgumentError(f"scheme {scheme.format} with group_size={scheme.group_size} needs scales [{n}, {groups}]")
    gi = group_index(scheme, k, g_idx, dev)
    if fmt.block_size is not None:
        s = get_format(fmt.scale_format).decode(_code_tensor(scales, "scales", (n, groups), dev))
    else:
        s = _float_tensor(scales, "scales", (n, groups), dev)
    s = s[:, gi]
    mode = scheme.zeros_mode
    if mode is None:
        if zeros is not None:
            raise ArgumentError("zeros were given but the scheme has zeros_mode=None")
        out = w * s
    elif zeros is None:
        raise ArgumentError(f"zeros_mode={mode!r} needs zeros")
    elif mode == "quantized":
        zt, _ = to_torch(zeros)
        storage = storage_of(zt)
        want = (groups, n * fmt.bits // STORAGE_BITS[storage])
        if tuple(zt.shape) != want or (n * fmt.bits) % STORAGE_BITS[storage]:
            raise ArgumentError(f"quantized zeros must be packed along N with shape {list(want)} ({storage}), "
                                f"got {list(zt.shape)}")
        qz = unpack_zeros(zt.to(dev), fmt.bits).to(torch.float64)[:, gi]
        out = (q.to(torch.float64) - qz) * s
    else:
        z = _float_tensor(zeros, "zeros", (n, groups), dev)[:, gi]
        if mode == "rescale":  # w * s is exact in float64; the subtraction is rounded once, correctly
            out = round_sum_torch(w * s, -z, out_dtype)
            return to_numpy(out) if was_np else out
        out = (w - z) * s
    out = round_torch(out, out_dtype)
    return to_numpy(out) if was_np else out


def dequantize(packed, scales, zeros, scheme: QuantScheme, g_idx=None, out_dtype="float32"):
    """Reference dequantization of a packed weight [N, K*b/storage_bits] (packed along K, see :mod:`.packing`).

    ``packed`` may also be a torch float8 tensor [N, K] (e4m3 / e5m2 weights); returns [N, K] in ``out_dtype``.
    """
    import torch

    if not isinstance(scheme, QuantScheme):
        raise ArgumentError(f"scheme must be a QuantScheme, got {type(scheme).__name__}")
    t, was_np = to_torch(packed)
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        t = t.view(torch.uint8)
    if t.dim() != 2:
        raise ArgumentError(f"packed weight must be 2-D [N, K*b/storage_bits], got shape {tuple(t.shape)}")
    codes = unpack(t, scheme.bits, axis=-1)
    out = dequantize_codes(codes, scheme, scales, zeros, g_idx, out_dtype)
    return to_numpy(out) if was_np else out
