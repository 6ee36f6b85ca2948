"""``QuantLinear``: a weight-only quantized ``nn.Linear`` on the dequant GEMM (:mod:`mmaemit.nn.ops`).

Made from an fp16 / bf16 ``nn.Linear`` (``from_linear``, quantized by :func:`mmaemit.dequant.quantize`), a
:class:`~mmaemit.dequant.QuantizedWeight` (``from_quantized``), or a GPTQ / AWQ checkpoint read with the
``safetensors`` package (``from_gptq_safetensors``, ``from_awq_safetensors``; a file path or an already loaded
``{name: tensor}`` dict). The weight is repacked once, at load, into the kernel layout on the target device; GPTQ
act-order weights (a ``g_idx`` that is not ``k // group_size``) are permuted along K at load so the groups are
contiguous, and the layer permutes the activations' K axis the same way (one ``index_select`` per call).

``forward(x)``: x [..., K] in the layer's dtype (float16 or bfloat16), any leading dims; y [..., N] (+ bias).

``QuantLinear.concat([q, k, v])`` stacks layers that read the same input (same K, format, group, zero-point mode,
dtype, device and act-order permutation) into one layer whose N is the sum (the kernel layout is blocked by 16
output rows, so the buffers concatenate as they are): one kernel launch instead of several, and a grid the GPU can
fill where a single small projection (e.g. k / v 4096 -> 1024 at M=1) cannot. ``out_splits`` records the parts:
``q, k, v = layer(x).split(layer.out_splits, -1)``.

``QuantGatedLinear.from_layers(gate, up, act="silu")`` is the gated counterpart for a SwiGLU / GeGLU MLP's gate and
up projections: y = act(gate(x)) * up(x) from one GEMM over the two weights interleaved by 16 rows, the gate applied
in the GEMV's epilogue at M <= 16.
"""
from __future__ import annotations

import torch
from torch import nn

from mmaemit.dequant import (QuantizedWeight, QuantScheme, act_order_permutation, from_awq, from_gptq, quantize,
                             unpack_zeros)
from mmaemit.dequant.kernel_layout import KERNEL_FORMATS, to_kernel_layout, to_kernel_scales
from mmaemit.dequant.packing import pack, unpack
from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError, choices

from . import ops

__all__ = ["QuantLinear", "QuantGatedLinear", "warmup"]

_DTYPES = {torch.float16: "float16", torch.bfloat16: "bfloat16"}


def _checkpoint(path_or_dict):
    if isinstance(path_or_dict, dict):
        return path_or_dict
    from safetensors.torch import load_file

    return load_file(str(path_or_dict))


