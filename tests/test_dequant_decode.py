"""Decode programs on the CPU: ``DecodeProgram.evaluate`` (the same ops the kernel runs, emulated bit for bit)
equals the reference ``scaling.dequantize`` for EVERY code of every format and mode, f16 and bf16, fast path and
reference converter; the fast programs equal the fast-decode spec (``fastdecode_reference``) op for op."""
import ml_dtypes as md
import numpy as np
import pytest
import torch

from mmaemit.dequant import FORMATS, QuantScheme, dequantize_codes, get_format, interleave, pack, pack_zeros
from mmaemit.dequant import decode as D
from mmaemit.dequant import fastdecode_reference as fd
from mmaemit.dequant import regops as R
from mmaemit.errors import ArchError, ArgumentError, UnsupportedConfigError

NP = {"float16": np.float16, "bfloat16": md.bfloat16}
DTYPES = ("float16", "bfloat16")


def _fast_cases():
    out = []
    for (f, d), table in sorted(D.FAST_DECODE.items()):
        for m, need in table.items():
            archs = {need, "sm_90"} if d == "bfloat16" else {need}   # bf16 add/sub: fma below sm_90, native on it
            for a in sorted(archs):
                out.append((f, d, m, a, "shift"))
            if get_format(f).bits == 4 and d == "float16" and get_format(f).kind in ("int", "uint"):
                out.append((f, d, m, need, "marlin"))
    return out


FAST_CASES = _fast_cases()
REF_CASES = [(f, d, m) for f in sorted(FORMATS) for d in DTYPES for m in D.valid_modes(f)]


def _words(codes, bits):
    """[rows, E] codes -> the interleaved 32-bit words the kernel loads (8-bit: plain bytes)."""
    plain = pack(codes.astype(np.uint8), bits, axis=-1, storage="int32")[:, 0]
    return (interleave(plain, bits) if bits < 8 else plain).view(np.uint32)


