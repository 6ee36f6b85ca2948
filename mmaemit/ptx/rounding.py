"""Correct rounding: exact float64 intermediates rounded once to f16 / bf16 / f32, in any PTX rounding direction.

``.rn`` results are correctly rounded: the exact value is carried as a float64 pair ``hi + lo`` (an error-free TwoSum)
and rounded through a round-to-odd float64 intermediate, which makes the final rounding to a format of <= 51
significand bits exact. NaN results are the canonical NaN of the format (f16 / bf16 ``0x7FFF``, f32 / tf32
``0x7FFFFFFF``); PTX leaves payloads unspecified, so compare NaN-ness, not NaN bits.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = ["canonical_nan", "two_sum", "round_f64", "f32_to_f16_bits", "f32_to_bf16_bits", "round_directed",
           "round_sum_f32"]

_F16_NAN = 0x7FFF
_BF16_NAN = 0x7FFF
_F32_NAN = 0x7FFFFFFF


def canonical_nan(fmt: str) -> int:
    """The canonical NaN bit pattern PTX produces for ``fmt`` ("f16", "bf16", "f32", "tf32")."""
    return {"f16": _F16_NAN, "bf16": _BF16_NAN, "f32": _F32_NAN, "tf32": _F32_NAN}[fmt]


def two_sum(a, b):
    """(s, e) with s + e == a + b exactly (Knuth), for float64 arrays without overflow (e = 0 where s is not
    finite)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, np.where(np.isfinite(s), e, 0.0)


def _round_to_odd(hi, lo):
    """The exact value hi + lo (hi = RN(exact)) rounded to odd at float64 precision."""
    bits = hi.view(np.int64)
    bump = (lo != 0) & ((bits & 1) == 0) & np.isfinite(hi)
    if not np.any(bump):
        return hi
    toward = np.where(lo > 0, np.inf, -np.inf)
    return np.where(bump, np.nextafter(hi, toward), hi)


def f32_to_f16_bits(x):
    """float32 (or float64) -> f16 bits, round-to-nearest-even, canonical NaN."""
    x = np.asarray(x)
    with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf is the IEEE result
        out = x.astype(np.float16).view(np.uint16)
    return np.where(np.isnan(x), np.uint16(_F16_NAN), out).astype(np.uint16)