def _tensor(ckpt, prefix, name, dtypes, ndim):
    key = f"{prefix}.{name}" if prefix else name
    if key not in ckpt:
        near = sorted(k for k in ckpt if k.startswith(prefix))[:8] if prefix else sorted(ckpt)[:8]
        raise ArgumentError(f"checkpoint has no tensor {key!r} (tensors under {prefix!r}: {near})")
    t = ckpt[key]
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{key!r} must be a torch tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise ArgumentError(f"{key!r} must have dtype {choices(str(d).replace('torch.', '') for d in dtypes)}, "
                            f"got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != ndim:
        raise ArgumentError(f"{key!r} must be {ndim}-D, got shape {list(t.shape)}")
    return key, t


def _shape(key, t, want):
    if list(t.shape) != list(want):
        raise ArgumentError(f"{key!r} has shape {list(t.shape)}, expected {list(want)}")


def _group(key_scales, groups, K, group_size):
    """The group size: from the scales' rows, checked against ``group_size`` when given."""
    if group_size is None:
        if groups < 1 or K % groups:
            raise TileShapeError(f"{key_scales!r} has {groups} groups, which do not divide K={K}")
        return K // groups
    g = K if group_size == -1 else group_size
    if not isinstance(g, int) or g <= 0 or K % g:
        raise TileShapeError(f"group_size={group_size} does not divide K={K} (K from the packed weight)")
    if K // g != groups:
        raise TileShapeError(f"{key_scales!r} has {groups} groups but K={K} / group_size={g} = {K // g}")
    return g


def _scales_and_zeros(ck, prefix, kq, K, N, bits, group_size):
    """GPTQ and AWQ alike: ``.scales`` float [G, N] and ``.qzeros`` int32 [G, N * bits / 32]; returns them and the
    group size (from the scales when ``group_size`` is None). ``kq``: the qweight key N came from."""
    ks, scales = _tensor(ck, prefix, "scales", (torch.float16, torch.bfloat16, torch.float32), 2)
    if scales.shape[1] != N:
        raise ArgumentError(f"{ks!r} has shape {list(scales.shape)}: its columns must be N={N} (from {kq!r})")
    G = _group(ks, scales.shape[0], K, group_size)
    kz, qzeros = _tensor(ck, prefix, "qzeros", (torch.int32,), 2)
    _shape(kz, qzeros, [K // G, N * bits // 32])
    return scales, qzeros, G


def _flat_input(layer, x):
    """(leading dims, x as a contiguous [M, K] in the layer's K order) after checking x's dtype and features."""
    if x.dtype != layer.dtype:
        raise ArgumentError(f"{type(layer).__name__} holds {_DTYPES[layer.dtype]} weights; x is {x.dtype} (convert x, "
                            f"or build the layer with dtype={x.dtype})")
    if x.shape[-1] != layer.in_features:
        raise ArgumentError(f"x has {x.shape[-1]} features in its last dim, the layer takes {layer.in_features}")
    x2 = x.reshape(-1, layer.in_features)
    if layer.perm is not None:
        x2 = x2.index_select(1, layer.perm)
    return x.shape[:-1], x2.contiguous()


def _same_permutation(p, q):
    """Whether two act-order permutations (or None) are the same."""
    return (p is None) == (q is None) and (p is None or torch.equal(p, q))


def _dequantized_weight(layer):
    """A layer's kernel-layout weight dequantized exactly (float32, CPU), in the original K order."""
    w = ops.dequantized_weight(layer.qweight, layer.scales, layer.zeros, layer.group_size, layer.weight_format,
                               layer.zeros_mode or "").float()
    if layer.perm is not None:
        out = torch.empty_like(w)
        out[:, layer.perm.cpu()] = w
        w = out
    return w


class QuantLinear(nn.Module):
    """``y = x @ dequant(W)^T + bias`` with the weight in the dequant kernels' layout (see the module doc).

    Buffers: ``qweight`` int32 [N/16, K/64, 32, b], ``scales`` [N/16, K/G, 4, 4] (layer dtype), ``zeros`` (zero
    points, or None), ``bias`` [N] (or None), ``perm`` int64 [K] (act-order, or None)."""

    def __init__(self, in_features: int, out_features: int, *, group_size: int, weight_format: str,
                 zeros_mode=None, dtype=torch.float16):
        super().__init__()
        if dtype not in _DTYPES:
            raise UnsupportedConfigError(f"dtype must be one of {choices(_DTYPES.values())}, not {dtype}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.group_size, self.weight_format, self.zeros_mode = int(group_size), weight_format, zeros_mode
        self.dtype = dtype
        for name in ("qweight", "scales", "zeros", "bias", "perm"):
            self.register_buffer(name, None)
        #: output features of the layers ``concat`` stacked, in order (one entry for a layer built otherwise)
        self.out_splits = (self.out_features,)

    # -------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_quantized(cls, qw: QuantizedWeight, bias=None, *, dtype=torch.float16, device=None) -> "QuantLinear":
        """Repack a QuantizedWeight [N, K] (act-order allowed) once into the kernel layout on ``device``."""
        if dtype not in _DTYPES:
            raise UnsupportedConfigError(f"dtype must be one of {choices(_DTYPES.values())}, not {dtype}")
        N, K = qw.shape
        scheme = qw.scheme
        if scheme.group_size is None:
            raise UnsupportedConfigError("QuantLinear needs scaled weights (group_size -1 or a group size)")
        G = K if scheme.group_size in (-1, K) else scheme.group_size
        if N % 16 or K % 64 or G % 64:
            raise TileShapeError(f"the dequant kernels need N % 16 == 0, K % 64 == 0 and a group size that is a "
                                 f"multiple of 64 (or -1); got N={N}, K={K}, group_size={scheme.group_size}")
        device = torch.device(device) if device is not None else torch.device("cpu")
        perm = None
        if qw.g_idx is not None:
            g_idx = torch.as_tensor(qw.g_idx).to(torch.int64).cpu()
            if not torch.equal(g_idx, torch.arange(K) // G):
                perm = act_order_permutation(g_idx, G)
            codes = unpack(torch.as_tensor(qw.packed), scheme.bits, axis=-1)
            if perm is not None:
                codes = codes[:, perm.to(codes.device)]
            qw = QuantizedWeight(pack(codes, scheme.bits, -1, "int32"), qw.scales, qw.zeros, None,
                                 QuantScheme(scheme.format, scheme.group_size, scheme.zeros_mode), (N, K))
        if scheme.format not in KERNEL_FORMATS:
            raise UnsupportedConfigError(f"the dequant kernels take {choices(KERNEL_FORMATS)} weights, not "
                                         f"{scheme.format!r}")
        qw = qw.to(device)           # repack on the target device (the GPU where there is one)
        mode = scheme.zeros_mode
        layer = cls(K, N, group_size=G, weight_format=scheme.format, zeros_mode=mode, dtype=dtype)
        layer.qweight = (to_kernel_layout(qw.codes(), scheme.bits).contiguous())
        layer.scales = (to_kernel_scales(torch.as_tensor(qw.scales).to(dtype)).contiguous())
        z = None
        if mode == "quantized":
            z = to_kernel_scales(unpack_zeros(qw.zeros, scheme.bits).to(torch.int16)).contiguous()
        elif mode is not None:
            z = to_kernel_scales(torch.as_tensor(qw.zeros).to(dtype)).contiguous()
        layer.zeros = z
        if bias is not None:
            b = torch.as_tensor(bias)
            if tuple(b.shape) != (N,):
                raise ArgumentError(f"bias must have shape [{N}], got {list(b.shape)}")
            bias = b.to(device=device, dtype=dtype).contiguous()
        layer.bias = bias
        layer.perm = None if perm is None else perm.to(device)
        return layer

    @classmethod
    def from_linear(cls, linear: nn.Linear, scheme="int4", *, group_size=128, dtype=None,
                    device=None) -> "QuantLinear":
        """Quantize an ``nn.Linear`` (round-to-nearest, :func:`mmaemit.dequant.quantize`). ``scheme``: a
        QuantScheme or a format name (then ``group_size``; unsigned formats get "quantized" zero points)."""
        if not isinstance(linear, nn.Linear):
            raise ArgumentError(f"from_linear takes an nn.Linear, got {type(linear).__name__}")
        if isinstance(scheme, str):
            from mmaemit.dequant.formats import get_format

            zm = "quantized" if get_format(scheme).kind == "uint" else None
            scheme = QuantScheme(scheme, group_size, zm)
        w = linear.weight.detach()
        dtype = dtype or (w.dtype if w.dtype in _DTYPES else torch.float16)
        qw = quantize(w.to(dtype), scheme)
        b = None if linear.bias is None else linear.bias.detach()
        return cls.from_quantized(qw, b, dtype=dtype, device=device if device is not None else w.device)

    @classmethod
    def from_gptq_safetensors(cls, path_or_dict, prefix: str, *, bits: int = 4, group_size=None, sym: bool = False,
                              version: int = 1, dtype=torch.float16, device=None) -> "QuantLinear":
        """Load ``{prefix}.qweight`` int32 [K*b/32, N], ``.qzeros`` int32 [G, N*b/32], ``.scales`` [G, N], optional
        ``.g_idx`` int32 [K] (act-order) and ``.bias`` [N] (GPTQ v1: zeros stored minus 1; v2: as is).
        ``group_size`` None: K / G from the scales."""
        ck = _checkpoint(path_or_dict)
        if bits not in (2, 4, 8):
            raise UnsupportedConfigError(f"GPTQ bits={bits}; valid: 2, 4, 8")
        kq, qweight = _tensor(ck, prefix, "qweight", (torch.int32,), 2)
        K, N = qweight.shape[0] * 32 // bits, qweight.shape[1]
        scales, qzeros, G = _scales_and_zeros(ck, prefix, kq, K, N, bits, group_size)
        g_idx = None
        kg = f"{prefix}.g_idx" if prefix else "g_idx"
        if kg in ck:
            kg, g_idx = _tensor(ck, prefix, "g_idx", (torch.int32, torch.int64), 1)
            _shape(kg, g_idx, [K])
            gi = g_idx.to(torch.int64)
            if int(gi.min()) < 0 or int(gi.max()) >= K // G or \
                    bool((torch.bincount(gi, minlength=K // G) != G).any()):
                raise ArgumentError(f"{kg!r} must give every one of the {K // G} groups exactly {G} columns")
        bias = cls._bias(ck, prefix, N)
        dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        t = [x.to(dev) for x in (qweight, qzeros, scales)]
        qw = from_gptq(t[0], t[1], t[2], None if g_idx is None else g_idx.to(dev), bits=bits,
                       group_size=G if G != K else -1, sym=sym, version=version)
        return cls.from_quantized(qw, bias, dtype=dtype, device=dev)

    @classmethod
    def from_awq_safetensors(cls, path_or_dict, prefix: str, *, bits: int = 4, group_size=None,
                             dtype=torch.float16, device=None) -> "QuantLinear":
        """Load AutoAWQ GEMM tensors ``{prefix}.qweight`` int32 [K, N/8], ``.qzeros`` int32 [G, N/8],
        ``.scales`` [G, N] and optional ``.bias`` [N] (packing order: :data:`mmaemit.dequant.AWQ_PACK_ORDER`)."""
        ck = _checkpoint(path_or_dict)
        if bits != 4:
            raise UnsupportedConfigError(f"AWQ bits={bits}; valid: 4")
        kq, qweight = _tensor(ck, prefix, "qweight", (torch.int32,), 2)
        K, N = qweight.shape[0], qweight.shape[1] * 32 // bits
        scales, qzeros, G = _scales_and_zeros(ck, prefix, kq, K, N, bits, group_size)
        bias = cls._bias(ck, prefix, N)
        dev = device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu")
        qw = from_awq(qweight.to(dev), qzeros.to(dev), scales.to(dev), bits=bits, group_size=G if G != K else -1)
        return cls.from_quantized(qw, bias, dtype=dtype, device=dev)

    @classmethod
    def concat(cls, layers) -> "QuantLinear":
        """One layer computing ``torch.cat([l(x) for l in layers], -1)`` in one launch (see the module doc). Every
        layer must share in_features, weight_format, group_size, zeros_mode, dtype, device and act-order
        permutation; a missing bias counts as zeros where another layer has one. ``out_splits`` of the result lists
        each part's out_features."""
        layers = list(layers)
        if not layers or not all(isinstance(m, QuantLinear) for m in layers):
            raise ArgumentError(f"concat takes a non-empty list of QuantLinear layers, got "
                                f"{[type(m).__name__ for m in layers]}")
        first = layers[0]
        for attr in ("in_features", "weight_format", "group_size", "zeros_mode", "dtype"):
            vals = [getattr(m, attr) for m in layers]
            if any(v != vals[0] for v in vals):
                raise ArgumentError(f"concat needs layers with one {attr}; got {vals}")
        devices = {m.qweight.device for m in layers}
        if len(devices) > 1:
            raise ArgumentError(f"concat needs layers on one device; got {sorted(map(str, devices))}")
        if not all(_same_permutation(m.perm, first.perm) for m in layers):
            raise ArgumentError("concat needs one act-order permutation for all layers (the activations are permuted "
                                "once per call); these layers' g_idx orders differ")
        out = cls(first.in_features, sum(m.out_features for m in layers), group_size=first.group_size,
                  weight_format=first.weight_format, zeros_mode=first.zeros_mode, dtype=first.dtype)
        out.qweight = torch.cat([m.qweight for m in layers])
        out.scales = torch.cat([m.scales for m in layers])
        out.zeros = None if first.zeros is None else torch.cat([m.zeros for m in layers])
        if any(m.bias is not None for m in layers):
            out.bias = torch.cat([m.bias if m.bias is not None else
                                  torch.zeros(m.out_features, dtype=first.dtype, device=first.qweight.device)
                                  for m in layers])
        out.perm = first.perm
        out.out_splits = tuple(n for m in layers for n in m.out_splits)
        return out

    @staticmethod
    def _bias(ck, prefix, N):
        kb = f"{prefix}.bias" if prefix else "bias"
        if kb not in ck:
            return None
        kb, b = _tensor(ck, prefix, "bias", (torch.float16, torch.bfloat16, torch.float32), 1)
        _shape(kb, b, [N])
        return b

    # -------------------------------------------------------------------------------------------- use
    def warmup(self, workers=None):
        """Compile every M path of this layer's kernels now (GPU; before serving or CUDA-graph capture). The paths
        compile in parallel worker processes (``workers``: None = up to the CPU count, 1 = serially here); for a
        whole model, :func:`warmup` (one pool for every layer shape)."""
        if self.qweight.is_cuda:
            ops.warmup(self.out_features, self.in_features, self.group_size, self.dtype, self.weight_format,
                       self.zeros_mode or "", self.qweight.device, workers)
        return self

    def gemm(self):
        """The shared :class:`~mmaemit.kernels.dequant_dispatch.DequantGemm` of this layer's problem on its device."""
        return ops.gemm_for(self.out_features, self.in_features, self.group_size, self.dtype, self.weight_format,
                            self.zeros_mode or "", self.qweight.device)

    def forward(self, x):
        lead, x2 = _flat_input(self, x)
        y = torch.ops.mmaemit.dequant_linear(x2, self.qweight, self.scales, self.zeros, self.group_size,
                                             self.weight_format, self.zeros_mode or "")
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def dequantized_weight(self):
        """The layer's weight [N, K] in float32 on the CPU, in the original K order (exact: b-bit codes times a
        16-bit scale fit float32)."""
        return _dequantized_weight(self)

    def extra_repr(self):
        parts = "" if len(self.out_splits) == 1 else f" (concat of {list(self.out_splits)})"
        return (f"in_features={self.in_features}, out_features={self.out_features}{parts}, {self.weight_format} "
                f"g{self.group_size}, zeros={self.zeros_mode}, dtype={_DTYPES[self.dtype]}, "
                f"bias={self.bias is not None}, act_order={self.perm is not None}")


class QuantGatedLinear(nn.Module):
    """``y = act(x @ dequant(Wg)^T + bg) * (x @ dequant(Wu)^T + bu)``: the gate / up pair of a SwiGLU / GeGLU MLP
    as one quantized layer (``act``: "silu" or "gelu_tanh", :mod:`mmaemit.kernels.gated`).

    The two weights are interleaved by 16 output rows into one kernel-layout weight of 2 N rows, so one GEMM reads
    both; at M <= 16 the GEMV applies the gate in its epilogue (one launch, no [M, 2 N] intermediate), other M gate
    the GEMM's output with torch (``gate_into``, as the unfused module would). Buffers as :class:`QuantLinear` with
    2 N rows (``bias`` [2 N] interleaved the same way, or None). Made by :meth:`from_layers` (two
    :class:`QuantLinear`, e.g. loaded from GPTQ / AWQ checkpoints) or :meth:`from_linears` (two ``nn.Linear``)."""

    def __init__(self, in_features: int, out_features: int, *, group_size: int, weight_format: str,
                 zeros_mode=None, dtype=torch.float16, act="silu"):
        super().__init__()
        from mmaemit.kernels.gated import check_gate

        if dtype not in _DTYPES:
            raise UnsupportedConfigError(f"dtype must be one of {choices(_DTYPES.values())}, not {dtype}")
        if check_gate(act) is None:
            raise UnsupportedConfigError("QuantGatedLinear needs an activation: act='silu' or 'gelu_tanh'")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.group_size, self.weight_format, self.zeros_mode = int(group_size), weight_format, zeros_mode
        self.dtype, self.act = dtype, act
        for name in ("qweight", "scales", "zeros", "bias", "perm"):
            self.register_buffer(name, None)

    @classmethod
    def from_layers(cls, gate: QuantLinear, up: QuantLinear, act="silu") -> "QuantGatedLinear":
        """Interleave two :class:`QuantLinear` layers (same in / out features, format, group, zero-point mode,
        dtype, device and act-order permutation) into one gated layer."""
        from mmaemit.kernels.gated import interleave_gated

        if not isinstance(gate, QuantLinear) or not isinstance(up, QuantLinear):
            raise ArgumentError(f"from_layers takes two QuantLinear layers, got {type(gate).__name__} and "
                                f"{type(up).__name__}")
        for attr in ("in_features", "out_features", "weight_format", "group_size", "zeros_mode", "dtype"):
            a, b = getattr(gate, attr), getattr(up, attr)
            if a != b:
                raise ArgumentError(f"the gate and up layers must share {attr}; got {a} and {b}")
        if gate.qweight.device != up.qweight.device:
            raise ArgumentError(f"the gate and up layers must be on one device; got {gate.qweight.device} and "
                                f"{up.qweight.device}")
        if not _same_permutation(gate.perm, up.perm):
            raise ArgumentError("the gate and up layers need one act-order permutation (the activations are "
                                "permuted once per call); their g_idx orders differ")
        out = cls(gate.in_features, gate.out_features, group_size=gate.group_size, weight_format=gate.weight_format,
                  zeros_mode=gate.zeros_mode, dtype=gate.dtype, act=act)
        out.qweight = interleave_gated(gate.qweight, up.qweight)
        out.scales = interleave_gated(gate.scales, up.scales)
        out.zeros = None if gate.zeros is None else interleave_gated(gate.zeros, up.zeros)
        if gate.bias is not None or up.bias is not None:
            zero = torch.zeros(gate.out_features, dtype=gate.dtype, device=gate.qweight.device)
            bg, bu = (b if b is not None else zero for b in (gate.bias, up.bias))
            out.bias = interleave_gated(bg.reshape(-1, 16), bu.reshape(-1, 16)).reshape(-1)
        out.perm = gate.perm
        return out

    @classmethod
    def from_linears(cls, gate: nn.Linear, up: nn.Linear, scheme="int4", *, group_size=128, act="silu", dtype=None,
                     device=None) -> "QuantGatedLinear":
        """Quantize two ``nn.Linear`` (as :meth:`QuantLinear.from_linear`) into one gated layer."""
        return cls.from_layers(QuantLinear.from_linear(gate, scheme, group_size=group_size, dtype=dtype, device=device),
                               QuantLinear.from_linear(up, scheme, group_size=group_size, dtype=dtype, device=device),
                               act)

    def warmup(self, workers=None):
        """Compile every M path of this layer's kernels now (as :meth:`QuantLinear.warmup`)."""
        if self.qweight.is_cuda:
            ops.warmup(2 * self.out_features, self.in_features, self.group_size, self.dtype, self.weight_format,
                       self.zeros_mode or "", self.qweight.device, workers, gated=self.act)
        return self

    def gemm(self):
        """The shared gated :class:`~mmaemit.kernels.dequant_dispatch.DequantGemm` of this layer on its device."""
        return ops.gemm_for(2 * self.out_features, self.in_features, self.group_size, self.dtype, self.weight_format,
                            self.zeros_mode or "", self.qweight.device, gated=self.act)

    def forward(self, x):
        from mmaemit.kernels.gated import gate_into

        lead, x2 = _flat_input(self, x)
        args = (x2, self.qweight, self.scales, self.zeros, self.group_size, self.weight_format, self.zeros_mode or "")
        if self.bias is None:
            y = torch.ops.mmaemit.dequant_gated_linear(*args, self.act)
        else:        # the bias joins before the gate: the full product, then the gate with torch's ops
            full = torch.ops.mmaemit.dequant_linear(*args) + self.bias
            y = gate_into(self.act, full, full.new_empty((full.shape[0], self.out_features)))
        return y.reshape(*lead, self.out_features)

    def dequantized_weight(self):
        """The interleaved gate / up weight [2 N, K] in float32 on the CPU (n16 blocks alternate gate and up,
        :func:`~mmaemit.kernels.gated.split_gated` separates a product with it), in the original K order."""
        return _dequantized_weight(self)

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, act={self.act}, "
                f"{self.weight_format} g{self.group_size}, zeros={self.zeros_mode}, dtype={_DTYPES[self.dtype]}, "
                f"bias={self.bias is not None}, act_order={self.perm is not None}")


def warmup(model, workers=None) -> float:
    """Compile every M path of every CUDA :class:`QuantLinear` / :class:`QuantGatedLinear` in ``model`` (an
    ``nn.Module``, searched with ``modules()``, or an iterable of layers) in one pool of worker processes: layers of
    the same problem share their kernels, so each distinct shape compiles once. ``workers``: as
    :func:`~mmaemit.kernels.dequant_dispatch.warmup_all`. Returns the wall time in seconds."""
    from mmaemit.kernels.dequant_dispatch import warmup_all

    return warmup_all(_layer_gemms(model), workers)


def _layer_gemms(model) -> list:
    """The distinct shared DequantGemms of the CUDA quantized layers in ``model`` (a module or an iterable of layers)."""
    layers = model.modules() if isinstance(model, nn.Module) else model
    gemms = {}
    for layer in layers:
        if isinstance(layer, (QuantLinear, QuantGatedLinear)) and layer.qweight.is_cuda:
            g = layer.gemm()
            gemms[id(g)] = g
    return list(gemms.values())


def measure_plans(model, max_m=None, **kwargs) -> list:
    """Measure the plan of every distinct CUDA layer problem in ``model`` (as :func:`warmup` finds them) on the
    visible GPU, store it and use it from now on, in this process and later ones
    (:func:`~mmaemit.kernels.dequant_plan.measure_plan`, whose keyword arguments ``kwargs`` takes; ``max_m``: its
    last measured M, None = :data:`~mmaemit.kernels.dequant_plan.PLAN_MAX_M`). Returns [(the problem's DequantGemm,
    its MeasuredPlan)]. A plan already stored for a problem, GPU and the same kernel sources is reused
    (``force=True`` measures again)."""
    from mmaemit.kernels.dequant_plan import PLAN_MAX_M, measure_plan

    return [(g, measure_plan(g, max_m=PLAN_MAX_M if max_m is None else max_m, **kwargs)) for g in _layer_gemms(model)]
