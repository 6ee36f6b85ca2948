"""M/N-contiguous 8-bit and 4-bit operand loads, proven bit-exactly by simulating the PTX instructions.

The simulators (``ptx_sim.py``) are transcribed from the PTX ISA text, independently of mmaemit.

Expected registers come from ``mma_fragment`` (itself checked against the PTX fragment figures in
test_layouts_fragment.py) applied to the operand with its M/N positions permuted by ``plan.perm``.
"""
import numpy as np
import pytest

from mmaemit import isa
from mmaemit.dtypes import bits as bits_of
from mmaemit.errors import UnsupportedConfigError
from mmaemit.layouts import make_mma_swizzle_layout, mma_fragment
from mmaemit.layouts.operand_load import operand_load_plan
from mmaemit.layouts.transposed_load import TransposedLoadPlan, transposed_load_plan
from ptx_sim import run_plan, sim_ldmatrix, sim_lop3, sim_movmatrix_trans, sim_prmt

LOW_BIT_ENTRIES = [e for e in isa.MMA_TABLE if e.operand_bits in (4, 8)]
ROW_BYTES = 48        # a shared tile 3 chunks wide; the load group sits in chunk 1, from row 5: addresses must add up


# ---- storage helpers -----------------------------------------------------------------------------------------------
def _random_smem(rng, plan):
    """Random bytes everywhere; returns (smem, element tile T[k, mn] of the group as stored, origin)."""
    rows = plan.k + 16
    smem = rng.integers(0, 256, size=rows * ROW_BYTES, dtype=np.uint8)
    origin = (5, 16)
    raw = smem.reshape(rows, ROW_BYTES)[origin[0]:origin[0] + plan.k, origin[1]:origin[1] + 16]
    if plan.elem_bits == 8:
        tile = raw.astype(np.int64)
    else:  # little-endian nibbles: element 2i is the low nibble of byte i
        tile = np.stack([raw & 0xF, raw >> 4], axis=-1).reshape(plan.k, 32).astype(np.int64)
    return smem, tile, origin


