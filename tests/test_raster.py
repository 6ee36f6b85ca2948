import itertools

import pytest

from mmaemit.errors import TileShapeError
from mmaemit.layouts.raster import panel_swizzle


@pytest.mark.parametrize("grid_m, grid_n, panel", list(itertools.product([1, 3, 8, 13, 32], [1, 5, 32], [1, 2, 4, 8, 16])))
def test_panel_swizzle_is_a_bijection_onto_the_grid(grid_m, grid_n, panel):
    tiles = [panel_swizzle(p, grid_m, grid_n, panel) for p in range(grid_m * grid_n)]
    assert sorted(tiles) == sorted(itertools.product(range(grid_m), range(grid_n)))


def test_panel_order_walks_down_the_panel_first():
    assert [panel_swizzle(p, 32, 32, 4) for p in range(6)] == [(0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1)]
    assert panel_swizzle(4 * 32, 32, 32, 4) == (4, 0)
    # panel 1 is row-major
    assert [panel_swizzle(p, 4, 3, 1) for p in range(4)] == [(0, 0), (0, 1), (0, 2), (1, 0)]


def test_panel_swizzle_on_primexprs_matches_ints():
    import tvm

    pid = tvm.tirx.Var("pid", "int32")
    bm, bn = panel_swizzle(pid, 13, 7, 4)
    for p in range(13 * 7):
        ana = tvm.sym.Analyzer()
        ana.bind(pid, p)
        got = (ana.simplify(bm).value, ana.simplify(bn).value)
        assert got == panel_swizzle(p, 13, 7, 4)


def test_bad_arguments():
    with pytest.raises(TileShapeError):
        panel_swizzle(0, 4, 4, 0)
