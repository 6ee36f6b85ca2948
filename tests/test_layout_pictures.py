"""Layout pictures: each kind renders a PNG whose labels and colours come from the layout object."""
import pytest

from mmaemit import isa
from mmaemit.cli import main
from mmaemit.errors import UnsupportedConfigError
from mmaemit.layouts import make_mma_swizzle_layout, matrix_move_layout, mma_fragment
from mmaemit.layouts.pictures import draw_fragment, draw_layout, draw_matrix_move, draw_swizzle
from mmaemit.layouts.raster import raster_order


def _is_png(path):
    from PIL import Image

    with Image.open(path) as im:
        return im.format == "PNG" and im.size[0] > 100 and im.size[1] > 100


@pytest.mark.parametrize("dtypes, operand", [(("float16", "float16", "float32"), "A"),
                                             (("float16", "float16", "float32"), "C"),
                                             (("int8", "int8", "int32"), "B")])
def test_fragment_picture_labels_are_the_inverse_map(dtypes, operand, tmp_path):
    frag = mma_fragment(isa.select_mma(*dtypes), operand)
    pic = draw_fragment(frag, tmp_path / "f.png")
    assert _is_png(pic.path) and pic.labels.shape == (frag.rows, frag.cols)
    for r in range(frag.rows):
        for c in range(frag.cols):
            lane, reg, elem = frag.inverse(r, c)
            assert pic.labels[r, c].startswith(f"T{lane}\nR{reg}") and pic.colors[r, c] == lane % 8
            if frag.elems_per_reg > 1:
                assert pic.labels[r, c].endswith(f".{elem}")


@pytest.mark.parametrize("op, num, trans", [("ldmatrix", 4, False), ("ldmatrix", 2, True), ("stmatrix", 1, False)])
def test_matrix_move_picture(op, num, trans, tmp_path):
    layout = matrix_move_layout(num, trans)
    pic = draw_matrix_move(layout, tmp_path / "m.png", op=op)
    assert _is_png(pic.path) and pic.labels.shape == (8, 8 * num) and op in pic.title
    for m in range(num):
        for r in range(8):
            for c in range(8):
                lane, reg, half = layout.inverse(m, r, c)
                assert pic.labels[r, 8 * m + c] == f"T{lane}\nR{reg}.{half}"


def test_swizzle_picture_colours_are_bank_groups(tmp_path):
    layout = make_mma_swizzle_layout((64, 64), "float16")
    pic = draw_swizzle(layout, tmp_path / "s.png", rows=16)
    assert _is_png(pic.path) and pic.labels.shape == (16, 8)
    for r in range(16):
        for k in range(8):
            assert pic.colors[r, k] == layout.byte_offset(r, 8 * k) // 16 % 8
            assert pic.labels[r, k] == f"->{layout(r, 8 * k)[1] // 8}"
    # conflict-free: every 8-row phase of a chunk column hits 8 bank groups
    for r0 in (0, 8):
        for k in range(8):
            assert len(set(pic.colors[r0:r0 + 8, k].tolist())) == 8
    ident = draw_swizzle(make_mma_swizzle_layout((16, 64), "float16", swizzle_bytes=0), tmp_path / "i.png")
    assert len(set(ident.colors[0:8, 0].tolist())) == 1  # unswizzled: one bank group per column


def test_raster_picture_and_dispatch(tmp_path):
    order = raster_order("grouped", 6, 10, 3)
    pic = draw_layout(order, tmp_path / "r.png", wave=7)
    assert _is_png(pic.path)
    for p in range(60):
        tm, tn = order.forward(p)
        assert pic.labels[tm, tn] == str(p) and pic.colors[tm, tn] == p // 7 % 8
    with pytest.raises(UnsupportedConfigError):
        draw_layout(object(), tmp_path / "x.png")


@pytest.mark.parametrize("argv", [["fragment", "--dtype", "bfloat16", "--operand", "C"],
                                  ["ldmatrix", "--num", "2", "--trans"], ["stmatrix"],
                                  ["swizzle", "--shape", "32x32", "--dtype", "float16"],
                                  ["raster", "--grid", "4x6", "--order", "serpentine", "--panel", "2"]])
def test_layout_show_cli(argv, tmp_path, capsys):
    out = tmp_path / "pic.png"
    assert main(["layout", "show", *argv, "-o", str(out)]) == 0
    assert _is_png(out) and f"wrote {out}" in capsys.readouterr().out



def test_readme_picture_is_small_and_current():
    from pathlib import Path

    docs = Path(__file__).resolve().parent.parent / "docs"
    committed = docs / "fragment-m16n8k16-A.png"
    assert committed.exists() and committed.stat().st_size < 100_000
    assert "docs/fragment-m16n8k16-A.png" in (docs.parent / "README.md").read_text()
