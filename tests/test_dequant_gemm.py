"""W4A16 small-M dequant GEMV: interpreter check on the CPU, SASS shape, GPU correctness over M and group sizes."""
import itertools

import pytest
import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import (from_kernel_layout, from_kernel_scales, k_permutation, kernel_arguments,
                                           to_kernel_layout, to_kernel_scales)
from mmaemit.errors import TileShapeError
from mmaemit.kernels.dequant_gemm import (GemvConfig, TiledConfig, make_dequant_gemm, make_dequant_gemm_tiled,
                                           make_dequant_gemv)


def _problem(M, N, K, group, device="cpu", seed=0, dtype=torch.float16, fmt="int4"):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g, dtype=torch.float32).to(dtype)
    qw = D.quantize(w, D.QuantScheme(fmt, group_size=group))
    A = torch.randn(M, K, generator=g).to(dtype)
    ref = A.double() @ qw.dequantize().double().T
    Wk = to_kernel_layout(qw.codes())
    return [t.to(device) for t in (A, Wk, to_kernel_scales(qw.scales))], ref


def test_kernel_layout_round_trip_and_permutation():
    codes = torch.randint(0, 16, (48, 384), dtype=torch.uint8)
    assert torch.equal(from_kernel_layout(to_kernel_layout(codes)), codes)
    scales = torch.randn(48, 6)
    ks = to_kernel_scales(scales)
    assert torch.equal(from_kernel_scales(ks), scales)
    # lane c of n16 block nb reads, for n8 half h, the scales of its accumulator columns 2c and 2c + 1
    assert ks[2, 5, 3, 2] == scales[16 * 2 + 8 * 1 + 2 * 3 + 0, 5] and ks[2, 5, 3, 1] == scales[32 + 6 + 1, 5]
    perm = k_permutation(128)
    assert sorted(perm.tolist()) == list(range(128))
    # lane c's A registers over the 4 k16 steps of a chunk are 16 consecutive k: 16c .. 16c+15
    for c in range(4):
        ks = [16 * s + 2 * c + 8 * h + e for s in range(4) for h in range(2) for e in range(2)]
        assert sorted(perm[ks].tolist()) == list(range(16 * c, 16 * c + 16))


@pytest.mark.parametrize("M, group, dtype, K, stages, ring", [
    (1, 128, torch.float16, 512, 3, None), (5, 64, torch.float16, 512, 3, None), (16, -1, torch.float16, 512, 3, None),
    (3, 128, torch.bfloat16, 512, 3, None),
    # at M <= 8 the main loop takes lcm(2, stages) chunks per iteration where the slice allows (12 chunks: 6 or 4)
    (2, 128, torch.float16, 1536, 3, None), (7, 64, torch.bfloat16, 1536, 4, False)])
def test_gemv_on_the_interpreter(M, group, dtype, K, stages, ring):
    N = 128
    (A, Wk, S), ref = _problem(M, N, K, group, dtype=dtype)
    func, _ = make_dequant_gemv(M, N, K, group, dtype=str(dtype)[6:], config=GemvConfig(
        n_blocks=2, k_slices=2, stages=stages, operand_ring=ring), arch="sm_90a")
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, A, Wk, S, C, arch="sm_90a")
    assert report.ok
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


@pytest.mark.parametrize("M, m_max, dtype, config", [
    (32, 32, torch.float16, GemvConfig(n_blocks=2, k_slices=2, stages=3)),
    (17, 32, torch.bfloat16, GemvConfig(n_blocks=1, k_slices=2, stages=2)),
    (5, 32, torch.float16, GemvConfig(n_blocks=2, k_slices=2, stages=3)),
    (24, None, torch.float16, GemvConfig(n_blocks=1, k_slices=2, stages=3))])
def test_gemv_two_m16_tiles_on_the_interpreter(M, m_max, dtype, config):
    """m_max up to 32: each lane holds rows g + 8 r of both m16 tiles and every decoded weight fragment feeds two
    mma; ragged rows (17, 24, 5 of 32) are never loaded or stored; symbolic and static M."""
    N, K = 128, 512
    (A, Wk, S), ref = _problem(M, N, K, 64 if M % 2 else 128, dtype=dtype)
    func, _ = make_dequant_gemv(None if m_max else M, N, K, 64 if M % 2 else 128, dtype=str(dtype)[6:],
                                config=config, arch="sm_90a", m_max=m_max)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, A, Wk, S, C, arch="sm_90a").ok
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


