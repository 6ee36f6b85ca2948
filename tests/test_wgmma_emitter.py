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
