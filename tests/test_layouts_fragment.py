"""mma fragment maps against the PTX ISA text, transcribed here case by case.

Reference: PTX ISA (9.x), section 9.7.14.5 "Matrix Fragments for mma.m16n8k*":
  9.7.14.5.7  "Matrix Fragments for mma.m16n8k8"                             (f16/bf16, tf32)
  9.7.14.5.8  "Matrix Fragments for mma.m16n8k16 with floating point type"   (f16/bf16)
  9.7.14.5.9  "Matrix Fragments for mma.m16n8k16 with integer type"          (s8/u8)
  9.7.14.5.10 "Matrix Fragments for mma.m16n8k32"                            (s8/u8, e4m3/e5m2, s4/u4)
  9.7.14.5.11 "Matrix Fragments for mma.m16n8k64"                            (s4/u4)
with groupID = %laneid >> 2, threadID_in_group = %laneid % 4. Element i of a fragment is listed "low to high":
register i // per_reg, sub-element i % per_reg counted from the low bits.
"""

import re

import numpy as np
import pytest

from mmaemit import isa
from mmaemit.errors import LayoutError, UnsupportedConfigError
from mmaemit.layouts import FragmentLayout, mma_fragment

from tir_eval import eval_prim


# ---- the PTX text, one function per (shape, type family, operand): (lane, i) -> (row, col) -----------------------
def _gt(lane):
    return lane >> 2, lane % 4


def k8_f16_A(lane, i):            # a0..a3 in two .f16x2 registers
    g, t = _gt(lane)
    row = g if i < 2 else g + 8
    return row, t * 2 + (i & 0x1)


def k8_tf32_A(lane, i):           # a0..a3, four .b32 registers
    g, t = _gt(lane)
    row = g if i in (0, 2) else g + 8
    col = t if i in (0, 1) else t + 4
    return row, col


def k8_f16_B(lane, i):            # b0, b1 in one .f16x2 register
    g, t = _gt(lane)
    return t * 2 + i, g


def k8_tf32_B(lane, i):           # b0, b1, two .b32 registers
    g, t = _gt(lane)
    return (t if i == 0 else t + 4), g


def k16_f16_A(lane, i):           # a0..a7 in four .f16x2 registers
    g, t = _gt(lane)
    row = g if (0 <= i < 2 or 4 <= i < 6) else g + 8
    col = t * 2 + (i & 0x1) if i < 4 else t * 2 + (i & 0x1) + 8
    return row, col


def k16_f16_B(lane, i):           # b0..b3 in two .f16x2 registers
    g, t = _gt(lane)
    row = t * 2 + (i & 0x1) if i < 2 else t * 2 + (i & 0x1) + 8
    return row, g


def k16_s8_A(lane, i):            # a0..a7 in two .b32 registers
    g, t = _gt(lane)
    row = g if i < 4 else g + 8
    return row, t * 4 + (i & 0x3)


def k16_s8_B(lane, i):            # b0..b3 in one .b32 register
    g, t = _gt(lane)
    return t * 4 + i, g


def k32_s8_A(lane, i):            # a0..a15 in four .b32 registers (.s8/.u8 and .e4m3/.e5m2)
    g, t = _gt(lane)
    row = g if (0 <= i < 4 or 8 <= i < 12) else g + 8
    col = t * 4 + (i & 0x3) if i < 8 else t * 4 + (i & 0x3) + 16
    return row, col


def k32_s8_B(lane, i):            # b0..b7 in two .b32 registers
    g, t = _gt(lane)
    row = t * 4 + (i & 0x3) if i < 4 else t * 4 + (i & 0x3) + 16
    return row, g


def k32_s4_A(lane, i):            # a0..a15 in two .b32 registers
    g, t = _gt(lane)
    row = g if i < 8 else g + 8
    return row, t * 8 + (i & 0x7)


def k32_s4_B(lane, i):            # b0..b7 in one .b32 register
    g, t = _gt(lane)
    return t * 8 + (i & 0x7), g


