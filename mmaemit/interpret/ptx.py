"""Bit-exact numpy semantics of the PTX instructions mmaemit kernels use, one function per instruction family.

Every function is pure and vectorized: registers are numpy arrays of their bit patterns (``uint32`` for ``.b32`` /
packed ``.f16x2``, ``uint16`` for ``.b16``), any leading shape. Nothing here knows about TIR, threads or memory, so
the functions are reusable outside the interpreter (e.g. to prove a dequant bit trick on all 2**16 inputs).

Semantics are transcribed from the PTX ISA (9.x) instruction descriptions:

* rounding: ``.rn`` results are correctly rounded (computed exactly in float64 where possible, otherwise through a
  round-to-odd float64 intermediate, which makes the final rounding to a format of <= 51 significand bits exact);
* NaN results are the canonical NaN of the format (f16/bf16 ``0x7FFF``, f32/tf32 ``0x7FFFFFFF``); PTX leaves payloads
  unspecified, so compare NaN-ness, not NaN bits;
* ``mma``: products are exact and the sum is formed in float64 (f32 accumulation order is not specified by NVIDIA:
  compare float results with a tolerance), integer MMAs are exact with int32 wrap-around or ``.satfinite`` clamping.

Fragment maps (which lane holds which matrix element) are the PTX ISA tables for ``mma.m16n8k*`` and ``ldmatrix``;
they are read from the shared layout objects (``mmaemit.layouts.mma_fragment``) through ``mma_a_coords`` etc.
"""
from __future__ import annotations

import ml_dtypes
import functools

import numpy as np

__all__ = [
    "canonical_nan", "round_f64", "f32_to_bf16_bits", "f32_to_f16_bits", "split_b32", "pack_b32",
    "lop3", "prmt", "shf", "shl", "shr", "half_arith", "cvt", "cvt_f32_to_x2", "cvt_tf32", "cvt_f8x2_to_f16x2",
    "cvt_f32_to_f8x2", "decode_f8", "mma_a_coords", "mma_b_coords", "mma_c_coords", "mma_sync", "ldmatrix",
    "stmatrix", "shfl", "MMA_ELEMENT_BITS",
]

_F16_NAN = 0x7FFF
_BF16_NAN = 0x7FFF
_F32_NAN = 0x7FFFFFFF


def canonical_nan(fmt: str) -> int:
    """The canonical NaN bit pattern PTX produces for ``fmt`` ("f16", "bf16", "f32", "tf32")."""
    return {"f16": _F16_NAN, "bf16": _BF16_NAN, "f32": _F32_NAN, "tf32": _F32_NAN}[fmt]


# --------------------------------------------------------------------------------------------------------------
# bit containers
# --------------------------------------------------------------------------------------------------------------

def split_b32(x):
    """(low 16 bits, high 16 bits) of a ``.b32`` register as uint16 arrays."""
    x = np.asarray(x).astype(np.uint32, copy=False)
    return (x & 0xFFFF).astype(np.uint16), (x >> 16).astype(np.uint16)


def pack_b32(lo, hi):
    """``{hi, lo}`` packed into one ``.b32`` register (``lo`` in bits 15:0)."""
    return (np.asarray(lo).astype(np.uint32) & 0xFFFF) | (np.asarray(hi).astype(np.uint32) << 16)


def _f16(bits):
    return np.asarray(bits).astype(np.uint16, copy=False).view(np.float16)


def _bf16(bits):
    return np.asarray(bits).astype(np.uint16, copy=False).view(ml_dtypes.bfloat16)


def _to_f64(bits, fmt):
    if fmt == "f16":
        return _f16(bits).astype(np.float64)
    if fmt == "bf16":
        return _bf16(bits).astype(np.float64)
    raise ValueError(fmt)


# --------------------------------------------------------------------------------------------------------------
# correct rounding
# --------------------------------------------------------------------------------------------------------------

def _two_sum(a, b):
    """s + e == a + b exactly (Knuth), for float64 arrays without overflow."""
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
        out = odd.astype(np.float32).view(np.uint32)
        return np.where(np.isnan(hi), np.uint32(_F32_NAN), out).astype(np.uint32)
    raise ValueError(f"unknown format {fmt!r}")


# --------------------------------------------------------------------------------------------------------------
# integer / logic
# --------------------------------------------------------------------------------------------------------------

