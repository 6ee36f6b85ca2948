"""PyTorch-facing layers on mmaemit's kernels.

* :class:`QuantLinear` (:mod:`mmaemit.nn.linear`) - a weight-only quantized ``nn.Linear`` (from an ``nn.Linear``,
  a QuantizedWeight, or GPTQ / AWQ ``.safetensors`` checkpoints); :func:`warmup` compiles a model's kernels in
  parallel, each distinct layer shape once; :func:`measure_plans` times each shape's paths per M bucket on the GPU
  and keeps the fastest (stored, used by later processes); :class:`QuantGatedLinear` - a SwiGLU / GeGLU gate / up pair as one
  layer (one GEMM, the gate in the GEMV's epilogue at M <= 16)
* ``torch.ops.mmaemit.dequant_linear`` / ``dequant_gated_linear`` (:mod:`mmaemit.nn.ops`) - the custom ops they
  call (fake implementations included, so ``torch.compile(fullgraph=True)`` traces them)
"""
from .linear import QuantGatedLinear, QuantLinear, measure_plans, warmup
from .ops import dequant_gated_linear, dequant_gated_linear_reference, dequant_linear, dequant_linear_reference

__all__ = ["QuantLinear", "QuantGatedLinear", "warmup", "measure_plans", "dequant_linear", "dequant_linear_reference",
           "dequant_gated_linear", "dequant_gated_linear_reference"]
