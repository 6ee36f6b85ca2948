"""Gated (SwiGLU / GeGLU) dequant GEMM: the GEMV's gate epilogue on the interpreter, DequantGemm(gated=...) on every
path kind, QuantGatedLinear against act(gate(x)) * up(x) from the exactly dequantized weights (CPU reference,
interpreter, torch.compile), bad inputs; on the GPU ragged M, the kernels and a CUDA-graph replay."""
import pytest
import torch

import mmaemit
from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError
from mmaemit.kernels.dequant_dispatch import DequantGemm
from mmaemit.kernels.dequant_gemm import GemvConfig, make_dequant_gemv
from mmaemit.kernels.gated import gate_torch, interleave_gated, split_gated
from mmaemit.nn import QuantGatedLinear, QuantLinear


def _pair(N, K, fmt, zeros, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    qg, qu = (D.quantize(torch.randn(N, K, generator=g).to(dtype), D.QuantScheme(fmt, 128, zeros)) for _ in range(2))
    (tg, kw), (tu, _) = kernel_arguments(qg), kernel_arguments(qu)
    return qg, qu, [interleave_gated(a, b) for a, b in zip(tg, tu)], kw, g


def _ref(act, A, qg, qu):
    return gate_torch(act, A.double() @ qg.dequantize().double().T, A.double() @ qu.dequantize().double().T).double()


def _rel(C, ref):
    return ((C.double().cpu() - ref).norm() / ref.norm()).item()


def test_interleave_and_split_are_inverse():
    a, b = torch.arange(4 * 3).reshape(4, 3), 100 + torch.arange(4 * 3).reshape(4, 3)
    both = interleave_gated(a, b)
    assert torch.equal(both[0::2], a) and torch.equal(both[1::2], b)
    y = torch.randn(5, 64)
    g, u = split_gated(y)
    assert torch.equal(g, torch.cat([y[:, 0:16], y[:, 32:48]], 1)) and torch.equal(u, torch.cat([y[:, 16:32],
                                                                                                  y[:, 48:64]], 1))
    with pytest.raises(ArgumentError, match="must match in shape"):
        interleave_gated(a, b[:3])
    with pytest.raises(TileShapeError, match="multiple of 32"):
        split_gated(torch.zeros(2, 48))


@pytest.mark.parametrize("act, fmt, zeros, dtype, m_max, M", [
    ("silu", "int4", None, torch.float16, 8, 3), ("gelu_tanh", "uint4", "quantized", torch.bfloat16, 16, 11),
    ("silu", "int2", None, torch.bfloat16, 32, 21)])
def test_gemv_gate_epilogue_on_the_interpreter(act, fmt, zeros, dtype, m_max, M):
    """The GEMV sums each gate / up block pair over its K slices and writes act(gate) * up, [M, N / 2]."""
    N, K = 64, 512
    qg, qu, tensors, kw, g = _pair(N, K, fmt, zeros, dtype, M)
    A = torch.randn(M, K, generator=g).to(dtype)
    func, _ = make_dequant_gemv(None, 2 * N, K, dtype=str(dtype)[6:], arch="sm_90a", m_max=m_max, gated=act,
                                config=GemvConfig(n_blocks=2, k_slices=2, stages=3), **kw)
    C = torch.full((M, N), float("nan"), dtype=dtype)
    assert mmaemit.interpret(func, A, *tensors, C, arch="sm_90a").ok
    assert not torch.isnan(C).any()
    assert _rel(C, _ref(act, A, qg, qu)) < (2e-3 if dtype == torch.float16 else 8e-3)


def test_gated_gemv_and_dispatcher_reject_bad_arguments():
    with pytest.raises(UnsupportedConfigError, match="n_blocks must be even"):
        make_dequant_gemv(1, 128, 1024, config=GemvConfig(n_blocks=1), gated="silu")
    with pytest.raises(UnsupportedConfigError, match="gated must be one of 'gelu_tanh', 'silu'"):
        make_dequant_gemv(1, 128, 1024, gated="relu")
    with pytest.raises(TileShapeError, match="multiple of 32"):
        DequantGemm(48, 1024, arch="sm_90a", gated="silu")


def test_dispatcher_gates_every_path_kind_on_the_interpreter():
    """gemv8 / gemv16 gate in their epilogue; gemv32 (n_blocks 1) and dense_mid gate the full product with torch."""
    N, K = 64, 1024
    qg, qu, tensors, kw, g = _pair(N, K, "int4", None, torch.float16, 7)
    dg = DequantGemm(2 * N, K, dtype="float16", arch="sm_90a", interpret=True, gated="silu", fused=False, **kw)
    assert "gated silu" in repr(dg)
    for M, path, in_kernel in ((1, "gemv8", True), (12, "gemv16", True), (20, "gemv32", False),
                               (40, "dense_mid", False)):
        assert dg.path_for(M) == path and dg.gates_in_kernel(path) == in_kernel
        A = torch.randn(M, K, generator=g).half()
        C = dg(A, *tensors)
        assert C.shape == (M, N) and _rel(C, _ref("silu", A, qg, qu)) < 2e-3, (M, path)


def _layers(dtype, bias, fmt="int4", K=512, N=128, seed=0):
    torch.manual_seed(seed)
    lins = [torch.nn.Linear(K, N, bias=bias).to(dtype) for _ in range(2)]
    return lins, [QuantLinear.from_linear(lin, fmt) for lin in lins]


@pytest.mark.parametrize("act, dtype, bias, fmt", [("silu", torch.float16, False, "int4"),
                                                   ("gelu_tanh", torch.bfloat16, True, "uint4"),
                                                   ("silu", torch.bfloat16, True, "int8")])
def test_gated_layer_is_act_of_gate_times_up(act, dtype, bias, fmt):
    """QuantGatedLinear(x) = act(gate(x)) * up(x) of the two QuantLinear layers (reference path on the CPU), any
    leading dims, bias before the gate."""
    _, (gate, up) = _layers(dtype, bias, fmt)
    layer = QuantGatedLinear.from_layers(gate, up, act)
    assert "act=" + act in repr(layer) and layer.out_features == 128
    x = torch.randn(2, 3, 512).to(dtype)
    y = layer(x)
    assert y.shape == (2, 3, 128) and y.dtype == dtype
    wg, wu = gate.dequantized_weight().double(), up.dequantized_weight().double()
    hg, hu = x.double() @ wg.T, x.double() @ wu.T
    if bias:
        hg, hu = hg + gate.bias.double(), hu + up.bias.double()
    ref = gate_torch(act, hg, hu).double()
    assert _rel(y, ref) < (2e-3 if dtype == torch.float16 else 8e-3)


def test_gated_layer_from_linears_on_the_interpreter(monkeypatch):
    """MMAEMIT_INTERPRET=1: the layer runs the gated kernels (no reference), at a GEMV M and above."""
    from mmaemit.nn import ops

    lins, (gate, up) = _layers(torch.float16, False)
    layer = QuantGatedLinear.from_linears(*lins, "int4")
    assert torch.equal(layer.qweight, interleave_gated(gate.qweight, up.qweight))
    wg, wu = gate.dequantized_weight().double(), up.dequantized_weight().double()
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    calls = []
    real = ops.dequant_gated_linear_reference
    monkeypatch.setattr(ops, "dequant_gated_linear_reference", lambda *a: calls.append(1) or real(*a))
    for lead in ((3,), (20,)):
        x = torch.randn(*lead, 512).half()
        ref = gate_torch("silu", x.double() @ wg.T, x.double() @ wu.T).double()
        assert _rel(layer(x), ref) < 2e-3, lead
    assert not calls


def test_gated_layer_compiles_and_rejects_bad_pairs():
    _, (gate, up) = _layers(torch.float16, False)
    layer = QuantGatedLinear.from_layers(gate, up)
    x = torch.randn(4, 512).half()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")     # fake tensors through register_fake
    assert torch.equal(compiled(x), layer(x))
    torch._dynamo.reset()
    _, (other, _) = _layers(torch.float16, False, N=64)
    with pytest.raises(ArgumentError, match="share out_features"):
        QuantGatedLinear.from_layers(gate, other)
    _, (g8, _) = _layers(torch.float16, False, fmt="int8")
    with pytest.raises(ArgumentError, match="share weight_format"):
        QuantGatedLinear.from_layers(gate, g8)
    with pytest.raises(ArgumentError, match="two QuantLinear"):
        QuantGatedLinear.from_layers(gate, torch.nn.Linear(512, 128))
    with pytest.raises(UnsupportedConfigError, match="'gelu_tanh', 'silu' or None, not 'relu'"):
        QuantGatedLinear.from_layers(gate, up, "relu")
    with pytest.raises(ArgumentError, match="holds float16 weights"):
        layer(torch.zeros(2, 512, dtype=torch.bfloat16))


@pytest.mark.gpu
def test_gpu_gated_layer_ragged_m_and_cuda_graph():
    """On the GPU: the gated layer at ragged M (GEMV epilogue at M <= 16, torch gate above) against the exact
    dequantized weights, and a CUDA-graph replay at M=1."""
    torch.manual_seed(3)
    lins = [torch.nn.Linear(1024, 512, bias=False).half().cuda() for _ in range(2)]
    layer = QuantGatedLinear.from_linears(*lins, "int4").warmup(workers=4)     # 4 build processes under -n 8
    gate, up = (QuantLinear.from_linear(lin, "int4") for lin in lins)
    wg, wu = gate.dequantized_weight().cuda().double(), up.dequantized_weight().cuda().double()
    for M in (1, 7, 16, 33, 300):
        x = torch.randn(M, 1024, device="cuda").half()
        y = layer(x)
        ref = gate_torch("silu", x.double() @ wg.T, x.double() @ wu.T).double()
        assert y.shape == (M, 512) and not torch.isnan(y).any()
        assert _rel(y, ref.cpu()) < 2e-3, M
    static = torch.randn(1, 1024, device="cuda").half()
    layer(static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(static)
    static.copy_(torch.randn(1, 1024, device="cuda").half())
    graph.replay()
    torch.cuda.synchronize()
    ref = gate_torch("silu", static.double() @ wg.T, static.double() @ wu.T).double()
    assert _rel(out, ref.cpu()) < 2e-3
