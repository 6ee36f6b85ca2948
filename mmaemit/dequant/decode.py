"""Decode programs: packed weight words -> f16x2 / bf16x2 mma B-fragment registers, as a list of PTX register ops.

A :class:`DecodeProgram` is data: a short list of :class:`Op` (one PTX instruction each, on named registers) built by
:func:`decode_program` from the format table. The SAME op list is

* emitted into a kernel being parsed (``program.emit(word, out_regs, scale_pair, zero_pair)`` appends one
  ``T.ptx.<mnemonic>`` statement per op; registers are local buffer elements; or the operand stage once with
  ``regs = program.emit_operands(scale_pair, zero_pair)`` and then ``program.emit(word, out_regs, operands=regs)``
  per word), and
* run on the CPU with the bit-exact numpy semantics of :mod:`.regops` (``program.evaluate(words, scales, zeros)``),

so the exhaustive CPU tests of ``evaluate`` against :func:`.scaling.dequantize` check exactly what the GPU runs.

Inputs and outputs of one program (one 32-bit word of E = 32/b codes, R = E/2 output registers)::

    w        the packed word, interleaved per :mod:`.interleave` (8-bit: plain bytes), as :mod:`.fragment_order`
             lays it out; decode-order slot e is element e, output register i holds slots (2i, 2i+1)
    s0..     one operand pair per output register: the scale of slot 2i in bits 0..15 and of slot 2i+1 in bits
             16..31 (f16 / bf16 bits, the output dtype); for the block formats two scale CODES in bytes 0 and 1
             (e8m0 for mxfp4, e4m3 for nvfp4)
    z0..     zero pairs the same way: f16 / bf16 zeros ("original", "rescale") or zero codes zero-extended in each
             16-bit half ("quantized")
    o0..     the f16x2 / bf16x2 outputs

In a GEMM both halves of a register share the output row n and, for an even group size, the group, so each pair is
``{S, S}``: build it once per group with :func:`emit_broadcast_half` (one PRMT) or store scales pre-paired.
Ops whose ``stage`` is ``"operand"`` read only the scale / zero inputs (the negated zero of "rescale", the
``0xE400 | z`` of "quantized", the e4m3 -> f16 scale of nvfp4, nf4's scaled tables): ``emit`` issues each of them
once per distinct (structurally equal) operand expression within the call. To issue them once for many words (per
scale group instead of per word), ``emit_operands`` emits them into registers (an :class:`OperandRegisters`;
``alloc_operands(n)`` allocates n sets to fill and read by index inside TIR loops) and ``emit(..., operands=)``
emits the word-stage ops only. ``op_counts("operand")`` counts the operand ops of the program (every pair
distinct), ``op_counts("operand", shared=True)`` those of one distinct pair; ``per_8_weights()`` is word ops only.

Fast path (``fast=True``, see :data:`FAST_DECODE`): the magic-number decode of :mod:`.fastdecode_reference`
(``lop3``/``prmt`` into the mantissa of 0x6400 = 1024.0 (f16) / 0x4300 = 128.0 (bf16), one exact subtract, quantized
zeros as ONE add of ``NEG_MAGIC | z``, the scale in a final ``fma(h, S, -0.0)``; the bias is never folded into the
scale FMA), plus three table / hardware paths:

* float4_e2m1fn / nvfp4 -> f16: a prmt register LUT. Every E2M1 magnitude is an f16 with a zero low byte, so one
  ``prmt`` with the code's three magnitude bits as byte selectors into an 8-byte table of f16 high bytes
  (0x00 0x38 0x3C 0x3E 0x40 0x42 0x44 0x46) yields the pair, and one ``lop3`` ORs in the two sign bits. nvfp4's e4m3
  scale pair is converted once per group with ``cvt.rn.f16x2.e4m3x2`` (sm_89+).
* float8_e4m3fn -> f16: ``cvt.rn.f16x2.e4m3x2`` (sm_89+; exact, NaN kept).
* int8 / int8_ob / uint8 -> bf16 (modes "none", "scale", uint8 "rescale"): a split magic. One ``prmt`` puts each
  code byte in a 16-bit half, one ``lop3`` makes ``x = 128 + (q & 0x7F)`` (0x4300 with the low seven bits), one
  ``lop3`` makes ``c`` = 128.0 or 256.0 from code bit 7, and ``x - c`` is the exact value (uint8: that of
  ``q ^ 0x80`` as two's complement, plus 128, exact): 5 ops per register before the scale, against 2 for f16.
* float8_e5m2 -> f16: ``prmt`` of the byte into the high byte of each half (f16 == e5m2 << 8).
* nf4 -> f16 / bf16, mode "none" (what the GEMV uses: its scales multiply the fp32 partial sums): a 16-entry LUT of
  the once-rounded table values from two byte planes. Per pair of output registers, ``prmt`` looks the low and the
  high bytes up in 8-byte tables (codes 0-7 and 8-15, the code's low three bits as selectors), one ``lop3`` per
  plane picks table a or b per byte by a byte mask of code bit 3 (two ``prmt`` in sign-replication mode make the
  masks of a word), and two ``prmt`` pair low with high bytes: 23 ops per word (15 ``prmt``) against 164 for the
  reference converter, the same bits. (Picking with ``prmt`` instead, 24 ops with 17 ``prmt``, ran 5 % slower in the
  GEMV on the H100: ``prmt`` issues at a lower rate than ``lop3``.)
* nf4 -> f16 / bf16, mode "scale": the same 23 word ops reading the planes from registers, one table per weight row.
  The operand stage builds, from a row's scale S, the table ``table[c] * S`` with every entry rounded ONCE (the
  reference's value): a float32 product, exact after one ``cvt.rn`` for every finite bf16 scale and, with f16
  scales, for 15 of the 16 codes (all 65536 scale patterns tried: code 2, -0.5251, double-rounds for 58 f16
  scales, so its product is rounded to odd first, fma.rz / .rm / .rp + 2 lop3), then ``cvt.rn.*x2.f32`` of entries
  (2k, 2k+1) and ``prmt`` 0x6420 / 0x7531 into the four planes. Per table (``op_counts("operand", shared=True)``):
  f16 36 ops (1 cvt.f32.f16, 14 FMUL, 3 FFMA, 2 LOP3, 8 F2FP, 8 PRMT; the mov unpack is free), bf16 32 (1 SHL, 15
  FMUL, 8 F2FP, 8 PRMT). Contract: output registers (0, 1) and (2, 3) each belong to one weight row and share one
  scale (both halves of each pair), so the table of pair p is built from s_{2p} and s_1 / s_3 are not read
  (``shared_scale_slots`` = 4; ``evaluate`` raises ``ArgumentError`` for differing scales within a pair). A table
  is per (row, group): build it once per group with ``emit_operands`` (``hoist_operands``); the per-word form emits
  two builds per word, which ptxas merges only between words reading the same pair registers (one chunk). Every
  scale pattern gives the reference converter's bits, inf / NaN too (+-inf; 0 x inf and NaN -> the canonical NaN).

Reference converter (``fast=False``, every format, every mode, f16 and bf16, sm_80+): per element, extract the field
(``bfe.u32``), build its exact float32 value (integer ``cvt``; exponent-field placement and one exact power-of-two
``mul`` for e2m1 / e4m3 / e5m2 / e8m0 with NaN / inf fix-ups; a ``lop3`` select tree over the float32 bit patterns
for nf4), apply the mode in float32 and round ONCE to f16 / bf16 (``cvt.rn.*x2.f32``). Products not provably exact
in float32 (every non-integer format, "original", "rescale") are rounded to odd first (``fma.rz``/``.rm``/``.rp``
+ two ``lop3``): a float32 rounded to odd, then to 8- / 11-bit significands, is the correctly rounded value. "original"
subtracts ``w - Z`` in float32 (exact whenever ``w - Z`` fits 24 bits, e.g. integer GPTQ zeros; the float64 reference
has the same caveat).

Formats with the reference path only, and why: mxfp4 (e8m0 scales 2^-127 .. 2^127 do not fit an f16 pair; no
one-byte bf16 LUT), float8_e8m0fnu, and every (format, bf16) pair without a magic path: 8-bit integers
with zeros other than uint8 "rescale" ("original" rounds q - Z in bf16 before the scale; "quantized" zero codes
above 127 have no bf16 magic), e4m3 / nvfp4 (``cvt.*.bf16x2.e4m3x2`` is sm_100+), e5m2 (its
byte is the high byte of an f16, not of a bf16) and e2m1 (its bf16 images do not share a zero low byte, so no
one-byte prmt LUT).
"""
from __future__ import annotations

