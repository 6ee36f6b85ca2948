"""Pure semantics of Hopper ``wgmma.mma_async`` (sm_90a): matrix descriptors, the K-major shared-memory layouts,
register fragments and the warpgroup multiply-accumulate. Nothing here knows about TIR, threads or the memory model
(the interpreter's ``wgmma_exec`` binds it); every function works on plain ints and numpy arrays.

Transcribed from the PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (9.7.15):

* Matrix descriptor (9.7.15.5.1.2.2), a 64-bit value: bits 13-0 start address, 29-16 leading dimension byte offset
  (LBO), 45-32 stride dimension byte offset (SBO), each stored as ``(x & 0x3FFFF) >> 4``; bits 51-49 base offset;
  bits 63-62 swizzle mode (0 none, 1 = 128-byte, 2 = 64-byte, 3 = 32-byte).
* K-major canonical layouts (9.7.15.5.1.2.1.3), in 16-byte units T: no swizzle ``((8,m),(T,2k)):((1T,SBO),(1,LBO))``;
  W-byte swizzle (W = 32/64/128) ``((8,m),(T,2k)):((W/16 T,SBO),(1,T))`` followed by ``Swizzle<log2(W/16),4,3>``
  on the byte address (16-byte chunk bits [4, 4+b) ^= bits [7, 7+b)). The swizzle acts on the absolute shared
  address, so a pattern whose repeat (1024/512/256 bytes) starts on that boundary has base offset 0.
* MN-major canonical layouts (``imm-trans`` = 1, f16 / bf16 only), in 16-byte units: no swizzle
  ``((1,m),(8,k)):((1,SBO),(1,LBO))``; W-byte swizzle ``((W/16,m),(8,k)):((1,LBO),(W/16,SBO))`` then the same
  swizzle (``mnmajor_chunk_addresses``).
* Register fragments (9.7.15.5.1.1.1, ``.m64nNkK``): warp w of the warpgroup holds rows 16w..16w+15; its A fragment
  is the ``mma.m16n8kK`` A fragment of those rows (K = 16 for f16 / bf16, 32 for e4m3 / e5m2 / s8 / u8, 8 for tf32;
  every row holds 32 bytes of K) and its accumulator is the ``mma.m16n8`` C fragment of every 8-column block j:
  ``d[4j + 2h + e] = D[16w + g + 8h, 8j + 2c + e]`` (g = lane / 4, c = lane % 4; f16 accumulators pack two per
  register). The mma.m16n8 maps are read from ``mmaemit.layouts`` (through ``mma_a_coords`` / ``mma_c_coords`` of
  ``mmaemit.ptx.mma``).

The product is formed like ``mmaemit.ptx.mma_sync``: exact products, float64 sum, one rounding to f32 / f16 (NVIDIA
does not specify the accumulation order; compare with a tolerance); integer products are exact with int32
wrap-around (or ``.satfinite`` clamping).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..errors import LayoutError
from .bits import half_values
from .floating import decode_f8
from .mma import mma_a_coords, mma_c_coords
from .rounding import round_f64

__all__ = ["MatrixDescriptor", "decode_matrix_descriptor", "encode_matrix_descriptor", "SWIZZLE_BYTES",
           "swizzle_address", "kmajor_chunk_addresses", "mnmajor_chunk_addresses", "wgmma_a_coords", "wgmma_d_coords",
           "wgmma_mma",
           "element_values", "WGMMA_M", "WGMMA_K", "WGMMA_K_OF", "WGMMA_ELEMENT_BITS"]

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


def mnmajor_chunk_addresses(desc: MatrixDescriptor, k_rows: int, mn_chunks: int):
    """(k_rows, mn_chunks) absolute shared byte addresses of the 16-byte MN chunks of each K row of an MN-major
    operand (``imm-trans`` = 1; f16 / bf16 only).

    Chunk ``c`` of K row ``k`` holds the 16 bytes of MN elements [c T, c T + T) at that k (T = 16 bytes / element
    size). Canonical MN-major layouts (PTX ISA 9.7.15.5.1.2.1.3, in 16-byte units): no swizzle
    ``((1,m),(8,k)):((1,SBO),(1,LBO))``: chunk c at ``start + SBO c``, K row k at ``+ 16 (k % 8) + LBO (k // 8)``;
    W-byte swizzle ``((W/16,m),(8,k)):((1,LBO),(W/16,SBO))``: chunk c at
    ``start + 16 (c % (W/16)) + LBO (c // (W/16))``, K row k at ``+ W (k % 8) + SBO (k // 8)``, then the address
    is swizzled.
    """
    k = np.arange(k_rows, dtype=np.int64)[:, None]
    c = np.arange(mn_chunks, dtype=np.int64)[None, :]
    w = desc.swizzle_bytes
    if w == 0:
        return desc.start + desc.sbo * c + 16 * (k % 8) + desc.lbo * (k // 8)
    per = w // 16
    return swizzle_address(desc.start + 16 * (c % per) + desc.lbo * (c // per) + w * (k % 8) + desc.sbo * (k // 8), w)


#: K of one ``.m64nNkK`` instruction per A / B element type
WGMMA_K_OF = {"f16": 16, "bf16": 16, "tf32": 8, "e4m3": 32, "e5m2": 32, "s8": 32, "u8": 32}
#: bits per element of each wgmma operand type
WGMMA_ELEMENT_BITS = {"f16": 16, "bf16": 16, "tf32": 32, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8}


@functools.lru_cache(maxsize=None)
def wgmma_a_coords(atype: str = "f16"):
    """(row, col) arrays (128, elements) of the A register fragment (RS form) of ``.m64nNkK``: warp w of the
    warpgroup holds rows 16w..16w+15 as the ``mma.m16n8kK`` A fragment (16-bit: K = 16, 8 elements in 4 registers,
    low half first; 8-bit: K = 32, 16 bytes, low byte first; tf32: K = 8, 4 registers)."""
    k = WGMMA_K_OF[atype]
    r, c = mma_a_coords((16, 8, k), atype, atype, "s32" if atype in ("s8", "u8") else "f32")
    warp = np.arange(4)[:, None, None]
    return (r[None] + 16 * warp).reshape(128, -1), np.broadcast_to(c[None], (4,) + c.shape).reshape(128, -1)


@functools.lru_cache(maxsize=None)
def wgmma_d_coords(n: int):
    """(row, col) arrays (128, n // 2) of the accumulator elements of ``.m64nNkK`` (f32 / s32: one per register;
    f16: register j holds elements 2j, 2j + 1, low half first)."""
    r, c = mma_c_coords((16, 8, 16), "f16", "f16", "f32")           # (32, 4)
    warp = np.arange(4)[:, None, None, None]
    j = np.arange(n // 8)[None, None, :, None]
    rows = np.broadcast_to(r[None, :, None, :] + 16 * warp, (4, 32, n // 8, 4))
    cols = np.broadcast_to(c[None, :, None, :] + 8 * j, (4, 32, n // 8, 4))
    return rows.reshape(128, -1), cols.reshape(128, -1)


def element_values(bits, ptype: str):
    """Exact values (float64, or int64 for s8 / u8) of wgmma operand elements given as bit patterns (uint16 for
    f16 / bf16, uint8 for e4m3 / e5m2 / s8 / u8, uint32 for tf32: its low 13 bits are ignored)."""
    if ptype in ("f16", "bf16"):
        return half_values(bits, ptype)
    if ptype in ("e4m3", "e5m2"):
        return decode_f8(bits, ptype)
    if ptype == "tf32":
        return (np.asarray(bits).astype(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)
    if ptype == "s8":
        return np.asarray(bits).astype(np.uint8).view(np.int8).astype(np.int64)
    if ptype == "u8":
        return np.asarray(bits).astype(np.uint8).astype(np.int64)
    raise ValueError(f"wgmma element type {ptype!r}; valid: {sorted(WGMMA_K_OF)}")


def wgmma_mma(n: int, atype: str, a, b, d, scale_d, scale_a: int = 1, scale_b: int = 1, *, btype=None,
              dtype: str = "f32", satfinite: bool = False):
    """``wgmma.mma_async.sync.aligned.m64n{n}k{K}.{dtype}.{atype}.{btype}`` on whole matrices.

    ``a``: (64, K) element bit patterns of A; ``b``: (K, n) of B (element (k, n)); ``d``: (64, n) accumulator input
    (float32 values for f32, float16 for f16, int32 for s32); ``scale_d``: bool (False ignores ``d``);
    ``scale_a``/``scale_b``: +1 or -1 (float types). Float: exact products, float64 sum, one rounding to ``dtype``
    (NVIDIA does not specify the accumulation order: compare with a tolerance). Integer (s32): exact, wrapped to
    int32 (clamped with ``satfinite``). Returns the (64, n) result as float32 / float16 / int32.
    """
    btype = atype if btype is None else btype
    A = element_values(a, atype)
    B = element_values(b, btype)
    if dtype == "s32":
        C = np.asarray(d, np.int32).astype(np.int64) if scale_d else np.zeros((WGMMA_M, n), np.int64)
        D = A @ B + C
        if satfinite:
            D = np.clip(D, -(2 ** 31), 2 ** 31 - 1)
        return D.astype(np.int64).astype(np.uint64).astype(np.uint32).view(np.int32)
    A = A * float(scale_a)
    B = B * float(scale_b)
    C = np.asarray(d).astype(np.float64) if scale_d else np.zeros((WGMMA_M, n))
    with np.errstate(all="ignore"):
        D = A @ B + C
    if dtype == "f16":
        return round_f64(D, 0.0, "f16").view(np.float16)
    return round_f64(D, 0.0, "f32").view(np.float32)
