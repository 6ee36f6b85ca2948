"""Hand-written epilogues over C_frag (issue 12): ``accumulator_coords`` / ``accumulator_register`` /
``accumulator_value`` on TIR loop variables, and examples/gemm_fused_epilogue.py against float64 references."""
import itertools
import pathlib
import runpy
import sys

import pytest
import torch
from tvm.script import tirx as T

import mmaemit
from mmaemit import TensorCoreIntrinEmitter

from tir_eval import eval_prim

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
import gemm_fused_epilogue as example  # noqa: E402

# (a, b, accum, a_transposed, b_transposed, warp_row_tiles, warp_col_tiles, n_tile): plain, f16 accumulators, n_tile 8,
# and the permuted majors (8-bit and 4-bit operands stored M/N-contiguous)
CONFIGS = [
    ("float16", "float16", "float32", False, True, 32, 32, None),
    ("float16", "float16", "float16", True, False, 32, 32, None),
    ("bfloat16", "bfloat16", "float32", False, True, 32, 16, 8),
    ("tf32", "tf32", "float32", False, True, 16, 16, None),
    ("int8", "int8", "int32", True, False, 32, 32, None),
    ("int8", "int8", "int32", False, False, 16, 48, None),
    ("int4", "int4", "int32", True, False, 64, 64, None),
    ("int4", "int4", "int32", True, True, 32, 32, 8),
]


def _emitter(a, b, acc, ta, tb, wr, wc, nt, chunk=64):
    return TensorCoreIntrinEmitter(a, b, acc, a_transposed=ta, b_transposed=tb, block_row_warps=2, block_col_warps=2,
                                   warp_row_tiles=wr, warp_col_tiles=wc, n_tile=nt, chunk=chunk)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c[0]}-{c[2]}-{'T' if c[3] else 'N'}{'T' if c[4] else 'N'}"
                         f"-{c[5]}x{c[6]}-n{c[7]}")
def test_accumulator_maps_on_tir_vars_equal_the_int_maps(config):
    """Every argument of accumulator_coords / accumulator_register may be a TIR variable: the expressions evaluate to
    the int maps for every lane, micro tile and element (the maps the emitter's own stores use)."""
    from tvm import tirx

    em = _emitter(*config)
    assert em.accumulator_elems == em.local_size_c * em.c_layout.elems_per_reg
    lane, i, j, e = (tirx.Var(n, "int32") for n in ("lane", "i", "j", "e"))
    sym = em.accumulator_coords(lane, i, j, e)
    (si, sj, sreg), shalf = em.accumulator_register(i, j, e)
    seen = set()
    for vi, vj, ve in itertools.product(range(em.warp_rows), range(em.warp_cols), range(em.accumulator_elems)):
        (ii, jj, reg), half = em.accumulator_register(vi, vj, ve)
        env = {"i": vi, "j": vj, "e": ve}
        assert (ii, jj) == (vi, vj) and 0 <= reg < em.local_size_c and 0 <= half < em.c_layout.elems_per_reg
        assert (eval_prim(sreg, env), eval_prim(shalf, env)) == (reg, half)
        for ln in range(32):
            want = em.accumulator_coords(ln, vi, vj, ve)
            assert tuple(eval_prim(x, {**env, "lane": ln}) for x in sym) == tuple(want)
            seen.add(want)
    # the map covers the warp tile exactly once
    assert len(seen) == em.warp_row_tiles * em.warp_col_tiles
    assert seen == set(itertools.product(range(em.warp_row_tiles), range(em.warp_col_tiles)))


