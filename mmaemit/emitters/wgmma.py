"""``WgmmaIntrinEmitter``: the Hopper ``wgmma.mma_async`` sequences of one warpgroup (sm_90a).

Like :class:`mmaemit.emitters.TensorCoreIntrinEmitter`, the emitter is plain Python that runs while TVMScript parses
your kernel: each method appends ``T.ptx`` statements at the point of the call; loops over K steps and N tiles are
unrolled in Python; stages, row offsets and ``scale_d`` may be TIR expressions.

Vocabulary (read-only properties):

* one instruction is ``wgmma.mma_async.sync.aligned.m64n{n}k{k}`` (``instruction``: a ``mmaemit.isa.WGMMA_TABLE``
  entry; ``k`` is 16 for f16 / bf16, 8 for tf32, 32 for 8-bit types);
* the shared tiles: A is ``block_m x block_k`` (SS form; a warpgroup reads 64 rows of it, ``m0``), B is
  ``block_n x block_k`` (``n_tiles = block_n / n`` instructions cover it per K step); ``k_steps = block_k / k``;
  their layouts (``a_layout`` / ``b_layout``: :class:`mmaemit.layouts.WgmmaOperandLayout`, the ``.layout`` attribute
  is the :class:`SwizzleLayout` to hand to ``TmaTile.for_layout`` or to index shared memory with) carry the
  descriptor fields, derived from the swizzle and proven by ``check()`` when the emitter is built;
* accumulators: ``local_size_c = n_tiles * instruction.accum_regs(n)`` registers per thread (float32 for f32, uint32
  holding two halves for f16, uint32 for s32), N tile ``h`` in registers ``[h * accum_regs, (h + 1) * accum_regs)``;
  flat element ``e`` of the thread sits in register ``e // elems_per_reg`` (f16: low half first) at
  ``accumulator_coords(thread, e)``;
* RS form: A comes from 4 registers per K step (``a_fragment_layout``: the m16n8kK A fragment of each warp's 16
  rows), K-major only.

The asynchronous protocol is the caller's: ``fence()`` before the first wgmma and after registers it reads were
written, ``commit_group()`` after a batch, ``wait_group(n)`` before reading the accumulators (or rewriting the A
registers / shared tiles of the retired groups), then ``pin_accumulators`` so nvcc keeps the epilogue after the wait.
"""
from __future__ import annotations

from .. import dtypes as _dt
from .. import isa
from ..errors import LayoutError, TileShapeError, UnsupportedConfigError, choices
from ..layouts.swizzle import SWIZZLE_CHOICES
from ..layouts.wgmma import WGMMA_MAJORS, wgmma_a_layout, wgmma_accumulator_layout, wgmma_operand_layout
from . import builder as _ir

FORMS = ("ss", "rs")
_OUT_DTYPES = {
    "float32": ("float32", "float16", "bfloat16"),
    "float16": ("float16", "float32"),
    "int32": ("int32",),
}


