"""The register fast decode (bit-exact emulation) equals the reference dequantize for EVERY code of every integer
format, every mode, f16 and bf16; the emulated instructions are checked against their definitions."""
from fractions import Fraction

import ml_dtypes as md
import numpy as np
import pytest
import torch

from mmaemit.dequant import FORMATS, QuantScheme, dequantize_codes, get_format, interleave, pack, pack_zeros
from mmaemit.dequant import fastdecode_reference as fd
from mmaemit.errors import ArgumentError, UnsupportedConfigError

NP = {"float16": np.float16, "bfloat16": md.bfloat16}
CASES = [(f, d, m, "shift") for (f, d), modes in sorted(fd.FAST_PATHS.items()) for m in modes] + \
        [(f, "float16", m, "marlin") for f in ("uint4", "int4", "int4_ob") for m in fd.fast_path_modes(f, "float16")]


def _words(codes, bits):
    plain = pack(codes.astype(np.uint8), bits, axis=-1, storage="int32")[:, 0]
    return interleave(plain, bits).view(np.uint32)


def _exhaustive_codes(bits, with_zeros):
    """Rows of E codes such that every code (or every (code, zero) pair) occurs in every slot; rows padded to 32."""
    n, e = 1 << bits, 32 // bits
    rows = n * n if with_zeros else n
    r = np.arange(rows)[:, None]
    s = np.arange(e)[None, :]
    q = (r % n + s) % n
    z = (r // n + s) % n if with_zeros else None
    total = rows + (-rows) % 32
    q = np.resize(q, (total, e))
    z = None if z is None else np.resize(z, (total, e))
    return q, z


def _bits_of(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.view(torch.int16).numpy().view(np.uint16)
    return np.asarray(x).view(np.uint16)


@pytest.mark.parametrize("fmt,dtype,mode,variant", CASES)
def test_fast_decode_equals_reference_for_every_code(fmt, dtype, mode, variant):
    f = get_format(fmt)
    rng = np.random.default_rng(sum(map(ord, fmt + dtype + mode + variant)))
    q, zq = _exhaustive_codes(f.bits, mode == "quantized")
    shape = q.shape
    # scales of both signs over a wide exponent range (exercises rounding of the final fma)
    scale = (rng.uniform(0.5, 1.0, shape) * 2.0 ** rng.integers(-12, 6, shape) *
             rng.choice([-1, 1], shape)).astype(NP[dtype])
    kw, zref = {}, None
    if mode == "original":
        # integer zeros (GPTQ/AWQ) and eighths: w - z stays exact in the output dtype
        z = (rng.integers(0, 8 << f.bits, shape) / 8).astype(NP[dtype])
        if f.bits == 8 and dtype == "float16":
            z = rng.integers(0, 256, shape).astype(NP[dtype])
        kw, zref = {"zero": z}, torch.from_numpy(z.astype(np.float32))
    elif mode == "rescale":
        z = (rng.standard_normal(shape) * 2.0 ** rng.integers(-10, 8, shape)).astype(NP[dtype])
        kw, zref = {"zero": z}, torch.from_numpy(z.astype(np.float32))
    elif mode == "quantized":
        kw, zref = {"zero": zq}, pack_zeros(torch.from_numpy(zq.astype(np.uint8)), f.bits, "int32")
    words = _words(q, f.bits) if f.bits < 8 else pack(q.astype(np.uint8), 8, storage="int32")[:, 0].view(np.uint32)
    got = fd.fast_decode(words, fmt, dtype, mode, scale=None if mode == "none" else scale, variant=variant, **kw)
    # the reference: per-element scales/zeros = group size 1
    scheme = QuantScheme(fmt, None if mode == "none" else 1, None if mode in ("none", "scale") else mode)
    ref = dequantize_codes(torch.from_numpy(q.astype(np.uint8)), scheme,
                           None if mode == "none" else torch.from_numpy(scale.astype(np.float32)), zref,
                           out_dtype=dtype)
    gb, rb = _bits_of(got, dtype), _bits_of(ref, dtype)
    nan = np.isnan(np.asarray(got, np.float64))
    assert np.array_equal(nan, np.isnan(ref.to(torch.float64).numpy()))
    bad = (gb != rb) & ~nan
    assert not bad.any(), f"{bad.sum()} mismatches, first at {np.argwhere(bad)[0]}"


def test_every_integer_format_has_a_f16_fast_path_and_the_rest_is_documented():
    ints = [n for n, f in FORMATS.items() if f.kind in ("uint", "int")]
    for name in ints:
        assert "scale" in fd.fast_path_modes(name, "float16")
        assert ("quantized" in fd.fast_path_modes(name, "float16")) == name.startswith("uint")
        assert bool(fd.fast_path_modes(name, "bfloat16")) == (get_format(name).bits < 8)
    for name in ("nf4", "float4_e2m1fn", "mxfp4", "nvfp4", "float8_e4m3fn"):
        assert fd.fast_path_modes(name, "float16") == () and name in fd.__doc__  # documented as "no fast path"


def test_no_fast_path_raises_naming_valid_ones():
    with pytest.raises(UnsupportedConfigError, match="uint4/float16"):
        fd.fast_decode(np.zeros(4, np.uint32), "nf4", "float16")
    with pytest.raises(UnsupportedConfigError, match="uint8/float16"):
        fd.fast_decode(np.zeros(4, np.uint32), "uint8", "bfloat16")
    with pytest.raises(UnsupportedConfigError):
        fd.fast_decode(np.zeros(4, np.uint32), "int4", "float16", "quantized", scale=1.0, zero=0)
    with pytest.raises(UnsupportedConfigError, match="uint4, int4, int4_ob"):
        fd.fast_decode(np.zeros(4, np.uint32), "uint4", "bfloat16", variant="marlin")
    with pytest.raises(UnsupportedConfigError, match="marlin"):
        fd.fast_decode(np.zeros(4, np.uint32), "uint4", "float16", variant="lut")
    with pytest.raises(ArgumentError, match="needs scale"):
        fd.fast_decode(np.zeros(4, np.uint32), "uint4", "float16", "scale")
    with pytest.raises(ArgumentError, match="zero"):
        fd.fast_decode(np.zeros(4, np.uint32), "uint4", "float16", "quantized", scale=1.0, zero=16)


def test_quantized_one_add_trick_example_and_bf16_variant():
    # (1024 + 5) + (0xE400 | 3) = 2.0 exactly (the notes' example), and the bf16 analogue with 0x4300 / 0xC300
    x = np.uint32(0x6405)
    assert fd.split2(fd.add2(x, np.uint32(0xE403), "float16"), "float16")[0] == 2.0
    assert fd.split2(fd.add2(np.uint32(0x4305), np.uint32(0xC303), "bfloat16"), "bfloat16")[0] == 2.0
    assert fd.split2(fd.sub2(np.uint32(0x4305), np.uint32(0x4308), "bfloat16"), "bfloat16")[0] == -3.0


def test_folding_the_magic_into_the_scale_is_not_exact():
    """Precision rule: fma(1024 + q, s, -(1024 + z) * s) with the constant rounded to fp16 loses up to s/2; the
    emulated fast path (exact subtract first) never does. Find a counterexample over all (q, z)."""
    rng = np.random.default_rng(0)
    q, z = np.meshgrid(np.arange(16), np.arange(16), indexing="ij")
    q, z = q.ravel(), z.ravel()
    worst = 0.0
    for s in rng.uniform(0.01, 0.2, 20).astype(np.float16):
        x = fd.pack2(1024.0 + q, 1024.0 + q, "float16")
        const = np.float16(-(1024.0 + z) * np.float64(s))            # the folded constant, rounded to fp16
        folded = fd.split2(fd.fma2(x, fd.pack2(s, s, "float16"), fd.pack2(const, const, "float16"), "float16"),
                           "float16")[0]
        exact = (q - z) * np.float64(s)
        worst = max(worst, float(np.max(np.abs(folded - exact)) / s))
    assert worst > 0.25, worst  # off by a large fraction of a quantization step (the exhaustive test: exact)


def _exact_f16_round(v: Fraction, dtype):
    """Nearest value of dtype (ties to even bits) to an exact rational, by brute force over the finite values."""
    table = _FINITE[dtype]
    i = np.searchsorted(table[:, 0], float(v))
    best = None
    for j in (i - 2, i - 1, i, i + 1):
        if 0 <= j < len(table):
            d = abs(Fraction(table[j, 0]) - v)
            key = (d, table[j, 1] % 2)
            if best is None or key < best[0]:
                best = (key, table[j, 0])
    return best[1]


def _finite(dtype):
    with np.errstate(invalid="ignore"):
        bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        vals = bits.view(NP[dtype]).astype(np.float64)
    keep = np.isfinite(vals) & ~((vals == 0) & np.signbit(vals))
    order = np.argsort(vals[keep], kind="stable")
    return np.stack([vals[keep][order], bits[keep][order].astype(np.float64)], 1)


_FINITE = {d: _finite(d) for d in NP}


@pytest.mark.parametrize("dtype", sorted(NP))
def test_emulated_half2_arithmetic_is_correctly_rounded(dtype):
    rng = np.random.default_rng(11)
    n = 400
    mags = 2.0 ** rng.integers(-14 if dtype == "float16" else -60, 10, (3, n))
    a, b, c = (rng.uniform(-1, 1, (3, n)) * mags).astype(NP[dtype]).astype(np.float64)
    ra, rb, rc = (fd.pack2(x, x[::-1], dtype) for x in (a, b, c))
    fma_lo = fd.split2(fd.fma2(ra, rb, rc, dtype), dtype)[0]
    add_lo = fd.split2(fd.add2(ra, rc, dtype), dtype)[0]
    sub_lo = fd.split2(fd.sub2(ra, rc, dtype), dtype)[0]
    for i in range(n):
        fa, fb, fc = Fraction(a[i]), Fraction(b[i]), Fraction(c[i])
        for got, exact in ((fma_lo[i], fa * fb + fc), (add_lo[i], fa + fc), (sub_lo[i], fa - fc)):
            if exact != 0:
                assert got == _exact_f16_round(exact, dtype), (a[i], b[i], c[i])


def test_bf16_fma_with_a_tiny_addend_is_not_double_rounded():
    # 13 * 29 = 377 is a bf16 midpoint (376 | 378); + 2^-133 must round up. Rounding fl64(377 + 2^-133) = 377
    # would tie to even (376): the emulation carries the exact TwoSum error to avoid that.
    tiny = np.uint32(0x0001)  # smallest bf16 subnormal, 2^-133
    r = fd.fma2(fd.pack2(13.0, 13.0, "bfloat16"), fd.pack2(29.0, -29.0, "bfloat16"),
                tiny | (tiny << np.uint32(16)), "bfloat16")
    lo, hi = fd.split2(r, "bfloat16")
    assert lo[()] == 378.0 and hi[()] == -376.0


def test_lop3_and_prmt_follow_their_definitions():
    rng = np.random.default_rng(5)
    a, b, c = rng.integers(0, 2**32, (3, 1000), dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(fd.lop3(a, b, c, 0xEA), (a & b) | c)
    assert np.array_equal(fd.lop3(a, b, c, 0x6A), (a & b) ^ c)
    assert np.array_equal(fd.lop3(a, b, c, 0x3C), a ^ b)
    assert np.array_equal(fd.lop3(a, b, c, 0x96), a ^ b ^ c)
    # prmt: 0x3210 is the identity on a, 0x7654 selects b, 0x0123 reverses a's bytes, 0x8 replicates a's byte-0 sign
    assert np.array_equal(fd.prmt(a, b, 0x3210), a) and np.array_equal(fd.prmt(a, b, 0x7654), b)
    assert np.array_equal(fd.prmt(a, b, 0x0123), a.byteswap())
    sign = np.where(a & 0x80, 0xFF, 0).astype(np.uint32)
    assert np.array_equal(fd.prmt(a, b, 0x8888), sign * 0x01010101)
    assert np.array_equal(fd.shr(a, 7), a >> 7)
