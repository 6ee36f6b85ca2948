"""Bit-exact checks of mmaemit.ptx against independent references (Python integers, exact fractions,
ml_dtypes, and fragment coordinates transcribed by hand from the PTX ISA figures)."""
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from mmaemit import isa
from mmaemit import ptx

RNG = np.random.default_rng(1234)


def rand_u32(n):
    return RNG.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)


# ---------------------------------------------------------------------------------------------------------------------
# logic / permutes / shifts
# ---------------------------------------------------------------------------------------------------------------------

def test_lop3_matches_per_bit_truth_table():
    a, b, c = rand_u32(64), rand_u32(64), rand_u32(64)
    for lut in [0xEA, 0x96, 0xF8, 0x01, 0x80, 0xFE, 0x6A, int(RNG.integers(0, 256))]:
        got = ptx.lop3(a, b, c, lut)
        for i in range(0, 64, 7):
            want = 0
            for bit in range(32):
                idx = (((int(a[i]) >> bit) & 1) << 2) | (((int(b[i]) >> bit) & 1) << 1) | ((int(c[i]) >> bit) & 1)
                want |= ((lut >> idx) & 1) << bit
            assert int(got[i]) == want, (hex(lut), i)


def test_prmt_generic_form_selects_and_sign_replicates_bytes():
    a, b = rand_u32(200), rand_u32(200)
    c = RNG.integers(0, 2 ** 16, 200).astype(np.uint32)
    got = ptx.prmt(a, b, c)
    for i in range(200):
        src = (int(b[i]) << 32) | int(a[i])          # bytes 0-3 from a, 4-7 from b (PTX: {b, a})
        want = 0
        for k in range(4):
            sel = (int(c[i]) >> (4 * k)) & 0xF
            byte = (src >> (8 * (sel & 7))) & 0xFF
            if sel & 8:
                byte = 0xFF if byte & 0x80 else 0
            want |= byte << (8 * k)
        assert int(got[i]) == want
    # the classic byte-swap selector 0x0123 reverses a's bytes
    assert int(ptx.prmt(np.uint32(0x11223344), np.uint32(0), np.uint32(0x0123))) == 0x44332211


# prmt modes, copied from the PTX ISA table as "d.b3 d.b2 d.b1 d.b0" source bytes for c[1:0] = 0..3
_PRMT_TABLE = {"f4e": ["3210", "4321", "5432", "6543"], "b4e": ["5670", "6701", "7012", "0123"],
               "rc8": ["0000", "1111", "2222", "3333"], "ecl": ["3210", "3211", "3222", "3333"],
               "ecr": ["0000", "1110", "2210", "3210"], "rc16": ["1010", "3232", "1010", "3232"]}


@pytest.mark.parametrize("mode", sorted(_PRMT_TABLE))
def test_prmt_modes_follow_the_isa_table(mode):
    a, b = rand_u32(40), rand_u32(40)
    c = rand_u32(40)
    got = ptx.prmt(a, b, c, mode)
    for i in range(40):
        src = ((int(b[i]) << 32) | int(a[i])).to_bytes(8, "little")
        row = _PRMT_TABLE[mode][int(c[i]) & 3]
        want = bytes(src[int(ch)] for ch in reversed(row))      # d.b0 first
        assert int(got[i]) == int.from_bytes(want, "little")


def test_shf_and_shifts_against_python_integers():
    a, b = rand_u32(50), rand_u32(50)
    n = RNG.integers(0, 40, 50).astype(np.uint32)
    for i in range(50):
        wide = (int(b[i]) << 32) | int(a[i])
        assert int(ptx.shf(a[i], b[i], n[i], "l", "wrap")) == ((wide << (int(n[i]) % 32)) >> 32) & 0xFFFFFFFF
        assert int(ptx.shf(a[i], b[i], n[i], "r", "clamp")) == (wide >> min(int(n[i]), 32)) & 0xFFFFFFFF
        assert int(ptx.shl(a[i], n[i])) == ((int(a[i]) << int(n[i])) & 0xFFFFFFFF if n[i] < 32 else 0)
        assert int(ptx.shr(a[i], n[i])) == (int(a[i]) >> int(n[i]) if n[i] < 32 else 0)
        s = int(a[i]) - (1 << 32) if a[i] >= 2 ** 31 else int(a[i])
        assert int(ptx.shr(a[i], n[i], signed=True)) == (s >> min(int(n[i]), 32)) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------------------------------
