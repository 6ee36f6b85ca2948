"""The wgmma building blocks: instruction facts (``isa.WGMMA_TABLE``), shared-memory descriptors derived from the
swizzle layouts (``mmaemit.layouts.wgmma``), accumulator / A-fragment maps, and ``WgmmaIntrinEmitter``: errors, PTX
text, SASS shape (CPU, nvcc) and numerics on the CPU interpreter against float64 / int64 references."""
import pytest

from mmaemit import isa
from mmaemit.errors import ArchError, UnsupportedConfigError


# ---- instruction table -------------------------------------------------------------------------------------------
def test_wgmma_table_facts():
    combos = {(e.a_dtype, e.b_dtype, e.accum_dtype): e for e in isa.WGMMA_TABLE}
    assert len(combos) == len(isa.WGMMA_TABLE) == 16
    for (a, b, acc), e in combos.items():
        assert e.k * e.operand_bits == 256                       # 32 bytes of K per row, every type
        assert e.a_regs == 4 and e.rs
        assert e.majors == (("K", "MN") if e.operand_bits == 16 else ("K",))
        assert e.satfinite == (acc == "int32")
        assert e.n_values == (isa.WGMMA_N_INT if a in ("int8", "uint8") else isa.WGMMA_N_FLOAT)
    assert isa.WGMMA_N_FLOAT == tuple(range(8, 257, 8))
    assert isa.WGMMA_N_INT == (8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224)
    assert {e.k for e in isa.find_wgmma("float32")} == {8}
    e = isa.select_wgmma("int8", "uint8", "int32")
    assert e.ptx(224, satfinite=True) == "wgmma.mma_async.sync.aligned.m64n224k32.satfinite.s32.s8.u8"
    assert e.accum_regs(224) == 112
    f = isa.select_wgmma("float8_e4m3fn", "float8_e5m2", "float16")
    assert f.ptx(256) == "wgmma.mma_async.sync.aligned.m64n256k32.f16.e4m3.e5m2" and f.accum_regs(256) == 64


def test_wgmma_table_errors():
    with pytest.raises(UnsupportedConfigError, match="valid combinations: .*'bfloat16 x bfloat16 -> float32'"):
        isa.select_wgmma("bfloat16", accum_dtype="float16")
    with pytest.raises(UnsupportedConfigError, match="valid combinations"):
        isa.select_wgmma("int4")
    with pytest.raises(ArchError, match="sm_90a"):
        isa.select_wgmma("float16", arch="sm_90")
    with pytest.raises(UnsupportedConfigError, match=r"valid N: 8, 16, 24, 32, 48"):
        isa.select_wgmma("int8", accum_dtype="int32").ptx(40)
    with pytest.raises(UnsupportedConfigError, match=r"valid N: 8, 16, 24, 32, 40"):
        isa.select_wgmma("float16").ptx(100)
    with pytest.raises(UnsupportedConfigError, match="satfinite"):
        isa.select_wgmma("float16").ptx(64, satfinite=True)


# ---- shared-memory operand layouts and descriptors ---------------------------------------------------------------
import numpy as np  # noqa: E402

from mmaemit.errors import LayoutError, TileShapeError  # noqa: E402
from mmaemit.layouts import (WgmmaOperandLayout, make_mma_swizzle_layout, wgmma_a_layout,  # noqa: E402
                             wgmma_accumulator_layout, wgmma_operand_layout)
from mmaemit.ptx import wgmma as PW  # noqa: E402

_EB = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1}


def _tile_cases():
    for dt in ("float16", "bfloat16", "float32", "float8_e5m2", "int8"):
        for sw in (0, 32, 64, 128):
            for major in ("K", "MN"):
                if major == "MN" and _EB[dt] != 2:
                    continue
                yield dt, sw, major


