"""Stream-K tails of the fused Hopper dequant GEMM (``HopperDequantConfig(stream_k=True)``): the scheduler's split of
the last wave (by enumeration), the kernel on the interpreter (every hand-over, ring shape and piece layout against
the float64 product, deterministic, the counters left at zero, a piece that starts past its consumer's first unit
followed by enough work to wrap the ring), the interpreter's global atomics, and the dispatcher's workspace; on the
GPU the same through ``DequantGemm``."""
import dataclasses
import itertools

import numpy as np
import pytest
import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import TileShapeError, UnsupportedConfigError
from mmaemit.kernels.dequant_gemm_hopper import (HopperDequantConfig, make_dequant_gemm_hopper, stream_k_scheduler,
                                                stream_k_workspace)
from mmaemit.pipeline import PersistentTileScheduler, StreamKScheduler


# ---------------------------------------------------------------------------------------------------------------------
# the scheduler
# ---------------------------------------------------------------------------------------------------------------------

def _walk(s: StreamKScheduler):
    """Every item of every worker: each (tile, unit) covered once, ring positions (ring0 + u0) contiguous per worker,
    pieces of a tail tile from consecutive workers in K order (what :meth:`pieces` names), slots as documented."""
    cover, pieces = {}, {}
    for w in range(s.workers):
        base = 0
        for tm, tn, u0, nu, b, sk, slot in s.plan(w):
            assert b + u0 == base and nu > 0 and nu % s.granule == 0 and u0 % s.granule == 0 and u0 + nu <= s.units
            assert slot in (0, 1)
            for u in range(u0, u0 + nu):
                assert (tm, tn, u) not in cover
                cover[(tm, tn, u)] = w
            base += nu
            if sk >= 0:
                assert nu < s.units
                pieces.setdefault(sk, []).append((w, slot, u0, nu))
            else:
                assert (u0, nu) == (0, s.units)
    assert len(cover) == s.tiles * s.units
    ng = s.granules_per_tile
    for sk, ps in pieces.items():
        lo, hi = s.pieces(sk)
        assert [p[0] for p in ps] == list(range(lo, hi + 1))
        assert all(slot == sk - s.range_start(w) // ng for w, slot, _, _ in ps)
        assert [p[2] for p in ps] == sorted(p[2] for p in ps) and sum(p[3] for p in ps) == s.units
    return cover


@pytest.mark.parametrize("gm, gn, workers", list(itertools.product([1, 3], [1, 5, 64, 448], [1, 7, 132])))
def test_stream_k_scheduler_covers_every_unit_once(gm, gn, workers):
    for units, granule, least in ((64, 2, 4), (6, 2, 1), (1, 1, 1), (12, 4, 2)):
        s = StreamKScheduler(gm, gn, workers, units, granule, 4, least)
        cover = _walk(s)
        if not s.streamed:
            # without the tail, the items are the persistent scheduler's, tile for tile
            p = PersistentTileScheduler(gm, gn, workers, 4)
            for w in range(workers):
                assert [it[:2] for it in s.plan(w)] == [p.tile(w, t) for t in range(p.count(w))]
        else:
            busiest = max(sum(it[3] for it in s.plan(w)) for w in range(workers))
            assert busiest <= -(-gm * gn // workers) * units       # never longer than the data-parallel last wave
        assert len(cover) == gm * gn * units


def test_stream_k_scheduler_balances_the_last_wave():
    # 28672 x 8192 at 64-row tiles: 448 tiles of 64 stages on 132 SMs (3.39 waves): the busiest SM does 218 stages
    # instead of 4 x 64 = 256; 4096-wide outputs (64 tiles): 56 instead of 112; a full last wave (128 of 132) stays
    # data-parallel
    for tiles, units, busiest in ((448, 64, 218), (64, 112, 56), (224, 32, 56)):
        s = StreamKScheduler(1, tiles, 132, units, 2, 8, 8)
        assert s.streamed and max(sum(it[3] for it in s.plan(w)) for w in range(132)) == busiest
    assert not StreamKScheduler(1, 128, 132, 64, 2).streamed
    assert not StreamKScheduler(2, 66, 132, 64, 2).streamed            # no tail at all
    with pytest.raises(TileShapeError, match="multiple of granule"):
        StreamKScheduler(1, 8, 4, 6, 4)
    with pytest.raises(UnsupportedConfigError, match="threshold"):
        StreamKScheduler(1, 8, 4, 8, 2, threshold=(3, 2))


def test_stream_k_applies_only_where_the_busiest_sm_saves_enough():
    # min_saved: 64 tiles of 16 units on 132 workers save 8 units of the busiest (16 -> 8)
    assert StreamKScheduler(1, 64, 132, 16, 2, min_saved=8).streamed
    assert not StreamKScheduler(1, 64, 132, 16, 2, min_saved=9).streamed
    s = StreamKScheduler(1, 64, 132, 16, 2, min_saved=9)
    assert [len(s.plan(w)) for w in range(132)] == [1] * 64 + [0] * 68      # the data-parallel items
    with pytest.raises(UnsupportedConfigError, match="min_saved"):
        StreamKScheduler(1, 8, 4, 8, 2, min_saved=-1)
    # the kernel's rule (stream_k_min_chunks=48) on the H100's 132 SMs, where it was measured (docs/perf-notes.md,
    # seventeenth session): stream-K lost at 4096 x 4096 (saves 32 chunks) and 14336 x 4096 fused128 (16), won at
    # 4096 x 7168 (56), 4096 x 14336 (112) and 1024 x 4096 (48)
    from mmaemit.kernels.dequant_dispatch import _DEFAULTS

    def on(path, N, K, M):
        cfg = dataclasses.replace(_DEFAULTS[path], stream_k=True, num_sms=132)
        return stream_k_scheduler(cfg, -(-M // cfg.block_m), N, K).streamed
    assert not on("fused64", 4096, 4096, 64) and not on("fused128", 4096, 4096, 128)
    assert not on("fused128", 14336, 4096, 128) and not on("fused128", 8192, 8192, 128)
    assert on("fused64", 4096, 7168, 64) and on("fused64", 4096, 14336, 64) and on("fused64", 1024, 4096, 64)
    assert on("fused256k", 4096, 14336, 256) and on("fused256", 4096, 14336, 512)
    # stream_k_waves=0: 28672 x 8192 (3 whole waves, then 52 tiles) stays data-parallel (power-capped there: evening
    # out the last wave lowered the clock instead of the time); with any number of waves allowed it streams
    assert not on("fused128", 28672, 8192, 128)
    cfg = dataclasses.replace(_DEFAULTS["fused128"], stream_k=True, num_sms=132, stream_k_waves=None)
    assert stream_k_scheduler(cfg, 1, 28672, 8192).streamed
    assert not StreamKScheduler(1, 5, 3, 16, 2, max_whole=0).streamed and StreamKScheduler(1, 5, 3, 16, 2).streamed
    with pytest.raises(UnsupportedConfigError, match="max_whole"):
        StreamKScheduler(1, 8, 4, 8, 2, max_whole=-1)
    with pytest.raises(TileShapeError, match="multiple of 64"):
        stream_k_scheduler(_DEFAULTS["fused64"], 1, 4000, 4096)


# ---------------------------------------------------------------------------------------------------------------------
# the interpreter's atomics
# ---------------------------------------------------------------------------------------------------------------------

def test_interpreter_global_atomics_return_old_values_in_order():
    from tvm.script import tirx as T

    @T.prim_func
    def atomics(X: T.Buffer((4,), "int32"), Old: T.Buffer((2, 64), "int32")):
        T.device_entry()
        bx = T.cta_id([2])
        tx = T.thread_id([64])
        old = T.alloc_local((1,), "int32")
        uold = T.alloc_local((1,), "uint32")
        T.ptx.atom.acq_rel.gpu.global_.add.s32(old[0], X.ptr_to([0]), tx + 1)
        Old[bx, tx] = old[0]
        T.ptx.atom.global_.min.s32(old[0], X.ptr_to([1]), tx - 40)
        T.ptx.atom.global_.max.u32(uold[0], X.ptr_to([2]), T.Cast("uint32", tx))
        T.ptx.red.global_.add.s32(X.ptr_to([3]), 2)

    X = torch.tensor([5, 0, 0, 7], dtype=torch.int32)
    Old = torch.zeros(2, 64, dtype=torch.int32)
    assert mmaemit.interpret(atomics, X, Old, arch="sm_90a").ok
    adds = np.tile(np.arange(1, 65), 2)
    assert Old.flatten().tolist() == (5 + np.concatenate([[0], np.cumsum(adds)[:-1]])).tolist()
    assert X.tolist() == [5 + int(adds.sum()), -40, 63, 7 + 2 * 128]


# ---------------------------------------------------------------------------------------------------------------------
# the kernel on the interpreter
# ---------------------------------------------------------------------------------------------------------------------

def _run(cfg, N, K, M, fmt="int4", zeros=None, seed=1, runs=1):
    g = torch.Generator().manual_seed(seed)
    qw = D.quantize(torch.randn(N, K, generator=g).half(), D.QuantScheme(fmt, 128, zeros))
    tensors, kw = kernel_arguments(qw)
    A = torch.randn(M, K, generator=g).half()
    func, _ = make_dequant_gemm_hopper(None, N, K, config=cfg, **kw)
    extra = ()
    if cfg.stream_k:
        (ws, _), (lk, _) = stream_k_workspace(cfg)
        extra = (torch.full(ws, float("nan")), torch.zeros(lk, dtype=torch.int32))
    outs = []
    for _ in range(runs):
        C = torch.full((M, N), float("nan"), dtype=torch.float16)
        report = mmaemit.interpret(func, A, *tensors, C, *extra, arch="sm_90a")
        assert report.ok, report.summary()
        outs.append(C)
    ref = A.double() @ qw.dequantize().double().T
    return outs, ref, extra


@pytest.mark.parametrize("name, N, K, M, fmt, zeros, cfg", [
    # 5 tiles on 3 CTAs: 1 whole tile each, then the last 2 tiles' stages spread over the 3 (2 pieces per tile)
    ("k_split parallel", 320, 1024, 20, "int4", None,
     dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2)),
    ("two consumer groups", 640, 512, 40, "int4", None, dict(block_m=32, consumers=2, stages=3, num_sms=4)),
    ("one-chunk stages, zero points", 320, 1024, 20, "uint4", "quantized",
     dict(block_m=16, consumers=2, stages=4, k_split=True)),
    ("in_flight 0, fit_rows", 320, 1024, 9, "int4", None,
     dict(block_m=16, consumers=2, stages=4, k_split=True, in_flight=0, fit_rows=True, activation_boxes="chunk")),
    ("4 consumers, kept stages", 320, 2048, 30, "int4", None,
     dict(block_m=32, consumers=4, stages=8, k_split=True, chunks_per_stage=2, consumer_regs=112, producer_regs=24,
          handover="stage")),
    ("two tile rows, 8-bit, kept stages", 192, 1024, 70, "int8", None,
     dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, num_sms=4, handover="stage",
          fit_rows=True, activation_boxes="chunk")),
    ("two tile rows, stage boxes, fit_rows", 320, 1024, 45, "int4", None,
     dict(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, fit_rows=True)),
])
def test_stream_k_matches_the_float64_product(name, N, K, M, fmt, zeros, cfg):
    """Each case has a stream-K tail (pieces written to the workspace, some tiles completed by a CTA other than the
    one that started them). Outputs: poisoned, fully written, within fp16 rounding of the float64 product, within a
    few fp16 ulps of the data-parallel kernel (another summation order), identical on a second launch (the order is
    fixed whoever finishes last); the counters are zero after each launch."""
    cfg = HopperDequantConfig(**{"num_sms": 3, "stream_k_min_chunks": 0, "stream_k_waves": None, **cfg})
    (dp,), ref, _ = _run(cfg, N, K, M, fmt, zeros)
    outs, _, (ws, lk) = _run(dataclasses.replace(cfg, stream_k=True), N, K, M, fmt, zeros, runs=2)
    for C in outs:
        assert not torch.isnan(C).any(), name
        assert ((C.double() - ref).norm() / ref.norm()).item() < 2e-3, name
        assert (C.float() - dp.float()).abs().max().item() <= 0.05, name
    assert torch.equal(outs[0], outs[1])
    assert int(lk.abs().sum()) == 0
    assert (~torch.isnan(ws)).any(), "no piece went through the workspace: the case has no stream-K tail"


def test_stream_k_piece_past_the_first_unit_then_a_ring_wrap():
    """Worker 1 takes the last 3 of tile 3's 8 granules (its first unit is past consumer 0's index), then 2 of tile
    4's. With handover="stage" consumer 0 must still release its last stage of the first piece: the second piece's
    4 stages wrap the 4-stage ring onto it (a release keyed on the unit instead of the consumer deadlocked on the
    H100; the interpreter reports that deadlock)."""
    s = StreamKScheduler(1, 5, 3, 16, 2, 16, 4)
    assert [it[2:4] for it in s.plan(1)[1:]] == [(10, 6), (0, 4)]
    cfg = HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, num_sms=3,
                              handover="stage", stream_k=True, stream_k_min_chunks=0, stream_k_waves=None)
    (C,), ref, (_, lk) = _run(cfg, 320, 2048, 20)
    assert not torch.isnan(C).any() and ((C.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert int(lk.abs().sum()) == 0


def test_stream_k_with_one_granule_per_tile_is_the_data_parallel_kernel():
    """A tile of one k_split round (4 consumers x one 4-chunk stage each at K=1024) cannot be cut: the stream_k
    kernel takes its workspace arguments but runs the whole tiles (the workspace stays untouched)."""
    cfg = HopperDequantConfig(block_m=32, consumers=4, stages=8, k_split=True, chunks_per_stage=4, num_sms=3,
                              consumer_regs=112, producer_regs=24, chunks_per_group=2, stream_k=True)
    (C,), ref, (ws, lk) = _run(cfg, 320, 1024, 20)
    assert not torch.isnan(C).any() and ((C.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert torch.isnan(ws).all() and int(lk.abs().sum()) == 0


def test_stream_k_tail_too_short_to_pay_runs_whole_tiles():
    """The same 5 tiles on 3 CTAs as the cases above, with the default stream_k_min_chunks (48): the busiest CTA
    would save 4 of a tile's 16 chunks (K=1024), so the run-time rule keeps the launch data-parallel (the workspace
    stays untouched, the counters zero) and the result is right."""
    cfg = HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, num_sms=3,
                              stream_k=True, stream_k_waves=None)
    (C,), ref, (ws, lk) = _run(cfg, 320, 1024, 20)
    assert not torch.isnan(C).any() and ((C.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert torch.isnan(ws).all() and int(lk.abs().sum()) == 0


def test_stream_k_config_errors_and_workspace():
    with pytest.raises(UnsupportedConfigError, match="stream_k=1; valid: True, False"):
        make_dequant_gemm_hopper(None, 128, 512, config=HopperDequantConfig(stream_k=1))
    with pytest.raises(UnsupportedConfigError, match="stream_k_min_chunks=-1; valid: an int >= 0"):
        make_dequant_gemm_hopper(None, 128, 512, config=HopperDequantConfig(stream_k=True, stream_k_min_chunks=-1))
    with pytest.raises(UnsupportedConfigError, match="stream_k_waves=1.5; valid: None or an int >= 0"):
        make_dequant_gemm_hopper(None, 128, 512, config=HopperDequantConfig(stream_k=True, stream_k_waves=1.5))
    # the scheduler and the workspace of a config check the same fields
    with pytest.raises(UnsupportedConfigError, match="stream_k_min_chunks=-1; valid: an int >= 0"):
        stream_k_scheduler(HopperDequantConfig(stream_k=True, stream_k_min_chunks=-1), 1, 128, 512)
    with pytest.raises(UnsupportedConfigError, match="stream_k_waves=-2; valid: None or an int >= 0"):
        stream_k_workspace(HopperDequantConfig(stream_k=True, stream_k_waves=-2))
    cfg = HopperDequantConfig(block_m=96, consumers=2, k_split=True, num_sms=132, stream_k=True)
    assert stream_k_workspace(cfg) == (((132, 2, 1, 48, 128), "float32"), ((132, 1), "int32"))
    assert stream_k_workspace(HopperDequantConfig(block_m=256, num_sms=7))[0][0] == (7, 2, 2, 128, 128)
    with pytest.raises(UnsupportedConfigError, match="HopperDequantConfig"):
        stream_k_workspace(dict(block_m=64))


def test_dispatcher_passes_the_stream_k_workspace_on_the_interpreter():
    """``DequantGemm`` with a stream_k config gives the kernel its workspace and counters (fresh on the interpreter;
    on the GPU views of the device's shared scratch), through the plan and by name."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm

    N, K = 320, 1024
    g = torch.Generator().manual_seed(3)
    qw = D.quantize(torch.randn(N, K, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, kw = kernel_arguments(qw)
    cfg = HopperDequantConfig(block_m=32, consumers=2, stages=4, k_split=True, chunks_per_stage=2, num_sms=3,
                              stream_k=True, stream_k_min_chunks=0, stream_k_waves=None)
    dg = DequantGemm(N, K, dtype="float16", arch="sm_90a", interpret=True, configs={"fused32": cfg}, **kw)
    A = torch.randn(24, K, generator=g).half()
    C = dg.run_path("fused32", A, *tensors, out=torch.full((24, N), float("nan"), dtype=torch.float16))
    ref = A.double() @ qw.dequantize().double().T
    assert not torch.isnan(C).any() and ((C.double() - ref).norm() / ref.norm()).item() < 2e-3


@pytest.mark.parametrize("path, M", [("fused48", 40), ("fused96", 70), ("fused256k", 250)])
def test_default_rings_with_stream_k_on_the_interpreter(path, M):
    """The plan's own rings with stream_k, through ``DequantGemm`` on 5 CTAs (512 x 1024 weights: 8 tiles of 64
    rows, so 3 go out in pieces): two chunks per wgmma group (fused48), lookahead with fit_rows (fused96), in_flight 0
    (fused256k)."""
    from mmaemit.kernels.dequant_dispatch import _DEFAULTS, DequantGemm

    g = torch.Generator().manual_seed(M)
    qw = D.quantize(torch.randn(512, 1024, generator=g).half(), D.QuantScheme("int4", 128))
    tensors, kw = kernel_arguments(qw)
    cfg = dataclasses.replace(_DEFAULTS[path], num_sms=5, stream_k=True, stream_k_min_chunks=0,
                              stream_k_waves=None)
    dg = DequantGemm(512, 1024, arch="sm_90a", interpret=True, configs={path: cfg}, **kw)
    x = torch.randn(M, 1024, generator=g).half()
    C = dg.run_path(path, x, *tensors, out=torch.full((M, 512), float("nan"), dtype=torch.float16))
    ref = x.double() @ qw.dequantize().double().T
    assert not torch.isnan(C).any() and ((C.double() - ref).norm() / ref.norm()).item() < 2e-3


# ---------------------------------------------------------------------------------------------------------------------
# the GPU
# ---------------------------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_stream_k_on_the_gpu(dtype):
    """Through ``DequantGemm`` with stream_k on and off: 4096 x 8192 (64 tiles of 64 rows for 132 SMs: every tile in
    pieces) and 1024 x 4096 on fused64 / fused128 / fused256k under the default rule, and 28672 x 4096 (448 tiles: 3
    whole rounds, then the tail in pieces) with the rule lifted. Poisoned outputs within tolerance of the fp32
    product, identical on repeated launches (the scratch's counters return to zero), and as close to the
    data-parallel kernels as their summation orders allow; then a CUDA graph replay."""
    from mmaemit.kernels.dequant_dispatch import DequantGemm
    from mmaemit.runtime.workspace import scratch

    lifted = dict(stream_k_min_chunks=0, stream_k_waves=None)
    shapes = [(4096, 8192, ((64, "fused64"), (100, "fused128"), (250, "fused256k")), {}),
              (1024, 4096, ((128, "fused128"),), {}), (28672, 4096, ((128, "fused128"),), lifted)]
    if dtype == torch.bfloat16:        # the same kernels in the other dtype: one path of each rule
        shapes = [(4096, 8192, ((100, "fused128"),), {}), (28672, 4096, ((128, "fused128"),), lifted)]
    for N, K, cases, rule in shapes:
        torch.manual_seed(N)
        qw = D.quantize(torch.randn(N, K, device="cuda").to(dtype), D.QuantScheme("int4", 128))
        tensors, kw = kernel_arguments(qw)
        tensors = [t.cuda() for t in tensors]
        dense = qw.dequantize().to(dtype).cuda()
        base = DequantGemm(N, K, dtype=str(dtype)[6:], **kw).configs
        plain, sk = (DequantGemm(N, K, dtype=str(dtype)[6:], **kw, configs={
            p: dataclasses.replace(base[p], stream_k=on, **(rule if on else {})) for _, p in cases})
            for on in (False, True))
        for M, path in cases:
            assert stream_k_scheduler(sk.configs[path], -(-M // base[path].block_m), N, K).streamed, (N, K, path)
        for M, path in cases:
            A = torch.randn(M, K, device="cuda").to(dtype)
            ref = A.float() @ dense.float().T
            want = plain.run_path(path, A, *tensors)
            outs = [sk.run_path(path, A, *tensors, out=torch.full((M, N), float("nan"), dtype=dtype, device="cuda"))
                    for _ in range(3)]
            torch.cuda.synchronize()
            for C in outs:
                assert not torch.isnan(C).any(), (N, path)
                assert ((C.float() - ref).norm() / ref.norm()).item() < (3e-3 if dtype == torch.float16 else 1e-2)
                assert torch.equal(C, outs[0]), (N, path)
            assert (outs[0].float() - want.float()).abs().max().item() <= 0.05 * want.float().abs().max().item()
            assert int(scratch("cuda", torch.int32, 1).abs().sum()) == 0
        M, path = cases[0]
        A = torch.randn(M, K, device="cuda").to(dtype)
        C = torch.empty(M, N, device="cuda", dtype=dtype)
        sk.run_path(path, A, *tensors, out=C)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            sk.run_path(path, A, *tensors, out=C)
        C.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref = A.float() @ dense.float().T
        assert not torch.isnan(C).any() and ((C.float() - ref).norm() / ref.norm()).item() < 1e-2