import functools
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .. import isa
from ..arch import as_arch
from ..errors import ArgumentError, UnsupportedConfigError, choices
from . import regops as R
from .fastdecode_reference import FAST_PATHS, MAGIC, NEG_MAGIC
from .formats import FORMATS, NF4_TABLE, Format, get_format
from .interleave import bit_positions
from .rounding import half_name

__all__ = ["MODES", "FAST_DECODE", "VARIANTS", "variants_of", "Imm", "Op", "DecodeProgram", "OperandRegisters",
           "decode_program", "fast_modes", "valid_modes", "mode_of", "operand_pairs", "SASS_CLASS", "emit_broadcast_half",
           "cost_table"]

MODES = ("none", "scale", "original", "rescale", "quantized")
VARIANTS = ("shift", "marlin")
_DT = {"u32": "uint32", "s32": "int32", "f32": "float32", "u16": "uint16"}
_PREFIX = {"u32": "t", "s32": "m", "f32": "f", "u16": "h"}   # temporaries: t3, m1, f7, h2


def _fast_table() -> dict:
    t = {key: {m: "sm_80" for m in modes} for key, modes in FAST_PATHS.items()}
    cvt_e4m3 = isa.FEATURES["cvt.e4m3x2"].min_arch
    t[("float4_e2m1fn", "float16")] = {"none": "sm_80", "scale": "sm_80"}
    t[("float8_e4m3fn", "float16")] = {"none": cvt_e4m3, "scale": cvt_e4m3}
    t[("nvfp4", "float16")] = {"scale": cvt_e4m3}     # its e4m3 scale pair goes through the cvt
    for d in ("float16", "bfloat16"):                  # "scale": a per-row table of once-rounded products
        t[("nf4", d)] = {"none": "sm_80", "scale": "sm_80"}
    # split magic: the low 7 bits, then an exact subtract; not "original" (q - Z rounds in bf16 before the scale)
    # nor "quantized" (zero codes above 127 have no bf16 magic)
    for name in ("int8", "int8_ob", "uint8"):
        t[(name, "bfloat16")] = {m: "sm_80" for m in (("none", "scale", "rescale")
                                                      if get_format(name).kind == "uint" else ("none", "scale"))}
    return t


#: (format, out dtype) -> {mode: minimum arch} of the fast decode. Everything else: ``fast=False``.
FAST_DECODE: dict = _fast_table()

#: SASS opcode class each fast-path op assembles to (ptxas 13; ``shl`` often becomes ``IMAD.SHL``); None = free.
SASS_CLASS = {
    "lop3.b32": "LOP3", "prmt.b32": "PRMT", "shr.b32": "SHIFT", "shl.b32": "SHIFT",
    "add.rn.f16x2": "HALF2", "sub.rn.f16x2": "HALF2", "fma.rn.f16x2": "HALF2",
    "add.rn.bf16x2": "HALF2", "sub.rn.bf16x2": "HALF2", "fma.rn.bf16x2": "HALF2",
    "cvt.rn.f16x2.e4m3x2": "F2FP", "cvt.rn.f16x2.f32": "F2FP", "cvt.rn.bf16x2.f32": "F2FP", "mov.b32": None,
    # float32 ops (the nf4 "scale" table build; the reference converter)
    "mul.rn.f32": "FMUL", "add.rn.f32": "FADD", "sub.rn.f32": "FADD", "cvt.rn.f32.u32": "I2F",
    **{f"fma.{rnd}.f32": "FFMA" for rnd in ("rn", "rz", "rm", "rp")}, "cvt.f32.f16": "CVT_F16_F32",
}


# ------------------------------------------------------------------------------------------------ ops as data
@dataclass(frozen=True)
class Imm:
    """An immediate operand: ``value`` (int or float) typed as the op's operand slot says."""

    value: object


@dataclass(frozen=True)
class Op:
    """One PTX instruction: ``ptx`` (exact mnemonic), destination register names, sources (names or Imm)."""

    ptx: str
    dst: tuple
    src: tuple
    stage: str = "word"

    def __str__(self):
        srcs = ", ".join(f"{s.value:#x}" if isinstance(s, Imm) and isinstance(s.value, int) else
                         (repr(s.value) if isinstance(s, Imm) else s) for s in self.src)
        return f"{self.ptx} {', '.join(self.dst)}, {srcs}"


def _half2(fn):
    return lambda dtype: (lambda *a: (fn(*a, dtype),))


# mnemonic -> (destination dtypes, source dtypes ("imm" = instruction-text immediate), numpy semantics)
_SPEC = {
    "lop3.b32": (("u32",), ("u32", "u32", "u32", "imm"), lambda a, b, c, lut: (R.lop3(a, b, c, lut),)),
    "shr.b32": (("u32",), ("u32", "u32"), lambda a, n: (R.shr(a, n),)),
    "shl.b32": (("u32",), ("u32", "u32"), lambda a, n: (R.shl(a, n),)),
    "prmt.b32": (("u32",), ("u32", "u32", "u32"), lambda a, b, c: (R.prmt(a, b, c),)),
    "bfe.u32": (("u32",), ("u32", "u32", "u32"), lambda a, p, n: (R.bfe_u32(a, p, n),)),
    "bfe.s32": (("s32",), ("s32", "u32", "u32"), lambda a, p, n: (R.bfe_s32(a, p, n),)),
    "set.eq.u32.u32": (("u32",), ("u32", "u32"), lambda a, b: (R.set_cmp("eq", a, b),)),
    "mov.b32": (("u16", "u16"), ("u32",), R.mov_unpack),
    "cvt.rn.f32.u32": (("f32",), ("u32",), lambda a: (R.cvt_f32_u32(a),)),
    "cvt.f32.f16": (("f32",), ("u16",), lambda a: (R.cvt_f32_f16(a),)),
    "cvt.rn.f16x2.e4m3x2": (("u32",), ("u16",), lambda a: (R.cvt_f16x2_e4m3x2(a),)),
    "add.rn.f32": (("f32",), ("f32", "f32"), lambda a, b: (R.add_f32(a, b),)),
    "sub.rn.f32": (("f32",), ("f32", "f32"), lambda a, b: (R.sub_f32(a, b),)),
    "mul.rn.f32": (("f32",), ("f32", "f32"), lambda a, b: (R.mul_f32(a, b),)),
    **{f"fma.{rnd}.f32": (("f32",), ("f32", "f32", "f32"), (lambda r: lambda a, b, c: (R.fma_f32(a, b, c, r),))(rnd))
       for rnd in ("rn", "rz", "rm", "rp")},
    "cvt.rn.f16x2.f32": (("u32",), ("f32", "f32"), lambda hi, lo: (R.cvt_pack_f32(hi, lo, "float16"),)),
    "cvt.rn.bf16x2.f32": (("u32",), ("f32", "f32"), lambda hi, lo: (R.cvt_pack_f32(hi, lo, "bfloat16"),)),
    **{f"{op}.rn.{t}x2": (("u32",), ("u32", "u32"), _half2({"add": R.add2, "sub": R.sub2}[op])(d))
       for op in ("add", "sub") for t, d in (("f16", "float16"), ("bf16", "bfloat16"))},
    **{f"fma.rn.{t}x2": (("u32",), ("u32", "u32", "u32"), _half2(R.fma2)(d))
       for t, d in (("f16", "float16"), ("bf16", "bfloat16"))},
}


class _Builder:
    """Collects ops; temporaries get fresh names, each with the dtype its defining op writes."""

    def __init__(self):
        self.ops = []
        self.dtypes = {}
        self._n = Counter()

    def declare(self, name, dtype):
        self.dtypes[name] = dtype
        return name

    def op(self, ptx, *src, dst=None, stage="word"):
        dts = _SPEC[ptx][0]
        if dst is None:
            dst = []
            for d in dts:
                self._n[d] += 1
                dst.append(self.declare(f"{_PREFIX[d]}{self._n[d]}", d))
        elif isinstance(dst, str):
            dst = [dst]
        for name, d in zip(dst, dts):
            if self.dtypes.setdefault(name, d) != d:
                raise AssertionError(f"{name} is {self.dtypes[name]}, {ptx} writes {d}")
        src = tuple(s if isinstance(s, str) else Imm(s) for s in src)
        self.ops.append(Op(ptx, tuple(dst), src, stage))
        return dst[0] if len(dst) == 1 else tuple(dst)