@pytest.mark.parametrize("dt, sw, major", list(_tile_cases()))
def test_descriptor_reads_the_layout_for_every_slice(dt, sw, major):
    span = (sw or 16) // _EB[dt]
    k = max(2 * span, 64 // _EB[dt]) if major == "K" else 32
    mn = 128 if major == "K" else max(128, 2 * span)
    lay = wgmma_operand_layout(mn, k, dt, major=major, swizzle_bytes=sw, stages=(2,))
    for instr_mn in (64, 8, 128):                 # A (64 rows), narrow and wide B
        lay.check(instr_mn)
    assert lay.layout.swizzle_bytes == sw and lay.layout.shape[0] == 2 and lay.layout.cols == span
    assert lay.descriptor_swizzle == {0: 0, 32: 3, 64: 2, 128: 1}[sw]
    # the descriptor TVM's encoder builds from (start, lbo >> 4, sbo >> 4, tvm_swizzle) decodes to the same fields
    d = PW.decode_matrix_descriptor(PW.encode_matrix_descriptor(2048, lay.lbo >> 4, lay.sbo >> 4, lay.tvm_swizzle))
    assert (d.start, d.lbo, d.sbo, d.swizzle_bytes) == (2048, lay.lbo, lay.sbo, sw)


def test_kmajor_128b_is_the_hand_written_descriptor_of_the_library_kernels():
    lay = wgmma_operand_layout(128, 64, "float16", stages=(4,))
    assert lay.layout == make_mma_swizzle_layout((4, 128, 64), "float16")     # the GEMM ring's own layout
    assert (lay.lbo >> 4, lay.sbo >> 4, lay.tvm_swizzle) == (1, 64, 3)
    assert [lay.start_offset(0, k0, 1) for k0 in (0, 16, 32, 48)] == [16384 + 32 * s for s in range(4)]
    assert lay.start_offset(64, 0, 0) == 64 * 128


def test_checker_catches_a_slice_crossing_an_mn_atom():
    lay = wgmma_operand_layout(192, 16, "float16", major="MN")              # 3 atoms of 64 N
    lay.check(64)
    lay.check(32)                                                           # inside an atom: fine
    with pytest.raises(LayoutError, match="slice \\(mn0=96"):
        lay.check(96)                                                       # starts mid-atom, runs into the next


def test_checker_catches_a_wrong_stride():
    class Wrong(WgmmaOperandLayout):
        sbo = property(lambda self: 512)

    good = wgmma_operand_layout(64, 64, "float16")
    with pytest.raises(LayoutError, match="SBO 512"):
        Wrong(good.layout, "K", 64, 64).check(64)


@pytest.mark.parametrize("kw, err, match", [
    (dict(mn=64, k=64, dtype="int8", major="MN"), UnsupportedConfigError, "valid majors for int8: 'K'"),
    (dict(mn=64, k=64, dtype="float16", major="M"), UnsupportedConfigError, "'K', 'MN'"),
    (dict(mn=64, k=32, dtype="float16"), TileShapeError, "multiple of 64"),
    (dict(mn=64, k=24, dtype="float16", swizzle_bytes=0), TileShapeError, "wgmma K for float16 \\(16\\)"),
    (dict(mn=12, k=64, dtype="float16"), TileShapeError, "multiple of 8"),
    (dict(mn=64, k=64, dtype="float16", swizzle_bytes=16), UnsupportedConfigError, "0, 32, 64, 128"),
    (dict(mn=32, k=16, dtype="float16", major="MN"), TileShapeError, "smaller swizzle_bytes"),
])
def test_operand_layout_errors(kw, err, match):
    with pytest.raises(err, match=match):
        wgmma_operand_layout(**kw)


# ---- register fragments ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("acc", ["float32", "float16"])
def test_accumulator_layout_follows_the_isa(acc):
    lay = wgmma_accumulator_layout(isa.select_wgmma("float16", accum_dtype=acc), 24)
    lay.check()
    per = lay.elems_per_reg
    for t in range(128):
        w, g, c = t // 32, (t % 32) // 4, t % 4
        for i in range(12):                          # element i = 4 j + 2 h + e: D[16 w + g + 8 h, 8 j + 2 c + e]
            j, h, e = i // 4, (i // 2) % 2, i % 2
            assert lay.forward(t, i // per, i % per) == (16 * w + g + 8 * h, 8 * j + 2 * c + e)
    dr, dc = PW.wgmma_d_coords(24)                   # the interpreter's map (f32: one element per register)
    tab = lay.table().reshape(128, -1, 2)
    np.testing.assert_array_equal(tab[..., 0], dr)
    np.testing.assert_array_equal(tab[..., 1], dc)


@pytest.mark.parametrize("dt, ptype", [("float16", "f16"), ("bfloat16", "bf16"), ("float32", "tf32"),
                                       ("float8_e4m3fn", "e4m3"), ("int8", "s8"), ("uint8", "u8")])
def test_a_fragment_layout_matches_the_isa_and_the_interpreter(dt, ptype):
    instr = isa.select_wgmma(dt, accum_dtype="int32" if "int" in dt else "float32")
    lay = wgmma_a_layout(instr)
    lay.check()
    e = lay.elems_per_reg
    for t in range(128):
        w, g, c = t // 32, (t % 32) // 4, t % 4
        for q in range(4):
            for x in range(e):                       # reg q: rows g + 8 (q % 2), K block q // 2 of 4 e columns
                assert lay.forward(t, q, x) == (16 * w + g + 8 * (q % 2), 4 * e * (q // 2) + e * c + x)
    ar, ac = PW.wgmma_a_coords(ptype)
    tab = lay.table().reshape(128, -1, 2)
    np.testing.assert_array_equal(tab[..., 0], ar)
    np.testing.assert_array_equal(tab[..., 1], ac)


def test_fragment_maps_take_tir_expressions():
    import tvm
    from tvm import tirx

    t = tirx.Var("t", "int32")
    lay = wgmma_accumulator_layout(isa.select_wgmma("bfloat16"), 64)
    r, c = lay.forward(t, 5, 0)
    assert isinstance(r, tvm.ir.expr.Expr) and isinstance(c, tvm.ir.expr.Expr)
    with pytest.raises(LayoutError, match="reg 0..31"):
        lay.forward(0, 32)
