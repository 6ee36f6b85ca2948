"""Tensor maps and the tensor copies of the Tensor Memory Accelerator (TMA, ``cp.async.bulk.tensor``), tiled mode.

A tensor map (``cuTensorMapEncodeTiled``, TVM's ``T.tensormap_encode_tiled``) describes a global tensor of rank 1..5
(dimension 0 innermost: ``global_dims[0]`` contiguous elements, ``global_strides[d - 1]`` bytes between steps of
dimension d >= 1) and a box: ``box_dims[d]`` elements traversed along dimension d every ``element_strides[d]``-th
element (PTX ISA "Tensor access modes, tiled mode": the traversal stride is the exact number of elements skipped).

A tensor copy with start coordinates ``c`` moves the box elements ``c[d] + i_d * element_strides[d]`` for
``0 <= i_d < ceil(box_dims[d] / element_strides[d])``. In shared memory the box is dense (row-major, i_0 fastest),
``box_bytes`` in all, starting at the instruction's shared address; the swizzle modes (32 / 64 / 128 bytes) then permute
its 16-byte chunks with ``Swizzle<b,4,3>`` on the absolute shared byte address (chunk bits [4, 4+b) ^= bits [7, 7+b),
b = log2(span / 16)): the same address function the wgmma matrix descriptors use (``mmaemit.ptx.wgmma``), whose
pattern repeats every 256 / 512 / 1024 bytes. Loads fill elements outside the tensor with zeros (or, with
``oob_fill=1`` on a float type, the canonical NaN) and always count the full ``box_bytes`` towards the mbarrier's
transaction count; stores write only the elements inside the tensor.

Validation follows the CUDA driver's rules for ``cuTensorMapEncodeTiled`` (also stated by TVM's TMA tile primitive):
rank 1..5; global dims in (0, 2^32]; byte strides multiples of 16 and below 2^40; global address 16-byte aligned;
box dims in [1, 256]; element strides in [1, 8] with element_strides[0] == 1; the inner box a multiple of 16 bytes and
no larger than the swizzle span. Interleaved layouts (``interleave`` != 0) and im2col mode are not implemented.

Hardware faults measured on the H100 (sm_90a, CUDA 13, 2026-11-26; each case a separate process, a TMA load of a box
into shared memory then a TMA store of it; ``tests/test_interp_hopper.py``), which no PTX or driver documentation we
know of states: copies the encoder accepts that stop the kernel with ``cudaErrorIllegalInstruction``.
``hardware_fault`` applies them; the interpreter reports them (kind "tma").

* A **store** (shared::cta -> global) whose box starts at a negative coordinate in any dimension faults (measured with
  both coordinates negative on 2-D maps, swizzled or not). Loads may start at negative coordinates (the outside is
  filled) and stores may run past the positive end of a dimension (the outside is dropped).
* On a **rank-1** map, a load whose box is not entirely inside the tensor faults (dims 100 and 104, box 64, start 60);
  stores are held to the same rule (conservatively: no rank-1 store past the end was measured on its own). Partly
  out-of-bounds loads of rank >= 2 maps are fine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, LayoutError, UnsupportedConfigError, choices
from .wgmma import swizzle_address

__all__ = ["TMA_DTYPES", "TMA_SWIZZLE_BYTES", "TensorMap", "encode_tiled", "box_element_offsets",
           "box_smem_addresses", "gather_box", "scatter_box", "box_chunk_origins", "hardware_fault"]

#: tensor-map element types (TVM dtype names) -> bytes per element
TMA_DTYPES = {"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "uint64": 8, "int64": 8,
              "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "float8_e4m3fn": 1, "float8_e5m2": 1}
#: the ``swizzle`` enum (CU_TENSOR_MAP_SWIZZLE_*) -> span in bytes (0 = no swizzle)
TMA_SWIZZLE_BYTES = {0: 0, 1: 32, 2: 64, 3: 128}
_FLOATS = ("float16", "bfloat16", "float32", "float64", "float8_e4m3fn", "float8_e5m2")
_NAN_BITS = {2: 0x7FFF, 4: 0x7FFFFFFF, 8: 0x7FFFFFFFFFFFFFFF, 1: 0x7F}


@dataclass(frozen=True)
class TensorMap:
    """An encoded tiled tensor map (all tuples innermost dimension first)."""

    dtype: str
    global_address: int
    global_dims: tuple
    global_strides: tuple         # bytes, for dimensions 1 .. rank-1
    box_dims: tuple
    element_strides: tuple
    swizzle: int = 0              # CU_TENSOR_MAP_SWIZZLE_*: 0 none, 1 32B, 2 64B, 3 128B
    oob_fill: int = 0             # 0 zeros, 1 NaN (float types)
    l2_promotion: int = 0
    interleave: int = 0
    name: str = ""

    @property
    def rank(self) -> int:
        return len(self.global_dims)

    @property
    def elem_bytes(self) -> int:
        return TMA_DTYPES[self.dtype]

    @property
    def swizzle_bytes(self) -> int:
        """0 (no swizzle), 32, 64 or 128."""
        return TMA_SWIZZLE_BYTES[self.swizzle]

    @property
    def box_extents(self) -> tuple:
        """Elements of the box along each dimension in shared memory: ceil(box_dims / element_strides)."""
        return tuple(-(-b // s) for b, s in zip(self.box_dims, self.element_strides))

    @property
    def inner_box_bytes(self) -> int:
        return self.box_extents[0] * self.elem_bytes

    @property
    def box_bytes(self) -> int:
        """Bytes one copy moves into shared memory (the transaction count a load signals)."""
        return int(np.prod(self.box_extents)) * self.elem_bytes

    @property
    def byte_strides(self) -> tuple:
        """Byte stride of every dimension (dimension 0: the element size)."""
        return (self.elem_bytes,) + tuple(self.global_strides)

    def describe(self) -> str:
        sw = f"{self.swizzle_bytes}-byte swizzle" if self.swizzle else "no swizzle"
        return (f"tensor map {self.name + ' ' if self.name else ''}({self.dtype}, dims {list(self.global_dims)}, "
                f"byte strides {list(self.global_strides)}, box {list(self.box_dims)}"
                f"{', element strides ' + str(list(self.element_strides)) if any(s != 1 for s in self.element_strides) else ''}"
                f", {sw})")


def encode_tiled(dtype, global_address, global_dims, global_strides, box_dims, element_strides=None, *,
                 interleave=0, swizzle=0, l2_promotion=0, oob_fill=0, name="") -> TensorMap:
    """Validate the arguments of ``cuTensorMapEncodeTiled`` and return the ``TensorMap`` (raises a clear error
    naming the rule and the valid choices for an illegal map). ``global_strides`` has rank - 1 byte strides."""
    dtype = str(dtype)
    if dtype not in TMA_DTYPES:
        raise UnsupportedConfigError(f"tensor map dtype {dtype!r}; valid: {choices(TMA_DTYPES)}")
    dims = tuple(int(d) for d in global_dims)
    rank = len(dims)
    what = f"tensor map{' ' + name if name else ''}"
    if not 1 <= rank <= 5:
        raise ArgumentError(f"{what}: rank {rank}; valid: 1..5")
    strides = tuple(int(s) for s in global_strides)
    box = tuple(int(b) for b in box_dims)
    es = tuple(int(e) for e in element_strides) if element_strides is not None else (1,) * rank
    if len(strides) != rank - 1 or len(box) != rank or len(es) != rank:
        raise ArgumentError(f"{what}: rank {rank} needs {rank} global dims, {rank - 1} byte strides, {rank} box dims "
                            f"and {rank} element strides; got {len(dims)}, {len(strides)}, {len(box)}, {len(es)}")
    if interleave not in (0, 1, 2):
        raise ArgumentError(f"{what}: interleave {interleave}; valid: 0 (none), 1 (16B), 2 (32B)")
    if interleave != 0:
        raise UnsupportedConfigError(f"{what}: interleaved layouts (interleave={interleave}) are not implemented; "
                                     f"valid: interleave=0")
    if swizzle not in TMA_SWIZZLE_BYTES:
        raise ArgumentError(f"{what}: swizzle {swizzle}; valid: 0 (none), 1 (32B), 2 (64B), 3 (128B)")
    if oob_fill not in (0, 1):
        raise ArgumentError(f"{what}: oob_fill {oob_fill}; valid: 0 (zeros), 1 (NaN)")
    if oob_fill == 1 and dtype not in _FLOATS:
        raise ArgumentError(f"{what}: oob_fill=1 (NaN) needs a float dtype, not {dtype}")
    if l2_promotion not in (0, 1, 2, 3):
        raise ArgumentError(f"{what}: l2_promotion {l2_promotion}; valid: 0..3")
    addr = int(global_address)
    if addr % 16:
        raise ArgumentError(f"{what}: global address {addr:#x} is not 16-byte aligned")
    for i, d in enumerate(dims):
        if not 0 < d <= 1 << 32:
            raise ArgumentError(f"{what}: global dim {i} = {d}; valid: 1..2^32")
    for i, s in enumerate(strides):
        if s < 0 or s >= 1 << 40 or s % 16:
            raise ArgumentError(f"{what}: byte stride of dimension {i + 1} = {s}; it must be a multiple of 16 below "
                                f"2^40 (pad the rows of the global tensor to 16 bytes)")
    for i, b in enumerate(box):
        if not 1 <= b <= 256:
            raise LayoutError(f"{what}: box dim {i} = {b}; valid: 1..256")
    for i, e in enumerate(es):
        if not 1 <= e <= 8:
            raise LayoutError(f"{what}: element stride {i} = {e}; valid: 1..8")
    if es[0] != 1:
        raise LayoutError(f"{what}: element stride 0 = {es[0]}; the innermost traversal stride must be 1")
    tm = TensorMap(dtype=dtype, global_address=addr, global_dims=dims, global_strides=strides, box_dims=box,
                   element_strides=es, swizzle=int(swizzle), oob_fill=int(oob_fill), l2_promotion=int(l2_promotion),
                   interleave=int(interleave), name=name)
    inner = tm.inner_box_bytes
    if inner % 16:
        raise LayoutError(f"{what}: the inner box is {inner} bytes ({box[0]} x {tm.elem_bytes}); it must be a multiple "
                          f"of 16 bytes")
    if tm.swizzle and inner > tm.swizzle_bytes:
        raise LayoutError(f"{what}: the inner box is {inner} bytes, larger than the {tm.swizzle_bytes}-byte swizzle "
                          f"span; valid: inner box <= {tm.swizzle_bytes} bytes (or a wider swizzle)")
    return tm


def _box_index(tm: TensorMap):
    """(N, rank) box indices i_d of every box element, dense shared-memory order (i_0 fastest)."""
    ext = tm.box_extents
    grids = np.meshgrid(*[np.arange(e, dtype=np.int64) for e in reversed(ext)], indexing="ij")
    return np.stack([g.reshape(-1) for g in reversed(grids)], axis=1)


def box_element_offsets(tm: TensorMap, coords):
    """For the box starting at ``coords`` (rank ints, innermost first): per box element in dense shared-memory order,
    (global element coordinates (N, rank), in-tensor mask (N,), global byte offsets from the map's address (N,))."""
    c = np.asarray([int(x) for x in coords], np.int64)
    if len(c) != tm.rank:
        raise ArgumentError(f"{tm.describe()}: {len(c)} coordinates for a rank-{tm.rank} map")
    g = c[None, :] + _box_index(tm) * np.asarray(tm.element_strides, np.int64)[None, :]
    inb = np.all((g >= 0) & (g < np.asarray(tm.global_dims, np.int64)[None, :]), axis=1)
    off = g @ np.asarray(tm.byte_strides, np.int64)
    return g, inb, off


def box_smem_addresses(tm: TensorMap, smem_addr: int):
    """(N,) absolute shared byte address of every box element (dense order, then the map's swizzle)."""
    n = int(np.prod(tm.box_extents))
    dense = int(smem_addr) + np.arange(n, dtype=np.int64) * tm.elem_bytes
    return swizzle_address(dense, tm.swizzle_bytes)


def gather_box(tm: TensorMap, gmem, base: int, coords):
    """The box a load brings: ``gmem`` is the global allocation as bytes (uint8) and ``base`` the byte offset of the
    map's address in it. Returns (data (N, elem_bytes) uint8 in dense order, in-tensor mask (N,), outside-allocation
    mask (N,): in-tensor elements whose bytes fall outside ``gmem``, which read as the fill)."""
    _g, inb, off = box_element_offsets(tm, coords)
    eb = tm.elem_bytes
    byte = base + off
    outside = inb & ((byte < 0) | (byte + eb > gmem.size))
    ok = inb & ~outside
    data = np.zeros((len(off), eb), np.uint8)
    if tm.oob_fill == 1:
        data[:] = np.frombuffer(int(_NAN_BITS[eb]).to_bytes(eb, "little"), np.uint8)
    if ok.any():
        data[ok] = gmem[byte[ok][:, None] + np.arange(eb)]
    return data, inb, outside


def scatter_box(tm: TensorMap, gmem, base: int, coords, data):
    """A store: write the in-tensor elements of ``data`` (N, elem_bytes) (dense order) into ``gmem`` (bytes, the map's
    address at ``base``); elements outside the tensor are dropped. Returns (in-tensor mask, outside-allocation mask);
    in-tensor elements outside ``gmem`` are not written."""
    _g, inb, off = box_element_offsets(tm, coords)
    eb = tm.elem_bytes
    byte = base + off
    outside = inb & ((byte < 0) | (byte + eb > gmem.size))
    ok = inb & ~outside
    if ok.any():
        gmem[byte[ok][:, None] + np.arange(eb)] = np.asarray(data, np.uint8).reshape(len(off), eb)[ok]
    return inb, outside


def box_chunk_origins(tm: TensorMap, coords):
    """(N16,) global byte offset (from the map's address, whether inside the tensor or not) of the first element of
    every 16-byte chunk of the dense box: what a consumer of the shared tile reads where."""
    _g, _inb, off = box_element_offsets(tm, coords)
    per = 16 // tm.elem_bytes if tm.elem_bytes <= 16 else 1
    return off[::per]


def hardware_fault(global_dims, box_dims, coords, *, store: bool, order: str = "innermost first"):
    """The measured H100 fault a tensor copy runs into (see the module docstring), as a message naming the rule, the
    coordinates and the box; None when no measured rule rejects the copy. ``global_dims``, ``box_dims`` and ``coords``
    are in the same order (``order`` names it in the message); an entry may be None where it is not known (a run-time
    coordinate, a symbolic dimension): rules that need it are then not applied."""
    dims, box, c = list(global_dims), list(box_dims), list(coords)
    where = f"box {box} at coordinates {c} ({order}) of a tensor with dims {dims}"
    measured = "faults with an illegal instruction on the H100 (measured 2026-11-26)"
    if store:
        neg = [d for d, x in enumerate(c) if x is not None and x < 0]
        if neg:
            return (f"a TMA store whose box starts at a negative coordinate ({c[neg[0]]} in position {neg[0]}) "
                    f"{measured}; negative coordinates are fine for loads only: {where}")
    if len(dims) == 1 and c[0] is not None and dims[0] is not None and not 0 <= c[0] <= dims[0] - box[0]:
        legal = (f"start in 0..{dims[0] - box[0]}" if box[0] <= dims[0]
                 else "no start is legal: the box is longer than the tensor")
        if store:
            return (f"a rank-1 TMA store whose box is not entirely inside the tensor is refused (a rank-1 load of such "
                    f"a box {measured}; stores are held to the same rule, not measured on their own); a rank-1 box "
                    f"must lie in [0, {dims[0]}) ({legal}): {where}")
        return (f"a rank-1 TMA load whose box is not entirely inside the tensor {measured}; a rank-1 box must lie in "
                f"[0, {dims[0]}) ({legal}): {where}")
    return None
