"""Shared-memory tile swizzles: XOR of 16-byte chunks within a row, chosen per row size to be bank-conflict-free.

Scheme. A row of ``R`` bytes holds ``C = R / 16`` chunks. The swizzle keeps the row and XORs the low ``b`` bits of
the chunk index with ``(row >> (3 - b)) & (2^b - 1)``; ``W = 2^b`` chunks (``swizzle_bytes = 16 W``) form one XOR
group, and ``W`` divides ``C`` so every row is permuted onto itself (bijective for any ``C``, no padding).
The default takes the largest ``W <= 8`` dividing ``C`` (``k`` = logical chunk, ``r`` = row):

* odd chunk count (16, 48, 80, 112 ... B): W = 1, identity (``swizzle_bytes`` 0): already conflict-free;
* C = 2 mod 4 (32, 96, 160, 224, 288 ... B): W = 2, chunk ``k ^ ((r >> 2) & 1)`` (``swizzle_bytes`` 32);
* C = 4 mod 8 (64, 192, 320, 448 ... B): W = 4, chunk ``k ^ ((r >> 1) & 3)`` (``swizzle_bytes`` 64);
* C = 0 mod 8 (128, 256, 384, 512 ... B): W = 8, chunk ``k ^ (r & 7)`` (``swizzle_bytes`` 128).

Why it is conflict-free (bank group of a 16-B access = (byte address / 16) % 8; the tile starts 128-B aligned and
has a multiple of 8 rows, so every 2-D tile in a stacked buffer does too). Write ``C = W * m``. For ``W < 8``, ``m``
is odd, so over 8 consecutive rows ``r0 + u`` (``r0 % 8 == 0``) the bank group of logical chunk ``k`` is
``(W * ((m u + k // W) % (8 / W)) + ((k % W) ^ (u // (8 / W)))) % 8``: ``u % (8/W)`` picks the multiple of ``W``
(``m`` odd makes it a bijection) and ``u // (8/W)`` the offset below ``W``, so the 8 rows hit 8 different bank
groups (one wavefront per ldmatrix / ldmatrix.trans / stmatrix 8x8 phase). For ``W = 8`` the group is
``(k ^ u) % 8``. A warp's cp.async of consecutive logical chunks in 8-lane phases starting at a multiple of 8:
each phase covers 8 / W whole XOR groups whose bases differ mod 8, so it is conflict-free as well.
For ``R`` equal to the swizzle span this is CuTe's ``Swizzle<b, 4, 3>`` on byte offsets; for longer rows it is
row-based, not address-based (it differs from CuTe there, and it is what makes 96/160/192/224-B rows work).

The maps use only ``^ & >>  <<`` on the indices, so they work on ints, numpy arrays and TVM PrimExprs.

``row_bits`` (optional) replaces ``(r >> (3 - b)) & (2^b - 1)`` by the row bits listed (bit ``i`` of the XOR value is
bit ``row_bits[i]`` of the row): still a permutation of every row's chunks (so bijective, and cp.async rows stay
conflict-free), for loads whose 8 rows per phase are not 8 consecutive rows (``TransposedLoadPlan``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import dtypes as _dt
from ..errors import LayoutError, TileShapeError, UnsupportedConfigError, choices
from .banks import bank_conflicts, phase_wavefronts

CHUNK_BYTES = 16
SWIZZLE_CHOICES = (0, 32, 64, 128)


@dataclass(frozen=True)
class SwizzleLayout:
    """A shared-memory tile layout: logical index -> physical index of the same buffer shape (XOR of 16-byte chunks
    within a row). Applies to the last two dims (row, col); leading dims (e.g. pipeline stage) pass through.

    ``shape``: the buffer shape (>= 2 dims, rows a multiple of 8, ``row_bytes`` a multiple of 16);
    ``dtype``: canonical element type (4- to 64-bit); ``swizzle_bytes``: 0 (identity), 32, 64 or 128;
    ``row_bits``: None (the scheme above) or one row-bit index per XOR bit (``log2(swizzle_bytes / 16)`` of them).
    Assumes the buffer starts 128-byte aligned.
    """

    shape: tuple
    dtype: str
    row_bytes: int
    swizzle_bytes: int
    row_bits: tuple = None
    elem_bits: int = field(init=False, repr=False)
    elems_per_chunk: int = field(init=False, repr=False)
    _row_shift: int = field(init=False, repr=False)
    _mask: int = field(init=False, repr=False)
    _col_shift: int = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "dtype", _dt.canonical(self.dtype))
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        row_bytes = _row_bytes(self.shape, self.dtype)
        if self.row_bytes != row_bytes:
            raise LayoutError(f"row_bytes={self.row_bytes} disagrees with shape {self.shape} of {self.dtype} "
                              f"({row_bytes} bytes per row)")
        _check_swizzle_bytes(self.swizzle_bytes, row_bytes)
        bits = _dt.bits(self.dtype)
        epc = CHUNK_BYTES * 8 // bits
        width = self.swizzle_bytes // CHUNK_BYTES        # chunks per XOR group; 0 = identity
        b = width.bit_length() - 1 if width else 0
        object.__setattr__(self, "elem_bits", bits)
        object.__setattr__(self, "elems_per_chunk", epc)
        object.__setattr__(self, "_row_shift", 3 - b)
        object.__setattr__(self, "_mask", (1 << b) - 1)
        object.__setattr__(self, "_col_shift", epc.bit_length() - 1)
        if self.row_bits is not None:
            rb = tuple(int(x) for x in self.row_bits)
            if len(rb) != b or len(set(rb)) != b or any(x < 0 for x in rb):
                raise UnsupportedConfigError(
                    f"row_bits={self.row_bits!r}: a {self.swizzle_bytes}-B swizzle XORs {b} chunk bit(s), so give {b} "
                    f"distinct non-negative row-bit indices (default: {tuple(range(3 - b, 3))})")
            object.__setattr__(self, "row_bits", rb)

    # -- geometry ---------------------------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        return self.shape[-2]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def chunks_per_row(self) -> int:
        return self.row_bytes // CHUNK_BYTES

    @property
    def leading_shape(self) -> tuple:
        return tuple(self.shape[:-2])

    # -- maps -------------------------------------------------------------------------------------------------------
    def __call__(self, *indices) -> tuple:
        """Logical -> physical index (ints, numpy arrays or PrimExprs); use as ``smem[layout(s, r, c)]`` in TIR."""
        if len(indices) == 1 and isinstance(indices[0], (tuple, list)):
            indices = tuple(indices[0])
        if len(indices) != len(self.shape):
            raise LayoutError(f"{len(indices)} indices for a {len(self.shape)}-D layout of shape {self.shape}")
        if self.swizzle_bytes == 0:
            return tuple(indices)
        *lead, r, c = indices
        return (*lead, r, c ^ (self._xor_of_row(r) << self._col_shift))

    def _xor_of_row(self, r):
        if self.row_bits is None:
            return (r >> self._row_shift) & self._mask
        x = None
        for i, bit in enumerate(self.row_bits):
            term = ((r >> bit) & 1) << i if i else (r >> bit) & 1
            x = term if x is None else x | term
        return x

    def inverse(self, *indices) -> tuple:
        """Physical -> logical index (the XOR is an involution and rows stay put, so this is the same map)."""
        return self(*indices)

    def byte_offset(self, *indices):
        """Byte offset from the buffer start of the physical location of a logical index."""
        phys = self(*indices)
        flat = 0
        for i, extent in zip(phys, self.shape):
            flat = flat * extent + i
        return flat * self.elem_bits // 8

    def describe(self) -> str:
        if self.swizzle_bytes == 0:
            return f"identity ({self.row_bytes}-B rows)"
        b = self._mask.bit_length()
        key = (f"row bits {list(self.row_bits)}" if self.row_bits is not None
               else f"(row >> {self._row_shift}) & {self._mask}")
        return (f"{self.swizzle_bytes}-B XOR swizzle of {self.row_bytes}-B rows: chunk ^= {key}  (16-B chunks, {b} "
                f"bit{'s' if b > 1 else ''})")

    # -- proofs -----------------------------------------------------------------------------------------------------
    def check(self) -> None:
        """Enumerate the whole buffer: logical -> physical is a bijection and ``inverse`` undoes it."""
        idx = np.indices(self.shape, dtype=np.int64)
        phys = self(*idx)
        for p, extent in zip(phys, self.shape):
            if p.min() < 0 or p.max() >= extent:
                raise LayoutError(f"{self!r}: maps outside the buffer")
        hit = np.zeros(int(np.prod(self.shape)), dtype=np.int64)
        np.add.at(hit, np.ravel_multi_index(tuple(phys), self.shape).ravel(), 1)
        if not (hit == 1).all():
            raise LayoutError(f"{self!r}: two logical indices share a physical slot")
        back = self.inverse(*phys)
        if any(not np.array_equal(x, y) for x, y in zip(back, idx)):
            raise LayoutError(f"{self!r}: inverse(forward(x)) != x")

    def _chunk_bytes(self, rows_flat, chunks):
        """Physical byte addresses of logical 16-B chunks (numpy arrays of flat row index and chunk index)."""
        lead_rows = self.leading_shape + (self.rows,)
        index = np.unravel_index(rows_flat, lead_rows)
        return self.byte_offset(*index, chunks * self.elems_per_chunk)

    @staticmethod
    def _sum_over_patterns(addrs, cost):
        # wavefronts only depend on addresses modulo a common shift by a multiple of 128 B (32 banks x 4 B), so
        # each distinct normalised lane pattern is counted once through the bank model and weighted by its count
        valid = addrs >= 0
        base = np.where(valid, addrs, np.iinfo(np.int64).max).min(axis=1, keepdims=True) // 128 * 128
        norm = np.where(valid, addrs - base, -1)
        patterns, counts = np.unique(norm, axis=0, return_counts=True)
        return sum(int(n) * cost([int(a) if a >= 0 else None for a in pat]) for pat, n in zip(patterns, counts))

    def ldmatrix_conflicts(self) -> int:
        """Extra wavefronts summed over every 8-row x 16-B phase a warp tile can issue through ldmatrix /
        ldmatrix.trans / stmatrix (rows r0..r0+7 with r0 % 8 == 0, one logical 16-B chunk), via ``banks``."""
        n_rows = int(np.prod(self.shape[:-1]))
        blocks, k, i = np.meshgrid(np.arange(n_rows // 8), np.arange(self.chunks_per_row), np.arange(8),
                                   indexing="ij")
        addrs = self._chunk_bytes(8 * blocks + i, k).reshape(-1, 8)
        return self._sum_over_patterns(addrs, lambda a: phase_wavefronts(a, CHUNK_BYTES) - 1)

    def cp_async_conflicts(self, warp_step: int = 32) -> int:
        """Extra wavefronts of warps copying consecutive logical 16-B chunks (lane l -> chunk q0 + l) with
        cp.async 16 B, summed over every warp start q0 that is a multiple of ``warp_step`` chunks (32: the usual
        ``chunk = iteration * threads + tid`` loop; 8 also covers any 8-aligned start), via ``banks``."""
        total = int(np.prod(self.shape[:-1])) * self.chunks_per_row
        q = np.arange(0, total, warp_step)[:, None] + np.arange(32)[None, :]
        inside = q < total
        qc = np.where(inside, q, 0)
        addrs = np.where(inside, self._chunk_bytes(qc // self.chunks_per_row, qc % self.chunks_per_row), -1)
        return self._sum_over_patterns(addrs, lambda a: bank_conflicts(a, CHUNK_BYTES))


def _valid_swizzles(row_bytes: int) -> list:
    return [0] + [s for s in SWIZZLE_CHOICES[1:] if row_bytes % s == 0]


def auto_swizzle_bytes(row_bytes: int) -> int:
    """The conflict-free swizzle for a row size: 16 x the largest power of two <= 8 dividing row_bytes / 16
    (0 when that is 1: with an odd chunk count the identity is already conflict-free)."""
    width = 1
    while width < 8 and (row_bytes // CHUNK_BYTES) % (2 * width) == 0:
        width *= 2
    return 0 if width == 1 else CHUNK_BYTES * width


def _shape_and_dtype(buffer_or_shape, dtype):
    if hasattr(buffer_or_shape, "shape") and hasattr(buffer_or_shape, "dtype") and not isinstance(
            buffer_or_shape, (tuple, list, np.ndarray)):
        buf_dtype = str(buffer_or_shape.dtype)
        if dtype is not None and _dt.canonical(dtype) != _dt.canonical(buf_dtype):
            raise UnsupportedConfigError(f"dtype {dtype!r} disagrees with the buffer's dtype {buf_dtype!r}; "
                                         f"omit dtype when passing a buffer")
        dtype = buf_dtype
        dims = list(buffer_or_shape.shape)
    else:
        if dtype is None:
            raise UnsupportedConfigError(f"dtype is required with a shape; valid: {choices(_dt.DTYPES)}")
        dims = list(buffer_or_shape)
    shape = []
    for d in dims:
        try:
            shape.append(int(d))
        except (TypeError, ValueError):
            raise TileShapeError(f"swizzled tiles need a static shape; got dimension {d!r} in {dims}") from None
    return tuple(shape), _dt.canonical(dtype)


def _row_bytes(shape, dt) -> int:
    """Bytes per row of a (..., rows, cols) tile of ``dt``; raises TileShapeError naming the accepted sizes."""
    if len(shape) < 2:
        raise TileShapeError(f"a swizzled tile needs at least 2 dims (row, col); got shape {shape}")
    bits = _dt.bits(dt)
    if bits not in (4, 8, 16, 32, 64):
        raise UnsupportedConfigError(f"unsupported element width {bits} bits for {dt}; valid: 4, 8, 16, 32, 64")
    row_bits = shape[-1] * bits
    if shape[-1] <= 0 or row_bits % (CHUNK_BYTES * 8) != 0:
        per = CHUNK_BYTES * 8 // bits
        raise TileShapeError(
            f"row of {shape[-1]} x {dt} = {row_bits / 8:g} bytes; accepted row sizes are multiples of 16 bytes "
            f"(16, 32, 48, 64, 96, 128, 192, 256, ...), i.e. a last dim that is a multiple of {per} {dt} elements")
    if shape[-2] <= 0 or shape[-2] % 8 != 0:
        raise TileShapeError(f"{shape[-2]} rows; accepted row counts are multiples of 8 (8, 16, 24, ...): "
                             f"ldmatrix phases span 8 rows and stacked tiles must stay 128-byte aligned")
    if any(d <= 0 for d in shape):
        raise TileShapeError(f"every dimension must be positive; got shape {shape}")
    return row_bits // 8


def _check_swizzle_bytes(swizzle_bytes, row_bytes) -> None:
    valid = _valid_swizzles(row_bytes)
    if isinstance(swizzle_bytes, bool) or swizzle_bytes not in valid:
        raise UnsupportedConfigError(
            f"swizzle_bytes={swizzle_bytes!r} is not valid for {row_bytes}-byte rows; valid: "
            f"{', '.join(map(str, valid))} (None = automatic, {auto_swizzle_bytes(row_bytes)} here)")


def make_mma_swizzle_layout(buffer_or_shape, dtype=None, *, swizzle_bytes=None, row_bits=None) -> SwizzleLayout:
    """A bank-conflict-free swizzle for a shared-memory tile read by ldmatrix/stmatrix and filled by cp.async.

    ``buffer_or_shape``: a TVM Buffer (shape and dtype read from it) or a shape tuple (then ``dtype`` is required);
    the last two dims are (row, col) and leading dims pass through. Rows must hold a multiple of 16 bytes
    (``shape[-1] * bits / 8``; int4 counts half a byte per element) and there must be a multiple of 8 rows.
    ``swizzle_bytes``: None picks the conflict-free one for the row size (see the module doc); 0, 32, 64 or 128
    force a scheme (it must divide the row size). ``row_bits``: which row bits form the XOR value (see the module
    doc; ``TensorCoreIntrinEmitter.shared_swizzle`` picks them for M/N-contiguous 8/4-bit operand tiles).
    """
    shape, dt = _shape_and_dtype(buffer_or_shape, dtype)
    row_bytes = _row_bytes(shape, dt)
    if swizzle_bytes is None:
        swizzle_bytes = auto_swizzle_bytes(row_bytes)
    _check_swizzle_bytes(swizzle_bytes, row_bytes)
    return SwizzleLayout(shape, dt, row_bytes, int(swizzle_bytes), None if row_bits is None else tuple(row_bits))
