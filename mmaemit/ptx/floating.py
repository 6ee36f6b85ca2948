"""Floating-point instructions: ``add`` / ``sub`` / ``mul`` / ``fma`` on ``.f16{x2}`` / ``.bf16{x2}`` / ``.f32`` (every
rounding direction PTX allows for them), and the ``cvt`` family. Operands are register bit patterns
(``mmaemit.ptx.bits``); results are correctly rounded with canonical NaNs (``mmaemit.ptx.rounding``).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .bits import half_values, pack_b32, split_b32, uint_type
from .rounding import (canonical_nan, f32_to_bf16_bits, f32_to_f16_bits, round_directed, round_f64, round_sum_f32,
                       two_sum)

__all__ = ["half_arith", "f32_arith", "SCALAR_TYPES", "cvt", "cvt_f32_to_x2", "cvt_tf32", "decode_f8",
           "cvt_f8x2_to_f16x2", "cvt_f32_to_f8x2"]

_F16_NAN = canonical_nan("f16")
_F32_NAN = canonical_nan("f32")

# --------------------------------------------------------------------------------------------------------------
# half-precision arithmetic (add/sub/mul/fma .f16 .f16x2 .bf16 .bf16x2)
# --------------------------------------------------------------------------------------------------------------

_F16_MIN_NORMAL = 2.0 ** -14


def _half_scalar(op, fmt, a, b, c, ftz, sat, relu):
    x = half_values(a, fmt)
    y = half_values(b, fmt)
    if ftz and fmt == "f16":
        x = np.where(np.abs(x) < _F16_MIN_NORMAL, np.copysign(0.0, x), x)
        y = np.where(np.abs(y) < _F16_MIN_NORMAL, np.copysign(0.0, y), y)
    with np.errstate(all="ignore"):
        if op == "add":
            hi, lo = two_sum(x, y)
        elif op == "sub":
            hi, lo = two_sum(x, -y)
        elif op == "mul":
            hi, lo = x * y, np.zeros_like(x)        # exact: 11x11 (8x8) significand bits
        elif op == "fma":
            z = half_values(c, fmt)
            if ftz and fmt == "f16":
                z = np.where(np.abs(z) < _F16_MIN_NORMAL, np.copysign(0.0, z), z)
            hi, lo = two_sum(x * y, z)
        else:
            raise ValueError(op)
    nan = np.isnan(hi)
    if sat:
        hi = np.where(nan, 0.0, np.clip(hi, 0.0, 1.0))
        lo = np.where((hi <= 0.0) | (hi >= 1.0), 0.0, lo)
        nan = np.zeros_like(nan)
    out = round_f64(hi, lo, fmt)
    if relu:
        neg = (out & 0x8000) != 0
        out = np.where(neg, np.uint16(0), out)
    if ftz and fmt == "f16":
        sub = ((out & 0x7C00) == 0) & ((out & 0x03FF) != 0)
        out = np.where(sub, out & np.uint16(0x8000), out)
    return np.where(nan, np.uint16(canonical_nan(fmt)), out).astype(np.uint16)


def half_arith(op: str, type_: str, a, b, c=None, *, ftz: bool = False, sat: bool = False, relu: bool = False):
    """``{add,sub,mul,fma}.rn{.ftz}{.sat}{.relu}.{f16,f16x2,bf16,bf16x2}``, correctly rounded.

    Operands are bit patterns: uint16 for ``.f16/.bf16``, uint32 for the ``x2`` forms (element 0 in bits 15:0).
    """
    fmt = type_.replace("x2", "")
    if type_.endswith("x2"):
        alo, ahi = split_b32(a)
        blo, bhi = split_b32(b)
        clo, chi = split_b32(c) if c is not None else (None, None)
        lo = _half_scalar(op, fmt, alo, blo, clo, ftz, sat, relu)
        hi = _half_scalar(op, fmt, ahi, bhi, chi, ftz, sat, relu)
        return pack_b32(lo, hi)
    return _half_scalar(op, fmt, np.asarray(a).astype(np.uint16), np.asarray(b).astype(np.uint16),
                        None if c is None else np.asarray(c).astype(np.uint16), ftz, sat, relu)


# --------------------------------------------------------------------------------------------------------------
# f32 arithmetic
# --------------------------------------------------------------------------------------------------------------

def _f32_values(bits, ftz):
    v = np.asarray(bits).astype(np.uint32).view(np.float32).astype(np.float64)
    if ftz:
        v = np.where(np.abs(v) < 2.0 ** -126, np.copysign(0.0, v), v)
    return v


def f32_arith(op: str, a, b, c=None, *, rnd: str = "rn", ftz: bool = False, sat: bool = False):
    """``{add,sub,mul}{.rnd}{.ftz}{.sat}.f32 d, a, b`` and ``fma{.rnd}{.ftz}{.sat}.f32 d, a, b, c`` on uint32 bits.

    The exact result rounded once: ``rnd`` "rn" with optional ``.ftz`` (subnormal inputs and results flushed to
    sign-preserving zero) and ``.sat`` (clamp to [0, 1], NaN -> 0); "rz", "rm", "rp" (without ``.ftz`` / ``.sat``:
    subnormals kept, a zero sum of opposite signs is -0 only under "rm"). NaN results are the canonical NaN.
    """
    names = ("add", "sub", "mul", "fma")
    if op not in names:
        raise ValueError(f"f32_arith: op {op!r} (valid: {names})")
    if rnd != "rn":
        if ftz or sat:
            raise NotImplementedError(f"{op}.{rnd} with .ftz / .sat")
        x, y = _f32_values(a, False), _f32_values(b, False)
        with np.errstate(invalid="ignore", over="ignore"):
            if op == "mul":
                p = x * y
                z = np.copysign(0.0, p)     # p + z == p exactly, signed zeros included
            elif op == "fma":
                p, z = x * y, _f32_values(c, False)
            else:
                p, z = x, (y if op == "add" else -y)
        out = round_sum_f32(p, z, rnd)
        with np.errstate(invalid="ignore"):
            nan = np.isnan(p + z)
        return np.where(nan, np.uint32(_F32_NAN), out).astype(np.uint32)
    vs = [_f32_values(x, ftz) for x in ((a, b) if op != "fma" else (a, b, c))]
    with np.errstate(all="ignore"):
        if op == "add":
            hi, lo = two_sum(vs[0], vs[1])
        elif op == "sub":
            hi, lo = two_sum(vs[0], -vs[1])
        elif op == "mul":
            hi, lo = vs[0] * vs[1], np.zeros_like(vs[0])
        else:
            hi, lo = two_sum(vs[0] * vs[1], vs[2])
    if sat:
        nan = np.isnan(hi)
        lo = np.where((hi <= 0) | (hi >= 1), 0.0, lo)
        hi = np.where(nan, 0.0, np.clip(hi, 0.0, 1.0))
    out = round_f64(hi, lo, "f32")
    if ftz:
        sub = ((out & 0x7F800000) == 0) & ((out & 0x7FFFFF) != 0)
        out = np.where(sub, out & np.uint32(0x80000000), out).astype(np.uint32)
    return out


# --------------------------------------------------------------------------------------------------------------
# conversions
# --------------------------------------------------------------------------------------------------------------

_F16_MAX = 65504.0
_BF16_MAX = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)


def _f32_to_half(x, fmt, rnd, relu, satfinite):
    x = np.asarray(x, dtype=np.float32)
    x64 = x.astype(np.float64)
    nan = np.isnan(x)
    if rnd == "rn":
        bits = f32_to_f16_bits(x) if fmt == "f16" else f32_to_bf16_bits(x)
    elif rnd == "rz":
        bits = f32_to_f16_bits(x) if fmt == "f16" else f32_to_bf16_bits(x)
        back = half_values(bits, fmt)
        over = np.isfinite(x64) & (np.abs(back) > np.abs(x64))
        # one step toward zero in the integer encoding (sign-magnitude: magnitude - 1)
        bits = np.where(over, bits - np.uint16(1), bits).astype(np.uint16)
    else:
        raise NotImplementedError(f"cvt rounding .{rnd} to {fmt}")
    if satfinite:
        fmax = _F16_MAX if fmt == "f16" else _BF16_MAX
        maxbits = f32_to_f16_bits(np.float32(fmax)) if fmt == "f16" else f32_to_bf16_bits(np.float32(fmax))
        inf = ~nan & np.isinf(half_values(bits, fmt))
        bits = np.where(inf, (bits & np.uint16(0x8000)) | maxbits, bits).astype(np.uint16)
    if relu:
        bits = np.where((bits & 0x8000) != 0, np.uint16(0), bits).astype(np.uint16)
    return np.where(nan, np.uint16(canonical_nan(fmt)), bits).astype(np.uint16)


def cvt_f32_to_x2(a, b, fmt: str, rnd: str = "rn", relu: bool = False, satfinite: bool = False):
    """``cvt.{rn,rz}{.relu}{.satfinite}.{f16x2,bf16x2}.f32 d, a, b``: d = {cvt(a) : cvt(b)} (a in the upper half).

    ``a``, ``b``: float32 values (not bits)."""
    return pack_b32(_f32_to_half(b, fmt, rnd, relu, satfinite), _f32_to_half(a, fmt, rnd, relu, satfinite))


def cvt_tf32(x, rnd: str = "rna", satfinite: bool = False):
    """``cvt.{rna,rn,rz}{.satfinite}.tf32.f32``: float32 rounded to 10 significand bits, low 13 bits zero."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    finite = (u & 0x7F800000) != 0x7F800000
    nan = ((u & 0x7F800000) == 0x7F800000) & ((u & 0x7FFFFF) != 0)
    if rnd == "rna":            # ties away from zero: add half an ulp to the magnitude, truncate
        r = (u + 0x1000) & 0xFFFFE000
    elif rnd == "rn":
        r = (u + 0xFFF + ((u >> 13) & 1)) & 0xFFFFE000
    elif rnd == "rz":
        r = u & 0xFFFFE000
    else:
        raise NotImplementedError(f"cvt.{rnd}.tf32.f32")
    r = np.where(finite, r, u & 0xFFFFE000)
    if satfinite:
        became_inf = finite & ((r & 0x7FFFFFFF) == 0x7F800000)
        r = np.where(became_inf, (r & 0x80000000) | 0x7F7FE000, r)
    return np.where(nan, np.uint64(_F32_NAN), r).astype(np.uint32)