def _exhaustive(bits, pair_bits=0):
    """Rows of E codes (and of E second codes with ``pair_bits``) so that every code, or every (code, second) pair,
    occurs in every slot."""
    n, m, e = 1 << bits, 1 << pair_bits, 32 // bits
    rows = n * m
    r, s = np.arange(rows + (-rows) % 32)[:, None], np.arange(e)[None, :]   # rows padded: zeros pack along N
    q = (r % n + s) % n
    z = ((r // n) % m + s) % m if pair_bits else None
    return q, z


def _random_values(rng, shape, dtype, lo_exp, hi_exp):
    v = rng.uniform(0.5, 1.0, shape) * 2.0 ** rng.integers(lo_exp, hi_exp, shape) * rng.choice([-1, 1], shape)
    return v.astype(NP[dtype])


def _bits(x):
    return np.asarray(x).view(np.uint16) if isinstance(x, np.ndarray) else x.view(torch.int16).numpy().view(np.uint16)


def _assert_same(got, ref):
    ref64 = ref.to(torch.float64).numpy() if isinstance(ref, torch.Tensor) else np.asarray(ref, np.float64)
    nan = np.isnan(got.astype(np.float64))
    assert np.array_equal(nan, np.isnan(ref64)), f"NaN mismatch at {np.argwhere(nan != np.isnan(ref64))[:3]}"
    bad = (_bits(got) != _bits(ref)) & ~nan
    assert not bad.any(), f"{bad.sum()} mismatches, first at {np.argwhere(bad)[0]}"


def _check(fmt, dtype, mode, program, wide):
    """evaluate(program) on every code (x every zero / scale code) == scaling.dequantize, bit for bit."""
    f = get_format(fmt)
    rng = np.random.default_rng(sum(map(ord, f"{fmt}{dtype}{mode}{program.fast}{program.arch}{program.variant}")))
    pair_bits = f.bits if mode == "quantized" else 8 if f.block_size else 0
    q, second = _exhaustive(f.bits, pair_bits)
    shape = q.shape
    words = _words(q, f.bits)
    if f.block_size:
        # one scale code per element: each element becomes row r of a [rows, block] weight whose block shares it
        got = program.evaluate(words, second.astype(np.uint8))
        rows = q.size
        codes = np.zeros((rows, f.block_size), np.uint8)
        codes[:, 0] = q.ravel()
        codes[:, 1:] = np.random.default_rng(1).integers(0, 16, (rows, f.block_size - 1))
        ref = dequantize_codes(torch.from_numpy(codes), QuantScheme(fmt),
                               torch.from_numpy(second.reshape(rows, 1).astype(np.uint8)), out_dtype=dtype)
        _assert_same(got.reshape(-1), ref[:, 0])
        return
    lo, hi = (-24, 12) if wide and dtype == "float16" else (-135, 125) if wide else (-12, 6)
    scale = _random_values(rng, shape, dtype, lo, hi) if mode != "none" else None
    k = program.shared_scale_slots      # nf4 "scale" fast: one scale per output register pair (one weight row)
    if scale is not None and k > 1:
        scale = np.repeat(scale[..., ::k], k, axis=-1)
    zero, zref = None, None
    if mode == "original":
        # w - Z exact in the arithmetic: eighths (fast path, exact in f16/bf16) / any value >= 2^-5 (float32)
        z = rng.integers(0, 8 << f.bits, shape) / 8 if not wide else rng.uniform(2.0 ** -5, 1 << f.bits, shape)
        zero = z.astype(NP[dtype])
        zref = torch.from_numpy(zero.astype(np.float32))
    elif mode == "rescale":
        zero = _random_values(rng, shape, dtype, lo, hi)
        zref = torch.from_numpy(zero.astype(np.float32))
    elif mode == "quantized":
        zero = second
        zref = pack_zeros(torch.from_numpy(second.astype(np.uint8)), f.bits, "int32")
    got = program.evaluate(words, scale, zero)
    scheme = QuantScheme(fmt, None if mode == "none" else 1, None if mode in ("none", "scale") else mode)
    ref = dequantize_codes(torch.from_numpy(q.astype(np.uint8)), scheme,
                           None if scale is None else torch.from_numpy(scale.astype(np.float32)), zref,
                           out_dtype=dtype)
    _assert_same(got, ref)


@pytest.mark.parametrize("fmt,dtype,mode,arch,variant", FAST_CASES)
def test_fast_program_equals_reference_for_every_code(fmt, dtype, mode, arch, variant):
    program = D.decode_program(fmt, dtype, mode, arch, fast=True, variant=variant)
    _check(fmt, dtype, mode, program, wide=False)


@pytest.mark.parametrize("fmt,dtype,mode", REF_CASES)
def test_reference_converter_equals_reference_for_every_code(fmt, dtype, mode):
    program = D.decode_program(fmt, dtype, mode, "sm_80", fast=False)
    assert not any(op.ptx.endswith(("f16x2", "bf16x2")) and op.ptx.startswith(("add", "sub", "fma"))
                   for op in program.ops)  # all arithmetic in float32, one final cvt per register
    _check(fmt, dtype, mode, program, wide=True)


def _all_finite(dtype, lo=None):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    v = bits.view(NP[dtype])
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(v.astype(np.float64)) & (v.astype(np.float64) != 0)
        if lo is not None:
            keep &= np.abs(v.astype(np.float64)) >= lo
    return v[keep]


def _double_rounds(x, dtype):
    """Exact float64 values x whose float32 round-to-nearest, rounded again to dtype, differs from one rounding."""
    with np.errstate(over="ignore", invalid="ignore"):
        twice = np.asarray(np.asarray(x, np.float64).astype(np.float32), np.float64).astype(np.float32)
        twice = twice.astype(NP[dtype]).view(np.uint16)
    once = R.round_np(x, dtype).view(np.uint16)
    return twice != once


def _run_rows(program, q, scale, zero=None):
    """Evaluate per-element (q, scale, zero) lists by filling the slots of as many words as needed."""
    e = program.elements
    n = -(-len(q) // e) * e
    pad = lambda a, fill: np.concatenate([a, np.full(n - len(a), fill, dtype=a.dtype)]).reshape(-1, e)  # noqa: E731
    qq, ss = pad(q.astype(np.uint8), 0), pad(scale, scale[0])
    zz = None if zero is None else pad(zero, zero[0])
    return program.evaluate(_words(qq, program.bits), ss, zz).reshape(-1)[:len(q)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_converter_rounds_once_where_float32_would_double_round(dtype):
    """"original" and "rescale" results can need more than float32's 24 bits. Find many (w, Z, S) whose float32
    rounding followed by an f16 / bf16 rounding is wrong, and check the reference converter (round-to-odd, then
    one rounding) gets each of them right."""
    rng = np.random.default_rng(3)
    # "original": (w - Z) S with w - Z of ~20 bits (large w, small Z with a fine ulp)
    n = 400_000 if dtype == "float16" else 2_000_000    # bf16: ~1 in 150k samples double-rounds
    zexp = -5 if dtype == "float16" else -8     # w - Z keeps <= 24 bits: exact in float32
    w, z = rng.integers(128, 256, n), rng.uniform(2.0 ** zexp, 2.0 ** (zexp + 1), n).astype(NP[dtype])
    s = _random_values(rng, n, dtype, -8, 8)
    x = (w - z.astype(np.float64)) * s.astype(np.float64)       # exact in float64 (<= 24 + 11 bits)
    hard = _double_rounds(x, dtype)
    assert hard.sum() >= 10
    got = _run_rows(D.decode_program("uint8", dtype, "original", fast=False), w[hard], s[hard], z[hard])
    _assert_same(got, R.round_np(x[hard], dtype))
    # "rescale": q S an exact midpoint of the dtype, minus a zero far below float32's resolution there
    with np.errstate(over="ignore", invalid="ignore"):
        s_all = _all_finite(dtype, lo=1.0)
        qs = np.repeat(np.arange(1, 16), len(s_all))
        ss = np.tile(s_all, 15)
        p = qs * ss.astype(np.float64)
        keep = p < float(md.finfo(NP[dtype]).max) / 2
        qs, ss, p = qs[keep], ss[keep], p[keep]
        rb = p.astype(NP[dtype]).view(np.uint16)     # all positive: neighbours are bit patterns +- 1
        r, up, down = ((rb.astype(np.int64) + k).astype(np.uint16).view(NP[dtype]).astype(np.float64)
                       for k in (0, 1, -1))
        mid = (p == (r + up) / 2) | (p == (r + down) / 2)
    tiny = np.asarray(2.0 ** (-24 if dtype == "float16" else -133)).astype(NP[dtype])
    qs, ss, p = qs[mid], ss[mid], p[mid]
    z = np.where(rng.integers(0, 2, len(qs)) == 1, tiny, -tiny).astype(NP[dtype])
    got = _run_rows(D.decode_program("uint4", dtype, "rescale", fast=False), qs, ss, z)
    col = (lambda a: torch.from_numpy(a[:, None]))   # noqa: E731
    ref = dequantize_codes(col(qs.astype(np.uint8)), QuantScheme("uint4", 1, "rescale"), col(ss.astype(np.float32)),
                           col(z.astype(np.float32)), out_dtype=dtype)[:, 0]
    naive = (p - z.astype(np.float64)).astype(np.float32).astype(NP[dtype])   # float32 first: ties to even
    assert (naive.view(np.uint16) != _bits(ref)).sum() >= 10
    _assert_same(got, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_nf4_reference_is_exact_for_every_scale_and_a_table_lut_would_not_be(dtype):
    """nf4 x S for all 16 codes and every finite scale: the reference converter equals dequantize; the rejected
    fast alternative (an f16 / bf16 table, then fma with the scale) rounds twice and is wrong on many of them."""
    s_all = _all_finite(dtype)
    q = np.repeat(np.arange(16), len(s_all))
    s = np.tile(s_all, 16)
    table = get_format("nf4").table
    got = _run_rows(D.decode_program("nf4", dtype, "scale", fast=False), q, s)
    ref = dequantize_codes(torch.from_numpy(q.astype(np.uint8)[:, None]), QuantScheme("nf4", 1),
                           torch.from_numpy(s.astype(np.float32)[:, None]), out_dtype=dtype)[:, 0]
    _assert_same(got, ref)
    lut = R.round_np(table[q], dtype)
    naive = R.fma2(R.pack2(lut, lut, dtype), R.pack2(s, s, dtype), np.uint32(0x80008000), dtype) & 0xFFFF
    assert (naive.astype(np.uint16) != _bits(ref)).sum() > 1000


def test_fast_programs_are_the_fast_decode_spec_op_for_op():
    """Every program of a FAST_PATHS entry computes what fastdecode_reference.fast_decode computes (random words,
    scales of both signs, zeros), bit for bit: the emitted program IS the specified algorithm."""
    rng = np.random.default_rng(5)
    for (f, d), modes in sorted(fd.FAST_PATHS.items()):
        variants = ("shift", "marlin") if get_format(f).bits == 4 and d == "float16" else ("shift",)
        assert D.variants_of(f, d) == variants, (f, d)
        for m in modes:
            for variant in variants:
                for arch in ("sm_80", "sm_90a"):
                    p = D.decode_program(f, d, m, arch, variant=variant)
                    words = rng.integers(0, 2 ** 32, 300, dtype=np.uint64).astype(np.uint32)
                    shape = (300, p.elements)
                    kw = {}
                    if m != "none":
                        kw["scale"] = _random_values(rng, shape, d, -10, 10)
                    if m in ("original", "rescale"):
                        kw["zero"] = (rng.integers(0, 8 << p.bits, shape) / 8).astype(NP[d])
                    if m == "quantized":
                        kw["zero"] = rng.integers(0, 1 << p.bits, shape)
                    want = fd.fast_decode(words, f, d, m, variant=variant, **kw)
                    got = p.evaluate(words, kw.get("scale"), kw.get("zero"))
                    assert np.array_equal(_bits(got), _bits(want)), (f, d, m, variant, arch)


def test_documented_fast_decode_costs():
    """The per-word costs fastdecode_reference documents: 4-bit shift 3 SHR + 4 LOP3 + 4 HSUB2; marlin 1 SHR +
    4 LOP3 + 2 HSUB2 + 2 HFMA2; 8-bit 2 PRMT + 2 HSUB2 (+1 LOP3 two's complement); 2 / 1-bit 7 / 15 SHR +
    8 / 16 LOP3 + 8 / 16 HSUB2 (int1 + 16 HFMA2); a scale adds one HFMA2 per register, "original" one HSUB2 more."""
    def c(fmt, mode="none", variant="shift", dtype="float16"):
        return dict(D.decode_program(fmt, dtype, mode, variant=variant).op_counts())

    assert c("uint4") == {"shr.b32": 3, "lop3.b32": 4, "sub.rn.f16x2": 4}
    assert c("int4", variant="marlin") == {"shr.b32": 1, "lop3.b32": 4, "sub.rn.f16x2": 2, "fma.rn.f16x2": 2}
    assert c("uint8") == {"prmt.b32": 2, "sub.rn.f16x2": 2}
    assert c("int8") == {"prmt.b32": 2, "sub.rn.f16x2": 2, "lop3.b32": 1}
    assert c("uint2") == {"shr.b32": 7, "lop3.b32": 8, "sub.rn.f16x2": 8}
    assert c("int1") == {"shr.b32": 15, "lop3.b32": 16, "sub.rn.f16x2": 16, "fma.rn.f16x2": 16}
    assert c("uint4", "scale") == {"shr.b32": 3, "lop3.b32": 4, "sub.rn.f16x2": 4, "fma.rn.f16x2": 4}
    assert c("uint4", "original") == {"shr.b32": 3, "lop3.b32": 4, "sub.rn.f16x2": 8, "fma.rn.f16x2": 4}
    # quantized zeros: one add instead of the magic subtract (+ one lop3 per register building NEG_MAGIC | z)
    assert c("uint4", "quantized") == {"shr.b32": 3, "lop3.b32": 8, "add.rn.f16x2": 4, "fma.rn.f16x2": 4}
    # bf16 below sm_90: every add / sub is an fma with 1.0 (same count), native add / sub from sm_90
    assert c("uint4", "scale", dtype="bfloat16") == {"shr.b32": 3, "lop3.b32": 4, "fma.rn.bf16x2": 8}
    assert dict(D.decode_program("uint4", "bfloat16", "scale", "sm_90").op_counts()) == \
        {"shr.b32": 3, "lop3.b32": 4, "sub.rn.bf16x2": 4, "fma.rn.bf16x2": 4}


@pytest.mark.parametrize("fmt,dtype,mode,arch,variant", FAST_CASES)
def test_precision_rule_the_bias_is_never_folded_into_the_scale_fma(fmt, dtype, mode, arch, variant):
    """Every fma that multiplies by a scale pair adds -0.0 (or the zero operand of "rescale"), and nothing that
    reads the magic-biased value multiplies by a scale before the exact subtract / add happened."""
    p = D.decode_program(fmt, dtype, mode, arch, variant=variant)
    if p.fmt.kind == "lut":     # nf4: the word stage only looks values up; the scale multiplies the table entries
        assert not any(op.ptx.startswith(("fma", "mul", "add", "sub")) for op in p.ops if op.stage == "word")
        table = [op for op in p.ops if op.stage == "operand" and op.ptx.startswith(("fma", "mul"))]
        assert len(table) == (0 if mode == "none" else 2 * (17 if dtype == "float16" else 15))
        assert all(op.src[1] in [D.Imm(float(t)) for t in get_format("nf4").table] for op in table)
        assert all(op.src[2] == D.Imm(-0.0) for op in table if op.ptx.startswith("fma"))
        return
    scale_regs = {f"s{i}" for i in range(p.registers)}
    for op in p.ops:                        # operand ops derived from a scale pair (nvfp4: e4m3 -> f16)
        if op.stage == "operand" and scale_regs & set(op.src):
            scale_regs |= set(op.dst)
    muls = [op for op in p.ops if op.ptx.startswith("fma") and op.src[1] in scale_regs]
    assert len(muls) == (p.registers if mode != "none" else 0)
    for op in muls:
        addend = op.src[2]
        assert addend == D.Imm(0x80008000) or (mode == "rescale" and isinstance(addend, str))
        # the value scaled is already exact: its last writer is not the magic-producing lop3 / prmt
        writers = [o for o in p.ops[:p.ops.index(op)] if op.src[0] in o.dst]
        assert writers[-1].ptx.split(".")[0] in ("sub", "add", "fma", "cvt", "lop3", "prmt")
        if get_format(fmt).kind != "float":
            assert writers[-1].ptx.split(".")[0] in ("sub", "add", "fma")


def test_decode_program_errors_name_the_valid_choices():
    with pytest.raises(UnsupportedConfigError, match="fast=False"):
        D.decode_program("mxfp4", "float16", "scale")
    with pytest.raises(UnsupportedConfigError, match="'none', 'scale'"):
        D.decode_program("int4", "float16", "quantized")
    with pytest.raises(UnsupportedConfigError, match="uint4, int4, int4_ob"):
        D.decode_program("uint2", "float16", variant="marlin")
    with pytest.raises(UnsupportedConfigError, match="marlin"):
        D.decode_program("uint4", "float16", variant="lut")
    with pytest.raises(UnsupportedConfigError, match="bfloat16"):
        D.decode_program("uint4", "float32")
    with pytest.raises(UnsupportedConfigError, match="quantized"):
        D.decode_program("uint4", "float16", "zeros")
    with pytest.raises(ArchError, match="sm_80"):
        D.decode_program("uint4", "float16", arch="sm_75")
    with pytest.raises(ArchError, match="sm_89"):
        D.decode_program("nvfp4", "float16", "scale", "sm_86")
    p = D.decode_program("uint4", "float16", "quantized")
    with pytest.raises(ArgumentError, match="needs zeros"):
        p.evaluate(np.zeros(2, np.uint32), np.ones((2, 8), np.float16))
    with pytest.raises(ArgumentError, match=r"\[0, 15\]"):
        p.evaluate(np.zeros(2, np.uint32), np.ones((2, 8), np.float16), np.full((2, 8), 16))
    with pytest.raises(ArgumentError, match="takes no scales"):
        D.decode_program("uint4").evaluate(np.zeros(2, np.uint32), np.ones((2, 8), np.float16))
    assert D.mode_of(QuantScheme("uint4", 128, "rescale")) == "rescale"
    assert D.mode_of(QuantScheme("int4", None)) == "none" and D.mode_of(QuantScheme("mxfp4")) == "scale"
    assert D.fast_modes("float8_e4m3fn", "float16", "sm_80") == () and \
        D.fast_modes("float8_e4m3fn", "float16", "sm_90a") == ("none", "scale")


def test_every_format_without_a_fast_path_is_named_in_the_module_doc():
    short = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2", "float4_e2m1fn": "e2m1"}
    doc = D.__doc__[D.__doc__.index("reference path only"):]
    for name, f in FORMATS.items():
        for d in DTYPES:
            if (name, d) in D.FAST_DECODE:
                continue
            assert short.get(name, name) in doc or (f.bits == 8 and f.is_integer and "8-bit integers" in doc), \
                (name, d)
