"""8-bit and 4-bit GEMMs with every operand major: SASS on the CPU (tensor-core MMA, LDSM, PRMT, no scalar shared
loads), bit-exact results on the CPU interpreter (``mmaemit.interpret``, exact PTX semantics) and on a GPU.

The SASS checks count the opcodes of the main-loop body (the backward branch of the K loop) of the example GEMM
(128 x 128 CTA tile, 4 warps of 64 x 64, one K tile per iteration): per warp and K step 32 mma.sync, 8 ldmatrix.x4
(``LDSM.16.MT88.4`` for each M/N-contiguous operand, 4 of them) and the register shuffles of the transposed loads.
"""
import collections
import itertools
import re

import pytest

from mmaemit.kernels.gemm_mma import LAYOUTS, GemmConfig, make_gemm, random_inputs, reference

_INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")


def _sass(func, arch):
    """(cuobjdump -sass text, ptxas resource usage) of the kernel built for ``arch`` (no GPU needed)."""
    import mmaemit

    kernel = mmaemit.compile(func, target=arch)
    return kernel.sass(arch), kernel.resource_usage(arch)


def _opcodes(sass):
    """[(address, full opcode)] of executed instructions (``@!PT`` padding dropped, predicates stripped)."""
    out = []
    for line in sass.splitlines():
        m = _INSTR.match(line)
        if not m or m.group(2).startswith("@!PT"):
            continue
        text = re.sub(r"^@!?U?P\w+\s+", "", m.group(2))
        out.append((int(m.group(1), 16), text.split()[0], text))
    return out


def _loop_body(ops):
    """Instructions of the last backward-branch loop (the K loop)."""
    body = None
    for addr, op, text in ops:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if op.startswith("BRA") and m and int(m.group(1), 16) < addr:
            body = [o for a, o, _ in ops if int(m.group(1), 16) <= a <= addr]
    assert body, "no K loop found in the SASS"
    return body


def _by_base(opcodes):
    return collections.Counter(o.split(".")[0] for o in opcodes)


CASES = (
    [("int8", "int8", lay, "sm_80") for lay in sorted(LAYOUTS)]
    + [("int8", "uint8", "TN", "sm_80"), ("uint8", "int8", "NN", "sm_80"), ("uint8", "uint8", "TT", "sm_80")]
    + [("float8_e4m3fn", "float8_e4m3fn", lay, "sm_89") for lay in sorted(LAYOUTS)]
    + [("float8_e5m2", "float8_e5m2", "TN", "sm_89"), ("float8_e4m3fn", "float8_e5m2", "NN", "sm_89")]
    + [("int4", "int4", lay, "sm_80") for lay in sorted(LAYOUTS)]
    + [("uint4", "int4", "TN", "sm_80")]
)


@pytest.mark.parametrize("a, b, layout, arch", CASES, ids=["-".join(c) for c in CASES])
def test_sass_tensor_core_ldmatrix_and_no_scalar_shared_loads(a, b, layout, arch):
    ta, tb = LAYOUTS[layout]
    four_bit = a in ("int4", "uint4")
    func, em = make_gemm(256, 256, 1024, a, trans_a=ta, trans_b=tb, b_dtype=b, arch=arch,
                         config=GemmConfig(block_k=64 if four_bit else 32))
    transposed = int(ta) + int(not tb)       # operands stored M/N-contiguous
    assert (em.c_row_perm is not None) == ta and (em.c_col_perm is not None) == (not tb)
    sass, usage = _sass(func, arch)
    assert usage.spill_bytes == 0 and usage.stack_frame_bytes == 0, usage
    ops = _opcodes(sass)
    allops = [o for _, o, _ in ops]
    loop = _loop_body(ops)
    full, base = collections.Counter(loop), _by_base(loop)
    mma = "QMMA.16832" if a.startswith("float8") else "IMMA.16864" if four_bit else "IMMA.16832"
    assert sum(v for k, v in full.items() if k.startswith(mma)) == 32, full
    assert full["LDSM.16.MT88.4"] == 4 * transposed and full["LDSM.16.M88.4"] == 4 * (2 - transposed), full
    # the shuffles: per M/N-contiguous operand and warp 16 prmt (8-bit: 4 groups x 4; 4-bit: 2 groups x 8),
    # for 4-bit also 16 lop3 and 16 shifts (ptxas writes shl as IMAD.SHL or SHF.L)
    assert base["PRMT"] >= 16 * transposed, base
    if four_bit:
        assert base["LOP3"] >= 16 * transposed, base
        shifts = sum(v for k, v in full.items() if k.startswith(("SHF.", "IMAD.SHL")))
        assert shifts >= 16 * transposed, full
    # no scalar (or any non-ldmatrix) shared loads in the K loop; elsewhere only the epilogue's 16-byte copies
    assert not any(o.startswith("LDS") and not o.startswith("LDSM") for o in loop), full
    narrow = sorted({o for o in allops if o.startswith("LDS") and not o.startswith("LDSM") and o != "LDS.128"})
    assert narrow == [], narrow
    assert "MOVM" not in base
    print(f"\n{a} x {b} {layout} {arch} K-loop mix:", dict(sorted(base.items(), key=lambda kv: -kv[1])))


