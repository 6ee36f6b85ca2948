"""Formats: every code of every format against ml_dtypes (independent), the OCP edge cases, encode, rounding."""
from statistics import NormalDist

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mmaemit.dequant import FORMATS, NF4_TABLE, get_format
from mmaemit.dequant.rounding import round_np, round_torch
from mmaemit.errors import ArgumentError, UnsupportedConfigError


def _all_codes(bits):
    return np.arange(1 << bits, dtype=np.uint8)


def _same(a, b):
    """Equal as values, NaN where the other is NaN, and with the same sign of zero."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.array_equal(np.isnan(a), np.isnan(b))
    m = ~np.isnan(a)
    assert np.array_equal(a[m], b[m])
    assert np.array_equal(np.signbit(a[m]), np.signbit(b[m]))


# ml_dtypes stores sub-byte types one per byte and reads the low bits: view the codes directly.
ML = {"uint1": md.uint1, "uint2": md.uint2, "uint4": md.uint4, "uint8": np.uint8, "int2": md.int2, "int4": md.int4,
      "int8": np.int8, "float4_e2m1fn": md.float4_e2m1fn, "mxfp4": md.float4_e2m1fn, "nvfp4": md.float4_e2m1fn,
      "float8_e4m3fn": md.float8_e4m3fn, "float8_e5m2": md.float8_e5m2, "float8_e8m0fnu": md.float8_e8m0fnu}


@pytest.mark.parametrize("name", sorted(ML))
def test_every_code_matches_ml_dtypes(name):
    f = get_format(name)
    codes = _all_codes(f.bits)
    _same(f.decode(codes), codes.view(ML[name]).astype(np.float64))
    _same(f.decode(torch.from_numpy(codes)).numpy(), codes.view(ML[name]).astype(np.float64))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_offset_binary_is_twos_complement_with_flipped_sign_bit(bits):
    codes = _all_codes(bits)
    tc = {2: md.int2, 4: md.int4, 8: np.int8}[bits]
    flipped = (codes ^ (1 << (bits - 1))).astype(np.uint8)
    _same(get_format(f"int{bits}_ob").decode(codes), flipped.view(tc).astype(np.float64))
    assert get_format(f"uint{bits}b{1 << (bits - 1)}").name == f"int{bits}_ob"


def test_int1_is_plus_minus_one_not_ml_dtypes_int1():
    f = get_format("int1")
    assert list(f.decode(np.array([0, 1]))) == [-1.0, 1.0]
    _same(f.decode(_all_codes(1)), 2 * _all_codes(1).view(md.uint1).astype(np.float64) - 1)
    # ml_dtypes' int1 is two's complement {0, -1}: a different (documented) choice
    assert list(np.array([0, 1], np.uint8).view(md.int1).astype(int)) == [0, -1]


def test_e4m3_edge_cases():
    f = get_format("e4m3")
    v = f.decode(_all_codes(8))
    assert v[0x00] == 0 and not np.signbit(v[0x00]) and v[0x80] == 0 and np.signbit(v[0x80])
    sub = [c for c in range(256) if (c >> 3) & 0xF == 0 and c & 7]
    assert len(sub) == 14
    for c in sub:
        assert v[c] == (-1) ** (c >> 7) * (c & 7) * 2.0 ** -9
    assert v[0x7E] == 448 and v[0xFE] == -448
    assert set(np.flatnonzero(np.isnan(v))) == {0x7F, 0xFF}
    assert not np.isinf(v).any()
    assert np.nanmax(np.abs(v)) == 448


def test_e5m2_edge_cases():
    f = get_format("e5m2")
    v = f.decode(_all_codes(8))
    assert v[0x7C] == np.inf and v[0xFC] == -np.inf
    assert set(np.flatnonzero(np.isnan(v))) == {0x7D, 0x7E, 0x7F, 0xFD, 0xFE, 0xFF}
    assert v[0x7B] == 57344 and v[0x01] == 2.0 ** -16 and np.signbit(v[0x80])
    # e5m2 is the top byte of an fp16: the property the prmt fast path relies on
    as_f16 = (_all_codes(8).astype(np.uint16) << 8).view(np.float16).astype(np.float64)
    _same(v, as_f16)


def test_e2m1_all_codes_and_e8m0():
    v = get_format("fp4").decode(_all_codes(4))
    _same(v, [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6])
    s = get_format("e8m0").decode(_all_codes(8))
    assert np.isnan(s[0xFF]) and s[127] == 1.0 and s[0] == 2.0 ** -127 and s[254] == 2.0 ** 127
    assert get_format("mxfp4").scale_format == "float8_e8m0fnu" and get_format("mxfp4").block_size == 32
    assert get_format("nvfp4").scale_format == "float8_e4m3fn" and get_format("nvfp4").block_size == 16


def test_nf4_is_bitsandbytes_table():
    f = get_format("nf4")
    assert f.table.dtype == np.float64 and np.array_equal(f.table, NF4_TABLE.astype(np.float64))
    assert NF4_TABLE.dtype == np.float32 and NF4_TABLE[7] == 0 and NF4_TABLE[0] == -1 and NF4_TABLE[15] == 1
    # independent reconstruction (bitsandbytes create_normal_map, offset 0.9677083): 8 positive quantiles of N(0,1)
    # from a 9-point grid, 7 negative from an 8-point grid, plus 0, normalised by the max
    nd, off = NormalDist(), 0.9677083
    pos = [nd.inv_cdf(p) for p in np.linspace(off, 0.5, 9)[:-1]]
    neg = [-nd.inv_cdf(p) for p in np.linspace(off, 0.5, 8)[:-1]]
    v = np.array(sorted(pos + [0.0] + neg))
    v /= v.max()
    assert np.abs(v - f.table).max() < 2e-7


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_encode_decode_round_trip_every_code(name):
    f = get_format(name)
    codes = _all_codes(f.bits)
    vals = f.decode(codes)
    keep = ~np.isnan(vals)
    assert np.array_equal(f.encode(vals[keep]), codes[keep])
    assert np.array_equal(f.encode(torch.from_numpy(vals[keep])).numpy(), codes[keep])


@pytest.mark.parametrize("name,ml", [("e4m3", md.float8_e4m3fn), ("e5m2", md.float8_e5m2),
                                     ("fp4", md.float4_e2m1fn)])
def test_encode_is_round_to_nearest_even_like_ml_dtypes(name, ml):
    f = get_format(name)
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(20000) * f.max_value / 3).astype(np.float32)
    x = x[np.abs(x) <= f.max_value]
    # also exact midpoints between neighbours (the tie cases)
    t = np.sort(np.unique(np.abs(f.table[np.isfinite(f.table)])))
    mids = ((t[1:] + t[:-1]) / 2).astype(np.float32)
    x = np.concatenate([x, mids, -mids])
    assert np.array_equal(f.encode(x), x.astype(ml).view(np.uint8) & ((1 << f.bits) - 1))


def test_encode_saturates_and_handles_nan():
    e4 = get_format("e4m3")
    assert list(e4.encode(np.array([1e6, -1e6, np.inf, np.nan]))) == [0x7E, 0xFE, 0x7E, 0x7F]
    assert list(get_format("e5m2").encode(np.array([1e9, -np.inf, np.nan]))) == [0x7B, 0xFC, 0x7E]
    with pytest.raises(ArgumentError, match="NaN"):
        get_format("fp4").encode(np.array([np.nan]))
    assert list(get_format("int4").encode(np.array([-9.0, -8.0, 2.5, 3.5, 100.0]))) == [8, 8, 2, 4, 7]
    assert list(get_format("int4_ob").encode(np.array([-8.0, 0.0, 7.0]))) == [0, 8, 15]
    assert list(get_format("int1").encode(np.array([-0.3, 0.0, 2.0]))) == [0, 1, 1]


def test_nf4_encode_is_nearest():
    f = get_format("nf4")
    x = np.random.default_rng(2).uniform(-1.2, 1.2, 5000)
    brute = np.argmin(np.abs(x[:, None] - NF4_TABLE[None, :].astype(np.float64)), axis=1)
    assert np.array_equal(f.encode(x), brute)


def test_bad_inputs_raise_typed_errors():
    with pytest.raises(UnsupportedConfigError, match="uint4"):
        get_format("int3")
    with pytest.raises(ArgumentError, match=r"\[0, 15\]"):
        get_format("uint4").decode(np.array([16]))
    with pytest.raises(ArgumentError, match="integer"):
        get_format("uint4").decode(np.array([1.0]))
    with pytest.raises(ArgumentError, match="integer"):
        get_format("uint4").decode(torch.tensor([1.0]))


@pytest.mark.parametrize("dtype,np_dtype", [("float16", np.float16), ("bfloat16", md.bfloat16)])
def test_rounding_is_single_correct_rounding(dtype, np_dtype):
    with np.errstate(invalid="ignore"):
        all_vals = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np_dtype).astype(np.float64)
    finite = np.unique(all_vals[np.isfinite(all_vals)])
    rng = np.random.default_rng(3)
    i = rng.integers(0, finite.size - 1, 4000)
    lo, hi = finite[i], finite[i + 1]
    mid = (lo + hi) / 2
    # exact midpoints and values a hair off them (where a double rounding through float32 goes wrong)
    eps = np.abs(mid) * 2.0 ** -40
    x = np.concatenate([mid, mid + eps, mid - eps, lo + (hi - lo) * rng.random(4000)])
    got = round_np(x, dtype).astype(np.float64)
    # brute force nearest, ties to the even bit pattern
    j = np.searchsorted(finite, x)
    a, b = finite[np.clip(j - 1, 0, None)], finite[np.clip(j, None, finite.size - 1)]
    da, db = np.abs(x - a), np.abs(b - x)
    b_even = (np.asarray(b).astype(np_dtype).view(np.uint16) % 2) == 0
    want = np.where((db < da) | ((db == da) & b_even), b, a)
    assert np.array_equal(got, want)
    assert np.array_equal(round_torch(torch.from_numpy(x), dtype).to(torch.float64).numpy(), want)