def lop3(a, b, c, imm_lut: int):
    """``lop3.b32 d, a, b, c, immLut``: bit i of d = bit (4*a_i + 2*b_i + c_i) of immLut."""
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    d = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), dtype=np.uint32)
    for minterm in range(8):
        if (imm_lut >> minterm) & 1:
            ta = a if minterm & 4 else ~a
            tb = b if minterm & 2 else ~b
            tc = c if minterm & 1 else ~c
            d |= ta & tb & tc
    return d


#: prmt.{mode}: source byte for d.b0..d.b3 per selector c[1:0] (PTX ISA prmt table, listed d.b3..d.b0 there)
_PRMT_MODES = {
    "f4e": ((0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5), (3, 4, 5, 6)),
    "b4e": ((0, 7, 6, 5), (1, 0, 7, 6), (2, 1, 0, 7), (3, 2, 1, 0)),
    "rc8": ((0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 2, 2), (3, 3, 3, 3)),
    "ecl": ((0, 1, 2, 3), (1, 1, 2, 3), (2, 2, 2, 3), (3, 3, 3, 3)),
    "ecr": ((0, 0, 0, 0), (0, 1, 1, 1), (0, 1, 2, 2), (0, 1, 2, 3)),
    "rc16": ((0, 1, 0, 1), (2, 3, 2, 3), (0, 1, 0, 1), (2, 3, 2, 3)),
}


def prmt(a, b, c, mode: str = ""):
    """``prmt.b32{.mode} d, a, b, c``: pick 4 of the 8 bytes of {b, a} (a = bytes 0-3).

    Generic form: byte i of d = byte ``c[4i+2:4i]`` of the source, sign-replicated when ``c[4i+3]`` is set.
    Modes (f4e, b4e, rc8, ecl, ecr, rc16): c[1:0] selects a row of the ISA's byte table; no sign replication.
    """
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    src = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    d = np.zeros(np.broadcast_shapes(a.shape, b.shape, c.shape), dtype=np.uint32)
    if mode:
        table = np.array(_PRMT_MODES[mode], np.uint64)           # (4 selectors, 4 destination bytes)
        sel = (c & 3).astype(np.int64)
        for i in range(4):
            byte = ((src >> (table[sel, i] * 8)) & 0xFF).astype(np.uint32)
            d |= byte << (8 * i)
        return d
    for i in range(4):
        sel = (c >> (4 * i)) & 0xF
        byte = ((src >> ((sel & 7).astype(np.uint64) * 8)) & 0xFF).astype(np.uint32)
        sign = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
        byte = np.where(sel & 8, sign, byte)
        d |= byte << (8 * i)
    return d


def shf(a, b, c, direction: str, mode: str):
    """``shf.{l,r}.{clamp,wrap}.b32 d, a, b, c``: funnel shift of {b, a} by c (wrap: c mod 32; clamp: min(c, 32))."""
    a, b, c = (np.asarray(v).astype(np.uint32) for v in (a, b, c))
    n = (c & 31) if mode == "wrap" else np.minimum(c, 32)
    n = n.astype(np.uint64)
    wide = (b.astype(np.uint64) << 32) | a.astype(np.uint64)
    if direction == "l":
        return (((wide << n) >> 32) & 0xFFFFFFFF).astype(np.uint32)
    return ((wide >> n) & 0xFFFFFFFF).astype(np.uint32)


