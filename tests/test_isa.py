"""The instruction table: shapes, register counts, PTX spellings and the errors validation raises."""
import pytest

from mmaemit import isa
from mmaemit.arch import as_arch
from mmaemit.errors import ArchError, UnsupportedConfigError


def test_register_counts_match_ptx_fragment_sizes():
    f16 = isa.select_mma("float16", "float16", "float32")
    assert (f16.shape, f16.a_regs, f16.b_regs, f16.c_regs) == ((16, 8, 16), 4, 2, 4)
    assert isa.select_mma("float16", "float16", "float16").c_regs == 2
    s8 = isa.select_mma("int8", "int8", "int32")
    assert (s8.k, s8.a_regs, s8.b_regs, s8.c_regs) == (32, 4, 2, 4)
    s4 = isa.select_mma("int4", "int4", "int32")
    assert (s4.k, s4.a_regs, s4.b_regs) == (64, 4, 2)
    tf32 = isa.select_mma("float32", "float32", "float32")
    assert (tf32.k, tf32.a_regs, tf32.b_regs, tf32.a_ptx) == (8, 4, 2, "tf32")


def test_ptx_spelling():
    assert isa.select_mma("bf16", "bf16", "fp32").ptx() == "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
    assert (isa.select_mma("int8", "uint8", "int32").ptx(satfinite=True)
            == "mma.sync.aligned.m16n8k32.row.col.satfinite.s32.s8.u8.s32")
    with pytest.raises(UnsupportedConfigError, match="integer"):
        isa.select_mma("float16", "float16", "float32").ptx(satfinite=True)


@pytest.mark.parametrize("combo", [("bfloat16", "bfloat16", "float16"), ("float16", "bfloat16", "float32"),
                                   ("int8", "float16", "int32"), ("float16", "float16", "int32")])
def test_missing_combination_names_valid_ones(combo):
    with pytest.raises(UnsupportedConfigError, match="float16 x float16 -> float32"):
        isa.select_mma(*combo)


def test_arch_gates():
    with pytest.raises(ArchError, match="sm_89"):
        isa.select_mma("e4m3", "e4m3", "float32", arch="sm_80")
    assert isa.select_mma("e4m3", "e4m3", "float32", arch="sm_89").k == 32
    with pytest.raises(ArchError, match="sm_90"):
        isa.matrix_move("stmatrix", 4, arch="sm_80")
    isa.matrix_move("stmatrix", 4, trans=True, arch="sm_90a")
    with pytest.raises(ArchError):
        isa.require_feature("wgmma", "sm_90")
    with pytest.raises(ArchError):
        isa.require_feature("wgmma", "sm_100a")
    isa.require_feature("wgmma", "sm_90a")
    with pytest.raises(ArchError, match="sm_80"):
        as_arch("sm_75")


def test_k_selection():
    assert isa.select_mma("float16", "float16", "float32", k=8).k == 8
    with pytest.raises(UnsupportedConfigError, match="valid k"):
        isa.select_mma("float16", "float16", "float32", k=32)


def test_instructions_older_than_sm_80_pass_the_gate():
    # ldmatrix's minimum arch (sm_75) lies below mmaemit's sm_80 floor: checking it must not reject the *minimum*
    assert isa.matrix_move("ldmatrix", 4, trans=True, arch="sm_80").min_arch == "sm_75"
    assert isa.require_feature("ldmatrix", "sm_90a").name == "ldmatrix"