# half-precision arithmetic: exact-fraction reference with round-to-nearest-even
# ---------------------------------------------------------------------------------------------------------------------

def _decode(bits, fmt):
    dt = np.float16 if fmt == "f16" else ml_dtypes.bfloat16
    with np.errstate(invalid="ignore"):
        return np.array([bits], np.uint16).view(dt).astype(np.float64)[0]


def _round_exact(fr, fmt):
    """Bits of the value of ``fmt`` nearest to the exact fraction ``fr`` (ties to even), by neighbour search."""
    dt = np.float16 if fmt == "f16" else ml_dtypes.bfloat16
    with np.errstate(over="ignore"):
        guess = int(np.array(float(fr)).astype(dt).view(np.uint16))
    best = None
    for cand in {(guess + d) & 0xFFFF for d in (-2, -1, 0, 1, 2)}:
        v = _decode(cand, fmt)
        if not np.isfinite(v):
            continue
        err = abs(Fraction(float(v)) - fr)
        key = (err, cand & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    maxv = _decode(0x7BFF if fmt == "f16" else 0x7F7F, fmt)
    ulp = maxv - _decode(0x7BFE if fmt == "f16" else 0x7F7E, fmt)
    if abs(fr) >= Fraction(float(maxv)) + Fraction(float(ulp)) / 2:
        return (0x7C00 if fmt == "f16" else 0x7F80) | (0x8000 if fr < 0 else 0)
    bits = best[1]
    if fr == 0 or bits & 0x7FFF == 0:     # keep the sign rules out of the comparison: compare zeros by value
        return bits & 0x7FFF
    return bits


def _rand_half_bits(n, fmt):
    bits = RNG.integers(0, 2 ** 16, 4 * n).astype(np.uint16)
    vals = np.array([_decode(b, fmt) for b in bits])
    ok = np.isfinite(vals) & (np.abs(vals) < (4.0 if fmt == "f16" else 1e30)) & (np.abs(vals) > 1e-30) | (vals == 0)
    bits = bits[ok][:n]
    # mix in values near 1 so that additions and fmas actually round
    near = (np.array(1.0 + RNG.standard_normal(n) * 0.3).astype(np.float16 if fmt == "f16" else ml_dtypes.bfloat16)
            .view(np.uint16))
    return np.where(RNG.random(n) < 0.5, bits, near)


@pytest.mark.parametrize("fmt", ["f16", "bf16"])
@pytest.mark.parametrize("op", ["add", "sub", "mul", "fma"])
def test_half2_arith_is_correctly_rounded(fmt, op):
    n = 300
    a, b, c = (_rand_half_bits(2 * n, fmt) for _ in range(3))
    pa, pb, pc = (ptx.pack_b32(x[:n], x[n:]) for x in (a, b, c))
    got = ptx.half_arith(op, fmt + "x2", pa, pb, pc if op == "fma" else None)
    lo, hi = ptx.split_b32(got)
    res = np.concatenate([lo, hi])
    for i in range(2 * n):
        x, y, z = (Fraction(float(_decode(v[i], fmt))) for v in (a, b, c))
        exact = {"add": x + y, "sub": x - y, "mul": x * y, "fma": x * y + z}[op]
        want = _round_exact(exact, fmt)
        r = int(res[i])
        if exact == 0 or want & 0x7FFF == 0:            # zero results: compare by value (signed zeros)
            assert r & 0x7FFF == 0, (op, fmt, i, hex(r))
        else:
            assert r == want, (op, fmt, i, hex(r), hex(want))


def test_half_arith_nan_and_scalar_forms():
    nan = np.uint16(0x7E01)
    assert int(ptx.half_arith("add", "f16", nan, np.uint16(0x3C00))) == ptx.canonical_nan("f16")
    one = np.uint16(0x3C00)
    assert int(ptx.half_arith("fma", "f16", one, one, one)) == 0x4000            # 1*1+1 = 2
    assert int(ptx.half_arith("add", "f16", np.uint16(0x3C00), np.uint16(0x3C00), sat=True)) == 0x3C00  # clamp 1.0


# ---------------------------------------------------------------------------------------------------------------------
# conversions
# ---------------------------------------------------------------------------------------------------------------------

def test_cvt_f32_to_f16x2_and_bf16x2_pack_a_high():
    a = RNG.standard_normal(500).astype(np.float32) * 1000
    b = RNG.standard_normal(500).astype(np.float32) * 1e-3
    d = ptx.cvt_f32_to_x2(a, b, "f16")
    assert np.array_equal((d >> 16).astype(np.uint16), a.astype(np.float16).view(np.uint16))
    assert np.array_equal((d & 0xFFFF).astype(np.uint16), b.astype(np.float16).view(np.uint16))
    d = ptx.cvt_f32_to_x2(a, b, "bf16")
    assert np.array_equal((d >> 16).astype(np.uint16), a.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal((d & 0xFFFF).astype(np.uint16), b.astype(ml_dtypes.bfloat16).view(np.uint16))


def test_cvt_rz_and_satfinite_and_relu():
    x = RNG.standard_normal(400).astype(np.float32) * 10
    d = ptx.cvt_f32_to_x2(x, x, "f16", rnd="rz")
    v = (d & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    assert np.all(np.abs(v) <= np.abs(x)) and np.all(np.sign(v) * np.sign(x) >= 0)
    nxt = np.nextafter(v.astype(np.float16), np.copysign(np.float16(np.inf), x.astype(np.float16))).astype(np.float64)
    assert np.all(np.abs(nxt) > np.abs(x))          # truncation: the next value away from zero overshoots
    big = np.array([1e6, -1e6], np.float32)
    sat = ptx.cvt_f32_to_x2(big, big, "f16", satfinite=True) & 0xFFFF
    assert list(sat.astype(np.uint16).view(np.float16)) == [65504.0, -65504.0]
    relu = ptx.cvt_f32_to_x2(np.float32(-3), np.float32(2), "f16", relu=True)
    assert int(relu) == 0x4000                    # hi: relu(-3) = 0, lo: 2.0


def test_cvt_rna_tf32_rounds_ties_away():
    x = np.concatenate([RNG.standard_normal(2000).astype(np.float32),
                        np.array([1 + 2 ** -11, -(1 + 2 ** -11), 1 + 3 * 2 ** -11, 3.0], np.float32)])
    got = ptx.cvt_tf32(x, "rna").view(np.float32).astype(np.float64)
    m, e = np.frexp(x.astype(np.float64))             # x = m * 2**e, 0.5 <= |m| < 1: 11 significant bits kept
    scaled = np.abs(m) * 2 ** 11
    want = np.sign(m) * np.floor(scaled + 0.5) * 2.0 ** (e - 11)
    assert np.array_equal(got, want)
    assert np.all((ptx.cvt_tf32(x, "rna") & 0x1FFF) == 0)


def _decode_e4m3(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return np.nan
    return s * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def _decode_e5m2(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 2) & 0x1F, b & 3
    if e == 31:
        return np.nan if m else s * np.inf
    return s * (m / 4 * 2.0 ** -14 if e == 0 else (1 + m / 4) * 2.0 ** (e - 15))


@pytest.mark.parametrize("fmt,decode", [("e4m3", _decode_e4m3), ("e5m2", _decode_e5m2)])
def test_cvt_f8x2_to_f16x2_every_byte_pair(fmt, decode):
    lo = np.arange(256, dtype=np.uint16)
    hi = np.roll(lo, 37)
    d = ptx.cvt_f8x2_to_f16x2(lo | (hi << 8), fmt)
    got_lo = (d & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
    got_hi = (d >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
    for i in range(256):
        for got, byte in ((got_lo[i], int(lo[i])), (got_hi[i], int(hi[i]))):
            want = decode(byte)
            assert (np.isnan(got) and np.isnan(want)) or got == want, (fmt, byte, got, want)


# ---------------------------------------------------------------------------------------------------------------------
# mma fragments: coordinates transcribed from the PTX ISA figures, then an end-to-end mma with independent packing
# ---------------------------------------------------------------------------------------------------------------------

def test_fragment_coordinates_match_isa_figures():
    r, c = ptx.mma_a_coords((16, 8, 16), "f16", "f16", "f32")           # f16 m16n8k16, lane 5: groupID 1, threadID_in_group 1
    assert list(zip(r[5], c[5])) == [(1, 2), (1, 3), (9, 2), (9, 3), (1, 10), (1, 11), (9, 10), (9, 11)]
    k, n = ptx.mma_b_coords((16, 8, 16), "f16", "f16", "f32")
    assert list(zip(k[5], n[5])) == [(2, 1), (3, 1), (10, 1), (11, 1)]
    r, c = ptx.mma_c_coords((16, 8, 16), "f16", "f16", "f32")
    assert list(zip(r[5], c[5])) == [(1, 2), (1, 3), (9, 2), (9, 3)]
    r, c = ptx.mma_a_coords((16, 8, 32), "s8", "s8", "s32")            # s8 m16n8k32, lane 6: groupID 1, threadID_in_group 2
    assert list(zip(r[6][::4], c[6][::4])) == [(1, 8), (9, 8), (1, 24), (9, 24)]
    assert list(c[6][:4]) == [8, 9, 10, 11]
    k, n = ptx.mma_b_coords((16, 8, 32), "s8", "s8", "s32")
    assert list(k[6]) == [8, 9, 10, 11, 24, 25, 26, 27] and set(n[6]) == {1}
    r, c = ptx.mma_a_coords((16, 8, 8), "tf32", "tf32", "f32")            # tf32 m16n8k8, lane 7: groupID 1, threadID_in_group 3
    assert list(zip(r[7], c[7])) == [(1, 3), (9, 3), (1, 7), (9, 7)]
    k, n = ptx.mma_b_coords((16, 8, 8), "tf32", "tf32", "f32")
    assert list(zip(k[7], n[7])) == [(3, 1), (7, 1)]
    r, c = ptx.mma_a_coords((16, 8, 64), "s4", "s4", "s32")            # s4 m16n8k64, lane 6
    assert (r[6][0], c[6][0], r[6][16], c[6][16], c[6][7]) == (1, 16, 1, 48, 23)


# (row, col) of element a_i / (k, n) of element b_i per lane, written out as the PTX ISA sections
# "Matrix Fragments for mma.m16n8k*" state them (g = groupID, t = threadID_in_group)
def _isa_a(shape, bits, g, t, i):
    m, n, k = shape
    if bits == 16 and k == 16:
        return g + 8 * (i in (2, 3, 6, 7)), t * 2 + (i & 1) + 8 * (i >= 4)
    if bits == 16 and k == 8:
        return g + 8 * (i >= 2), t * 2 + (i & 1)
    if bits == 32:
        return g + 8 * (i in (1, 3)), t + 4 * (i >= 2)
    if bits == 8 and k == 16:
        return g + 8 * (i >= 4), t * 4 + (i & 3)
    if bits == 8 and k == 32:
        return g + 8 * (not (i < 4 or 8 <= i < 12)), t * 4 + (i & 3) + 16 * (i >= 8)
    if bits == 4 and k == 32:
        return g + 8 * (i >= 8), t * 8 + (i & 7)
    if bits == 4 and k == 64:
        return g + 8 * (not (i < 8 or 16 <= i < 24)), t * 8 + (i & 7) + 32 * (i >= 16)
    raise AssertionError(shape)


def _isa_b(shape, bits, g, t, i):
    m, n, k = shape
    if bits == 16 and k == 16:
        return t * 2 + (i & 1) + 8 * (i >= 2), g
    if bits == 16 and k == 8:
        return t * 2 + i, g
    if bits == 32:
        return t + 4 * i, g
    if bits == 8 and k == 16:
        return t * 4 + i, g
    if bits == 8 and k == 32:
        return t * 4 + (i & 3) + 16 * (i >= 4), g
    if bits == 4 and k == 32:
        return t * 8 + i, g
    if bits == 4 and k == 64:
        return t * 8 + (i & 7) + 32 * (i >= 8), g
    raise AssertionError(shape)


def _pack(codes, shape, bits, which):
    """Registers (1, 32, nregs) uint32 holding the ``bits``-wide codes of matrix A [m, k] or B [k, n]."""
    m, n, k = shape
    nelem = (m * k if which == "A" else k * n) // 32
    epr = 32 // bits
    regs = np.zeros((1, 32, nelem // epr), np.uint64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(nelem):
            r, c = (_isa_a if which == "A" else _isa_b)(shape, bits, g, t, i)
            regs[0, lane, i // epr] |= np.uint64(int(codes[r, c]) & ((1 << bits) - 1)) << np.uint64((i % epr) * bits)
    return regs.astype(np.uint32)


_CODES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
          "float8_e5m2": ml_dtypes.float8_e5m2}


def _operand(dtype, shape):
    """(codes as unsigned ints, exact values as float64/int64) of a random operand."""
    if dtype in ("int8", "uint8", "int4", "uint4"):
        bits = 8 if dtype.endswith("8") else 4
        lo, hi = (-(1 << (bits - 1)), 1 << (bits - 1)) if dtype.startswith("int") else (0, 1 << bits)
        v = RNG.integers(lo, hi, shape)
        return v & ((1 << bits) - 1), v.astype(np.int64)
    if dtype == "float32":       # tf32 operands: values on the tf32 grid (the mma reads 19 of the 32 bits)
        f = RNG.standard_normal(shape).astype(np.float32)
        u = f.view(np.uint32) & np.uint32(0xFFFFE000)
        return u, u.view(np.float32).astype(np.float64)
    f = RNG.standard_normal(shape).astype(_CODES[dtype])
    return f.view(np.uint8 if f.dtype.itemsize == 1 else np.uint16), f.astype(np.float64)


@pytest.mark.parametrize("instr", [pytest.param(e, id=e.ptx()) for e in isa.MMA_TABLE])
def test_mma_sync_every_instruction_in_the_table(instr):
    shape = instr.shape
    acode, aval = _operand(instr.a_dtype, (16, instr.k))
    bcode, bval = _operand(instr.b_dtype, (instr.k, 8))
    a = _pack(acode, shape, instr.operand_bits, "A")
    b = _pack(bcode, shape, instr.operand_bits, "B")
    cregs = np.zeros((1, 32, instr.c_regs), np.uint32)
    if instr.is_integer:
        C = RNG.integers(-(2 ** 20), 2 ** 20, (16, 8)).astype(np.int32)
        cbits = C.view(np.uint32)
    elif instr.accum_dtype == "float16":
        C = RNG.standard_normal((16, 8)).astype(np.float16)
        cbits = C.view(np.uint16).astype(np.uint32)
    else:
        C = RNG.standard_normal((16, 8)).astype(np.float32)
        cbits = C.view(np.uint32)
    per_reg = 2 if instr.accum_dtype == "float16" else 1
    for lane in range(32):          # accumulator c_i: row g + 8 * (i >= 2), col 2t + (i & 1) (ISA)
        g, t = lane // 4, lane % 4
        for i in range(4):
            cregs[0, lane, i // per_reg] |= cbits[g + 8 * (i >= 2), 2 * t + (i & 1)] << np.uint32(16 * (i % per_reg))
    acc = instr.accum_ptx
    d = ptx.mma_sync(shape, instr.a_ptx, instr.b_ptx, acc, acc, a, b, cregs)
    D = np.zeros((16, 8), np.float64 if not instr.is_integer else np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for i in range(4):
            word = int(d[0, lane, i // per_reg])
            if instr.is_integer:
                v = np.array([word], np.uint32).view(np.int32)[0]
            elif per_reg == 2:
                v = np.array([(word >> (16 * (i % 2))) & 0xFFFF], np.uint16).view(np.float16)[0]
            else:
                v = np.array([word], np.uint32).view(np.float32)[0]
            D[g + 8 * (i >= 2), 2 * t + (i & 1)] = v
    exact = aval @ bval + C.astype(np.int64 if instr.is_integer else np.float64)
    if instr.is_integer:
        assert np.array_equal(D, exact)
    elif instr.accum_dtype == "float16":
        assert np.array_equal(D, exact.astype(np.float16).astype(np.float64))   # one rounding of the exact sum
    else:
        np.testing.assert_allclose(D, exact, rtol=1e-6, atol=1e-6)


def test_mma_int_wraps_and_satfinite_clamps():
    a = np.full((1, 32, 4), 0x7F7F7F7F, np.uint32)          # all s8 = 127
    b = np.full((1, 32, 2), 0x7F7F7F7F, np.uint32)
    c = np.full((1, 32, 4), 2 ** 31 - 1000, np.uint32)
    wrapped = ptx.mma_sync((16, 8, 32), "s8", "s8", "s32", "s32", a, b, c).view(np.int32)
    assert np.all(wrapped == np.int64(2 ** 31 - 1000 + 32 * 127 * 127 - 2 ** 32))
    sat = ptx.mma_sync((16, 8, 32), "s8", "s8", "s32", "s32", a, b, c, satfinite=True).view(np.int32)
    assert np.all(sat == 2 ** 31 - 1)


# ---------------------------------------------------------------------------------------------------------------------
# ldmatrix / stmatrix / shfl
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_distribution_and_stmatrix_inverse(trans):
    mats = RNG.integers(0, 2 ** 16, (3, 4, 8, 8)).astype(np.uint16)     # 3 warps, x4
    regs = ptx.ldmatrix(mats, trans)
    assert regs.shape == (3, 32, 4)
    for w in range(3):
        for lane in range(32):
            for m in range(4):
                r, c = lane // 4, 2 * (lane % 4)
                lo, hi = (mats[w, m, c, r], mats[w, m, c + 1, r]) if trans else (mats[w, m, r, c], mats[w, m, r, c + 1])
                assert int(regs[w, lane, m]) == int(lo) | (int(hi) << 16)
    assert np.array_equal(ptx.stmatrix(regs, trans), mats)


def test_shfl_modes_match_cuda_semantics():
    v = RNG.integers(0, 2 ** 32, (2, 32), dtype=np.uint64).astype(np.uint32)
    lane = np.arange(32)
    d, _ = ptx.shfl(v, "idx", 5, 0x1F)                     # __shfl_sync(.., 5, 32)
    assert np.all(d == v[:, [5]])
    d, _ = ptx.shfl(v, "bfly", 3, 0x1F)                    # __shfl_xor_sync(.., 3, 32)
    assert np.array_equal(d, v[:, lane ^ 3])
    d, p = ptx.shfl(v, "down", 4, ((32 - 16) << 8) | 0x1F)  # __shfl_down_sync(.., 4, 16)
    src = np.where((lane % 16) + 4 < 16, lane + 4, lane)
    assert np.array_equal(d, v[:, src]) and np.array_equal(p[0], (lane % 16) + 4 < 16)
    d, p = ptx.shfl(v, "up", 1, 0)                          # __shfl_up_sync(.., 1, 32)
    assert np.array_equal(d, v[:, np.maximum(lane - 1, 0)]) and not p[0, 0] and p[0, 1:].all()


@pytest.mark.filterwarnings("ignore:overflow")
def test_cvt_scalar_directed_roundings_bracket_the_exact_value():
    x = np.concatenate([RNG.standard_normal(500) * 100, [65519.0, 65520.0, -65536.0, 1e-8, -1e-8]]).astype(np.float32)
    bits = x.view(np.uint32)
    up = ptx.cvt(bits, "f16", "f32", "rp").view(np.float16)
    down = ptx.cvt(bits, "f16", "f32", "rm").view(np.float16)
    zero = ptx.cvt(bits, "f16", "f32", "rz").view(np.float16)
    near = ptx.cvt(bits, "f16", "f32", "rn").view(np.float16)
    x64 = x.astype(np.float64)
    assert np.all(up.astype(np.float64) >= x64) and np.all(down.astype(np.float64) <= x64)
    # tight: the neighbour on the other side lies past x (or the values are equal and x is representable)
    assert np.all((up == down) | (np.nextafter(up, np.float16(-np.inf)).astype(np.float64) < x64))
    assert np.all(np.abs(zero.astype(np.float64)) <= np.abs(x64))
    assert np.all(np.where(x64 >= 0, zero == down, zero == up))
    assert np.array_equal(near, x.astype(np.float16))


def test_cvt_scalar_float_to_int_saturates_and_rounds():
    x = np.array([2.5, -2.5, 3.7, -3.7, 1e10, -1e10, np.nan, 255.5], np.float32)
    b = x.view(np.uint32)
    assert list(ptx.cvt(b, "s32", "f32", "rni").view(np.int32)) == [2, -2, 4, -4, 2 ** 31 - 1, -(2 ** 31), 0, 256]
    assert list(ptx.cvt(b, "s32", "f32", "rmi").view(np.int32))[:4] == [2, -3, 3, -4]
    assert list(ptx.cvt(b, "u8", "f32", "rzi").view(np.uint8)) == [2, 0, 3, 0, 255, 0, 0, 255]
    assert list(ptx.cvt(np.array([-5, 300, 7], np.int32).view(np.uint32), "u8", "s32", sat=True)) == [0, 255, 7]
    assert list(ptx.cvt(np.array([-5, 300], np.int32).view(np.uint32), "u8", "s32")) == [251, 44]   # wraps
    big = np.array([2 ** 24 + 1], np.int32).view(np.uint32)
    assert ptx.cvt(big, "f32", "s32", "rp").view(np.float32)[0] == 2 ** 24 + 2
    assert ptx.cvt(big, "f32", "s32", "rn").view(np.float32)[0] == 2 ** 24
    h = np.array([1.5, -0.25], np.float16).view(np.uint16)
    assert list(ptx.cvt(h, "f32", "f16").view(np.float32)) == [1.5, -0.25]
