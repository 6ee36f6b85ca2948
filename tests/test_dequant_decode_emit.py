"""Decode programs inside real tirx kernels: the emitted T.ptx statements are the program's ops in order (so the
CPU ``evaluate`` checks what runs), the kernels compile with ``mmaemit.compile`` for sm_80 / sm_89 / sm_90a, and
the SASS holds exactly the program's LOP3 / PRMT / shift / HADD2-HFMA2 / F2FP counts (no hidden slow path).
The dequant B emitter's fragment placement is proven on the CPU against ``dequantize`` and the PTX B map."""
import re
from collections import Counter

import numpy as np
import pytest
import torch
import tvm_ffi
from tvm.ir.expr import Call
from tvm.script import tirx as T

import mmaemit
from mmaemit.dequant import QuantScheme, dequantize_codes, get_format, pack_for_mma, pack_zeros
from mmaemit.dequant import decode as D
from mmaemit.dequant import regops as R
from mmaemit.emitters import TensorCoreIntrinEmitter
from mmaemit.emitters import builder as _ir
from mmaemit.emitters.dequant import DequantBEmitter
from mmaemit.errors import ArchError, ArgumentError, UnsupportedConfigError
from mmaemit.layouts import mma_fragment
from mmaemit.runtime.gating import _mnemonic_of_ptx_call, _ptx_table
from mmaemit.runtime.sass import sass_functions

OPERAND_SLOTS = 16  # scale / zero pair slots per program in the test kernels (>= registers of any program)


