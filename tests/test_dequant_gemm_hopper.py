"""The fused Hopper dequant GEMM (TMA + mbarrier ring, warp-specialized, int4 decoded into RS wgmma): exact-reference
runs on the CPU interpreter (fp16 / bf16, group 128 / per column, ragged and symbolic M), SASS shape for sm_90a,
errors, the DequantGemm fused paths (by name) and GPU tests."""
import dataclasses
import functools

import numpy as np
import pytest
import torch

import mmaemit
from mmaemit.runtime.sass import wgmma_accumulator_hazards
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import ArchError, TileShapeError, UnsupportedConfigError
from mmaemit.kernels.dequant_gemm_hopper import HopperDequantConfig, make_dequant_gemm_hopper, quad_word_plan

N, K = 256, 512


@functools.lru_cache(maxsize=None)
def _weights(n, k, group, dtype):
    g = torch.Generator().manual_seed(n + k + (group if group > 0 else 7))
    w = torch.randn(n, k, generator=g).to(dtype)
    qw = D.quantize(w, D.QuantScheme("int4", group_size=group))
    tensors, kw = kernel_arguments(qw)
    return tensors, kw, qw.dequantize().double()


def _problem(M, n, k, group, dtype, seed):
    tensors, kw, wd = _weights(n, k, group, dtype)
    A = torch.randn(M, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return [A, *tensors], kw, A.double() @ wd.T


def _rel(C, ref):
    return ((C.double().cpu() - ref).norm() / ref.norm()).item()


def _tol(dtype):
    return 2e-3 if dtype == torch.float16 else 8e-3


@pytest.mark.parametrize("M, dtype, group", [
    (1, torch.float16, 128), (33, torch.float16, -1), (100, torch.float16, 128), (256, torch.float16, -1),
    (1, torch.bfloat16, -1), (33, torch.bfloat16, 128), (100, torch.bfloat16, -1), (256, torch.bfloat16, 128),
])
def test_fused_hopper_on_the_interpreter(M, dtype, group):
    """The exact sm_90a kernel on the CPU (TMA boxes, mbarrier ring, shfl re-pairing, RS wgmma, TMA store clipped at
    M): a poisoned output fully overwritten and within the output dtype's rounding of the float64 product of
    ``dequantize()``. Two persistent CTAs, so tiles are walked by the scheduler (2 N tiles x ceil(M / 128))."""
    args, kw, ref = _problem(M, N, K, group, dtype, seed=M)
    func, _ = make_dequant_gemm_hopper(M, N, K, dtype=str(dtype)[6:], config=HopperDequantConfig(num_sms=2), **kw)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    report = mmaemit.interpret(func, *args, C, arch="sm_90a")
    assert report.ok, report
    assert not torch.isnan(C).any()
    assert _rel(C, ref) < _tol(dtype)


@pytest.mark.parametrize("M, k, in_flight", [(7, 512, 1), (70, 576, 1), (70, 576, 0)])
def test_fused_hopper_symbolic_m_small_tiles(M, k, in_flight):
    """M=None (one kernel for every M), block_m 32 and one consumer, 2 stages (the ring wraps), 3 persistent CTAs;
    K=576: an odd chunk count (the 2-buffer K loop's tail chunk); in_flight 0 and 1."""
    dtype = torch.float16
    args, kw, ref = _problem(M, 128, k, 128 if k == 512 else -1, dtype, seed=M)
    cfg = HopperDequantConfig(block_m=32, consumers=1, stages=2, num_sms=3, in_flight=in_flight)
    func, _ = make_dequant_gemm_hopper(None, 128, k, config=cfg, **kw)
    C = torch.full((M, 128), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, *args, C, arch="sm_90a").ok
    assert _rel(C, ref) < _tol(dtype)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_quad_word_plan_is_the_transpose_of_the_kernel_layout(bits):
    """Simulate one lane quad in numpy: bundles built by the plan, transposed over the quad and assembled must give
    lane c decode words whose register rho = 4 S + r (r = 2 n + H, element e, in the decode-slice order) holds exactly
    the code of weight row g + 8 n, real column 16 S + 8 H + 2 c + e (what wgmma's A fragment contracts with a
    real-order activation tile), with the layout read through its own inverse."""
    from mmaemit.dequant.interleave import bit_positions
    from mmaemit.dequant.kernel_layout import from_kernel_layout, to_kernel_layout

    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(16, 64), dtype=np.uint8)
    words = to_kernel_layout(codes, bits).astype(np.int64) & 0xFFFFFFFF      # [1, 1, 32, bits]
    assert (from_kernel_layout(to_kernel_layout(codes, bits), bits) == codes).all()
    plan = quad_word_plan(bits)
    pos, R = bit_positions(bits), 16 // bits
    assert plan.words == bits and plan.bundle_words == max(1, bits // 4)

    def mv(w, shift, mask):
        return ((w << shift) if shift >= 0 else (w >> -shift)) & mask & 0xFFFFFFFF

    for g in range(8):
        lanes = [4 * g + c for c in range(4)]
        Y = [[[sum(mv(words[0, 0, l, sw], sh, m) for sw, sh, m in plan.build[cp][b])
               for b in range(plan.bundle_words)] for cp in range(4)] for l in lanes]
        for c in range(4):
            y = [[Y[S][c][b] for S in range(4)] for b in range(plan.bundle_words)]    # received from lane S
            for w, terms in enumerate(plan.assemble):
                z = 0
                for S, b, sh in terms:
                    assert z & (y[b][S] << sh) == 0
                    z |= y[b][S] << sh
                for i in range(R):
                    S, r = divmod(w * R + i, 4)
                    for e in range(2):
                        code = (z >> pos[2 * i + e]) & ((1 << bits) - 1)
                        assert code == codes[g + 8 * (r // 2), 16 * S + 8 * (r % 2) + 2 * c + e]
    with pytest.raises(UnsupportedConfigError, match="valid: 1, 2, 4, 8"):
        quad_word_plan(3)


@pytest.mark.parametrize("dtype, op, in_flight", [("float16", "HGMMA.64x128x16.F32", 1),
                                                 ("bfloat16", "HGMMA.64x128x16.F32.BF16", 1),
                                                 ("float16", "HGMMA.64x128x16.F32", 0)])
def test_fused_hopper_sass(dtype, op, in_flight):
    """sm_90a SASS (nvcc only, no GPU): 4 HGMMA per chunk issued behind one warpgroup arrive per chunk (not
    serialized; in_flight=1 unrolls the K loop by 2 and peels the last two chunks), TMA loads (2-D activations,
    3-D packed words in 512-byte rows and scales) and a TMA store, the PDL prologue's weight prefetches,
    no spills or stack, no C7514 / C7508 in ptxas's log."""
    kt = 8192 // 64
    chunks = 2 + (kt - 2 * ((kt - 1) // 2)) if in_flight else 1     # the K loop's pair + the peeled last chunks
    func, _ = make_dequant_gemm_hopper(None, 8192, 8192, 128, dtype,
                                       config=HopperDequantConfig(in_flight=in_flight))
    k = mmaemit.compile(func, target="sm_90a")
    hist = k.opcode_histogram("sm_90a")
    assert hist.get(op, 0) == 4 * chunks, hist
    assert hist.get("WARPGROUP.ARRIVE", 0) == chunks, hist
    assert hist.get("UTMALDG.2D", 0) == 1 and hist.get("UTMALDG.3D", 0) == 2, hist     # activations; words, scales
    # the L2 prefetch of the first tile's weight boxes before griddepcontrol.wait (pdl, the default): one per stage
    assert sum(n for o, n in hist.items() if o.startswith("UTMAPF")) == HopperDequantConfig().stages, hist
    assert hist.get("ACQBULK", 0) >= 1, hist                                             # griddepcontrol.wait
    assert hist.get("UTMASTG.2D", 0) == 1 and hist.get("SHFL.BFLY", 0) == 4 * chunks, hist
    assert not any(o.startswith("LDGSTS") for o in hist), hist
    use = k.resource_usage("sm_90a")
    assert use.spill_store_bytes == use.spill_load_bytes == use.stack_frame_bytes == 0, use
    log = k.cubin("sm_90a").ptxas_log
    assert "C7514" not in log and "C7508" not in log, log
    # no accumulator read before the last wgmma group retired (the in_flight=1 epilogue once was, see the checker)
    assert wgmma_accumulator_hazards(k.sass("sm_90a")) == []


def test_fused_hopper_errors():
    ok = dict(group_size=128)
    with pytest.raises(ArchError, match="sm_90a"):
        make_dequant_gemm_hopper(64, 256, 512, arch="sm_80", **ok)
    with pytest.raises(UnsupportedConfigError, match="weight_format in .*int8"):
        make_dequant_gemm_hopper(64, 256, 512, weight_format="mxfp4", **ok)
    with pytest.raises(UnsupportedConfigError, match="zero points apply to unsigned codes"):
        make_dequant_gemm_hopper(64, 256, 512, weight_format="int4", zeros_mode="original", **ok)
    with pytest.raises(UnsupportedConfigError, match="zeros_mode must be one of"):
        make_dequant_gemm_hopper(64, 256, 512, weight_format="uint4", zeros_mode="awq", **ok)
    with pytest.raises(UnsupportedConfigError, match="float16"):
        make_dequant_gemm_hopper(64, 256, 512, dtype="float32", **ok)
    with pytest.raises(TileShapeError, match="multiple of the tile's 128 weight rows"):
        make_dequant_gemm_hopper(64, 192, 512, **ok)
    with pytest.raises(TileShapeError, match="multiples of 64"):
        make_dequant_gemm_hopper(64, 256, 500, **ok)
    with pytest.raises(TileShapeError, match="multiples of 64"):
        make_dequant_gemm_hopper(64, 256, 512, group_size=96)
    with pytest.raises(TileShapeError, match="M must be a positive int"):
        make_dequant_gemm_hopper(0, 256, 512, **ok)
    with pytest.raises(TileShapeError, match="block_m"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(block_m=100), **ok)
    with pytest.raises(UnsupportedConfigError, match="consumers"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(consumers=3), **ok)
    with pytest.raises(UnsupportedConfigError, match="stages"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(stages=1), **ok)
    with pytest.raises(UnsupportedConfigError, match="shared memory"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(block_m=256, stages=8), **ok)
    with pytest.raises(UnsupportedConfigError, match="in_flight"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(in_flight=2), **ok)
    with pytest.raises(UnsupportedConfigError, match="HopperDequantConfig"):
        make_dequant_gemm_hopper(64, 256, 512, config=object(), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"handover='tree'; valid: 'parallel', 'rounds', 'stage'"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(handover="tree"), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"handover='rounds' passes k_split consumers"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(handover="rounds"), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"quad_repair='ldmatrix'; valid: 'shared', 'shuffle'"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(quad_repair="ldmatrix"), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"pdl='yes'; valid: True, False"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(pdl="yes"), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"activation_boxes='tile'; valid: 'chunk', 'stage'"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(activation_boxes="tile"), **ok)
    with pytest.raises(UnsupportedConfigError, match=r"chunks_per_stage=3; valid: 1, 2, 4"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(chunks_per_stage=3), **ok)
    with pytest.raises(TileShapeError, match="chunks_per_stage=2 needs K a multiple of 128"):
        make_dequant_gemm_hopper(64, 256, 576, config=HopperDequantConfig(chunks_per_stage=2), group_size=-1)
    with pytest.raises(TileShapeError, match="multiple of 256 .stages of 2"):
        make_dequant_gemm_hopper(64, 256, 640, config=HopperDequantConfig(chunks_per_stage=2, k_split=True),
                                 group_size=-1)
    with pytest.raises(UnsupportedConfigError, match="producers"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(producers=3), **ok)
    with pytest.raises(UnsupportedConfigError, match="multiple of 2"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(producers=2, stages=3), **ok)
    with pytest.raises(UnsupportedConfigError, match="with k_split=True; valid: 2 or 4"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(consumers=1, k_split=True), **ok)
    with pytest.raises(UnsupportedConfigError, match="valid: 1 or 2"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(consumers=4), **ok)
    with pytest.raises(UnsupportedConfigError, match="consumers can have at most 104"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(consumers=4, k_split=True, stages=5), **ok)
    four = dict(block_m=32, consumers=4, k_split=True, consumer_regs=112, producer_regs=24)
    with pytest.raises(UnsupportedConfigError, match="stages >= 8"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(stages=4, **four), **ok)
    # k_split deals stages round robin: a consumer's parity wait is only sound if the stage's previous round was its
    # own unit, so the stages are a multiple of the consumers (and min_stages rounds up to one)
    with pytest.raises(UnsupportedConfigError, match="stages must be a multiple of 2 .*, not 5"):
        make_dequant_gemm_hopper(64, 256, 1024, config=HopperDequantConfig(block_m=32, stages=5, k_split=True), **ok)
    with pytest.raises(UnsupportedConfigError, match="stages must be a multiple of 4 .*, not 10"):
        make_dequant_gemm_hopper(64, 256, 1024, config=HopperDequantConfig(stages=10, **four), **ok)
    assert [HopperDequantConfig(consumers=c, k_split=True, in_flight=f).min_stages
            for c in (2, 4) for f in (0, 1)] == [2, 4, 4, 8]
    assert HopperDequantConfig(stages=5).min_stages == 2 and HopperDequantConfig(stages=5).stage_step == 1
    with pytest.raises(TileShapeError, match="multiple of 256"):
        make_dequant_gemm_hopper(64, 256, 640, config=HopperDequantConfig(stages=5, **four), group_size=-1)
    with pytest.raises(UnsupportedConfigError, match="accumulator registers"):
        make_dequant_gemm_hopper(128, 256, 512, config=HopperDequantConfig(**dict(four, block_m=128, stages=5)),
                                 **ok)
    with pytest.raises(UnsupportedConfigError, match="stages >= 4"):
        make_dequant_gemm_hopper(64, 256, 512, config=HopperDequantConfig(k_split=True, stages=2), **ok)
    with pytest.raises(TileShapeError, match="multiple of 128"):
        make_dequant_gemm_hopper(64, 256, 576, config=HopperDequantConfig(k_split=True), group_size=-1)


@pytest.mark.parametrize("M, k, in_flight, sms, k_split, producers, consumers, cps, xb", [
    (70, 512, 1, 1, True, 1, 2, 1, "chunk"), (33, 640, 1, 2, True, 2, 2, 1, "stage"),
    (20, 512, 0, 1, True, 1, 2, 2, "stage"), (70, 576, 1, 1, False, 2, 2, 1, "chunk"),
    (40, 768, 1, 1, True, 1, 4, 1, "chunk"), (17, 512, 1, 2, True, 2, 4, 2, "chunk"),
    (5, 256, 0, 1, True, 1, 4, 1, "chunk"), (70, 512, 1, 1, True, 1, 2, 4, "stage"),
    (40, 1024, 1, 2, True, 1, 2, 2, "chunk"), (33, 768, 1, 1, False, 1, 2, 2, "stage"),
    (21, 768, 1, 1, False, 1, 2, 2, "chunk")])
def test_fused_hopper_k_split_on_the_interpreter(M, k, in_flight, sms, k_split, producers, consumers, cps, xb):
    """k_split: two consumer warpgroups on the same 64 weight rows, even / odd chunks, sums added through shared
    memory; one persistent CTA walks both N tiles (the hand-over buffer reused across tiles); K=640: 5 chunks per
    consumer (the single peeled tail chunk); in_flight 0 and 1. producers=2: two threads fill alternate stages (K=576:
    an odd chunk count, the producers issue 5 and 4). 4 consumers: chunks dealt round robin (K=768: 3 each, a pair
    and the peeled tail; K=256: one each), three hand-overs through shared memory. cps: chunks per ring stage (2 or
    4; group 128 with 4: one scale box of two groups per stage; per-column scales: one box; group 192 with 2: one
    scale box per chunk), with and without k_split. xb: the activations as one box per chunk or one 3-D box per
    stage (rows past M zero-filled in both; "stage" with one chunk per stage is the per-chunk box)."""
    group = 128 if k == 512 else (192 if M == 21 else -1)
    args, kw, ref = _problem(M, 128, k, group, torch.float16, seed=M)
    cfg = HopperDequantConfig(block_m=32, consumers=consumers, k_split=k_split,
                              stages=2 + 2 * producers if consumers == 2 else 8, num_sms=sms,
                              consumer_regs=232 if consumers == 2 else 112, producer_regs=40 if consumers == 2 else 24,
                              in_flight=in_flight, producers=producers, chunks_per_stage=cps, activation_boxes=xb)
    func, _ = make_dequant_gemm_hopper(None, 128, k, config=cfg, **kw)
    C = torch.full((M, 128), float("nan"), dtype=torch.float16)
    assert mmaemit.interpret(func, *args, C, arch="sm_90a").ok
    assert _rel(C, ref) < _tol(torch.float16)


@pytest.mark.parametrize("M, in_flight, cps", [(40, 1, 2), (70, 0, 1)])
def test_fused_hopper_handover_in_rounds_on_the_interpreter(M, in_flight, cps):
    """handover="rounds": four k_split consumers pass their sums to consumer 0 through one shared slot, one consumer
    per barrier round (the output staging tile in the same bytes), on a persistent CTA that walks both N tiles; two
    slots less shared memory than "parallel"."""
    from mmaemit.kernels.dequant_gemm_hopper import fused_smem_bytes

    args, kw, ref = _problem(M, 128, 1024, 128, torch.float16, seed=M + 5)
    cfg = HopperDequantConfig(block_m=32, consumers=4, k_split=True, stages=8, num_sms=1, consumer_regs=112,
                              producer_regs=24, in_flight=in_flight, chunks_per_stage=cps, handover="rounds")
    func, _ = make_dequant_gemm_hopper(None, 128, 1024, config=cfg, **kw)
    C = torch.full((M, 128), float("nan"), dtype=torch.float16)
    assert mmaemit.interpret(func, *args, C, arch="sm_90a").ok
    assert not torch.isnan(C).any()
    assert _rel(C, ref) < _tol(torch.float16)
    par = dataclasses.replace(cfg, handover="parallel")
    assert fused_smem_bytes(par, 4, 128) - fused_smem_bytes(cfg, 4, 128) == 2 * 128 * 16 * 4


@pytest.mark.parametrize("fmt, zeros, consumers, cps, M", [("int4", None, 2, 2, 20), ("uint4", "quantized", 4, 2, 20),
                                                      ("int8", None, 2, 4, 45), ("int4", None, 4, 4, 33)])
def test_fused_hopper_handover_in_kept_stages_is_bit_identical(fmt, zeros, consumers, cps, M):
    """handover="stage": each consumer c > 0 keeps its last ring stage of a tile and writes its fp32 sums over the
    stage's activation bytes; consumer 0 adds them, stages the output tile in consumer 1's stage and releases the kept
    stages after the store read it. The bits of "parallel" (its own slots) on the same ring, on a persistent CTA
    that walks both N tiles (so the next tile's loads wait for the kept stages), 2 and 4 consumers, 2 / 4 chunks per
    stage, zero points, 8-bit words; no shared memory beyond the stages. One-chunk stages (the sums would not fit) and
    in_flight=0 are refused."""
    from mmaemit.kernels.dequant_gemm_hopper import fused_smem_bytes

    regs = dict(consumer_regs=112, producer_regs=24) if consumers == 4 else {}
    K = 64 * cps * consumers * 2
    g = torch.Generator().manual_seed(M + cps)
    qw = D.quantize(torch.randn(128, K, generator=g).half(), D.QuantScheme(fmt, 128, zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).half()
    outs = []
    cfgs = [HopperDequantConfig(block_m=32, consumers=consumers, stages=2 * consumers,
                                k_split=True, chunks_per_stage=cps, num_sms=1, handover=h, **regs)
            for h in ("parallel", "stage")]
    for cfg in cfgs:
        func, _ = make_dequant_gemm_hopper(None, 128, K, config=cfg, **kw)
        C = torch.full((M, 128), float("nan"), dtype=torch.float16)
        assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
        outs.append(C)
    ref = A.double() @ qw.dequantize().double().T
    assert not torch.isnan(outs[0]).any() and _rel(outs[0], ref) < 3e-3
    assert torch.equal(outs[0], outs[1])
    bits = D.get_format(fmt).bits
    nacc = cfgs[0].block_m // 2
    z = zeros is not None
    assert (fused_smem_bytes(cfgs[0], bits, 128, z) - fused_smem_bytes(cfgs[1], bits, 128, z)
            == (consumers - 1) * 128 * nacc * 4)
    with pytest.raises(UnsupportedConfigError, match="handover='stage' writes a consumer's fp32 sums"):
        make_dequant_gemm_hopper(None, 128, 1024, config=dataclasses.replace(cfgs[1], chunks_per_stage=1))
    with pytest.raises(UnsupportedConfigError, match="handover='stage' writes a consumer's fp32 sums"):
        make_dequant_gemm_hopper(None, 128, 1024, config=dataclasses.replace(cfgs[1], in_flight=0))
    with pytest.raises(UnsupportedConfigError, match="handover='stage' passes k_split consumers"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(handover="stage"))


@pytest.mark.parametrize("M, sym, cfg", [
    (13, True, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, activation_boxes="chunk")),
    (20, True, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, activation_boxes="chunk",
                    handover="stage")),
    (37, True, dict(block_m=48, consumers=2, stages=3, chunks_per_stage=1)),       # two 64-row groups, no k_split
    (9, False, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=1, in_flight=0)),
    # two and three tile rows, the last one short, after whole rows on the same CTA (which leave their activations,
    # or with the kept-stage handover their sums, in the rows past the short box)
    (50, True, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=1)),
    (75, True, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, activation_boxes="chunk",
                    handover="stage")),
    # stage boxes: whole rows take one box per stage, the short row one per chunk
    (37, True, dict(block_m=16, consumers=2, stages=4, k_split=True, chunks_per_stage=4)),
    (70, False, dict(block_m=32, consumers=2, stages=4, chunks_per_stage=2)),
    (64, True, dict(block_m=32, consumers=2, stages=4, chunks_per_stage=2)),          # no short row
    (64, False, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2))])  # static, none
