"""The README's code runs: the quick start and the autotune example are example files, verbatim, that run here;
every other ```python block runs on its own, or continues an example file, or is marked as a fragment and checked
another way (``<!-- readme-test: ... -->`` on the line above it). Each "Conventions" statement has a check below."""
import pathlib
import re
import runpy
import warnings

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
EXAMPLE_TESTS = {"examples/quickstart.py": "tests/test_readme.py::test_quickstart_runs",
                 "examples/autotune_gemm.py": "tests/test_readme.py::test_autotune_example_runs",
                 "examples/gemm_hopper.py": "tests/test_example_gemm_hopper.py::test_hopper_example_runs"}
_BLOCK = re.compile(r"(?:<!-- readme-test: (?P<marker>[^\n]*?) -->\n)?```python\n(?P<code>.*?)\n```", re.S)


def readme_blocks():
    """(line, marker or None, code) of every ```python block of README.md."""
    return [(README[:m.start("code")].count("\n"), m.group("marker"), m.group("code"))
            for m in _BLOCK.finditer(README)]


def test_every_python_fence_is_found():
    assert len(readme_blocks()) == README.count("```python") >= 10


@pytest.mark.parametrize("line, marker, code", readme_blocks(), ids=[f"line{b[0]}" for b in readme_blocks()])
def test_readme_python_block(line, marker, code, capsys):
    if marker is None:
        for path, test in EXAMPLE_TESTS.items():
            if code == (ROOT / path).read_text().rstrip("\n"):
                file, name = test.split("::")     # the example file itself runs in that test
                assert f"def {name}(" in (ROOT / file).read_text()
                return
        exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})
        return
    m = re.fullmatch(r"continues (examples/\S+\.py)", marker)
    if m:
        ns = runpy.run_path(str(ROOT / m.group(1)))
        exec(compile(code, f"README.md:{line}", "exec"), ns)
        return
    m = re.fullmatch(r"fragment of (examples/\S+\.py)", marker)
    if m:                                         # the fragment is a contiguous run of the file's lines
        want = [ln.strip() for ln in code.splitlines()]
        have = [ln.strip() for ln in (ROOT / m.group(1)).read_text().splitlines()]
        assert any(have[i:i + len(want)] == want for i in range(len(have))), f"README.md:{line} not in {m.group(1)}"
        return
    m = re.fullmatch(r"fragment, checked by (test_\w+)", marker)
    assert m, f"README.md:{line}: unknown readme-test marker {marker!r}"
    assert m.group(1) in globals(), f"README.md:{line}: no test {m.group(1)} in tests/test_readme.py"


def test_readme_quickstart_is_the_example_file():
    code = (ROOT / "examples" / "quickstart.py").read_text().rstrip("\n")
    assert f"```python\n{code}\n```" in README


