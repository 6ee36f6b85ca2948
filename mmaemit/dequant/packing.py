"""Pack b-bit codes into storage words, little-endian along one axis, and the exact inverse.

Rule (the same as GPTQ's int32 ``qweight`` along K / ``qzeros`` along N and BitBLAS's int8 storage): with
``per = storage_bits / b`` codes per word, word ``w`` along ``axis`` holds codes ``w*per + j`` (j = 0 .. per-1) at bits
``[b*j, b*(j+1))``. Storage ``"int32"`` words are returned as torch.int32 (two's-complement reinterpretation of the
unsigned word), ``"int8"`` as torch.int8, ``"uint8"`` as torch.uint8. Works on torch tensors on any device; numpy
arrays in give numpy arrays out.
"""
from __future__ import annotations

import numpy as np

from ..errors import ArgumentError, TileShapeError, UnsupportedConfigError, choices

STORAGE_BITS = {"int32": 32, "int8": 8, "uint8": 8}
VALID_BITS = (1, 2, 4, 8)


def check_bits(bits) -> int:
    if bits not in VALID_BITS:
        raise UnsupportedConfigError(f"bits={bits!r} is not packable here; valid: {choices(VALID_BITS)}")
    return int(bits)


def check_storage(storage) -> str:
    name = str(storage).replace("torch.", "")
    if name not in STORAGE_BITS:
        raise UnsupportedConfigError(f"storage {storage!r} is not supported; valid: {choices(STORAGE_BITS)}")
    return name


def storage_of(packed) -> str:
    """Storage name of a packed tensor from its dtype (int32 / uint32 -> "int32", int8, uint8)."""
    name = str(packed.dtype).replace("torch.", "")
    name = {"uint32": "int32"}.get(name, name)
    if name not in STORAGE_BITS:
        raise ArgumentError(f"packed words must have dtype int32, uint32, int8 or uint8; got {packed.dtype}")
    return name


def to_torch(x):
    """(tensor, was_numpy). numpy unsigned 32-bit words are widened to int64 (torch lacks most uint32 ops);
    ``ml_dtypes.bfloat16`` arrays become torch.bfloat16 (bit for bit)."""
    import torch

    if isinstance(x, np.ndarray):
        if x.dtype == np.uint32:
            x = x.astype(np.int64)
        if x.dtype.name == "bfloat16":  # ml_dtypes.bfloat16: the same bits as torch.bfloat16
            return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(torch.bfloat16), True
        return torch.from_numpy(np.ascontiguousarray(x)), True
    if not isinstance(x, torch.Tensor):
        raise ArgumentError(f"expected a torch tensor or numpy array, got {type(x).__name__}")
    return x, False


def to_numpy(t):
    """A CPU numpy copy of torch tensor ``t``; bfloat16 becomes an ``ml_dtypes.bfloat16`` array (numpy has no
    bfloat16 of its own; torch's ``.numpy()`` refuses it), bit for bit."""
    import torch

    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def _to_storage(words64, storage: str):
    import torch

    sb = STORAGE_BITS[storage]
    signed = words64 - ((words64 >> (sb - 1)) & 1) * (1 << sb)
    if storage == "uint8":
        return words64.to(torch.uint8)
    return signed.to(torch.int32 if storage == "int32" else torch.int8)


def words_as_uint(packed):
    """Packed storage words (torch) -> int64 tensor holding the unsigned word values."""
    import torch

    sb = STORAGE_BITS[storage_of(packed)]
    return packed.to(torch.int64) & ((1 << sb) - 1)


def pack(codes, bits: int, axis: int = -1, storage: str = "int32"):
    """Pack integer ``codes`` (values in [0, 2^bits)) along ``axis``; that axis shrinks by ``storage_bits/bits``."""
    import torch

    bits, storage = check_bits(bits), check_storage(storage)
    t, was_np = to_torch(codes)
    if t.dtype.is_floating_point or t.dtype == torch.bool:
        raise ArgumentError(f"codes must be an integer tensor, got {t.dtype}")
    per = STORAGE_BITS[storage] // bits
    t = t.movedim(axis, -1).to(torch.int64)
    if t.shape[-1] % per:
        raise TileShapeError(f"axis length {t.shape[-1]} is not a multiple of {per} ({bits}-bit codes per {storage})")
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= (1 << bits)):
        raise ArgumentError(f"codes must lie in [0, {(1 << bits) - 1}] for bits={bits}")
    t = t.reshape(*t.shape[:-1], t.shape[-1] // per, per)
    shifts = torch.arange(per, device=t.device, dtype=torch.int64) * bits
    words = (t << shifts).sum(-1)
    out = _to_storage(words, storage).movedim(-1, axis)
    return out.numpy() if was_np else out


def unpack(packed, bits: int, axis: int = -1):
    """Inverse of :func:`pack`: storage words -> uint8 codes; ``axis`` grows by ``storage_bits/bits``."""
    import torch

    bits = check_bits(bits)
    t, was_np = to_torch(packed)
    if was_np and isinstance(packed, np.ndarray) and packed.dtype == np.uint32:
        storage, w = "int32", t
    else:
        storage = storage_of(t)
        w = words_as_uint(t)
    per = STORAGE_BITS[storage] // bits
    w = w.movedim(axis, -1)
    shifts = torch.arange(per, device=w.device, dtype=torch.int64) * bits
    codes = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(*w.shape[:-1], w.shape[-1] * per).to(torch.uint8).movedim(-1, axis)
    return codes.numpy() if was_np else codes