def test_fused_hopper_fit_rows_is_bit_identical(M, sym, cfg):
    """fit_rows=True: the last tile row's activation boxes carry its rows rounded up to 8 (M - (rows - 1) x
    block_m; encoded per launch, the barrier armed for those bytes) and the tile rows past them are zeroed once per
    CTA instead of zero-filled by TMA every stage. The bits of the full boxes: symbolic and static M, k_split and
    not, the kept-stage handover (which later writes over those rows), one tile row and several, chunk and stage
    boxes."""
    K = 512
    g = torch.Generator().manual_seed(M)
    qw = D.quantize(torch.randn(128, K, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).half()
    outs = []
    for fit in (False, True):
        c = HopperDequantConfig(num_sms=1, **dict(cfg, fit_rows=fit))
        func, _ = make_dequant_gemm_hopper(None if sym else M, 128, K, config=c, **kw)
        C = torch.full((M, 128), float("nan"), dtype=torch.float16)
        assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
        outs.append(C)
    assert not torch.isnan(outs[0]).any() and _rel(outs[0], A.double() @ qw.dequantize().double().T) < 3e-3
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(UnsupportedConfigError, match="fit_rows=1; valid: True, False"):
        make_dequant_gemm_hopper(None, 128, K, config=HopperDequantConfig(fit_rows=1))


@pytest.mark.parametrize("sms, prefetch", [(1, None), (3, 0), (3, 9)])
def test_fused_hopper_pdl_is_bit_identical(sms, prefetch):
    """pdl (default): griddepcontrol at entry, the producer's L2 prefetch of its first tile's weight boxes (None:
    ``stages`` of them; more than the tile has are cut) before the wait; the same bits as without. With 3 persistent
    CTAs for 2 tiles one CTA has no tile and prefetches nothing."""
    args, kw, ref = _problem(40, 128, 1024, 128, torch.float16, seed=11)
    outs = []
    for pdl in (False, True):
        cfg = HopperDequantConfig(block_m=48, consumers=2, k_split=True, stages=4, num_sms=sms, chunks_per_stage=2,
                                  pdl=pdl, pdl_prefetch=prefetch)
        func, _ = make_dequant_gemm_hopper(None, 128, 1024, config=cfg, **kw)
        C = torch.full((40, 128), float("nan"), dtype=torch.float16)
        assert mmaemit.interpret(func, *args, C, arch="sm_90a").ok
        outs.append(C)
    assert not torch.isnan(outs[0]).any() and _rel(outs[0], ref) < _tol(torch.float16)
    assert torch.equal(outs[0], outs[1])


def _fused_variants(fmt, zeros, dtype, K, seed, configs):
    """The fused kernel's outputs on the interpreter (N=128, M=20, symbolic M) for each config on one random problem;
    the first is checked for NaN (poisoned output) and against the float64 product."""
    g = torch.Generator().manual_seed(seed)
    qw = D.quantize(torch.randn(128, K, generator=g).to(dtype), D.QuantScheme(fmt, 128, zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(20, K, generator=g).to(dtype)
    outs = []
    for cfg in configs:
        func, _ = make_dequant_gemm_hopper(None, 128, K, dtype=str(dtype)[6:], config=cfg, **kw)
        C = torch.full((20, 128), float("nan"), dtype=dtype)
        assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
        outs.append(C)
    ref = A.double() @ qw.dequantize().double().T
    assert not torch.isnan(outs[0]).any() and _rel(outs[0], ref) < (3e-3 if dtype == torch.float16 else 1e-2)
    return outs


@pytest.mark.parametrize("fmt, zeros, dtype", [("int4", None, torch.float16), ("int8", None, torch.bfloat16),
                                               ("uint2", "quantized", torch.float16), ("int1", None, torch.float16)])
def test_fused_hopper_shared_quad_repair_is_bit_identical(fmt, zeros, dtype):
    """quad_repair="shared" (each lane reads its quad partners' words from the ring stage and rotates their codes
    into place) gives the bits of the shuffle transpose, for every word width (8-bit: two bundle words; 2 / 1-bit:
    bundles assembled after the transpose)."""
    outs = _fused_variants(fmt, zeros, dtype, 512, len(fmt), [
        HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, quad_repair=repair)
        for repair in ("shuffle", "shared")])
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("fmt, zeros, dtype, cps, in_flight", [("int4", None, torch.float16, 2, 1),
                                                                 ("int2", None, torch.float16, 4, 1),
                                                                 ("int8", None, torch.bfloat16, 1, 1),
                                                                 ("uint4", "quantized", torch.float16, 4, 0),
                                                                 ("nf4", None, torch.float16, 2, 1)])
def test_fused_hopper_lookahead_is_bit_identical(fmt, zeros, dtype, cps, in_flight):
    """lookahead=True (a stage's words loaded at once, chunk j + 1's quad shuffles before chunk j's decode) gives the
    bits of the plain order for every word width, 1 / 2 / 4 chunks per stage, both A-buffer modes, zero points and
    nf4's tables; with quad_repair="shared" it is refused."""
    outs = _fused_variants(fmt, zeros, dtype, 1024, len(fmt) + cps, [
        HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=cps,
                            in_flight=in_flight, lookahead=lookahead) for lookahead in (False, True)])
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(UnsupportedConfigError, match="lookahead=True works on the shuffle repair"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(lookahead=True, quad_repair="shared"))
    with pytest.raises(UnsupportedConfigError, match="lookahead=1; valid: True, False"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(lookahead=1))


@pytest.mark.parametrize("fmt, zeros, dtype, consumers, in_flight, lookahead", [
    ("int4", None, torch.float16, 2, 1, False), ("uint4", "quantized", torch.float16, 4, 1, False),
    ("int2", None, torch.bfloat16, 2, 0, False), ("nf4", None, torch.float16, 2, 1, True),
    ("int8", None, torch.bfloat16, 2, 1, False)])
def test_fused_hopper_chunk_pairs_are_bit_identical(fmt, zeros, dtype, consumers, in_flight, lookahead):
    """chunks_per_group=2 (two chunks' wgmmas in one commit group, four A buffers with a group in flight) gives the
    bits of one chunk per group: 2 and 4 k_split consumers, both A-buffer modes, lookahead, zero points, nf4's
    tables, 2- and 8-bit words; other values and stages of fewer than 4 chunks are refused."""
    regs = dict(consumer_regs=112, producer_regs=24) if consumers == 4 else {}
    outs = _fused_variants(fmt, zeros, dtype, 1024, len(fmt) + consumers, [
        HopperDequantConfig(block_m=32, consumers=consumers, stages=2 * consumers, k_split=True, chunks_per_stage=4,
                            in_flight=in_flight, lookahead=lookahead, chunks_per_group=cpg, **regs)
        for cpg in (1, 2)])
    assert torch.equal(outs[0], outs[1])
    with pytest.raises(UnsupportedConfigError, match="chunks_per_group=3; valid: 1, 2"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(chunks_per_group=3))
    with pytest.raises(UnsupportedConfigError, match="needs chunks_per_stage=4"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(chunks_per_group=2, chunks_per_stage=2))


@pytest.mark.parametrize("fmt, zeros, group_cps", [("int4", None, 4), ("uint4", "quantized", 2),
                                                    ("uint4", "original", 1), ("int4_ob", None, 2)])
def test_fused_hopper_decode_variants_are_bit_identical(fmt, zeros, group_cps):
    """decode_variant: "auto" takes Marlin's decode for 4-bit integer codes to float16 (one shift per word, the high
    nibbles' magic removed by an exact fma by 1/16), with the bits of "shift" (zero points, 1 / 2 / 4 chunks per
    stage, so the scales are reused across 1 or 2 chunks of a group); a variant the format lacks is refused."""
    outs = _fused_variants(fmt, zeros, torch.float16, 1024, 11 + group_cps, [
        HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=group_cps,
                            decode_variant=v) for v in ("shift", "auto", "marlin")])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    with pytest.raises(UnsupportedConfigError, match="marlin variant exists for 4-bit integer formats"):
        make_dequant_gemm_hopper(None, 128, 1024, dtype="bfloat16", config=HopperDequantConfig(decode_variant="marlin"))
    with pytest.raises(UnsupportedConfigError, match="marlin variant exists for 4-bit integer formats"):
        make_dequant_gemm_hopper(None, 128, 1024, weight_format="int8",
                                 config=HopperDequantConfig(decode_variant="marlin"))
    with pytest.raises(UnsupportedConfigError, match="decode_variant='fast'; valid: 'auto', 'marlin', 'shift'"):
        make_dequant_gemm_hopper(None, 128, 1024, config=HopperDequantConfig(decode_variant="fast"))