def f32_to_bf16_bits(x):
    """float32 -> bf16 bits, round-to-nearest-even (``cvt.rn.bf16.f32``), canonical NaN."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(_BF16_NAN), r).astype(np.uint16)


def _f64_to_f32_odd(x):
    with np.errstate(over="ignore", invalid="ignore"):
        f = x.astype(np.float32)
    err = x - f.astype(np.float64)
    bits = f.view(np.uint32)
    bump = (err != 0) & ((bits & 1) == 0) & np.isfinite(f)
    if np.any(bump):
        f = np.where(bump, np.nextafter(f, np.where(err > 0, np.float32(np.inf), np.float32(-np.inf))), f)
    return f.astype(np.float32)


def round_f64(hi, lo, fmt):
    """Correctly rounded (RN-even) bits in ``fmt`` of the exact value ``hi + lo`` (float64 pair, hi = RN(exact)).

    ``fmt``: "f16" -> uint16, "bf16" -> uint16, "f32" -> uint32. NaN -> canonical NaN.
    """
    hi = np.asarray(hi, dtype=np.float64)
    lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), hi.shape)
    odd = _round_to_odd(hi, lo)
    if fmt == "f16":
        return f32_to_f16_bits(odd)          # numpy rounds float64 -> float16 directly (RNE)
    if fmt == "bf16":
        return f32_to_bf16_bits(_f64_to_f32_odd(odd))
    if fmt == "f32":
        with np.errstate(over="ignore", invalid="ignore"):   # overflow to inf is the IEEE result
            out = odd.astype(np.float32).view(np.uint32)
        return np.where(np.isnan(hi), np.uint32(_F32_NAN), out).astype(np.uint32)
    raise ValueError(f"unknown format {fmt!r}")


def _step(v, dt, direction):
    """The neighbour of float values ``v`` (dtype dt) toward +inf (direction > 0) or -inf, elementwise."""
    if np.dtype(dt) == np.dtype(ml_dtypes.bfloat16):
        bits = v.view(np.uint16).astype(np.int32)
        neg = (bits & 0x8000) != 0
        mag = bits & 0x7FFF
        up = np.where(neg, np.where(mag == 0, 0x0001, bits - 1), bits + 1)        # toward +inf
        down = np.where(neg, bits + 1, np.where(mag == 0, 0x8001, bits - 1))      # toward -inf
        out = np.where(direction > 0, up, down).astype(np.uint16)
        return out.view(ml_dtypes.bfloat16)
    with np.errstate(over="ignore"):
        return np.nextafter(v, np.where(direction > 0, dt(np.inf), dt(-np.inf)).astype(dt)).astype(dt)


def round_directed(x64, dt, rnd):
    """float64 values (exact) rounded to the float type ``dt`` (numpy float16 / bfloat16 / float32 / float64) with
    PTX rounding ``rnd``: "rn" (nearest even), "rz" (toward zero), "rm" (toward -inf), "rp" (toward +inf)."""
    if np.dtype(dt) == np.dtype(ml_dtypes.bfloat16):
        r = round_f64(x64, 0.0, "bf16").view(ml_dtypes.bfloat16)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            r = x64.astype(dt)
    if rnd == "rn":
        return r
    back = r.astype(np.float64)
    fin = np.isfinite(x64)
    if rnd == "rz":
        fix = fin & (np.abs(back) > np.abs(x64))
        return np.where(fix, _step(r, dt, -np.sign(x64)), r).astype(dt)
    if rnd == "rp":
        return np.where(fin & (back < x64), _step(r, dt, 1), r).astype(dt)
    if rnd == "rm":
        return np.where(fin & (back > x64), _step(r, dt, -1), r).astype(dt)
    raise NotImplementedError(f"cvt rounding .{rnd}")


def _round_exact_f32(s, e):
    """The exact value s + e (s = fl64(s + e)) rounded once to float32, nearest even (via round-to-odd)."""
    s = np.asarray(s, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    inexact = e != 0
    toward_zero = inexact & (np.sign(e) != np.sign(s))
    trunc = np.where(toward_zero, np.nextafter(s, 0.0), s)
    odd = trunc.view(np.uint64) | np.where(inexact, np.uint64(1), np.uint64(0))
    with np.errstate(over="ignore", invalid="ignore"):
        return odd.view(np.float64).astype(np.float32)


def round_sum_f32(p, z, rnd: str = "rn"):
    """f32 bits (uint32) of the exact sum ``p + z`` of two exact float64 values, rounded once in direction ``rnd``
    ("rn", "rz", "rm", "rp"). A zero sum of opposite signs is +0 except under "rm" (-0), as IEEE 754 says;
    subnormal results are kept (no flush to zero)."""
    with np.errstate(invalid="ignore", over="ignore"):
        s, e = two_sum(p, z)
        r = np.asarray(_round_exact_f32(s, e), dtype=np.float32)
        if rnd != "rn":
            rf = r.astype(np.float64)
            above = ((rf - s) - e) > 0      # the nearest value lies above the exact one
            below = ((rf - s) - e) < 0
            exact_val = s + e
            if rnd == "rz":
                step = (above & (exact_val > 0)) | (below & (exact_val < 0))
                r = np.where(step, np.nextafter(r, np.float32(0)), r)
            elif rnd == "rm":
                r = np.where(above, np.nextafter(r, np.float32(-np.inf)), r)
            elif rnd == "rp":
                r = np.where(below, np.nextafter(r, np.float32(np.inf)), r)
            else:
                raise ValueError(f"rounding {rnd!r}")
        bits = np.asarray(r, dtype=np.float32).view(np.uint32)
        zero_sum = (s == 0) & (e == 0)
        if rnd == "rm":  # IEEE 754: an exact zero sum is -0 under roundTowardNegative unless both are +0
            plus = (p == 0) & (z == 0) & ~np.signbit(p) & ~np.signbit(z)
            bits = np.where(zero_sum & ~plus, np.uint32(0x80000000), bits)
    return np.asarray(bits).astype(np.uint32)
