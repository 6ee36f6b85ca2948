"""Gated (GLU) outputs of the dequant GEMM: ``act(x @ Wg^T) * (x @ Wu^T)``, the gate / up pair of a SwiGLU or GeGLU
MLP, computed by one GEMM over the two weights interleaved by 16 rows.

* :func:`interleave_gated` stacks the kernel-layout tensors of the gate and up weights (``qweight`` [N/16, ...],
  ``scales`` / ``zeros`` [N/16, ...]) so that n16 block 2 i is gate rows 16 i .. 16 i + 15 and block 2 i + 1 the same
  up rows: one weight of 2 N rows, whose GEMM output column ``32 i + j`` is gate column ``16 i + j`` and ``32 i + 16 +
  j`` is up column ``16 i + j`` (:func:`split_gated` undoes it on an output).
* The GEMV epilogue (``make_dequant_gemv(..., gated=act)``, ``n_blocks`` even: a CTA holds whole block pairs) applies
  :func:`gate_tir` to the fp32 sums of each pair and writes the N gated columns, rounded once; other paths run the
  full GEMM into a scratch and :func:`gate_into` on it (torch's ops in the output dtype, as an unfused module does).
  :func:`gate_torch` is the float32 reference.

Activations (:data:`GATE_ACTIVATIONS`): ``"silu"`` (x * sigmoid(x), SwiGLU: Llama, Mistral, Qwen) and ``"gelu_tanh"``
(the tanh approximation of GELU, GeGLU: Gemma), both in float32.
"""
from __future__ import annotations

from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError, choices

__all__ = ["GATE_ACTIVATIONS", "check_gate", "gate_tir", "gate_torch", "gate_into", "interleave_gated",
           "split_gated"]

#: the gate activations the gated GEMM applies
GATE_ACTIVATIONS = ("silu", "gelu_tanh")
_GELU_C = 0.7978845608028654      # sqrt(2 / pi)


def check_gate(act):
    """Validate a gate activation name (None: no gating); returns it."""
    if act is not None and act not in GATE_ACTIVATIONS:
        raise UnsupportedConfigError(f"gated must be one of {choices(GATE_ACTIVATIONS)} or None, not {act!r}")
    return act


def gate_tir(act, g, u):
    """The TIR float32 expression ``act(g) * u`` (g, u float32 PrimExprs)."""
    from tvm.script import tirx as T

    one, half = T.float32(1.0), T.float32(0.5)
    if act == "silu":
        return g / (one + T.exp(T.float32(0.0) - g)) * u
    if act == "gelu_tanh":
        return half * g * (one + T.tanh(T.float32(_GELU_C) * (g + T.float32(0.044715) * g * g * g))) * u
    raise UnsupportedConfigError(f"gated must be one of {choices(GATE_ACTIVATIONS)}, not {act!r}")


def _torch_act(act):
    """The torch function of a gate activation."""
    import torch.nn.functional as F

    if act == "silu":
        return F.silu
    if act == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    raise UnsupportedConfigError(f"gated must be one of {choices(GATE_ACTIVATIONS)}, not {act!r}")


def _blocks(y):
    """The view [..., 2 N / 32, 2, 16] of a gated GEMM output [..., 2 N]: (block pair, gate / up, column)."""
    n2 = y.shape[-1]
    if n2 % 32:
        raise TileShapeError(f"a gated output has a multiple of 32 columns (16-row gate / up blocks), not {n2}")
    return y.reshape(*y.shape[:-1], n2 // 32, 2, 16)


def gate_torch(act, g, u):
    """``act(g) * u`` in float32 (torch tensors of any float dtype; returns float32)."""
    return _torch_act(act)(g.float()) * u.float()


def gate_into(act, y, out):
    """``out`` [..., N] = act(gate) * up of a GEMM output ``y`` [..., 2 N] over :func:`interleave_gated` weights, with
    torch's ops in the output dtype (act computed in float32 and rounded, then the product rounded: what an unfused
    ``act(gate(x)) * up(x)`` module computes), two elementwise kernels and no copies; returns ``out``."""
    import torch

    n2 = y.shape[-1]
    if n2 % 32 or out.shape[-1] * 2 != n2:
        raise TileShapeError(f"gate_into takes y [..., 2 N] (2 N a multiple of 32) and out [..., N]; got "
                             f"{tuple(y.shape)} and {tuple(out.shape)}")
    v = _blocks(y)
    torch.mul(_torch_act(act)(v[..., 0, :]), v[..., 1, :], out=out.view(*out.shape[:-1], n2 // 32, 16))
    return out


def interleave_gated(gate, up):
    """One kernel-layout tensor from the gate's and the up weight's (same shape, leading dim N/16): n16 blocks
    alternate gate, up (see the module doc). Works for ``qweight``, ``scales`` and ``zeros`` alike."""
    import torch

    if not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor):
        raise ArgumentError("interleave_gated takes two torch tensors in the kernel layout")
    if gate.shape != up.shape or gate.dtype != up.dtype or gate.device != up.device:
        raise ArgumentError(f"the gate and up tensors must match in shape, dtype and device; got "
                            f"{tuple(gate.shape)} {gate.dtype} {gate.device} and {tuple(up.shape)} {up.dtype} "
                            f"{up.device}")
    return torch.stack([gate, up], 1).reshape(2 * gate.shape[0], *gate.shape[1:]).contiguous()


def split_gated(y):
    """(gate, up) views [..., N] of a GEMM output [..., 2 N] over :func:`interleave_gated` weights."""
    v, half = _blocks(y), y.shape[-1] // 2
    return v[..., 0, :].reshape(*y.shape[:-1], half), v[..., 1, :].reshape(*y.shape[:-1], half)