def test_fused64_chunk_instruction_budget():
    """The per-chunk SASS of the default fused64 (int4, fp16; nvcc only): the cuts of the fifteenth session stay in.
    Between two warpgroup arrives (one chunk: LDS of the words, quad repair, decode, 4 HGMMA) at most 96
    instructions (114 before): Marlin's decode (4 SHF per chunk, not 12), one lop3 select per repair bundle word
    (not two), the scale pairs by PRMT once per scale group (not shift + mask + multiply every chunk), and a 32-bit
    add per wgmma descriptor (one uniform add, not three)."""
    from mmaemit.kernels.dequant_dispatch import _DEFAULTS

    func, _ = make_dequant_gemm_hopper(None, 8192, 8192, 128, "float16", config=_DEFAULTS["fused64"])
    sass = mmaemit.compile(func, target="sm_90a").sass("sm_90a")
    ops = [line.split("*/")[1].split(";")[0].split() for line in sass.splitlines()
           if line.strip().startswith("/*") and "*/" in line and ";" in line]
    ops = [o[1] if o[0].startswith("@") else o[0] for o in ops if o]
    arrives = [i for i, o in enumerate(ops) if o == "WARPGROUP.ARRIVE"]
    chunks = [ops[a + 1:b + 1] for a, b in zip(arrives, arrives[1:])]
    assert len(chunks) >= 4, len(chunks)
    counts = [len(c) for c in chunks[1:3]]           # a stage's interior chunks (the 4th also waits for the next)
    assert max(counts) <= 96, counts
    for c in chunks[1:3]:
        assert sum(o.startswith("HGMMA") for o in c) == 4 and sum(o.split(".")[0] == "SHF" for o in c) <= 8, c
        assert sum(o.startswith("UIADD3.64") for o in c) == 0, c