def k64_s4_A(lane, i):            # a0..a31 in four .b32 registers
    g, t = _gt(lane)
    row = g if (0 <= i < 8 or 16 <= i < 24) else g + 8
    col = t * 8 + (i & 0x7) if i < 16 else t * 8 + (i & 0x7) + 32
    return row, col


def k64_s4_B(lane, i):            # b0..b15 in two .b32 registers
    g, t = _gt(lane)
    row = t * 8 + (i & 0x7) if i < 8 else t * 8 + (i & 0x7) + 32
    return row, g


def acc_m16n8(lane, i):           # c0..c3: four .f32/.s32 registers, or two .f16x2 registers
    g, t = _gt(lane)
    row = g if i < 2 else g + 8
    return row, t * 2 + (i & 0x1)


F16ISH = ("f16", "bf16")
S8ISH = ("s8", "u8", "e4m3", "e5m2")
S4ISH = ("s4", "u4")

# (shape, ptx type) -> {operand: (registers, elements per register, map)}, from the fragment tables of the text
PTX = {}
for ty in F16ISH:
    PTX[("m16n8k8", ty)] = {"A": (2, 2, k8_f16_A), "B": (1, 2, k8_f16_B)}
    PTX[("m16n8k16", ty)] = {"A": (4, 2, k16_f16_A), "B": (2, 2, k16_f16_B)}
PTX[("m16n8k8", "tf32")] = {"A": (4, 1, k8_tf32_A), "B": (2, 1, k8_tf32_B)}
for ty in ("s8", "u8"):
    PTX[("m16n8k16", ty)] = {"A": (2, 4, k16_s8_A), "B": (1, 4, k16_s8_B)}
for ty in S8ISH:
    PTX[("m16n8k32", ty)] = {"A": (4, 4, k32_s8_A), "B": (2, 4, k32_s8_B)}
for ty in S4ISH:
    PTX[("m16n8k32", ty)] = {"A": (2, 8, k32_s4_A), "B": (1, 8, k32_s4_B)}
    PTX[("m16n8k64", ty)] = {"A": (4, 8, k64_s4_A), "B": (2, 8, k64_s4_B)}
ACC = {"f32": (4, 1), "s32": (4, 1), "f16": (2, 2)}


def _reference(instr, operand):
    if operand == "C":
        regs, per = ACC[instr.accum_ptx]
        return regs, per, acc_m16n8
    ty = instr.a_ptx if operand == "A" else instr.b_ptx
    return PTX[(instr.shape_name, ty)][operand]


CASES = [(e, op) for e in isa.MMA_TABLE for op in "ABC"]


def _id(case):
    e, op = case
    return f"{e.shape_name}-{e.a_ptx}-{e.b_ptx}-{e.accum_ptx}-{op}"


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_fragment_matches_ptx_text(case):
    instr, operand = case
    regs, per, ref = _reference(instr, operand)
    frag = mma_fragment(instr, operand)
    assert (frag.regs, frag.elems_per_reg) == (regs, per)
    assert frag.rows * frag.cols == 32 * regs * per
    tab = frag.table()
    assert tab.shape == (32, regs, per, 2)
    for lane in range(32):
        for reg in range(regs):
            for elem in range(per):
                want = ref(lane, reg * per + elem)
                assert frag.forward(lane, reg, elem) == want
                assert tuple(tab[lane, reg, elem]) == want
                assert tuple(frag.inverse(*want)) == (lane, reg, elem)
    frag.check()


def test_every_table_entry_has_a_reference_and_tile_shape():
    for e in isa.MMA_TABLE:
        assert (mma_fragment(e, "A").rows, mma_fragment(e, "A").cols) == (e.m, e.k)
        assert (mma_fragment(e, "B").rows, mma_fragment(e, "B").cols) == (e.k, e.n)
        assert (mma_fragment(e, "C").rows, mma_fragment(e, "C").cols) == (e.m, e.n)
        assert mma_fragment(e, "D") is mma_fragment(e, "C")
        for op in "ABC":
            _reference(e, op)