def _uint(bits):
    return {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[bits]


def _sint(bits):
    return {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}[bits]


def shl(a, n, bits: int = 32):
    """``shl.b{bits}``: shift amounts >= bits give 0 (PTX clamps the amount to the width)."""
    ut = _uint(bits)
    a = np.asarray(a).astype(ut)
    n = np.asarray(n).astype(np.uint64)
    wide = a.astype(np.uint64) << np.minimum(n, bits)
    return np.where(n >= bits, ut(0), (wide & ((1 << bits) - 1)).astype(ut)).astype(ut)


def shr(a, n, bits: int = 32, signed: bool = False):
    """``shr.{b,u,s}{bits}``: logical (b/u) or arithmetic (s); amounts >= bits clamp to the width."""
    n = np.minimum(np.asarray(n).astype(np.uint64), bits)
    if signed:
        st = _sint(bits)
        a = np.asarray(a).astype(_uint(bits)).view(st).astype(np.int64)
        return (a >> n.astype(np.int64)).astype(st).view(_uint(bits))
    ut = _uint(bits)
    a = np.asarray(a).astype(ut).astype(np.uint64)
    return np.where(n >= bits, 0, a >> np.minimum(n, bits - 1)).astype(ut)


# --------------------------------------------------------------------------------------------------------------
# half-precision arithmetic (add/sub/mul/fma .f16 .f16x2 .bf16 .bf16x2)
# --------------------------------------------------------------------------------------------------------------

_F16_MIN_NORMAL = 2.0 ** -14


def _half_scalar(op, fmt, a, b, c, ftz, sat, relu):
    x = _to_f64(a, fmt)
    y = _to_f64(b, fmt)
    if ftz and fmt == "f16":
        x = np.where(np.abs(x) < _F16_MIN_NORMAL, np.copysign(0.0, x), x)
        y = np.where(np.abs(y) < _F16_MIN_NORMAL, np.copysign(0.0, y), y)
    with np.errstate(all="ignore"):
        if op == "add":
            hi, lo = _two_sum(x, y)
        elif op == "sub":
            hi, lo = _two_sum(x, -y)
        elif op == "mul":
            hi, lo = x * y, np.zeros_like(x)        # exact: 11x11 (8x8) significand bits
        elif op == "fma":
            z = _to_f64(c, fmt)
            if ftz and fmt == "f16":
                z = np.where(np.abs(z) < _F16_MIN_NORMAL, np.copysign(0.0, z), z)
            hi, lo = _two_sum(x * y, z)
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
        back = _to_f64(bits, fmt)
        over = np.isfinite(x64) & (np.abs(back) > np.abs(x64))
        # one step toward zero in the integer encoding (sign-magnitude: magnitude - 1)
        bits = np.where(over, bits - np.uint16(1), bits).astype(np.uint16)
    else:
        raise NotImplementedError(f"cvt rounding .{rnd} to {fmt}")
    if satfinite:
        fmax = _F16_MAX if fmt == "f16" else _BF16_MAX
        maxbits = f32_to_f16_bits(np.float32(fmax)) if fmt == "f16" else f32_to_bf16_bits(np.float32(fmax))
        inf = ~nan & np.isinf(_to_f64(bits, fmt))
        bits = np.where(inf, (bits & np.uint16(0x8000)) | maxbits, bits).astype(np.uint16)
    if relu:
        bits = np.where((bits & 0x8000) != 0, np.uint16(0), bits).astype(np.uint16)
    return np.where(nan, np.uint16(canonical_nan(fmt)), bits).astype(np.uint16)


def cvt_f32_to_x2(a, b, fmt: str, rnd: str = "rn", relu: bool = False, satfinite: bool = False):
    """``cvt.{rn,rz}{.relu}{.satfinite}.{f16x2,bf16x2}.f32 d, a, b``: d = {cvt(a) : cvt(b)} (a in the upper half)."""
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


_SCALAR = {"f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
           "u8": np.uint8, "u16": np.uint16, "u32": np.uint32, "u64": np.uint64,
           "s8": np.int8, "s16": np.int16, "s32": np.int32, "s64": np.int64}


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


def _directed(x64, dt, rnd):
    """float64 values (exact) rounded to float type ``dt`` with PTX rounding rn/rz/rm/rp."""
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


def cvt(a, dtype: str, atype: str, rnd: str = "", *, sat: bool = False, relu: bool = False,
        satfinite: bool = False, ftz: bool = False):
    """Scalar ``cvt{.rnd}{.ftz}{.sat}{.relu}{.satfinite}.<dtype>.<atype> d, a`` on register bit patterns.

    Float -> float: exact when widening, rounded (rn/rz/rm/rp) when narrowing, rounded to an integral value with
    rni/rzi/rmi/rpi when the types match. Float -> int: rni/rzi/rmi/rpi, saturating to the integer range, NaN -> 0.
    Int -> float: rn/rz/rm/rp. Int -> int: wrap, or clamp with ``.sat``. Returns the bits of ``dtype``.
    """
    src_t, dst_t = _SCALAR[atype], _SCALAR[dtype]
    bits_src = np.dtype(src_t).itemsize
    v = np.asarray(a).astype(_uint(8 * bits_src)).view(src_t)
    src_float, dst_float = atype[0] in "fb", dtype[0] in "fb"
    if src_float:
        x = v.astype(np.float64)
        if ftz and atype == "f32":
            x = np.where(np.abs(x) < 2.0 ** -126, np.copysign(0.0, x), x)
        if dst_float:
            if rnd in ("rni", "rzi", "rmi", "rpi"):
                x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rnd](x)
                out = _directed(x, dst_t, "rn")
            else:
                out = _directed(x, dst_t, rnd or "rn")
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
            return out.view(_uint(8 * np.dtype(dst_t).itemsize))
        x = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil, "": np.trunc}[rnd](x)
        info = np.iinfo(dst_t)
        x = np.where(np.isnan(x), 0.0, np.clip(x, info.min, info.max))
        return np.asarray(x).astype(dst_t).view(_uint(8 * np.dtype(dst_t).itemsize))
    iv = v.astype(np.int64) if atype != "u64" else v.astype(np.uint64)
    if dst_float:
        return _directed(iv.astype(np.float64), dst_t, rnd or "rn").view(_uint(8 * np.dtype(dst_t).itemsize))
    if sat:
        info = np.iinfo(dst_t)
        iv = np.clip(iv, info.min, info.max)
    return np.asarray(iv).astype(dst_t).view(_uint(8 * np.dtype(dst_t).itemsize))


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


