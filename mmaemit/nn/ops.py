"""``torch.ops.mmaemit.dequant_linear``: the dequant GEMM as a ``torch.library`` custom op.

``dequant_linear(x, qweight, scales, zeros, group_size, weight_format, zeros_mode) -> y``: x [M, K] float16 /
bfloat16, qweight / scales / zeros in the kernel layout (:func:`mmaemit.dequant.kernel_layout.kernel_arguments`;
``zeros`` None without zero points, ``zeros_mode`` "" then), y [M, N] = x @ dequant(W)^T in x's dtype.

* CUDA: one :class:`~mmaemit.kernels.dequant_dispatch.DequantGemm` per (N, K, group, dtype, format, zeros mode,
  device), shared by every layer of that shape; each M path compiles on its first use (:func:`warmup` compiles all
  of them, do it before serving or CUDA-graph capture). Its plan is the measured one stored for the problem on this
  GPU where there is one (:mod:`mmaemit.kernels.dequant_plan`; ``MMAEMIT_DEQUANT_PLAN=rules`` ignores it).
* CPU: the exact reference (the kernel-layout tensors dequantized in float64 by the documented formulas, the product
  in float32, rounded once to x's dtype), or, with ``MMAEMIT_INTERPRET=1``, the same kernels on the CPU interpreter.
* a fake (meta) implementation gives the output's shape and dtype, so ``torch.compile(fullgraph=True)`` traces it.

``dequant_gated_linear(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, act) -> y``: the same over a
gate and an up weight interleaved by 16 rows (:mod:`mmaemit.kernels.gated`), y [M, N/2] = act(gate) * up (float32,
one rounding); at M <= 16 the GEMV applies it in its epilogue.
"""
from __future__ import annotations

import os
import threading
from typing import Optional

import torch

from mmaemit.dequant.formats import get_format
from mmaemit.dequant.kernel_layout import from_kernel_layout, from_kernel_scales
from mmaemit.errors import ArgumentError
from mmaemit.kernels.dequant_dispatch import DequantGemm
from mmaemit.kernels.gated import check_gate, gate_torch, split_gated

__all__ = ["dequant_linear", "dequant_linear_reference", "dequant_gated_linear", "dequant_gated_linear_reference",
           "dequantized_weight", "gemm_for", "warmup"]

_GEMMS: dict = {}
_LOCK = threading.Lock()


def _zeros_mode(zeros_mode: str):
    return zeros_mode or None


def gemm_for(N, K, group_size, dtype, weight_format, zeros_mode, device=None, *, interpret=None,
             gated=None) -> DequantGemm:
    """The shared :class:`DequantGemm` of a problem (made once per device; ``gated``: its gate activation)."""
    dev = None if device is None else torch.device(device)
    key = (N, K, group_size, str(dtype), weight_format, zeros_mode or None,
           None if dev is None or dev.type == "cpu" else (dev.type, dev.index), interpret, gated or None)
    with _LOCK:
        g = _GEMMS.get(key)
        if g is None:
            arch = None
            if dev is not None and dev.type == "cuda":
                from mmaemit.arch import device_arch

                arch = device_arch(dev.index or 0).name
            dt = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dtype, dtype)
            g = _GEMMS[key] = DequantGemm(N, K, group_size, dt, weight_format, zeros_mode or None, arch,
                                          interpret=interpret, gated=gated or None)
            if arch is not None and _plan_mode() == "stored":
                _adopt_stored_plan(g)
        return g


def _adopt_stored_plan(g) -> None:
    """``g`` serves by the measured plan stored for its problem on this GPU, if any; a stored plan that does not fit
    the problem any more (a path it names no longer runs here) is skipped with a warning, never an error in a
    forward pass."""
    import warnings

    from mmaemit.errors import MmaemitError
    from mmaemit.kernels.dequant_plan import stored_plan

    plan = stored_plan(g)
    if plan is None:
        return
    try:
        g.set_plan(plan)
    except MmaemitError as e:
        warnings.warn(f"the measured plan stored for {g!r} does not fit it ({e}); using the rules' plan (measure it "
                      f"again: mmaemit.kernels.dequant_plan.measure_plan(gemm, force=True))", RuntimeWarning,
                      stacklevel=3)


def _plan_mode() -> str:
    mode = os.environ.get("MMAEMIT_DEQUANT_PLAN", "stored")
    if mode not in ("stored", "rules"):
        raise ArgumentError(f"MMAEMIT_DEQUANT_PLAN={mode!r}; valid: 'stored' (a measured plan of the problem where "
                            f"one is stored, mmaemit.kernels.dequant_plan), 'rules'")
    return mode