@pytest.mark.parametrize("ring", [None, False])
def test_gemv_sass_streams_weights_with_16_byte_cp_async(ring):
    """Weights by 16-byte cp.async; with the operand ring (the default at M <= 8) the activations and scales come
    through it too (no LDG left), without it by 16- / 8-byte LDG."""
    M, N, K = 1, 8192, 8192
    func, em = make_dequant_gemv(M, N, K, 128, config=GemvConfig(operand_ring=ring), arch="sm_90a")
    kernel = mmaemit.compile(func, target="sm_90a")
    hist = kernel.opcode_histogram("sm_90a")
    mix = kernel.instruction_mix("sm_90a")
    assert hist.get("LDGSTS.E.BYPASS.128", 0) > 0 and mix["HMMA"] > 0
    ldg = [k for k in hist if k.startswith("LDG.") and not k.startswith("LDGSTS")]
    if ring is None:
        assert not ldg and hist.get("LDGSTS.E.64", 0) > 0, hist
    else:
        assert ldg and all(k.startswith(("LDG.E.128", "LDG.E.64")) for k in ldg)
    assert kernel.resource_usage("sm_90a").spill_bytes == 0


@pytest.mark.parametrize("fmt, zeros, dtype, m_max, M", [
    ("int4", None, torch.float16, 8, 1), ("int4", None, torch.bfloat16, 16, 13), ("uint4", "quantized", torch.float16,
                                                                                  8, 5),
    ("int2", None, torch.float16, 16, 9), ("int8", None, torch.float16, 8, 3), ("nf4", None, torch.bfloat16, 8, 8)])
