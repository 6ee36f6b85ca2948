"""PyTorch-facing layers on mmaemit's kernels.

* :class:`QuantLinear` (:mod:`mmaemit.nn.linear`) - a weight-only quantized ``nn.Linear`` (from an ``nn.Linear``,
  a QuantizedWeight, or GPTQ / AWQ ``.safetensors`` checkpoints); :func:`warmup` compiles a model's kernels in
  parallel, each distinct layer shape once
* ``torch.ops.mmaemit.dequant_linear`` (:mod:`mmaemit.nn.ops`) - the custom op it calls (fake implementation
  included, so ``torch.compile(fullgraph=True)`` traces it)
"""
from .linear import QuantLinear, warmup
from .ops import dequant_linear, dequant_linear_reference

__all__ = ["QuantLinear", "warmup", "dequant_linear", "dequant_linear_reference"]