def _hand_epilogue_gemm(em, M, N, K, in_dtype):
    """A GEMM from the emitters with a hand-written TIR epilogue: C[m, n] = float(acc) * row_scale[m] + bias[n]. A is
    stored [M, K] or [K, M] and B [K, N] or [N, K] as the emitter says; the shared tiles use ``shared_swizzle``."""
    BM, BN, BK, NT = em.block_m, em.block_n, em.block_k, em.threads
    ar, acl = em.a_shared_shape
    br, bcl = em.b_shared_shape
    swa = em.shared_swizzle("A", em.a_shared_shape, in_dtype)
    swb = em.shared_swizzle("B", em.b_shared_shape, in_dtype)
    a_shape = (K, M) if em.a_transposed else (M, K)
    b_shape = (N, K) if em.b_transposed else (K, N)
    a_origin = (lambda bm, ko: (ko * BK, bm * BM)) if em.a_transposed else (lambda bm, ko: (bm * BM, ko * BK))
    b_origin = (lambda bn, ko: (bn * BN, ko * BK)) if em.b_transposed else (lambda bn, ko: (ko * BK, bn * BN))

    @T.prim_func
    def gemm(A: T.Buffer(a_shape, in_dtype), B: T.Buffer(b_shape, in_dtype), row_scale: T.Buffer((M,), "float32"),
             bias: T.Buffer((N,), "float32"), C: T.Buffer((M, N), "float32")):
        T.device_entry()
        bn, bm = T.cta_id([N // BN, M // BM])
        warp = T.warp_id([em.num_warps])
        lane = T.lane_id([32])
        As = T.alloc_buffer(em.a_shared_shape, in_dtype, scope="shared")
        Bs = T.alloc_buffer(em.b_shared_shape, in_dtype, scope="shared")
        a, b, c = em.alloc_fragments()
        em.fill_accumulators(c)
        for ko in T.serial(K // BK):
            r0, c0 = T.meta_var(a_origin(bm, ko))
            for t in T.serial(ar * acl // NT):
                x = T.meta_var(t * NT + warp * 32 + lane)
                As[swa(x // acl, x % acl)] = A[r0 + x // acl, c0 + x % acl]
            r1, c1 = T.meta_var(b_origin(bn, ko))
            for t in T.serial(br * bcl // NT):
                x = T.meta_var(t * NT + warp * 32 + lane)
                Bs[swb(x // bcl, x % bcl)] = B[r1 + x // bcl, c1 + x % bcl]
            T.cuda.cta_sync()
            for ki in T.unroll(em.k_steps):
                em.ldmatrix_a(a, As, ki, warp=warp, lane=lane, layout=swa)
                em.ldmatrix_b(b, Bs, ki, warp=warp, lane=lane, layout=swb)
                em.mma(a, b, c)
            T.cuda.cta_sync()
        wm, wn, _ = T.meta_var(em.warp_coords(warp))
        for i in T.unroll(em.warp_rows):
            for j in T.unroll(em.warp_cols):
                for e in T.unroll(em.accumulator_elems):
                    m, n = T.meta_var(em.accumulator_coords(lane, i, j, e))
                    row = T.meta_var(bm * BM + wm * em.warp_row_tiles + m)
                    col = T.meta_var(bn * BN + wn * em.warp_col_tiles + n)
                    C[row, col] = T.Cast("float32", em.accumulator_value(c, i, j, e)) * row_scale[row] + bias[col]

    return gemm


@pytest.mark.parametrize("a, acc, ta, tb", [
    ("float16", "float16", False, True),     # f16 accumulators: the half of each register picked by a loop variable
    ("int8", "int32", True, False),          # both operands 8-bit M/N-contiguous: rows and columns permuted
    ("int8", "int32", False, True),
])
def test_hand_written_epilogue_on_the_interpreter(a, acc, ta, tb):
    em = _emitter(a, a, acc, ta, tb, 32, 32, None, chunk=32)
    M, N, K = 2 * em.block_m, em.block_n, 2 * em.block_k
    func = _hand_epilogue_gemm(em, M, N, K, a)
    g = torch.Generator().manual_seed(12)
    if a == "int8":
        A = torch.randint(-128, 128, (M, K), generator=g, dtype=torch.int8)
        B = torch.randint(-128, 128, (K, N), generator=g, dtype=torch.int8)
    else:
        A, B = torch.randn(M, K, generator=g).half(), torch.randn(K, N, generator=g).half()
    rs, bias = torch.rand(M, generator=g) + 0.5, torch.randn(N, generator=g)
    C = torch.full((M, N), float("nan"))
    args = (A.T.contiguous() if ta else A, B.T.contiguous() if tb else B, rs, bias, C)
    report = mmaemit.interpret(func, *args, arch="sm_80")
    assert report.ok and not torch.isnan(C).any()
    ref = (A.double() @ B.double()) * rs.double()[:, None] + bias.double()
    tol = 1e-6 if a == "int8" else 5e-3       # int32 sums are exact; f16 accumulators round each step
    assert ((C.double() - ref).norm() / ref.norm()).item() < tol


@pytest.mark.parametrize("act", example.ACTIVATIONS)
def test_fused_epilogue_example_on_the_interpreter(act):
    M, N, K = 128, 128, 96
    alpha = 0.75
    func, _ = example.make_fused_gemm(M, N, K, act, alpha, arch="sm_80")
    g = torch.Generator().manual_seed(7)
    A, B = torch.randn(M, K, generator=g).half(), torch.randn(N, K, generator=g).half()
    bias = torch.randn(N, generator=g)
    C = torch.full((M, N), float("nan")).half()
    report = mmaemit.interpret(func, A, B, bias, C, arch="sm_80")
    assert report.ok and report.total_bank_conflicts == 0, report.summary()
    ref = example.reference(A, B, bias, act, alpha)
    assert not torch.isnan(C).any()
    # fp32 accumulation and activation, then one rounding to fp16 (2^-11 relative) dominate
    err = (C.double() - ref).abs()
    assert (err <= 2.0 ** -10 * ref.abs() + 2e-3).all(), err.max().item()
    # the epilogue is not a no-op: a different activation gives a clearly different C
    other = example.reference(A, B, bias, "none" if act != "none" else "silu", alpha)
    assert (C.double() - other).abs().max().item() > 0.1


def test_fused_epilogue_example_is_spill_free_and_rejects_bad_arguments():
    func, _ = example.make_fused_gemm(128, 128, 64, "gelu", arch="sm_80")
    use = mmaemit.compile(func, target="sm_80").resource_usage("sm_80")
    assert use.spill_store_bytes == 0 and use.spill_load_bytes == 0 and use.stack_frame_bytes == 0, use
    with pytest.raises(ValueError, match="gelu"):
        example.make_fused_gemm(128, 128, 64, "relu6")
    with pytest.raises(ValueError, match="multiples"):
        example.make_fused_gemm(100, 128, 64)


def test_fused_epilogue_example_script_runs(capsys):
    runpy.run_path(str(ROOT / "examples" / "gemm_fused_epilogue.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "HMMA" in out or "max |err|" in out


_GPU = {}


@pytest.mark.gpu
def test_fused_epilogue_example_on_the_gpu():
    M, N, K = 256, 512, 256
    if "kernel" not in _GPU:
        _GPU["kernel"] = mmaemit.compile(example.make_fused_gemm(M, N, K, "gelu", 0.5)[0])
    A, B = torch.randn(M, K, device="cuda").half(), torch.randn(N, K, device="cuda").half()
    bias = torch.randn(N, device="cuda")
    C = torch.full((M, N), float("nan"), device="cuda").half()
    _GPU["kernel"](A, B, bias, C)
    ref = example.reference(A, B, bias, "gelu", 0.5)
    err = (C.double() - ref).abs()
    assert not torch.isnan(C).any() and (err <= 2.0 ** -10 * ref.abs() + 2e-3).all(), err.max().item()
