"""Device scratch that kernels keep between launches (stream-K partial sums and tile counters).

``scratch(device, dtype, numel)`` returns a flat tensor of at least ``numel`` elements on ``device``, zero-filled when
first allocated, shared by every caller of that device and dtype: kernels on one stream use it one after another,
and each leaves what it must (stream-K counters) as it found it. A request larger than the current buffer allocates
a larger one; the old one stays alive, because a CUDA graph captured earlier may still launch kernels with its
address. Concurrent kernels on two streams must not share it.
"""
from __future__ import annotations

import threading

__all__ = ["scratch"]

_BUFFERS: dict = {}
_KEPT: list = []
_LOCK = threading.Lock()


def scratch(device, dtype, numel: int):
    """A flat ``dtype`` tensor of >= ``numel`` elements on ``device``, zero when first allocated (see module doc)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), dtype)
    with _LOCK:
        buf = _BUFFERS.get(key)
        if buf is None or buf.numel() < numel:
            if buf is not None:
                _KEPT.append(buf)
            buf = torch.zeros(max(int(numel), 1), dtype=dtype, device=device)
            _BUFFERS[key] = buf
        return buf