# -------------------------------------------------------------------------------------------------- mode helpers
def valid_modes(fmt) -> tuple:
    """Modes a QuantScheme of ``fmt`` can have (QuantScheme decides: zeros for unsigned ints only, the block
    formats always scaled)."""
    from .scaling import QuantScheme

    out = []
    for m in MODES:
        try:
            QuantScheme(get_format(fmt).name, None if m == "none" else "auto", None if m in ("none", "scale") else m)
        except UnsupportedConfigError:
            continue
        out.append(m)
    return tuple(out)


def mode_of(scheme) -> str:
    """The decode mode of a QuantScheme ("none", "scale", or its zeros_mode); a mode string is returned checked."""
    from .scaling import QuantScheme

    if isinstance(scheme, QuantScheme):
        if not scheme.scaled:
            return "none"
        return scheme.zeros_mode or "scale"
    if scheme not in MODES:
        raise UnsupportedConfigError(f"mode {scheme!r} is unknown; valid: {choices(MODES)} or a QuantScheme")
    return scheme


def fast_modes(fmt, out_dtype, arch="sm_80") -> tuple:
    """Modes with a fast decode for (``fmt``, ``out_dtype``) on ``arch``; () if none."""
    a = as_arch(arch)
    table = FAST_DECODE.get((get_format(fmt).name, half_name(out_dtype)), {})
    return tuple(m for m, need in table.items() if a.satisfies(need))


def _const2(bits16: int) -> int:
    return bits16 | (bits16 << 16)


def _half_bits(value: float, dtype: str) -> int:
    return int(np.asarray(value, dtype=R.NP_HALF[dtype]).view(np.uint16))


def _f32_bits(value: float) -> int:
    return int(np.float32(value).view(np.uint32))


# lop3 truth tables (a = 0xF0, b = 0xCC, c = 0xAA)
_AND_OR = 0xEA      # (a & b) | c
_AND_XOR = 0x6A     # (a & b) ^ c
_XOR = 0x3C         # a ^ b
_OR = 0xFC          # a | b
_AND = 0xC0         # a & b
_OR_AND = 0xF8      # a | (b & c)
_SEL_C = 0xD8       # c ? b : a
_AC_OR_B = 0xEC     # (a & c) | b
_XOR_AND = 0x28     # (a ^ b) & c
_OR_OR_AND = 0xA8   # (a | b) & c


class _HalfArith:
    """f16x2 / bf16x2 add, sub, fma; bf16 add/sub below sm_90 as ``fma.rn.bf16x2`` with 1.0 (one rounding, the same
    result)."""

    def __init__(self, b: _Builder, dtype: str, arch):
        self.b, self.dtype = b, dtype
        self.t = "f16" if dtype == "float16" else "bf16"
        self.native = dtype == "float16" or as_arch(arch).satisfies(isa.FEATURES["add.bf16x2"].min_arch)
        self.one = _const2(_half_bits(1.0, dtype))
        self.neg_one = _const2(_half_bits(-1.0, dtype))

    def add(self, a, c, dst):
        if self.native:
            return self.b.op(f"add.rn.{self.t}x2", a, c, dst=dst)
        return self.b.op("fma.rn.bf16x2", a, self.one, c, dst=dst)

    def sub(self, a, c, dst):
        if self.native:
            return self.b.op(f"sub.rn.{self.t}x2", a, c, dst=dst)
        if isinstance(c, str):
            return self.b.op("fma.rn.bf16x2", c, self.neg_one, a, dst=dst)
        return self.b.op("fma.rn.bf16x2", a, self.one, c ^ 0x80008000, dst=dst)

    def fma(self, a, m, c, dst):
        return self.b.op(f"fma.rn.{self.t}x2", a, m, c, dst=dst)


# ------------------------------------------------------------------------------------------------- fast programs
def _table_words(byte_values) -> tuple:
    """An 8-byte prmt table (entry j = byte j) as its two source registers (low word, high word)."""
    by = list(byte_values)
    return sum(v << (8 * j) for j, v in enumerate(by[:4])), sum(v << (8 * j) for j, v in enumerate(by[4:]))


def _e2m1_table_bytes() -> tuple:
    """(low word, high word) of the 8-byte prmt table: high byte of the f16 of E2M1 magnitude code 0..7."""
    vals = get_format("float4_e2m1fn").table[:8]
    bits = [_half_bits(v, "float16") for v in vals]
    if any(x & 0xFF for x in bits):
        raise AssertionError("an E2M1 magnitude has a nonzero f16 low byte; the one-byte LUT would be wrong")
    return _table_words(x >> 8 for x in bits)


def _nf4_table_planes(dtype: str) -> tuple:
    """(low bytes of codes 0-7, of 8-15, high bytes of 0-7, of 8-15), each as two u32 (4 bytes each, code order) of
    the f16 / bf16 images of the NF4 values, each rounded once from its float32 (what the reference converter's
    cvt.rn gives in mode "none")."""
    halves = [_half_bits(float(np.float32(v)), dtype) for v in NF4_TABLE]

    def plane(codes, shift):
        return _table_words((halves[c] >> shift) & 0xFF for c in codes)

    return plane(range(8), 0), plane(range(8, 16), 0), plane(range(8), 8), plane(range(8, 16), 8)