def _expected_register(ins, operand, plan, tile, unit, reg):
    frag = mma_fragment(ins, operand)
    b = plan.elem_bits
    out = np.zeros(32, dtype=np.uint64)
    for lane in range(32):
        word = 0
        for e in range(32 // b):
            r, c = frag.forward(lane, reg, e)
            if operand == "A":
                k, mn = c, plan.perm[16 * unit + r]
            else:
                k, mn = r, plan.perm[8 * unit + c]
            word |= int(tile[k, mn]) << (b * e)
        out[lane] = word
    return out.astype(np.uint32)


@pytest.mark.parametrize("ins", LOW_BIT_ENTRIES, ids=lambda e: e.describe())
@pytest.mark.parametrize("operand", ["A", "B"])
def test_transposed_load_delivers_permuted_fragment(ins, operand):
    plan = operand_load_plan(ins, operand, k_contiguous=False, n_tile=16)
    assert isinstance(plan, TransposedLoadPlan)
    frag = mma_fragment(ins, operand)
    # the permutation is a bijection of the group's M/N positions and matches the closed form the emitter uses
    assert sorted(plan.perm) == list(range(plan.extent))
    per = 16 if operand == "A" else 8
    for f, mn in enumerate(plan.perm):
        assert plan.mn_offset(f // per, f % 8, (f % per) // 8) == mn
    # every fragment register of every unit is produced exactly once
    slots = sorted((u, r) for _, u, r in plan.outputs)
    assert slots == [(u, r) for u in range(plan.units) for r in range(frag.regs)]
    rng = np.random.default_rng(hash((ins.describe(), operand)) % 2**32)
    for _ in range(3):
        smem, tile, origin = _random_smem(rng, plan)
        regs = run_plan(plan, smem, lambda k, mn: (origin[0] + k) * ROW_BYTES + origin[1] + mn * plan.elem_bits // 8)
        for name, unit, reg in plan.outputs:
            want = _expected_register(ins, operand, plan, tile, unit, reg)
            np.testing.assert_array_equal(regs[name], want, err_msg=f"{name} -> unit {unit} reg {reg}")


@pytest.mark.parametrize("bits, counts", [
    (8, {"ldmatrix": 1, "prmt": 4}),
    (4, {"ldmatrix": 2, "prmt": 8, "shl": 4, "shr": 4, "lop3": 8}),
])
def test_instruction_counts(bits, counts):
    ins = [e for e in LOW_BIT_ENTRIES if e.operand_bits == bits][0]   # largest K first
    for operand in "AB":
        plan = transposed_load_plan(ins, operand)
        assert plan.instruction_counts() == counts
        assert all(ld.num == 4 for ld in plan.loads)
        assert plan.units == (plan.extent // 16 if operand == "A" else plan.extent // 8)


def test_simulators_against_hand_values():
    """Anchor the simulators on values worked out by hand from the PTX text."""
    a, b = np.array([0x03020100], np.uint32), np.array([0x07060504], np.uint32)
    assert sim_prmt(a, b, 0x7531)[0] == 0x07050301
    assert sim_prmt(a, b, 0x6420)[0] == 0x06040200
    assert sim_prmt(np.array([0x00007F80], np.uint32), b, 0x4489)[0] == 0x0404FF00   # sign replication
    x, y, c = (np.array([v], np.uint32) for v in (0x12345678, 0x9ABCDEF0, 0x0F0F0F0F))
    assert sim_lop3(x, y, c, 0xE4)[0] == (0x12345678 & 0x0F0F0F0F) | (0x9ABCDEF0 & 0xF0F0F0F0)
    assert sim_lop3(x, y, c, 0x96)[0] == 0x12345678 ^ 0x9ABCDEF0 ^ 0x0F0F0F0F
    lanes = np.arange(32, dtype=np.uint32)
    reg = (lanes * 2) | ((lanes * 2 + 1) << 16)          # element (r, c) = 8r + c
    t = sim_movmatrix_trans(reg)
    assert t[1] & 0xFFFF == 2 * 8 and t[1] >> 16 == 3 * 8   # lane 1: row 0 of the transpose = column 0, rows 2, 3


def test_alternative_movmatrix_sequence_is_also_correct_but_longer():
    """The lead's first design (ldmatrix non-trans over even/odd k rows, 2 prmt, 2 movmatrix per 16 k) also yields
    the A fragment, with rows m = [0,1,4,5,8,9,12,13 | 2,3,6,7,10,11,14,15]; it costs 4 more instructions (MOVM)
    per m16n8k32 tile than the plan, which is why the plan uses ldmatrix.trans instead."""
    ins = isa.select_mma("int8", "int8", "int32")
    frag = mma_fragment(ins, "A")
    rng = np.random.default_rng(7)
    smem = rng.integers(0, 256, size=32 * 16, dtype=np.uint8)
    tile = smem.reshape(32, 16).astype(np.int64)                       # [k, m]
    addrs = [16 * (16 * (lane // 16) + 2 * (lane % 8) + (lane // 8) % 2) for lane in range(32)]
    r = sim_ldmatrix(smem, addrs, 4, trans=False)
    perm = [0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15]
    for h in range(2):
        x = sim_prmt(r[:, 2 * h], r[:, 2 * h + 1], 0x5140)
        y = sim_prmt(r[:, 2 * h], r[:, 2 * h + 1], 0x7362)
        for v, src in ((0, x), (1, y)):
            got = sim_movmatrix_trans(src)
            for lane in range(32):
                want = 0
                for e in range(4):
                    row, k = frag.forward(lane, 2 * h + v, e)
                    want |= int(tile[k, perm[row]]) << (8 * e)
                assert int(got[lane]) == want


def test_non_low_bit_operands_raise():
    f16 = isa.select_mma("float16", "float16", "float32")
    with pytest.raises(UnsupportedConfigError, match="4, 8"):
        transposed_load_plan(f16, "A")
    with pytest.raises(UnsupportedConfigError, match="'A', 'B'"):
        transposed_load_plan(isa.select_mma("int8", "int8", "int32"), "C")
    tf32 = isa.select_mma("float32", "float32", "float32")
    with pytest.raises(UnsupportedConfigError, match="K-contiguous"):
        operand_load_plan(tf32, "A", k_contiguous=False)
    assert bits_of(f16.a_dtype) == 16


@pytest.mark.parametrize("bits, k", [(8, 32), (8, 16), (4, 64), (4, 32)])
@pytest.mark.parametrize("operand", ["A", "B"])
def test_swizzle_row_bits_make_the_loads_conflict_free(bits, k, operand):
    """The default row & 7 XOR conflicts on the plan's phases (rows 4 or 8 apart share bank groups); the chosen
    row bits remove every conflict for rows of >= 64 B (8-bit) / >= 128 B (4-bit), halve them for 64-B 4-bit rows,
    and keep cp.async row writes conflict-free."""
    dt = "uint8" if bits == 8 else "int4"
    ins = isa.select_mma(dt, dt, "int32", k=k)
    plan = transposed_load_plan(ins, operand)
    for row_bytes in (64, 128, 256):
        shape = (2, 64, row_bytes * 8 // bits)
        default = make_mma_swizzle_layout(shape[1:], dt)
        row_bits = plan.swizzle_row_bits(row_bytes)
        chosen = make_mma_swizzle_layout(shape, dt, row_bits=row_bits)
        chosen.check()
        assert chosen.cp_async_conflicts() == 0
        c_default = plan.ldmatrix_conflicts(default)
        c_chosen = plan.ldmatrix_conflicts(make_mma_swizzle_layout(shape[1:], dt, row_bits=row_bits))
        assert c_default > 0
        if bits == 4 and row_bytes == 64:
            phases = len(plan.phase_rows()) * (64 // k) * (row_bytes // 16)
            assert c_chosen == phases and c_default == 3 * phases    # 2-way instead of 4-way
        else:
            assert c_chosen == 0, (row_bytes, row_bits)


def test_swizzle_row_bits_argument_is_checked():
    with pytest.raises(UnsupportedConfigError, match="3 distinct"):
        make_mma_swizzle_layout((64, 128), "int8", row_bits=(0, 2))
    with pytest.raises(UnsupportedConfigError, match="3 distinct"):
        make_mma_swizzle_layout((64, 128), "int8", row_bits=(0, 0, 3))
    lay = make_mma_swizzle_layout((64, 128), "int8", row_bits=(0, 2, 3))
    assert lay(5, 16) == (5, 32)            # row 5: bits 0, 2 set -> XOR 0b011 -> chunk 1 -> 2
    assert lay(12, 0) == (12, 96)           # row 12: bits 2, 3 set -> XOR 0b110
    assert "row bits [0, 2, 3]" in lay.describe()


def test_simulators_agree_with_the_dequant_regops():
    """Two independent transcriptions of the PTX text (these test simulators, mmaemit.dequant.regops) agree."""
    from mmaemit.dequant import regops

    rng = np.random.default_rng(5)
    a, b, c = (rng.integers(0, 2**32, size=256, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    for sel in (0x6420, 0x7531, 0x5140, 0x7362, 0x4489, 0xBA98, int(rng.integers(0, 2**16))):
        np.testing.assert_array_equal(sim_prmt(a, b, sel), regops.prmt(a, b, sel))
    for lut in (0xE4, 0x96, 0xEA, int(rng.integers(0, 256))):
        np.testing.assert_array_equal(sim_lop3(a, b, c, lut), regops.lop3(a, b, c, lut))