def test_gemv_operand_ring_is_bit_identical(fmt, zeros, dtype, m_max, M):
    """Activations and scales (zeros) through the cp.async ring, or only the scales ("scales"), give the same bits as
    their ld.global loads."""
    outs = _gemv_variants(fmt, zeros, dtype, m_max, M, [dict(operand_ring=r) for r in (False, True, "scales")])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def _gemv_variants(fmt, zeros, dtype, m_max, M, variants, check_em=None):
    """The GEMV's outputs on the interpreter for each config variant (GemvConfig fields over 2 x 2 x 3 stages) on one
    random problem; the first is checked against the float64 product and for NaN (poisoned output)."""
    N, K = 64, 1024
    g = torch.Generator().manual_seed(len(fmt) + M)
    qw = D.quantize(torch.randn(N, K, generator=g).to(dtype), D.QuantScheme(fmt, 128, zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).to(dtype)
    outs = []
    for v in variants:
        func, em = make_dequant_gemv(None, N, K, dtype=str(dtype)[6:], arch="sm_90a", m_max=m_max, config=GemvConfig(
            n_blocks=2, k_slices=2, stages=3, **v), **kw)
        if check_em:
            check_em(v, em)
        C = torch.full((M, N), float("nan"), dtype=dtype)
        assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
        outs.append(C)
    ref = A.double() @ qw.dequantize().double().T
    assert not torch.isnan(outs[0]).any()
    assert ((outs[0].double() - ref).norm() / ref.norm()).item() < (2e-3 if dtype == torch.float16 else 8e-3)
    return outs


@pytest.mark.parametrize("fmt, zeros, dtype, m_max, M", [
    ("int4", None, torch.float16, 8, 1), ("nf4", None, torch.bfloat16, 16, 11), ("uint2", "rescale", torch.float16,
                                                                                 8, 6),
    ("int8", None, torch.bfloat16, 8, 8), ("int1", None, torch.float16, 32, 29), ("uint4", "quantized", torch.float16,
                                                                                32, 17)])
def test_gemv_weights_as_a_is_bit_identical(fmt, zeros, dtype, m_max, M):
    """C^T = W A^T (the decoded weights as the mma's A operand, tokens as n8 tiles) gives the same bits as C = A W^T
    (the weights as B, m16 tiles of activation rows), for every word width, post- and decode-time scaling."""
    def check_em(v, em):
        assert (em.warp_row_tiles, em.n_tile) == ((32, 8) if v["weights_as_a"] else (16 * -(-m_max // 16), 16))

    outs = _gemv_variants(fmt, zeros, dtype, m_max, M, [dict(weights_as_a=a) for a in (True, False)], check_em)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("fmt, zeros, dtype, m_max, M", [
    ("int4", None, torch.float16, 8, 1), ("uint4", "quantized", torch.bfloat16, 16, 13), ("int1", None, torch.float16,
                                                                                        32, 20)])
def test_gemv_pdl_is_bit_identical(fmt, zeros, dtype, m_max, M):
    """Programmatic dependent launch (the default on sm_90+): griddepcontrol at entry and an L2 prefetch of the
    first pdl_prefetch chunks (None: stages - 1; more than the K slice has are cut; 0: none) before the wait give the
    same bits as without."""
    outs = _gemv_variants(fmt, zeros, dtype, m_max, M, [dict(pdl=False), dict(), dict(pdl=True, pdl_prefetch=99),
                                                        dict(pdl=True, pdl_prefetch=0)])
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("dtype, m_max, M, k_slices, gated", [(torch.float16, 8, 1, 2, None),
                                                              (torch.bfloat16, 16, 11, 16, None),
                                                              (torch.float16, 8, 5, 4, "silu")])
def test_gemv_shared_pair_table_is_bit_identical(dtype, m_max, M, k_slices, gated):
    """nf4 looked up in the shared pair table (lookup="shared", the default for nf4; filled by 64 / 512 / 128 threads,
    i.e. several rows per thread, two threads per row, one row per thread) gives the bits of the register decode, with
    and without the gate in the epilogue."""
    N, K = 64, 2048
    g = torch.Generator().manual_seed(M)
    qw = D.quantize(torch.randn(N, K, generator=g).to(dtype), D.QuantScheme("nf4", 128))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).to(dtype)
    outs = []
    for lookup in ("registers", "shared", None):
        func, _ = make_dequant_gemv(None, N, K, dtype=str(dtype)[6:], arch="sm_90a", m_max=m_max, gated=gated,
                                    config=GemvConfig(n_blocks=2, k_slices=k_slices, stages=3, lookup=lookup), **kw)
        C = torch.full((M, N // 2 if gated else N), float("nan"), dtype=dtype)
        assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
        outs.append(C)
    assert not torch.isnan(outs[0]).any()
    if gated is None:
        ref = A.double() @ qw.dequantize().double().T
        assert ((outs[0].double() - ref).norm() / ref.norm()).item() < (2e-3 if dtype == torch.float16 else 8e-3)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_gemv_shared_pair_table_sass_and_refusals():
    """The nf4 GEMV's loop looks each pair of codes up with one conflict-free ld.shared.b32 (8192^2: 4 n16 blocks x
    4 chunks x 4 words x 4 lookups = 128 LDS.32 in the body, plus the scale / zero loads) and has far fewer PRMT than
    the register decode; lookup="shared" is refused for formats without a table and fills that do not tile 256 rows."""
    from mmaemit.dequant.decode import decode_program
    from mmaemit.kernels.dequant_gemm import register_nibbles

    # the pairing the table's rows assume (register k: codes of nibbles k and k + 4), read off the decode program
    assert register_nibbles(decode_program("nf4", "float16", "none", fast=True)) == [(k, k + 4) for k in range(4)]
    hists = {}
    for lookup in ("registers", "shared"):
        kernel = mmaemit.compile(make_dequant_gemv(None, 8192, 8192, 128, config=GemvConfig(lookup=lookup),
                                                   arch="sm_90a", weight_format="nf4", m_max=8)[0], target="sm_90a")
        hists[lookup] = kernel.opcode_histogram("sm_90a")
        assert kernel.resource_usage("sm_90a").spill_bytes == 0
    assert hists["shared"].get("LDS", 0) >= 128 and hists["registers"].get("LDS", 0) < 16
    assert sum(hists["shared"].values()) < 0.9 * sum(hists["registers"].values())
    with pytest.raises(mmaemit.UnsupportedConfigError,
                       match="lookup='shared' is for table formats \\('nf4'\\), not 'int4'"):
        make_dequant_gemv(1, 256, 4096, config=GemvConfig(lookup="shared"), weight_format="int4")
    with pytest.raises(mmaemit.UnsupportedConfigError, match="k_slices a power of two, not 3"):
        make_dequant_gemv(1, 256, 3 * 128 * 2, config=GemvConfig(k_slices=3, lookup="shared"), weight_format="nf4")
    with pytest.raises(mmaemit.UnsupportedConfigError, match="lookup='table'; valid: None, 'registers', 'shared'"):
        make_dequant_gemv(1, 256, 4096, config=GemvConfig(lookup="table"), weight_format="nf4")
    # None takes the table for nf4, and falls back to the register decode where the fill does not fit the threads
    def has_table(k_slices):
        func, _ = make_dequant_gemv(1, 256, k_slices * 128 * 2, config=GemvConfig(k_slices=k_slices),
                                    weight_format="nf4")
        return "Tab = T.decl_buffer" in func.script()

    assert has_table(4) and not has_table(3)


def test_gemv_weights_as_a_halves_the_mma_at_m8():
    """At M <= 8 the weights-as-A GEMV issues one m16n8k16 per n16 block and k16 step where weights as B issue two
    (one per n8 half, 16 activation rows of which 8 are real), and its loop moves no zero rows into A fragments."""
    mixes = []
    for as_a in (True, False):
        func, _ = make_dequant_gemv(None, 4096, 4096, 128, config=GemvConfig(weights_as_a=as_a), arch="sm_90a",
                                    m_max=8)
        kernel = mmaemit.compile(func, target="sm_90a")
        mixes.append(kernel.opcode_histogram("sm_90a"))
        assert kernel.resource_usage("sm_90a").spill_bytes == 0
    assert 2 * mixes[0]["HMMA.16816.F32"] == mixes[1]["HMMA.16816.F32"], mixes
    moves = [sum(n for op, n in m.items() if op in ("MOV", "IMAD.MOV.U32")) for m in mixes]
    assert moves[0] < moves[1] / 4, moves


def test_gemv_rejects_bad_shapes():
    with pytest.raises(TileShapeError, match="1 <= M <= 32"):
        make_dequant_gemv(33, 256, 1024)
    with pytest.raises(TileShapeError, match="limit of 32"):
        make_dequant_gemv(None, 256, 1024, m_max=64)
    with pytest.raises(TileShapeError, match="multiple of 16"):
        make_dequant_gemv(1, 200, 1024)
    with pytest.raises(TileShapeError, match="group_size"):
        make_dequant_gemv(1, 256, 4096, group_size=32)
    with pytest.raises(mmaemit.UnsupportedConfigError, match="operand_ring='weights'; valid: None, True, False"):
        make_dequant_gemv(1, 256, 1024, config=GemvConfig(operand_ring="weights"))
    with pytest.raises(mmaemit.UnsupportedConfigError, match="weights_as_a='yes'; valid: True, False"):
        make_dequant_gemv(1, 256, 1024, config=GemvConfig(weights_as_a="yes"))


GEMV_GPU_CONFIGS = [GemvConfig(), GemvConfig(n_blocks=4, k_slices=16, stages=3, min_blocks_per_sm=1),
                    GemvConfig(n_blocks=8, k_slices=4, stages=2, min_blocks_per_sm=1), GemvConfig(decode_variant="marlin"),
                    GemvConfig(n_blocks=1, k_slices=8, stages=4), GemvConfig(operand_ring=True, stages=3),
                    GemvConfig(operand_ring="scales"), GemvConfig(weights_as_a=False)]


def _rotate(*axes, rotated):
    """Every combination of ``axes`` once, with the values of each ``rotated`` axis taken in turn (a GPU subset that
    still reaches every value of every axis; the full products run on the CPU interpreter)."""
    return [(*combo, *(r[i % len(r)] for r in rotated)) for i, combo in enumerate(itertools.product(*axes))]


@pytest.mark.gpu
@pytest.mark.parametrize("config, dtype, M, group", _rotate(
    GEMV_GPU_CONFIGS, [torch.float16, torch.bfloat16], rotated=([1, 3, 8, 9, 16], [64, 128, -1])))
def test_gemv_matches_reference_on_gpu(config, dtype, M, group):
    if config.decode_variant == "marlin" and dtype == torch.bfloat16:
        pytest.skip("Marlin's decode is fp16-only (its bf16 request is refused: test_marlin_variant_never_degrades)")
    N, K = 512, 4096
    (A, Wk, S), ref = _problem(M, N, K, group, device="cuda", seed=M, dtype=dtype)
    func, _ = make_dequant_gemv(M, N, K, group, dtype=str(dtype)[6:], config=config)
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(A, Wk, S, C)
    assert not torch.isnan(C).any()
    rel = ((C.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


@pytest.mark.parametrize("M, dtype, config", [
    (128, torch.float16, TiledConfig()),
    (50, torch.bfloat16, TiledConfig(block_m=64, block_n=128, warp_m=32, warp_n=64, stages=3)),
    (17, torch.float16, TiledConfig(block_m=32, block_n=64, warp_m=32, warp_n=32, stages=2)),
    (64, torch.float16, TiledConfig(block_m=64, block_n=32, warp_m=32, warp_n=16, stages=4)),
    (24, torch.bfloat16, TiledConfig(block_m=32, block_n=16, warp_m=16, warp_n=16, stages=4)),
])
def test_tiled_path_on_the_interpreter(M, dtype, config):
    N, K = 128, 512
    (A, Wk, S), ref = _problem(M, N, K, 128, dtype=dtype)
    func, _ = make_dequant_gemm_tiled(M, N, K, 128, dtype=str(dtype)[6:], config=config, arch="sm_90a")
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, A, Wk, S, C, arch="sm_90a")
    assert report.ok and report.total_bank_conflicts == 0, report.summary()
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


def test_dispatch_by_m_uses_one_layout():
    em = make_dequant_gemm(16, 256, 2048)[1]       # the GEMV: weights as A (n16 blocks), 16 tokens as two n8 tiles
    assert (em.block_m, em.block_n, em.n_tile) == (32, 16, 8)
    assert make_dequant_gemm(17, 256, 2048, arch="sm_80")[1].block_m == 64     # 64 x 64 tiles up to M = 64
    assert make_dequant_gemm(65, 256, 2048, arch="sm_80")[1].block_m == 128
    with pytest.raises(TileShapeError, match="block_n"):
        make_dequant_gemm(64, 200, 2048)


@pytest.mark.gpu
@pytest.mark.parametrize("M, dtype, group", _rotate([1, 16, 128, 1024, 333], [torch.float16, torch.bfloat16],
                                                    rotated=([64, 128, -1],)))
def test_dequant_gemm_every_m_on_gpu(M, dtype, group):
    N, K = 512, 2048
    (A, Wk, S), ref = _problem(M, N, K, group, device="cuda", seed=M + 7, dtype=dtype)
    func, _ = make_dequant_gemm(M, N, K, group, dtype=str(dtype)[6:])
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(A, Wk, S, C)
    assert not torch.isnan(C).any()
    rel = ((C.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), rel


def _problem_zeros(M, N, K, group, mode, dtype=torch.float16, device="cpu", seed=0):
    """uint4 weights with zero points: kernel arguments (A, W, S, Z) and an fp64 reference of the dequantized GEMM."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, K, generator=g).to(dtype)
    scheme = D.QuantScheme("uint4", group_size=group, zeros_mode=mode)
    qw = D.quantize(w, scheme)
    codes = qw.codes()
    A = torch.randn(M, K, generator=g).to(dtype)
    if mode == "quantized":
        zeros_ref = qw.zeros                                        # packed GPTQ-style, as the reference takes it
        z_kernel = D.unpack_zeros(qw.zeros, 4).to(torch.int16)      # the kernel takes the integer codes
    else:
        zeros_ref = qw.zeros.to(dtype)                              # the kernel's contract: zeros in A's dtype
        z_kernel = zeros_ref
    W_ref = D.dequantize_codes(codes, scheme, qw.scales, zeros_ref, out_dtype=str(dtype)[6:])
    ref = A.double() @ torch.as_tensor(W_ref).double().T
    args = [A, to_kernel_layout(codes), to_kernel_scales(qw.scales), to_kernel_scales(z_kernel)]
    return [t.to(device) for t in args], ref


@pytest.mark.parametrize("M, mode, dtype", [(1, "rescale", torch.bfloat16), (3, "original", torch.float16),
                                            (9, "rescale", torch.float16), (16, "quantized", torch.float16),
                                            (2, "quantized", torch.bfloat16), (40, "original", torch.float16),
                                            (64, "quantized", torch.bfloat16), (33, "rescale", torch.float16)])
def test_uint4_zero_modes_on_the_interpreter(M, mode, dtype):
    N, K = 128, 512
    args, ref = _problem_zeros(M, N, K, 128, mode, dtype)
    config = (GemvConfig(n_blocks=2, k_slices=2, stages=3) if M <= 16
              else TiledConfig(block_m=64, block_n=128, warp_m=32, warp_n=64, stages=3))
    func, _ = make_dequant_gemm(M, N, K, 128, str(dtype)[6:], config, "sm_90a", weight_format="uint4",
                                zeros_mode=mode)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, *args, C, arch="sm_90a").ok
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), (mode, rel)


def test_marlin_variant_never_degrades_silently():
    make_dequant_gemv(1, 256, 4096, config=GemvConfig(decode_variant="marlin"))        # int4 -> f16: exists
    with pytest.raises(mmaemit.MmaemitError):
        make_dequant_gemv(1, 256, 4096, dtype="bfloat16", config=GemvConfig(decode_variant="marlin"))


def test_bad_weight_format_and_zero_mode_combinations():
    with pytest.raises(mmaemit.UnsupportedConfigError, match="uint4"):
        make_dequant_gemm(1, 256, 4096, weight_format="int4", zeros_mode="original")
    with pytest.raises(mmaemit.UnsupportedConfigError, match="'float4_e2m1fn', .*'uint8', not 'nvfp4'"):
        make_dequant_gemm(1, 256, 4096, weight_format="nvfp4")
    with pytest.raises(mmaemit.UnsupportedConfigError, match="'original'"):
        make_dequant_gemm(64, 256, 4096, weight_format="uint4", zeros_mode="asymmetric")


@pytest.mark.gpu
@pytest.mark.parametrize("mode, dtype, twice, M, group", _rotate(
    ["original", "rescale", "quantized"], [torch.float16, torch.bfloat16], [0, 1], rotated=([1, 16, 128, 1024],
                                                                                            [64, 128])))
def test_uint4_zero_modes_on_gpu(mode, dtype, twice, M, group):
    N, K = 512, 2048
    args, ref = _problem_zeros(M, N, K, group, mode, dtype, device="cuda", seed=M)
    func, _ = make_dequant_gemm(M, N, K, group, str(dtype)[6:], weight_format="uint4", zeros_mode=mode)
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(*args, C)
    assert not torch.isnan(C).any()
    rel = ((C.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), (mode, rel)


@pytest.mark.parametrize("fmt, M, dtype", [("nf4", 1, torch.float16), ("float4_e2m1fn", 5, torch.float16),
                                          ("float4_e2m1fn", 2, torch.bfloat16), ("nf4", 48, torch.bfloat16),
                                          ("nf4", 9, torch.bfloat16), ("float4_e2m1fn", 64, torch.float16)])
def test_float4_formats_on_the_interpreter(fmt, M, dtype):
    N, K = 128, 512
    (A, Wk, S), ref = _problem(M, N, K, 128, dtype=dtype, fmt=fmt)
    config = (GemvConfig(n_blocks=2, k_slices=2, stages=3) if M <= 16
              else TiledConfig(block_m=64, block_n=128, warp_m=32, warp_n=64, stages=3))
    func, _ = make_dequant_gemm(M, N, K, 128, str(dtype)[6:], config, "sm_90a", weight_format=fmt)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, A, Wk, S, C, arch="sm_90a").ok
    rel = ((C.double() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), (fmt, rel)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt, M, dtype", _rotate(["nf4", "float4_e2m1fn"], [1, 16, 128],
                                                  rotated=([torch.float16, torch.bfloat16],)))
def test_float4_formats_on_gpu(fmt, M, dtype):
    # uint4 needs zero points: covered by test_uint4_zero_modes_on_gpu
    N, K = 512, 2048
    (A, Wk, S), ref = _problem(M, N, K, 128, device="cuda", seed=M, dtype=dtype, fmt=fmt)
    func, _ = make_dequant_gemm(M, N, K, 128, str(dtype)[6:], weight_format=fmt)
    kernel = mmaemit.compile(func)
    C = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
    kernel(A, Wk, S, C)
    assert not torch.isnan(C).any()
    rel = ((C.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (2e-3 if dtype == torch.float16 else 8e-3), (fmt, rel)


def _gptq_checkpoint(K, N, group, seed=0):
    """AutoGPTQ v1 tensors (qweight packed along K, qzeros along N with the -1 storage convention) and the exact
    dequantized weight [N, K] computed from the raw codes, zeros and scales."""
    import numpy as np

    from test_dequant_importers import gptq_pack_cols, gptq_pack_rows

    rng = np.random.default_rng(seed)
    q = rng.integers(0, 16, size=(K, N))
    z = rng.integers(1, 16, size=(K // group, N))
    s = rng.uniform(0.002, 0.02, size=(K // group, N)).astype(np.float16)
    tensors = (torch.as_tensor(gptq_pack_rows(q, 4)), torch.as_tensor(gptq_pack_cols(z - 1, 4)), torch.as_tensor(s))
    want = (q.T - z.repeat(group, 0).T) * s.repeat(group, 0).astype(np.float64).T
    return tensors, torch.as_tensor(want)


@pytest.mark.parametrize("M", [2, 40])
def test_gptq_checkpoint_end_to_end_on_the_interpreter(M):
    from mmaemit.dequant.kernel_layout import kernel_arguments

    K, N, group = 512, 128, 128
    (qweight, qzeros, scales), want = _gptq_checkpoint(K, N, group)
    qw = D.from_gptq(qweight, qzeros, scales, None, bits=4, group_size=group)
    tensors, kw = kernel_arguments(qw)
    assert kw == {"group_size": 128, "weight_format": "uint4", "zeros_mode": "quantized"}
    config = (GemvConfig(n_blocks=2, k_slices=2, stages=3) if M <= 16
              else TiledConfig(block_m=64, block_n=128, warp_m=32, warp_n=64, stages=3))
    func, _ = make_dequant_gemm(M, N, K, config=config, arch="sm_90a", **kw)
    A = torch.randn(M, K, generator=torch.Generator().manual_seed(M)).half()
    C = torch.full((M, N), float("nan"), dtype=torch.float16)
    assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
    ref = A.double() @ want.T
    assert ((C.double() - ref).norm() / ref.norm()).item() < 2e-3


def test_kernel_arguments_refuse_what_the_kernels_cannot_read():
    from mmaemit.dequant.kernel_layout import kernel_arguments

    w = torch.randn(64, 256).half()
    with pytest.raises(mmaemit.UnsupportedConfigError, match="'float4_e2m1fn', .*'uint8' weights, not 'nvfp4'"):
        kernel_arguments(D.quantize(w, D.QuantScheme("nvfp4")))
    g_idx = torch.randperm(256) // 128
    with pytest.raises(mmaemit.UnsupportedConfigError, match="act-order"):
        kernel_arguments(D.quantize(w, D.QuantScheme("int4", group_size=128, act_order=True), g_idx=g_idx))


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 7, 300])
def test_gptq_checkpoint_end_to_end_on_gpu(M):
    from mmaemit.dequant.kernel_layout import kernel_arguments

    K, N, group = 2048, 512, 128
    (qweight, qzeros, scales), want = _gptq_checkpoint(K, N, group, seed=M)
    tensors, kw = kernel_arguments(D.from_gptq(qweight, qzeros, scales, None, bits=4, group_size=group))
    kernel = mmaemit.compile(make_dequant_gemm(M, N, K, **kw)[0])
    A = torch.randn(M, K, device="cuda").half()
    C = torch.full((M, N), float("nan"), dtype=torch.float16, device="cuda")
    kernel(A, *[t.cuda() for t in tensors], C)
    ref = A.double().cpu() @ want.T
    assert ((C.double().cpu() - ref).norm() / ref.norm()).item() < 2e-3


def test_kernel_scale_layout_follows_the_mma_fragment_maps():
    """The kernel scale layout and the kernels' column selection restate fragment facts; check them against the one
    source (mmaemit.layouts.mma_fragment): lane (g, c) reads accumulator columns from [nb, grp, c, 2h + e] and
    B-fragment columns from [nb, grp, g // 2, 2h + g % 2]."""
    from mmaemit import isa
    from mmaemit.layouts import mma_fragment

    ins = isa.select_mma("float16", "float16", "float32")
    C, B = mma_fragment(ins, "C"), mma_fragment(ins, "B")
    scales = torch.arange(16 * 3, dtype=torch.float32).reshape(16, 3)     # scale value = 3 * n + group
    ks = to_kernel_scales(scales)
    for lane in range(32):
        g, c = lane // 4, lane % 4
        for reg in range(4):                                          # accumulator regs of one n8 half
            _, col = C.forward(lane, reg, 0)
            for h in range(2):
                n = 8 * h + col
                assert ks[0, 1, c, 2 * h + col % 2] == scales[n, 1]
        for reg in range(B.regs):
            _, n_b = B.forward(lane, reg, 0)
            for h in range(2):
                assert ks[0, 2, g // 2, 2 * h + g % 2] == scales[8 * h + n_b, 2]