def warmup(N, K, group_size, dtype, weight_format, zeros_mode, device, workers=None, gated=None):
    """Compile every M path of a problem's DequantGemm now (``workers``: as
    :func:`~mmaemit.kernels.dequant_dispatch.warmup_all`)."""
    gemm_for(N, K, group_size, dtype, weight_format, zeros_mode, device, gated=gated).warmup(workers)


def dequantized_weight(qweight, scales, zeros, group_size, weight_format, zeros_mode):
    """The weight [N, K] (float64, on the CPU) of kernel-layout tensors, by the documented formulas."""
    fmt = get_format(weight_format)
    codes = from_kernel_layout(qweight.cpu(), fmt.bits)
    values = fmt.decode(codes)                                                   # float64 [N, K]
    K = values.shape[1]
    G = K if group_size in (None, -1) else group_size
    s = from_kernel_scales(scales.cpu()).double().repeat_interleave(G, dim=1)
    mode = _zeros_mode(zeros_mode)
    if mode is None:
        w = values * s
    else:
        z = from_kernel_scales(zeros.cpu()).double().repeat_interleave(G, dim=1)
        w = values * s - z if mode == "rescale" else (values - z) * s
    return w


def dequant_linear_reference(x, qweight, scales, zeros, group_size, weight_format, zeros_mode):
    """The exact CPU reference of :func:`dequant_linear` (any device): float64 dequantization of the kernel-layout
    tensors, float32 product, one rounding to x's dtype."""
    return _reference_product(x, qweight, scales, zeros, group_size, weight_format, zeros_mode).to(x.dtype).to(x.device)


def _reference_product(x, qweight, scales, zeros, group_size, weight_format, zeros_mode):
    """x [M, K] @ W^T in float32 on the CPU, W the kernel-layout tensors dequantized in float64."""
    w = dequantized_weight(qweight, scales, zeros, group_size, weight_format, zeros_mode)
    return x.cpu().float() @ w.float().T


def _dequant_call(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, act):
    """Both ops: the reference on the CPU (unless MMAEMIT_INTERPRET), else the shared DequantGemm (gated by ``act``
    unless it is None)."""
    if x.dim() != 2:
        raise ArgumentError(f"x must be 2-D [M, K], got {tuple(x.shape)}")
    N, K = qweight.shape[0] * 16, x.shape[1]
    args = (qweight, scales, zeros, group_size, weight_format, zeros_mode)
    if x.device.type != "cuda" and os.environ.get("MMAEMIT_INTERPRET", "") in ("", "0"):
        if act is None:
            return dequant_linear_reference(x, *args)
        return dequant_gated_linear_reference(x, *args, act)
    x = x.contiguous()
    if x.data_ptr() % 16:
        x = x.clone()
    g = gemm_for(N, K, group_size, x.dtype, weight_format, zeros_mode, x.device, gated=act)
    out = torch.empty((x.shape[0], g.n_out), dtype=x.dtype, device=x.device)
    return g(x, qweight, scales, zeros, out=out)


@torch.library.custom_op("mmaemit::dequant_linear", mutates_args=())
def dequant_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                   group_size: int, weight_format: str, zeros_mode: str) -> torch.Tensor:
    return _dequant_call(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, None)


@dequant_linear.register_fake
def _(x, qweight, scales, zeros, group_size, weight_format, zeros_mode):
    return x.new_empty((x.shape[0], qweight.shape[0] * 16))


def dequant_gated_linear_reference(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, act):
    """The exact CPU reference of :func:`dequant_gated_linear`: the float64-dequantized interleaved weight, the
    float32 product, ``act(gate) * up`` in float32, one rounding to x's dtype."""
    y = _reference_product(x, qweight, scales, zeros, group_size, weight_format, zeros_mode)
    return gate_torch(act, *split_gated(y)).to(x.dtype).to(x.device)


@torch.library.custom_op("mmaemit::dequant_gated_linear", mutates_args=())
def dequant_gated_linear(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: Optional[torch.Tensor],
                         group_size: int, weight_format: str, zeros_mode: str, act: str) -> torch.Tensor:
    """y [M, N/2] = act(x @ Wg^T) * (x @ Wu^T) over gate / up weights interleaved by 16 rows
    (:mod:`mmaemit.kernels.gated`; qweight etc. as :func:`dequant_linear`, N = qweight.shape[0] * 16 rows)."""
    check_gate(act)
    return _dequant_call(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, act)


@dequant_gated_linear.register_fake
def _(x, qweight, scales, zeros, group_size, weight_format, zeros_mode, act):
    return x.new_empty((x.shape[0], qweight.shape[0] * 8))
