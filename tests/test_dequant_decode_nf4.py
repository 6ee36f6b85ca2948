"""nf4 with a scale, fast: a per-row table of once-rounded products ``table[c] * S`` (operand stage) looked up with
prmt (word stage). Exhaustive over every 16-bit scale pattern (f16 and bf16) x every code against the reference
converter and ``dequantize``; the shared-scale contract; the operand-stage API (``emit_operands`` /
``emit(..., operands=)`` / ``alloc_operands``) on the CPU interpreter, the old emit form unchanged, and the tiled
kernel that builds the tables once per scale group."""
import ml_dtypes as md
import numpy as np
import pytest
import torch
from tvm.script import tirx as T

import mmaemit
from mmaemit.dequant import QuantScheme, dequantize_codes, interleave, pack
from mmaemit.dequant import decode as D
from mmaemit.dequant import regops as R
from mmaemit.emitters import builder as _ir
from mmaemit.errors import ArgumentError
from mmaemit.interpret import interpret

NP = {"float16": np.float16, "bfloat16": md.bfloat16}
DTYPES = ("float16", "bfloat16")
NAN_BELOW = {"float16": 0x7C00, "bfloat16": 0x7F80}


def _words(codes):
    """[rows, 8] nf4 codes (decode-order slots) -> the interleaved words the kernel loads."""
    plain = pack(np.asarray(codes, np.uint8), 4, axis=-1, storage="int32")[:, 0]
    return interleave(plain, 4).view(np.uint32)


def _all_patterns(dtype):
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(NP[dtype])


def _every_scale_and_code(dtype, scales):
    """Words covering every (scale, code): per scale its 16 codes as 4 quads (one register pair, one row each)."""
    s = np.repeat(scales, 16).reshape(-1, 8)
    q = np.tile(np.arange(16), len(scales)).reshape(-1, 8)
    return _words(q), q, s


def _same_bits(a, b, dtype):
    """Bit-equal, any NaN equal to any NaN (dequantize's NaNs are torch's)."""
    a, b = np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16)
    nan = lambda x: (x & 0x7FFF) > NAN_BELOW[dtype]  # noqa: E731
    bad = (a != b) & ~(nan(a) & nan(b))
    assert not bad.any(), f"{bad.sum()} mismatches, first at {np.argwhere(bad)[0]}: {a[bad][:4]} vs {b[bad][:4]}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_scaled_nf4_equals_the_reference_for_every_scale_pattern_and_code(dtype):
    """All 65536 scale bit patterns x 16 codes: the fast program's evaluate equals the reference converter bit for
    bit (inf / NaN scales included: +-inf, and the canonical NaN for 0 x inf and NaN), and dequantize (one
    rounding of the float64 product) for every finite scale: zeros, subnormals, both signs, the largest."""
    fast = D.decode_program("nf4", dtype, "scale")
    assert fast.fast and fast.shared_scale_slots == 4 and fast.hoist_operands
    words, q, s = _every_scale_and_code(dtype, _all_patterns(dtype))
    got = fast.evaluate(words, s)
    ref = D.decode_program("nf4", dtype, "scale", fast=False).evaluate(words, s)
    assert np.array_equal(got.view(np.uint16), ref.view(np.uint16))      # NaN payloads too
    with np.errstate(invalid="ignore"):
        finite = np.isfinite(s.astype(np.float64))
    want = dequantize_codes(torch.from_numpy(q[finite].astype(np.uint8)[:, None]), QuantScheme("nf4", 1),
                            torch.from_numpy(s[finite].astype(np.float32)[:, None]), out_dtype=dtype)[:, 0]
    _same_bits(got[finite], want.view(torch.int16).numpy(), dtype)
    assert finite.sum() == 16 * (63488 if dtype == "float16" else 65280)