@functools.lru_cache(maxsize=None)
def _nf4_double_rounding_codes(dtype: str) -> frozenset:
    """NF4 codes c for which ``cvt.rn(mul.rn.f32(S, table[c]))`` differs from the once-rounded ``table[c] * S`` for
    some finite ``dtype`` scale S: found by trying all 65536 scale bit patterns (f16: {2}, bf16: none). The table
    build rounds exactly these products to odd first; a plain float32 product is exact for every other code."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    with np.errstate(invalid="ignore"):
        s = bits.astype(np.uint16).view(R.NP_HALF[dtype]).astype(np.float64)
    s = s[np.isfinite(s)]
    sf = R.f32_bits(s)
    out = set()
    for c, t in enumerate(NF4_TABLE):
        twice = R.cvt_pack_f32(0, R.mul_f32(sf, R.f32_bits(t)), dtype) & np.uint32(0xFFFF)
        once = R.round_np(float(t) * s, dtype).view(np.uint16)
        if (twice != once).any():
            out.add(c)
    return frozenset(out)


def _nf4_scaled_planes(b: _Builder, s: str, dtype: str) -> tuple:
    """Operand stage: the planes of :func:`_nf4_table_planes` (same order, eight registers) of the table
    ``table[c] * S``, S the scale in pair register ``s`` (read from its low half; both halves hold S), every entry
    rounded ONCE: a float32 product (exact but for the codes of :func:`_nf4_double_rounding_codes`, which are
    rounded to odd), then ``cvt.rn`` of entries (2k, 2k+1) into one pair, then ``prmt`` of two pairs into the
    low-byte (0x6420) and high-byte (0x7531) words of four codes."""
    st = _Staged(b)
    if dtype == "float16":
        sf = st.op("cvt.f32.f16", st.op("mov.b32", s)[0])
    else:
        sf = st.op("shl.b32", s, 16)                        # bf16 bits are the high half of its float32
    odd = _nf4_double_rounding_codes(dtype)
    vals = [sf if t == 1.0 else _odd_fma(st, sf, float(t), -0.0) if c in odd else st.op("mul.rn.f32", sf, float(t))
            for c, t in enumerate(NF4_TABLE)]
    cvt = "cvt.rn.f16x2.f32" if dtype == "float16" else "cvt.rn.bf16x2.f32"
    pairs = [st.op(cvt, vals[2 * k + 1], vals[2 * k]) for k in range(8)]          # {entry 2k, entry 2k + 1}

    def plane(first, sel):      # codes first .. first + 7: two words of four bytes each, code order
        return tuple(st.op("prmt.b32", pairs[first // 2 + 2 * j], pairs[first // 2 + 2 * j + 1], sel)
                     for j in range(2))

    return plane(0, 0x6420), plane(8, 0x6420), plane(0, 0x7531), plane(8, 0x7531)


def _build_fast(b: _Builder, fmt: Format, dtype: str, mode: str, arch, variant: str, nreg: int):
    ar = _HalfArith(b, dtype, arch)
    bits = fmt.bits
    magic, neg_magic = MAGIC[dtype], NEG_MAGIC[dtype]
    marlin = variant == "marlin"
    out = [b.declare(f"o{i}", "u32") for i in range(nreg)]

    # operand preparation (stage "operand": reads only s_i / z_i)
    sp, zp = [f"s{i}" for i in range(nreg)], [f"z{i}" for i in range(nreg)]
    if fmt.name == "nvfp4":
        for i in range(nreg):
            lo, _ = b.op("mov.b32", sp[i], stage="operand")
            sp[i] = b.op("cvt.rn.f16x2.e4m3x2", lo, stage="operand")
    if mode == "rescale":
        zp = [b.op("lop3.b32", z, 0x80008000, 0, _XOR, stage="operand") for z in zp]
    elif mode == "quantized":
        for i in range(nreg):
            if marlin and i % 2:    # -(64 + z) = 0xD400 | z << 4 (f16, z < 16)
                z4 = b.op("shl.b32", zp[i], 4, stage="operand")
                zp[i] = b.op("lop3.b32", z4, _const2(0xD400), 0, _OR, stage="operand")
            else:                   # -(MAGIC + z) = NEG_MAGIC | z
                zp[i] = b.op("lop3.b32", zp[i], _const2(neg_magic), 0, _OR, stage="operand")

    # base decode: o_i = MAGIC + q (ints), or the value itself (floats)
    if fmt.name == "float8_e5m2":
        for i, sel in enumerate((0x1404, 0x3424)):
            b.op("prmt.b32", "w", 0, sel, dst=out[i])
    elif fmt.name == "float8_e4m3fn":
        lo, hi = b.op("mov.b32", "w")
        for i, h in enumerate((lo, hi)):
            b.op("cvt.rn.f16x2.e4m3x2", h, dst=out[i])
    elif fmt.name == "nf4":
        # 16-entry LUT of 16-bit values from two byte planes: prmt looks up 8-entry byte tables with the code's low
        # three bits (codes 0-7 and 8-15 separately), a third prmt picks per byte by code bit 3, a fourth pairs low
        # and high bytes into the two halves of an output register. Mode "none": the planes are immediates; "scale":
        # registers, one table per register pair (0, 1) / (2, 3), built from s0 / s2 in the operand stage
        planes = ([_nf4_table_planes(dtype)] * 2 if mode == "none" else
                  [_nf4_scaled_planes(b, sp[2 * p], dtype) for p in range(2)])
        t = b.op("prmt.b32", "w", "w", 0x3120)          # nibbles (n0, n1, n4, n5 | n2, n3, n6, n7)
        # code bit 3 as byte masks, by prmt's sign-replication mode: t << 4 puts n0, n4, n2, n6's bit 3 at the top
        # of bytes 0..3, t has n1, n5, n3, n7's there; byte k of a mask is 0xFF where code k takes table b
        u = b.op("shl.b32", t, 4)
        masks = (b.op("prmt.b32", u, t, 0xD9C8), b.op("prmt.b32", u, t, 0xFBEA))     # (n0, n1, n4, n5) / (n2, ..)
        for (lo_a, lo_b, hi_a, hi_b), s_, m, regs in zip(planes, (t, b.op("shr.b32", t, 16)), masks,
                                                          ((0, 1), (2, 3))):
            idx = b.op("lop3.b32", s_, 0x7777, 0, _AND)                      # low three bits: byte selectors
            lo = b.op("lop3.b32", b.op("prmt.b32", lo_a[0], lo_a[1], idx), b.op("prmt.b32", lo_b[0], lo_b[1], idx),
                      m, _SEL_C)
            hi = b.op("lop3.b32", b.op("prmt.b32", hi_a[0], hi_a[1], idx), b.op("prmt.b32", hi_b[0], hi_b[1], idx),
                      m, _SEL_C)
            b.op("prmt.b32", lo, hi, 0x6240, dst=out[regs[0]])               # (n0, n4) / (n2, n6)
            b.op("prmt.b32", lo, hi, 0x7351, dst=out[regs[1]])               # (n1, n5) / (n3, n7)
    elif fmt.name in ("float4_e2m1fn", "nvfp4"):
        t_lo, t_hi = _e2m1_table_bytes()
        t = b.op("prmt.b32", "w", "w", 0x3120)          # bytes (e0|e2, e1|e3, e4|e6, e5|e7)
        u = b.op("shl.b32", t, 4)
        st = b.op("lop3.b32", t, 0x70707070, 0x08080808, _AND_OR)   # magnitude nibbles; bit 3 -> byte 0x00
        su = b.op("lop3.b32", u, 0x70707070, 0x08080808, _AND_OR)
        sels = [su, st, b.op("shr.b32", su, 16), b.op("shr.b32", st, 16)]
        signs = [b.op("shl.b32", "w", 12), b.op("shl.b32", "w", 8), b.op("shl.b32", "w", 4), "w"]
        for i in range(nreg):
            b.op("prmt.b32", t_lo, t_hi, sels[i], dst=out[i])
            b.op("lop3.b32", out[i], signs[i], 0x80008000, _OR_AND, dst=out[i])
    elif bits == 8 and dtype == "bfloat16":
        # 8-bit codes overflow the 7 mantissa bits of the bf16 magic 128.0: x = 128 + (q & 0x7F) (magic with the low
        # seven bits), c = 128 or 256 by code bit 7, and x - c is the exact value (|v| < 256 fits bf16's 8 bits):
        # two's complement v = q_lo - 128 q7 (c = 128 | q7 << 7 = 0x4300 / 0x4380), offset binary v = q_lo + 128 q7
        # - 128 (c = 0x4380 ^ q7 << 7); uint8 as two's complement of q ^ 0x80, plus 128 (exact)
        src = b.op("lop3.b32", "w", 0x80808080, 0, _XOR) if fmt.kind == "uint" else "w"
        # c = 256.0 (the magic's exponent + 1) ^ q7 << 7, or 128.0 (the magic) | q7 << 7
        cval, clut = (_const2(magic | 0x80), _AND_XOR) if fmt.storage == "offset_binary" else (_const2(magic), _AND_OR)
        for i, sel in enumerate((0x4140, 0x4342)):
            t = b.op("prmt.b32", src, 0, sel)                                    # {byte, 0} halves
            x = b.op("lop3.b32", t, 0x007F007F, _const2(magic), _AND_OR)
            c = b.op("lop3.b32", t, 0x00800080, cval, clut)
            ar.sub(x, c, out[i])
            if fmt.kind == "uint":
                ar.add(out[i], _const2(_half_bits(128.0, dtype)), out[i])
    elif bits == 8:
        src = b.op("lop3.b32", "w", 0x80808080, 0, _XOR) if fmt.storage == "twos_complement" else "w"
        for i, sel in enumerate((0x4140, 0x4342)):
            b.op("prmt.b32", src, _const2((magic >> 8) * 0x101), sel, dst=out[i])   # {MAGIC_hi, byte} halves
    else:
        mask = ((1 << bits) - 1) * 0x10001
        if fmt.storage == "twos_complement":
            c, lut = _const2(magic | (1 << (bits - 1))), _AND_XOR
        else:
            c, lut = _const2(magic), _AND_OR
        if marlin:
            hi_c = _const2(magic | 0x80) if fmt.storage == "twos_complement" else _const2(magic)
            upper = b.op("shr.b32", "w", 8)
            for i, (src, m, cc) in enumerate((("w", mask, c), ("w", mask << 4, hi_c),
                                              (upper, mask, c), (upper, mask << 4, hi_c))):
                b.op("lop3.b32", src, m, cc, lut, dst=out[i])
        else:
            for i in range(nreg):
                src = "w" if i == 0 else b.op("shr.b32", "w", bits * i)
                b.op("lop3.b32", src, mask, c, lut, dst=out[i])

    # finish: exact integer value (no scale involved), then the mode
    neg_zero = _const2(0x8000)
    if fmt.kind == "lut":           # nf4: the table holds the final (scaled) values
        return out
    for i, o in enumerate(out):
        if fmt.kind == "float" or (bits == 8 and dtype == "bfloat16"):
            pass
        elif marlin and i % 2:      # o = 1024 + 16q: (o / 16) - 64 (- 8 signed, - z quantized), exact
            sixteenth = _const2(_half_bits(1 / 16, dtype))
            if mode == "quantized":
                ar.fma(o, sixteenth, zp[i], o)
            else:
                ar.fma(o, sixteenth, _const2(_half_bits(-72.0 if fmt.signed else -64.0, dtype)), o)
        elif mode == "quantized":
            ar.add(o, zp[i], o)     # (MAGIC + q) + -(MAGIC + z) = q - z exactly, one add
        elif fmt.kind == "uint":
            ar.sub(o, _const2(magic), o)
        elif fmt.storage == "plus_minus_one":
            ar.sub(o, _const2(magic), o)
            ar.fma(o, _const2(_half_bits(2.0, dtype)), _const2(_half_bits(-1.0, dtype)), o)
        else:
            ar.sub(o, _const2(magic + (1 << (bits - 1))), o)
        if mode == "original":
            ar.sub(o, zp[i], o)
        if mode in ("scale", "original", "quantized"):
            ar.fma(o, sp[i], neg_zero, o)   # -0.0 addend: the signed zeros of a plain multiply
        elif mode == "rescale":
            ar.fma(o, sp[i], zp[i], o)      # zp = -Z: one rounding of w*S - Z
    return out


# -------------------------------------------------------------------------------------------- reference programs
def _value_f32(b: _Builder, fmt: Format, q: str) -> str:
    """f32 register (or u32 register of f32 bits) holding the exact value of code register ``q``."""
    bits = fmt.bits
    if fmt.kind == "uint":
        return b.op("cvt.rn.f32.u32", q)
    if fmt.kind == "int":
        if fmt.storage == "plus_minus_one":
            return b.op("fma.rn.f32", b.op("cvt.rn.f32.u32", q), 2.0, -1.0)
        if fmt.storage == "twos_complement":
            q = b.op("lop3.b32", q, 1 << (bits - 1), 0, _XOR)   # -> offset binary
        return b.op("add.rn.f32", b.op("cvt.rn.f32.u32", q), -float(1 << (bits - 1)))
    if fmt.kind == "lut":       # select tree over the float32 bit patterns, one mask per index bit
        level = [_f32_bits(v) for v in NF4_TABLE]
        for j in range(4):
            m = b.op("bfe.s32", q, j, 1)
            level = [b.op("lop3.b32", level[2 * k], level[2 * k + 1], m, _SEL_C) for k in range(len(level) // 2)]
        return level[0]
    name = "float4_e2m1fn" if fmt.name in ("mxfp4", "nvfp4") else fmt.name
    return _minifloat_f32(b, name, q)


def _minifloat_f32(b: _Builder, name: str, q: str) -> str:
    """Exact float32 of an e2m1 / e4m3 / e5m2 / e8m0 code: exponent|mantissa placed in the float32 fields, then one
    exact power-of-two multiply re-biases (subnormals included); NaN / inf codes fixed up with a mask."""
    if name == "float8_e8m0fnu":
        t = b.op("shl.b32", q, 23)
        n0 = b.op("set.eq.u32.u32", q, 0)
        n255 = b.op("set.eq.u32.u32", q, 255)
        fix = b.op("lop3.b32", n0, n255, 0x00400000, _OR_OR_AND)   # 2^-127 (subnormal) / quiet-NaN bit
        return b.op("lop3.b32", t, fix, 0, _OR)
    man, bias, mag_mask = {"float4_e2m1fn": (1, 1, 0x7), "float8_e4m3fn": (3, 7, 0x7F),
                           "float8_e5m2": (2, 15, 0x7F)}[name]
    sign_shift = 28 if name == "float4_e2m1fn" else 24
    a = b.op("lop3.b32", q, mag_mask, 0, _AND)
    t = b.op("shl.b32", a, 23 - man)
    s = b.op("shl.b32", q, sign_shift)
    fbits = b.op("lop3.b32", s, t, 0x80000000, _AC_OR_B)
    v = b.op("mul.rn.f32", fbits, 2.0 ** (127 - bias))
    if name == "float8_e4m3fn":             # S.1111.111 = NaN
        n = b.op("set.eq.u32.u32", a, 0x7F)
        v = b.op("lop3.b32", v, n, 0, _OR)
    elif name == "float8_e5m2":             # exponent 31: inf (m = 0) / NaN
        e = b.op("lop3.b32", q, 0x7C, 0, _AND)
        n = b.op("set.eq.u32.u32", e, 0x7C)
        v = b.op("lop3.b32", v, n, 0x7F800000, _OR_AND)
    return v


def _odd_fma(b: _Builder, x, y, c) -> str:
    """x*y + c rounded to odd in float32 (truncate, then set the last bit if inexact): a later single rounding to
    f16 / bf16 is then the correct rounding of the exact value."""
    rz = b.op("fma.rz.f32", x, y, c)
    rm = b.op("fma.rm.f32", x, y, c)
    rp = b.op("fma.rp.f32", x, y, c)
    inexact = b.op("lop3.b32", rm, rp, 1, _XOR_AND)
    return b.op("lop3.b32", rz, inexact, 0, _OR)


def _build_reference(b: _Builder, fmt: Format, dtype: str, mode: str, nreg: int):
    bits = fmt.bits
    pos = bit_positions(bits)
    out = [b.declare(f"o{i}", "u32") for i in range(nreg)]
    exact_product = fmt.kind in ("uint", "int")     # <= 8-bit integers x 8/11-bit scales fit float32
    scale_f, zero_f, halves = {}, {}, {}

    def half16(name):       # the two b16 halves of a pair (mov.b32 unpack, free in SASS)
        if name not in halves:
            halves[name] = b.op("mov.b32", name, stage="operand")
        return halves[name]

    def scale(i, h):        # f32 scale of half h of pair s_i (operand stage)
        if (i, h) in scale_f:
            return scale_f[(i, h)]
        s = f"s{i}"
        if fmt.block_size is not None:
            code = b.op("bfe.u32", s, 8 * h, 8, stage="operand")
            v = _minifloat_f32(_Staged(b), fmt.scale_format, code)
        elif dtype == "bfloat16":
            v = (b.op("shl.b32", s, 16, stage="operand") if h == 0 else
                 b.op("lop3.b32", s, 0xFFFF0000, 0, _AND, stage="operand"))
        else:
            v = b.op("cvt.f32.f16", half16(s)[h], stage="operand")
        scale_f[(i, h)] = v
        return v

    def zero(i, h):
        if (i, h) in zero_f:
            return zero_f[(i, h)]
        z = f"z{i}"
        if mode == "quantized":
            zc = (b.op("lop3.b32", z, 0xFFFF, 0, _AND, stage="operand") if h == 0 else
                  b.op("shr.b32", z, 16, stage="operand"))
            v = b.op("cvt.rn.f32.u32", zc, stage="operand")
        elif dtype == "bfloat16":
            v = (b.op("shl.b32", z, 16, stage="operand") if h == 0 else
                 b.op("lop3.b32", z, 0xFFFF0000, 0, _AND, stage="operand"))
        else:
            v = b.op("cvt.f32.f16", half16(z)[h], stage="operand")
        if mode == "rescale":
            v = b.op("lop3.b32", v, 0x80000000, 0, _XOR, stage="operand")    # -Z, exact
        zero_f[(i, h)] = v
        return v

    for i in range(nreg):
        r = []
        for h in range(2):
            e = 2 * i + h
            q = b.op("bfe.u32", "w", pos[e], bits)
            v = _value_f32(b, fmt, q)
            if mode == "none":
                pass
            elif mode == "rescale":
                v = _odd_fma(b, v, scale(i, h), zero(i, h))
            else:
                if mode == "original":
                    v = b.op("sub.rn.f32", v, zero(i, h))
                elif mode == "quantized":
                    v = b.op("sub.rn.f32", v, zero(i, h))    # q - z, exact
                if exact_product and mode != "original":
                    v = b.op("fma.rn.f32", v, scale(i, h), -0.0)
                else:
                    v = _odd_fma(b, v, scale(i, h), -0.0)
            r.append(v)
        b.op("cvt.rn.f16x2.f32" if dtype == "float16" else "cvt.rn.bf16x2.f32", r[1], r[0], dst=out[i])
    return out


class _Staged:
    """A builder view that tags every op as operand-stage (for helpers shared with the per-element path)."""

    def __init__(self, b: _Builder):
        self._b = b

    def op(self, ptx, *src, dst=None, stage="operand"):
        return self._b.op(ptx, *src, dst=dst, stage="operand")


# ------------------------------------------------------------------------------------------------------ the program
@dataclass(frozen=True)
class DecodeProgram:
    """Ops decoding one 32-bit word of ``format`` codes into ``registers`` f16x2 / bf16x2 outputs (see module doc).

    ``ops``: the instructions in program order; ``dtypes``: register name -> "u32" / "s32" / "f32" / "u16".
    """

    format: str
    out_dtype: str
    mode: str
    arch: str
    fast: bool
    variant: str
    ops: tuple = field(repr=False)
    dtypes: dict = field(repr=False, compare=False)

    @property
    def fmt(self) -> Format:
        return get_format(self.format)

    @property
    def bits(self) -> int:
        return self.fmt.bits

    @property
    def elements(self) -> int:
        return 32 // self.bits

    @property
    def registers(self) -> int:
        return self.elements // 2

    @property
    def inputs(self) -> tuple:
        regs = range(self.registers)
        return ("w", *(f"s{i}" for i in regs if self.mode != "none"),
                *(f"z{i}" for i in regs if self.mode in ("original", "rescale", "quantized")))

    @property
    def outputs(self) -> tuple:
        return tuple(f"o{i}" for i in range(self.registers))

    @property
    def hoist_operands(self) -> bool:
        """Whether kernels should emit the operand stage once per scale group (:meth:`emit_operands`) instead of
        per word: True where it is a table build (nf4 "scale" fast: 32-36 ops per row against 23 word ops); every
        other operand stage is at most 3 ops per pair and kernels keep the per-word form (and their code)."""
        return self.shared_scale_slots > 1

    @property
    def shared_scale_slots(self) -> int:
        """Consecutive decode-order slots that must share one scale: 4 for the nf4 "scale" fast program (output
        registers (0, 1) / (2, 3) look up one table each, built from s0 / s2; s1 / s3 are not read), else 1."""
        return 4 if self.fast and self.fmt.kind == "lut" and self.mode == "scale" else 1

    def __str__(self):
        head = (f"# {self.format} -> {self.out_dtype}, mode {self.mode}, {self.arch}, "
                f"{'fast' if self.fast else 'reference'}{'/' + self.variant if self.fast else ''}")
        return "\n".join([head, *(("  " if op.stage == "word" else "  [operand] ") + str(op) for op in self.ops)])

    # ---- counts -------------------------------------------------------------------------------------------
    def op_counts(self, stage=None, shared=False) -> Counter:
        """Instructions per word by mnemonic (``stage``: None = all, "word", "operand"). Operand-stage ops count
        as in the program (every pair distinct) or, with ``shared=True``, as :meth:`emit` issues them when every
        s_i (and z_i) is one pair: the cost per distinct pair, e.g. one nf4 table build."""
        ops = self.ops
        if shared:
            alias = {f"{p}{i}": f"{p}0" for p in "sz" for i in range(1, self.registers)}
            ops = list(_dedup_operands(ops, alias))
        return Counter(op.ptx for op in ops if stage is None or op.stage == stage)

    def sass_counts(self, stage=None, shared=False) -> Counter:
        """Per-word count per SASS class of :data:`SASS_CLASS` (LOP3, PRMT, SHIFT, HALF2, F2FP, FFMA, FMUL,
        CVT_F16_F32; other mnemonics under their own name); ``shared`` as in :meth:`op_counts`."""
        out = Counter()
        for name, n in self.op_counts(stage, shared).items():
            cls = SASS_CLASS.get(name, name)
            if cls is not None:
                out[cls] += n
        return out

    def per_8_weights(self, stage="word") -> float:
        """Instructions (excluding the free ``mov.b32`` unpack) per 8 decoded weights."""
        n = sum(v for k, v in self.op_counts(stage).items() if k != "mov.b32")
        return n * 8 / self.elements

    # ---- CPU evaluation -----------------------------------------------------------------------------------
    def evaluate(self, words, scales=None, zeros=None) -> np.ndarray:
        """Run the ops on numpy: ``words`` [...] -> values [..., E] of ``out_dtype`` (decode-order slots).

        ``scales`` / ``zeros``: per-element arrays broadcastable to [..., E] (see :func:`operand_pairs` for the
        values each mode takes); packed into the s_i / z_i pairs exactly as the kernel passes them.
        """
        words = np.asarray(words)
        if not np.issubdtype(words.dtype, np.integer):
            raise ArgumentError(f"words must be 32-bit integers, got {words.dtype}")
        env = {"w": R.u32(words)}
        shape = words.shape + (self.elements,)
        need_s, need_z = self.mode != "none", self.mode in ("original", "rescale", "quantized")
        for what, given, need in (("scales", scales, need_s), ("zeros", zeros, need_z)):
            if (given is None) == need:
                raise ArgumentError(f"mode {self.mode!r} {'needs' if need else 'takes no'} {what}")
        k = self.shared_scale_slots
        if need_s and k > 1:        # one table per register pair: its slots must share the scale, bit for bit
            sb = np.broadcast_to(scales, shape).astype(R.NP_HALF[self.out_dtype]).view(np.uint16)
            sb = sb.reshape(*words.shape, self.elements // k, k)
            if (sb != sb[..., :1]).any():
                raise ArgumentError(f"the fast {self.format} 'scale' decode builds one table per output register "
                                    f"pair: slots {k}j .. {k}j + {k - 1} (registers 2j, 2j + 1) must share one "
                                    f"scale; use fast=False for per-element scales")
        if need_s:
            kind = "scale_code" if self.fmt.block_size is not None else "value"
            for i, p in enumerate(operand_pairs(np.broadcast_to(scales, shape), kind, self.out_dtype)):
                env[f"s{i}"] = p
        if need_z:
            kind = "zero_code" if self.mode == "quantized" else "value"
            if kind == "zero_code":
                zc = np.broadcast_to(zeros, shape)
                if not np.issubdtype(np.asarray(zc).dtype, np.integer) or zc.min() < 0 or zc.max() >= (1 << self.bits):
                    raise ArgumentError(f"quantized zeros must be integer codes in [0, {(1 << self.bits) - 1}]")
            for i, p in enumerate(operand_pairs(np.broadcast_to(zeros, shape), kind, self.out_dtype)):
                env[f"z{i}"] = p
        with np.errstate(invalid="ignore", over="ignore"):
            for op in self.ops:
                _, src_dt, fn = _SPEC[op.ptx]
                args = [(_imm_bits(s.value, dt) if dt != "imm" else s.value) if isinstance(s, Imm) else env[s]
                        for s, dt in zip(op.src, src_dt)]
                for name, val in zip(op.dst, fn(*args)):
                    env[name] = np.broadcast_to(R.u32(val), words.shape)
        out = np.empty(shape, dtype=R.NP_HALF[self.out_dtype])
        for i in range(self.registers):
            lo, hi = R.split2(env[f"o{i}"], self.out_dtype)
            out[..., 2 * i], out[..., 2 * i + 1] = lo, hi
        return out

    # ---- TIR emission -------------------------------------------------------------------------------------
    def emit(self, word, out_regs, scale_pair=None, zero_pair=None, *, operands=None) -> tuple:
        """Append the ops to the kernel being parsed; returns the ops emitted (operand ops once per distinct pair).

        ``word``: a uint32 / int32 expression (best a register: it is read by several instructions).
        ``out_regs``: ``registers`` uint32 lvalues (buffer elements), output i = slots (2i, 2i+1).
        ``scale_pair`` / ``zero_pair``: one uint32 expression for every register, or a sequence of ``registers``.
        ``operands``: instead of the pairs, an :class:`OperandRegisters` filled by :meth:`emit_operands`; then only
        the word-stage ops are emitted, reading the operand-stage results from it.
        """
        from tvm.script import tirx as T

        if len(out_regs) != self.registers:
            raise ArgumentError(f"{self.format} decodes into {self.registers} registers per word, "
                                f"got {len(out_regs)} out_regs")
        if operands is not None:
            if scale_pair is not None or zero_pair is not None:
                raise ArgumentError("pass either operands= (from emit_operands) or scale_pair / zero_pair, not both")
            if not isinstance(operands, OperandRegisters) or operands.program != self:
                raise ArgumentError("operands= must be this program's OperandRegisters (program.emit_operands(...) "
                                    "or an index of program.alloc_operands(...) filled by emit_operands)")
            if operands.alias is None:
                raise ArgumentError("these operand registers were allocated but never filled: call "
                                    "emit_operands(..., into=...) before emit(..., operands=...)")
            bind, alias = {"w": word, **operands.bind()}, dict(operands.alias)
            ops = [op for op in self.ops if op.stage == "word"]
        else:
            bind = {"w": word, **self._bind_pairs(scale_pair, zero_pair)}
            alias = _alias_equal_inputs(bind, self.registers)
            ops = self.ops
        for i, r in enumerate(out_regs):
            bind[f"o{i}"] = r
        temps = [n for n in self.dtypes if n not in bind and (operands is None or n not in self.inputs)]
        for dt in sorted({self.dtypes[n] for n in temps}):
            names = [n for n in temps if self.dtypes[n] == dt]
            buf = T.alloc_local((len(names),), _DT[dt])
            for k, n in enumerate(names):
                bind[n] = buf[k]
        return self._emit_ops(ops, bind, alias)

    def alloc_operands(self, *shape) -> "OperandRegisters":
        """Allocate (``T.alloc_local``, where the kernel is being parsed) registers for the operand-stage results
        of ``shape`` independent operand sets, e.g. one per n16 block a warp decodes; index the result (``regs[j]``,
        j an int or a TIR expression) to fill one set with :meth:`emit_operands` and read it in :meth:`emit`."""
        return OperandRegisters.allocate(self, shape)

    def emit_operands(self, scale_pair=None, zero_pair=None, *, into=None) -> "OperandRegisters":
        """Emit the operand-stage ops ONCE (deduplicated as :meth:`emit` does) into registers; returns them for any
        number of ``emit(word, out_regs, operands=...)`` (the word-stage ops only).

        ``scale_pair`` / ``zero_pair``: as in :meth:`emit`. ``into``: registers from :meth:`alloc_operands` (one
        index of them) to fill; None allocates a fresh set here. The raw pairs the word stage reads itself (e.g.
        the ``fma`` with s_i of the magic-number programs) are copied into the registers too, so the handle holds
        the operand values of this point of the kernel. Emitting the operand stage where the scale of a group is
        loaded (not per word) is what makes a table-building program (nf4 "scale") cheap per word.
        """
        from ..emitters.builder import store

        regs = OperandRegisters.allocate(self, ()) if into is None else into
        if not isinstance(regs, OperandRegisters) or regs.program != self:
            raise ArgumentError("into= must be OperandRegisters of this program (program.alloc_operands(...)[j])")
        if regs.shape:
            raise ArgumentError(f"into= has {len(regs.shape)} unindexed dimension(s) of shape {list(regs.shape)}; "
                                f"index it to one operand set (into=regs[j])")
        bind = self._bind_pairs(scale_pair, zero_pair)
        alias = _alias_equal_inputs(bind, self.registers)
        given = dict(bind)
        bind.update(regs.bind())
        for name in regs.captured:
            if name not in alias:   # an aliased pair reads the register of the (earlier) pair it equals
                store(regs.buffers["u32"], _tir_operand(given[name], "u32"), (*regs.index, regs.slots[name][1]))
        emitted = self._emit_ops([op for op in self.ops if op.stage == "operand"], bind, alias)
        regs.set_alias(alias)
        regs.ops = emitted
        return regs

    def _bind_pairs(self, scale_pair, zero_pair) -> dict:
        bind = {}
        for prefix, given, need in (("s", scale_pair, self.mode != "none"),
                                    ("z", zero_pair, self.mode in ("original", "rescale", "quantized"))):
            if (given is None) == need:
                raise ArgumentError(f"mode {self.mode!r} {'needs' if need else 'takes no'} "
                                    f"{'scale_pair' if prefix == 's' else 'zero_pair'}")
            if given is None:
                continue
            seq = list(given) if isinstance(given, (list, tuple)) else [given] * self.registers
            if len(seq) != self.registers:
                raise ArgumentError(f"pass one {prefix}-pair or {self.registers}, got {len(seq)}")
            for i, e in enumerate(seq):
                bind[f"{prefix}{i}"] = e
        return bind

    def _emit_ops(self, ops, bind, alias) -> tuple:
        from tvm.script import tirx as T

        from ..emitters.builder import emit

        emitted = []
        for op in _dedup_operands(ops, alias):
            _, src_dt, _ = _SPEC[op.ptx]
            args = [_tir_operand(bind[s], dt) if isinstance(s, str) else _tir_imm(s.value, dt)
                    for s, dt in zip(op.src, src_dt)]
            dsts = [bind[d] for d in op.dst]
            emit(T.ptx[op.ptx](*dsts, *args))
            emitted.append(op)
        return tuple(emitted)


class OperandRegisters:
    """Registers holding a program's operand-stage results (and the raw s_i / z_i its word stage reads), filled by
    :meth:`DecodeProgram.emit_operands` and read by ``DecodeProgram.emit(..., operands=...)``.

    ``shape``: the unindexed leading dimensions (one operand set per index); ``regs[j]`` names set j. ``alias``:
    program register -> the register holding its value (equal pairs, deduplicated ops), set by ``emit_operands``
    and shared by every index of one allocation (one ``emit_operands`` parse per set layout)."""

    def __init__(self, program, slots, buffers, captured, shape, index, state):
        self.program, self.slots, self.buffers, self.captured = program, slots, buffers, captured
        self.shape, self.index, self._state = tuple(shape), tuple(index), state
        self.ops = ()

    @classmethod
    def allocate(cls, program, shape):
        from tvm.script import tirx as T

        # raw pairs the word stage reads: all of a prefix (an aliased pair reads an earlier one's register)
        word_reads = {s[0] for op in program.ops if op.stage == "word" for s in op.src if isinstance(s, str)}
        captured = tuple(n for n in program.inputs if n != "w" and n[0] in word_reads)
        names = [n for op in program.ops if op.stage == "operand" for n in op.dst]
        dtypes = {**{n: "u32" for n in captured}, **{n: program.dtypes[n] for n in names}}
        slots, buffers = {}, {}
        for dt in sorted(set(dtypes.values())):
            group = [n for n in dtypes if dtypes[n] == dt]
            buffers[dt] = T.alloc_local((*shape, len(group)), _DT[dt])
            slots.update({n: (dt, k) for k, n in enumerate(group)})
        return cls(program, slots, buffers, captured, shape, (), {"alias": None})

    def __getitem__(self, j):
        if not self.shape:
            raise ArgumentError("these operand registers are one set already; there is nothing to index")
        return OperandRegisters(self.program, self.slots, self.buffers, self.captured, self.shape[1:],
                                (*self.index, j), self._state)

    @property
    def alias(self):
        return self._state["alias"]

    def set_alias(self, alias: dict):
        if self._state["alias"] is not None and self._state["alias"] != alias:
            raise ArgumentError("emit_operands was already parsed into these registers with other equal pairs; "
                                "pairs that are structurally equal in one set must be so in every set")
        self._state["alias"] = dict(alias)

    def bind(self) -> dict:
        """Program register name -> its TIR lvalue in this (fully indexed) set."""
        if self.shape:
            raise ArgumentError(f"index the operand registers (shape {list(self.shape)}) to one set first")
        return {n: self.buffers[dt][(*self.index, k)] for n, (dt, k) in self.slots.items()}


def _dedup_operands(ops, alias):
    """The ops with their sources renamed through ``alias``; an operand-stage op repeating an earlier one (same
    mnemonic, same renamed sources) is dropped and its destinations are aliased to the earlier op's."""
    seen = {}
    for op in ops:
        src = tuple(alias.get(s, s) if isinstance(s, str) else s for s in op.src)
        if op.stage == "operand":
            key = (op.ptx, src)
            if key in seen:
                for d, prev in zip(op.dst, seen[key]):
                    alias[d] = prev
                continue
            seen[key] = op.dst
        yield Op(op.ptx, op.dst, src, op.stage)


