"""Pure semantics of Hopper ``wgmma.mma_async`` (sm_90a): matrix descriptors, the K-major shared-memory layouts,
register fragments and the warpgroup multiply-accumulate. Nothing here knows about TIR, threads or the memory model
(that is ``wgmma_exec``); every function works on plain ints and numpy arrays.

Transcribed from the PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (9.7.15):

* Matrix descriptor (9.7.15.5.1.2.2), a 64-bit value: bits 13-0 start address, 29-16 leading dimension byte offset
  (LBO), 45-32 stride dimension byte offset (SBO), each stored as ``(x & 0x3FFFF) >> 4``; bits 51-49 base offset;
  bits 63-62 swizzle mode (0 none, 1 = 128-byte, 2 = 64-byte, 3 = 32-byte).
* K-major canonical layouts (9.7.15.5.1.2.1.3), in 16-byte units T: no swizzle ``((8,m),(T,2k)):((1T,SBO),(1,LBO))``;
  W-byte swizzle (W = 32/64/128) ``((8,m),(T,2k)):((W/16 T,SBO),(1,T))`` followed by ``Swizzle<log2(W/16),4,3>``
  on the byte address (16-byte chunk bits [4, 4+b) ^= bits [7, 7+b)). The swizzle acts on the absolute shared
  address, so a pattern whose repeat (1024/512/256 bytes) starts on that boundary has base offset 0.
* Register fragments (9.7.15.5.1.1.1, ``.m64nNk16``): warp w of the warpgroup holds rows 16w..16w+15; its A fragment
  is the ``mma.m16n8k16`` A fragment of those rows and its accumulator is the ``mma.m16n8`` C fragment of every
  8-column block j: ``d[4j + 2h + e] = D[16w + g + 8h, 8j + 2c + e]`` (g = lane / 4, c = lane % 4). The mma.m16n8
  maps are read from ``mmaemit.layouts`` (through ``mma_a_coords`` / ``mma_c_coords`` of ``mmaemit.ptx.mma``).

The product is formed like ``mmaemit.ptx.mma_sync``: exact products, float64 sum, one rounding to f32 (NVIDIA does not
specify the accumulation order; compare with a tolerance).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError
from .bits import half_values
from .mma import mma_a_coords, mma_c_coords
from .rounding import round_f64

__all__ = ["MatrixDescriptor", "decode_matrix_descriptor", "encode_matrix_descriptor", "SWIZZLE_BYTES",
           "swizzle_address", "kmajor_chunk_addresses", "wgmma_a_coords", "wgmma_d_coords", "wgmma_mma",
           "WGMMA_M", "WGMMA_K"]

WGMMA_M = 64
#: K of one ``.m64nNk16`` instruction (f16 / bf16)
WGMMA_K = 16

#: descriptor swizzle-mode field -> swizzle width in bytes (0 = no swizzle)
SWIZZLE_BYTES = {0: 0, 1: 128, 2: 64, 3: 32}
_FIELD = 0x3FFF


@dataclass(frozen=True)
class MatrixDescriptor:
    """A decoded wgmma matrix descriptor. ``start``, ``lbo``, ``sbo`` in bytes (the 4 dropped low bits are 0)."""

    start: int
    lbo: int
    sbo: int
    base_offset: int
    layout_type: int

    @property
    def swizzle_bytes(self) -> int:
        """0 (no swizzle), 32, 64 or 128."""
        return SWIZZLE_BYTES[self.layout_type]


def decode_matrix_descriptor(desc) -> MatrixDescriptor:
    """Split a 64-bit wgmma matrix descriptor into its fields (PTX ISA matrix descriptor format)."""
    d = int(np.uint64(desc)) if isinstance(desc, np.generic) else int(desc) & (2 ** 64 - 1)
    return MatrixDescriptor(start=(d & _FIELD) << 4, lbo=((d >> 16) & _FIELD) << 4, sbo=((d >> 32) & _FIELD) << 4,
                            base_offset=(d >> 49) & 0x7, layout_type=(d >> 62) & 0x3)


#: the ``swizzle`` argument of ``T.cuda.wgmma.encode_matrix_descriptor`` -> descriptor layout-type field
_TVM_SWIZZLE_ARG = {0: 0, 1: 3, 2: 2, 3: 1}


def encode_matrix_descriptor(smem_addr, ldo, sdo, swizzle):
    """The value ``T.cuda.wgmma.encode_matrix_descriptor(desc_ptr, ptr, ldo, sdo, swizzle)`` stores (TVM 0.27's C
    helper over the ``GmmaDescriptor`` bitfield union): start = ``smem_addr >> 4`` and ``ldo``/``sdo`` (already in
    16-byte units) truncated to 14 bits, base offset 0, ``swizzle`` 0/1/2/3 (none/32B/64B/128B) mapped to layout
    type 0/3/2/1 (any other value leaves 0, as the C ``switch`` does).

    Ints give an int; numpy arrays (broadcast together) give a uint64 array.
    """
    if all(isinstance(x, (int, np.integer)) for x in (smem_addr, ldo, sdo, swizzle)):
        layout = _TVM_SWIZZLE_ARG.get(int(swizzle), 0)
        return (((int(smem_addr) >> 4) & _FIELD) | ((int(ldo) & _FIELD) << 16) | ((int(sdo) & _FIELD) << 32)
                | (layout << 62))
    sa, lo, so, sw = np.broadcast_arrays(*(np.asarray(x).astype(np.int64) for x in (smem_addr, ldo, sdo, swizzle)))
    layout = np.select([sw == k for k in _TVM_SWIZZLE_ARG], list(_TVM_SWIZZLE_ARG.values()), 0).astype(np.uint64)
    u = np.uint64
    return (((sa >> 4) & _FIELD).astype(u) | ((lo & _FIELD).astype(u) << u(16)) | ((so & _FIELD).astype(u) << u(32))
            | (layout << u(62)))


def swizzle_address(addr, swizzle_bytes: int):
    """``Swizzle<b,4,3>`` on byte addresses (b = log2(swizzle_bytes / 16)): 16-byte chunk bits [4, 4+b) ^= bits
    [7, 7+b). ``swizzle_bytes`` 0 leaves the address unchanged."""
    addr = np.asarray(addr, np.int64)
    if swizzle_bytes == 0:
        return addr
    mask = swizzle_bytes // 16 - 1
    return addr ^ (((addr >> 7) & mask) << 4)


def kmajor_chunk_addresses(desc: MatrixDescriptor, rows: int, chunks: int = 2):
    """(rows, chunks) absolute shared byte addresses of the 16-byte K chunks of each M/N row of a K-major operand.

    Row ``r`` is an M row (A) or an N column (B); chunk ``j`` holds K bytes [16j, 16j + 16) of the instruction's K
    slice (2 chunks = 32 bytes = k16 of f16/bf16). Canonical K-major layouts: no swizzle puts row r at
    ``start + 16 (r % 8) + SBO (r // 8)`` and chunk j at ``+ LBO j``; a W-byte swizzle puts row r at
    ``start + W (r % 8) + SBO (r // 8)``, chunk j at ``+ 16 j``, then swizzles the address.
    """
    r = np.arange(rows, dtype=np.int64)[:, None]
    j = np.arange(chunks, dtype=np.int64)[None, :]
    w = desc.swizzle_bytes
    if w == 0:
        return desc.start + 16 * (r % 8) + desc.sbo * (r // 8) + desc.lbo * j
    if 16 * chunks > w:
        raise LayoutError(f"{16 * chunks} bytes of K per row do not fit a {w}-byte swizzle row; valid: "
                          f"chunks <= {w // 16}")
    return swizzle_address(desc.start + w * (r % 8) + desc.sbo * (r // 8) + 16 * j, w)


@functools.lru_cache(maxsize=None)
def wgmma_a_coords(atype: str = "f16"):
    """(row, col) arrays (128, 8) of the A register fragment (``.m64nNk16``, 16-bit A): thread t's element i lives in
    register i // 2, half i % 2 (low half first)."""
    r, c = mma_a_coords((16, 8, 16), atype, atype, "f32")           # (32, 8)
    warp = np.arange(4)[:, None, None]
    return (r[None] + 16 * warp).reshape(128, -1), np.broadcast_to(c[None], (4,) + c.shape).reshape(128, -1)


@functools.lru_cache(maxsize=None)
def wgmma_d_coords(n: int):
    """(row, col) arrays (128, n // 2) of the f32 accumulator fragment of ``.m64nNk16``."""
    r, c = mma_c_coords((16, 8, 16), "f16", "f16", "f32")           # (32, 4)
    warp = np.arange(4)[:, None, None, None]
    j = np.arange(n // 8)[None, None, :, None]
    rows = np.broadcast_to(r[None, :, None, :] + 16 * warp, (4, 32, n // 8, 4))
    cols = np.broadcast_to(c[None, :, None, :] + 8 * j, (4, 32, n // 8, 4))
    return rows.reshape(128, -1), cols.reshape(128, -1)


def wgmma_mma(n: int, atype: str, a, b, d, scale_d, scale_a: int = 1, scale_b: int = 1):
    """``wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{atype}.{atype}`` on whole matrices.

    ``a``: (64, 16) element bit patterns (uint16) of A; ``b``: (16, n) uint16 of B (element (k, n)); ``d``: (64, n)
    float32 accumulator input; ``scale_d``: bool (False ignores ``d``); ``scale_a``/``scale_b``: +1 or -1.
    Returns the (64, n) float32 result ``scale_a A . scale_b B + (scale_d ? d : 0)``, rounded once to f32.
    """
    A = half_values(a, atype) * float(scale_a)
    B = half_values(b, atype) * float(scale_b)
    C = np.asarray(d, np.float32).astype(np.float64) if scale_d else np.zeros((WGMMA_M, n))
    with np.errstate(all="ignore"):
        D = A @ B + C
    return round_f64(D, 0.0, "f32").view(np.float32)
