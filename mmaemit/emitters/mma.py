"""``TensorCoreIntrinEmitter``: the ldmatrix / mma.sync / stmatrix sequences of one CTA's warp tiles.

The emitter is plain Python that runs while TVMScript parses your ``@T.prim_func``: every method appends ``T.ptx``
statements to the kernel at the point of the call. Loops over micro tiles are unrolled in Python, so every register
index is a constant; ``ki`` (the K step inside a shared tile), ``warp`` and ``lane`` may be TIR expressions.

Tile vocabulary (all sizes are read-only properties; never re-derive them):

* the CTA tile is ``block_m x block_n x block_k``; ``block_m = block_row_warps * warp_row_tiles``,
  ``block_n = block_col_warps * warp_col_tiles``, ``block_k = chunk``.
* a warp owns ``warp_row_tiles x warp_col_tiles`` of C, made of ``warp_rows x warp_cols`` micro tiles of
  ``micro_m x micro_n`` (16 x ``n_tile``); one micro tile is one (n_tile 8) or two (n_tile 16) mma.sync per K step.
* ``reduce_k`` warp groups split ``chunk`` along K (``k_steps = chunk // reduce_k // micro_k`` per group).
* storage: A is [M, K] (``a_transposed=False``) or [K, M]; B is [K, N] (``b_transposed=False``) or [N, K].

Fragments (``alloc_fragments``): A ``uint32[warp_rows, local_size_a]``, B ``uint32[warp_cols, local_size_b]``,
C ``[warp_rows, warp_cols, local_size_c]`` of float32 (f32 accumulators) or uint32 (f16 pairs, s32).

8-bit and 4-bit operands stored M/N-contiguous load through ``TransposedLoadPlan`` (ldmatrix.trans + prmt, plus
shl/shr/lop3 for 4-bit), which permutes M (A) or N (B) inside a 16- or 32-wide load group. The accumulators then hold
C with permuted rows / columns: ``stmatrix`` and ``reduce_accumulators`` account for it; code that reads
``C_frag`` by hand must map registers with ``accumulator_coords`` (``c_row_perm`` / ``c_col_perm`` are the raw
permutations, None when the major needs none). ``accumulator_coords``, ``accumulator_register`` and
``accumulator_value`` take Python ints or TIR loop variables, so a custom epilogue is a ``T.unroll`` loop over
``warp_rows x warp_cols x accumulator_elems`` (``examples/gemm_fused_epilogue.py``).
"""
from __future__ import annotations

from .. import dtypes as _dt
from .. import isa
from ..arch import as_arch
from ..errors import TileShapeError, UnsupportedConfigError, choices
from ..layouts.fragment import mma_fragment
from ..layouts.operand_load import accumulator_store_plan, operand_load_plan
from ..layouts.swizzle import make_mma_swizzle_layout
from ..layouts.transposed_load import TransposedLoadPlan
from . import builder as _ir

WARP_ORDERS = ("m_fast", "n_fast")
_OUT_DTYPES = {
    "float32": ("float32", "float16", "bfloat16"),
    "float16": ("float16", "float32"),
    "int32": ("int32",),
}


