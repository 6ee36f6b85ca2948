"""Packed weight element formats: ONE table, each entry with one documented meaning, bit-exact.

A *code* is the raw b-bit field as stored (0 .. 2^b - 1). ``Format.decode(codes)`` maps codes to real values
(float64); ``Format.encode(values)`` maps real values to the nearest code. Every value set below is computed from the
formula in its description (not copied from another library); the tests check each code against ``ml_dtypes``.

===================  ====  =====================================================================================
name                 bits  value of code q
===================  ====  =====================================================================================
uint1/2/4/8          b     q
int2/4/8             b     two's complement: q - 2^b if q >= 2^(b-1) else q   (int4: -8 .. 7)
int2_ob/4_ob/8_ob    b     offset binary (excess 2^(b-1), vLLM's "uint4b8"; BitBLAS's int2/int4): q - 2^(b-1)
int1                 1     2q - 1, i.e. code 0 -> -1, code 1 -> +1 (the value set is {-1, +1}; there is no 0)
nf4                  4     bitsandbytes' NF4 table (float32 values, listed in ``NF4_TABLE``), code 0 = -1.0, 7 = 0
float4_e2m1fn        4     OCP E2M1 ``s e1 e0 m``: e == 0 ? m/2 : 2^(e-1) (1 + m/2), sign (-1)^s;
                           magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}; no inf / NaN
float8_e4m3fn        8     OCP E4M3 (bias 7): e == 0 ? (m/8) 2^-6 : (1 + m/8) 2^(e-7); S.1111.111 (0x7F, 0xFF) = NaN;
                           no inf; max 448; 14 nonzero subnormals (m = 1..7, both signs)
float8_e5m2          8     OCP E5M2 (bias 15, IEEE-like): e == 0 ? (m/4) 2^-14 : (1 + m/4) 2^(e-15); e == 31: m == 0
                           -> inf, else NaN; max 57344
float8_e8m0fnu       8     OCP E8M0 scale: 2^(q - 127); 0xFF = NaN; no zero, no sign
mxfp4                4     elements are float4_e2m1fn; one float8_e8m0fnu scale per 32 elements along K (OCP MX)
nvfp4                4     elements are float4_e2m1fn; one float8_e4m3fn scale per 16 elements along K
===================  ====  =====================================================================================

Signed zero: float formats keep it (code 0x80 of e4m3 decodes to -0.0). ``encode`` saturates: finite values beyond
the largest magnitude become +-max; +-inf becomes +-inf where the format has it (e5m2) and +-max elsewhere; NaN
becomes the format's NaN code (formats without NaN reject it). Ties go to the even code (for the float formats
that is round-to-nearest-even); integer formats round half to even and clamp.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import ArgumentError, UnsupportedConfigError, choices

# bitsandbytes `bitsandbytes/functional.py::get_4bit_type("nf4")` (bitsandbytes-foundation/bitsandbytes), the values
# bitsandbytes stores as a float32 torch tensor (then divides by its abs-max, 1.0, which leaves them unchanged).
NF4_TABLE = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
], dtype=np.float32)


def _minifloat(code: int, exp_bits: int, man_bits: int, bias: int, special: str) -> float:
    """Value of one sign-exponent-mantissa code. ``special``: "none" (no inf/NaN), "fn" (all-ones = NaN),
    "ieee" (exponent all ones: inf if mantissa 0 else NaN)."""
    s = (code >> (exp_bits + man_bits)) & 1
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    sign = -1.0 if s else 1.0
    emax = (1 << exp_bits) - 1
    if special == "fn" and e == emax and m == (1 << man_bits) - 1:
        return float("nan")
    if special == "ieee" and e == emax:
        return sign * float("inf") if m == 0 else float("nan")
    if e == 0:
        return sign * (m / (1 << man_bits)) * 2.0 ** (1 - bias)
    return sign * (1.0 + m / (1 << man_bits)) * 2.0 ** (e - bias)


def _values(kind: str, bits: int, storage: str) -> tuple:
    n = 1 << bits
    if kind == "uint":
        return tuple(float(q) for q in range(n))
    if storage == "twos_complement":
        return tuple(float(q - n if q >= n // 2 else q) for q in range(n))
    if storage == "offset_binary":
        return tuple(float(q - n // 2) for q in range(n))
    if storage == "plus_minus_one":
        return (-1.0, 1.0)
    raise AssertionError(storage)


@dataclass(frozen=True)
class Format:
    """One element format. ``values[q]`` is the exact value of code ``q`` (float64; NaN / inf where the format has
    them). ``kind``: "uint" | "int" | "float" | "lut". ``scale_format`` / ``block_size`` are set for the block-scaled
    formats (mxfp4, nvfp4): their scales are codes of that format, one per ``block_size`` elements along K."""

    name: str
    bits: int
    kind: str
    signed: bool
    storage: str
    description: str
    values: tuple = field(repr=False)
    scale_format: str | None = None
    block_size: int | None = None
    nan_code: int | None = None

    @cached_property
    def table(self) -> np.ndarray:
        return np.array(self.values, dtype=np.float64)

    @property
    def is_integer(self) -> bool:
        return self.kind in ("uint", "int")

    @property
    def max_value(self) -> float:
        t = self.table
        return float(np.max(np.abs(t[np.isfinite(t)])))

    def _check_codes(self, codes):
        lo, hi = int(codes.min()), int(codes.max())
        if lo < 0 or hi >= (1 << self.bits):
            raise ArgumentError(f"{self.name} codes must lie in [0, {(1 << self.bits) - 1}], got [{lo}, {hi}]")

    def decode(self, codes):
        """Codes (integer numpy array or torch tensor, any device) -> float64 values of the same shape and kind."""
        if _is_torch(codes):
            import torch

            if codes.dtype.is_floating_point or codes.dtype == torch.bool:
                raise ArgumentError(f"codes must be an integer tensor, got {codes.dtype}")
            if codes.numel():
                self._check_codes(codes)
            return torch.as_tensor(self.table, device=codes.device)[codes.long()]
        codes = np.asarray(codes)
        if not np.issubdtype(codes.dtype, np.integer):
            raise ArgumentError(f"codes must be an integer array, got {codes.dtype}")
        if codes.size:
            self._check_codes(codes)
        return self.table[codes.astype(np.int64)]

    def encode(self, values):
        """Real values (numpy array or torch tensor) -> nearest codes (uint8, same kind/device), see module doc."""
        if _is_torch(values):
            import torch

            v = values.to(torch.float64)
            return _encode(self, v, torch).to(torch.uint8)
        return _encode(self, np.asarray(values, dtype=np.float64), np).astype(np.uint8)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _round_half_even(xp, x):
    return xp.round(x)  # numpy and torch both round half to even


def _encode(fmt: Format, v, xp):
    n = 1 << fmt.bits
    isnan = xp.isnan(v)
    if fmt.kind in ("uint", "int"):
        if bool(isnan.any()):
            raise ArgumentError(f"cannot encode NaN as {fmt.name}")
        if fmt.storage == "plus_minus_one":
            return xp.where(v >= 0, 1, 0)
        lo, hi = fmt.table.min(), fmt.table.max()
        r = xp.clip(_round_half_even(xp, v), lo, hi)
        if fmt.storage == "twos_complement":
            r = xp.where(r < 0, r + n, r)
        elif fmt.storage == "offset_binary":
            r = r + n // 2
        return r
    # float / lut: nearest entry of the finite, sorted positive half (sign-magnitude formats) or whole table (nf4)
    if fmt.kind == "lut":
        codes_sorted = np.arange(n)
        mags = fmt.table
        mag_in = v
    else:
        half = n // 2 if fmt.signed else n
        pos = fmt.table[:half]
        keep = np.isfinite(pos)
        codes_sorted = np.arange(half)[keep]
        mags = pos[keep]
        mag_in = xp.abs(v) if fmt.signed else v
    if bool(isnan.any()) and fmt.nan_code is None:
        raise ArgumentError(f"cannot encode NaN as {fmt.name} (it has no NaN)")
    mag_in = xp.where(isnan, 0.0, mag_in)
    if xp is np:
        mags_x = mags
        codes_x = codes_sorted
        idx = np.searchsorted(mags_x, mag_in)
    else:
        mags_x = xp.as_tensor(mags, device=v.device)
        codes_x = xp.as_tensor(codes_sorted, device=v.device)
        idx = xp.searchsorted(mags_x, mag_in.contiguous())
    last = len(mags) - 1
    hi_i = xp.clip(idx, 0, last)
    lo_i = xp.clip(idx - 1, 0, last)
    d_hi = xp.abs(mags_x[hi_i] - mag_in)
    d_lo = xp.abs(mag_in - mags_x[lo_i])
    c_hi, c_lo = codes_x[hi_i], codes_x[lo_i]
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (c_hi % 2 == 0))
    code = xp.where(pick_hi, c_hi, c_lo)
    if fmt.kind == "float" and fmt.signed:
        neg = xp.signbit(v)
        code = code + xp.where(neg, n // 2, 0)
    inf_codes = np.flatnonzero(np.isposinf(fmt.table))
    if inf_codes.size:
        code = xp.where(xp.isinf(v), int(inf_codes[0]) + xp.where(xp.signbit(v), n // 2, 0), code)
    if fmt.nan_code is not None:
        code = xp.where(isnan, fmt.nan_code, code)
    return code


def _make_table() -> dict:
    t = {}

    def add(**kw):
        t[kw["name"]] = Format(**kw)

    for b in (1, 2, 4, 8):
        add(name=f"uint{b}", bits=b, kind="uint", signed=False, storage="unsigned",
            description=f"unsigned integer: value = q in [0, {(1 << b) - 1}]", values=_values("uint", b, "unsigned"))
    for b in (2, 4, 8):
        add(name=f"int{b}", bits=b, kind="int", signed=True, storage="twos_complement",
            description=f"two's complement: value = q - {1 << b} if q >= {1 << (b - 1)} else q",
            values=_values("int", b, "twos_complement"))
        add(name=f"int{b}_ob", bits=b, kind="int", signed=True, storage="offset_binary",
            description=f"offset binary (excess-{1 << (b - 1)}): value = q - {1 << (b - 1)}",
            values=_values("int", b, "offset_binary"))
    add(name="int1", bits=1, kind="int", signed=True, storage="plus_minus_one",
        description="value = 2q - 1: code 0 -> -1, code 1 -> +1 (value set {-1, +1})",
        values=_values("int", 1, "plus_minus_one"))
    add(name="nf4", bits=4, kind="lut", signed=True, storage="table",
        description="bitsandbytes NF4: value = NF4_TABLE[q] (float32 values)",
        values=tuple(float(x) for x in NF4_TABLE))
    e2m1 = tuple(_minifloat(q, 2, 1, 1, "none") for q in range(16))
    add(name="float4_e2m1fn", bits=4, kind="float", signed=True, storage="sign_magnitude",
        description="OCP E2M1: e == 0 ? m/2 : 2^(e-1)(1+m/2), sign (-1)^s", values=e2m1)
    add(name="float8_e4m3fn", bits=8, kind="float", signed=True, storage="sign_magnitude", nan_code=0x7F,
        description="OCP E4M3 (bias 7, no inf, 0x7F/0xFF NaN, max 448)",
        values=tuple(_minifloat(q, 4, 3, 7, "fn") for q in range(256)))
    add(name="float8_e5m2", bits=8, kind="float", signed=True, storage="sign_magnitude", nan_code=0x7E,
        description="OCP E5M2 (bias 15, inf 0x7C/0xFC, NaN e=31 m!=0, max 57344)",
        values=tuple(_minifloat(q, 5, 2, 15, "ieee") for q in range(256)))
    add(name="float8_e8m0fnu", bits=8, kind="float", signed=False, storage="exponent", nan_code=0xFF,
        description="OCP E8M0 scale: 2^(q-127), 0xFF NaN",
        values=tuple(float("nan") if q == 255 else 2.0 ** (q - 127) for q in range(256)))
    add(name="mxfp4", bits=4, kind="float", signed=True, storage="sign_magnitude", scale_format="float8_e8m0fnu",
        block_size=32, description="OCP MXFP4: E2M1 elements, one E8M0 scale per 32 elements", values=e2m1)
    add(name="nvfp4", bits=4, kind="float", signed=True, storage="sign_magnitude", scale_format="float8_e4m3fn",
        block_size=16, description="NVFP4: E2M1 elements, one E4M3 scale per 16 elements", values=e2m1)
    return t


#: THE format table: canonical name -> Format.
FORMATS: dict = _make_table()

_ALIASES = {
    "u1": "uint1", "u2": "uint2", "u4": "uint4", "u8": "uint8",
    "s2": "int2", "s4": "int4", "s8": "int8", "i2": "int2", "i4": "int4", "i8": "int8",
    "uint2b2": "int2_ob", "uint4b8": "int4_ob", "uint8b128": "int8_ob",
    "int2_offset_binary": "int2_ob", "int4_offset_binary": "int4_ob", "int8_offset_binary": "int8_ob",
    "fp4": "float4_e2m1fn", "e2m1": "float4_e2m1fn", "fp4_e2m1": "float4_e2m1fn", "float4_e2m1": "float4_e2m1fn",
    "e4m3": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3": "float8_e4m3fn",
    "e5m2": "float8_e5m2", "fp8_e5m2": "float8_e5m2",
    "e8m0": "float8_e8m0fnu", "fp8_e8m0": "float8_e8m0fnu",
}


def get_format(name) -> Format:
    """The Format for a canonical name, an alias (``"fp4"``, ``"e4m3"``, ``"uint4b8"`` ...) or a Format."""
    if isinstance(name, Format):
        return name
    key = str(name).replace("torch.", "")
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise UnsupportedConfigError(f"unknown weight format {name!r}; valid: {choices(FORMATS)}")
    return FORMATS[key]
