"""The numpy instruction semantics the decode programs run on, each checked against its PTX ISA definition written
out independently here (Python integers, exact fractions, ml_dtypes)."""
from fractions import Fraction

import ml_dtypes as md
import numpy as np
import pytest

from mmaemit.dequant import regops as R

rng = np.random.default_rng(17)
U32 = rng.integers(0, 2 ** 32, 2000, dtype=np.uint64).astype(np.uint32)


def test_shifts_and_bit_field_extract():
    a = U32
    for n in (0, 1, 4, 16, 31, 32, 40):
        assert [int(x) for x in R.shr(a, n)] == [(int(x) >> n) if n < 32 else 0 for x in a]
        assert [int(x) for x in R.shl(a, n)] == [((int(x) << n) & 0xFFFFFFFF) if n < 32 else 0 for x in a]
    for pos, ln in ((0, 1), (3, 1), (4, 4), (28, 4), (24, 8), (0, 32), (13, 7)):
        want_u = [(int(x) >> pos) & ((1 << ln) - 1) for x in a]
        want_s = [(v - (1 << ln) if v >> (ln - 1) else v) & 0xFFFFFFFF for v in want_u]
        assert [int(x) for x in R.bfe_u32(a, pos, ln)] == want_u
        assert [int(x) for x in R.bfe_s32(a, pos, ln)] == want_s


def test_prmt_with_a_register_selector_equals_the_byte_rule():
    a, b = U32[:500], U32[500:1000]
    sel = U32[1000:1500]
    got = R.prmt(a, b, sel)
    for x, y, c, d in zip(a.tolist(), b.tolist(), sel.tolist(), got.tolist()):
        src = [(x >> (8 * j)) & 0xFF for j in range(4)] + [(y >> (8 * j)) & 0xFF for j in range(4)]
        want = 0
        for j in range(4):
            nib = (c >> (4 * j)) & 0xF
            byte = src[nib & 7]
            if nib & 8:
                byte = 0xFF if byte & 0x80 else 0
            want |= byte << (8 * j)
        assert d == want
    # an immediate selector behaves as the same value in a register
    assert np.array_equal(R.prmt(a, b, 0x3120), R.prmt(a, b, np.full(a.shape, 0x3120, np.uint32)))


def test_set_mov_and_integer_to_float():
    a = U32 % 7
    assert np.array_equal(R.set_cmp("eq", a, 3), np.where(a == 3, 0xFFFFFFFF, 0).astype(np.uint32))
    lo, hi = R.mov_unpack(U32)
    assert np.array_equal(lo | (hi << 16), U32) and lo.max() <= 0xFFFF and hi.max() <= 0xFFFF
    small = U32 % (1 << 24)
    assert np.array_equal(R.cvt_f32_u32(small).view(np.float32), small.astype(np.float32))
    h = (U32 & 0xFFFF).astype(np.uint16)
    with np.errstate(invalid="ignore"):
        f = R.cvt_f32_f16(h).view(np.float32)
        want = h.view(np.float16).astype(np.float32)
    assert np.array_equal(np.isnan(f), np.isnan(want)) and np.array_equal(f[~np.isnan(f)], want[~np.isnan(want)])


def test_cvt_e4m3x2_is_the_ml_dtypes_value_low_byte_first():
    a = np.arange(1 << 16, dtype=np.uint32)
    got = R.cvt_f16x2_e4m3x2(a)
    lo = (a & 0xFF).astype(np.uint8).view(md.float8_e4m3fn).astype(np.float16)
    hi = (a >> 8).astype(np.uint8).view(md.float8_e4m3fn).astype(np.float16)
    for g, w in ((got & 0xFFFF, lo), (got >> 16, hi)):
        gv = g.astype(np.uint16).view(np.float16)
        nan = np.isnan(w)
        assert np.array_equal(np.isnan(gv), nan)
        assert np.array_equal(g.astype(np.uint16)[~nan], w.view(np.uint16)[~nan])