def _decode_kernel(programs):
    """One warp; program k decodes W[k] (copied to a register) with its own distinct scale / zero pair per output
    register (S[16k + i], Z[16k + i]) and stores its outputs to O[16k + i]."""
    n = len(programs)

    def body(W, S, Z, O):
        for k, p in enumerate(programs):
            w = T.alloc_local((1,), "uint32")
            _ir.store(w, W[k], (0,))
            out = T.alloc_local((p.registers,), "uint32")
            pairs = {}
            for prefix, buf, need in (("s", S, p.mode != "none"),
                                      ("z", Z, p.mode in ("original", "rescale", "quantized"))):
                if need:
                    reg = T.alloc_local((p.registers,), "uint32")
                    for i in range(p.registers):
                        _ir.store(reg, buf[OPERAND_SLOTS * k + i], (i,))
                    pairs[prefix] = [reg[i] for i in range(p.registers)]
            p.emit(w[0], [out[i] for i in range(p.registers)], pairs.get("s"), pairs.get("z"))
            for i in range(p.registers):
                _ir.store(O, out[i], (OPERAND_SLOTS * k + i,))

    @T.prim_func
    def decode_kernel(W: T.Buffer((n,), "uint32"), S: T.Buffer((n * OPERAND_SLOTS,), "uint32"),
                      Z: T.Buffer((n * OPERAND_SLOTS,), "uint32"), O: T.Buffer((n * OPERAND_SLOTS,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(W, S, Z, O)

    return decode_kernel


def _ptx_calls(func):
    calls = []
    tvm_ffi.structural_walk(func, (Call, lambda c: calls.append(c) if str(getattr(c.op, "name", "")).startswith(
        "tirx.ptx.") else None))
    return calls


def _register_key(arg):
    """Identity of a register operand: (buffer var, indices), looking through T.reinterpret."""
    if isinstance(arg, Call) and "reinterpret" in str(getattr(arg.op, "name", "")):
        arg = arg.args[0]
    return (arg.source.__chandle__(), tuple(int(i) for i in arg.indices))


def _fast_programs(dtype, arch):
    progs = []
    for (f, d), table in sorted(D.FAST_DECODE.items()):
        if d != dtype:
            continue
        for m in D.fast_modes(f, d, arch):
            progs.append(D.decode_program(f, d, m, arch))
            if get_format(f).bits == 4 and d == "float16" and get_format(f).kind in ("int", "uint"):
                progs.append(D.decode_program(f, d, m, arch, variant="marlin"))
    return progs


def _reference_programs(dtype, arch):
    from mmaemit.dequant import FORMATS

    return [D.decode_program(f, dtype, m, arch, fast=False) for f in sorted(FORMATS) for m in D.valid_modes(f)]


# ---------------------------------------------------------------------------------------------- emitted TIR order
def test_emitted_ptx_statements_are_the_program_ops_in_order():
    """Walk the PrimFunc: every T.ptx call, in order, has the op's mnemonic and immediates, and the registers form
    the same dataflow graph (one TIR operand per program register, distinct registers stay distinct)."""
    progs = _fast_programs("float16", "sm_89") + _fast_programs("bfloat16", "sm_80") + \
        [D.decode_program(f, d, m, "sm_80", fast=False) for f, d, m in
         (("nf4", "float16", "scale"), ("mxfp4", "bfloat16", "scale"), ("uint4", "float16", "rescale"),
          ("float8_e5m2", "bfloat16", "none"), ("uint2", "bfloat16", "quantized"))]
    func = _decode_kernel(progs)
    calls = _ptx_calls(func)
    ops = [(k, op) for k, p in enumerate(progs) for op in p.ops]
    assert len(calls) == len(ops)
    table = _ptx_table()
    names = {}
    for call, (k, op) in zip(calls, ops):
        assert _mnemonic_of_ptx_call(call, table) == op.ptx
        args = list(call.args)[:len(op.dst) + len(op.src)]
        for name, arg in zip(list(op.dst) + list(op.src), args):
            if isinstance(name, D.Imm):
                assert float(arg.value) == float(name.value) or int(arg.value) & 0xFFFFFFFF == name.value, op
            else:
                key = _register_key(arg)
                assert names.setdefault((k, name), key) == key, (op, name)
    by_prog = {}
    for (k, name), text in names.items():
        by_prog.setdefault(k, {})[name] = text
    for regs in by_prog.values():   # distinct program registers are distinct TIR operands
        assert len(set(regs.values())) == len(regs)


def test_operand_ops_are_emitted_once_per_distinct_pair():
    """A single {S, S} / zero pair for all registers: the operand-stage ops (rescale's -Z, quantized's NEG_MAGIC | z,
    nvfp4's e4m3 -> f16) run once, the word ops all run."""
    cases = [D.decode_program("uint4", "float16", "rescale"), D.decode_program("uint2", "bfloat16", "quantized"),
             D.decode_program("nvfp4", "float16", "scale", "sm_89"),
             D.decode_program("uint4", "float16", "quantized", variant="marlin")]
    got = {}

    def body(W, S, Z, O):
        for k, p in enumerate(cases):
            out = T.alloc_local((p.registers,), "uint32")
            got[k] = p.emit(W[k], [out[i] for i in range(p.registers)], S[k],
                            Z[k] if p.mode != "scale" else None)
            for i in range(p.registers):
                _ir.store(O, out[i], (16 * k + i,))

    @T.prim_func
    def shared_operands(W: T.Buffer((4,), "uint32"), S: T.Buffer((4,), "uint32"), Z: T.Buffer((4,), "uint32"),
                        O: T.Buffer((64,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(W, S, Z, O)

    for k, p in enumerate(cases):
        word_ops = [op for op in p.ops if op.stage == "word"]
        operand = [op for op in got[k] if op.stage == "operand"]
        distinct = {(op.ptx, op.src) for op in p.ops if op.stage == "operand" and op.src[0] in ("s1", "z1")}
        assert [op.ptx for op in got[k] if op.stage == "word"] == [op.ptx for op in word_ops]
        # marlin quantized has two zero forms (even / odd registers); every other program one
        assert len(operand) == (3 if p.variant == "marlin" else 2 if p.format == "nvfp4" else 1), p
        assert len(distinct) >= 1
    assert len(_ptx_calls(shared_operands)) == sum(len(v) for v in got.values())


# -------------------------------------------------------------------------------------------------------- SASS
_IDIOM_PRMT = re.compile(r"^PRMT\s+(R\d+),\s*(?:R\d+,\s*0x7610|\1,\s*0x5410),\s*(R\d+)$")


def _sass_classes(sass: str) -> Counter:
    """Decode-relevant SASS classes. Constant materialisations ptxas inserts are not decode work and are skipped:
    ``HFMA2.MMA Rd, -RZ, RZ, imm`` / ``HADD2 Rd, -RZ.H0_H0, imm`` (move an immediate), ``PRMT Rd, Rs, 0x7610, Rd``
    (insert a 16-bit constant) and ``PRMT Rd, Rd, 0x5410, Rd`` (Rd's low half into both halves: seen once from ptxas
    for sm_89 in the all-programs kernel, 2026-11-27); no program uses selector 0x7610 or 0x5410."""
    out = Counter()
    for instrs in sass_functions(sass).values():
        for text in instrs:
            if text.startswith("@!PT"):
                continue
            op, _, rest = text.partition(" ")
            operands = [x.strip() for x in rest.split(",")]
            base = op.split(".")[0]
            if base in ("HADD2", "HFMA2", "HMUL2"):
                if ".F32" in op:
                    out["CVT_F16_F32"] += 1                 # cvt.f32.f16 assembles to HADD2.F32
                elif all(x.lstrip("-|").startswith("RZ") or not x.lstrip("-").startswith("R")
                         for x in operands[1:]):
                    continue
                else:
                    out["HALF2"] += 1
            elif base == "PRMT":
                m = _IDIOM_PRMT.match(text.replace(".reuse", "").strip())
                if not (m and m.group(1) == m.group(2)):
                    out["PRMT"] += 1
            elif base == "LOP3":
                out["LOP3"] += 1
            elif base == "SHF" or op.startswith("IMAD.SHL") or _imad_shift(op, operands):
                out["SHIFT"] += 1
            elif base in ("I2F", "I2FP"):
                out["I2F"] += 1                             # sm_90: I2FP.F32.U32
            elif base in ("F2FP", "FFMA", "FADD", "FMUL", "LDL", "STL"):
                out[base] += 1
            if ".FTZ" in op:
                out["FTZ"] += 1                             # flushing subnormals would break exactness
    return out


def _imad_shift(op, operands) -> bool:
    """``IMAD.U32 Rd, Ra, 2^k, RZ``: a left shift (ptxas's form of ``shl.b32 x, 16`` feeding float32 math)."""
    if not op.startswith("IMAD.U32") or len(operands) != 4 or operands[3] != "RZ":
        return False
    try:
        m = int(operands[2], 16)
    except ValueError:
        return False
    return m > 0 and m & (m - 1) == 0


def _asm_call_sites(cuda_source: str) -> int:
    """T.ptx statements in the kernel body: each is one call of a generated one-instruction asm function."""
    body = cuda_source[cuda_source.index("__global__"):]
    return len(re.findall(r"\btvm_builtin_ptx_\w+\(", body))


_REF_SASS = {"fma.rn.f32": "FFMA", "fma.rz.f32": "FFMA", "fma.rm.f32": "FFMA", "fma.rp.f32": "FFMA",
             "add.rn.f32": "FADD", "sub.rn.f32": "FADD", "mul.rn.f32": "FMUL", "cvt.rn.f32.u32": "I2F",
             "cvt.rn.f16x2.f32": "F2FP", "cvt.rn.bf16x2.f32": "F2FP", "lop3.b32": "LOP3",
             "cvt.f32.f16": "CVT_F16_F32"}


@pytest.mark.parametrize("dtype,arch", [("float16", "sm_80"), ("bfloat16", "sm_80"), ("float16", "sm_89"),
                                        ("float16", "sm_90a"), ("bfloat16", "sm_90a")])
def test_fast_decode_sass_has_exactly_the_program_instructions(dtype, arch):
    progs = _fast_programs(dtype, arch)
    assert not any(op.ptx == "prmt.b32" and (D.Imm(0x7610) in op.src or D.Imm(0x5410) in op.src)
                   for p in progs for op in p.ops)
    kernel = mmaemit.compile(_decode_kernel(progs), target=arch)
    want = Counter()
    for p in progs:
        want += p.sass_counts()
    got = _sass_classes(kernel.sass())
    # float32 ops only where the program has them (nf4 "scale": its table build); no local-memory detour
    classes = ("LOP3", "PRMT", "SHIFT", "HALF2", "F2FP", "FFMA", "FMUL", "CVT_F16_F32", "I2F")
    assert {k: got[k] for k in classes} == {k: want[k] for k in classes}
    assert got["LDL"] == got["STL"] == got["FTZ"] == 0
    assert _asm_call_sites(kernel.cuda_source) == sum(len(p.ops) for p in progs)
    if dtype == "bfloat16":     # sub.bf16x2 exists from sm_90: the program uses it there, fma below
        assert any(op.ptx == "sub.rn.bf16x2" for p in progs for op in p.ops) == (arch == "sm_90a")


@pytest.mark.parametrize("dtype,arch", [("float16", "sm_80"), ("bfloat16", "sm_80"), ("bfloat16", "sm_90a")])
def test_reference_converter_compiles_to_its_float32_ops(dtype, arch):
    progs = _reference_programs(dtype, arch)
    kernel = mmaemit.compile(_decode_kernel(progs), target=arch)
    want = Counter()
    for p in progs:
        for name, n in p.op_counts().items():
            if name in _REF_SASS:
                want[_REF_SASS[name]] += n
    got = _sass_classes(kernel.sass())
    assert {k: got[k] for k in want} == dict(want)
    assert got["LDL"] == got["STL"] == got["FTZ"] == 0
    assert _asm_call_sites(kernel.cuda_source) == sum(len(p.ops) for p in progs)
    assert want["F2FP"] == sum(p.registers for p in progs)      # one final rounding per output register


def test_arch_gates_from_the_instruction_table():
    with pytest.raises(ArchError, match="sm_89"):
        D.decode_program("float8_e4m3fn", "float16", "scale", "sm_80")
    bf16_sm90 = D.decode_program("int4", "bfloat16", "scale", "sm_90a")
    assert any(op.ptx == "sub.rn.bf16x2" for op in bf16_sm90.ops)
    with pytest.raises(ArchError, match="sm_90"):           # FEATURES["add.bf16x2"] via mmaemit.compile's gate
        mmaemit.compile(_decode_kernel([bf16_sm90]), target="sm_80")
    with pytest.raises(ArchError, match="sm_89"):           # FEATURES["cvt.e4m3x2"]
        mmaemit.compile(_decode_kernel([D.decode_program("float8_e4m3fn", "float16", "none", "sm_89")]),
                        target="sm_80")


# -------------------------------------------------------------------------------------------- the B emitter
@pytest.mark.parametrize("fmt,dtype,mode", [("uint4", "float16", "quantized"), ("int2", "bfloat16", "scale"),
                                            ("uint1", "float16", "rescale"), ("int8_ob", "float16", "scale"),
                                            ("float4_e2m1fn", "float16", "scale"), ("nf4", "bfloat16", "scale"),
                                            ("uint2", "bfloat16", "none")])
def test_warp_decode_into_fragments_reproduces_the_dequantized_weight(fmt, dtype, mode):
    """CPU model of one warp over 2 x 2 word blocks: each lane's word (pack_for_mma) is decoded by the program's
    evaluate with the scale / zero pairs of ``operand_coords``; register i goes to the emitter's (k step, n8 tile,
    b reg) slot, whose (k, n) the PTX B map (mma_fragment) gives. The rebuilt weight equals dequantize bit for bit."""
    group = 16
    scheme = QuantScheme(fmt, None if mode == "none" else group, None if mode in ("none", "scale") else mode)
    em = DequantBEmitter(scheme, dtype, fast=mode in D.FAST_DECODE.get((fmt, dtype), {}))
    f = get_format(fmt)
    rng = np.random.default_rng(7)
    n, k = 2 * em.block_n, 2 * em.block_k
    codes = rng.integers(0, 1 << f.bits, (n, k)).astype(np.uint8)
    half = D.R.NP_HALF[dtype]
    scales = (rng.uniform(0.5, 2, (n, k // group)) * rng.choice([-1, 1], (n, k // group))).astype(half)
    zeros, zref = None, None
    if mode == "quantized":
        zeros = rng.integers(0, 1 << f.bits, (n, k // group))
        zref = pack_zeros(torch.from_numpy(zeros.astype(np.uint8)), f.bits, "int32")
    elif mode == "rescale":
        zeros = rng.standard_normal((n, k // group)).astype(half)
        zref = torch.from_numpy(zeros.astype(np.float32))
    ref = dequantize_codes(torch.from_numpy(codes), scheme,
                           None if mode == "none" else torch.from_numpy(scales.astype(np.float32)), zref,
                           out_dtype=dtype)
    words = pack_for_mma(codes, f.bits).view(np.uint32)       # [N/BN, K/BK, 32]
    frag = mma_fragment(em.instruction, "B")
    rebuilt = np.zeros((n, k), dtype=np.uint16)
    filled = np.zeros((n, k), dtype=bool)
    for nb, kb, lane in np.ndindex(*words.shape):
        rows = [nb * em.block_n + c[0] for c in em.operand_coords(lane)]
        grps = [(kb * em.block_k + c[1]) // group for c in em.operand_coords(lane)]
        per_elem = (lambda t: None if t is None else np.repeat(t[rows, grps], 2))     # both halves: one pair
        vals = em.program.evaluate(words[nb, kb, lane], per_elem(None if mode == "none" else scales),
                                   per_elem(zeros)).view(np.uint16)
        for i, (tk, tn, r) in enumerate(em.fragment_slots()):
            for h in range(2):
                k_in, n_in = frag.forward(lane, r, h)
                row, col = nb * em.block_n + 8 * tn + n_in, kb * em.block_k + 16 * tk + k_in
                rebuilt[row, col] = vals[2 * i + h]
                filled[row, col] = True
    assert filled.all()
    assert np.array_equal(rebuilt, ref.view(torch.int16).numpy().view(np.uint16))


def _mini_gemm(fmt, dtype, mode, arch):
    """One warp: C[16, 16] += A[16, 16*TK] (ldmatrix) @ decode(word) for one word per lane (B from registers)."""
    em = DequantBEmitter(fmt, dtype, mode, arch=arch)
    mma = TensorCoreIntrinEmitter(dtype, dtype, "float32", block_row_warps=1, block_col_warps=1,
                                  warp_row_tiles=16, warp_col_tiles=16, chunk=em.block_k, n_tile=16, arch=arch)
    tk = em.k_steps

    def body(A, W, S, C, lane):
        As = T.alloc_buffer((16, em.block_k), dtype, scope="shared")
        for e in range(16 * em.block_k // 32):
            idx = lane * (16 * em.block_k // 32) + e
            _ir.store(As, A[idx // em.block_k, idx % em.block_k], (idx // em.block_k, idx % em.block_k))
        _ir.emit(T.cuda.cta_sync())
        a_frag, _, c_frag = mma.alloc_fragments()
        b_frags = [T.alloc_local((1, 4), "uint32") for _ in range(tk)]
        mma.fill_accumulators(c_frag)
        w = T.alloc_local((1,), "uint32")
        _ir.store(w, W[lane], (0,))
        s = T.alloc_local((2,), "uint32")
        for t in range(2):
            _ir.store(s, S[2 * lane + t], (t,))
        pairs = [s[tn] for _, tn, _ in em.fragment_slots()] if mode != "none" else None
        em.decode(w[0], b_frags, 0, scale_pair=pairs)
        for ki in range(tk):
            mma.ldmatrix_a(a_frag, As, ki, warp=0, lane=lane)
            mma.mma_atom(a_frag, b_frags[ki], c_frag, 0, 0)
        mma.stmatrix(c_frag, C, warp=0, lane=lane)

    @T.prim_func
    def mini_gemm(A: T.Buffer((16, em.block_k), dtype), W: T.Buffer((32,), "uint32"), S: T.Buffer((64,), "uint32"),
                  C: T.Buffer((16, 16), "float32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        body(A, W, S, C, lane)

    return em, mini_gemm


@pytest.mark.parametrize("fmt,dtype,mode,arch", [("uint4", "float16", "scale", "sm_80"),
                                                 ("int2", "bfloat16", "scale", "sm_90a"),
                                                 ("uint1", "float16", "none", "sm_80")])
def test_emitter_feeds_mma_atom_in_a_compiled_kernel(fmt, dtype, mode, arch):
    em, func = _mini_gemm(fmt, dtype, mode, arch)
    kernel = mmaemit.compile(func, target=arch)
    hist = kernel.instruction_mix()
    assert hist["HMMA"] == 2 * em.k_steps                  # n_tile 16: two m16n8k16 per k step
    assert _sass_classes(kernel.sass())["HALF2"] == em.program.sass_counts()["HALF2"]
    mnemonics = [_mnemonic_of_ptx_call(c, _ptx_table()) for c in _ptx_calls(func)]
    decode = [op.ptx for op in em.program.ops]
    start = mnemonics.index(decode[0])
    assert mnemonics[start:start + len(decode)] == decode    # the decode sits before the mmas, unbroken
    assert not any(m.startswith("mma.") for m in mnemonics[:start])
    assert sum(m.startswith("mma.") for m in mnemonics[start + len(decode):]) == 2 * em.k_steps


def test_emitter_targets_and_errors():
    em = DequantBEmitter("uint2", "float16", "none")
    assert em.k_steps == 2 and em.n_tiles == 2 and em.registers == 8
    assert em.fragment_slots() == ((0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0),
                                   (1, 1, 1))
    with pytest.raises(ArgumentError, match="4 k steps"):
        DequantBEmitter("uint1", "float16").b_targets([object()] * 2)
    with pytest.raises(UnsupportedConfigError, match="8-bit words only"):
        em.b_targets([None, None], n8=1)
    with pytest.raises(ArgumentError, match="not both"):
        DequantBEmitter(QuantScheme("uint4", 128, "quantized"), "float16", "scale")
    assert DequantBEmitter(QuantScheme("uint4", 128, "quantized")).program.mode == "quantized"
    with pytest.raises(UnsupportedConfigError, match="fast=False"):
        DequantBEmitter(QuantScheme("mxfp4"))
    assert DequantBEmitter(QuantScheme("nf4", 64), fast=False).program.fast is False
    assert DequantBEmitter(QuantScheme("nf4", 64)).program.hoist_operands


def test_broadcast_half_is_one_prmt_building_the_pair():
    x = np.random.default_rng(2).integers(0, 2 ** 32, 1000, dtype=np.uint64).astype(np.uint32)
    assert np.array_equal(R.prmt(x, x, 0x1010), (x & 0xFFFF) * np.uint32(0x10001))
    assert np.array_equal(R.prmt(x, x, 0x3232), (x >> 16) * np.uint32(0x10001))

    @T.prim_func
    def pair(S: T.Buffer((2,), "uint32"), O: T.Buffer((2,), "uint32")):
        T.device_entry()
        warp = T.warp_id([1])
        lane = T.lane_id([32])
        r = T.alloc_local((2,), "uint32")
        D.emit_broadcast_half(r[0], S[0])
        D.emit_broadcast_half(r[1], S[1], high=True)
        O[0] = r[0]
        O[1] = r[1]

    assert _sass_classes(mmaemit.compile(pair, target="sm_80").sass())["PRMT"] == 2