class WgmmaIntrinEmitter:
    """Emit warpgroup-level ``wgmma.mma_async`` building blocks.

    Args:
        a_dtype, b_dtype, accum_dtype: a combination of ``mmaemit.isa.WGMMA_TABLE`` (aliases accepted; ``b_dtype``
            None = ``a_dtype``).
        n: the instruction N (``instruction.n_values``: multiples of 8 up to 256; s8 / u8: 8, 16, 24, 32, 48, ..., 224).
        form: ``"ss"`` (A from shared memory) or ``"rs"`` (A from registers).
        a_major, b_major: ``"K"`` (K contiguous: A [M, K], B [N, K]) or ``"MN"`` (A [K, M], B [K, N]; 16-bit only,
            A in the SS form only).
        block_m: rows of the A shared tile (a multiple of 64; each warpgroup reads 64 of them). block_n: rows of the
            B tile (a multiple of ``n``; default ``n``). block_k: the K extent of both tiles (default: one swizzle span
            of the K-major operand, at least one instruction K).
        swizzle_bytes: 0, 32, 64 or 128 (both tiles; ``a_swizzle_bytes`` / ``b_swizzle_bytes`` override one).
        stages: leading (stage) dims of both shared tiles, e.g. ``(4,)`` for a 4-deep ring (``a_stages`` /
            ``b_stages`` override one, e.g. a single A tile read against a B ring: ``a_stages=()``).
        arch: the target (must be sm_90a). satfinite: clamp s32 accumulators (integer only).
    """

    def __init__(self, a_dtype="float16", b_dtype=None, accum_dtype="float32", n=128, *, form="ss", a_major="K",
                 b_major="K", block_m=64, block_n=None, block_k=None, swizzle_bytes=128, a_swizzle_bytes=None,
                 b_swizzle_bytes=None, stages=(), a_stages=None, b_stages=None, arch="sm_90a", satfinite=False):
        self.instruction: isa.WgmmaInstr = isa.select_wgmma(a_dtype, b_dtype, accum_dtype, arch=arch or "sm_90a")
        ins = self.instruction
        self.a_dtype, self.b_dtype, self.accum_dtype = ins.a_dtype, ins.b_dtype, ins.accum_dtype
        self.n = ins.check_n(n)
        if form not in FORMS:
            raise UnsupportedConfigError(f"form must be one of {choices(FORMS)}, not {form!r}")
        self.form = form
        for name, major, dt in (("a_major", a_major, ins.a_dtype), ("b_major", b_major, ins.b_dtype)):
            if major not in WGMMA_MAJORS:
                raise UnsupportedConfigError(f"{name} must be one of {choices(WGMMA_MAJORS)}, not {major!r}")
            if major not in ins.majors:
                raise UnsupportedConfigError(
                    f"{name}={major!r}: wgmma reads {dt} operands K-major only (MN-major needs 16-bit operands: "
                    f"float16, bfloat16); valid: {choices(ins.majors)}")
        if form == "rs" and a_major != "K":
            raise UnsupportedConfigError("a_major='MN' with form='rs': a register-sourced A is K-major by "
                                         "construction; valid: a_major='K', or form='ss'")
        self.a_major, self.b_major = a_major, b_major
        if satfinite and not ins.satfinite:
            raise UnsupportedConfigError(f"satfinite applies to integer wgmma only; {ins.describe()} is not")
        self.satfinite = bool(satfinite)
        for name, v in (("swizzle_bytes", swizzle_bytes), ("a_swizzle_bytes", a_swizzle_bytes),
                        ("b_swizzle_bytes", b_swizzle_bytes)):
            if v is not None and (isinstance(v, bool) or v not in SWIZZLE_CHOICES):
                raise UnsupportedConfigError(f"{name}={v!r}; valid: {choices(SWIZZLE_CHOICES)}")
        self.a_swizzle_bytes = swizzle_bytes if a_swizzle_bytes is None else a_swizzle_bytes
        self.b_swizzle_bytes = swizzle_bytes if b_swizzle_bytes is None else b_swizzle_bytes
        if not isinstance(block_m, int) or block_m < 64 or block_m % 64:
            raise TileShapeError(f"block_m must be a positive multiple of 64 (the wgmma M), not {block_m!r}")
        block_n = self.n if block_n is None else block_n
        if not isinstance(block_n, int) or block_n < self.n or block_n % self.n:
            raise TileShapeError(f"block_n must be a positive multiple of n={self.n}, not {block_n!r}")
        eb = _dt.bits(ins.a_dtype) // 8
        if block_k is None:
            spans = [(s or 16) // eb for s, m in ((self.a_swizzle_bytes, a_major), (self.b_swizzle_bytes, b_major))
                     if m == "K"]
            block_k = max([ins.k] + spans)
        if not isinstance(block_k, int) or block_k < ins.k or block_k % ins.k:
            raise TileShapeError(f"block_k must be a positive multiple of the wgmma K ({ins.k}), not {block_k!r}")
        self.block_m, self.block_n, self.block_k = block_m, block_n, block_k
        self.stages = tuple(int(s) for s in stages)
        self.a_stages = self.stages if a_stages is None else tuple(int(s) for s in a_stages)
        self.b_stages = self.stages if b_stages is None else tuple(int(s) for s in b_stages)
        self.b_layout = wgmma_operand_layout(block_n, block_k, ins.b_dtype, major=b_major,
                                             swizzle_bytes=self.b_swizzle_bytes, stages=self.b_stages)
        self.b_layout.check(self.n)
        self.a_layout = None
        if form == "ss":
            self.a_layout = wgmma_operand_layout(block_m, block_k, ins.a_dtype, major=a_major,
                                                 swizzle_bytes=self.a_swizzle_bytes, stages=self.a_stages)
            self.a_layout.check(64)
        self.c_layout = wgmma_accumulator_layout(ins, self.n)
        self.a_fragment_layout = wgmma_a_layout(ins)

    # ---- derived sizes -------------------------------------------------------------------------------------
    m = property(lambda self: self.instruction.m, doc="rows of one wgmma (64)")
    k = property(lambda self: self.instruction.k, doc="K of one wgmma")
    k_steps = property(lambda self: self.block_k // self.k, doc="wgmma K steps per shared tile")
    n_tiles = property(lambda self: self.block_n // self.n, doc="instructions along N per K step")
    accum_regs = property(lambda self: self.instruction.accum_regs(self.n), doc="registers per N tile")
    local_size_c = property(lambda self: self.n_tiles * self.accum_regs, doc="accumulator registers per thread")
    local_elems_c = property(lambda self: self.n_tiles * self.instruction.accum_elems(self.n),
                             doc="accumulator elements per thread")
    local_size_a = property(lambda self: self.instruction.a_regs, doc="A registers per K step (RS form): 4")
    c_fragment_dtype = property(lambda self: "float32" if self.accum_dtype == "float32" else "uint32")
    a_shared_shape = property(lambda self: self.a_layout.layout.shape if self.a_layout else None,
                              doc="the A shared buffer shape (SS form)")
    b_shared_shape = property(lambda self: self.b_layout.layout.shape, doc="the B shared buffer shape")

    def ptx(self) -> str:
        """The instruction's mnemonic."""
        return self.instruction.ptx(self.n, self.satfinite)

    def __repr__(self):
        return (f"WgmmaIntrinEmitter({self.ptx()} {self.form.upper()}, A {self.a_major}-major, B {self.b_major}-major, "
                f"tiles A {self.block_m}x{self.block_k} B {self.block_n}x{self.block_k})")

    # ---- registers -----------------------------------------------------------------------------------------
    def alloc_accumulators(self):
        """Allocate the accumulator registers (``local_size_c`` of ``c_fragment_dtype``)."""
        from tvm.script import tirx as T

        return T.alloc_local((self.local_size_c,), self.c_fragment_dtype)

    def alloc_a_fragment(self, k_steps=None):
        """Allocate RS-form A registers: uint32 ``[k_steps, 4]`` (default: one K block)."""
        from tvm.script import tirx as T

        self._need_form("rs", "alloc_a_fragment")
        return T.alloc_local((self.k_steps if k_steps is None else k_steps, self.local_size_a), "uint32")

    def alloc_descriptor(self):
        """A ``uint64[1]`` register for one matrix descriptor."""
        from tvm.script import tirx as T

        return T.alloc_local((1,), "uint64")

    def fill_accumulators(self, acc, value=0):
        """Set every accumulator register to ``value`` (0 by default; packed f16 / s32 accept 0 only). With a first
        wgmma of ``scale_d=False`` no fill is needed (and a fill can make ptxas serialize the wgmmas, C7514)."""
        from tvm.script import tirx as T

        if value != 0 and self.c_fragment_dtype != "float32":
            raise UnsupportedConfigError("only 0 can fill packed (f16 / s32) accumulators")
        v = T.float32(value) if self.c_fragment_dtype == "float32" else T.uint32(0)
        for r in range(self.local_size_c):
            _ir.store(acc, v, (r,))

    def pin_accumulators(self, acc, index=()):
        """After the last ``wait_group``: one ``xor.b32 r, r, 0`` per accumulator register (an exact identity that
        ptxas drops), so nvcc cannot hoist the epilogue's reads above the wait: nvcc does not know the wait writes the
        accumulators. The pin must be an ``asm volatile`` (ordered after the wait's own ``asm volatile``): TVM renders
        ``mov.b32`` as a plain ``asm``, which nvcc moved above the wait, so the epilogue read accumulators that the
        last wgmma group was still writing (wrong results on the H100, 2026-11-26, see docs/perf-notes.md).
        ``index``: leading indices of ``acc`` when it holds several accumulator sets (``acc[*index, r]``)."""
        from tvm.script import tirx as T

        for r in range(self.local_size_c):
            reg = acc[(*index, r)]
            _ir.emit(T.ptx.xor.b32(reg, reg, T.uint32(0)))

    # ---- the asynchronous protocol -------------------------------------------------------------------------
    @staticmethod
    def fence():
        """``wgmma.fence.sync.aligned``: orders prior register / shared accesses before the next wgmma."""
        from tvm.script import tirx as T

        _ir.emit(T.ptx.wgmma.fence.sync.aligned())

    @staticmethod
    def commit_group():
        """``wgmma.commit_group.sync.aligned``: close a group over the warpgroup's uncommitted wgmmas."""
        from tvm.script import tirx as T

        _ir.emit(T.ptx.wgmma.commit_group.sync.aligned())

    @staticmethod
    def wait_group(n: int = 0):
        """``wgmma.wait_group.sync.aligned n``: wait until at most ``n`` (a compile-time int) groups are pending."""
        from tvm.script import tirx as T

        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 7:
            raise UnsupportedConfigError(f"wait_group takes a compile-time int in 0..7, not {n!r}")
        _ir.emit(T.ptx.wgmma.wait_group.sync.aligned(n))

    # ---- descriptors ---------------------------------------------------------------------------------------
    def _operand_layout(self, operand):
        if operand not in ("A", "B"):
            raise UnsupportedConfigError(f"operand must be one of {choices(['A', 'B'])}, not {operand!r}")
        if operand == "A":
            self._need_form("ss", "an A descriptor")
            return self.a_layout
        return self.b_layout

    def _need_form(self, form, what):
        if self.form != form:
            raise UnsupportedConfigError(f"{what} belongs to the {form.upper()} form; this emitter is "
                                         f"form={self.form!r}")

    def shared_layout(self, operand):
        """The ``SwizzleLayout`` of operand ``"A"`` (SS form) or ``"B"``'s shared tile: index shared memory with it
        (``S[layout(stage, row, col)]``) or build the TMA box from it (``TmaTile.for_layout``)."""
        return self._operand_layout(operand).layout

    def init_descriptor(self, desc, smem, operand):
        """Encode the descriptor of operand ``"A"`` / ``"B"`` for the shared buffer ``smem`` (start = the buffer's
        first element; LBO / SBO / swizzle from the operand layout) into ``desc[0]``, through TVM's
        ``T.cuda.wgmma.encode_matrix_descriptor``. Once per kernel; per slice, ``descriptor`` adds the offset."""
        from tvm.script import tirx as T

        lay = self._operand_layout(operand)
        if _ir.scope_of(smem) not in ("shared", "shared.dyn"):
            raise UnsupportedConfigError(f"wgmma reads shared memory; {smem.name} is in {_ir.scope_of(smem)!r} "
                                         f"(valid scopes: 'shared', 'shared.dyn')")
        try:
            shape = tuple(int(d) for d in smem.shape)
        except TypeError:
            shape = None
        if shape != lay.layout.shape or _dt.canonical(str(smem.dtype)) != lay.dtype:
            raise TileShapeError(f"shared buffer {smem.name} is {list(smem.shape)} {smem.dtype}; operand {operand} "
                                 f"needs {list(lay.layout.shape)} {lay.dtype} ({lay.describe()})")
        _ir.emit(T.cuda.wgmma.encode_matrix_descriptor(T.address_of(desc[0]), smem.ptr_to([0] * len(shape)),
                                                       lay.lbo >> 4, lay.sbo >> 4, lay.tvm_swizzle))

    def descriptor(self, desc, operand, mn0, k0, stage=()):
        """``desc[0]`` advanced to the instruction slice whose first element is (mn0, k0) of stage ``stage`` (a tuple
        of ints / PrimExprs): the descriptor value to pass to ``mma_async``."""
        from tvm.script import tirx as T

        lay = self._operand_layout(operand)
        stage = tuple(stage) if isinstance(stage, (tuple, list)) else (stage,)
        if len(stage) != lay.stages:
            raise TileShapeError(f"{len(stage)} stage indices for operand {operand} with stage dims "
                                 f"{list(lay.stage_shape)}")
        off = lay.start_offset(mn0, k0, *stage)
        if isinstance(off, int):
            return desc[0] + T.uint64(off // 16) if off else desc[0]
        # a runtime offset (a ring stage) moves the start address field (bits 0-13) only: a 32-bit add on the low
        # word (no carry can reach bit 32) instead of a 64-bit one, one uniform instruction instead of three per wgmma
        lo = T.Cast("uint32", desc[0]) + T.Cast("uint32", off // 16)
        return ((desc[0] >> T.uint64(32)) << T.uint64(32)) | T.Cast("uint64", lo)

    # ---- the instruction -----------------------------------------------------------------------------------
    def mma_async(self, acc, a, b_desc, scale_d=True, *, n_tile=0, scale_a=1, scale_b=1):
        """One ``wgmma.mma_async``: accumulator N tile ``n_tile`` (+)= A x B.

        ``a``: SS: the A descriptor value; RS: 4 uint32 registers (a list, or a buffer / row of ``alloc_a_fragment``).
        ``b_desc``: the B descriptor value. ``scale_d``: True (D = A B + D), False (D = A B: zero-scale init) or a
        warpgroup-uniform boolean PrimExpr. ``scale_a`` / ``scale_b``: +1 / -1 (floating-point types only).
        """
        from tvm.script import tirx as T

        ins = self.instruction
        if not 0 <= n_tile < self.n_tiles:
            raise TileShapeError(f"n_tile={n_tile}; valid: 0..{self.n_tiles - 1}")
        for name, v in (("scale_a", scale_a), ("scale_b", scale_b)):
            if v not in (1, -1) or isinstance(v, bool):
                raise UnsupportedConfigError(f"{name}={v!r}; valid: 1, -1")
            if v == -1 and ins.is_integer:
                raise UnsupportedConfigError(f"{name}=-1: integer wgmma has no operand negation; valid: 1")
        if isinstance(scale_d, bool):
            scale_d = T.bool(scale_d)          # a predicate constant (a Python bool would lower as an integer)
        base = n_tile * self.accum_regs
        d = [acc[base + r] for r in range(self.accum_regs)]
        if self.form == "rs":
            a_ops = self._a_registers(a)
        else:
            a_ops = [a]
        extra = []
        if not ins.is_integer:
            extra = [scale_a, scale_b]
            if ins.operand_bits == 16:
                trans_b = int(self.b_major == "MN")
                extra += [trans_b] if self.form == "rs" else [int(self.a_major == "MN"), trans_b]
        _ir.emit(_ir.ptx(self.ptx())(*d, *a_ops, b_desc, scale_d, *extra))

    def _a_registers(self, a):
        if isinstance(a, (list, tuple)):
            regs = list(a)
        elif _ir.is_buffer(a) and len(a.shape) == 1:
            regs = [a[q] for q in range(int(a.shape[0]))]
        else:
            raise UnsupportedConfigError("RS form: pass the A operand as 4 uint32 registers (a list such as "
                                         "[af[ki, 0], af[ki, 1], af[ki, 2], af[ki, 3]], or a 1-D buffer of 4)")
        if len(regs) != self.local_size_a:
            raise UnsupportedConfigError(f"RS form: the A operand is {self.local_size_a} uint32 registers, got "
                                         f"{len(regs)}")
        return regs

    def mma(self, acc, a, b_desc, ki, *, a_desc=None, stage=(), m0=0, n0=0, scale_d=True, scale_a=1, scale_b=1,
            a_stage=None, b_stage=None):
        """K step ``ki`` (int or PrimExpr) of the shared tiles: ``n_tiles`` wgmmas, N tile h reading B rows
        ``n0 + h n``. SS: ``a`` is the A descriptor register (``init_descriptor``), rows ``m0 .. m0 + 63`` of the A
        tile; RS: ``a`` is the 4 A registers of this step. ``b_desc``: the B descriptor register. ``stage`` indexes
        both tiles' stage dims; ``a_stage`` / ``b_stage`` override it per operand (``a_stages`` / ``b_stages``)."""
        k0 = ki * self.k
        a_stage = stage if a_stage is None else a_stage
        b_stage = stage if b_stage is None else b_stage
        a_val = self.descriptor(a, "A", m0, k0, a_stage) if self.form == "ss" else a
        for h in range(self.n_tiles):
            b_val = self.descriptor(b_desc, "B", n0 + h * self.n, k0, b_stage)
            self.mma_async(acc, a_val, b_val, scale_d, n_tile=h, scale_a=scale_a, scale_b=scale_b)

    def mma_block(self, acc, a, b_desc, *, stage=(), m0=0, n0=0, scale_d=True, scale_a=1, scale_b=1):
        """Every K step of the shared tiles (``k_steps`` x ``n_tiles`` wgmmas). ``scale_d`` applies to the first K
        step (False / a PrimExpr: start a fresh accumulation), later steps accumulate. RS: ``a`` is the
        ``[k_steps, 4]`` A fragment buffer."""
        for ki in range(self.k_steps):
            if self.form == "rs":
                a_ki = [a[ki, q] for q in range(self.local_size_a)]
            else:
                a_ki = a
            self.mma(acc, a_ki, b_desc, ki, stage=stage, m0=m0, n0=n0, scale_d=scale_d if ki == 0 else True,
                     scale_a=scale_a, scale_b=scale_b)

    # ---- accumulator positions -----------------------------------------------------------------------------
    def accumulator_slot(self, e):
        """(register, half) of flat accumulator element ``e`` (f16 accumulators: two per register, low half
        first)."""
        per = self.c_layout.elems_per_reg
        return e // per, e % per

    def accumulator_coords(self, thread, e):
        """(m, n) inside the warpgroup's ``64 x block_n`` tile of flat accumulator element ``e`` (0 ..
        ``local_elems_c - 1``) held by ``thread`` (0..127 inside the warpgroup; may be a PrimExpr)."""
        if isinstance(e, int) and not 0 <= e < self.local_elems_c:
            raise TileShapeError(f"accumulator element {e}; valid: 0..{self.local_elems_c - 1}")
        reg, half = self.accumulator_slot(e)
        h, r = reg // self.accum_regs, reg % self.accum_regs
        m, n = self.c_layout.forward(thread, r, half)
        return m, h * self.n + n

    def accumulator_row_slots(self):
        """Per flat accumulator element ``e``: the index (0, 1, ...) of its row among the rows the thread holds,
        ascending, and the same for every thread of the warpgroup (proven here by enumeration): what a row-wise
        reduction (softmax max / sum, per-row scales) indexes its per-thread row registers with. f32 / s32 m64:
        2 rows per thread (``g`` and ``g + 8`` of the warp's 16), slots 0, 1."""
        if getattr(self, "_row_slots", None) is not None:
            return list(self._row_slots)
        slots = None
        for t in range(128):
            rows = [self.accumulator_coords(t, e)[0] for e in range(self.local_elems_c)]
            order = sorted(set(rows))
            mine = [order.index(r) for r in rows]
            if slots is None:
                slots = mine
            elif mine != slots:
                raise LayoutError(f"{self.ptx()}: thread {t} holds its accumulator rows in another order "
                                  f"({mine[:8]} ... vs {slots[:8]} ...)")
        self._row_slots = tuple(slots)
        return slots

    def accumulator_row_shuffles(self):
        """The ``shfl.sync.bfly`` lane masks whose butterfly reduces across exactly the threads that share an
        accumulator row (f32 m64: the 4 threads of a quad, masks 1 and 2), proven by enumeration: every thread's
        butterfly group holds the same rows, and no other thread holds them."""
        if getattr(self, "_row_shuffles", None) is not None:
            return list(self._row_shuffles)
        rows_of = [frozenset(self.accumulator_coords(t, e)[0] for e in range(self.local_elems_c)) for t in range(128)]
        sharing = [frozenset(u for u in range(128) if rows_of[u] == rows_of[t]) for t in range(128)]
        masks = sorted({t ^ u for t in range(128) for u in sharing[t] if t != u})
        masks = [m for m in masks if m & (m - 1) == 0]           # the butterfly's single-bit distances
        for t in range(128):
            group = {t}
            for m in masks:
                group |= {u ^ m for u in group}
            if group != set(sharing[t]) or any(rows_of[u] & rows_of[t] for u in range(128) if u not in group):
                raise LayoutError(f"{self.ptx()}: the threads sharing thread {t}'s accumulator rows "
                                  f"({sorted(sharing[t])}) are not a butterfly group of lane masks {masks}")
        self._row_shuffles = tuple(masks)
        return masks

    def accumulator_row(self, thread, slot):
        """The row (0..63 of the warpgroup tile) of row slot ``slot`` (see ``accumulator_row_slots``) of ``thread``
        (may be a PrimExpr): the row of the first element in that slot."""
        e = self.accumulator_row_slots().index(slot)
        return self.accumulator_coords(thread, e)[0]

    def a_fragment_coords(self, thread, reg, elem=0):
        """(m, k) in the 64 x ``k`` A slice of one K step held by RS register ``reg`` (0..3), sub-element ``elem``."""
        return self.a_fragment_layout.forward(thread, reg, elem)

    def _acc_value(self, acc, e):
        from tvm.script import tirx as T

        reg, half = self.accumulator_slot(e)
        r = acc[reg]
        if self.accum_dtype == "float16":
            bits = r & T.uint32(0xFFFF) if half == 0 else r >> T.uint32(16)
            return T.reinterpret("float16", T.Cast("uint16", bits))
        if self.accum_dtype == "int32":
            return T.reinterpret("int32", r)
        return r

    def store_accumulators(self, acc, C_buf, thread, *, row0=0, col0=0, scale=None):
        """Plain element stores of every accumulator to ``C_buf[row0 + m, col0 + n]`` (shared or global), converted
        to ``C_buf``'s dtype (f32 -> f32/f16/bf16, f16 -> f16/f32, s32 -> s32), times ``scale`` if given (float)."""
        from tvm.script import tirx as T

        buf, lead, r_off, c_off = _ir.split_region(C_buf)
        out = _dt.canonical(str(buf.dtype))
        if out not in _OUT_DTYPES[self.accum_dtype]:
            raise UnsupportedConfigError(f"cannot store {self.accum_dtype} accumulators as {out}; valid output "
                                         f"dtypes: {choices(_OUT_DTYPES[self.accum_dtype])}")
        for e in range(self.local_elems_c):
            m, n = self.accumulator_coords(thread, e)
            v = self._acc_value(acc, e)
            if scale is not None:
                v = T.Cast("float32", v) * scale
            _ir.store(buf, _ir.cast(out, v), (*lead, r_off + row0 + m, c_off + col0 + n))