#: PTX scalar type token -> numpy type (``cvt`` operands)
SCALAR_TYPES = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
                "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
                "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64}


def cvt(a, dtype: str, atype: str, rnd: str = "", *, sat: bool = False, relu: bool = False,
        satfinite: bool = False, ftz: bool = False):
    """Scalar ``cvt{.rnd}{.ftz}{.sat}{.relu}{.satfinite}.<dtype>.<atype> d, a`` on register bit patterns.

    Float -> float: exact when widening, rounded (rn/rz/rm/rp) when narrowing, rounded to an integral value with
    rni/rzi/rmi/rpi when the types match. Float -> int: rni/rzi/rmi/rpi, saturating to the integer range, NaN -> 0.
    Int -> float: rn/rz/rm/rp. Int -> int: wrap, or clamp with ``.sat``. Returns the bits of ``dtype``.
    """
    src_t, dst_t = SCALAR_TYPES[atype], SCALAR_TYPES[dtype]
    bits_src = np.dtype(src_t).itemsize
    v = np.asarray(a).astype(uint_type(8 * bits_src)).view(src_t)
    src_float, dst_float = atype[0] in "fb", dtype[0] in "fb"
    if src_float:
        x = v.astype(np.float64)
        if ftz and atype == "f32":
            x = np.where(np.abs(x) < 2.0 ** -126, np.copysign(0.0, x), x)
        if dst_float:
            if rnd in ("rni", "rzi", "rmi", "rpi"):
                x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rnd](x)
                out = round_directed(x, dst_t, "rn")
            else:
                out = round_directed(x, dst_t, rnd or "rn")
            if satfinite:
                fmax = float(np.finfo(dst_t).max) if dst_t is not ml_dtypes.bfloat16 else _BF16_MAX
                out = np.where(np.isinf(out.astype(np.float64)), np.copysign(fmax, x), out).astype(dst_t)
            if sat:
                out = np.where(np.isnan(x), 0.0, np.clip(out.astype(np.float64), 0.0, 1.0)).astype(dst_t)
            if relu:
                out = np.where(out.astype(np.float64) < 0, 0.0, out).astype(dst_t)
            out = np.asarray(out, dst_t)
            if dtype in ("f16", "bf16"):
                out = np.where(np.isnan(x), np.uint16(canonical_nan(dtype)).view(dst_t), out)
            return out.view(uint_type(8 * np.dtype(dst_t).itemsize))
        x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil, "": np.trunc}[rnd](x)
        info = np.iinfo(dst_t)
        x = np.where(np.isnan(x), 0.0, np.clip(x, info.min, info.max))
        return np.asarray(x).astype(dst_t).view(uint_type(8 * np.dtype(dst_t).itemsize))
    iv = v.astype(np.int64) if atype != "u64" else v.astype(np.uint64)
    if dst_float:
        return round_directed(iv.astype(np.float64), dst_t, rnd or "rn").view(uint_type(8 * np.dtype(dst_t).itemsize))
    if sat:
        info = np.iinfo(dst_t)
        iv = np.clip(iv, info.min, info.max)
    return np.asarray(iv).astype(dst_t).view(uint_type(8 * np.dtype(dst_t).itemsize))


