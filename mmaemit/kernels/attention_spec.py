"""What both attention kernels (mma.sync and Hopper wgmma) accept, and the constants of their online softmax."""
from __future__ import annotations

import math

from mmaemit.dtypes import canonical
from mmaemit.errors import UnsupportedConfigError, choices

DTYPES = ("float16", "bfloat16")
HEAD_DIMS = (64, 128, 256)
IMPLEMENTATIONS = ("mma_sync", "wgmma")
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def check_problem(dtype, head_dim, heads, kv_heads, softmax_scale):
    """Validate the problem; returns (canonical dtype, softmax scale)."""
    dtype = canonical(dtype)
    if dtype not in DTYPES:
        raise UnsupportedConfigError(f"attention dtype must be one of {choices(DTYPES)}, not {dtype!r}")
    if head_dim not in HEAD_DIMS:
        raise UnsupportedConfigError(f"head_dim must be one of {choices(HEAD_DIMS)}, not {head_dim!r}")
    if kv_heads < 1 or heads % kv_heads:
        raise UnsupportedConfigError(f"kv_heads={kv_heads} must divide heads={heads} (GQA / MQA)")
    scale = float(softmax_scale) if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    if not scale > 0:
        raise UnsupportedConfigError(f"softmax_scale must be positive, not {softmax_scale!r}")
    return dtype, scale


class KeyBlocks:
    """Which key blocks a CTA of ``block_m`` query rows visits and which of them need a mask, for both kernels
    (bottom-right causal alignment: query row r of a sequence pair sees keys up to r + seq_k - seq_q).

    ``keys_end(q_row0, seq_q, seq_k)``: the keys the CTA's rows see (all of them, or up to its last row's diagonal);
    ``needs_mask(n, q_row0, seq_q, seq_k)``: key block ``n`` (``block_n`` keys) has keys past the sequence end or,
    causal, keys after its first row's diagonal. Arguments are TIR expressions."""

    def __init__(self, causal: bool, block_m: int, block_n: int):
        self.causal, self.block_m, self.block_n = bool(causal), int(block_m), int(block_n)

    def keys_end(self, q_row0, seq_q, seq_k):
        from tvm.script import tirx as T

        if not self.causal:
            return seq_k
        return T.max(T.min(seq_k, T.min(seq_q, q_row0 + self.block_m) + seq_k - seq_q), 0)

    def needs_mask(self, n, q_row0, seq_q, seq_k):
        from tvm.script import tirx as T

        past_end = (n + 1) * self.block_n > seq_k
        if not self.causal:
            return past_end
        return T.Or(past_end, (n + 1) * self.block_n - 1 > q_row0 + seq_k - seq_q)