LAYOUT_LIST = sorted(LAYOUTS)

INTERP_CASES = (
    [("int8", "int8", lay, "sm_80", epi, GemmConfig(epilogue=epi)) for lay in LAYOUT_LIST
     for epi in ("shared", "global")]
    + [("uint8", "int8", lay, "sm_80", "global",
        GemmConfig(block_k=64, n_tile=8, reduce_k=2, warp_order="n_fast", epilogue="global")) for lay in ("NN", "TN")]
    + [("float8_e4m3fn", "float8_e5m2", lay, "sm_89", "shared", GemmConfig()) for lay in LAYOUT_LIST]
    + [("int4", "int4", lay, "sm_80", "shared", GemmConfig(block_k=64)) for lay in LAYOUT_LIST]
    + [("uint4", "int4", lay, "sm_80", "global", GemmConfig(block_m=256, block_n=256, warp_m=128, warp_n=128,
                                                             block_k=64, stages=2, epilogue="global"))
       for lay in ("NN", "TN")]
)


def _interp_id(case):
    a, b, lay, arch, epi, cfg = case
    extra = "-nt8-rk2" if cfg.reduce_k > 1 else "-256" if cfg.block_m == 256 else ""
    return f"{a}-{b}-{lay}-{arch}-{epi}{extra}"


@pytest.mark.parametrize("a, b, layout, arch, epilogue, config", INTERP_CASES,
                         ids=[_interp_id(c) for c in INTERP_CASES])
def test_gemm_on_the_interpreter(a, b, layout, arch, epilogue, config):
    """The whole kernel (cp.async ring, transposed loads, mma, permuted epilogue) on the CPU interpreter: integer
    results bit-exact, fp8 within f32 rounding; the transposed ldmatrix loads are bank-conflict-free (4-bit: on
    128-byte rows; on 64-byte rows they are 2-way, the best any row XOR allows)."""
    import torch

    from mmaemit.interpret import interpret

    M, N, K = 256, 256, 256
    ta, tb = LAYOUTS[layout]
    func, em = make_gemm(M, N, K, a, trans_a=ta, trans_b=tb, b_dtype=b, config=config, arch=arch)
    A, B = random_inputs(M, N, K, a, ta, tb, device="cpu", seed=21, b_dtype=b)
    if em.accum_dtype == "int32":
        C = torch.full((M, N), -0x5A5A5A5A, dtype=torch.int32)
    else:
        C = torch.full((M, N), float("nan"), dtype=torch.float32)
    report = interpret(func, A, B, C, arch=arch)
    assert report.ok, report.summary()
    if em.accum_dtype == "int32":
        assert torch.equal(C.long(), reference(A, B, ta, tb, dtype=a, b_dtype=b))
    else:
        a64 = A.double().T if ta else A.double()
        b64 = B.double().T if tb else B.double()
        ref = a64 @ b64
        assert ((C.double() - ref).abs().max() / ref.abs().max()).item() < 1e-6
    ldsm = [x for x in report.bank_conflicts if x.op.startswith("ldmatrix")]
    assert ldsm, "no ldmatrix recorded"
    rows_64b = a in ("int4", "uint4") and config.block_m == 128 and (ta or not tb)
    if rows_64b:
        assert all(x.conflicts <= x.executions * 4 for x in ldsm), report.summary()   # <= 1 extra per 8x8 phase
    else:
        assert sum(x.conflicts for x in ldsm) == 0, report.summary()


