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


# ------------------------------------------------------------------ the order objects
from mmaemit.errors import LayoutError, UnsupportedConfigError  # noqa: E402
from mmaemit.layouts.raster import (RASTER_ORDERS, GroupedRaster, PanelRaster, RowMajorRaster,  # noqa: E402
                                    raster_order)

GRIDS = [(1, 1), (1, 7), (5, 1), (3, 5), (8, 8), (13, 7), (16, 33), (32, 12)]


@pytest.mark.parametrize("kind", RASTER_ORDERS)
@pytest.mark.parametrize("panel", [1, 2, 3, 4, 8, 16])
def test_every_order_is_a_checked_bijection(kind, panel):
    for gm, gn in GRIDS:
        order = raster_order(kind, gm, gn, panel)
        order.check()
        o = order.order()
        assert sorted(o.ravel().tolist()) == list(range(gm * gn))
        for pid in range(0, gm * gn, 7):
            assert order.inverse(*order.forward(pid)) == pid


@pytest.mark.parametrize("kind", RASTER_ORDERS)
def test_orders_on_primexprs_match_ints(kind):
    import tvm

    pid = tvm.tirx.Var("pid", "int32")
    order = raster_order(kind, 13, 7, 3)
    bm, bn = order.forward(pid)
    for p in range(13 * 7):
        ana = tvm.sym.Analyzer()
        ana.bind(pid, p)
        assert (ana.simplify(bm).value, ana.simplify(bn).value) == order.forward(p)


def test_named_orders_walk_as_documented():
    assert [RowMajorRaster(3, 4).forward(p) for p in range(5)] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    s = PanelRaster(4, 3, 2, serpentine=True)
    assert [s.forward(p) for p in range(12)] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2),
                                                (2, 2), (3, 2), (2, 1), (3, 1), (2, 0), (3, 0)]
    g = GroupedRaster(4, 5, 2)
    assert [g.forward(p) for p in range(10)] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3),
                                                (0, 4), (1, 4)]
    # panel order = Triton's grouped order (GROUP_SIZE_M = panel)
    gm, gn, group = 10, 6, 4
    for pid in range(gm * gn):
        first = pid // (group * gn) * group
        size = min(gm - first, group)
        triton = (first + (pid % (group * gn)) % size, (pid % (group * gn)) // size)
        assert panel_swizzle(pid, gm, gn, group) == triton


def test_panel_orders_shrink_the_wave_footprint():
    # 16384 x 16384 C in 128 x 128 tiles, a wave of 264 CTAs (132 SMs x 2)
    row = raster_order("row", 128, 128).wave_panels(264)
    for kind in ("panel", "serpentine", "grouped"):
        assert raster_order(kind, 128, 128, 16).wave_panels(264) < 0.4 * row


def test_order_errors_name_the_choices():
    with pytest.raises(UnsupportedConfigError, match="'grouped'"):
        raster_order("hilbert", 4, 4)
    with pytest.raises(LayoutError):
        RowMajorRaster(2, 2).forward(4)
    with pytest.raises(LayoutError):
        GroupedRaster(2, 2, 2).inverse(2, 0)


# ------------------------------------------------------------------ the GEMM's order and persistent knobs
@pytest.mark.parametrize("cfg", [dict(raster="grouped", panel=2), dict(raster="serpentine", panel=3, persistent=5),
                                 dict(raster="row", persistent=4, epilogue="global", stages=3)])
def test_gemm_raster_and_persistent_variants_on_the_interpreter(cfg):
    import torch

    from mmaemit.interpret import interpret
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, random_inputs, reference

    M, N, K = 256, 192, 64
    config = GemmConfig(64, 64, 32, 32, 32, **{"stages": 2, **cfg})
    func, _ = make_gemm(M, N, K, "float16", config=config, arch="sm_90a")
    A, B = random_inputs(M, N, K, "float16", device="cpu", seed=3)
    C = torch.full((M, N), float("nan"), dtype=torch.float16)
    interpret(func, A, B, C)   # raises on shared-memory races (e.g. a missing barrier between persistent tiles)
    ref = reference(A, B)
    assert not torch.isnan(C).any()
    assert ((C.float() - ref).norm() / ref.norm()).item() < 2e-3


def test_gemm_default_order_is_unchanged_and_bad_knobs_are_refused():
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm

    with pytest.raises(UnsupportedConfigError, match="raster"):
        make_gemm(256, 256, 64, config=GemmConfig(raster="zigzag"), arch="sm_80")
    with pytest.raises(UnsupportedConfigError, match="persistent"):
        make_gemm(256, 256, 64, config=GemmConfig(persistent=-1), arch="sm_80")


def test_wave_footprint_counts_distinct_panels():
    from mmaemit.layouts.raster import wave_footprint_bytes
    # row-major on a 4 x 8 grid, waves of 8: one A panel and 8 B panels per wave
    r = raster_order("row", 4, 8)
    assert wave_footprint_bytes(r, 8, 128, 128, 64) == (1 * 128 + 8 * 128) * 64 * 2
    # panel 4: a wave of 8 covers 4 rows x 2 columns
    p = raster_order("panel", 4, 8, 4)
    assert wave_footprint_bytes(p, 8, 128, 128, 64, 1, 1) == (4 * 128 + 2 * 128) * 64
    with pytest.raises(TileShapeError):
        wave_footprint_bytes(r, 0, 128, 128, 64)


@pytest.mark.parametrize("shape, expected", [((16384, 16384, 4096), ("panel", 8)), ((8192, 65536, 8192), ("panel", 8)),
                                             ((4096, 4096, 4096), ("row", 1)), ((8192, 8192, 2048), ("row", 1))])
def test_default_raster_rule_matches_the_h100_study(shape, expected):
    """The shapes of the study (BENCHMARKS.md): row-major won where a wave's panels fit in the 50 MB L2, panel 8 where
    they did not; the rule reproduces each winner."""
    from mmaemit.layouts.raster import L2_BYTES, choose_raster
    M, N, K = shape
    assert choose_raster(M // 128, N // 128, 128, 128, K, 132, L2_BYTES[9]) == expected


def test_gemm_config_auto_raster_is_the_default():
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
    assert GemmConfig().raster == "auto"
    make_gemm(256, 256, 128, config=GemmConfig(raster="auto"))
    with pytest.raises(UnsupportedConfigError, match="auto"):
        make_gemm(256, 256, 128, config=GemmConfig(raster="hilbert"))


def test_grouped_order_compiles_on_large_grids():
    """Regression (H100 raster study): the grouped order's symbolic forward map on a 128 x 128 tile grid made TVM
    build int32 literals past 2^31 (``pid - first_m * grid_n`` expanded into products of C's strides)."""
    import mmaemit
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
    f, _ = make_gemm(16384, 16384, 4096, config=GemmConfig(raster="grouped", panel=4), arch="sm_90a")
    assert "gemm" in mmaemit.compile(f, target="sm_90a", check_spills=False).cuda_source