def test_only_f16_code_2_needs_round_to_odd():
    """The table build multiplies in float32 and rounds once: exact for every finite bf16 scale and, with f16
    scales, for every code but 2 (-0.5251), whose product double-rounds for 58 scales; those go through fma
    round-to-odd (fma.rz / .rm / .rp + 2 lop3), the others are one FMUL (code 15, 1.0: the scale itself)."""
    assert D._nf4_double_rounding_codes("float16") == {2}
    assert D._nf4_double_rounding_codes("bfloat16") == frozenset()
    s = _all_patterns("float16")
    with np.errstate(invalid="ignore"):
        s = s[np.isfinite(s.astype(np.float64))]
    t = np.float32(D.NF4_TABLE[2])
    plain = R.cvt_pack_f32(0, R.mul_f32(R.f32_bits(s.astype(np.float64)), R.f32_bits(t)), "float16") & 0xFFFF
    once = R.round_np(float(t) * s.astype(np.float64), "float16").view(np.uint16)
    assert (plain != once).sum() == 58
    counts = {d: D.decode_program("nf4", d, "scale").op_counts("operand", shared=True) for d in DTYPES}
    assert counts["float16"] == {"mov.b32": 1, "cvt.f32.f16": 1, "mul.rn.f32": 14, "fma.rz.f32": 1, "fma.rm.f32": 1,
                                 "fma.rp.f32": 1, "lop3.b32": 2, "cvt.rn.f16x2.f32": 8, "prmt.b32": 8}
    assert counts["bfloat16"] == {"shl.b32": 1, "mul.rn.f32": 15, "cvt.rn.bf16x2.f32": 8, "prmt.b32": 8}
    for d in DTYPES:
        p = D.decode_program("nf4", d, "scale")
        assert p.op_counts("word") == D.decode_program("nf4", d, "none").op_counts("word") == \
            {"prmt.b32": 15, "lop3.b32": 6, "shr.b32": 1, "shl.b32": 1}
        assert p.op_counts("operand") == counts[d] + counts[d]      # two rows per word, every pair distinct
        assert p.per_8_weights() == 23
        assert p.sass_counts("operand", shared=True) == ({"CVT_F16_F32": 1, "FMUL": 14, "FFMA": 3, "LOP3": 2,
                                                          "F2FP": 8, "PRMT": 8} if d == "float16" else
                                                         {"SHIFT": 1, "FMUL": 15, "F2FP": 8, "PRMT": 8})
        assert "| nf4 | " + d + " | scale | sm_80 | fast | 6 | 15 | 2 | 0 | 0 | 0 | 23 | " + \
            ("72 (36)" if d == "float16" else "64 (32)") + " |" in D.cost_table(archs=("sm_80",))


@pytest.mark.parametrize("dtype", DTYPES)
def test_random_words_with_one_scale_per_row(dtype):
    """Random words, each register pair (one weight row) with its own random scale (wide exponents, both signs,
    zeros and subnormals among them): equal to dequantize of the codes with those per-row scales."""
    rng = np.random.default_rng(11)
    n = 20000
    q = rng.integers(0, 16, (n, 8))
    lo, hi = (-26, 16) if dtype == "float16" else (-135, 127)
    s = (rng.uniform(0.5, 1.0, (n, 2)) * 2.0 ** rng.integers(lo, hi, (n, 2)) * rng.choice([-1, 1], (n, 2)))
    s = s.astype(NP[dtype])
    s[::97] = 0
    s = np.repeat(s, 4, axis=1)
    got = D.decode_program("nf4", dtype, "scale").evaluate(_words(q), s)
    want = dequantize_codes(torch.from_numpy(q.astype(np.uint8)), QuantScheme("nf4", 1),
                            torch.from_numpy(s.astype(np.float32)), out_dtype=dtype)
    _same_bits(got, want.view(torch.int16).numpy(), dtype)


def test_shared_scale_contract():
    """One table per register pair: evaluate refuses different scales within slots 0-3 (or 4-7), and the program
    reads s0 / s2 only; pairs of different rows may differ."""
    p = D.decode_program("nf4", "float16", "scale")
    read = {s for op in p.ops for s in op.src if isinstance(s, str) and s[0] == "s"}
    assert read == {"s0", "s2"}
    w = np.zeros(3, np.uint32)
    ok = np.repeat(np.float16([[1, -2], [0.5, 3], [0, 1]]), 4, axis=1)
    p.evaluate(w, ok)
    for slot in (1, 3, 4, 7):
        bad = ok.copy()
        bad[1, slot] = np.float16(7)
        with pytest.raises(ArgumentError, match="must share one scale"):
            p.evaluate(w, bad)
    with pytest.raises(ArgumentError, match="must share one scale"):    # -0.0 vs 0.0: different bits, two tables
        p.evaluate(w, np.float16([0, 0, 0, -0.0, 1, 1, 1, 1]))
    D.decode_program("nf4", "float16", "scale", fast=False).evaluate(w, np.float16(np.arange(8)))   # per element


# ------------------------------------------------------------------------------------------------- emission
def _program_cases():
    return [D.decode_program("nf4", "float16", "scale"), D.decode_program("nf4", "bfloat16", "scale", "sm_90a"),
            D.decode_program("int4", "float16", "scale"), D.decode_program("uint4", "float16", "rescale"),
            D.decode_program("uint4", "float16", "quantized", variant="marlin"),
            D.decode_program("uint2", "bfloat16", "quantized"), D.decode_program("nvfp4", "float16", "scale", "sm_89"),
            D.decode_program("nf4", "float16", "scale", fast=False)]