@pytest.mark.parametrize("layout", LAYOUT_LIST)
@pytest.mark.parametrize("accum, out", [("float16", "float16"), ("float32", "bfloat16")])
def test_fp8_16bit_output_on_the_interpreter(layout, accum, out):
    """16-bit outputs of permuted accumulators: PTX stmatrix where the permutation is across rows (sm_90a), packed
    pairs/quads (prmt for f16 accumulators, cvt for f32) where it runs along the row."""
    import torch

    from mmaemit.interpret import interpret

    M, N, K = 128, 128, 64
    ta, tb = LAYOUTS[layout]
    cfg = GemmConfig(block_m=64, block_n=64, warp_m=32, warp_n=32, stages=2)
    func, em = make_gemm(M, N, K, "float8_e4m3fn", accum_dtype=accum, out_dtype=out, trans_a=ta, trans_b=tb,
                         config=cfg, arch="sm_90a")
    A, B = random_inputs(M, N, K, "float8_e4m3fn", ta, tb, device="cpu", seed=22)
    C = torch.full((M, N), float("nan"), dtype=getattr(torch, out))
    report = interpret(func, A, B, C, arch="sm_90a")
    assert report.ok, report.summary()
    ref = reference(A, B, ta, tb)
    rel = ((C.float() - ref).norm() / ref.norm()).item()
    assert rel < 5e-3, rel          # output rounding; a misplaced accumulator would give O(1)
    assert ("stmatrix" in str(func.script())) == (em.c_col_perm is None)


@pytest.mark.gpu
@pytest.mark.parametrize("a, b, layout, epilogue", [
    (a, b, lay, ("shared", "global")[i % 2]) for i, ((a, b), lay) in enumerate(itertools.product(
        [("int8", "int8"), ("int8", "uint8"), ("uint8", "uint8")], LAYOUT_LIST))])
def test_int8_gemm_bit_exact(a, b, layout, epilogue):
    import torch

    import mmaemit

    M, N, K = 384, 256, 512
    ta, tb = LAYOUTS[layout]
    func, _ = make_gemm(M, N, K, a, trans_a=ta, trans_b=tb, b_dtype=b, config=GemmConfig(epilogue=epilogue))
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, a, ta, tb, seed=11, b_dtype=b)
    C = torch.full((M, N), -0x5A5A5A5A, dtype=torch.int32, device="cuda")     # poison
    kernel(A, B, C)
    ref = reference(A, B, ta, tb)
    assert torch.equal(C.cpu().long(), ref)


@pytest.mark.gpu
@pytest.mark.parametrize("a, b", [("int4", "int4"), ("uint4", "int4")])
@pytest.mark.parametrize("layout", LAYOUT_LIST)
def test_int4_gemm_bit_exact(a, b, layout):
    import torch

    import mmaemit

    M, N, K = 256, 256, 512
    ta, tb = LAYOUTS[layout]
    func, _ = make_gemm(M, N, K, a, trans_a=ta, trans_b=tb, b_dtype=b, config=GemmConfig(block_k=64))
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, a, ta, tb, seed=12, b_dtype=b)
    C = torch.full((M, N), -0x5A5A5A5A, dtype=torch.int32, device="cuda")
    kernel(A, B, C)
    assert torch.equal(C.cpu().long(), reference(A, B, ta, tb, dtype=a, b_dtype=b))


@pytest.mark.gpu
@pytest.mark.parametrize("a, b", [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e4m3fn")])
@pytest.mark.parametrize("layout", LAYOUT_LIST)
def test_fp8_gemm_matches_float64(a, b, layout):
    """fp8 products are exact and the f32 sums carry 24 bits: compare against float64 with a tight bound."""
    import torch

    import mmaemit

    M, N, K = 256, 256, 256
    ta, tb = LAYOUTS[layout]
    func, _ = make_gemm(M, N, K, a, trans_a=ta, trans_b=tb, b_dtype=b)
    kernel = mmaemit.compile(func)
    A, B = random_inputs(M, N, K, a, ta, tb, seed=13, b_dtype=b)
    C = torch.full((M, N), float("nan"), dtype=torch.float32, device="cuda")
    kernel(A, B, C)
    a64 = A.double().T if ta else A.double()
    b64 = B.double().T if tb else B.double()
    ref = a64 @ b64
    assert not torch.isnan(C).any()
    err = (C.double() - ref).abs().max().item() / ref.abs().max().item()
    assert err < 1e-5, err


def test_layout_combinations_cover_every_major():
    assert sorted(itertools.product([False, True], repeat=2)) == sorted(LAYOUTS.values())
