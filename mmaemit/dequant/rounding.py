"""Correct round-to-nearest-even from float64 to float16 / bfloat16 (numpy and torch, any device).

Why this exists: converting float64 straight to bfloat16 with ml_dtypes (and, on some backends, torch) goes through
float32 with two roundings, which is wrong near ties (1 + 2^-8 + 2^-30 becomes 1.0 instead of 1 + 2^-7). We round
float64 to float32 with *round-to-odd* first; a second rounding to a format with at most 22 significand bits is then
exactly the single correct rounding (24 >= p + 2), for float16 and bfloat16, subnormals and overflow included.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import UnsupportedConfigError, choices

#: name -> (numpy dtype, significand bits incl. the hidden one)
HALF_DTYPES = {"float16": (np.dtype(np.float16), 11), "bfloat16": (np.dtype(ml_dtypes.bfloat16), 8),
               "float32": (np.dtype(np.float32), 24)}


def half_name(dtype) -> str:
    """Canonical name among float16 / bfloat16 / float32 of a string, numpy or torch dtype."""
    name = str(dtype).replace("torch.", "")
    name = {"fp16": "float16", "half": "float16", "f16": "float16", "bf16": "bfloat16", "fp32": "float32",
            "f32": "float32", "float": "float32"}.get(name, name)
    if name not in HALF_DTYPES:
        raise UnsupportedConfigError(f"output dtype {dtype!r} is not supported; valid: {choices(HALF_DTYPES)}")
    return name


def _round_to_odd_f32_np(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        t = x.astype(np.float32)
        back = t.astype(np.float64)
    inexact = (back != x) & np.isfinite(x)
    # truncate toward zero, then force the last bit to 1 where the value was not exact
    over = inexact & (np.abs(back) > np.abs(x))
    t = np.where(over, np.nextafter(t, np.float32(0)), t)
    bits = t.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
    return bits.view(np.float32)


def round_np(x, dtype) -> np.ndarray:
    """float64 array -> ``dtype`` (float16 / bfloat16 / float32) with one correct round-to-nearest-even."""
    name = half_name(dtype)
    if name == "float32":
        return np.asarray(x, dtype=np.float64).astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        return _round_to_odd_f32_np(x).astype(HALF_DTYPES[name][0])


def round_torch(x, dtype):
    """torch float64 tensor -> torch float16 / bfloat16 / float32 with one correct rounding (same device)."""
    import torch

    name = half_name(dtype)
    x = x.to(torch.float64)
    if name == "float32":
        return x.to(torch.float32)
    t = x.to(torch.float32)
    back = t.to(torch.float64)
    inexact = (back != x) & torch.isfinite(x)
    over = inexact & (back.abs() > x.abs())
    t = torch.where(over, torch.nextafter(t, torch.zeros_like(t)), t)
    bits = t.view(torch.int32) | inexact.to(torch.int32)
    return bits.view(torch.float32).to(getattr(torch, name))


def round_sum_torch(a, b, dtype):
    """Correctly rounded ``a + b`` (float64 torch tensors holding exact values) in ``dtype``: the float64 sum is
    corrected by its exact TwoSum error through round-to-odd, so a tiny addend is never lost to a double rounding
    (bf16: 13 * 29 + 2^-133 must give 378, not 376)."""
    import torch

    a, b = a.to(torch.float64), b.to(torch.float64)
    s = a + b
    bp = s - a
    err = (a - (s - bp)) + (b - bp)
    err = torch.where(torch.isfinite(s), err, torch.zeros_like(err))
    inexact = err != 0
    toward_zero = inexact & (torch.sign(err) != torch.sign(s))
    trunc = torch.where(toward_zero, torch.nextafter(s, torch.zeros_like(s)), s)
    odd = trunc.view(torch.int64) | inexact.to(torch.int64)
    return round_torch(odd.view(torch.float64), dtype)