def _operand_values(p, rng):
    """(scales, zeros) per element of one word, valid for the program (one scale per row pair for nf4)."""
    E = p.elements
    if p.fmt.block_size is not None:
        scales = rng.integers(0x30, 0x48, E)
    else:
        scales = np.repeat((rng.uniform(0.25, 2, E // 4) * rng.choice([-1, 1], E // 4)), 4).astype(np.float32)
    zeros = None
    if p.mode == "quantized":
        zeros = np.repeat(rng.integers(0, 1 << p.bits, E // 2), 2)
    elif p.mode == "rescale":
        zeros = np.repeat(rng.uniform(-3, 3, E // 2), 2).astype(np.float32)
    return scales, zeros


WORDS = 3       # words decoded with one set of operand registers


def test_emit_operands_once_then_words_on_the_interpreter():
    """For each program: emit_operands once from the pair registers, then emit(word, out, operands=) for three
    words. The interpreter's outputs equal evaluate's; the kernel holds the operand ops once (deduplicated as the
    per-word form does) and the word ops three times; the raw pairs a word stage reads (int4's fma with s_i) come
    from the registers captured at emit_operands."""
    progs = _program_cases()
    rng = np.random.default_rng(5)
    got_ops = {}

    def body(W, S, Z, O):
        for k, p in enumerate(progs):
            sreg = T.alloc_local((p.registers,), "uint32")
            zreg = T.alloc_local((p.registers,), "uint32")
            for i in range(p.registers):
                _ir.store(sreg, S[16 * k + i], (i,))
                _ir.store(zreg, Z[16 * k + i], (i,))
            regs = p.emit_operands([sreg[i] for i in range(p.registers)],
                                   [zreg[i] for i in range(p.registers)] if p.mode in ("rescale", "quantized")
                                   else None)
            for i in range(p.registers):          # the pairs change after the operand stage: the handle kept them
                _ir.store(sreg, T.uint32(0), (i,))
            got_ops[k] = [regs.ops]
            out = T.alloc_local((p.registers,), "uint32")
            for w in range(WORDS):
                got_ops[k].append(p.emit(W[WORDS * k + w], [out[i] for i in range(p.registers)], operands=regs))
                for i in range(p.registers):
                    _ir.store(O, out[i], (16 * (WORDS * k + w) + i,))

    n = len(progs)

    @T.prim_func
    def kernel(W: T.Buffer((n * WORDS,), "uint32"), S: T.Buffer((n * 16,), "uint32"),
               Z: T.Buffer((n * 16,), "uint32"), O: T.Buffer((n * WORDS * 16,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(W, S, Z, O)

    words = rng.integers(0, 2 ** 32, n * WORDS, dtype=np.uint64).astype(np.uint32)
    S, Z = np.zeros(n * 16, np.uint32), np.zeros(n * 16, np.uint32)
    want = []
    for k, p in enumerate(progs):
        scales, zeros = _operand_values(p, rng)
        kind = "scale_code" if p.fmt.block_size is not None else "value"
        S[16 * k:16 * k + p.registers] = [int(np.asarray(r).reshape(-1)[0]) for r in
                                          D.operand_pairs(scales, kind, p.out_dtype)]
        if zeros is not None:
            zk = "zero_code" if p.mode == "quantized" else "value"
            Z[16 * k:16 * k + p.registers] = [int(np.asarray(r).reshape(-1)[0]) for r in
                                              D.operand_pairs(zeros, zk, p.out_dtype)]
        want.append(p.evaluate(words[WORDS * k:WORDS * (k + 1)], scales, zeros))
    O = np.zeros(n * WORDS * 16, np.uint32)
    assert interpret(kernel, words, S, Z, O, arch="sm_90a").ok
    for k, p in enumerate(progs):
        operand_ops, *word_ops = got_ops[k]
        assert [op.ptx for op in operand_ops] == [op.ptx for op in p.ops if op.stage == "operand"]   # pairs distinct
        for ops in word_ops:
            assert [op.ptx for op in ops] == [op.ptx for op in p.ops if op.stage == "word"]
        for w in range(WORDS):
            got = O[16 * (WORDS * k + w):16 * (WORDS * k + w) + p.registers]
            halves = np.stack([got & 0xFFFF, got >> 16], -1).reshape(-1).astype(np.uint16)
            assert np.array_equal(halves, want[k][w].view(np.uint16)), (str(p).splitlines()[0], w)


def test_alloc_operands_fill_and_read_inside_tir_loops():
    """alloc_operands(2): operand set j filled in one unrolled TIR loop (j a loop variable), read by two words per
    set in another; outputs equal evaluate with the rows' scales."""
    p = D.decode_program("nf4", "float16", "scale")

    def fill(regs, sreg, j):
        p.emit_operands([sreg[j, 0], sreg[j, 0], sreg[j, 1], sreg[j, 1]], into=regs[j])

    def decode(regs, W, out, j, w):
        p.emit(W[2 * j + w], [out[i] for i in range(4)], operands=regs[j])

    @T.prim_func
    def kernel(W: T.Buffer((4,), "uint32"), S: T.Buffer((4,), "uint32"), O: T.Buffer((16,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        regs = T.meta_var(p.alloc_operands(2))
        sreg = T.alloc_local((2, 2), "uint32")
        out = T.alloc_local((4,), "uint32")
        for j in T.unroll(2):
            sreg[j, 0] = S[2 * j]
            sreg[j, 1] = S[2 * j + 1]
            fill(regs, sreg, j)
        for j in T.unroll(2):
            for w in T.unroll(2):
                decode(regs, W, out, j, w)
                for i in T.unroll(4):
                    O[4 * (2 * j + w) + i] = out[i]

    rng = np.random.default_rng(9)
    words = rng.integers(0, 2 ** 32, 4, dtype=np.uint64).astype(np.uint32)
    rows = (rng.uniform(0.25, 4, 4) * rng.choice([-1, 1], 4)).astype(np.float16)     # set j: rows 2j, 2j + 1
    S = rows.view(np.uint16).astype(np.uint32) * np.uint32(0x10001)
    O = np.zeros(16, np.uint32)
    assert interpret(kernel, words, S, O, arch="sm_80").ok
    scales = np.repeat(rows.reshape(2, 2), 4, axis=1)[[0, 0, 1, 1]]                  # word 2j + w: set j
    want = p.evaluate(words, scales).view(np.uint16)
    halves = np.stack([O & 0xFFFF, O >> 16], -1).reshape(4, 8).astype(np.uint16)
    assert np.array_equal(halves, want)


def test_operand_api_errors():
    p, other = D.decode_program("nf4", "float16", "scale"), D.decode_program("nf4", "bfloat16", "scale")
    seen = []

    def body(W, S, O):
        buf = T.alloc_local((4,), "uint32")
        out = [buf[i] for i in range(4)]
        regs = p.emit_operands(S[0])
        for call, match in ((lambda: p.emit(W[0], out, S[0], operands=regs), "not both"),
                            (lambda: other.emit(W[0], out, operands=regs), "this program's"),
                            (lambda: p.emit(W[0], out, operands=p.alloc_operands()), "never filled"),
                            (lambda: p.emit_operands(S[0], into=p.alloc_operands(2)), "index it"),
                            (lambda: p.emit_operands(S[0], into=other.alloc_operands()), "of this program"),
                            (lambda: p.emit_operands(), "needs scale_pair"),
                            (lambda: regs[0], "nothing to index")):
            with pytest.raises(ArgumentError, match=match):
                call()
            seen.append(match)
        p.emit(W[0], out, operands=regs)

    @T.prim_func
    def kernel(W: T.Buffer((1,), "uint32"), S: T.Buffer((1,), "uint32"), O: T.Buffer((4,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(W, S, O)

    assert len(seen) == 7


# the int4 -> f16 "scale" decode of one word with one pair S[0], as the per-word form emitted it before the
# operand-stage API existed (printed TIR, statements in order)
_INT4_SCALE_TIR = """\
buffer = T.alloc_local((4,), "uint32")
buffer_1 = T.alloc_local((3,), "uint32")
T.ptx.lop3(buffer[0], W, T.uint32(983055), T.uint32(1678271496), 106, "b32", "")
T.ptx.shr(buffer_1[0], W, T.uint32(4), "b32", "")
T.ptx.lop3(buffer[1], buffer_1[0], T.uint32(983055), T.uint32(1678271496), 106, "b32", "")
T.ptx.shr(buffer_1[1], W, T.uint32(8), "b32", "")
T.ptx.lop3(buffer[2], buffer_1[1], T.uint32(983055), T.uint32(1678271496), 106, "b32", "")
T.ptx.shr(buffer_1[2], W, T.uint32(12), "b32", "")
T.ptx.lop3(buffer[3], buffer_1[2], T.uint32(983055), T.uint32(1678271496), 106, "b32", "")
T.ptx.sub(buffer[0], buffer[0], T.uint32(1678271496), "rn", "", "", "f16x2", "")
T.ptx.fma(buffer[0], buffer[0], S, T.uint32(2147516416), "rn", "", "", "", "", "f16x2", "")
T.ptx.sub(buffer[1], buffer[1], T.uint32(1678271496), "rn", "", "", "f16x2", "")
T.ptx.fma(buffer[1], buffer[1], S, T.uint32(2147516416), "rn", "", "", "", "", "f16x2", "")
T.ptx.sub(buffer[2], buffer[2], T.uint32(1678271496), "rn", "", "", "f16x2", "")
T.ptx.fma(buffer[2], buffer[2], S, T.uint32(2147516416), "rn", "", "", "", "", "f16x2", "")
T.ptx.sub(buffer[3], buffer[3], T.uint32(1678271496), "rn", "", "", "f16x2", "")
T.ptx.fma(buffer[3], buffer[3], S, T.uint32(2147516416), "rn", "", "", "", "", "f16x2", "")"""


def test_per_word_emit_form_is_unchanged():
    """The old call form emits what it always did (int4 "scale" with one pair: 15 ops, one temp buffer, every
    fma reading the pair S[0])."""
    p = D.decode_program("int4", "float16", "scale")
    got = {}

    def body(W, S, O):
        out = T.alloc_local((4,), "uint32")
        got["ops"] = p.emit(W[0], [out[i] for i in range(4)], S[0])
        for i in range(4):
            _ir.store(O, out[i], (i,))

    @T.prim_func
    def kernel(W: T.Buffer((1,), "uint32"), S: T.Buffer((1,), "uint32"), O: T.Buffer((4,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(W, S, O)

    lines = [ln.strip() for ln in str(kernel).splitlines()]
    stmts = [ln for ln in lines if ln.startswith(("buffer", "T.ptx"))]
    assert "\n".join(stmts) == _INT4_SCALE_TIR
    assert [str(op) for op in got["ops"]][:2] == ["lop3.b32 o0, w, 0xf000f, 0x64086408, 0x6a", "shr.b32 t1, w, 0x4"]
    assert [op.ptx for op in got["ops"]] == [op.ptx for op in p.ops]
    assert {s for op in got["ops"] for s in op.src if isinstance(s, str) and s[0] == "s"} == {"s0"}   # one pair


@pytest.mark.parametrize("dtype, group", [("float16", 128), ("bfloat16", 64)])
def test_tiled_kernel_builds_the_tables_once_per_group(dtype, group, monkeypatch):
    """The tiled kernel (2 n16 blocks per warp) fills its operand registers with emit_operands at the first chunk
    of each scale group (group 128: every other chunk) and decodes every word from them. On the interpreter its
    output is bit-identical to the same kernel with the reference converter (same mma order, same weights)."""
    import mmaemit.kernels.dequant_gemm as G
    from mmaemit.dequant import quantize
    from mmaemit.dequant.kernel_layout import to_kernel_layout, to_kernel_scales

    calls = []
    real = D.DecodeProgram.emit_operands
    monkeypatch.setattr(D.DecodeProgram, "emit_operands", lambda self, *a, **k: calls.append(self) or
                        real(self, *a, **k))
    M, N, K = 20, 64, 256
    g = torch.Generator().manual_seed(3)
    tdt = getattr(torch, dtype)
    qw = quantize(torch.randn(N, K, generator=g).to(tdt), QuantScheme("nf4", group))
    A = torch.randn(M, K, generator=g).to(tdt)
    args = (A, to_kernel_layout(qw.codes()), to_kernel_scales(qw.scales))
    cfg = G.TiledConfig(64, 64, 32, 32, 3)
    fast, _ = G.make_dequant_gemm_tiled(M, N, K, group, dtype, cfg, "sm_80", weight_format="nf4")
    assert len(calls) == 1 and calls[0].fast
    monkeypatch.setattr(G, "kernel_decode_program",
                        lambda f, d, m, a, v="shift": D.decode_program(f, d, m, a, fast=False))
    ref, _ = G.make_dequant_gemm_tiled(M, N, K, group, dtype, cfg, "sm_80", weight_format="nf4")
    assert len(calls) == 1
    out = []
    for func in (fast, ref):
        C = torch.full((M, N), float("nan"), dtype=tdt)
        assert mmaemit.interpret(func, *args, C, arch="sm_80").ok
        out.append(C)
    assert not torch.isnan(out[0]).any() and torch.equal(out[0].view(torch.int16), out[1].view(torch.int16))
    want = A.double() @ qw.dequantize().double().T
    assert ((out[0].double() - want).norm() / want.norm()).item() < (2e-3 if dtype == "float16" else 8e-3)