def _alias_equal_inputs(bind: dict, nreg: int) -> dict:
    """s_i / z_i bound to an expression structurally equal to an earlier one's -> that earlier name."""
    import tvm_ffi

    alias = {}
    for prefix in ("s", "z"):
        for i in range(nreg):
            name = f"{prefix}{i}"
            if name not in bind:
                continue
            for j in range(i):
                if tvm_ffi.structural_equal(bind[name], bind[f"{prefix}{j}"]):
                    alias[name] = alias.get(f"{prefix}{j}", f"{prefix}{j}")
                    break
    return alias


def _imm_bits(value, dt):
    if dt == "f32":
        return np.uint32(_f32_bits(value))
    return np.uint32(int(value) & 0xFFFFFFFF)


def _tir_imm(value, dt):
    from tvm.script import tirx as T

    if dt == "imm":
        return T.int32(value)
    if dt == "f32":
        return T.float32(value)
    if dt == "s32":
        return T.int32(value)
    return T.uint32(int(value) & 0xFFFFFFFF)


def _tir_operand(expr, dt):
    from tvm.script import tirx as T

    want = _DT[dt]
    ty = getattr(expr, "ty", None)
    have = str(ty.dtype if ty is not None and hasattr(ty, "dtype") else expr.dtype)
    if have == want:
        return expr
    if have in ("uint32", "int32", "float32") and want in ("uint32", "int32", "float32"):
        return T.reinterpret(want, expr)
    raise ArgumentError(f"operand of dtype {have} cannot feed a {want} slot")


