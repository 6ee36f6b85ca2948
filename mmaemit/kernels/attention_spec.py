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
