"""Every decode program (fast and reference, every format / mode / output dtype) runs on the CPU interpreter and
gives exactly what its own numpy evaluation gives: the interpreter's PTX semantics and the decode's agree on every
instruction the decode emits (lop3, prmt, bfe, set, shifts, half2 and f32 arithmetic in all roundings, cvt)."""
import numpy as np
import pytest

import mmaemit.dequant.decode as D
from mmaemit.interpret import interpret

from test_dequant_decode_emit import OPERAND_SLOTS, _decode_kernel, _fast_programs, _reference_programs


def _operands(p, rng):
    """Per-element scales / zeros for one word, valid for the program's mode (None where the mode takes none)."""
    E = p.elements
    scales = zeros = None
    if p.mode != "none":
        if p.fmt.block_size is not None:       # block formats take scale codes (e4m3 for nvfp4, e8m0 for mxfp4)
            scales = rng.integers(0x30, 0x48, E) if p.fmt.scale_format == "float8_e4m3fn" \
                else rng.integers(120, 134, E)
        else:
            scales = (rng.uniform(0.25, 2.0, E) * rng.choice([-1, 1], E)).astype(np.float32)
            k = p.shared_scale_slots            # nf4 "scale" fast: one scale per output register pair
            scales = np.repeat(scales[::k], k)
    if p.mode == "quantized":
        zeros = rng.integers(0, 1 << p.bits, E)
    elif p.mode in ("original", "rescale"):
        zeros = rng.uniform(-3, 3, E).astype(np.float32)
    return scales, zeros


def _registers(values, kind, dtype, p):
    if values is None:
        return np.zeros(OPERAND_SLOTS, np.uint32)
    regs = [np.asarray(r).reshape(-1)[0] for r in D.operand_pairs(values, kind, dtype)]
    out = np.zeros(OPERAND_SLOTS, np.uint32)
    out[:len(regs)] = np.asarray(regs, dtype=np.uint32)
    return out


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("path", ["fast", "reference"])
def test_every_decode_program_interprets_to_its_own_evaluation(dtype, path):
    arch = "sm_90a"
    programs = _fast_programs(dtype, arch) if path == "fast" else _reference_programs(dtype, arch)
    rng = np.random.default_rng(3)
    W, S, Z, want = [], [], [], []
    for p in programs:
        word = np.uint32(rng.integers(0, 2 ** 32))
        scales, zeros = _operands(p, rng)
        s_kind = "scale_code" if p.fmt.block_size is not None else "value"
        z_kind = "zero_code" if p.mode == "quantized" else "value"
        W.append(word)
        S.append(_registers(scales, s_kind, dtype, p))
        Z.append(_registers(zeros, z_kind, dtype, p))
        want.append(p.evaluate(np.asarray([word]), scales, zeros)[0])
    func = _decode_kernel(programs)
    O = np.zeros(len(programs) * OPERAND_SLOTS, np.uint32)
    report = interpret(func, np.asarray(W, np.uint32), np.concatenate(S), np.concatenate(Z), O, arch=arch)
    assert report.ok
    half = np.uint16
    for k, p in enumerate(programs):
        got = O[OPERAND_SLOTS * k: OPERAND_SLOTS * k + p.registers]
        got_halves = np.stack([got & 0xFFFF, got >> 16], -1).reshape(-1).astype(half)
        exp = np.asarray(want[k]).view(half).reshape(-1)
        nan = lambda b: (b & 0x7FFF) > (0x7C00 if dtype == "float16" else 0x7F80)  # noqa: E731
        same = (got_halves == exp) | (nan(got_halves) & nan(exp))
        assert same.all(), (str(p).splitlines()[0], got_halves, exp)
    assert len(programs) > 10
