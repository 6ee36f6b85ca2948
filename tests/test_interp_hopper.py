"""The Hopper pipeline on the interpreter: tensor maps and TMA copies, mbarriers, warp-specialized contexts,
setmaxnreg, and the diagnostics that go with them (each shown firing on a broken kernel and quiet on the correct one).

References are independent of ``mmaemit.ptx.tma``: the box layout and swizzle are re-derived by plain loops in
``interp_hopper_kernels.reference_box``; GEMMs are checked against float64 products.
"""
from __future__ import annotations

import itertools
import math

import ml_dtypes
import numpy as np
import pytest

import interp_hopper_kernels as K
import mmaemit
from mmaemit.errors import ArgumentError, LayoutError, TileShapeError, UnsupportedConfigError
from mmaemit.interpret import (DeadlockError, RegisterBudgetError, TmaBeforeWaitError, TmaError,
                               TmaLayoutError, interpret)
from mmaemit.ptx import control, mbarrier, tma

# ----------------------------------------------------------------------------------------------------------------------
# mmaemit.ptx.tma: validation, box geometry, gather / scatter
# ----------------------------------------------------------------------------------------------------------------------

GOOD = dict(dtype="float16", global_address=0, global_dims=(64, 32), global_strides=(128,), box_dims=(64, 8),
            element_strides=(1, 1))


@pytest.mark.parametrize("change, error, words", [
    (dict(global_dims=(), global_strides=(), box_dims=(), element_strides=()), ArgumentError, "rank 0; valid: 1..5"),
    (dict(global_dims=(2,) * 6, global_strides=(16,) * 5, box_dims=(8,) * 6, element_strides=(1,) * 6), ArgumentError,
     "rank 6"),
    (dict(global_dims=(64, 0)), ArgumentError, "global dim 1 = 0"),
    (dict(global_strides=(120,)), ArgumentError, "multiple of 16"),
    (dict(global_strides=(1 << 40,)), ArgumentError, "below 2^40"),
    (dict(global_address=8), ArgumentError, "16-byte aligned"),
    (dict(box_dims=(64, 257)), LayoutError, "box dim 1 = 257; valid: 1..256"),
    (dict(box_dims=(0, 8)), LayoutError, "box dim 0 = 0"),
    (dict(element_strides=(1, 9)), LayoutError, "element stride 1 = 9; valid: 1..8"),
    (dict(element_strides=(2, 1)), LayoutError, "innermost traversal stride must be 1"),
    (dict(box_dims=(12, 8)), LayoutError, "24 bytes"),
    (dict(box_dims=(64, 8), swizzle=2), LayoutError, "larger than the 64-byte swizzle span"),
    (dict(swizzle=4), ArgumentError, "swizzle 4"),
    (dict(dtype="int4"), UnsupportedConfigError, "tensor map dtype 'int4'"),
    (dict(dtype="int32", oob_fill=1), ArgumentError, "needs a float dtype"),
    (dict(interleave=1), UnsupportedConfigError, "interleaved layouts"),
])
def test_encode_tiled_names_the_broken_rule(change, error, words):
    args = {**GOOD, **change}
    kw = {k: args.pop(k) for k in ("swizzle", "oob_fill", "interleave") if k in args}
    with pytest.raises(error, match=words.replace("^", r"\^").replace("(", r"\(")):
        tma.encode_tiled(*args.values(), **kw)


def test_encode_tiled_geometry():
    m = tma.encode_tiled("bfloat16", 256, (100, 30, 7), (256, 256 * 30), (64, 9, 4), (1, 2, 3), swizzle=3)
    assert m.rank == 3 and m.elem_bytes == 2 and m.swizzle_bytes == 128
    assert m.box_extents == (64, 5, 2)                      # ceil(9 / 2), ceil(4 / 3)
    assert m.box_bytes == 64 * 5 * 2 * 2 and m.inner_box_bytes == 128
    assert m.byte_strides == (2, 256, 256 * 30)


