"""QuantLinear and torch.ops.mmaemit.dequant_linear: from_linear, GPTQ v1/v2 (sym, asym, act-order) and AWQ
checkpoints written as real .safetensors files with this file's own packing code, bad checkpoints, leading dims, bias,
fp16 / bf16, torch.compile(fullgraph=True); on the CPU the exact reference path (and once the interpreter), on the
GPU the kernels, torch.compile with inductor and CUDA-graph capture."""
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from mmaemit import dequant as D
from mmaemit.errors import ArgumentError, TileShapeError
from mmaemit.nn import QuantLinear

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]        # nibble i of an AWQ word holds column 8 w + AWQ_ORDER[i]


# ---------------------------------------------------------------- independent reference packing (numpy, bit by bit)
def _pack_along_rows(q, bits):
    """[R, C] codes -> int32 [R * bits / 32, C]: code (r, c) at bits bits * (r % per) of word (r // per, c)."""
    per = 32 // bits
    R, C = q.shape
    out = np.zeros((R // per, C), np.uint64)
    for j in range(per):
        out |= (q[j::per].astype(np.uint64) & ((1 << bits) - 1)) << np.uint64(bits * j)
    return torch.from_numpy(out.astype(np.uint32).view(np.int32).copy())


def _pack_along_cols(q, bits, order=None):
    """[R, C] codes -> int32 [R, C * bits / 32]: field j of word (r, w) holds column per * w + order[j]."""
    per = 32 // bits
    order = order or list(range(per))
    R, C = q.shape
    out = np.zeros((R, C // per), np.uint64)
    for j in range(per):
        out |= (q[:, order[j]::per].astype(np.uint64) & ((1 << bits) - 1)) << np.uint64(bits * j)
    return torch.from_numpy(out.astype(np.uint32).view(np.int32).copy())


def _random_gptq(N, K, G, bits, seed, act_order=False, sym=False):
    rng = np.random.default_rng(seed)
    q = rng.integers(0, 1 << bits, (K, N))
    groups = K // G
    z = np.full((groups, N), 1 << (bits - 1)) if sym else rng.integers(1, 1 << bits, (groups, N))
    s = (rng.random((groups, N)) * 0.02 + 0.005).astype(np.float16)
    if act_order:
        perm = rng.permutation(K)
        g_idx = np.empty(K, np.int64)
        g_idx[perm] = np.arange(K) // G
    else:
        g_idx = np.arange(K) // G
    w = (q - z[g_idx]) * s.astype(np.float64)[g_idx]          # [K, N]
    return q, z, s, g_idx, torch.from_numpy(w.T.copy())         # reference W [N, K] float64


def _write(tmp_path, tensors, name="model.safetensors"):
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


def _gptq_file(tmp_path, N=128, K=512, G=128, bits=4, version=1, act_order=False, sym=False, bias=False, seed=0):
    q, z, s, g_idx, w = _random_gptq(N, K, G, bits, seed, act_order, sym)
    stored_z = z - 1 if version == 1 else z
    t = {"layer.qweight": _pack_along_rows(q, bits), "layer.qzeros": _pack_along_cols(stored_z, bits),
         "layer.scales": torch.from_numpy(s)}
    if act_order:
        t["layer.g_idx"] = torch.from_numpy(g_idx.astype(np.int32))
    b = None
    if bias:
        b = torch.randn(N, generator=torch.Generator().manual_seed(seed)).half()
        t["layer.bias"] = b
    return _write(tmp_path, t), w, b


def _check_layer(layer, w_ref, bias=None, dtype=torch.float16, lead=(2, 3), device="cpu", tol=None):
    K = w_ref.shape[1]
    x = torch.randn(*lead, K, generator=torch.Generator().manual_seed(5)).to(dtype).to(device)
    y = layer(x)
    assert y.shape == (*lead, w_ref.shape[0]) and y.dtype == dtype
    ref = x.double().cpu() @ w_ref.double().T
    if bias is not None:
        ref = ref + bias.double()
    rel = ((y.double().cpu() - ref).norm() / ref.norm()).item()
    assert rel < (tol or (2e-3 if dtype == torch.float16 else 8e-3)), rel


# ---------------------------------------------------------------- from_linear
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("scheme", ["int4", "uint4", "int8"])
def test_from_linear_matches_dequantize_and_the_fp_linear(dtype, scheme):
    torch.manual_seed(0)
    lin = nn_linear(256, 128, dtype)
    layer = QuantLinear.from_linear(lin, scheme)
    zm = "quantized" if scheme.startswith("uint") else None
    qw = D.quantize(lin.weight.detach(), D.QuantScheme(scheme, 128, zm))       # the same quantizer, independently
    assert torch.equal(layer.dequantized_weight(), qw.dequantize())
    _check_layer(layer, qw.dequantize(), lin.bias.detach(), dtype)
    x = torch.randn(4, 7, 256).to(dtype)
    y, ref = layer(x).float(), lin(x).float()
    rel = ((y - ref).norm() / ref.norm()).item()
    assert rel < (0.12 if scheme.endswith("4") else 0.01), rel        # int4 RTN g128 on random weights: ~7 %


def nn_linear(K, N, dtype, bias=True):
    lin = torch.nn.Linear(K, N, bias=bias)
    return lin.to(dtype)


def test_layer_rejects_wrong_dtype_and_features():
    layer = QuantLinear.from_linear(nn_linear(256, 128, torch.float16), "int4")
    with pytest.raises(ArgumentError, match="holds float16 weights; x is torch.bfloat16"):
        layer(torch.zeros(3, 256, dtype=torch.bfloat16))
    with pytest.raises(ArgumentError, match="takes 256"):
        layer(torch.zeros(3, 128, dtype=torch.float16))
    with pytest.raises(TileShapeError, match="multiple of 64"):
        QuantLinear.from_linear(nn_linear(256, 128, torch.float16), "int4", group_size=32)


@pytest.mark.parametrize("scheme, dtype", [("int4", torch.float16), ("uint4", torch.bfloat16), ("int8", torch.float16)])
def test_concat_is_the_layers_side_by_side(scheme, dtype):
    """concat([q, k, v]): one layer whose output is the parts' outputs side by side (bias missing on one part:
    zeros there), exactly the parts' dequantized weights stacked; on the interpreter through the dequant kernels."""
    torch.manual_seed(1)
    parts = [QuantLinear.from_linear(nn_linear(512, n, dtype, bias=n != 32), scheme) for n in (128, 32, 64)]
    qkv = QuantLinear.concat(parts)
    assert qkv.out_splits == (128, 32, 64) and qkv.out_features == 224 and "concat of [128, 32, 64]" in repr(qkv)
    assert torch.equal(qkv.dequantized_weight(), torch.cat([m.dequantized_weight() for m in parts]))
    x = torch.randn(3, 5, 512).to(dtype)
    ys = qkv(x).split(qkv.out_splits, -1)
    for y, m in zip(ys, parts):
        assert torch.equal(y, m(x))             # the reference op computes each part the same way
    bias = torch.cat([m.bias if m.bias is not None else torch.zeros(32, dtype=dtype) for m in parts]).float()
    _check_layer(qkv, qkv.dequantized_weight(), bias, dtype)
    nested = QuantLinear.concat([qkv, parts[0]])
    assert nested.out_splits == (128, 32, 64, 128)


def test_concat_on_the_interpreter(monkeypatch):
    parts = [QuantLinear.from_linear(nn_linear(512, n, torch.float16), "int4") for n in (64, 64)]
    gate_up = QuantLinear.concat(parts)
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    _check_layer(gate_up, gate_up.dequantized_weight(), gate_up.bias.float(), lead=(3,))


def test_concat_refuses_layers_that_do_not_share_an_input():
    a = QuantLinear.from_linear(nn_linear(256, 64, torch.float16), "int4")
    with pytest.raises(ArgumentError, match="one in_features"):
        QuantLinear.concat([a, QuantLinear.from_linear(nn_linear(512, 64, torch.float16), "int4")])
    with pytest.raises(ArgumentError, match="one weight_format"):
        QuantLinear.concat([a, QuantLinear.from_linear(nn_linear(256, 64, torch.float16), "int8")])
    with pytest.raises(ArgumentError, match="one group_size"):
        QuantLinear.concat([a, QuantLinear.from_linear(nn_linear(256, 64, torch.float16), "int4", group_size=64)])
    with pytest.raises(ArgumentError, match="one dtype"):
        QuantLinear.concat([a, QuantLinear.from_linear(nn_linear(256, 64, torch.bfloat16), "int4")])
    with pytest.raises(ArgumentError, match="non-empty list of QuantLinear"):
        QuantLinear.concat([a, nn_linear(256, 64, torch.float16)])
    with pytest.raises(ArgumentError, match="non-empty list"):
        QuantLinear.concat([])


def test_concat_of_act_order_layers(tmp_path):
    """GPTQ act-order parts: one permutation shared (the same g_idx) concatenates; different ones are refused."""
    path, w, b = _gptq_file(tmp_path, N=128, K=512, act_order=True, bias=True, seed=3)
    g1 = QuantLinear.from_gptq_safetensors(path, "layer")
    g2 = QuantLinear.from_gptq_safetensors(path, "layer")
    both = QuantLinear.concat([g1, g2])
    _check_layer(both, torch.cat([w, w]), torch.cat([b, b]).float())
    path2, _, _ = _gptq_file(tmp_path, N=128, K=512, act_order=True, seed=4)
    other = QuantLinear.from_gptq_safetensors(path2, "layer")
    assert not torch.equal(other.perm, g1.perm)
    with pytest.raises(ArgumentError, match="act-order permutation"):
        QuantLinear.concat([g1, other])
    with pytest.raises(ArgumentError, match="act-order permutation"):
        QuantLinear.concat([g1, QuantLinear.from_linear(nn_linear(512, 64, torch.float16), "uint4")])


# ---------------------------------------------------------------- GPTQ / AWQ checkpoints
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_safetensors(tmp_path, version, act_order):
    path, w, b = _gptq_file(tmp_path, version=version, act_order=act_order, bias=True, seed=version + 2 * act_order)
    layer = QuantLinear.from_gptq_safetensors(path, "layer", version=version)
    assert (layer.perm is not None) == act_order
    assert torch.allclose(layer.dequantized_weight().double(), w, rtol=0, atol=0)
    _check_layer(layer, w, b)


def test_gptq_sym_8bit_and_bf16(tmp_path):
    path, w, _ = _gptq_file(tmp_path, bits=8, sym=True, G=256)
    layer = QuantLinear.from_gptq_safetensors(path, "layer", bits=8, sym=True, dtype=torch.bfloat16)
    assert layer.weight_format == "int8_ob" and layer.zeros is None and layer.group_size == 256
    _check_layer(layer, w, dtype=torch.bfloat16, tol=1.5e-2)


def test_gptq_v1_is_not_v2(tmp_path):
    """Reading a v1 file as v2 gives a different (wrong) weight: the loader does not ignore the version."""
    path, w, _ = _gptq_file(tmp_path, version=1)
    v2 = QuantLinear.from_gptq_safetensors(path, "layer", version=2)
    assert not torch.allclose(v2.dequantized_weight().double(), w)


def test_awq_safetensors(tmp_path):
    N, K, G = 128, 512, 128
    q, z, s, _, w = _random_gptq(N, K, G, 4, seed=11)
    b = torch.randn(N).half()
    path = _write(tmp_path, {"m.qweight": _pack_along_cols(q, 4, AWQ_ORDER),
                             "m.qzeros": _pack_along_cols(z, 4, AWQ_ORDER), "m.scales": torch.from_numpy(s),
                             "m.bias": b})
    layer = QuantLinear.from_awq_safetensors(path, "m")
    assert torch.equal(layer.dequantized_weight().double(), w)
    _check_layer(layer, w, b, lead=(5,))
    # the plain (GPTQ-style, unordered) packing is a different weight: the order matters
    wrong = _write(tmp_path, {"m.qweight": _pack_along_cols(q, 4), "m.qzeros": _pack_along_cols(z, 4, AWQ_ORDER),
                              "m.scales": torch.from_numpy(s)}, "wrong.safetensors")
    assert not torch.equal(QuantLinear.from_awq_safetensors(wrong, "m").dequantized_weight().double(), w)


def _bad(tmp_path, edit):
    path, _, _ = _gptq_file(tmp_path, act_order=True)
    from safetensors.torch import load_file

    t = load_file(str(path))
    edit(t)
    return t


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.pop("layer.scales"), "no tensor 'layer.scales'"),
    (lambda t: t.__setitem__("layer.qweight", t["layer.qweight"].float()), "'layer.qweight' must have dtype 'int32', got float32"),
    (lambda t: t.__setitem__("layer.qzeros", t["layer.qzeros"][:, :-1]), "'layer.qzeros' has shape"),
    (lambda t: t.__setitem__("layer.scales", t["layer.scales"][:3]), "'layer.scales' has 3 groups, which do not"),
    (lambda t: t.__setitem__("layer.g_idx", t["layer.g_idx"][:-1]), "'layer.g_idx' has shape"),
    (lambda t: t.__setitem__("layer.g_idx", torch.zeros_like(t["layer.g_idx"])), "'layer.g_idx' must give every"),
    (lambda t: t.__setitem__("layer.bias", torch.zeros(7).half()), "'layer.bias' has shape"),
])
def test_bad_gptq_checkpoints_name_the_tensor(tmp_path, edit, match):
    with pytest.raises((ArgumentError, TileShapeError), match=match):
        QuantLinear.from_gptq_safetensors(_bad(tmp_path, edit), "layer")


def test_group_size_must_divide_k(tmp_path):
    path, _, _ = _gptq_file(tmp_path)
    with pytest.raises(TileShapeError, match="group_size=96 does not divide K=512"):
        QuantLinear.from_gptq_safetensors(path, "layer", group_size=96)
    with pytest.raises(TileShapeError, match="'layer.scales' has 4 groups but K=512 / group_size=256"):
        QuantLinear.from_gptq_safetensors(path, "layer", group_size=256)
    with pytest.raises(ArgumentError, match="no tensor 'other.qweight'"):
        QuantLinear.from_gptq_safetensors(path, "other")


# ---------------------------------------------------------------- torch.compile / interpreter (CPU)
def test_torch_compile_fullgraph_traces_the_op():
    layer = QuantLinear.from_linear(nn_linear(256, 128, torch.float16), "int4")
    x = torch.randn(2, 5, 256).half()
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")     # fake tensors through register_fake
    assert torch.equal(compiled(x), layer(x))
    torch._dynamo.reset()


def test_layer_on_the_interpreter(monkeypatch):
    """MMAEMIT_INTERPRET=1: the layer's CPU calls run the dequant kernels on the interpreter (not the reference)."""
    from mmaemit.nn import ops

    layer = QuantLinear.from_linear(nn_linear(512, 128, torch.float16), "int4")
    w = layer.dequantized_weight()
    monkeypatch.setenv("MMAEMIT_INTERPRET", "1")
    calls = []
    real = ops.dequant_linear_reference
    monkeypatch.setattr(ops, "dequant_linear_reference", lambda *a: calls.append(1) or real(*a))
    _check_layer(layer, w, layer.bias.float(), lead=(3,))
    assert not calls


# ---------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.heavy
def test_gpu_quant_mlp_compile_graph_and_ragged_m(tmp_path):
    """A small quantized MLP on the GPU: ragged M (each path compiled on first use), torch.compile (inductor,
    fullgraph) and a CUDA graph replay, each against the exact dequantized weights; a GPTQ act-order checkpoint
    repacked on the GPU."""
    torch.manual_seed(0)
    # no warmup(): each path compiles on first use (the warmed, compile-free calls are the dispatcher's GPU test)
    up = QuantLinear.from_linear(nn_linear(1024, 2048, torch.float16).cuda(), "int4")
    down = QuantLinear.from_linear(nn_linear(2048, 1024, torch.float16).cuda(), "int4")
    wu, wd = up.dequantized_weight().cuda(), down.dequantized_weight().cuda()

    def mlp(x):
        return down(torch.nn.functional.silu(up(x)))

    def ref(x):
        h = (x.float() @ wu.T + up.bias.float()).half()
        return torch.nn.functional.silu(h).float() @ wd.T + down.bias.float()

    for lead in ((1,), (7,), (3, 11), (257,), (2, 500)):
        x = torch.randn(*lead, 1024, device="cuda").half()
        y = mlp(x)
        r = ref(x)
        assert y.shape == (*lead, 1024) and not torch.isnan(y).any()
        assert ((y.float() - r).norm() / r.norm()).item() < 5e-3, lead
    compiled = torch.compile(mlp, fullgraph=True)
    x = torch.randn(4, 1024, device="cuda").half()
    assert ((compiled(x).float() - ref(x)).norm() / ref(x).norm()).item() < 5e-3
    static = torch.randn(33, 1024, device="cuda").half()
    mlp(static)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = mlp(static)
    static.copy_(torch.randn(33, 1024, device="cuda").half())
    graph.replay()
    torch.cuda.synchronize()
    assert ((out.float() - ref(static)).norm() / ref(static).norm()).item() < 5e-3
    path, w, b = _gptq_file(tmp_path, N=256, K=1024, act_order=True, bias=True)
    g = QuantLinear.from_gptq_safetensors(path, "layer", device="cuda")
    assert g.qweight.is_cuda and g.perm is not None
    _check_layer(g, w, b, lead=(2, 9), device="cuda")