_F8_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def decode_f8(bits, fmt: str):
    """float64 values of e4m3 / e5m2 bytes (PTX ``.e4m3`` is the OCP E4M3 "fn" format: no inf, NaN = S.1111.111)."""
    return np.asarray(bits).astype(np.uint8).view(_F8_DTYPES[fmt]).astype(np.float64)


def cvt_f8x2_to_f16x2(a, fmt: str = "e4m3", relu: bool = False):
    """``cvt.rn{.relu}.f16x2.{e4m3x2,e5m2x2} d, a``: a[7:0] -> d[15:0], a[15:8] -> d[31:16] (exact conversion)."""
    a = np.asarray(a).astype(np.uint16)
    lo = decode_f8(a & 0xFF, fmt)
    hi = decode_f8(a >> 8, fmt)
    out = []
    for v in (lo, hi):
        bits = f32_to_f16_bits(v)
        if relu:
            bits = np.where((bits & 0x8000) != 0, np.uint16(0), bits)
            bits = np.where(np.isnan(v), np.uint16(_F16_NAN), bits)
        out.append(bits.astype(np.uint16))
    return pack_b32(out[0], out[1])


def cvt_f32_to_f8x2(a, b, fmt: str = "e4m3", relu: bool = False, satfinite: bool = True):
    """``cvt.rn.satfinite{.relu}.{e4m3x2,e5m2x2}.f32 d, a, b``: d[15:8] = cvt(a), d[7:0] = cvt(b) (uint16 result)."""
    dt = _F8_DTYPES[fmt]
    fmax = float(ml_dtypes.finfo(dt).max)
    res = []
    for v in (b, a):
        v = np.asarray(v, dtype=np.float32)
        nan = np.isnan(v)
        w = np.clip(v, -fmax, fmax) if satfinite else v
        if relu:
            w = np.maximum(w, np.float32(0))
        q = w.astype(dt).view(np.uint8).astype(np.uint16)
        res.append(np.where(nan, np.uint16(0x7F), q).astype(np.uint16))
    return (res[0] | (res[1] << 8)).astype(np.uint16)