def _loop_offsets(m, coords):
    """Independent loop: per box element (dimension 0 fastest) its global coordinates, in-tensor flag, byte offset."""
    out = []
    ext = [-(-b // e) for b, e in zip(m.box_dims, m.element_strides)]
    for idx in itertools.product(*[range(e) for e in reversed(ext)]):
        idx = idx[::-1]
        g = [coords[d] + idx[d] * m.element_strides[d] for d in range(m.rank)]
        inside = all(0 <= g[d] < m.global_dims[d] for d in range(m.rank))
        off = g[0] * m.elem_bytes + sum(g[d] * m.global_strides[d - 1] for d in range(1, m.rank))
        out.append((g, inside, off))
    return out


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_box_element_offsets_match_a_loop(rank):
    rng = np.random.default_rng(rank)
    dims = [int(x) for x in rng.integers(3, 9, rank)]
    dims[0] = 16
    strides, s = [], 2 * dims[0]
    for d in dims[1:]:
        s = (s + 15) // 16 * 16 + 16 * int(rng.integers(0, 2))
        strides.append(s)
        s *= d
    box = [8] + [int(x) for x in rng.integers(1, 6, rank - 1)]
    es = [1] + [int(x) for x in rng.integers(1, 4, rank - 1)]
    m = tma.encode_tiled("float16", 0, dims, strides, box, es)
    for _ in range(4):
        coords = [int(x) for x in rng.integers(-4, 12, rank)]
        g, inb, off = tma.box_element_offsets(m, coords)
        want = _loop_offsets(m, coords)
        assert [list(x) for x in g] == [w[0] for w in want]
        assert list(inb) == [w[1] for w in want]
        assert list(off) == [w[2] for w in want]


def test_gather_fills_outside_the_tensor_and_scatter_clips():
    dims, strides = (8, 5), (32,)
    glob = np.arange(5 * 32, dtype=np.uint8)
    m = tma.encode_tiled("float16", 0, dims, strides, (8, 4), (1, 1))
    data, inb, outside = tma.gather_box(m, glob, 0, (0, 3))              # rows 3, 4 inside; 5, 6 outside
    assert not outside.any() and inb.reshape(4, 8).all(axis=1).tolist() == [True, True, False, False]
    got = data.reshape(4, 16)
    assert np.array_equal(got[:2], glob.reshape(5, 32)[3:5, :16]) and not got[2:].any()
    mn = tma.encode_tiled("float32", 0, (4, 5), (16,), (4, 2), (1, 1), oob_fill=1)
    d, _i, _o = tma.gather_box(mn, np.zeros(80, np.uint8), 0, (-2, 0))
    vals = d.reshape(-1).view(np.float32).reshape(2, 4)
    assert np.isnan(vals[:, :2]).all() and (vals[:, 2:] == 0).all()
    out = np.zeros(5 * 32, np.uint8)
    tma.scatter_box(m, out, 0, (0, 3), np.full((32, 2), 7, np.uint8))
    assert (out.reshape(5, 32)[3:, :16] == 7).all() and not out.reshape(5, 32)[:3].any()
    assert not out.reshape(5, 32)[:, 16:].any()


@pytest.mark.parametrize("swizzle", [0, 1, 2, 3])
def test_box_smem_addresses_are_the_swizzled_dense_box(swizzle):
    span = K.SWIZZLE_SPAN[swizzle]
    inner = max(span, 32) // 2
    m = tma.encode_tiled("float16", 0, (inner, 40), (2 * inner,), (inner, 24), (1, 1), swizzle=swizzle)
    for base in (0, 1024, 4096 + 128):
        got = tma.box_smem_addresses(m, base)
        want = K.swizzled(base + 2 * np.arange(inner * 24), span)
        assert np.array_equal(got, want)
        assert len(np.unique(got // 2)) == inner * 24          # a permutation of the box's elements


# ----------------------------------------------------------------------------------------------------------------------
# mmaemit.ptx.mbarrier and control
# ----------------------------------------------------------------------------------------------------------------------

def test_mbarrier_phase_needs_arrivals_and_transactions():
    b = mbarrier.MBarrier(2)
    assert b.phase_completed(1) and not b.phase_completed(0)        # the "preceding phase" of parity 1 is complete
    b.complete_tx(100)                                               # a copy may land before its expect-tx
    assert b.tx == -100
    assert not b.arrive()
    b.expect_tx(100)
    assert b.tx == 0 and b.pending == 1
    assert b.arrive()                                                # last arrival and tx-count 0: phase 0 completes
    assert b.phase == 1 and b.pending == 2 and b.phase_completed(0) and not b.phase_completed(1)
    b.expect_tx(64)
    assert not b.arrive(2)                                           # arrivals done, 64 bytes outstanding
    assert b.complete_tx(64) and b.phase == 2
    assert not b.arrive(1, drop=True) and b.expected == 1            # dropping shrinks later phases
    assert b.arrive() and b.pending == 1


def test_mbarrier_rejects_undefined_states():
    with pytest.raises(mbarrier.MbarrierStateError, match="valid: 1..1048575"):
        mbarrier.MBarrier(0)
    b = mbarrier.MBarrier(1)
    with pytest.raises(mbarrier.MbarrierStateError, match="more arrivals"):
        b.arrive(2)
    with pytest.raises(mbarrier.MbarrierStateError, match="tx-count"):
        b.expect_tx(1 << 21)


def test_elect_sync_and_setmaxnreg_rules():
    act = np.zeros((2, 32), bool)
    act[0, 5:] = True
    act[1, [3, 9]] = True
    d, p = control.elect_sync(act, np.array([0xFFFFFFFF, 0xFFFFFFF0], np.uint32))
    assert (d[0] == 5).all() and (d[1] == 9).all()                 # lane 3 is outside warp 1's member mask
    assert np.argwhere(p).tolist() == [[0, 5], [1, 9]]
    assert control.check_setmaxnreg("dec", 40, None) == 40
    for bad, words in (((("inc", 20, None)), "valid: 24..256"), (("inc", 104, 120), "below"),
                       (("dec", 200, 120), "above"), (("inc", 233, None), "steps of 8")):
        with pytest.raises(ArgumentError, match=words):
            control.check_setmaxnreg(*bad)
    assert control.launch_register_cap(384) == 168 and control.launch_register_cap(128) == 256


# ----------------------------------------------------------------------------------------------------------------------
# TMA load / store kernels on the interpreter
# ----------------------------------------------------------------------------------------------------------------------

ELEM = {"float16": 2, "float32": 4}
ROUNDTRIPS = {
    "2d_128B": dict(dims=(64, 48), strides=(128,), box=(64, 32), es=(1, 1), coords=(0, 8), store=(0, 16),
                    swizzle=3),
    "2d_64B_ragged": dict(dims=(40, 23), strides=(96,), box=(32, 16), es=(1, 1), coords=(24, 15), store=(16, 16),
                          swizzle=2),
    "2d_32B_f32": dict(dims=(20, 9), strides=(96,), box=(8, 8), es=(1, 1), coords=(16, -2), store=(16, 5),
                       swizzle=1, dtype="float32"),
    "3d_strided": dict(dims=(16, 12, 3), strides=(48, 48 * 12), box=(16, 8, 3), es=(1, 2, 1), coords=(0, 3, 1),
                       store=(0, 0, 0), swizzle=0),
    "1d": dict(dims=(100,), strides=(), box=(64,), es=(1,), coords=(0,), store=(0,), swizzle=0),
    "5d": dict(dims=(8, 3, 2, 2, 3), strides=(16, 48, 96, 192), box=(8, 2, 2, 1, 2), es=(1, 1, 1, 1, 2),
               coords=(0, 2, 0, 1, 0), store=(0, 0, 1, 0, 2), swizzle=0),
    "nan_fill": dict(dims=(12, 6), strides=(48,), box=(8, 4), es=(1, 1), coords=(8, 4), store=(0, 0), swizzle=0,
                     dtype="float32", oob_fill=1),
    # a [40, 192] matrix as (64 columns, 40 rows, 3 column chunks): strides out of order (a row 384 B, a chunk 128 B),
    # the box two chunks of 32 rows from row 16 (8 rows past the end), the fused dequant kernel's activation box
    "3d_chunk_view": dict(dims=(64, 40, 3), strides=(384, 128), box=(64, 32, 2), es=(1, 1, 1), coords=(0, 16, 1),
                          store=(0, 0, 0), swizzle=3),
}
# Coordinates are innermost first (as the PTX instruction takes them). ROUNDTRIPS are legal on the H100 and also run
# there (test_tma_roundtrips_on_gpu_match_the_interpreter); the variants below were measured on the H100 too
# (2026-11-26, each in its own process) and run on the interpreter only: more legal copies, and copies that stop the
# kernel with an illegal instruction, which the interpreter must report (``mmaemit.ptx.tma.hardware_fault``).
LEGAL_VARIANTS = {
    "2d64_store00": dict(ROUNDTRIPS["2d_64B_ragged"], store=(0, 0)),
    "1d_dim104_inb": dict(ROUNDTRIPS["1d"], dims=(104,)),
}
#: name (as in the H100 log; "2d64_negstore" and "1d_oob" were ROUNDTRIPS' "2d_64B_ragged" and "1d" there) ->
#: (case, [(copy, words of the rule)] of the faults the interpreter reports, in program order)
H100_FAULTS = {
    "2d64_negstore": (dict(ROUNDTRIPS["2d_64B_ragged"], store=(-8, -4)), [("store", "negative coordinate")]),
    "2d64_noswz": (dict(ROUNDTRIPS["2d_64B_ragged"], store=(-8, -4), swizzle=0), [("store", "negative coordinate")]),
    "2d128_negstore": (dict(ROUNDTRIPS["2d_128B"], store=(-8, -4)), [("store", "negative coordinate")]),
    "1d_oob": (dict(ROUNDTRIPS["1d"], coords=(60,), store=(80,)), [("load", "rank-1"), ("store", "rank-1")]),
    "1d_store_inb": (dict(ROUNDTRIPS["1d"], coords=(60,), store=(0,)), [("load", "rank-1")]),
    "1d_dim104": (dict(ROUNDTRIPS["1d"], dims=(104,), coords=(60,), store=(80,)),
                  [("load", "rank-1"), ("store", "rank-1")]),
}
_CASES = {**ROUNDTRIPS, **LEGAL_VARIANTS, **{k: v[0] for k, v in H100_FAULTS.items()}}
_KERNELS = {}


def _roundtrip_kernel(name, **faults):
    key = (name, tuple(sorted(faults.items())))
    if key not in _KERNELS:
        c = _CASES[name]
        _KERNELS[key] = K.tma_roundtrip(c["dims"], c["strides"], c["box"], c["es"], c["coords"], c["store"],
                                        dtype=c.get("dtype", "float16"), swizzle=c["swizzle"],
                                        oob_fill=c.get("oob_fill", 0), **faults)
    return _KERNELS[key]


def _tensor_elems(c):
    e = ELEM[c.get("dtype", "float16")]
    bs = [e] + list(c["strides"])
    return (sum((d - 1) * s for d, s in zip(c["dims"], bs)) + e) // e


def _roundtrip_args(name):
    """(G random, O poisoned, C filled with 9) for case ``name``."""
    c = _CASES[name]
    dt = c.get("dtype", "float16")
    n = _tensor_elems(c)
    G = np.random.default_rng(len(name)).standard_normal(n).astype(dt)
    nbox = int(np.prod([-(-b // s) for b, s in zip(c["box"], c["es"])]))
    return G, np.full(nbox * ELEM[dt], 0xAB, np.uint8), np.full(n, 9.0, dt)


def _check_roundtrip(name, on_error="raise"):
    """Interpret case ``name`` and check O and C bit-exactly against the loop reference (loads fill, stores clip);
    returns the report."""
    c = _CASES[name]
    dt = c.get("dtype", "float16")
    e = ELEM[dt]
    n = _tensor_elems(c)
    span = K.SWIZZLE_SPAN[c["swizzle"]]
    ext = [-(-b // s) for b, s in zip(c["box"], c["es"])]
    nbox = int(np.prod(ext))
    G, O, C = _roundtrip_args(name)
    report = interpret(_roundtrip_kernel(name), G, O, C, on_error=on_error)
    assert report.stats["tma.load"] == 1 and report.stats["tma.store"] == 1
    want = K.reference_box(G.view(np.uint8), c["dims"], c["strides"], c["box"], c["es"], c["coords"], e, span,
                           fill_nan=c.get("oob_fill", 0) == 1)
    assert np.array_equal(O, want)
    # the store writes box element i (dense order, un-swizzled) at its coordinates from ``store``, inside only
    dense = want[K.swizzled(np.arange(nbox) * e, span)[:, None] + np.arange(e)].reshape(-1).view(dt)
    expect = np.full(n, 9.0, dt)
    byte_strides = [e] + list(c["strides"])
    for flat in range(nbox):
        idx, rem = [], flat
        for x in ext:
            idx.append(rem % x)
            rem //= x
        g = [c["store"][d] + idx[d] * c["es"][d] for d in range(len(ext))]
        if all(0 <= g[d] < c["dims"][d] for d in range(len(ext))):
            expect[sum(g[d] * byte_strides[d] for d in range(len(ext))) // e] = dense[flat]
    assert np.array_equal(C.view(np.uint8), expect.view(np.uint8))
    return report


@pytest.mark.parametrize("name", list(ROUNDTRIPS) + list(LEGAL_VARIANTS))
def test_tma_load_and_store_match_the_loop_reference(name):
    report = _check_roundtrip(name)
    assert report.ok, report.summary()


@pytest.mark.parametrize("name", list(H100_FAULTS))
def test_tma_copies_the_h100_rejects_are_reported(name):
    """Each copy measured to fault on the H100 is a "tma" error naming the rule, its coordinates and the box (the run
    then goes on with the copy filled / clipped as modelled, so the outputs still match the loop reference), and the
    default on_error raises ``TmaError`` at the first one."""
    c, faults = H100_FAULTS[name]
    report = _check_roundtrip(name, on_error="report")
    assert not report.ok
    assert [d.kind for d in report.errors] == ["tma"] * len(faults), report.summary()
    for d, (copy, rule) in zip(report.errors, faults):
        at = c["coords"] if copy == "load" else c["store"]
        assert d.message.startswith("cp.async.bulk.tensor") and f"TMA {copy}" in d.message, d.message
        assert rule in d.message and "H100" in d.message, d.message
        assert f"box {list(c['box'])} at coordinates {list(at)}" in d.message, d.message
        assert ("global.shared::cta" in d.message) == (copy == "store")
    with pytest.raises(TmaError, match=faults[0][1]):
        interpret(_roundtrip_kernel(name), *_roundtrip_args(name))


def test_tma_kernels_compile_to_utmaldg_and_utmastg():
    mix = mmaemit.compile(_roundtrip_kernel("2d_128B"), target="sm_90a").instruction_mix("sm_90a")
    assert mix["UTMALDG"] == 1 and mix["UTMASTG"] == 1 and mix["SYNCS"] >= 1


@pytest.mark.parametrize("fault, kind", [("read_before_wait", "tma_before_wait"),
                                         ("no_store_wait", "tma_before_wait"),
                                         # a load that lands only when nothing else can run: still in flight at exit
                                         ("never_wait", "tma_before_wait"),
                                         ("store_without_fence", "missing_proxy_fence")])
def test_tma_faults_fire_and_the_correct_kernel_is_quiet(fault, kind):
    c = ROUNDTRIPS["2d_128B"]
    n = _tensor_elems(c)
    G = np.random.default_rng(0).standard_normal(n).astype(np.float16)
    args = (G, np.zeros(64 * 32 * 2, np.uint8), np.zeros(n, np.float16))
    report = interpret(_roundtrip_kernel("2d_128B", **{fault: True}), *args, on_error="report")
    assert [d.kind for d in report.errors] == [kind], report.summary()
    assert interpret(_roundtrip_kernel("2d_128B"), *args).ok
    if kind == "tma_before_wait":
        with pytest.raises(TmaBeforeWaitError):
            interpret(_roundtrip_kernel("2d_128B", **{fault: True}), *args)


def test_tensor_map_past_its_buffer_is_an_argument_error():
    bad = K.tma_roundtrip((64, 48), (128,), (64, 32), (1, 1), (0, 8), (0, 16), swizzle=3, nelem=64 * 40)
    with pytest.raises(ArgumentError, match="spans 6144 bytes from the start of G, which has 5120"):
        interpret(bad, np.zeros(64 * 40, np.float16), np.zeros(4096, np.uint8), np.zeros(64 * 40, np.float16))


# The H100's measured faults as a rule on (dims, box, coordinates), innermost first: every row of the 2026-11-26
# measurement (names as in the H100 log), plus the edges of the rank-1 rule and unknown (run-time) entries.
@pytest.mark.parametrize("dims, box, coords, store, words", [
    ((64, 48), (64, 32), (0, 8), False, None),                   # 2d_128B load
    ((64, 48), (64, 32), (0, 16), True, None),                   # 2d_128B store
    ((20, 9), (8, 8), (16, -2), False, None),                    # 2d_32B_f32: negative, partly outside load
    ((20, 9), (8, 8), (16, 5), True, None),
    ((40, 23), (32, 16), (24, 15), False, None),                 # 2d_64B_ragged load, partly outside
    ((40, 23), (32, 16), (0, 0), True, None),                    # 2d64_store00
    ((40, 23), (32, 16), (16, 16), True, None),                  # 2d64_store_pos_oob
    ((40, 23), (32, 16), (-8, -4), True, "negative coordinate (-8 in position 0)"),   # 2d_64B_ragged, 2d64_noswz
    ((64, 48), (64, 32), (0, -4), True, "negative coordinate (-4 in position 1)"),
    ((100,), (64,), (60,), False, "rank-1 TMA load"),            # 1d, 1d_store_inb
    ((100,), (64,), (80,), True, "rank-1 TMA store"),
    ((104,), (64,), (60,), False, "start in 0..40"),             # 1d_dim104
    ((100,), (64,), (0,), False, None),                          # 1d_load_inb
    ((100,), (64,), (36,), True, None),                          # the last legal start
    ((100,), (64,), (-1,), False, "rank-1 TMA load"),
    ((100,), (64,), (-1,), True, "negative coordinate"),
    ((48,), (64,), (0,), False, "no start is legal"),
    ((100,), (64,), (None,), True, None),                        # a run-time coordinate: not checked
    ((None,), (64,), (60,), False, None),                        # a symbolic dimension: not checked
    ((40, 23), (32, 16), (None, -4), True, "negative coordinate (-4 in position 1)"),
])
def test_hardware_fault_is_the_measured_rule(dims, box, coords, store, words):
    msg = tma.hardware_fault(dims, box, coords, store=store)
    if words is None:
        assert msg is None, msg
    else:
        assert words in msg and "H100" in msg and f"box {list(box)} at coordinates {list(coords)}" in msg, msg


def _tile_store_kernel(coords, shape, box, prefetch=None):
    """128 threads write X into a shared tile (generic stores, then fence.proxy.async), thread 0 stores it with
    ``TmaTile.store`` at the constant ``coords`` (outermost first) into C (``prefetch``: thread 0 first asks L2 for
    the box at those coordinates with ``TmaTile.prefetch``)."""
    from tvm.script import tirx as T

    from mmaemit.pipeline import TmaTile, bulk_commit, bulk_wait

    tile = TmaTile(shape, "float16", box, 0)
    n = int(np.prod(box))

    @T.prim_func
    def tile_store(X: T.Buffer((n,), "float16"), C: T.Buffer(shape, "float16")):
        c_map = tile.encode(C)
        T.device_entry()
        _bx = T.cta_id([1])
        tx = T.thread_id([128])
        pool = T.SMEMPool()
        s = pool.alloc((n,), "float16", align=1024)
        pool.commit()
        for i in T.serial(n // 128):
            s[i * 128 + tx] = X[i * 128 + tx]
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        if prefetch is not None:
            tile.prefetch(c_map, prefetch, pred=tx == 0)
        tile.store(c_map, coords, s.ptr_to([0]), pred=tx == 0)
        bulk_commit()
        bulk_wait(0, read=True)
    return tile_store


def test_tma_tile_refuses_constant_coordinates_the_h100_rejects():
    """``TmaTile.store`` / ``load`` check compile-time-constant coordinates against ``hardware_fault`` while the kernel
    is built; a legal store past the positive end builds and clips on the interpreter."""
    from mmaemit.pipeline import TmaTile

    X = np.random.default_rng(1).standard_normal(32 * 64).astype(np.float16)
    C = np.full((48, 64), 9.0, np.float16)
    assert interpret(_tile_store_kernel((32, 0), (48, 64), (32, 64)), X, C).ok
    assert np.array_equal(C[32:], X.reshape(32, 64)[:16]) and (C[:32] == 9).all()
    with pytest.raises(Exception, match=r"TmaTile.store: a TMA store whose box starts at a negative coordinate "
                                        r"\(-8 in position 0\).*coordinates \[-8, 0\] \(outermost first\)"):
        _tile_store_kernel((-8, 0), (48, 64), (32, 64))        # TVMScript wraps it in a DiagnosticError
    with pytest.raises(Exception, match=r"TmaTile.store: a rank-1 TMA store .*\(start in 0..64\)"):
        _tile_store_kernel((96,), (128,), (64,))
    with pytest.raises(TileShapeError, match=r"TmaTile.load: a rank-1 TMA load .*coordinates \[60\]"):
        TmaTile((100,), "float16", (64,)).load(None, None, (60,), None)     # refused before any code


def test_tma_tile_view_strides_are_checked():
    """``TmaTile(strides=...)``: a view of a dense buffer in any stride order (byte strides innermost first, as the
    encoder takes them); bad strides and a view past its buffer are refused with the rule."""
    import tvm
    from tvm.script import tirx as T

    from mmaemit.pipeline import TmaTile

    m = tvm.tirx.Var("m", "int32")
    view = TmaTile((3, m, 64), "float16", (2, 32, 64), 128, strides=(64, 192, 1))
    assert view.byte_strides() == (384, 128) and view.box_bytes == 2 * 32 * 64 * 2
    assert TmaTile((3, 40, 64), "float16", (2, 32, 64), strides=(64, 192, 1)).byte_strides() == (384, 128)
    for strides, words in (((64, 192), "one positive element stride per dimension"),
                           ((64, 192, 2), "the innermost 1"), ((4, 192, 1), "multiple of 16")):
        with pytest.raises(TileShapeError, match=words):
            TmaTile((3, 40, 64), "float16", (2, 32, 64), strides=strides)
    assert view._view_fits([m, 192])
    assert not view._view_fits([m, 128])                      # three 64-column chunks need 192 columns
    assert not view._view_fits([40, 192])                     # the view's symbolic rows are not the buffer's
    assert not TmaTile((3, m, 64), "float16", (2, 32, 64), strides=(64, 96, 1))._view_fits([m, 192])

    def kernel(rows):
        @T.prim_func
        def f(A: T.Buffer((m, rows), "float16")):
            view.encode(A)
            T.device_entry()
            T.evaluate(0)
        return f
    kernel(192)
    with pytest.raises(Exception, match=r"this tensor map describes \[3, m, 64\] float16"):
        kernel(160)

    def short_box(box):
        @T.prim_func
        def f(A: T.Buffer((m, 192), "float16")):
            view.encode(A, box=box)
            T.device_entry()
            T.evaluate(0)
        return f
    short_box((2, T.min(32, (m + 7) // 8 * 8), 64))           # a per-launch box (fit_rows), at most the built one
    with pytest.raises(Exception, match=r"one extent per dimension in 1 .. the built box \(2, 32, 64\)"):
        short_box((2, 40, 64))


def test_tma_prefetch_is_checked_and_leaves_memory_alone():
    """``TmaTile.prefetch`` (an L2 hint): compiles to UTMAPF, runs on the interpreter without changing any result
    (also partly outside the tensor, which the hardware ignores), and refuses the rank-1 coordinates a load refuses."""
    from mmaemit.pipeline import TmaTile

    X = np.random.default_rng(2).standard_normal(32 * 64).astype(np.float16)
    for at in ((16, 0), (40, 0)):
        C = np.full((48, 64), 9.0, np.float16)
        func = _tile_store_kernel((16, 0), (48, 64), (32, 64), prefetch=at)
        assert interpret(func, X, C).ok
        assert np.array_equal(C[16:], X.reshape(32, 64)) and (C[:16] == 9).all()
    hist = mmaemit.compile(func, target="sm_90a").opcode_histogram("sm_90a")
    assert hist.get("UTMAPF.L2.2D", 0) == 1, hist
    with pytest.raises(TileShapeError, match=r"TmaTile.prefetch: a rank-1 TMA load .*coordinates \[60\]"):
        TmaTile((100,), "float16", (64,)).prefetch(None, (60,))


# ----------------------------------------------------------------------------------------------------------------------
# mbarrier kernels: phases, arrivals, deadlocks
# ----------------------------------------------------------------------------------------------------------------------

def test_mbarrier_phases_complete_with_the_expected_arrivals():
    O = np.zeros(8, np.int32)
    report = interpret(K.mbarrier_counts(arrive_count=4, phases=3), O)
    assert report.ok and O[:3].tolist() == [1, 2, 3] and report.stats["contexts"] == 4
    O[:] = 0
    assert interpret(K.mbarrier_counts(arrive_count=2, arrivals=(1, 2), phases=2, arrive_form="count"), O).ok
    assert O[:2].tolist() == [1, 2]


@pytest.mark.parametrize("kw, words", [
    (dict(arrive_count=2, arrivals=(0,)), "1 of 2 arrivals pending"),
    (dict(arrive_count=4, arrive_form="expect_tx", expect_bytes=256), "0 of 4 arrivals pending, tx-count 1024"),
    # phase 0 never completes, but a wait for parity 1 (the "preceding" phase) succeeds at once: no deadlock
    (dict(arrive_count=8, parity_of_wait=1, phases=1), None),
])
def test_a_wait_that_can_never_complete_is_a_deadlock(kw, words):
    O = np.zeros(8, np.int32)
    f = K.mbarrier_counts(**kw)
    report = interpret(f, O, on_error="report")
    if words is None:
        assert report.ok
        return
    (d,) = report.errors
    assert d.kind == "deadlock" and words in d.message and "bar[0]" in d.message and "warp 3 wait" in d.message
    with pytest.raises(DeadlockError):
        interpret(f, O)


# ----------------------------------------------------------------------------------------------------------------------
# the warp-specialized TMA + mbarrier + wgmma GEMM
# ----------------------------------------------------------------------------------------------------------------------

GEMMS = {
    "2c3s_ragged": (200, 100, 200, dict(consumers=2, stages=3)),
    "1c2s_elect_cuda_wait": (100, 60, 72, dict(consumers=1, stages=2, producer_elect="elect", consumer_wait="cuda")),
    "2c2s_tma_store": (150, 68, 136, dict(consumers=2, stages=2, epilogue="tma")),
}
_GEMM_CACHE = {}


def _gemm(M, N, Kd, **kw):
    key = (M, N, Kd, tuple(sorted(kw.items())))
    if key not in _GEMM_CACHE:
        _GEMM_CACHE[key] = K.ws_gemm(M, N, Kd, **kw)
    return _GEMM_CACHE[key]


def _gemm_args(M, N, Kd, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((M, Kd)).astype(np.float16)
    B = rng.standard_normal((N, Kd)).astype(np.float16)
    return A, B, np.full((M, N), np.nan, np.float32)


@pytest.mark.parametrize("name", list(GEMMS))
def test_warp_specialized_gemm_matches_float64(name):
    M, N, Kd, kw = GEMMS[name]
    A, B, C = _gemm_args(M, N, Kd)
    report = interpret(_gemm(M, N, Kd, **kw), A, B, C)
    assert report.ok, report.summary()
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    assert not np.isnan(C).any()
    np.testing.assert_allclose(C, ref, rtol=1e-5, atol=1e-4 * math.sqrt(Kd))
    cons = kw["consumers"]
    ctas = -(-M // (64 * cons)) * -(-N // 64)
    assert report.stats["contexts"] == ctas * (1 + cons) and report.stats["setmaxnreg"] == ctas * (1 + cons)
    assert report.stats["tma.load"] == ctas * -(-Kd // 64) * 2


def test_warp_specialized_gemm_sass():
    M, N, Kd, kw = GEMMS["2c2s_tma_store"]
    k = mmaemit.compile(_gemm(M, N, Kd, **kw), target="sm_90a")
    mix = k.instruction_mix("sm_90a")
    assert mix["HGMMA"] > 0 and mix["UTMALDG"] > 0 and mix["UTMASTG"] > 0 and mix["LDGSTS"] == 0
    from mmaemit.runtime.sass import wgmma_accumulator_hazards
    assert wgmma_accumulator_hazards(k.sass("sm_90a")) == []


@pytest.mark.parametrize("fault, kind, error, words", [
    (dict(no_full_wait=True), "tma_before_wait", TmaBeforeWaitError, "before waiting for the mbarrier phase"),
    (dict(b_swizzle=2), "tma_layout_mismatch", TmaLayoutError, "64-byte swizzle"),
    (dict(regs=(40, 248)), "register_budget", RegisterBudgetError, "68608 registers, over its 64512 (its launch allocation, 384 threads x 168"),
    # within the 64K file but over what 384 threads x 168 registers were given at launch: hangs on the GPU
    (dict(regs=(48, 232)), "register_budget", RegisterBudgetError, "65536 registers, over its 64512"),
    (dict(producer_parity_bug=True), "deadlock", DeadlockError, "warp 0 (the rest of warps 0-3 idles in lockstep with it) waits in T.cuda.mbarrier_wait"),
])
def test_gemm_faults_fire(fault, kind, error, words):
    M, N, Kd = 128, 64, 128
    args = _gemm_args(M, N, Kd)
    f = _gemm(M, N, Kd, consumers=2, stages=2, **fault)
    report = interpret(f, *args, on_error="report")
    assert report.errors and report.errors[0].kind == kind, report.summary()
    assert words in report.errors[0].message
    with pytest.raises(error):
        interpret(f, *_gemm_args(M, N, Kd))
    good = _gemm(M, N, Kd, consumers=2, stages=2)
    A, B, C = _gemm_args(M, N, Kd)
    assert interpret(good, A, B, C).ok


@pytest.mark.parametrize("kw, kind", [(dict(), None), (dict(sync_before_read=False), "race"),
                                      # without the arrive the kernel runs in one lockstep pass, where a bar.sync
                                      # over all 64 threads reached by 32 of them is reported as divergence
                                      (dict(arrive=False), "divergence")])
def test_named_barrier_arrive_orders_a_handoff(kw, kind):
    X = np.arange(32, dtype=np.float32)
    O = np.full(32, np.nan, np.float32)
    report = interpret(K.named_barrier_handoff(**kw), X, O, on_error="report")
    if kind is None:
        assert report.ok and np.array_equal(O, 2 * X) and report.stats["contexts"] == 2
    else:
        assert [d.kind for d in report.errors] == [kind], report.summary()


def test_elect_sync_elects_the_lowest_active_lane():
    O = np.zeros(64, np.uint32)
    assert interpret(K.elect_lanes(3), O).ok
    want = np.where(np.arange(32) < 3, 0, 300)
    want[3] = 301
    assert np.array_equal(O.reshape(2, 32), np.stack([want, want]))


def test_pipeline_instructions_are_gated_by_arch():
    from mmaemit.errors import ArchError

    M, N, Kd, kw = GEMMS["1c2s_elect_cuda_wait"]
    with pytest.raises(ArchError, match="sm_90"):
        interpret(_gemm(M, N, Kd, **kw), *_gemm_args(M, N, Kd), arch="sm_90")     # wgmma / setmaxnreg: sm_90a
    c = ROUNDTRIPS["1d"]
    n = _tensor_elems(c)
    with pytest.raises(ArchError, match="sm_90"):
        interpret(_roundtrip_kernel("1d"), np.zeros(n, np.float16), np.zeros(128, np.uint8),
                  np.zeros(n, np.float16), arch="sm_80")


# ----------------------------------------------------------------------------------------------------------------------
# the same kernels on the GPU: the interpreter's model of TMA, mbarriers and the pipeline checked against hardware
# ----------------------------------------------------------------------------------------------------------------------

# Only ROUNDTRIPS run here (all legal on the H100); the copies the H100 rejects with an illegal instruction
# (H100_FAULTS, measured 2026-11-26) are interpreter-only tests that check the interpreter reports them.

_ROUNDTRIP_CHILD = """
import sys, numpy as np, torch
sys.path.insert(0, sys.argv[1])
import mmaemit, test_interp_hopper as t
for name in sys.argv[2:]:
    c = t.ROUNDTRIPS[name]
    dt = c.get("dtype", "float16")
    n = t._tensor_elems(c)
    G = np.random.default_rng(len(name)).standard_normal(n).astype(dt)
    nbox = int(np.prod([-(-b // s) for b, s in zip(c["box"], c["es"])]))
    O = np.zeros(nbox * t.ELEM[dt], np.uint8)
    C = np.full(n, 9.0, dt)
    f = t._roundtrip_kernel(name)
    assert t.interpret(f, G, O, C).ok
    Gd = torch.from_numpy(G).cuda()
    Od = torch.zeros(O.shape, dtype=torch.uint8, device="cuda")
    Cd = torch.full((n,), 9.0, dtype=getattr(torch, dt), device="cuda")
    print("START", name, flush=True)
    mmaemit.compile(f, target="sm_90a")(Gd, Od, Cd)
    torch.cuda.synchronize()
    if c.get("oob_fill", 0):       # the OOB fill is "a NaN": compare NaN-ness there, bits elsewhere
        got, want = Od.cpu().numpy().view(np.float32), O.view(np.float32)
        ok = (np.array_equal(np.isnan(got), np.isnan(want))
              and np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)]))
    else:
        ok = np.array_equal(Od.cpu().numpy(), O) and np.array_equal(Cd.cpu().numpy().view(np.uint8), C.view(np.uint8))
    print("BIT-EXACT" if ok else "MISMATCH", name, flush=True)
"""


@pytest.mark.gpu
def test_tma_roundtrips_on_gpu_match_the_interpreter():
    """Every ROUNDTRIPS case, bit for bit against the interpreter, in one child process (one start-up of torch, TVM
    and the CUDA context for all cases instead of one each). A TMA fault poisons the CUDA context, so the case that
    faults is recorded and a fresh child goes on with the cases after it: one bad case never hides the others or fails
    the tests that share this pytest worker."""
    import os
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    todo, results, errors = list(ROUNDTRIPS), {}, {}
    while todo:
        proc = subprocess.run([sys.executable, "-c", _ROUNDTRIP_CHILD, here, *todo], capture_output=True, text=True,
                              timeout=600)
        for line in proc.stdout.splitlines():
            word, _, name = line.partition(" ")
            if word in ("BIT-EXACT", "MISMATCH"):
                results[name] = word
        done = [n for n in todo if n in results]
        rest = todo[len(done):]
        if proc.returncode != 0 and rest:       # the first case without a result failed the child: record it, go on
            errors[rest[0]] = proc.stderr[-1500:]
            rest = rest[1:]
        elif proc.returncode == 0 and rest:
            errors.update({n: "no result from a child that exited 0" for n in rest})
            rest = []
        todo = rest
    bad = {n: w for n, w in results.items() if w != "BIT-EXACT"}
    assert not bad and not errors, (bad, errors)
    assert sorted(results) == sorted(ROUNDTRIPS)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GEMMS))
def test_warp_specialized_gemm_on_gpu(name):
    import torch

    M, N, Kd, kw = GEMMS[name]
    A, B, C = _gemm_args(M, N, Kd)
    f = _gemm(M, N, Kd, **kw)
    assert interpret(f, A, B, C).ok
    Cd = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    mmaemit.compile(f, target="sm_90a")(torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda(), Cd)
    got = Cd.cpu().numpy()
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    assert not np.isnan(got).any()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4 * math.sqrt(Kd))
    np.testing.assert_allclose(got, C, rtol=1e-5, atol=1e-4 * math.sqrt(Kd))


@pytest.mark.gpu
def test_mbarrier_and_named_barrier_kernels_on_gpu():
    import torch

    O = torch.zeros(8, dtype=torch.int32, device="cuda")
    mmaemit.compile(K.mbarrier_counts(arrive_count=4, phases=3), target="sm_90a")(O)
    assert O.cpu().numpy()[:3].tolist() == [1, 2, 3]
    X = torch.arange(32, dtype=torch.float32, device="cuda")
    Y = torch.zeros(32, dtype=torch.float32, device="cuda")
    mmaemit.compile(K.named_barrier_handoff(), target="sm_90a")(X, Y)
    assert torch.equal(Y, 2 * X)
    E = torch.zeros(64, dtype=torch.uint32, device="cuda")
    mmaemit.compile(K.elect_lanes(3), target="sm_90a")(E)
    e = E.cpu().view(torch.int32).numpy().astype(np.int64).reshape(2, 32)
    for w in range(2):
        leader = e[w, 3] // 100
        assert 3 <= leader < 32 and (e[w, 3:] // 100 == leader).all() and (e[w, 3:] % 100).sum() == 1
        assert e[w, leader] % 100 == 1          # the interpreter elects the lowest active lane (3); PTX allows any


# ----------------------------------------------------------------------------------------------------------------------
# wgmma beyond f16 / bf16 (the library Hopper GEMM uses fp8 and int8 SS forms)
# ----------------------------------------------------------------------------------------------------------------------

def test_wgmma_8bit_a_fragment_is_the_ptx_table():
    """PTX ISA wgmma .m64nNk32 A fragment (8-bit): a0 = A[16w + g, 4c..4c+3], a1 rows + 8, a2 columns + 16, a3
    both (bytes low first); tf32 .k8: a0 = (g, c), a1 = (g + 8, c), a2 = (g, c + 4), a3 = (g + 8, c + 4)."""
    from mmaemit.ptx import wgmma as W

    t = np.arange(128)
    w, g, c = t // 32, (t % 32) // 4, t % 4
    r, col = W.wgmma_a_coords("e4m3")
    for reg in range(4):
        for byte in range(4):
            assert np.array_equal(r[:, 4 * reg + byte], 16 * w + g + 8 * (reg % 2))
            assert np.array_equal(col[:, 4 * reg + byte], 4 * c + byte + 16 * (reg // 2))
    r, col = W.wgmma_a_coords("tf32")
    assert np.array_equal(r, np.stack([16 * w + g + 8 * (q % 2) for q in range(4)], 1))
    assert np.array_equal(col, np.stack([c + 4 * (q // 2) for q in range(4)], 1))


def test_wgmma_mma_integer_wraps_or_saturates_and_f16_accumulates_in_f16():
    from mmaemit.ptx import wgmma as W

    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (64, 32)).astype(np.uint8)
    b = rng.integers(0, 256, (32, 16)).astype(np.uint8)
    d = rng.integers(-2 ** 31, 2 ** 31, (64, 16)).astype(np.int32)
    exact = a.view(np.int8).astype(np.int64) @ b.astype(np.int64) + d
    wrapped = W.wgmma_mma(16, "s8", a, b, d, True, btype="u8", dtype="s32")
    assert np.array_equal(wrapped.astype(np.int64), (exact + 2 ** 31) % 2 ** 32 - 2 ** 31)
    sat = W.wgmma_mma(16, "s8", a, b, d, True, btype="u8", dtype="s32", satfinite=True)
    assert np.array_equal(sat.astype(np.int64), np.clip(exact, -2 ** 31, 2 ** 31 - 1))
    x = rng.standard_normal((64, 32)).astype(ml_dtypes.float8_e4m3fn)
    y = rng.standard_normal((32, 8)).astype(ml_dtypes.float8_e5m2)
    acc = rng.standard_normal((64, 8)).astype(np.float16)
    got = W.wgmma_mma(8, "e4m3", x.view(np.uint8), y.view(np.uint8), acc, True, -1, 1, btype="e5m2", dtype="f16")
    ref = -x.astype(np.float64) @ y.astype(np.float64) + acc
    assert got.dtype == np.float16 and np.array_equal(got, ref.astype(np.float16))


HOPPER_LIB = {
    "f16_persistent": (200, 136, 200, "float16", None, dict(block_n=64, consumers=2, stages=2, num_sms=2,
                                                             epilogue_boxes=1)),
    "bf16_to_f32": (128, 128, 128, "bfloat16", "float32", dict(block_n=64, num_sms=2)),
    "fp8_scaled": (128, 136, 96, "float8_e4m3fn", "float32", dict(block_n=64, num_sms=3, epilogue_boxes=1)),
    "int8": (128, 128, 160, "int8", None, dict(block_n=64, num_sms=2, epilogue_boxes=1)),
}


@pytest.mark.parametrize("name", list(HOPPER_LIB))
def test_library_hopper_gemm_on_the_interpreter(name):
    """mmaemit.kernels.gemm_hopper (TmaTile, MbarrierRing, WarpgroupRoles, persistent scheduler, TMA-store
    epilogue) runs clean on the interpreter and matches float64 / exact integer references."""
    from mmaemit.kernels.gemm_hopper import HopperGemmConfig, make_gemm_hopper

    M, N, Kd, dt, out, cfg = HOPPER_LIB[name]
    f, _ = make_gemm_hopper(M, N, Kd, dtype=dt, out_dtype=out, config=HopperGemmConfig(**cfg))
    rng = np.random.default_rng(7)
    npdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
            "int8": np.int8}[dt]
    if dt == "int8":
        A = rng.integers(-128, 128, (M, Kd)).astype(np.int8)
        B = rng.integers(-128, 128, (N, Kd)).astype(np.int8)
    else:
        A = rng.standard_normal((M, Kd)).astype(npdt)
        B = rng.standard_normal((N, Kd)).astype(npdt)
    outdt = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
             "int32": np.int32}[out or {"int8": "int32"}.get(dt, dt)]
    C = np.full((M, N), -7 if outdt == np.int32 else np.nan, outdt)
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    args = [A, B, C]
    if dt.startswith("float8"):
        sa, sb = np.array([0.5], np.float32), np.array([3.0], np.float32)
        args += [sa, sb]
        ref = ref * 1.5
    report = interpret(f, *args)
    assert report.ok, report.summary()
    if outdt == np.int32:
        assert np.array_equal(C.astype(np.int64), ref.astype(np.int64))
    else:
        got = C.astype(np.float64)
        tol = {np.float16: 2e-3, ml_dtypes.bfloat16: 8e-3, np.float32: 1e-5}[outdt]
        assert not np.isnan(got).any()
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


def test_clusters_of_more_than_one_cta_are_refused_clearly():
    from mmaemit.kernels.gemm_hopper import HopperGemmConfig, make_gemm_hopper

    f, _ = make_gemm_hopper(256, 128, 128, config=HopperGemmConfig(block_n=64, num_sms=2, cluster_m=2,
                                                                     epilogue_boxes=1))
    args = _gemm_args(256, 128, 128)
    with pytest.raises(UnsupportedConfigError, match="clusters of one CTA"):
        interpret(f, args[0], args[1], args[2].astype(np.float16))


@pytest.mark.parametrize("stages, consumers", [(2, 2), (3, 2), (4, 2), (5, 2), (6, 3), (4, 3)])
def test_round_robin_ring_parity_alias(stages, consumers):
    """Consumers dealt a ring's stages round robin (the fused dequant kernel's k_split) wait by phase parity. TMA loads
    land as late as a legal schedule allows (only when nothing else can run), so with stages not a multiple of the
    consumers a consumer meets a stage whose previous round, another consumer's unit, is still in flight: its parity
    wait passes on that round's phase and it reads bytes the copy has not written (the H100 faulted in the producer's
    expect-tx arrive on this pattern). With a multiple, every sum is exact."""
    units = 12
    G = np.random.default_rng(stages).standard_normal((units, 64)).astype(np.float32)
    O = np.full(64 * consumers, np.nan, np.float32)
    report = interpret(K.round_robin_ring(units, stages, consumers), G.reshape(-1), O, on_error="report")
    if stages % consumers:
        assert report.errors and report.errors[0].kind == "tma_before_wait", report.summary()
        assert "passed on an earlier phase" in report.errors[0].message
    else:
        assert report.ok, report.summary()
        ref = np.stack([G[c::consumers].sum(0) for c in range(consumers)]).reshape(-1)
        assert np.allclose(O, ref, rtol=1e-5, atol=1e-5)