def test_bad_operand_and_instruction():
    e = isa.MMA_TABLE[0]
    with pytest.raises(UnsupportedConfigError) as ei:
        mma_fragment(e, "X")
    assert all(f"'{n}'" in str(ei.value) for n in "ABC")
    fake = isa.MmaInstr(8, 8, 4, "float16", "float16", "float32", "sm_70")
    with pytest.raises(UnsupportedConfigError, match="MMA_TABLE"):
        mma_fragment(fake, "A")
    frag = mma_fragment(e, "A")
    with pytest.raises(LayoutError):
        frag.forward(32, 0, 0)
    with pytest.raises(LayoutError):
        frag.inverse(16, 0)


def test_check_detects_a_broken_map():
    class Swapped(FragmentLayout):
        def forward(self, lane, reg, elem=0):
            row, col = super().forward(lane, reg, elem)
            return (row, col) if lane != 6 else super().forward(5, reg, elem)   # lane 6 lands on lane 5's slots

    e = isa.select_mma("float16", "float16", "float32")
    broken = Swapped("broken", "A", e.m, e.k, 16, e.a_regs)
    with pytest.raises(LayoutError, match="both map"):
        broken.check()


# ---- symbolic evaluation: the maps build valid TIR expressions --------------------------------------------------


def test_forward_and_inverse_on_tir_vars():
    import tvm
    from tvm import tirx

    lane, row, col = tirx.Var("lane", "int32"), tirx.Var("row", "int32"), tirx.Var("col", "int32")
    assert isinstance(lane // 4, tvm.tirx.FloorDiv) and isinstance(lane % 4, tvm.tirx.FloorMod)
    for instr in isa.MMA_TABLE:
        for op in "ABC":
            frag = mma_fragment(instr, op)
            for reg in range(frag.regs):
                for elem in range(frag.elems_per_reg):
                    sym = frag.forward(lane, reg, elem)
                    assert all(isinstance(x, tvm.tirx.Expr) for x in sym)
                    for v in range(32):
                        assert tuple(eval_prim(x, {"lane": v}) for x in sym) == frag.forward(v, reg, elem)
            sym = frag.inverse(row, col)
            for r in range(frag.rows):
                for c in range(frag.cols):
                    got = tuple(eval_prim(x, {"row": r, "col": c}) for x in sym)
                    assert got == tuple(frag.inverse(r, c))


def test_table_is_a_permutation_of_the_tile():
    rng = np.random.default_rng(7)
    for instr in isa.MMA_TABLE:
        for op in "ABC":
            frag = mma_fragment(instr, op)
            tile = rng.integers(-1000, 1000, size=(frag.rows, frag.cols))
            tab = frag.table()
            regs = tile[tab[..., 0], tab[..., 1]]                      # scatter the tile into registers
            back = np.zeros_like(tile)
            back[tab[..., 0], tab[..., 1]] = regs
            assert np.array_equal(back, tile)


def test_ptx_name_is_accepted_and_a_bad_name_lists_what_is():
    """Issue 12: the error listed the PTX name it then rejected. Every table entry's PTX name (and the integer ones'
    .satfinite spelling) gives the entry's own map; any other string lists exactly the accepted names."""
    for e in isa.MMA_TABLE:
        for op in "ABC":
            assert mma_fragment(e.ptx(), op) is mma_fragment(e, op)
        if e.is_integer:
            assert mma_fragment(e.ptx(True), "C") is mma_fragment(e, "C")
    frag = mma_fragment("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "A")
    assert (frag.rows, frag.cols, frag.elem_bits) == (16, 16, 16)
    bad = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f16"
    with pytest.raises(UnsupportedConfigError) as ei:
        mma_fragment(bad, "A")
    head, _, valid = str(ei.value).partition("valid PTX names:")
    assert bad in head
    listed = set(re.findall(r"'(mma\.sync[^']*)'", valid))
    assert listed == {e.ptx() for e in isa.MMA_TABLE}
    for name in listed:
        mma_fragment(name, "A")     # everything the message lists is accepted
