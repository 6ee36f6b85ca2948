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
"""
from __future__ import annotations

from .. import dtypes as _dt
from .. import isa
from ..arch import as_arch
from ..errors import TileShapeError, UnsupportedConfigError, choices
from ..layouts.fragment import mma_fragment
from ..layouts.operand_load import accumulator_store_plan, operand_load_plan
from . import _ir

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
            instead of [K, N]. M/N-contiguous storage needs 16-bit operands (ldmatrix .trans).
        block_row_warps, block_col_warps: warps along M and N. warp_row_tiles, warp_col_tiles: a warp's C extent.
        chunk: the K extent of one shared tile. reduce_k: warp groups splitting ``chunk`` along K.
        n_tile: 8 or 16 (default 16 when ``warp_col_tiles`` allows). k: the mma K (default: the table's largest).
        warp_order: "m_fast" (warp id = warp_m + block_row_warps * warp_n) or "n_fast".
        arch: target arch; checks the instruction exists there and enables PTX stmatrix on sm_90+.
        satfinite: clamp integer accumulators (``.satfinite``) instead of wrapping.
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
        self.c_layout = mma_fragment(ins, "C")
        self._c_pairs = self._accumulator_pairs()

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
    def _ldmatrix(self, plan, frag, slot, operand, row0, col0, lane, layout):
        buf, lead, r_off, c_off = _ir.split_region(operand)
        if _ir.scope_of(buf) not in ("shared", "shared.dyn"):
            raise UnsupportedConfigError(f"ldmatrix reads shared memory; {buf.name} is in {_ir.scope_of(buf)!r} "
                                         f"(valid scopes: 'shared', 'shared.dyn')")
        r, c = plan.lane_address(lane)
        idx = (*lead, r_off + row0 + r, c_off + col0 + c)
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

    def ldmatrix_a(self, A_frag, A_shared, ki, *, warp, lane, layout=None):
        """Load this warp's ``warp_rows`` A micro tiles of K step ``ki`` (one ldmatrix each; .trans if A is [K, M]).

        ``A_shared``: a 2-D shared buffer, or a region/element naming the CTA tile's origin (``As[stage, 0:BM, 0:BK]``).
        ``layout``: the swizzle the tile was written with (``make_mma_swizzle_layout``), applied to full indices.
        """
        wm, _, wk = self.warp_coords(warp)
        k0 = wk * (self.chunk // self.reduce_k) + ki * self.micro_k
        for i in range(self.warp_rows):
            m0 = wm * self.warp_row_tiles + i * self.micro_m
            row0, col0 = (k0, m0) if self.a_transposed else (m0, k0)
            self._ldmatrix(self.a_plan, A_frag, i, A_shared, row0, col0, lane, layout)

    def ldmatrix_b(self, B_frag, B_shared, ki, *, warp, lane, layout=None):
        """Load this warp's ``warp_cols`` B micro tiles of K step ``ki`` (.trans if B is [K, N])."""
        _, wn, wk = self.warp_coords(warp)
        k0 = wk * (self.chunk // self.reduce_k) + ki * self.micro_k
        for j in range(self.warp_cols):
            n0 = wn * self.warp_col_tiles + j * self.n_tile
            row0, col0 = (n0, k0) if self.b_transposed else (k0, n0)
            self._ldmatrix(self.b_plan, B_frag, j, B_shared, row0, col0, lane, layout)

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

    # ---- registers -> memory -------------------------------------------------------------------------------
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

    def _pair_values(self, C_frag, i, j, h, e):
        """The two accumulator values of pair ``e`` (as PrimExprs of the accumulator type) and the packed reg."""
        from tvm.script import tirx as T

        base = h * self.instruction.c_regs
        if self.accum_dtype == "float16":
            reg = C_frag[i, j, base + e // 2]
            lo = T.reinterpret("float16", T.Cast("uint16", reg & T.uint32(0xFFFF)))
            hi = T.reinterpret("float16", T.Cast("uint16", reg >> T.uint32(16)))
            return lo, hi, reg
        return C_frag[i, j, base + e], C_frag[i, j, base + e + 1], None

    def _store_pair(self, buf, idx, C_frag, i, j, h, e, out_dtype, space):
        from tvm.script import tirx as T

        x0, x1, packed = self._pair_values(C_frag, i, j, h, e)
        ptr = buf.ptr_to(list(idx))
        acc = self.accum_dtype
        if out_dtype == "float32":
            if acc == "float16":
                x0, x1 = T.Cast("float32", x0), T.Cast("float32", x1)
            _ir.emit(_ir.ptx(f"st.{space}.v2.f32")(ptr, x0, x1))
        elif acc == "int32":
            _ir.emit(_ir.ptx(f"st.{space}.v2.b32")(ptr, x0, x1))
        elif acc == "float16" and out_dtype == "float16":
            _ir.emit(_ir.ptx(f"st.{space}.b32")(ptr, packed))
        else:
            tmp = T.alloc_local((1,), "uint32")
            cvt = "cvt.rn.f16x2.f32" if out_dtype == "float16" else "cvt.rn.bf16x2.f32"
            _ir.emit(_ir.ptx(cvt)(tmp[0], x1, x0))
            _ir.emit(_ir.ptx(f"st.{space}.b32")(ptr, tmp[0]))

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
        wm, wn, wk = self.warp_coords(warp)
        m_base = block_row * self.block_m + wm * self.warp_row_tiles
        n_base = block_col * self.block_n + wn * self.warp_col_tiles

        def index(m, n):
            idx = (*lead, r_off + n, c_off + m) if transpose else (*lead, r_off + m, c_off + n)
            return tuple(layout(*idx)) if layout is not None else idx

        with _ir.only_if(wk == 0 if self.reduce_k > 1 else None):
            if row_limit is not None and use_stmatrix:
                raise UnsupportedConfigError("row_limit needs the plain-store path (use_stmatrix=False)")
            if can_ptx and use_stmatrix is not False and row_limit is None:
                self._stmatrix_ptx(C_frag, buf, m_base, n_base, lane, index, out, transpose, num)
                return
            lay = self.c_layout
            per = lay.elems_per_reg
            for i in range(self.warp_rows):
                for j in range(self.warp_cols):
                    for h in range(self.n_tile // 8):
                        for e in self._c_pairs:
                            r, c = lay.forward(lane, e // per, e % per)
                            m = m_base + i * self.micro_m + r
                            n = n_base + j * self.n_tile + h * 8 + c
                            if transpose:
                                x0, x1, _ = self._pair_values(C_frag, i, j, h, e)
                                for d, x in enumerate((x0, x1)):
                                    _ir.store(buf, _ir.cast(out, x), index(m, n + d))
                            else:
                                with _ir.only_if(m < row_limit if row_limit is not None else None):
                                    self._store_pair(buf, index(m, n), C_frag, i, j, h, e, out, space)

    def _stmatrix_ptx(self, C_frag, buf, m_base, n_base, lane, index, out, transpose, num):
        from tvm.script import tirx as T

        plan = accumulator_store_plan(self.n_tile, transpose)
        per = plan.num if num is None else num
        if per not in (1, 2, 4) or per > plan.num:
            raise UnsupportedConfigError(f"stmatrix num for a 16x{self.n_tile} micro tile must be one of "
                                         f"{choices(n for n in (1, 2, 4) if n <= plan.num)}, not {num!r}")
        instr = isa.matrix_move("stmatrix", per, transpose, arch=self.arch)
        tmp = T.alloc_local((plan.num,), "uint32")
        for i in range(self.warp_rows):
            for j in range(self.warp_cols):
                # register q of stmatrix = n8 half q // 2, row half q % 2 (the plan's matrix order)
                for q in range(plan.num):
                    h, e = q // 2, self._c_pairs[q % 2]
                    x0, x1, packed = self._pair_values(C_frag, i, j, h, e)
                    if self.accum_dtype == "float16":
                        _ir.store(tmp, packed, (q,))
                    else:
                        cvt = "cvt.rn.f16x2.f32" if out == "float16" else "cvt.rn.bf16x2.f32"
                        _ir.emit(_ir.ptx(cvt)(tmp[q], x1, x0))
                for first in range(0, plan.num, per):
                    m, n = plan.lane_address(lane, first, per)  # the row this lane addresses, in the micro tile
                    idx = index(m_base + i * self.micro_m + m, n_base + j * self.n_tile + n)
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
        stores and loads are conflict-free), one ``bar.sync``, then group 0 adds them in group order. float32: fp32
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
