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
    md = isa.wgmma_markdown_table().splitlines()
    assert len(md) == 2 + len(isa.WGMMA_TABLE)
    assert "| m64nNk16 | float16 | float16 | float32 | 8..256 step 8 | K/MN |" in md[2]


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


# ---- the emitter: kernels ----------------------------------------------------------------------------------------
import ml_dtypes  # noqa: E402

from mmaemit import WgmmaIntrinEmitter  # noqa: E402

NPDT = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32,
        "float8_e4m3fn": ml_dtypes.float8_e4m3fn, "float8_e5m2": ml_dtypes.float8_e5m2, "int8": np.int8,
        "uint8": np.uint8, "int32": np.int32}


def emitter_kernel(em: WgmmaIntrinEmitter, out_dtype=None, neg_b=False):
    """C[64, block_n] = A[64, block_k] @ B[block_n, block_k]^T with one warpgroup: both tiles copied element by element
    into shared memory through the emitter's layouts (whatever their majors), one fence / K block / commit / wait,
    the first K step with scale-d false (the accumulators are never initialised), stores through accumulator_coords.
    RS: A arrives pre-packed in fragment order, Ap[thread, 4 ki + q] (host side: ``a_fragment_layout``)."""
    from tvm.script import tirx as T

    BN, BK, KS = em.block_n, em.block_k, em.k_steps
    out = out_dtype or em.accum_dtype
    ad, bd = em.a_dtype, em.b_dtype
    ss = em.form == "ss"
    a_shape = em.a_shared_shape if ss else (8, 8)
    a_lay = em.a_layout if ss else None
    b_lay = em.b_layout

    @T.prim_func
    def kern(A: T.Buffer((64, BK), ad), B: T.Buffer((BN, BK), bd), Ap: T.Buffer((128, 4 * KS), "uint32"),
             C: T.Buffer((64, BN), out)):
        T.device_entry()
        _cta = T.cta_id([1])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        tid = T.meta_var(warp * 32 + lane)
        pool = T.SMEMPool()
        As = pool.alloc(a_shape, ad, align=1024)
        Bs = pool.alloc(em.b_shared_shape, bd, align=1024)
        pool.commit()
        for i in T.serial(BN * BK // 128):
            q = T.meta_var(i * 128 + tid)
            Bs[b_lay.layout(*b_lay.index(q // BK, q % BK))] = B[q // BK, q % BK]
        if ss:
            for i in T.serial(64 * BK // 128):
                q = T.meta_var(i * 128 + tid)
                As[a_lay.layout(*a_lay.index(q // BK, q % BK))] = A[q // BK, q % BK]
        T.ptx.fence.proxy.async_()
        T.cuda.cta_sync()
        acc = em.alloc_accumulators()
        bdesc = em.alloc_descriptor()
        em.init_descriptor(bdesc, Bs, "B")
        if ss:
            adesc = em.alloc_descriptor()
            em.init_descriptor(adesc, As, "A")
            em.fence()
            em.mma_block(acc, adesc, bdesc, scale_d=False, scale_b=-1 if neg_b else 1)
        else:
            af = em.alloc_a_fragment()
            for ki in T.unroll(KS):
                for r in T.unroll(4):
                    af[ki, r] = Ap[tid, 4 * ki + r]
            em.fence()
            em.mma_block(acc, af, bdesc, scale_d=False, scale_b=-1 if neg_b else 1)
        em.commit_group()
        em.wait_group(0)
        em.pin_accumulators(acc)
        em.store_accumulators(acc, C, tid)

    return kern


def _random(dtype, shape, rng):
    if dtype in ("int8", "uint8"):
        lo, hi = (-128, 128) if dtype == "int8" else (0, 256)
        return rng.integers(lo, hi, shape).astype(NPDT[dtype])
    x = rng.standard_normal(shape)
    if dtype == "float32":                     # exact tf32 values: the instruction ignores the low 13 bits
        return (x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return x.astype(NPDT[dtype])


def pack_a_fragments(em, A):
    """Ap[thread, 4 ki + reg]: the RS registers of every K step, packed low element first (a_fragment_layout)."""
    lay = em.a_fragment_layout
    bits = A.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[A.dtype.itemsize]).astype(np.uint64)
    tab = lay.table()                                              # (128, 4, elems, 2)
    eb = 32 // lay.elems_per_reg
    Ap = np.zeros((128, 4 * em.k_steps), np.uint64)
    for ki in range(em.k_steps):
        for e in range(lay.elems_per_reg):
            v = bits[tab[:, :, e, 0], ki * em.k + tab[:, :, e, 1]]
            Ap[:, 4 * ki:4 * ki + 4] |= v << np.uint64(eb * e)
    return Ap.astype(np.uint32)


def run_emitter(em, out_dtype=None, seed=0, neg_b=False):
    from mmaemit import interpret

    rng = np.random.default_rng(seed)
    A = _random(em.a_dtype, (64, em.block_k), rng)
    B = _random(em.b_dtype, (em.block_n, em.block_k), rng)
    out = out_dtype or em.accum_dtype
    C = np.full((64, em.block_n), -7 if out == "int32" else np.nan, NPDT[out])
    Ap = pack_a_fragments(em, A) if em.form == "rs" else np.zeros((128, 4 * em.k_steps), np.uint32)
    report = interpret(emitter_kernel(em, out_dtype, neg_b), A, B, Ap, C, arch="sm_90a")
    assert report.ok and not report.errors, report.summary()
    ref = A.astype(np.float64) @ B.astype(np.float64).T * (-1 if neg_b else 1)
    return C, ref


def _numeric_cases():
    f = [("float16", "float16", "float32"), ("float16", "float16", "float16"), ("bfloat16", "bfloat16", "float32"),
         ("float32", "float32", "float32"), ("float8_e4m3fn", "float8_e5m2", "float32"),
         ("float8_e5m2", "float8_e4m3fn", "float16"), ("int8", "uint8", "int32"), ("uint8", "uint8", "int32")]
    for i, (a, b, acc) in enumerate(f):
        for form in ("ss", "rs"):
            n = (8, 24, 64, 136, 256, 200, 224, 48)[i] if form == "ss" else (16, 40, 96, 8, 72, 128, 112, 32)[i]
            if a in ("int8", "uint8") and n not in isa.WGMMA_N_INT:
                n = 48
            yield a, b, acc, form, n


@pytest.mark.parametrize("a, b, acc, form, n", list(_numeric_cases()))
def test_emitter_numerics_on_the_interpreter(a, b, acc, form, n):
    em = WgmmaIntrinEmitter(a, b, acc, n, form=form, swizzle_bytes=128 if n % 16 else 64)
    C, ref = run_emitter(em, seed=n)
    if acc == "int32":
        assert np.array_equal(C.astype(np.int64), ref.astype(np.int64))
        return
    got = C.astype(np.float64)
    assert not np.isnan(got).any()
    tol = 2e-3 if acc == "float16" else 1e-5
    np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


@pytest.mark.parametrize("kw", [
    dict(swizzle_bytes=0), dict(swizzle_bytes=32), dict(a_swizzle_bytes=0, b_swizzle_bytes=64),
    dict(block_n=128, n=64), dict(block_k=128),                                         # 2 N tiles; 2 K atoms
    dict(b_major="MN"), dict(a_major="MN", b_major="MN", swizzle_bytes=64),
    dict(a_major="MN", swizzle_bytes=0, n=16), dict(form="rs", b_major="MN", swizzle_bytes=32),
    dict(dtype="bfloat16", a_major="MN", block_n=128, n=32),
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_emitter_layout_variants_on_the_interpreter(kw):
    kw = dict(kw)
    dt = kw.pop("dtype", "float16")
    em = WgmmaIntrinEmitter(dt, dt, "float32", kw.pop("n", 64), **kw)
    C, ref = run_emitter(em, seed=3)
    np.testing.assert_allclose(C.astype(np.float64), ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_emitter_negated_b_and_output_conversion():
    em = WgmmaIntrinEmitter("bfloat16", n=32)
    C, ref = run_emitter(em, out_dtype="bfloat16", neg_b=True)
    np.testing.assert_allclose(C.astype(np.float64), ref, rtol=1e-2, atol=1e-2 * np.abs(ref).max())


# ---- PTX text and SASS (CPU: nvcc for sm_90a) --------------------------------------------------------------------
_SASS = [  # (a, b, acc, form, n, SASS opcode prefix)
    ("float16", "float16", "float32", "ss", 256, "HGMMA.64x256x16.F32"),
    ("bfloat16", "bfloat16", "float32", "rs", 64, "HGMMA.64x64x16.F32.BF16"),
    ("float32", "float32", "float32", "ss", 128, "HGMMA.64x128x8.F32.TF32"),
    ("float8_e4m3fn", "float8_e4m3fn", "float32", "ss", 128, "QGMMA.64x128x32.F32.E4M3.E4M3"),
    ("int8", "int8", "int32", "rs", 224, "IGMMA.64x224x32.S8.S8"),
]


@pytest.mark.parametrize("a, b, acc, form, n, op", _SASS, ids=[c[0] + "-" + c[3] for c in _SASS])
def test_emitter_ptx_and_sass(a, b, acc, form, n, op):
    import mmaemit

    em = WgmmaIntrinEmitter(a, b, acc, n, form=form)
    k = mmaemit.compile(emitter_kernel(em), target="sm_90a")
    src = k.cuda_source
    assert src.count(em.ptx()) >= 1 and em.ptx().startswith("wgmma.mma_async.sync.aligned.m64n")
    assert "wgmma.fence.sync.aligned" in src and "wgmma.commit_group.sync.aligned" in src
    assert "wgmma.wait_group.sync.aligned" in src
    hist = k.opcode_histogram("sm_90a")
    gmma = {o: c for o, c in hist.items() if "GMMA" in o}
    assert sum(c for o, c in gmma.items() if o.startswith(op)) == em.k_steps * em.n_tiles == sum(gmma.values()), hist
    assert hist.get("WARPGROUP.ARRIVE", 0) == 1, hist         # issued back to back: ptxas did not serialize (C7514)
    usage = k.resource_usage("sm_90a")
    assert usage.spill_store_bytes == usage.spill_load_bytes == usage.stack_frame_bytes == 0
    log = k.cubin("sm_90a").ptxas_log
    assert "C7514" not in log and "C7515" not in log and "serializ" not in log.lower(), log


# ---- emitter errors ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kw, err, match", [
    (("bfloat16", None, "float16"), {}, UnsupportedConfigError, "valid combinations: .*'bfloat16 x bfloat16 -> f"),
    (("float16",), dict(n=100), UnsupportedConfigError, "valid N: 8, 16, 24"),
    (("int8", None, "int32"), dict(n=256), UnsupportedConfigError, "valid N: .*208, 224"),
    (("float16",), dict(form="sr"), UnsupportedConfigError, "'rs', 'ss'"),
    (("int8", None, "int32"), dict(b_major="MN"), UnsupportedConfigError, "K-major only .*valid: 'K'"),
    (("float32",), dict(a_major="MN"), UnsupportedConfigError, "valid: 'K'"),
    (("float16",), dict(a_major="MN", form="rs"), UnsupportedConfigError, "a_major='K', or form='ss'"),
    (("float16",), dict(b_major="N"), UnsupportedConfigError, "'K', 'MN'"),
    (("float16",), dict(swizzle_bytes=48), UnsupportedConfigError, "valid: 0, 32, 64, 128"),
    (("float16",), dict(satfinite=True), UnsupportedConfigError, "integer wgmma only"),
    (("float16",), dict(arch="sm_90"), ArchError, "sm_90a"),
    (("float16",), dict(block_m=96), TileShapeError, "multiple of 64"),
    (("float16",), dict(n=64, block_n=96), TileShapeError, "multiple of n=64"),
    (("float16",), dict(block_k=24), TileShapeError, "wgmma K \\(16\\)"),
    (("float16",), dict(block_k=32), TileShapeError, "multiple of 64"),              # 128-byte K atoms
    (("float16",), dict(n=32, b_major="MN", swizzle_bytes=128), TileShapeError, "smaller swizzle_bytes"),
])
def test_emitter_errors(args, kw, err, match):
    with pytest.raises(err, match=match):
        WgmmaIntrinEmitter(*args, **kw)


def test_emitter_call_errors():
    from tvm.script import tirx as T

    em = WgmmaIntrinEmitter("int8", None, "int32", 64, form="rs")
    with pytest.raises(UnsupportedConfigError, match="SS form"):
        em.shared_layout("A")
    with pytest.raises(UnsupportedConfigError, match="valid: 1"):
        em.mma_async([0] * 32, [0] * 4, 0, scale_b=-1)
    with pytest.raises(UnsupportedConfigError, match="4 uint32 registers"):
        em.mma_async([0] * 32, [0] * 3, 0)
    with pytest.raises(TileShapeError, match="valid: 0..0"):
        em.mma_async([0] * 32, [0] * 4, 0, n_tile=1)
    with pytest.raises(UnsupportedConfigError, match="0..7"):
        em.wait_group(8)
    with pytest.raises(TileShapeError, match="valid: 0..31"):
        em.accumulator_coords(0, 32)

    ss = WgmmaIntrinEmitter("float16", n=64)

    def bad_buffer():
        @T.prim_func
        def k(A: T.Buffer((64, 64), "float16")):
            T.device_entry()
            _cta = T.cta_id([1])
            _w = T.warp_id([4])
            _l = T.lane_id([32])
            pool = T.SMEMPool()
            Bs = pool.alloc((64, 32), "float16", align=1024)
            pool.commit()
            d = ss.alloc_descriptor()
            ss.init_descriptor(d, Bs, "B")
        return k

    with pytest.raises(Exception, match=r"needs \[64, 64\] float16"):      # TVMScript wraps it in a DiagnosticError
        bad_buffer()


# ---- GPU: the same kernel on the H100 (a representative subset; the sweep runs on the interpreter above) -----------
def _to_torch(x):
    import torch

    tdt = {np.dtype(ml_dtypes.float8_e4m3fn): torch.float8_e4m3fn, np.dtype(ml_dtypes.float8_e5m2): torch.float8_e5m2,
           np.dtype(ml_dtypes.bfloat16): torch.bfloat16, np.dtype(np.uint32): torch.uint32}.get(x.dtype)
    if tdt is None:
        return torch.from_numpy(x).cuda()
    raw = {1: np.uint8, 2: np.int16, 4: np.int32}[x.dtype.itemsize]
    return torch.from_numpy(x.view(raw)).view(tdt).cuda()


_GPU = [  # (a, b, acc, n, emitter keywords)
    ("float16", "float16", "float32", 256, dict()),
    ("bfloat16", "bfloat16", "float32", 64, dict(a_major="MN", b_major="MN", swizzle_bytes=64, block_n=128)),
    ("float16", "float16", "float16", 40, dict(form="rs", b_major="MN", swizzle_bytes=0)),
    ("float16", "float16", "float32", 16, dict(a_major="MN", swizzle_bytes=32)),
    ("float32", "float32", "float32", 96, dict(form="rs")),
    ("float8_e4m3fn", "float8_e5m2", "float32", 128, dict(swizzle_bytes=32)),
    ("int8", "uint8", "int32", 224, dict(form="rs")),
]


@pytest.mark.gpu
@pytest.mark.parametrize("a, b, acc, n, kw", _GPU, ids=[f"{c[0]}-{c[3]}-{c[4]}" for c in _GPU])
def test_emitter_on_gpu(a, b, acc, n, kw):
    import torch

    import mmaemit

    em = WgmmaIntrinEmitter(a, b, acc, n, **kw)
    rng = np.random.default_rng(n)
    A = _random(a, (64, em.block_k), rng)
    B = _random(b, (em.block_n, em.block_k), rng)
    Ap = pack_a_fragments(em, A) if em.form == "rs" else np.zeros((128, 4 * em.k_steps), np.uint32)
    kernel = mmaemit.compile(emitter_kernel(em))
    C = torch.full((64, em.block_n), -7 if acc == "int32" else float("nan"), device="cuda",
                   dtype=getattr(torch, acc))
    kernel(_to_torch(A), _to_torch(B), _to_torch(Ap), C)
    ref = A.astype(np.float64) @ B.astype(np.float64).T
    got = C.double().cpu().numpy()
    if acc == "int32":
        assert np.array_equal(got, ref)
    elif a.startswith("float8"):
        # the H100's fp8 wgmma does not accumulate to full f32 precision (measured 2026-11-26 on this case: max
        # error 1.8e-3 at |C| = 11.56, about 2^-13 relative; the interpreter's exact-product model is 1e-7 away)
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-3 * np.abs(ref).max())
    else:
        tol = 2e-3 if acc == "float16" else 1e-5
        np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * np.abs(ref).max())


# ---- per-operand stages, accumulator rows, accumulator -> RS A operand (FlashAttention's building blocks) ---------
def test_per_operand_stages_and_descriptor_offsets():
    # a single A tile (attention's Q) against a 2-stage B ring (K): each operand indexes its own stage dims
    em = WgmmaIntrinEmitter("float16", n=128, block_m=128, block_k=128, a_stages=(), b_stages=(2,))
    assert em.a_shared_shape == (2, 128, 64) and em.b_shared_shape == (2, 2, 128, 64)
    a, b = em.a_layout, em.b_layout
    assert (a.lbo, a.sbo, b.lbo, b.sbo) == (16, 1024, 16, 1024)
    # K step 5 (k0 = 80: atom 1, column 16) of stage 1, rows 64.. of A
    assert a.start_offset(64, 80) == 2 * (128 * 64 + 64 * 64 + 16)
    assert b.start_offset(0, 80, 1) == 2 * (2 * 128 * 64 + 128 * 64 + 16)
    with pytest.raises(TileShapeError, match="stage indices for operand A"):
        em.descriptor([0], "A", 0, 0, (1,))
    both = WgmmaIntrinEmitter("float16", n=64, stages=(3,))
    assert both.a_stages == both.b_stages == (3,) and both.a_shared_shape[0] == 3


@pytest.mark.parametrize("a, acc, n", [("float16", "float32", 64), ("bfloat16", "float32", 256),
                                       ("float16", "float16", 32), ("int8", "int32", 48)])
def test_accumulator_rows_slots_and_shuffles(a, acc, n):
    em = WgmmaIntrinEmitter(a, None, acc, n)
    slots = em.accumulator_row_slots()
    assert len(slots) == em.local_elems_c and set(slots) == {0, 1}
    assert em.accumulator_row_shuffles() == [1, 2]
    for t in range(128):
        rows = {}
        for e in range(em.local_elems_c):
            m, _ = em.accumulator_coords(t, e)
            rows.setdefault(slots[e], set()).add(m)
        assert all(len(v) == 1 for v in rows.values())                 # one row per slot
        assert [em.accumulator_row(t, s) for s in (0, 1)] == [rows[0].pop(), rows[1].pop()]
        assert em.accumulator_row(t, 0) == 16 * (t // 32) + (t % 32) // 4   # the ISA's D layout
        for d in em.accumulator_row_shuffles():                       # the butterfly partner shares the rows
            assert em.accumulator_row(t ^ d, 1) == em.accumulator_row(t, 1)


@pytest.mark.parametrize("dt, n", [("float16", 64), ("bfloat16", 128)])
def test_warpgroup_accumulator_as_rs_operand(dt, n):
    from mmaemit.layouts.accumulator_operand import warpgroup_accumulator_as_operand

    c = WgmmaIntrinEmitter(dt, n=n)                                   # S = Q K^T, 64 x n f32
    o = WgmmaIntrinEmitter(dt, n=64, form="rs", block_k=n)            # O += P V: P = S as A, n / 16 K steps
    pack = warpgroup_accumulator_as_operand(c.c_layout, o.a_fragment_layout, o.k_steps)
    assert len(pack) == o.k_steps and all(len(step) == 4 for step in pack)
    used = sorted(reg for step in pack for regs in step for reg, _ in regs)
    assert used == list(range(c.local_size_c))                         # every accumulator once
    # the same map as the per-warp mma.sync proof (two n8 C tiles = one k16 A step), register for register
    from mmaemit.layouts.accumulator_operand import accumulator_as_operand

    warp = accumulator_as_operand(dt, "float32").pack_order()
    assert pack == [[[(4 * (2 * ks + h) + r, e) for h, r, e in warp[q]] for q in range(4)] for ks in range(o.k_steps)]
    for t in range(128):                                              # independent check, element by element
        for ks, step in enumerate(pack):
            for q, regs in enumerate(step):
                for x, (reg, elem) in enumerate(regs):
                    m, k = o.a_fragment_coords(t, q, x)
                    assert c.accumulator_coords(t, reg) == (m, ks * o.k + k)


def test_warpgroup_accumulator_as_operand_refuses():
    from mmaemit.layouts.accumulator_operand import warpgroup_accumulator_as_operand

    c = WgmmaIntrinEmitter("float16", n=64)
    o = WgmmaIntrinEmitter("float16", n=64, form="rs", block_k=64)
    with pytest.raises(LayoutError, match="do not fit"):
        warpgroup_accumulator_as_operand(c.c_layout, o.a_fragment_layout, 5)
    s8 = WgmmaIntrinEmitter("int8", None, "int32", 64, form="rs")     # k32 A: 4 columns per thread per block of 16
    with pytest.raises(LayoutError, match="shuffle is needed"):
        warpgroup_accumulator_as_operand(c.c_layout, s8.a_fragment_layout, 1)