# --------------------------------------------------------------------------------------------------------------
# mma.sync: fragment maps (PTX ISA "Matrix fragments for mma.m16n8k*") and the multiply-accumulate
# --------------------------------------------------------------------------------------------------------------

#: bits per element of each PTX mma operand type
MMA_ELEMENT_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8, "s4": 4, "u4": 4,
                    "f32": 32, "s32": 32}


@functools.lru_cache(maxsize=None)
def _fragment_coords(shape, atype, btype, dtype, operand):
    """(row, col) arrays (32, elems) of an mma operand, read from the shared layout objects (mmaemit.layouts)."""
    from .. import isa
    from ..layouts import mma_fragment

    m, n, k = shape
    for ins in isa.MMA_TABLE:
        if (ins.m, ins.n, ins.k, ins.a_ptx, ins.b_ptx, ins.accum_ptx) == (m, n, k, atype, btype, dtype):
            t = mma_fragment(ins, operand).table()          # (32, regs, elems_per_reg, 2)
            t = t.reshape(32, -1, 2)
            return t[..., 0], t[..., 1]
    raise NotImplementedError(f"mma m{m}n{n}k{k} .{dtype}.{atype}.{btype} is not in mmaemit.isa.MMA_TABLE")


def mma_a_coords(shape, atype, btype, dtype):
    """(row, col) of every A element per lane: element j = register j // epr, bits (j % epr) * bits."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "A")


def mma_b_coords(shape, atype, btype, dtype):
    """(k, n) of every B element per lane."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "B")


def mma_c_coords(shape, atype, btype, dtype):
    """(row, col) of every accumulator element per lane (f16: two per register, low half first)."""
    return _fragment_coords(tuple(shape), atype, btype, dtype, "C")