def test_fused_hopper_chunk_pairs_sass():
    """sm_90a SASS of fused32's and fused48's defaults (two chunks per wgmma group): half the wgmma fences of one
    chunk per group, the same HGMMA count, no spills for 4-, 2- and 1-bit weights, zero points and nf4."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    for path in ("fused32", "fused48"):
        cfg = DequantGemm(8192, 8192, arch="sm_90a").configs[path]
        assert cfg.chunks_per_group == 2
        counts = {}
        for fmt, zeros in (("int4", None), ("uint4", "quantized"), ("nf4", None), ("int2", None), ("int1", None)):
            for cpg in ((1, 2) if fmt == "int4" else (2,)):
                k = mmaemit.compile(make_dequant_gemm_hopper(None, 8192, 8192, 128, "float16",
                                                             dataclasses.replace(cfg, chunks_per_group=cpg), "sm_90a",
                                                             weight_format=fmt, zeros_mode=zeros)[0], target="sm_90a")
                assert k.resource_usage("sm_90a").spill_bytes == 0, (path, fmt)
                sass = k.sass("sm_90a")
                counts[fmt, cpg] = (sass.count("WARPGROUP.ARRIVE"), sass.count("HGMMA."))
        (fences1, hgmma1), (fences2, hgmma2) = counts["int4", 1], counts["int4", 2]
        assert fences2 * 2 == fences1 and hgmma2 == hgmma1, (path, counts)


@pytest.mark.parametrize("path, fmt, zeros, dtype, M", [("fused160", "int4", None, torch.float16, 140),
                                                        ("fused160", "uint4", "original", torch.bfloat16, 129),
                                                        ("fused192", "int4", None, torch.float16, 170),
                                                        ("fused224", "uint4", "quantized", torch.float16, 200),
                                                        ("fused256k", "int8", None, torch.bfloat16, 250)])
def test_one_wave_tiles_on_the_interpreter(path, fmt, zeros, dtype, M):
    """The one-wave configs of the plan at 8192^2 (fused160 / 192 / 224 / 256k: block_m x 64 tiles, two consumers
    splitting K, one chunk per stage) on the interpreter at a ragged M: NaN-poisoned output within the dtype's
    rounding of the float64 product; once per path, every format of the plan's checks compiles without spills for
    sm_90a (8-bit weights with fewer stages)."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    def plan_config(wf, zm, dt):
        return DequantGemm(8192, 8192, dtype=dt, weight_format=wf, zeros_mode=zm, arch="sm_90a").configs[path]

    cfg = plan_config(fmt, zeros, str(dtype)[6:])
    assert cfg.k_split and cfg.weight_rows == 64 and cfg.chunks_per_stage == 1 and cfg.block_m >= M
    g = torch.Generator().manual_seed(M)
    qw = D.quantize(torch.randn(128, 1024, generator=g).to(dtype), D.QuantScheme(fmt, 128, zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, 1024, generator=g).to(dtype)
    small = dataclasses.replace(cfg, num_sms=2)
    func, _ = make_dequant_gemm_hopper(None, 128, 1024, dtype=str(dtype)[6:], config=small, **kw)
    C = torch.full((M, 128), float("nan"), dtype=dtype)
    extra = ()
    if small.stream_k:          # the plan's default (STREAM_K_PATHS): the kernel takes its workspace after C
        from mmaemit.kernels.dequant_gemm_hopper import stream_k_workspace

        (ws, _), (lk, _) = stream_k_workspace(small)
        extra = (torch.full(ws, float("nan")), torch.zeros(lk, dtype=torch.int32))   # counters start at zero
    assert mmaemit.interpret(func, A, *tensors, C, *extra, arch="sm_90a").ok
    assert not torch.isnan(C).any()
    assert _rel(C, A.double() @ qw.dequantize().double().T) < _tol(dtype)
    if fmt == "int4" or path in ("fused224", "fused256k"):     # once per path
        for wf, zm, dt in (("int4", None, "float16"), ("nf4", None, "float16"), ("int8", None, "bfloat16"),
                           ("uint4", "quantized", "float16")):
            k = mmaemit.compile(make_dequant_gemm_hopper(None, 8192, 8192, 128, dt, plan_config(wf, zm, dt),
                                                         "sm_90a", weight_format=wf, zeros_mode=zm)[0],
                                target="sm_90a")
            assert k.resource_usage("sm_90a").spill_bytes == 0, (path, wf)


def test_fused_hopper_lookahead_sass():
    """sm_90a SASS of fused96's default (lookahead) against the plain order: with lookahead the next chunk's quad
    shuffles sit among this chunk's wgmmas (between its first and last HGMMA), in the plain order never; no
    spills."""
    import re

    from mmaemit.kernels.dequant_dispatch import DequantGemm

    cfg = DequantGemm(8192, 8192, arch="sm_90a").configs["fused96"]
    assert cfg.lookahead
    interleaved = {}
    for lookahead in (True, False):
        k = mmaemit.compile(make_dequant_gemm_hopper(None, 8192, 8192, 128, "float16",
                                                     dataclasses.replace(cfg, lookahead=lookahead), "sm_90a")[0],
                            target="sm_90a")
        ops = re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", k.sass("sm_90a"))
        at = [i for i, op in enumerate(ops) if op == "WARPGROUP.ARRIVE"]
        n = 0
        for a, b in zip(at, at[1:]):
            h = [i for i, o in enumerate(ops[a:b]) if o.startswith("HGMMA")]
            n += bool(h) and any(o.startswith("SHFL") for o in ops[a:b][h[0]:h[-1]])
        interleaved[lookahead] = n
        assert k.resource_usage("sm_90a").spill_bytes == 0
    assert interleaved[True] >= 1 and interleaved[False] == 0, interleaved


def test_fused_hopper_short_k_producer_loop_rolled():
    """At K = 1024 nvcc fully unrolled the producer's 8-unit loop and its per-unit box coordinates outgrew the
    producer's setmaxnreg budget: fused128x2 with fit_rows spilled 144 bytes. The loop is kept rolled
    (``#pragma unroll 1``); the same build has no spills now."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    cfg = dataclasses.replace(DequantGemm(512, 1024, arch="sm_90a").configs["fused128x2"], fit_rows=True)
    k = mmaemit.compile(make_dequant_gemm_hopper(None, 512, 1024, 128, "float16", cfg, "sm_90a")[0],
                        target="sm_90a", check_spills=False)
    assert "#pragma unroll 1" in k.cuda_source
    assert k.resource_usage("sm_90a").spill_bytes == 0


def test_fused_hopper_shared_quad_repair_sass():
    """sm_90a SASS of fused64's shape, int4: with quad_repair="shared" the consumers issue no shuffles (the one left
    is the warp-index broadcast at entry) and fewer instructions per chunk than with the shuffle transpose."""
    import re

    per_chunk, shuffles = {}, {}
    for repair in ("shuffle", "shared"):
        cfg = HopperDequantConfig(block_m=64, consumers=2, stages=4, k_split=True, chunks_per_stage=4,
                                  quad_repair=repair)
        k = mmaemit.compile(make_dequant_gemm_hopper(None, 8192, 8192, 128, "float16", cfg, "sm_90a")[0],
                            target="sm_90a")
        ops = re.findall(r"/\*[0-9a-f]{4,5}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", k.sass("sm_90a"))
        at = [i for i, op in enumerate(ops) if op == "WARPGROUP.ARRIVE"]
        gaps = sorted(b - a for a, b in zip(at, at[1:]))
        per_chunk[repair] = gaps[len(gaps) // 2]
        shuffles[repair] = sum(op.startswith("SHFL") for op in ops)
        assert k.resource_usage("sm_90a").spill_bytes == 0
    assert shuffles["shared"] <= 1 < shuffles["shuffle"], shuffles
    assert per_chunk["shared"] < per_chunk["shuffle"], per_chunk


def test_dispatcher_fused_path_by_name_outside_its_range():
    from mmaemit.kernels.dequant_dispatch import FUSED_PATHS, DequantGemm

    M = 56
    args, kw, ref = _problem(M, N, K, 128, torch.float16, seed=3)
    dg = DequantGemm(N, K, interpret=True, arch="sm_90a", fill_waves=False,
                     configs={"fused256": HopperDequantConfig(block_m=64, num_sms=2)}, **kw)
    assert dg.path_for(M) == "fused64" and set(FUSED_PATHS) <= set(dg.runnable_paths())
    C = torch.full((M, N), float("nan"), dtype=torch.float16)
    dg.run_path("fused256", *args, out=C)
    assert _rel(C, ref) < _tol(torch.float16)
    zq = DequantGemm(N, K, interpret=True, arch="sm_90a", weight_format="uint4", zeros_mode="original")
    assert set(FUSED_PATHS) <= set(zq.runnable_paths())                   # zero points too
    assert not set(FUSED_PATHS) & set(DequantGemm(N, K, interpret=True, arch="sm_80").runnable_paths())


_SPLIT4 = dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, num_sms=3)


@pytest.mark.parametrize("fmt, dtype, cfg", [
    ("int4_ob", torch.float16, {}), ("nf4", torch.bfloat16, {}), ("float4_e2m1fn", torch.float16, {}),
    ("int8", torch.float16, {}), ("int8", torch.bfloat16, _SPLIT4), ("int8_ob", torch.bfloat16, {}),
    ("float8_e4m3fn", torch.float16, _SPLIT4), ("int2", torch.bfloat16, {}), ("int2_ob", torch.float16, _SPLIT4),
    ("int1", torch.float16, {})])
def test_fused_hopper_other_formats_on_the_interpreter(fmt, dtype, cfg):
    """Every format without zero points takes the fused path (codes re-paired blind over the quad by
    ``quad_word_plan(bits)``, then the format's own decode program): symmetric GPTQ (int4_ob), nf4, fp4, 8-bit
    (two bundle words per quad lane), 2- and 1-bit (bundles shifted into place after the transpose); k_split with
    2 chunks per stage for some."""
    _fused_on_the_interpreter(D.QuantScheme(fmt, group_size=128), dtype, 512, cfg, len(fmt))


def _fused_on_the_interpreter(scheme, dtype, k, cfg, seed):
    """Random [128, k] weights of ``scheme`` through ``make_dequant_gemm_hopper`` (symbolic M, M=40; ``cfg`` or one
    64-row consumer, 3 stages, 2 CTAs) on the interpreter: a NaN-poisoned output within the dtype's rounding of the
    float64 product of ``dequantize()``."""
    g = torch.Generator().manual_seed(seed)
    qw = D.quantize(torch.randn(128, k, generator=g).to(dtype), scheme)
    tensors, kw = kernel_arguments(qw)
    assert kw["zeros_mode"] == scheme.zeros_mode and len(tensors) == (3 if scheme.zeros_mode else 2)
    A = torch.randn(40, k, generator=g).to(dtype)
    ref = A.double() @ qw.dequantize().double().T
    config = HopperDequantConfig(**(cfg or dict(block_m=64, consumers=1, stages=3, num_sms=2)))
    func, _ = make_dequant_gemm_hopper(None, 128, k, dtype=str(dtype)[6:], config=config, **kw)
    C = torch.full((40, 128), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
    assert not torch.isnan(C).any()
    assert _rel(C, ref) < _tol(dtype)


@pytest.mark.parametrize("dtype, group, cfg", [
    (torch.float16, 128, dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=4, num_sms=2)),
    (torch.float16, 64, _SPLIT4), (torch.bfloat16, 192, dict(block_m=32, consumers=1, stages=3, chunks_per_stage=2,
                                                            num_sms=2)),
    (torch.bfloat16, -1, dict(block_m=64, consumers=1, stages=3, num_sms=2))])
def test_fused_hopper_nf4_tables_on_the_interpreter(dtype, group, cfg):
    """nf4 with a scale builds each row's 16 scaled values (rounded once) as prmt tables once per scale group
    (``emit_operands``) and looks the codes up per word: rebuilt at every group start of a stage (4 chunks of group
    128, group 64 = every chunk), every chunk where a group straddles stages (192 with 2-chunk stages), once per
    stage for a group per column. Exact: compared with the float64 product of ``dequantize()``."""
    _fused_on_the_interpreter(D.QuantScheme("nf4", group_size=group), dtype, 768 if group == 192 else 512, cfg,
                              group + 3)


@pytest.mark.parametrize("fmt, mode, dtype, group, cfg", [
    ("uint4", "original", torch.float16, 128, {}), ("uint4", "rescale", torch.bfloat16, 128, _SPLIT4),
    ("uint4", "quantized", torch.float16, -1, _SPLIT4), ("uint4", "quantized", torch.bfloat16, 128, {}),
    ("uint8", "quantized", torch.float16, 128, _SPLIT4), ("uint8", "rescale", torch.bfloat16, 128, {}),
    ("uint2", "original", torch.bfloat16, 128, {}), ("uint1", "quantized", torch.float16, 128, {})])
def test_fused_hopper_zero_points_on_the_interpreter(fmt, mode, dtype, group, cfg):
    """Zero points (asymmetric GPTQ / AWQ: unsigned codes, every zeros mode) travel in the ring next to the scales
    (a second box of the same shape, int16 codes for "quantized") and reach the decode as pairs like the scales."""
    _fused_on_the_interpreter(D.QuantScheme(fmt, group, mode), dtype, 512, cfg, len(fmt) + len(mode))


@pytest.mark.gpu
@pytest.mark.parametrize("M, dtype, group", [(1000, torch.float16, 128), (77, torch.bfloat16, -1)])
def test_fused_hopper_on_gpu(M, dtype, group):
    """Symbolic M, default tiles, ragged M; poisoned output vs the float64 reference."""
    n, k = 1024, 2048
    args, kw, ref = _problem(M, n, k, group, dtype, seed=M)
    func, _ = make_dequant_gemm_hopper(None, n, k, dtype=str(dtype)[6:], **kw)
    kernel = mmaemit.compile(func)
    C = torch.full((M, n), float("nan"), dtype=dtype, device="cuda")
    kernel(*[t.cuda() for t in args], C)
    torch.cuda.synchronize()
    assert not torch.isnan(C).any()
    assert _rel(C, ref) < _tol(dtype)


@pytest.mark.gpu
def test_short_row_boxes_on_gpu(monkeypatch):
    """The short last tile row two ways on the GPU, bit-identical: zero-filled full boxes and ``fit_rows`` (a box per
    chunk of the row's height), for the stage-box rings of fused32 (4 chunks per stage, four consumers splitting K)
    and fused128x2 (2 chunks, two consumer warpgroups), where ``fit_rows`` is off by default, one short row and a
    short row after whole rows, on 2 persistent CTAs (each walks several tiles, whole rows before the short one). The
    four kernels build in parallel worker processes."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm, prebuild

    N, K = 512, 2048
    g = torch.Generator().manual_seed(5)
    qw = D.quantize(torch.randn(N, K, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, kw = kernel_arguments(qw)
    tensors = [t.cuda() for t in tensors]
    base = DequantGemm(N, K, arch="sm_90a", **kw).configs
    cases = (("fused32", (20, 75)), ("fused128x2", (300,)))
    plans = {path: [DequantGemm(N, K, arch="sm_90a", configs={path: dataclasses.replace(
        base[path], num_sms=2, fit_rows=fit)}, **kw) for fit in (False, True)] for path, _ in cases}
    monkeypatch.setenv("MMAEMIT_CUBIN_CACHE", "1")        # prebuild sets it; restored after the test
    prebuild([dict(p.spec(), paths=[path]) for path, ps in plans.items() for p in ps], workers=4)
    for path, ms in cases:
        for M in ms:
            A = torch.randn(M, K, generator=g).half().cuda()
            outs = [p.run_path(path, A, *tensors, out=torch.full((M, N), float("nan"), dtype=torch.float16,
                                                                 device="cuda")) for p in plans[path]]
            torch.cuda.synchronize()
            assert not torch.isnan(outs[0]).any(), (path, M)
            assert _rel(outs[0].cpu(), A.cpu().double() @ qw.dequantize().double().T) < 3e-3, (path, M)
            assert all(torch.equal(o, outs[0]) for o in outs[1:]), (path, M)


@pytest.mark.gpu
@pytest.mark.heavy
@pytest.mark.parametrize("fmt, dtype, zeros_mode", [
    ("int4_ob", torch.float16, None), ("nf4", torch.float16, None), ("int8", torch.bfloat16, None),
    ("int2", torch.float16, None), ("uint4", torch.float16, "quantized"), ("uint4", torch.bfloat16, "original")])
def test_fused_paths_other_formats_on_gpu(fmt, dtype, zeros_mode):
    """DequantGemm on sm_90a puts symmetric-GPTQ (int4_ob), asymmetric GPTQ / AWQ (uint4 with zeros), nf4 (scaled
    tables built once per group), 8-bit (bf16: the split-magic decode) and 2-bit weights on the fused paths too: M =
    20 / 100 / 300 (fused32, fused128, fused128x2), through the plan and by name. NaN-poisoned outputs vs the
    float64 product (K=2048: 4 chunks per stage in fused32, 2 in the others; 8-bit rings with fewer stages)."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    g = torch.Generator().manual_seed(11)
    qw = D.quantize(torch.randn(1024, 2048, generator=g).to(dtype), D.QuantScheme(fmt, 128, zeros_mode))
    tensors, kw = kernel_arguments(qw)
    tensors = [t.cuda() for t in tensors]
    wd = qw.dequantize().double().cuda()
    dg = DequantGemm(1024, 2048, dtype=str(dtype)[6:], fill_waves=False, **kw)     # the M-only plan's paths
    for M, path in zip((20, 100, 300), ("fused32", "fused128", "fused128x2")):
        assert dg.path_for(M) == path
        A = torch.randn(M, 2048, device="cuda").to(dtype)
        by_name = dg.run_path(path, A, *tensors, out=torch.full((M, 1024), float("nan"), dtype=dtype, device="cuda"))
        for C in (dg(A, *tensors, out=torch.full((M, 1024), float("nan"), dtype=dtype, device="cuda")), by_name):
            torch.cuda.synchronize()
            assert not torch.isnan(C).any(), (fmt, M)
            ref = A.double() @ wd.T
            assert ((C.double() - ref).norm() / ref.norm()).item() < _tol(dtype), (fmt, M)