class TensorCoreIntrinEmitter:
    """Emit warp-level mma.sync GEMM building blocks for one CTA tile.

    Args:
        a_dtype, b_dtype, accum_dtype: an mma.sync combination from ``mmaemit.isa.MMA_TABLE`` (aliases accepted).
        a_transposed: A stored [K, M] (M-contiguous) instead of [M, K]. b_transposed: B stored [N, K] (K-contiguous)
            instead of [K, N]. M/N-contiguous storage works for 16-bit (ldmatrix .trans), 8-bit and 4-bit operands
            (``TransposedLoadPlan``; warp_row_tiles / warp_col_tiles must then be multiples of 16 (8-bit) or 32
            (4-bit)); tf32 operands must be K-contiguous.
        block_row_warps, block_col_warps: warps along M and N. warp_row_tiles, warp_col_tiles: a warp's C extent.
        chunk: the K extent of one shared tile. reduce_k: warp groups splitting ``chunk`` along K.
        n_tile: 8 or 16 (default 16 when ``warp_col_tiles`` allows). k: the mma K (default: the table's largest).
        warp_order: "m_fast" (warp id = warp_m + block_row_warps * warp_n) or "n_fast".
        arch: target arch; checks the instruction exists there and enables PTX stmatrix on sm_90+.
        satfinite: clamp integer accumulators (``.satfinite``) instead of wrapping.

    ``shared_swizzle(operand, shape, dtype)`` gives the conflict-free shared layout for each operand tile (it differs
    from the default for M/N-contiguous 8/4-bit operands).
    """

    def __init__(self, a_dtype="float16", b_dtype="float16", accum_dtype="float32", a_transposed=False,
                 b_transposed=False, block_row_warps=2, block_col_warps=2, warp_row_tiles=64, warp_col_tiles=64,
                 chunk=32, reduce_k=1, n_tile=None, k=None, warp_order="m_fast", arch=None, satfinite=False):
        self.arch = as_arch(arch) if arch is not None else None
        self.instruction: isa.MmaInstr = isa.select_mma(a_dtype, b_dtype, accum_dtype, k=k, arch=self.arch)
        ins = self.instruction
        self.a_dtype, self.b_dtype, self.accum_dtype = ins.a_dtype, ins.b_dtype, ins.accum_dtype
        self.a_transposed, self.b_transposed = bool(a_transposed), bool(b_transposed)
        if satfinite and not ins.is_integer:
            raise UnsupportedConfigError(f"satfinite applies to integer mma only; {ins.describe()} is not")
        self.satfinite = bool(satfinite)
        if warp_order not in WARP_ORDERS:
            raise UnsupportedConfigError(f"warp_order must be one of {choices(WARP_ORDERS)}, not {warp_order!r}")
        self.warp_order = warp_order
        for name, v in (("block_row_warps", block_row_warps), ("block_col_warps", block_col_warps),
                        ("reduce_k", reduce_k)):
            if not isinstance(v, int) or v < 1:
                raise TileShapeError(f"{name} must be a positive int, not {v!r}")
        self.block_row_warps, self.block_col_warps, self.reduce_k = block_row_warps, block_col_warps, reduce_k
        if n_tile is None:
            n_tile = 16 if warp_col_tiles % 16 == 0 and ins.b_regs * 2 <= 4 else 8
        if n_tile not in (8, 16):
            raise UnsupportedConfigError(f"n_tile must be one of {choices([8, 16])}, not {n_tile!r}")
        self.n_tile = n_tile
        if warp_row_tiles < ins.m or warp_row_tiles % ins.m:
            raise TileShapeError(f"warp_row_tiles must be a positive multiple of {ins.m}, not {warp_row_tiles}")
        if warp_col_tiles < n_tile or warp_col_tiles % n_tile:
            raise TileShapeError(f"warp_col_tiles must be a positive multiple of n_tile={n_tile}, "
                                 f"not {warp_col_tiles}")
        self.warp_row_tiles, self.warp_col_tiles = warp_row_tiles, warp_col_tiles
        if chunk % (reduce_k * ins.k):
            raise TileShapeError(f"chunk must be a multiple of reduce_k * mma K = {reduce_k} * {ins.k}, not {chunk}"
                                 f" (valid: {', '.join(str(reduce_k * ins.k * i) for i in (1, 2, 4, 8))}, ...)")
        self.chunk = chunk
        if self.threads > 1024:
            raise TileShapeError(f"{self.threads} threads per CTA exceed 1024; use fewer warps")
        # fast loads: the plans raise a clear error for majors ldmatrix cannot serve
        self.a_plan = operand_load_plan(ins, "A", k_contiguous=not self.a_transposed)
        self.b_plan = operand_load_plan(ins, "B", k_contiguous=self.b_transposed, n_tile=n_tile)
        for plan, name, size in ((self.a_plan, "warp_row_tiles", warp_row_tiles),
                                 (self.b_plan, "warp_col_tiles", warp_col_tiles)):
            if isinstance(plan, TransposedLoadPlan) and size % plan.extent:
                raise TileShapeError(
                    f"{name}={size}: a {plan.elem_bits}-bit operand stored {'M' if plan.operand == 'A' else 'N'}-"
                    f"contiguous loads {plan.extent} {'rows' if plan.operand == 'A' else 'columns'} at a time (one "
                    f"16-byte ldmatrix row); use a multiple of {plan.extent} (valid: "
                    f"{', '.join(str(plan.extent * i) for i in (1, 2, 4))}, ...)")
        self.c_layout = mma_fragment(ins, "C")
        self._check_c_rows()
        self._c_pairs = self._accumulator_pairs()
        self._c_store_pairs = self._store_pairs()
        self._c_store_quads = self._store_quads()

    # ---- derived sizes -------------------------------------------------------------------------------------
    micro_m = property(lambda self: self.instruction.m, doc="rows of one mma micro tile (16)")
    micro_n = property(lambda self: self.n_tile, doc="columns of one micro tile (n_tile: 8 or 16)")
    micro_k = property(lambda self: self.instruction.k, doc="K of one mma.sync")
    warp_rows = property(lambda self: self.warp_row_tiles // self.micro_m, doc="micro tiles along M per warp")
    warp_cols = property(lambda self: self.warp_col_tiles // self.n_tile, doc="micro tiles along N per warp")
    k_steps = property(lambda self: self.chunk // self.reduce_k // self.micro_k, doc="mma K steps per group and tile")
    local_size_a = property(lambda self: self.instruction.a_regs, doc="uint32 registers per A micro tile")
    local_size_b = property(lambda self: self.instruction.b_regs * (self.n_tile // 8),
                            doc="uint32 registers per B micro tile")
    local_size_c = property(lambda self: self.instruction.c_regs * (self.n_tile // 8),
                            doc="accumulator registers per micro tile")
    num_warps = property(lambda self: self.block_row_warps * self.block_col_warps * self.reduce_k)
    threads = property(lambda self: 32 * self.num_warps, doc="threads per CTA")
    block_m = property(lambda self: self.block_row_warps * self.warp_row_tiles)
    block_n = property(lambda self: self.block_col_warps * self.warp_col_tiles)
    block_k = property(lambda self: self.chunk)
    a_shared_shape = property(lambda self: (self.block_k, self.block_m) if self.a_transposed
                              else (self.block_m, self.block_k), doc="shape of one A shared tile as stored")
    b_shared_shape = property(lambda self: (self.block_n, self.block_k) if self.b_transposed
                              else (self.block_k, self.block_n), doc="shape of one B shared tile as stored")
    c_fragment_dtype = property(lambda self: "float32" if self.accum_dtype == "float32" else "uint32")
    c_row_perm = property(
        lambda self: self.a_plan.perm if isinstance(self.a_plan, TransposedLoadPlan) else None,
        doc="None, or the M permutation of an M-contiguous 8/4-bit A: accumulator row ``x`` of micro tile ``i`` holds "
            "m = ``(i // G) * len(perm) + perm[16 * (i % G) + x]`` (G = len(perm) // 16) of the warp tile")
    c_col_perm = property(
        lambda self: self.b_plan.perm if isinstance(self.b_plan, TransposedLoadPlan) else None,
        doc="None, or the N permutation of an N-contiguous 8/4-bit B: accumulator column ``x`` of n8 tile ``s`` (n8 "
            "tiles counted across micro tiles, ``s = j * n_tile // 8 + h``) holds n = ``(s // G) * len(perm) + "
            "perm[8 * (s % G) + x]`` (G = len(perm) // 8) of the warp tile")

    def __repr__(self):
        return (f"TensorCoreIntrinEmitter({self.instruction.ptx()}, block {self.block_m}x{self.block_n}x"
                f"{self.block_k}, warps {self.block_row_warps}x{self.block_col_warps}x{self.reduce_k}, "
                f"warp tile {self.warp_row_tiles}x{self.warp_col_tiles}, n_tile {self.n_tile})")

    # ---- thread mapping ------------------------------------------------------------------------------------
    def warp_coords(self, warp):
        """(warp_m, warp_n, warp_k) of linear warp id ``warp`` (0 .. num_warps-1) under ``warp_order``."""
        rw, cw = self.block_row_warps, self.block_col_warps
        if self.warp_order == "m_fast":
            wm, wn = warp % rw, (warp // rw) % cw
        else:
            wn, wm = warp % cw, (warp // cw) % rw
        return wm, wn, warp // (rw * cw)

    # ---- fragments -----------------------------------------------------------------------------------------
    def alloc_fragments(self):
        """Allocate (A_frag, B_frag, C_frag) register buffers in the kernel being parsed."""
        from tvm.script import tirx as T

        a = T.alloc_local((self.warp_rows, self.local_size_a), "uint32")
        b = T.alloc_local((self.warp_cols, self.local_size_b), "uint32")
        c = T.alloc_local((self.warp_rows, self.warp_cols, self.local_size_c), self.c_fragment_dtype)
        return a, b, c

    def fill_accumulators(self, C_frag, value=0):
        """Set every accumulator to ``value`` (0 by default)."""
        from tvm.script import tirx as T

        if value != 0 and self.c_fragment_dtype != "float32":
            raise UnsupportedConfigError("only 0 can fill packed (f16 / s32) accumulators")
        v = T.float32(value) if self.c_fragment_dtype == "float32" else T.uint32(0)
        for i in range(self.warp_rows):
            for j in range(self.warp_cols):
                for r in range(self.local_size_c):
                    _ir.store(C_frag, v, (i, j, r))

    # ---- shared -> registers -------------------------------------------------------------------------------
    def shared_swizzle(self, operand, buffer_or_shape, dtype=None):
        """The bank-conflict-free ``make_mma_swizzle_layout`` for operand ``"A"`` / ``"B"``'s shared tile.

        K-contiguous and 16-bit tiles get the default scheme. An M/N-contiguous 8/4-bit tile is read by
        ``TransposedLoadPlan`` phases of non-consecutive rows, so its XOR takes the rows' varying bits instead
        (``TransposedLoadPlan.swizzle_row_bits``): conflict-free for 64/128-byte+ (8-bit) and 128-byte+ (4-bit)
        rows; with the default scheme those loads would be 2-way (8-bit) / 4-way (4-bit) conflicted.
        """
        if operand not in ("A", "B"):
            raise UnsupportedConfigError(f"operand must be one of {choices(['A', 'B'])}, not {operand!r}")
        layout = make_mma_swizzle_layout(buffer_or_shape, dtype)
        plan = self.a_plan if operand == "A" else self.b_plan
        if not isinstance(plan, TransposedLoadPlan):
            return layout
        return make_mma_swizzle_layout(buffer_or_shape, dtype, row_bits=plan.swizzle_row_bits(layout.row_bytes))

    @staticmethod
    def _buffer_col(buf, elem_bits, col):
        """Operand column ``col`` (in operand elements) as an index of ``buf``: a 4-bit operand may sit packed in a
        uint8/int8 buffer (two per byte, half the columns). ldmatrix rows start on 16-byte boundaries, so the
        division is exact."""
        buf_bits = _dt.bits(str(buf.dtype))
        if buf_bits == elem_bits:
            return col
        if elem_bits == 4 and buf_bits == 8:
            return col // 2
        raise UnsupportedConfigError(f"shared buffer {buf.name} of {buf.dtype} cannot hold {elem_bits}-bit operand "
                                     f"elements; valid: the operand's dtype" + (", or uint8/int8 (packed 4-bit)"
                                                                              if elem_bits == 4 else ""))

    def _ldmatrix(self, plan, frag, slot, operand, row0, col0, lane, layout):
        buf, lead, r_off, c_off = _ir.split_region(operand)
        if _ir.scope_of(buf) not in ("shared", "shared.dyn"):
            raise UnsupportedConfigError(f"ldmatrix reads shared memory; {buf.name} is in {_ir.scope_of(buf)!r} "
                                         f"(valid scopes: 'shared', 'shared.dyn')")
        r, c = plan.lane_address(lane)
        idx = (*lead, r_off + row0 + r, c_off + self._buffer_col(buf, plan.elem_bits, col0 + c))
        if layout is not None:
            idx = tuple(layout(*idx))
        instr = isa.matrix_move("ldmatrix", plan.num, plan.trans, arch=self.arch)
        regs = [frag[slot, q] for q in range(plan.num)]
        _ir.emit(_ir.ptx(instr.ptx())(*regs, buf.ptr_to(list(idx))))
        if self.instruction.a_ptx == "tf32":
            self._round_tf32(frag, slot, plan.num)

    def _round_tf32(self, frag, slot, n):
        from tvm.script import tirx as T

        for q in range(n):
            _ir.emit(T.ptx.cvt.rna.tf32.f32(frag[slot, q], T.reinterpret("float32", frag[slot, q])))

    def fragment_slot(self, operand, group, unit, reg):
        """(micro tile, register) of A_frag / B_frag that register ``reg`` of ``unit`` of load group ``group`` of
        a ``TransposedLoadPlan`` fills. A: unit = micro tile in the group. B: unit = n8 tile in the group; n8 tiles
        run across micro tiles (n_tile 16: two per micro tile, registers ``h * b_regs + reg``)."""
        plan = self.a_plan if operand == "A" else self.b_plan
        if operand == "A":
            return group * plan.units + unit, reg
        j, h = divmod(group * plan.units + unit, self.n_tile // 8)
        return j, h * self.instruction.b_regs + reg

    def _ldmatrix_transposed(self, plan, frag_slot, operand, row0, col0, lane, layout):
        """One load group of a ``TransposedLoadPlan``: ldmatrix.trans into temporaries, then the shuffle program,
        whose outputs land in the fragment registers ``frag_slot(unit, reg)``."""
        from tvm.script import tirx as T

        buf, lead, r_off, c_off = _ir.split_region(operand)
        if _ir.scope_of(buf) not in ("shared", "shared.dyn"):
            raise UnsupportedConfigError(f"ldmatrix reads shared memory; {buf.name} is in {_ir.scope_of(buf)!r} "
                                         f"(valid scopes: 'shared', 'shared.dyn')")
        temps = T.alloc_local((len(plan.temps),), "uint32")
        reg = {name: temps[q] for q, name in enumerate(plan.temps)}
        for name, unit, r in plan.outputs:
            reg[name] = frag_slot(unit, r)
        for ld in plan.loads:
            k, mn = plan.lane_address(ld.index, lane)
            idx = (*lead, r_off + row0 + k, c_off + self._buffer_col(buf, plan.elem_bits, col0 + mn))
            if layout is not None:
                idx = tuple(layout(*idx))
            instr = isa.matrix_move("ldmatrix", ld.num, True, arch=self.arch)
            _ir.emit(_ir.ptx(instr.ptx())(*[reg[d] for d in ld.dst], buf.ptr_to(list(idx))))
        for op in plan.ops:
            srcs = [reg[n] for n in op.srcs]
            if op.op == "prmt":
                args = (*srcs, T.uint32(op.imm[0]))
            elif op.op in ("shl", "shr"):
                args = (*srcs, T.uint32(op.imm[0]))
            else:  # lop3: constant third operand, LUT immediate
                args = (*srcs, T.uint32(op.imm[0]), op.imm[1])
            _ir.emit(_ir.ptx(op.ptx())(reg[op.dst], *args))

    def ldmatrix_a(self, A_frag, A_shared, ki, *, warp, lane, layout=None):
        """Load this warp's ``warp_rows`` A micro tiles of K step ``ki`` (one ldmatrix each; .trans if A is [K, M]).

        ``A_shared``: a 2-D shared buffer, or a region/element naming the CTA tile's origin (``As[stage, 0:BM, 0:BK]``).
        ``layout``: the swizzle the tile was written with (``make_mma_swizzle_layout``), applied to full indices.
        A 4-bit operand may sit in a uint8/int8 buffer, packed two per byte (element 2i in the low nibble of byte i;
        buffer indices, regions and ``layout`` then count bytes).
        8/4-bit A stored [K, M]: per 16 (8-bit) or 32 (4-bit) rows one ``TransposedLoadPlan`` group (ldmatrix.trans,
        prmt, and for 4-bit shl/shr/lop3), rows permuted as ``c_row_perm`` says.
        """
        wm, _, wk = self.warp_coords(warp)
        k0 = wk * (self.chunk // self.reduce_k) + ki * self.micro_k
        plan = self.a_plan
        if isinstance(plan, TransposedLoadPlan):
            for grp in range(self.warp_rows // plan.units):
                m0 = wm * self.warp_row_tiles + grp * plan.extent
                self._ldmatrix_transposed(plan, lambda u, r, g=grp: A_frag[self.fragment_slot("A", g, u, r)],
                                          A_shared, k0, m0, lane, layout)
            return
        for i in range(self.warp_rows):
            m0 = wm * self.warp_row_tiles + i * self.micro_m
            row0, col0 = (k0, m0) if self.a_transposed else (m0, k0)
            self._ldmatrix(plan, A_frag, i, A_shared, row0, col0, lane, layout)

    def ldmatrix_b(self, B_frag, B_shared, ki, *, warp, lane, layout=None):
        """Load this warp's ``warp_cols`` B micro tiles of K step ``ki`` (.trans if B is [K, N]).

        8/4-bit B stored [K, N]: per 16 (8-bit) or 32 (4-bit) columns one ``TransposedLoadPlan`` group, columns
        permuted as ``c_col_perm`` says.
        """
        _, wn, wk = self.warp_coords(warp)
        k0 = wk * (self.chunk // self.reduce_k) + ki * self.micro_k
        plan = self.b_plan
        if isinstance(plan, TransposedLoadPlan):
            for grp in range(self.warp_col_tiles // plan.extent):
                n0 = wn * self.warp_col_tiles + grp * plan.extent
                self._ldmatrix_transposed(plan, lambda u, r, g=grp: B_frag[self.fragment_slot("B", g, u, r)],
                                          B_shared, k0, n0, lane, layout)
            return
        for j in range(self.warp_cols):
            n0 = wn * self.warp_col_tiles + j * self.n_tile
            row0, col0 = (n0, k0) if self.b_transposed else (k0, n0)
            self._ldmatrix(plan, B_frag, j, B_shared, row0, col0, lane, layout)

    # ---- mma -----------------------------------------------------------------------------------------------
    def mma_atom(self, A_frag, B_frag, C_frag, i, j, half=None):
        """One mma.sync: A micro tile ``i`` x n8 half ``half`` of B micro tile ``j`` into C micro tile (i, j).

        ``half=None`` issues every n8 half of the micro tile (1 or 2 instructions).
        """
        ins = self.instruction
        halves = range(self.n_tile // 8) if half is None else [half]
        name = ins.ptx(self.satfinite)
        for h in halves:
            a = [A_frag[i, q] for q in range(ins.a_regs)]
            b = [B_frag[j, h * ins.b_regs + q] for q in range(ins.b_regs)]
            c = [C_frag[i, j, h * ins.c_regs + q] for q in range(ins.c_regs)]
            _ir.emit(_ir.ptx(name)(*c, *a, *b, *c))

    def mma(self, A_frag, B_frag, C_frag):
        """All ``warp_rows x warp_cols`` micro tiles of one K step: C += A @ B (accumulates in place)."""
        for i in range(self.warp_rows):
            for j in range(self.warp_cols):
                self.mma_atom(A_frag, B_frag, C_frag, i, j)

    # ---- accumulator positions -----------------------------------------------------------------------------
    def _check_c_rows(self):
        """The C fragment puts lane l's rows at ``l // 4 + 8 hi`` (hi fixed per register slot), columns < 8: the
        row/column permutations below rely on it."""
        lay = self.c_layout
        for reg, elem in ((r, e) for r in range(lay.regs) for e in range(lay.elems_per_reg)):
            hi = lay.forward(0, reg, elem)[0] // 8
            for lane in range(32):
                r, c = lay.forward(lane, reg, elem)
                if r != lane // 4 + 8 * hi or not 0 <= c < 8:
                    raise AssertionError(f"C fragment slot (lane {lane}, reg {reg}, elem {elem}) is at {(r, c)}")

    # Every map below uses only + - * // % (floordiv / floormod on TIR), so it evaluates on Python ints and on
    # PrimExprs alike: the same code serves the emitters (constant indices) and hand-written TIR loops.
    accumulator_elems = property(
        lambda self: (self.n_tile // 8) * self.instruction.c_elems,
        doc="flat accumulator elements per micro tile (per lane): e of ``accumulator_coords`` runs over 0 .. this - 1")

    def _acc_slot(self, e):
        """Flat accumulator element ``e`` of a micro tile -> (n8 half h, register index in C_frag, half in it)."""
        ins = self.instruction
        h, idx = e // ins.c_elems, e % ins.c_elems
        per = self.c_layout.elems_per_reg
        return h, h * ins.c_regs + idx // per, idx % per

    def _m_of(self, i, lo, hi):
        plan = self.a_plan
        if isinstance(plan, TransposedLoadPlan):
            return (i // plan.units) * plan.extent + plan.mn_offset(i % plan.units, lo, hi)
        return i * self.micro_m + lo + 8 * hi

    def _n_of(self, j, h, col):
        plan = self.b_plan
        if isinstance(plan, TransposedLoadPlan):
            s = j * (self.n_tile // 8) + h
            return (s // plan.units) * plan.extent + plan.mn_offset(s % plan.units, col)
        return j * self.n_tile + 8 * h + col

    def accumulator_coords(self, lane, i, j, e):
        """(m, n) inside the warp tile of flat accumulator element ``e`` of micro tile (i, j) held by ``lane``.

        ``e`` runs over ``accumulator_elems`` = ``(n_tile // 8) * instruction.c_elems`` elements: n8 half
        ``e // c_elems``, then the C fragment's element order (f16 accumulators: two per register, low half first).
        Every argument may be a Python int or a PrimExpr (a ``T.unroll`` / ``T.serial`` loop variable inside
        ``@T.prim_func``). The register holding the element is ``accumulator_register(i, j, e)``, its value
        ``accumulator_value(C_frag, i, j, e)``. Add ``warp_coords(warp)`` times the warp tile (and the CTA's origin)
        for the position in C. This is the map to use when reading ``C_frag`` by hand: it is the C fragment layout
        (``mma_fragment(instruction, "C")``) plus ``c_row_perm`` / ``c_col_perm``.
        """
        h, reg, half = self._acc_slot(e)
        lay = self.c_layout
        # the C layout puts lane l's rows at l // 4 + 8 hi, hi fixed per register slot (checked in __init__)
        hi = lay.forward(0, reg - h * self.instruction.c_regs, half)[0] // 8
        col = lay.forward(lane, reg - h * self.instruction.c_regs, half)[1]
        return self._m_of(i, lane // 4, hi), self._n_of(j, h, col)

    def accumulator_register(self, i, j, e):
        """(C_frag index ``(i, j, reg)``, half): the register of flat accumulator element ``e`` of micro tile (i, j)
        and, for f16 accumulators (two per uint32), which 16-bit half (0 = low bits); always 0 otherwise. Ints or
        PrimExprs."""
        _, reg, half = self._acc_slot(e)
        return (i, j, reg), half

    def accumulator_value(self, C_frag, i, j, e):
        """Flat accumulator element ``e`` of micro tile (i, j) as a PrimExpr of ``accum_dtype`` (float32, float16
        unpacked from its register half, or int32); ``i``, ``j``, ``e`` may be PrimExprs. Read-only: write results
        to memory (see ``examples/gemm_fused_epilogue.py``)."""
        from tvm.script import tirx as T

        x = self._acc_value(C_frag, i, j, e)[0]
        return T.reinterpret("int32", x) if self.accum_dtype == "int32" else x

    def _accumulator_pairs(self):
        """Flat accumulator element pairs (e, e+1) that sit in adjacent columns of one row (checked here)."""
        lay = self.c_layout
        per = lay.elems_per_reg
        n = lay.regs * per
        pairs = []
        for e in range(0, n, 2):
            for lane in range(32):
                r0, c0 = lay.forward(lane, e // per, e % per)
                r1, c1 = lay.forward(lane, (e + 1) // per, (e + 1) % per)
                if (r1, c1) != (r0, c0 + 1) or c0 % 2:
                    raise AssertionError(f"accumulator elements {e},{e + 1} are not an aligned column pair")
            pairs.append(e)
        return pairs

    def _store_pairs(self):
        """Every accumulator as ((i, j, e), (i, j2, e2)) pairs at (m, n) and (m, n + 1), n even, for every lane.

        Without a column permutation these are the fragment pairs of one n8 tile; with one they join n8 tiles (and
        micro tiles) of a load group. Found by enumerating the lanes, so any pairing error shows up here.
        """
        elems = (self.n_tile // 8) * self.instruction.c_elems
        pairs = []
        for i in range(self.warp_rows):
            where = {}
            for j in range(self.warp_cols):
                for e in range(elems):
                    where[tuple(self.accumulator_coords(lane, i, j, e) for lane in range(32))] = (i, j, e)
            for key, slot in where.items():
                if any(n % 2 for _, n in key):
                    continue
                mate = where.get(tuple((m, n + 1) for m, n in key))
                if mate is None:
                    raise AssertionError(f"accumulator {slot} has no neighbour at n + 1")
                pairs.append((slot, mate))
        if 2 * len(pairs) != self.warp_rows * self.warp_cols * elems:
            raise AssertionError("accumulators do not split into (n, n + 1) pairs")
        return sorted(pairs)

    def _store_quads(self):
        """The store pairs joined into (pair at n, pair at n + 2) with n % 4 == 0 for every lane, or None unless every
        pair joins one. A column permutation gives each lane four adjacent n per row (n = S c .. S c + S - 1), so one
        16-byte store (32-bit output) or 8-byte store (16-bit) writes them; without one a lane holds only pairs."""
        coords = {}
        for a, b in self._c_store_pairs:
            coords[tuple(self.accumulator_coords(lane, *a) for lane in range(32))] = (a, b)
        quads = []
        for key, pair in coords.items():
            if any(n % 4 for _, n in key):
                continue
            mate = coords.get(tuple((m, n + 2) for m, n in key))
            if mate is None:
                return None
            quads.append((pair, mate))
        return sorted(quads) if 2 * len(quads) == len(self._c_store_pairs) else None

    def _acc_value(self, C_frag, i, j, e):
        """(value as a PrimExpr of the accumulator type, its C_frag register, half) of element ``e``."""
        from tvm.script import tirx as T

        _, reg, half = self._acc_slot(e)
        r = C_frag[i, j, reg]
        if self.accum_dtype == "float16":
            if isinstance(half, int):
                bits = r & T.uint32(0xFFFF) if half == 0 else r >> T.uint32(16)
            else:
                bits = (r >> T.Cast("uint32", half * 16)) & T.uint32(0xFFFF)
            return T.reinterpret("float16", T.Cast("uint16", bits)), r, half
        return r, r, half

    # ---- registers -> memory -------------------------------------------------------------------------------
    def _value32(self, C_frag, slot, out_dtype):
        """Accumulator ``slot`` as the 32-bit output value (float32 / int32)."""
        from tvm.script import tirx as T

        x = self._acc_value(C_frag, *slot)[0]
        return T.Cast("float32", x) if out_dtype == "float32" and self.accum_dtype == "float16" else x

    def _word16(self, C_frag, a, b, out_dtype):
        """A uint32 holding accumulators ``a`` (low half) and ``b`` converted to the 16-bit ``out_dtype``."""
        from tvm.script import tirx as T

        x0, r0, h0 = self._acc_value(C_frag, *a)
        x1, r1, h1 = self._acc_value(C_frag, *b)
        if self.accum_dtype == "float16" and out_dtype == "float16":
            if a[:2] == b[:2] and self._acc_slot(a[2])[1] == self._acc_slot(b[2])[1] and (h0, h1) == (0, 1):
                return r0
            # the pair sits in two registers (column permutation): pack the halves with one prmt
            tmp = T.alloc_local((1,), "uint32")
            _ir.emit(T.ptx.prmt.b32(tmp[0], r0, r1, T.uint32((2 * h0) | (2 * h0 + 1) << 4
                                                              | (4 + 2 * h1) << 8 | (5 + 2 * h1) << 12)))
            return tmp[0]
        tmp = T.alloc_local((1,), "uint32")
        cvt = "cvt.rn.f16x2.f32" if out_dtype == "float16" else "cvt.rn.bf16x2.f32"
        _ir.emit(_ir.ptx(cvt)(tmp[0], x1, x0))
        return tmp[0]

    def _store_run(self, buf, idx, C_frag, slots, out_dtype, space):
        """One vector store of 2 or 4 accumulators adjacent along n (``slots`` in n order) at ``idx``."""
        ptr = buf.ptr_to(list(idx))
        if _dt.bits(out_dtype) == 32:
            kind = "f32" if out_dtype == "float32" else "b32"
            vals = [self._value32(C_frag, s, out_dtype) for s in slots]
            _ir.emit(_ir.ptx(f"st.{space}.v{len(slots)}.{kind}")(ptr, *vals))
            return
        words = [self._word16(C_frag, slots[q], slots[q + 1], out_dtype) for q in range(0, len(slots), 2)]
        _ir.emit(_ir.ptx(f"st.{space}.{'v2.' if len(words) == 2 else ''}b32")(ptr, *words))

    def _quads_fit(self, buf, c_off):
        """True when 4-element stores at n % 4 == 0 are aligned in ``buf``: a static row length and column offset
        that are multiples of 4 elements (the buffer itself starts at least 16-byte aligned)."""
        if self._c_store_quads is None:
            return False
        try:
            cols, off = int(buf.shape[-1]), int(c_off)
        except TypeError:
            return False
        return cols % 4 == 0 and off % 4 == 0

    def stmatrix(self, C_frag, C_buf, *, warp, lane, layout=None, block_row=0, block_col=0, use_stmatrix=None,
                 transpose=False, num=None, row_limit=None):
        """Store this warp's accumulators to ``C_buf`` (shared or global), converting to ``C_buf``'s dtype.

        Shared, 16-bit output, sm_90+ (``arch`` given): PTX ``stmatrix.sync.aligned.m8n8.x{2,4}[.trans].shared.b16``
        (``use_stmatrix=False`` forces plain stores). Otherwise one 2-element vector store per accumulator pair
        (``st.{shared,global}.v2.f32`` / ``.b32``), or element stores when transposed. ``transpose=True`` stores
        C^T: element (m, n) goes to ``C_buf[n, m]`` (``.trans``). ``C_buf`` may be a region; ``block_row`` /
        ``block_col`` add ``block_m`` / ``block_n`` multiples (the CTA's tile) to the (m, n) origin. ``num``
        (1, 2 or 4) picks stmatrix.x{num}: a micro tile holds ``2 * n_tile // 8`` 8x8 matrices, stored by as many
        instructions as needed (default: one). ``row_limit``: skip rows m >= row_limit (a C with fewer rows than the
        tile, e.g. a GEMV with M < 16; plain stores only). With
        ``reduce_k > 1`` only the ``warp_k == 0`` group stores (call ``reduce_accumulators`` first). Output dtypes:
        float32 accumulators -> float32/float16/bfloat16; float16 -> float16/float32; int32 -> int32.
        Permuted accumulators (``c_row_perm`` / ``c_col_perm``) land at their true (m, n): PTX stmatrix takes per-row
        addresses, so it serves a row permutation (or, transposed, a column permutation); the other case uses the
        vector stores, which join the accumulators of adjacent n across n8 tiles: with a column permutation a lane
        holds 4 adjacent n per row and stores them with one ``st.v4.b32/f32`` (16-bit output: ``st.v2.b32``) when
        ``C_buf``'s row length and column offset are static multiples of 4, else as two 2-element stores.
        """
        buf, lead, r_off, c_off = _ir.split_region(C_buf)
        out = _dt.canonical(buf.dtype)
        if out not in _OUT_DTYPES[self.accum_dtype]:
            raise UnsupportedConfigError(f"cannot store {self.accum_dtype} accumulators as {out}; valid output "
                                         f"dtypes: {choices(_OUT_DTYPES[self.accum_dtype])}")
        scope = _ir.scope_of(buf)
        space = "global" if scope == "global" else "shared" if scope in ("shared", "shared.dyn") else None
        if space is None:
            raise UnsupportedConfigError(f"stmatrix stores to shared or global memory; {buf.name} is {scope!r}")
        can_ptx = (space == "shared" and _dt.bits(out) == 16 and self.arch is not None
                   and self.arch.satisfies(isa.FEATURES["stmatrix"].min_arch))
        if use_stmatrix and not can_ptx:
            isa.matrix_move("stmatrix", 4, arch=self.arch or "sm_80")  # raises the arch error if that is the cause
            raise UnsupportedConfigError("PTX stmatrix needs a shared destination of a 16-bit dtype "
                                         f"(got {out} in {scope!r})")
        # a stmatrix row is 8 contiguous elements: the permutation along the row must be the identity
        along_row = self.c_row_perm if transpose else self.c_col_perm
        if use_stmatrix and along_row is not None:
            raise UnsupportedConfigError(
                f"PTX stmatrix{'.trans' if transpose else ''} writes 8 contiguous {'m' if transpose else 'n'} per "
                f"row, but the accumulators' {'rows' if transpose else 'columns'} are permuted by the "
                f"{'M' if transpose else 'N'}-contiguous {self.a_dtype if transpose else self.b_dtype} operand; "
                f"use use_stmatrix=None/False (vector stores){' or store C untransposed' if transpose else ''}")
        wm, wn, wk = self.warp_coords(warp)
        m_base = block_row * self.block_m + wm * self.warp_row_tiles
        n_base = block_col * self.block_n + wn * self.warp_col_tiles

        def index(m, n):
            idx = (*lead, r_off + n, c_off + m) if transpose else (*lead, r_off + m, c_off + n)
            return tuple(layout(*idx)) if layout is not None else idx

        with _ir.only_if(wk == 0 if self.reduce_k > 1 else None):
            if row_limit is not None and use_stmatrix:
                raise UnsupportedConfigError("row_limit needs the plain-store path (use_stmatrix=False)")
            if can_ptx and use_stmatrix is not False and along_row is None and row_limit is None:
                self._stmatrix_ptx(C_frag, buf, m_base, n_base, lane, index, out, transpose, num)
                return
            runs = ([(*p, *q) for p, q in self._c_store_quads] if not transpose and self._quads_fit(buf, c_off)
                    else self._c_store_pairs)
            for run in runs:
                m, n = self.accumulator_coords(lane, *run[0])
                m, n = m_base + m, n_base + n
                with _ir.only_if(m < row_limit if row_limit is not None else None):
                    if transpose:
                        for d, slot in enumerate(run):
                            _ir.store(buf, _ir.cast(out, self._acc_value(C_frag, *slot)[0]), index(m, n + d))
                    else:
                        self._store_run(buf, index(m, n), C_frag, run, out, space)

    def _stmatrix_row(self, lane, i, j, first, per, transpose):
        """(m, n) in the warp tile of the row start whose address ``lane`` gives to the stmatrix.x{per}[.trans] that
        stores matrices ``first .. first + per - 1`` of micro tile (i, j).

        Lane ``8 t + r`` addresses row r of matrix jm = first + t = (n8 half jm // 2, row half jm % 2): fragment row
        ``r + 8 (jm % 2)``; transposed, a stored row is fragment column r of n8 half jm // 2 (the order of
        ``AccumulatorStorePlan``). Permutations apply per row (the caller ensures none runs along the row).
        """
        jm, r = first + (lane // 8) % per, lane % 8
        if transpose:
            return self._m_of(i, 0, jm % 2), self._n_of(j, jm // 2, r)
        return self._m_of(i, r, jm % 2), self._n_of(j, jm // 2, 0)

    def _stmatrix_ptx(self, C_frag, buf, m_base, n_base, lane, index, out, transpose, num):
        from tvm.script import tirx as T

        plan = accumulator_store_plan(self.n_tile, transpose)
        per = plan.num if num is None else num
        if per not in (1, 2, 4) or per > plan.num:
            raise UnsupportedConfigError(f"stmatrix num for a 16x{self.n_tile} micro tile must be one of "
                                         f"{choices(n for n in (1, 2, 4) if n <= plan.num)}, not {num!r}")
        instr = isa.matrix_move("stmatrix", per, transpose, arch=self.arch)
        tmp = T.alloc_local((plan.num,), "uint32")
        c_elems = self.instruction.c_elems
        for i in range(self.warp_rows):
            for j in range(self.warp_cols):
                # register q of stmatrix = n8 half q // 2, row half q % 2 (the plan's matrix order)
                for q in range(plan.num):
                    e = (q // 2) * c_elems + self._c_pairs[q % 2]
                    x0, packed, _ = self._acc_value(C_frag, i, j, e)
                    x1 = self._acc_value(C_frag, i, j, e + 1)[0]
                    if self.accum_dtype == "float16":
                        _ir.store(tmp, packed, (q,))
                    else:
                        cvt = "cvt.rn.f16x2.f32" if out == "float16" else "cvt.rn.bf16x2.f32"
                        _ir.emit(_ir.ptx(cvt)(tmp[q], x1, x0))
                for first in range(0, plan.num, per):
                    m, n = self._stmatrix_row(lane, i, j, first, per, transpose)
                    idx = index(m_base + m, n_base + n)
                    _ir.emit(_ir.ptx(instr.ptx())(buf.ptr_to(list(idx)), *[tmp[q] for q in range(first, first + per)]))

    # ---- split-K across warp groups ------------------------------------------------------------------------
    @property
    def reduce_scratch_shape(self):
        """Shape of the shared scratch ``reduce_accumulators`` needs (dtype ``c_fragment_dtype``), () if none."""
        if self.reduce_k == 1:
            return ()
        per_warp = self.warp_rows * self.warp_cols * self.local_size_c
        return (self.reduce_k - 1, self.block_row_warps * self.block_col_warps, per_warp, 32)

    def reduce_accumulators(self, C_frag, scratch, *, warp, lane):
        """Sum the ``reduce_k`` groups' partial accumulators into group 0 (``warp_k == 0``); all warps must call it.

        Groups 1.. write their registers to ``scratch`` (shape ``reduce_scratch_shape``, lane-contiguous so the
        stores and loads are conflict-free), one ``bar.sync``, then group 0 adds them in group order. The sum is
        register by register: every group holds the same (m, n) in the same register, permuted or not. float32: fp32
        adds; float16: ``add.f16x2``; int32: wrapping 32-bit adds (as the mma's own accumulation).
        """
        from tvm.script import tirx as T

        if self.reduce_k == 1:
            return
        if tuple(int(x) for x in scratch.shape) != self.reduce_scratch_shape:
            raise TileShapeError(f"scratch shape {list(scratch.shape)} != reduce_scratch_shape "
                                 f"{list(self.reduce_scratch_shape)}")
        _, _, wk = self.warp_coords(warp)
        wmn = warp % (self.block_row_warps * self.block_col_warps)
        regs = [(i, j, r) for i in range(self.warp_rows) for j in range(self.warp_cols)
                for r in range(self.local_size_c)]
        with _ir.only_if(wk > 0):
            for f, (i, j, r) in enumerate(regs):
                _ir.store(scratch, C_frag[i, j, r], (wk - 1, wmn, f, lane))
        _ir.emit(T.cuda.cta_sync())
        with _ir.only_if(wk == 0):
            for g in range(self.reduce_k - 1):
                for f, (i, j, r) in enumerate(regs):
                    part = scratch[g, wmn, f, lane]
                    if self.accum_dtype == "float16":
                        _ir.emit(T.ptx.add.f16x2(C_frag[i, j, r], C_frag[i, j, r], part))
                    else:
                        _ir.store(C_frag, C_frag[i, j, r] + part, (i, j, r))