def _unpack(regs, ptype):
    """Element values (float64 or int64) of registers (..., nregs) uint32 -> (..., nregs * epr)."""
    regs = np.asarray(regs).astype(np.uint32)
    bits = MMA_ELEMENT_BITS[ptype]
    epr = 32 // bits
    if ptype == "f32":
        return regs.view(np.float32).astype(np.float64)
    if ptype == "s32":
        return regs.view(np.int32).astype(np.int64)
    if ptype == "tf32":     # the mma reads the 19 tf32 bits: the low 13 significand bits are ignored
        return (regs & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    parts = [(regs >> np.uint32(e * bits)) & np.uint32((1 << bits) - 1) for e in range(epr)]
    elems = np.stack(parts, -1).reshape(regs.shape[:-1] + (regs.shape[-1] * epr,))
    if ptype == "f16":
        return _f16(elems.astype(np.uint16)).astype(np.float64)
    if ptype == "bf16":
        return _bf16(elems.astype(np.uint16)).astype(np.float64)
    if ptype in ("e4m3", "e5m2"):
        return decode_f8(elems, ptype)
    if ptype == "u8" or ptype == "u4":
        return elems.astype(np.int64)
    if ptype == "s8":
        return elems.astype(np.uint8).view(np.int8).astype(np.int64)
    if ptype == "s4":
        e = elems.astype(np.int64)
        return np.where(e >= 8, e - 16, e)
    raise NotImplementedError(f"mma element type .{ptype}")


def mma_sync(shape, atype, btype, ctype, dtype, a, b, c, *, satfinite: bool = False):
    """``mma.sync.aligned.<shape>.row.col{.satfinite}.<dtype>.<atype>.<btype>.<ctype> d, a, b, c`` for whole warps.

    ``a``, ``b``, ``c``: register bit patterns (W, 32, nregs) uint32 for W warps. Returns d (W, 32, nregs_d) uint32.
    Float accumulation: exact products, float64 sum, one rounding to ``dtype``. Integer: exact, wrap (or clamp with
    ``.satfinite``) to int32.
    """
    m, n, k = shape
    W = a.shape[0]
    key = (tuple(shape), atype, btype, dtype)
    ar, ac = mma_a_coords(*key)
    bk, bn = mma_b_coords(*key)
    cr, cc = mma_c_coords(*key)
    integer = dtype == "s32"
    acc_t = np.int64 if integer else np.float64
    A = np.zeros((W, m, k), acc_t)
    B = np.zeros((W, k, n), acc_t)
    A[:, ar, ac] = _unpack(a, atype)
    B[:, bk, bn] = _unpack(b, btype)
    if ctype == "f16":
        cvals = _f16(np.stack(split_b32(c), -1).reshape(W, 32, -1)).astype(np.float64)
    else:
        cvals = _unpack(c, ctype)
    C = np.zeros((W, m, n), acc_t)
    C[:, cr, cc] = cvals
    if integer:
        D = np.einsum("wmk,wkn->wmn", A, B) + C
        if satfinite:
            D = np.clip(D, -(2 ** 31), 2 ** 31 - 1)
        d = D[:, cr, cc].astype(np.int64).astype(np.uint64).astype(np.uint32)
        return d
    with np.errstate(all="ignore"):
        D = np.einsum("wmk,wkn->wmn", A, B) + C
    dvals = D[:, cr, cc]
    if dtype == "f32":
        return round_f64(dvals, 0.0, "f32")
    if dtype == "f16":
        h = round_f64(dvals, 0.0, "f16").reshape(W, 32, -1, 2)
        return pack_b32(h[..., 0], h[..., 1])
    raise NotImplementedError(f"mma accumulator .{dtype}")


# --------------------------------------------------------------------------------------------------------------
# ldmatrix / stmatrix (.m8n8 .b16) and shfl.sync
# --------------------------------------------------------------------------------------------------------------

def ldmatrix(mats, trans: bool = False):
    """``ldmatrix.sync.aligned.m8n8.x{num}{.trans}.shared.b16`` data movement.

    ``mats``: (..., num, 8, 8) uint16, matrix ``m`` row ``r`` being the 16 bytes at the row address of lane 8m+r.
    Returns registers (..., 32, num) uint32: lane l, register m holds row l//4, columns 2(l%4), 2(l%4)+1 of
    matrix m (low half first); with ``.trans`` the matrix is transposed first.
    """
    mats = np.asarray(mats).astype(np.uint16)
    if trans:
        mats = np.swapaxes(mats, -1, -2)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    lo = mats[..., r, c]            # (..., num, 32)
    hi = mats[..., r, c + 1]
    return np.swapaxes(pack_b32(lo, hi), -1, -2)


def stmatrix(regs, trans: bool = False):
    """Inverse of :func:`ldmatrix`: registers (..., 32, num) uint32 -> matrices (..., num, 8, 8) uint16 to be stored
    at the row addresses (matrix m row r at the address of lane 8m+r)."""
    regs = np.swapaxes(np.asarray(regs).astype(np.uint32), -1, -2)     # (..., num, 32)
    lo, hi = split_b32(regs)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    mats = np.zeros(regs.shape[:-1] + (8, 8), np.uint16)
    mats[..., r, c] = lo
    mats[..., r, c + 1] = hi
    if trans:
        mats = np.swapaxes(mats, -1, -2)
    return np.ascontiguousarray(mats)


def shfl(values, mode: str, b, c):
    """``shfl.sync.{up,down,bfly,idx}.b32 d|p, a, b, c, membermask`` for whole warps.

    ``values``: (W, 32, ...) source registers; ``b`` (lane or delta) and ``c`` (clamp in c[4:0], segment mask in
    c[12:8]) broadcastable to (W, 32). Returns (d, p): the shuffled values and the in-range predicate.
    """
    values = np.asarray(values)
    lane = np.arange(32)[None, :]
    b = np.broadcast_to(np.asarray(b).astype(np.int64), (values.shape[0], 32))
    c = np.broadcast_to(np.asarray(c).astype(np.int64), (values.shape[0], 32))
    bval, cval, segmask = b & 31, c & 31, (c >> 8) & 31
    max_lane = (lane & segmask) | (cval & ~segmask)
    min_lane = lane & segmask
    if mode == "up":
        j = lane - bval
        p = j >= max_lane
    elif mode == "down":
        j = lane + bval
        p = j <= max_lane
    elif mode == "bfly":
        j = lane ^ bval
        p = j <= max_lane
    elif mode == "idx":
        j = min_lane | (bval & ~segmask)
        p = j <= max_lane
    else:
        raise ValueError(mode)
    j = np.where(p, j, lane) & 31
    w = np.arange(values.shape[0])[:, None]
    return values[w, j], p