def _f32_neighbours(x: Fraction):
    """(largest float32 <= x, smallest float32 >= x), by bisection over the ordered bit patterns."""
    def val(bits):
        return Fraction(float(np.uint32(bits).view(np.float32)))

    def key(i):          # ordered index -> bit pattern of the float32 (negatives descend)
        return (i if i >= 0 else (0x80000000 | -i))
    lo, hi = -0x7F800000, 0x7F800000
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if val(key(mid)) <= x:
            lo = mid
        else:
            hi = mid
    down = val(key(lo))
    return (key(lo), key(lo) if down == x else key(hi))


def _exact_round_f32(x: Fraction, rnd: str) -> int:
    bits = _round_f32_magnitude(x, rnd)
    return 0x80000000 if bits == 0 and x < 0 else bits      # a negative value rounded to zero is -0


def _round_f32_magnitude(x: Fraction, rnd: str) -> int:
    d, u = _f32_neighbours(x)
    vd, vu = (Fraction(float(np.uint32(b).view(np.float32))) for b in (d, u))
    if d == u:
        return d
    if rnd == "rz":
        return d if x > 0 else u
    if rnd == "rm":
        return d
    if rnd == "rp":
        return u
    if x - vd != vu - x:
        return d if x - vd < vu - x else u
    return d if d % 2 == 0 else u


@pytest.mark.parametrize("rnd", ["rn", "rz", "rm", "rp"])
def test_fma_f32_rounds_the_exact_value_once_in_each_direction(rnd):
    n = 300
    mags = 2.0 ** rng.integers(-140, 60, (3, n))
    a, b, c = (rng.uniform(-1, 1, (3, n)) * mags).astype(np.float32)
    c[: n // 4] = -(a[: n // 4].astype(np.float64) * b[: n // 4]).astype(np.float32)   # near cancellation
    got = R.fma_f32(R.f32_bits(a), R.f32_bits(b), R.f32_bits(c), rnd)
    for x, y, z, g in zip(a, b, c, got.tolist()):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        if exact == 0:
            continue
        assert g == _exact_round_f32(exact, rnd), (x, y, z, rnd)
    assert np.array_equal(R.mul_f32(R.f32_bits(a), R.f32_bits(b)),
                          R.fma_f32(R.f32_bits(a), R.f32_bits(b), R.f32_bits(np.float32(-0.0)), "rn"))


def test_fma_f32_signed_zero_and_overflow():
    one, m_one = R.f32_bits(np.float32(1)), R.f32_bits(np.float32(-1))
    assert R.fma_f32(one, one, m_one, "rn") == 0 and R.fma_f32(one, one, m_one, "rm") == 0x80000000
    big = R.f32_bits(np.float32(3e38))
    assert R.fma_f32(big, R.f32_bits(np.float32(2)), 0, "rn") == 0x7F800000      # inf
    assert R.fma_f32(big, R.f32_bits(np.float32(2)), 0, "rz") == 0x7F7FFFFF      # FLT_MAX
    assert R.fma_f32(big, R.f32_bits(np.float32(2)), 0, "rp") == 0x7F800000


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cvt_pack_rounds_each_float32_to_nearest_even(dtype):
    t = {"float16": np.float16, "bfloat16": md.bfloat16}[dtype]
    x = (rng.uniform(-1, 1, 600) * 2.0 ** rng.integers(-30 if dtype == "float16" else -140, 17, 600)).astype(
        np.float32)
    got = R.cvt_pack_f32(R.f32_bits(x[:300]), R.f32_bits(x[300:]), dtype)
    # one correct rounding of a float32 is what the numpy / ml_dtypes cast does (overflow -> inf included)
    with np.errstate(over="ignore"):
        assert np.array_equal(got & 0xFFFF, x[300:].astype(t).view(np.uint16))
        assert np.array_equal(got >> 16, x[:300].astype(t).view(np.uint16))
