"""``torch.ops.mmaemit.flash_attention``: the mma.sync FlashAttention forward as a torch custom op.

``torch.library.custom_op`` with a ``register_fake`` (shapes only), so ``torch.compile(fullgraph=True)`` traces it as
one opaque node. Returns ``(O [batch, seqlen, heads, head_dim], LSE float32 [batch, heads, seqlen])``.

    import mmaemit.kernels.attention_op  # registers the op
    o, lse = torch.ops.mmaemit.flash_attention(q, k, v, True, None)            # mma.sync
    o, lse = torch.ops.mmaemit.flash_attention(q, k, v, True, None, "wgmma")   # the Hopper kernel (sm_90a)
"""
from __future__ import annotations

from typing import Optional

import torch

from mmaemit.kernels.flash_attention import flash_attention

__all__ = ["flash_attention_op"]


@torch.library.custom_op("mmaemit::flash_attention", mutates_args=())
def flash_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       softmax_scale: Optional[float] = None,
                       implementation: str = "mma_sync") -> tuple[torch.Tensor, torch.Tensor]:
    o, lse = flash_attention(q, k, v, causal=causal, softmax_scale=softmax_scale, implementation=implementation)
    return o, lse.contiguous()


@flash_attention_op.register_fake
def _flash_attention_fake(q, k, v, causal=False, softmax_scale=None, implementation="mma_sync"):
    batch, seqlen, heads, _ = q.shape
    return torch.empty_like(q), q.new_empty((batch, heads, seqlen), dtype=torch.float32)