def test_readme_has_the_two_fresh_machine_commands():
    assert "pip install torch==2.13.0 && pip install . && mmaemit demo" in README
    test_cmd = 'pip install torch==2.13.0 && pip install ".[test]" && python3 -m pytest -q'
    assert test_cmd in README
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_quickstart_runs(capsys):
    # without a GPU it compiles for sm_80 and prints the instruction mix; with one it runs and prints the error
    runpy.run_path(str(ROOT / "examples" / "quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "HMMA" in out or "max |err|" in out


def test_readme_autotune_example_is_the_example_file():
    code = (ROOT / "examples" / "autotune_gemm.py").read_text().rstrip("\n")
    assert f"```python\n{code}\n```" in README


def test_autotune_example_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "autotune_gemm.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "stages" in out


# ---------------------------------------------------------------------------------------------- Conventions checks
def _emitter(a, acc="float32", **kw):
    from mmaemit import TensorCoreIntrinEmitter

    args = dict(block_row_warps=2, block_col_warps=2, warp_row_tiles=32, warp_col_tiles=32, chunk=64)
    return TensorCoreIntrinEmitter(a, a, acc, **{**args, **kw})


def test_conventions_operand_storage():
    """a_transposed: A [M, K] / [K, M]; b_transposed: B [K, N] / [N, K]; and a GEMM with A stored [K, M], B [K, N]
    computes A @ B on the interpreter against an independent float64 product."""
    import mmaemit
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm

    for ta in (False, True):
        for tb in (False, True):
            em = _emitter("float16", a_transposed=ta, b_transposed=tb)
            assert em.a_shared_shape == ((em.block_k, em.block_m) if ta else (em.block_m, em.block_k))
            assert em.b_shared_shape == ((em.block_n, em.block_k) if tb else (em.block_k, em.block_n))
    M, N, K = 128, 128, 64
    func, _ = make_gemm(M, N, K, "bfloat16", trans_a=True, trans_b=False, config=GemmConfig(epilogue="global"),
                        arch="sm_80")
    g = torch.Generator().manual_seed(3)
    A_mk, B_kn = torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, N, generator=g).bfloat16()
    C = torch.full((M, N), float("nan")).bfloat16()
    assert mmaemit.interpret(func, A_mk.T.contiguous(), B_kn.contiguous(), C, arch="sm_80").ok
    ref = A_mk.double() @ B_kn.double()
    assert ((C.double() - ref).norm() / ref.norm()).item() < 8e-3


def test_conventions_swizzle_call_forms_and_conflict_freedom():
    from mmaemit import make_mma_swizzle_layout
    from mmaemit.errors import LayoutError

    tile = make_mma_swizzle_layout((64, 32), "float16")
    stages = make_mma_swizzle_layout((3, 64, 32), "float16")
    tile.check()
    stages.check()
    for s, r, c in ((0, 0, 0), (1, 9, 17), (2, 63, 31)):
        assert stages(s, r, c) == (s, *tile(r, c))
    with pytest.raises(LayoutError):
        stages(9, 17)                            # a stacked buffer takes (stage, r, c)
    with pytest.raises(LayoutError):
        tile(0, 9, 17)
    # K-contiguous / 16-bit operand tiles: the default scheme, conflict-free for every row size
    for dt, bits in (("float16", 16), ("int8", 8)):
        for row_bytes in (16, 32, 48, 64, 96, 128, 192, 256):
            shape = (64, row_bytes * 8 // bits)
            assert make_mma_swizzle_layout(shape, dt).ldmatrix_conflicts() == 0, (dt, row_bytes)
    em16 = _emitter("float16", a_transposed=True)
    assert em16.shared_swizzle("A", (64, 64), "float16") == make_mma_swizzle_layout((64, 64), "float16")
    # M/N-contiguous 8/4-bit tiles: conflict-free exactly for rows of a multiple of 64 B (8-bit) / 128 B (4-bit)
    for dt, acc, bits, unit, wt in (("int8", "int32", 8, 64, 16), ("int4", "int32", 4, 128, 32)):
        em = _emitter(dt, acc, a_transposed=True, warp_row_tiles=wt, warp_col_tiles=wt)
        for row_bytes in (16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 512):
            lay = em.shared_swizzle("A", (64, row_bytes * 8 // bits), dt)
            assert (em.a_plan.ldmatrix_conflicts(lay) == 0) == (row_bytes % unit == 0), (dt, row_bytes)
    em4 = _emitter("int4", "int32", a_transposed=True)
    lay = em4.shared_swizzle("A", (64, 128), "int4")                    # 64-byte rows: 2-way
    phases = len(range(0, 64 - em4.micro_k + 1, em4.micro_k)) * 4 * len(em4.a_plan.phase_rows())
    assert em4.a_plan.ldmatrix_conflicts(lay) == phases                 # one extra wavefront per phase


def test_conventions_sub_byte_packing():
    """Element 2i in the low nibble; pack_int4 == dequant.pack; a packed (rows, cols // 2) uint8 tile is what the
    emitter reads (the library GEMM sizes its tiles so): an int4 GEMM with A [K, M] is exact on the interpreter."""
    import mmaemit
    from mmaemit.dequant import pack
    from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm, pack_int4

    x = torch.randint(-8, 8, (16, 64))
    p = pack(x & 0xF, 4, axis=-1, storage="uint8")
    assert torch.equal(p, pack_int4(x)) and p.shape == (16, 32)
    assert torch.equal(p.long() & 0xF, x[:, 0::2] & 0xF) and torch.equal(p.long() >> 4, x[:, 1::2] & 0xF)
    M, N, K = 128, 128, 128
    cfg = GemmConfig(128, 128, 128, 64, 64, epilogue="global")
    func, em = make_gemm(M, N, K, "int4", trans_a=True, trans_b=False, config=cfg, arch="sm_80")
    rows, cols = em.a_shared_shape
    assert (rows, cols) == (em.block_k, em.block_m)
    g = torch.Generator().manual_seed(5)
    A_km, B_kn = torch.randint(-8, 8, (K, M), generator=g), torch.randint(-8, 8, (K, N), generator=g)
    C = torch.full((M, N), -1, dtype=torch.int32)
    assert mmaemit.interpret(func, pack_int4(A_km), pack_int4(B_kn), C, arch="sm_80").ok
    assert torch.equal(C.long(), A_km.T @ B_kn)


def test_conventions_split_k_scratch():
    """The README fragment's three lines in the quick-start kernel with reduce_k=2, on the interpreter; the shape
    formula; a wrong scratch shape is refused, naming both shapes."""
    from tvm.script import tirx as T

    import mmaemit
    from mmaemit import TensorCoreIntrinEmitter, make_mma_swizzle_layout

    M, N, K = 64, 64, 128
    em = TensorCoreIntrinEmitter("float16", "float16", "float32", b_transposed=True, block_row_warps=2,
                                 block_col_warps=2, warp_row_tiles=32, warp_col_tiles=32, chunk=64, reduce_k=2)
    assert em.reduce_scratch_shape == (1, 4, em.warp_rows * em.warp_cols * em.local_size_c, 32)
    assert em.c_fragment_dtype == "float32"
    assert _emitter("float16", "float16", reduce_k=2).c_fragment_dtype == "uint32"
    assert _emitter("int8", "int32", reduce_k=2, b_transposed=True).c_fragment_dtype == "uint32"
    BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
    swz = make_mma_swizzle_layout((BM, BK), "float16")

    def build(scratch_shape):
        @T.prim_func
        def gemm(A: T.Buffer((M, K), "float16"), B: T.Buffer((N, K), "float16"), C: T.Buffer((M, N), "float32")):
            T.device_entry()
            bn, bm = T.cta_id([N // BN, M // BM])
            warp = T.warp_id([em.num_warps])
            lane = T.lane_id([32])
            As = T.alloc_buffer((BM, BK), "float16", scope="shared")
            Bs = T.alloc_buffer((BN, BK), "float16", scope="shared")
            a, b, c = em.alloc_fragments()
            em.fill_accumulators(c)
            for ko in T.serial(K // BK):
                for t in T.serial(BM * BK // NT):
                    e = T.meta_var(t * NT + warp * 32 + lane)
                    As[swz(e // BK, e % BK)] = A[bm * BM + e // BK, ko * BK + e % BK]
                    Bs[swz(e // BK, e % BK)] = B[bn * BN + e // BK, ko * BK + e % BK]
                T.cuda.cta_sync()
                for ki in T.unroll(em.k_steps):
                    em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=swz)
                    em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=swz)
                    em.mma(a, b, c)
                T.cuda.cta_sync()
            scratch = T.alloc_buffer(scratch_shape, em.c_fragment_dtype, scope="shared")
            em.reduce_accumulators(c, scratch, warp=warp, lane=lane)
            em.stmatrix(c, C, warp=warp, lane=lane, block_row=bm, block_col=bn)

        return gemm

    func = build(em.reduce_scratch_shape)
    g = torch.Generator().manual_seed(4)
    A, B = torch.randn(M, K, generator=g).half(), torch.randn(N, K, generator=g).half()
    C = torch.full((M, N), float("nan"))
    assert mmaemit.interpret(func, A, B, C, arch="sm_80").ok
    ref = A.double() @ B.double().T
    assert ((C.double() - ref).norm() / ref.norm()).item() < 1e-5
    # a TileShapeError, which TVMScript reports as a parse diagnostic with the same message
    with pytest.raises(Exception, match=r"scratch shape \[2, 4, 32, 32\] != reduce_scratch_shape \[1, 4, 32, 32\]"):
        build((2, 4, em.warp_rows * em.warp_cols * em.local_size_c, 32))


def test_conventions_decode_program_evaluate_layout():
    """words [...] of interleaved 32-bit words -> [..., E]; without the interleave the slots come out permuted;
    bf16 out is ml_dtypes.bfloat16; quantized zeros are integer codes; 8-bit words are plain."""
    import ml_dtypes

    from mmaemit.dequant import decode_program, interleave, pack

    rng = np.random.default_rng(0)
    codes = rng.integers(0, 16, (2, 3, 8)).astype(np.uint8)
    plain = pack(codes.reshape(6, 8), 4, axis=-1, storage="int32")[:, 0]
    words = interleave(plain, 4).reshape(2, 3)
    s, z = np.float16(0.25), np.float16(5)
    out = decode_program("uint4", "float16", "original", "sm_80").evaluate(words, s, z)
    assert out.shape == (2, 3, 8) and out.dtype == np.float16
    assert np.array_equal(out, ((codes - 5.0) * 0.25).astype(np.float16))
    wrong = decode_program("uint4", "float16", "original", "sm_80").evaluate(plain.reshape(2, 3), s, z)
    assert not np.array_equal(wrong, out)
    bf = decode_program("uint4", "bfloat16", "quantized", "sm_80").evaluate(words, ml_dtypes.bfloat16(0.5),
                                                                            np.uint8(3))
    assert bf.dtype == ml_dtypes.bfloat16 and np.array_equal(bf.astype(np.float64), (codes - 3.0) * 0.5)
    c8 = rng.integers(0, 256, (5, 4)).astype(np.uint8)
    w8 = pack(c8, 8, axis=-1, storage="int32")[:, 0]
    out8 = decode_program("uint8", "float16", "scale", "sm_80").evaluate(w8, np.float16(2))
    assert np.array_equal(out8, (c8 * 2.0).astype(np.float16))


def test_conventions_from_gptq_keywords_and_zero_points():
    import inspect

    from mmaemit.dequant import from_gptq, pack
    from mmaemit.errors import ArgumentError

    sig = inspect.signature(from_gptq)
    kw = {n: p.default for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY}
    assert kw == {"bits": inspect.Parameter.empty, "group_size": inspect.Parameter.empty, "sym": False,
                  "version": 1, "zeros_mode": "quantized", "storage": "int32", "v1_zero_wrap": False}
    assert list(sig.parameters)[:4] == ["qweight", "qzeros", "scales", "g_idx"]
    K, N, G, bits = 256, 32, 64, 4
    g = torch.Generator().manual_seed(1)
    q = torch.randint(0, 16, (K, N), generator=g)
    z = torch.randint(1, 16, (K // G, N), generator=g)
    s = (torch.rand(K // G, N, generator=g) + 0.5).half()
    qweight = pack(q.T, bits, axis=-1, storage="int32").T.contiguous()
    gi = torch.arange(K) // G
    want = ((q - z[gi]) * s[gi].float()).T
    v1 = from_gptq(qweight, pack(z - 1, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G)
    v2 = from_gptq(qweight, pack(z, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G, version=2)
    assert torch.equal(v1.dequantize(), want) and torch.equal(v2.dequantize(), want)
    for mode in ("original", "rescale"):
        other = from_gptq(qweight, pack(z - 1, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G,
                          zeros_mode=mode)
        assert other.scheme.zeros_mode == mode
        assert torch.allclose(other.dequantize().double(), want.double(), rtol=0, atol=1e-2)
    half = torch.full_like(z, 8)
    sym = from_gptq(qweight, pack(half - 1, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G, sym=True)
    assert sym.scheme.format == "int4_ob" and sym.zeros is None
    assert torch.equal(sym.dequantize(), ((q - 8) * s[gi].float()).T)
    with pytest.raises(ArgumentError, match="sym=True"):
        from_gptq(qweight, pack(z - 1, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G, sym=True)
    ones = torch.full_like(z, 15)                                  # v1 all-ones field: zero 16, or 0 when wrapped
    wrapped = from_gptq(qweight, pack(ones, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G,
                        v1_zero_wrap=True)
    assert torch.equal(wrapped.dequantize(), (q * s[gi].float()).T)
    unwrapped = from_gptq(qweight, pack(ones, bits, axis=-1, storage="int32"), s, bits=bits, group_size=G,
                          zeros_mode="original")
    assert torch.equal(unwrapped.dequantize(), ((q - 16) * s[gi].float()).T)


def test_conventions_register_budget_and_spills():
    """64 x 64 f32 warp tiles are 128 accumulator registers per lane; the quick start does not use local memory."""
    from mmaemit.errors import PerformanceWarning

    em = _emitter("bfloat16", warp_row_tiles=64, warp_col_tiles=64)
    assert em.warp_rows * em.warp_cols * em.local_size_c == 64 * 64 // 32 == 128
    ns = runpy.run_path(str(ROOT / "examples" / "quickstart.py"))
    assert ns["em"].warp_rows * ns["em"].warp_cols * ns["em"].local_size_c == 32
    with warnings.catch_warnings():
        warnings.simplefilter("error", PerformanceWarning)
        import mmaemit

        use = mmaemit.compile(ns["gemm"], target="sm_90a").resource_usage()
    assert not use.uses_local_memory and use.registers <= 255


def test_measured_plan_readme():
    """The measured-plan block, with the GPU's timing replaced by a cost model (the rows of tiles x their height;
    fused32 at 0.8 of that) on the interpreter's object: it runs, prints the table, and the plan it leaves serves
    M = 17..512 from the measurement and the rules elsewhere. The real measurement: test_dequant_plan.py (GPU)."""
    block = next(code for _, marker, code in readme_blocks() if marker and "test_measured_plan_readme" in marker)
    assert 'DequantGemm(4096, 4096, 128, "float16")' in block and "measure_plan(g, max_m=512)" in block
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    def model(path, m, base):
        bm = ns["g"].configs[path].block_m
        return -(-m // bm) * bm * (0.8 if path == "fused32" else 1.0)
    ns = {"__name__": "__readme__", "model": model}
    code = block.replace('DequantGemm(4096, 4096, 128, "float16")',
                         'DequantGemm(4096, 4096, 128, "float16", arch="sm_90a", interpret=True)')
    code = code.replace("measure_plan(g, max_m=512)", "measure_plan(g, max_m=512, timer=model)")
    exec(compile(code, "README.md (measured plan)", "exec"), ns)
    g, plan = ns["g"], ns["plan"]
    assert isinstance(g, DequantGemm) and plan.max_m == 512 and g.ranges != g.rule_ranges
    assert g.path_for(100) == "fused32" and g.path_for(600) == next(p for p, lo, hi in g.rule_ranges
                                                                    if lo <= 600 and (hi is None or hi >= 600))