# ----------------------------------------------------------------------------------------------------- host side
def operand_pairs(values, kind: str, out_dtype="float16") -> list:
    """Per-element operands [..., E] -> the R uint32 pair registers s_i / z_i a kernel passes (numpy).

    ``kind``: "value" (f16 / bf16 scales or zeros: their bits in the low / high 16 bits), "zero_code" (integer
    zero codes, each zero-extended in its 16-bit half) or "scale_code" (block-format scale codes in bytes 0 / 1).
    """
    dtype = half_name(out_dtype)
    v = np.asarray(values)
    if kind == "value":
        bits = v.astype(R.NP_HALF[dtype]).view(np.uint16).astype(np.uint32)
        shift = 16
    elif kind in ("zero_code", "scale_code"):
        if not np.issubdtype(v.dtype, np.integer):
            raise ArgumentError(f"{kind} operands must be integer codes, got {v.dtype}")
        bits = v.astype(np.uint32)
        shift = 16 if kind == "zero_code" else 8
    else:
        raise UnsupportedConfigError(f"operand kind {kind!r} is unknown; valid: value, zero_code, scale_code")
    return [bits[..., 2 * i] | (bits[..., 2 * i + 1] << np.uint32(shift)) for i in range(v.shape[-1] // 2)]


def variants_of(fmt, out_dtype="float16") -> tuple:
    """The fast-path variants of ``fmt`` -> ``out_dtype`` (names from :data:`VARIANTS`): "shift" always, "marlin"
    (one shift per word instead of three, two of the four magic subtracts an exact ``fma`` by 1/16) for 4-bit integer
    codes to float16, whose 0x6400 magic leaves room for a code 4 bits up."""
    fmt = get_format(fmt)
    marlin = fmt.bits == 4 and half_name(out_dtype) == "float16" and fmt.kind in ("int", "uint")
    return VARIANTS if marlin else ("shift",)


def decode_program(fmt, out_dtype="float16", mode="none", arch="sm_80", fast=True,
                   variant="shift") -> DecodeProgram:
    """The decode of one 32-bit word of ``fmt`` codes into f16x2 / bf16x2 registers.

    ``mode``: "none" | "scale" | "original" | "rescale" | "quantized" or a QuantScheme. ``fast``: the magic-number /
    LUT / cvt path (:data:`FAST_DECODE`; ``UnsupportedConfigError`` or ``ArchError`` where it does not exist) or
    ``False`` for the reference converter (every format and mode, sm_80+). ``variant``: "shift" or "marlin"
    (4-bit -> f16 fast path only: one shift per word instead of three).
    """
    from ..errors import ArchError

    fmt = get_format(fmt)
    dtype = half_name(out_dtype)
    if dtype == "float32":
        raise UnsupportedConfigError("mma B fragments are float16 or bfloat16; valid: float16, bfloat16")
    mode = mode_of(mode)
    if mode not in valid_modes(fmt):
        raise UnsupportedConfigError(f"{fmt.name} has no mode {mode!r}; valid: {choices(valid_modes(fmt))}")
    a = as_arch(arch)
    if not a.satisfies("sm_80"):
        raise ArchError(f"the decode targets mma.sync m16n8k16 (sm_80+); target is {a.name}")
    if variant not in VARIANTS:
        raise UnsupportedConfigError(f"variant {variant!r} is unknown; valid: {choices(VARIANTS)}")
    b = _Builder()
    b.declare("w", "u32")
    nreg = 16 // fmt.bits
    for i in range(nreg):
        b.declare(f"s{i}", "u32")
        b.declare(f"z{i}", "u32")
    if fast:
        table = FAST_DECODE.get((fmt.name, dtype), {})
        if mode not in table:
            have = sorted(f"{f}/{d}" for (f, d) in FAST_DECODE)
            raise UnsupportedConfigError(
                f"no fast decode for {fmt.name} -> {dtype} in mode {mode!r} (fast modes here: "
                f"{choices(table) or 'none'}); use fast=False for the reference converter; fast paths: "
                f"{', '.join(have)}")
        if not a.satisfies(table[mode]):
            raise ArchError(f"the fast decode of {fmt.name} -> {dtype} needs {table[mode]} or newer "
                            f"({isa.FEATURES['cvt.e4m3x2'].ptx}); target is {a.name}; use fast=False for the "
                            f"reference converter")
        if variant not in variants_of(fmt, dtype):
            raise UnsupportedConfigError(f"the {variant} variant exists for 4-bit integer formats -> float16 only; "
                                         f"valid formats: {', '.join(f for f in FORMATS if variant in variants_of(f))}")
        _build_fast(b, fmt, dtype, mode, a, variant, nreg)
    else:
        variant = "shift"
        _build_reference(b, fmt, dtype, mode, nreg)
    used = {n for op in b.ops for n in (*op.dst, *(s for s in op.src if isinstance(s, str)))}
    dtypes = {n: d for n, d in b.dtypes.items() if n in used or n[0] == "o"}
    return DecodeProgram(fmt.name, dtype, mode, a.name, bool(fast), variant, tuple(b.ops), dtypes)


def emit_broadcast_half(dst, src, high: bool = False):
    """Emit ``prmt.b32 dst, src, src, 0x1010`` (or ``0x3232``): the pair {x, x} of src's low (high) 16 bits — how a
    kernel turns one f16 / bf16 scale or zero (or a zero code) into the s_i / z_i operand pair. One PRMT. ``high``:
    a Python bool, or a boolean PrimExpr (a per-lane choice: the selector is then computed, still one PRMT)."""
    from tvm.script import tirx as T

    from ..emitters.builder import emit

    if isinstance(high, (bool, int)):
        sel = T.uint32(0x3232 if high else 0x1010)
    else:
        sel = T.Select(high, T.uint32(0x3232), T.uint32(0x1010))
    emit(T.ptx.prmt.b32(dst, src, src, sel))


def cost_table(archs=("sm_80", "sm_90a"), dtypes=("float16", "bfloat16"), fast_only=True) -> str:
    """Markdown table of the decode cost per 8 weights (word-stage ops) for every fast path (and, with
    ``fast_only=False``, every reference program), generated from the programs; the last column counts the
    operand-stage ops of one word with every pair distinct, and in brackets those of one distinct pair (what
    ``emit_operands`` issues per scale group when all registers share it; nf4 "scale": one table build), both
    without the free ``mov.b32`` unpack."""

    rows = ["| format | out | mode | arch | path | LOP3 | PRMT | SHIFT | HALF2 | F2FP | other | per 8 weights |"
            " operand ops |", "|" + "---|" * 13]
    for name in FORMATS:
        for dtype in dtypes:
            for mode in valid_modes(name):
                for arch in archs:
                    variants = []
                    if mode in fast_modes(name, dtype, arch):
                        variants += [(True, v) for v in variants_of(name, dtype)]
                    if not fast_only:
                        variants.append((False, "shift"))
                    for fast, variant in variants:
                        p = decode_program(name, dtype, mode, arch, fast=fast, variant=variant)
                        scale = 8 / p.elements
                        c = p.sass_counts("word")
                        cls = ("LOP3", "PRMT", "SHIFT", "HALF2", "F2FP")
                        other = sum(v for k, v in c.items() if k not in cls)
                        cells = [f"{c[k] * scale:g}" for k in cls] + [f"{other * scale:g}"]
                        path = ("fast" + ("/marlin" if variant == "marlin" else "")) if fast else "reference"
                        n_all, n_one = (sum(v for k, v in p.op_counts("operand", sh).items() if k != "mov.b32")
                                        for sh in (False, True))
                        rows.append(f"| {name} | {dtype} | {mode} | {arch} | {path} | {' | '.join(cells)} | "
                                    f"{p.per_8_weights():g} | {n_all} ({n_one}) |" if n_all else
                                    f"| {name} | {dtype} | {mode} | {arch} | {path} | {' | '.join(cells)} | "
                                    f"{p.per_8_weights():g} | 0 |")
    return "\n".join(rows)
