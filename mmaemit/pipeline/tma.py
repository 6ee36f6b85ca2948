"""TMA (the Hopper bulk tensor copy engine): tensor maps, box loads into shared memory, box stores to global.

A :class:`TmaTile` describes one tensor map: the global tensor (logical shape, outermost dimension first, as the
kernel's ``T.Buffer`` declares it; dense row-major), the box that one copy moves (outermost first) and the shared
memory swizzle the box lands in. The swizzle comes from the same :class:`mmaemit.layouts.SwizzleLayout` object that
the consumer reads the tile through (``TmaTile.for_layout``), so a TMA box and a wgmma descriptor can never disagree.

Hardware facts (CUDA driver ``cuTensorMapEncodeTiled``, PTX ISA ``cp.async.bulk.tensor``), all checked in Python
before any code is generated:

* rank 1..5; every global dimension in [1, 2^32]; the byte stride of every non-innermost dimension a multiple of 16
  and below 2^40 (so the innermost row must hold a multiple of 16 bytes); the innermost dimension is contiguous.
* every box dimension in [1, 256]; the innermost box extent times the element size a multiple of 16 bytes.
* with a swizzle of S bytes (32, 64, 128) the innermost box row holds at most S bytes: a 128-byte-swizzled box of
  fp16 is at most 64 elements wide. The swizzle is CuTe's ``Swizzle<log2(S/16), 4, 3>`` on the absolute shared
  address (16-byte chunk bits [4, 4+b) ^= bits [7, 7+b)), which equals :class:`SwizzleLayout`'s row-based XOR when
  every shared row is exactly S bytes and the tile starts on a ``8 * S``-byte boundary (1024 B for 128-byte
  swizzle; the destination must be 128-byte aligned without swizzle).
* out-of-bounds elements of a load are filled with zeros (or NaN, ``oob_fill="nan"``, floats only) and still count
  towards the mbarrier's transaction bytes; out-of-bounds elements of a store are not written. So ragged M / N / K
  need no padding by the caller, within the two limits below.
* measured on the H100 (2026-11-26, ``cudaErrorIllegalInstruction``; not documented PTX rules, see
  ``mmaemit.ptx.tma.hardware_fault``, which the interpreter applies): a **store** whose box starts at a negative
  coordinate in any dimension faults (loads may start at negative coordinates; stores may run past the positive
  end); on a **rank-1** map a load whose box is not entirely inside the tensor faults (stores are held to the same
  rule). So rank-1 boxes must tile the tensor exactly (or the last box start at ``length - box``), and partial tiles
  at the low end need a rank >= 2 map. :meth:`TmaTile.load` / :meth:`TmaTile.store` refuse such compile-time-constant
  coordinates with a ``TileShapeError``; run-time coordinates are checked by the interpreter.

Code forms (what :meth:`TmaTile.load` / :meth:`TmaTile.store` emit; verified on the H100, see the notes):
``cp.async.bulk.tensor.{r}d.shared::cluster.global.mbarrier::complete_tx::bytes[.multicast::cluster]`` and
``cp.async.bulk.tensor.{r}d.global.shared::cta.tile.bulk_group`` with ``cp.async.bulk.commit_group`` /
``cp.async.bulk.wait_group[.read] N``. The map is encoded on the host for every launch
(``T.tensormap_encode_tiled``) and reaches the kernel as a ``__grid_constant__ CUtensorMap``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import dtypes as _dt
from ..errors import LayoutError, TileShapeError, UnsupportedConfigError, choices
from ..ptx.tma import hardware_fault
from .stmt import emit

__all__ = ["TmaTile", "bulk_commit", "bulk_wait", "SWIZZLE_MODES", "OOB_FILLS", "L2_PROMOTIONS"]

#: swizzle bytes -> CUtensorMapSwizzle enum value
SWIZZLE_MODES = {0: 0, 32: 1, 64: 2, 128: 3}
#: oob_fill -> CUtensorMapFloatOOBfill enum value
OOB_FILLS = {"zero": 0, "nan": 1}
#: L2 promotion bytes -> CUtensorMapL2promotion enum value
L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}

_TMA_DTYPES = ("float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "uint32", "float8_e4m3fn",
               "float8_e5m2")


def _symbolic(d) -> bool:
    return type(d).__module__.startswith("tvm") and type(d).__name__ != "IntImm"


def _constant(c):
    """The value of a compile-time-constant coordinate (a Python int or a TIR IntImm), else None."""
    if isinstance(c, int):
        return int(c)
    if type(c).__name__ == "IntImm" and type(c).__module__.startswith("tvm"):
        return int(c.value)
    return None


@dataclass(frozen=True)
class TmaTile:
    """One TMA tensor map: ``global_shape`` / ``box`` are outermost-first element counts (``box`` has one entry per
    global dimension; use 1 to take a single index of an outer dimension), ``swizzle_bytes`` 0/32/64/128.

    ``multicast``: the cluster size a multicast load spreads over (1 = no multicast). ``l2_promotion``: 0, 64, 128 or
    256 bytes. ``oob_fill``: ``"zero"`` or ``"nan"``.

    ``strides``: None for a dense row-major tensor (each dimension's stride the product of the inner extents), or the
    element stride of every dimension, outermost first, the innermost 1: the map is then a *view* of the buffer it
    encodes, its dimensions in any stride order, e.g. ``(K // 64, M, 64)`` with strides ``(64, K, 1)`` over an
    ``[M, K]`` matrix, whose box ``(c, rows, 64)`` lands ``c`` column chunks of ``rows`` x 64 one after another in
    shared memory (one copy instead of ``c``). Any dimension of a view may be symbolic.
    """

    global_shape: tuple
    dtype: str
    box: tuple
    swizzle_bytes: int = 0
    oob_fill: str = "zero"
    l2_promotion: int = 128
    multicast: int = 1
    strides: tuple | None = None

    def __post_init__(self):
        object.__setattr__(self, "dtype", _dt.canonical(self.dtype))
        # the outermost dimension (any dimension of a view with explicit strides) may be a TIR expression (a symbolic
        # row count, e.g. a dynamic M): the host code encodes the map from the argument's shape at every launch
        view = self.strides is not None
        dims = tuple(self.global_shape)
        object.__setattr__(self, "global_shape", tuple(d if (i == 0 or view) and _symbolic(d) else int(d)
                                                       for i, d in enumerate(dims)))
        object.__setattr__(self, "box", tuple(int(b) for b in self.box))
        if view:
            object.__setattr__(self, "strides", tuple(int(s) for s in self.strides))
        self._validate()

    # -- construction -------------------------------------------------------------------------------------------
    @classmethod
    def for_layout(cls, global_shape, layout, *, box_outer=None, **kw) -> "TmaTile":
        """The tensor map whose box fills one ``(rows, cols)`` tile of ``layout`` (a ``SwizzleLayout``; its leading
        dims, e.g. pipeline stages, are separate boxes). Global dims beyond the last two get box extent 1 unless
        ``box_outer`` gives them. The swizzle is the layout's; its rows must be exactly one swizzle span (or the
        layout unswizzled)."""
        rows, cols = layout.rows, layout.cols
        sw = layout.swizzle_bytes
        if sw and layout.row_bytes != sw:
            raise LayoutError(
                f"a {layout.row_bytes}-byte row with a {sw}-byte swizzle is not a TMA layout: TMA swizzles absolute "
                f"addresses in {sw}-byte rows, so a box row holds at most {sw} bytes. Split the tile into "
                f"{layout.row_bytes // sw} column atoms of {sw * 8 // layout.elem_bits} elements (a layout of shape "
                f"(..., {layout.row_bytes // sw}, {rows}, {sw * 8 // layout.elem_bits})) and load one box per atom")
        view = kw.get("strides") is not None
        gs = tuple(d if (i == 0 or view) and _symbolic(d) else int(d) for i, d in enumerate(global_shape))
        if len(gs) < 2:
            box = (cols,)
            if rows != 1:
                raise TileShapeError(f"a rank-1 tensor map takes a one-row tile; the layout has {rows} rows")
        else:
            outer = tuple(box_outer) if box_outer is not None else (1,) * (len(gs) - 2)
            if len(outer) != len(gs) - 2:
                raise TileShapeError(f"box_outer needs {len(gs) - 2} extents for a rank-{len(gs)} tensor, "
                                     f"got {len(outer)}")
            box = (*outer, rows, cols)
        return cls(gs, layout.dtype, box, sw, **kw)

    # -- derived sizes ------------------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.global_shape)

    @property
    def elem_bytes(self) -> int:
        return _dt.bits(self.dtype) // 8

    @property
    def box_bytes(self) -> int:
        """Bytes one load moves into each destination CTA (the mbarrier transaction count), OOB fill included."""
        n = 1
        for b in self.box:
            n *= b
        return n * self.elem_bytes

    @property
    def smem_alignment(self) -> int:
        """Required alignment of the shared-memory destination / source in bytes."""
        return 8 * self.swizzle_bytes if self.swizzle_bytes else 128

    def byte_strides(self) -> tuple:
        """Byte strides of the dimensions above the innermost, innermost-first (what the encoder takes)."""
        if self.strides is not None:
            return tuple(st * self.elem_bytes for st in reversed(self.strides[:-1]))
        strides, acc = [], self.elem_bytes
        for d in reversed(self.global_shape[1:]):
            acc *= d
            strides.append(acc)
        return tuple(strides)

    def _validate(self):
        if self.dtype not in _TMA_DTYPES:
            raise UnsupportedConfigError(f"TMA dtype {self.dtype!r} is not supported; valid: {choices(_TMA_DTYPES)}")
        r = self.rank
        if not 1 <= r <= 5:
            raise UnsupportedConfigError(f"a tensor map has rank 1..5; got {r} dims {self.global_shape}")
        if len(self.box) != r:
            raise TileShapeError(f"box {self.box} needs one extent per global dimension ({r})")
        for d in self.global_shape:
            if _symbolic(d):
                continue
            if not 1 <= d <= 2 ** 32:
                raise TileShapeError(f"global dimension {d} of {self.global_shape} is outside [1, 2^32]")
        if self.strides is not None:
            if len(self.strides) != r or self.strides[-1] != 1 or any(st < 1 for st in self.strides):
                raise TileShapeError(f"strides {self.strides}: one positive element stride per dimension "
                                     f"(outermost first), the innermost 1 (TMA reads rows contiguously)")
            for st in self.byte_strides():
                if st % 16:
                    raise TileShapeError(f"strides {self.strides}: a byte stride of {st} is not a multiple of 16 "
                                         f"bytes, which TMA needs")
        inner_bytes = self.global_shape[-1] * self.elem_bytes
        if r > 1 and self.strides is None and inner_bytes % 16:
            raise TileShapeError(
                f"the innermost global dimension holds {inner_bytes} bytes ({self.global_shape[-1]} x {self.dtype}); "
                f"TMA needs every row stride to be a multiple of 16 bytes, i.e. a multiple of "
                f"{16 // self.elem_bytes} elements (pad the tensor's rows or use the cp.async path)")
        for s in self.byte_strides():
            if s >= 2 ** 40:
                raise TileShapeError(f"a global stride of {s} bytes is >= 2^40")
        for b in self.box:
            if not 1 <= b <= 256:
                raise TileShapeError(f"box extent {b} of {self.box} is outside [1, 256]")
        box_inner = self.box[-1] * self.elem_bytes
        if box_inner % 16:
            raise TileShapeError(f"the innermost box extent is {box_inner} bytes; it must be a multiple of 16 bytes "
                                 f"({16 // self.elem_bytes} x {self.dtype})")
        if self.swizzle_bytes not in SWIZZLE_MODES:
            raise UnsupportedConfigError(f"swizzle_bytes={self.swizzle_bytes!r}; valid: {choices(SWIZZLE_MODES)}")
        if self.swizzle_bytes and box_inner > self.swizzle_bytes:
            raise TileShapeError(
                f"the innermost box row is {box_inner} bytes but a {self.swizzle_bytes}-byte swizzle allows at most "
                f"{self.swizzle_bytes} ({self.swizzle_bytes // self.elem_bytes} x {self.dtype}); split the box")
        if self.oob_fill not in OOB_FILLS:
            raise UnsupportedConfigError(f"oob_fill={self.oob_fill!r}; valid: {choices(OOB_FILLS)}")
        if self.oob_fill == "nan" and not _dt.is_float(self.dtype):
            raise UnsupportedConfigError(f"oob_fill='nan' needs a float dtype, not {self.dtype}")
        if self.l2_promotion not in L2_PROMOTIONS:
            raise UnsupportedConfigError(f"l2_promotion={self.l2_promotion!r}; valid: {choices(L2_PROMOTIONS)}")
        if not 1 <= self.multicast <= 16:
            raise UnsupportedConfigError(f"multicast={self.multicast}: a cluster has 1..16 CTAs")

    # -- code -----------------------------------------------------------------------------------------------------
    def encode(self, buffer, *, box=None):
        """Host code (before ``T.device_entry()``): bind a ``CUtensorMap`` for ``buffer`` and return it.

        ``buffer`` must be the kernel parameter the map reads or writes, with this map's ``global_shape`` and dtype.
        ``box``: extents (outermost first) to encode instead of :attr:`box`, each at most the built one and
        possibly a host expression (e.g. of a symbolic M); a load then moves and completes that many bytes, not
        :attr:`box_bytes`, and lands them at the same shared-memory rows (the caller arms its barrier accordingly).
        """
        from tvm.script import tirx as T
        from tvm.tirx.script.builder import ir as IRB

        shape = [d if _symbolic(d) else int(d) for d in buffer.shape]
        if self.strides is not None:
            same = self._view_fits(shape)
        else:
            same = len(shape) == self.rank and all(
                (a.same_as(b) if _symbolic(a) and _symbolic(b) else (not _symbolic(a) and not _symbolic(b) and a == b))
                for a, b in zip(shape, self.global_shape))
        if not same or _dt.canonical(str(buffer.dtype)) != self.dtype:
            view = "" if self.strides is None else f" (a view with element strides {list(self.strides)})"
            raise TileShapeError(f"buffer {buffer.name} is {shape} {buffer.dtype}; this tensor map describes "
                                 f"{list(self.global_shape)} {self.dtype}{view}")
        r = self.rank
        if box is None:
            box = self.box
        else:
            box = tuple(box)
            if len(box) != r or any(not _symbolic(b) and not 1 <= int(b) <= a for b, a in zip(box, self.box)):
                raise TileShapeError(f"box {box}: one extent per dimension in 1 .. the built box {self.box}")
        tmap = IRB.Bind(T.tvm_stack_alloca("tensormap", 1), T.TensorMap)
        IRB.add_to_parent(IRB.evaluate(T.tensormap_encode_tiled(
            tmap, buffer.data, *reversed(self.global_shape), *self.byte_strides(), *reversed(box), *([1] * r),
            descriptor_dtype=self.dtype, rank=r, interleave=0, swizzle=SWIZZLE_MODES[self.swizzle_bytes],
            l2_promotion=L2_PROMOTIONS[self.l2_promotion], oob_fill=OOB_FILLS[self.oob_fill])))
        return tmap

    def _view_fits(self, shape) -> bool:
        """Whether this view stays inside a dense buffer of ``shape``: the same symbolic variables appear in both (a
        view's symbolic dimension is one of the buffer's, used once), and with the symbolic extents set to 1 in both
        the view's last element lies inside the buffer (a view that fits at one row fits at every row count where
        each symbolic view dimension strides over whole buffer rows, as a row index does)."""
        sym_b = [d for d in shape if _symbolic(d)]
        sym_v = [d for d in self.global_shape if _symbolic(d)]
        if len(sym_b) != len(sym_v) or not all(any(a.same_as(b) for b in sym_b) for a in sym_v):
            return False
        numel = 1
        for d in shape:
            numel *= 1 if _symbolic(d) else d
        dense = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            dense[i] = dense[i + 1] * (1 if _symbolic(shape[i + 1]) else shape[i + 1])
        for d, st in zip(self.global_shape, self.strides):
            if _symbolic(d) and not any(b.same_as(d) and st == dense[i] for i, b in enumerate(shape)
                                        if _symbolic(b)):
                return False
        last = sum((d - 1) * st for d, st in zip(self.global_shape, self.strides) if not _symbolic(d))
        return last < numel

    def _coords(self, coords, *, store, op=None):
        from tvm.script import tirx as T

        if len(coords) != self.rank:
            raise TileShapeError(f"{len(coords)} coordinates for a rank-{self.rank} tensor map (outermost first)")
        msg = hardware_fault([None if _symbolic(d) else d for d in self.global_shape], self.box,
                             [_constant(c) for c in coords], store=store, order="outermost first")
        if msg is not None:
            raise TileShapeError(f"TmaTile.{op or ('store' if store else 'load')}: {msg}")
        return [T.Cast("int32", c) if not isinstance(c, int) else T.int32(c) for c in reversed(list(coords))]

    def load(self, smem_ptr, tmap, coords, barrier_ptr, *, multicast_mask=None, pred=None) -> None:
        """Emit one box load: global box at element ``coords`` (outermost first; may be out of bounds, the outside
        is filled, except on a rank-1 map: see the module docstring) -> shared ``smem_ptr``, completing
        ``box_bytes`` transaction bytes on the mbarrier at ``barrier_ptr`` (of every destination CTA with
        ``multicast_mask``). One thread issues it (``pred``: the threads where it is true, as a predicate instead of
        a branch)."""
        from tvm.script import tirx as T

        at = self._coords(coords, store=False)
        name = f"cp.async.bulk.tensor.{self.rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
        args = [smem_ptr, T.address_of(tmap), *at, barrier_ptr]
        if multicast_mask is not None:
            if self.multicast < 2:
                raise UnsupportedConfigError("multicast_mask given but this TmaTile was built with multicast=1")
            name += ".multicast::cluster"
            args.append(T.Cast("uint16", multicast_mask) if not isinstance(multicast_mask, int)
                        else T.uint16(multicast_mask))
        emit(T.ptx[name](*args, **({} if pred is None else {"pred": pred})))

    def prefetch(self, tmap, coords, *, pred=None) -> None:
        """Emit one box prefetch into L2 (``cp.async.bulk.prefetch.tensor``): the global box at ``coords`` starts
        moving towards L2 and nothing waits for it; a later :meth:`load` of the same box then finds it there. For a
        stream from DRAM whose shared-memory ring is too shallow to keep enough bytes in flight. Out-of-bounds
        parts are ignored. ``pred``: the issuing thread(s)."""
        from tvm.script import tirx as T

        at = self._coords(coords, store=False, op="prefetch")
        emit(T.ptx[f"cp.async.bulk.prefetch.tensor.{self.rank}d.L2.global.tile"](
            T.address_of(tmap), *at, **({} if pred is None else {"pred": pred})))

    def store(self, tmap, coords, smem_ptr, *, pred=None) -> None:
        """Emit one box store: shared ``smem_ptr`` -> global box at ``coords`` (outermost first; never negative,
        and inside the tensor on a rank-1 map: see the module docstring; elements past the positive end are dropped)
        in the current bulk group; follow with :func:`bulk_commit`. The writing threads must have executed
        ``fence.proxy.async.shared::cta`` and a barrier before. ``pred``: the issuing thread(s)."""
        from tvm.script import tirx as T

        at = self._coords(coords, store=True)
        emit(T.ptx[f"cp.async.bulk.tensor.{self.rank}d.global.shared::cta.tile.bulk_group"](
            T.address_of(tmap), *at, smem_ptr, **({} if pred is None else {"pred": pred})))


def bulk_commit() -> None:
    """``cp.async.bulk.commit_group``: close the current bulk group of TMA stores."""
    from tvm.script import tirx as T

    emit(T.ptx.cp.async_.bulk.commit_group())


def bulk_wait(n: int = 0, *, read: bool = True) -> None:
    """``cp.async.bulk.wait_group[.read] n``: at most ``n`` bulk groups still pending (``read``: only their reads of
    shared memory need to be done, so the buffer may be refilled)."""
    from tvm.script import tirx as T

    if not isinstance(n, int) or n < 0:
        raise UnsupportedConfigError(f"bulk_wait takes a non-negative compile-time int, not {n!r}")
    emit(T.ptx.cp.async_.bulk.wait_group.read(n) if read else T.ptx.cp.async_.bulk.wait_group(n))
