"""Dequant GEMV / GEMM, W8A16 / W4A16 / W2A16 / W1A16, from mmaemit's building blocks: C = A @ dequant(W)^T.

Shapes: A [M, K], W [N, K] (packed), C [M, N].

Weights: b-bit codes (b in 1, 2, 4, 8; every per-element format of ``WEIGHT_FORMATS``) with a per-(n, group) scale,
packed once by :func:`mmaemit.dequant.kernel_layout.to_kernel_layout` (mma B-fragment order, a K permutation inside
each 64-wide chunk, WPC = b words = 4 b bytes per lane per n16 block and chunk). Small-M path (M <= 32, ``m_max``)
per CTA: ``k_slices`` warps each own a K slice of the same ``16 * n_blocks`` output columns. The decoded weights
are the mma's A operand (``GemvConfig.weights_as_a``, C^T = W A^T: an n16 block of weight rows is an m16 tile) and a
warp's ceil(m_max / 8) token rows g + 8 r are its n8 tiles, so each decoded weight fragment feeds one mma per 8
tokens; with ``weights_as_a=False`` the weights are B and a warp holds ceil(m_max / 16) m16 tiles of activation rows.

* weights: per lane, n16 block and 64-wide K chunk, 4 b bytes by ``cp.async`` (16-byte ``cp.async.cg`` pieces for
  b >= 4, one 8- / 4-byte ``cp.async.ca`` for b = 2 / 1) into a ``stages``-deep per-thread ring in shared memory
  (each thread reads back only the bytes it copied, so the ring needs no barrier);
* activations: the K permutation makes a lane's A-fragment registers of a chunk 16 consecutive halfs of one row, so
  two 16-byte loads per row fetch them (rows >= M are zero and never loaded); with ``operand_ring`` (default for
  ``m_max`` <= 8) they are ``cp.async`` copies into the same per-thread ring as the weights, ``stages - 1`` chunks
  ahead, and so are each group's scales (zeros); else ``ld.global`` one chunk ahead (scales: at the group's first
  chunk);
* decode (``mmaemit.dequant.decode``; magic-number / LUT / cvt fast path where one exists, else the exact reference
  converter) of the words straight into the weight fragment by the kernel layout's decode-slice rule (word w of a
  chunk gives B-fragment registers [w R, (w + 1) R), R = 16 / b, of the chunk's 4 k16 steps x 4 registers; 8-bit:
  two words per step, 2 / 1-bit: one word decoded at its first step, the later steps' registers kept in a small
  local buffer; as A, B register r of a block is A register ``weight_a_registers(...)[r]``); ``mma.sync m16n8k16``
  through ``TensorCoreIntrinEmitter.mma`` accumulates the group's code-value products
  in fp32 (exact products), and at the end of every group the fp32 partials are scaled,
  ``acc += s[n, group] * partial`` (one FFMA per accumulator per group instead of one HMUL2 per weight pair, and
  the scale is applied in fp32 instead of rounding every dequantized weight to fp16 / bf16);
* epilogue: every warp writes its partial sums of rows < M to shared memory; after one barrier all threads sum the
  ``k_slices`` partials of the M x (16 n_blocks) outputs in parallel and store them coalesced.

    python -m mmaemit.kernels.dequant_gemm         # needs a GPU
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mmaemit import TensorCoreIntrinEmitter, isa
from mmaemit.arch import as_arch
from mmaemit.dequant.kernel_layout import CHUNK, words_per_chunk
from mmaemit.dtypes import canonical
from mmaemit.emitters.builder import emit, only_if, store
from mmaemit.errors import TileShapeError, UnsupportedConfigError, choices
from mmaemit.kernels.dequant_parts import (TABLE_FORMATS, WEIGHT_FORMATS, ZEROS_FORMATS, ZEROS_MODES,  # noqa: F401
                                           check_scheme, grid_kernel, kernel_decode_program, pair_of_column,
                                           symbolic_m)
from mmaemit.kernels.gated import check_gate, gate_tir
from mmaemit.runtime.launch import programmatic_dependent_launch


#: where the GEMV looks a table format's codes up (``GemvConfig.lookup``)
LOOKUPS = ("registers", "shared")
#: the shared pair table of ``lookup="shared"``: entry i = (value of code i & 15, value of code i >> 4) as one
#: f16x2 / bf16x2 word (unscaled: the GEMV scales its fp32 partial sums), 32 copies side by side (row i holds entry i
#: 32 times and lane l reads word l, so a warp's 32 lookups hit 32 banks whatever the codes)
PAIR_TABLE_ROWS, PAIR_TABLE_COPIES = 256, 32

#: largest M of the small-M path (n8 token tiles per warp: ceil(m_max / 8), each decoded weight fragment feeds all)
GEMV_M_LIMIT = 32


class _WordPlan:
    """The decode-slice rule of :mod:`mmaemit.dequant.kernel_layout` for b-bit words: WPC = b words per lane, n16
    block and chunk, R = 16 / b registers per word. B-fragment register r (0..3) of k16 step s is chunk register
    4 s + r = output (4 s + r) % R of word (4 s + r) // R; its scale / zero pair is that of the n8 half r // 2."""

    def __init__(self, bits):
        self.wpc = words_per_chunk(bits)
        self.regs = 16 // bits                       # R
        self.vec = min(self.wpc, 4)                  # words per cp.async / shared load: 16, 8 or 4 bytes
        self.pieces = self.wpc // self.vec           # cp.asyncs / shared loads per lane, block and chunk
        self.words_per_step = max(1, 4 // self.regs)     # 8-bit: 2
        self.steps_per_word = max(1, self.regs // 4)     # 2-bit: 2, 1-bit: 4
        self.stash = max(0, self.regs - 4)       # outputs kept for the word's later steps

    def decode_step(self, program, s, word, b_reg, stash, pair, operands=None):
        """Emit the decode of the words k16 step ``s`` (a TIR loop variable) starts, for one n16 block:
        ``word(w)`` the block's word register w, ``b_reg(r)`` B-fragment lvalue r, ``stash(i)`` stash lvalue i
        (outputs 4.. of a word with R > 4, used by the word's later steps), ``pair(h)`` the (scale, zero) operand
        pairs of n8 half h, each None when the program takes none; ``operands``: the block's operand registers
        (``program.emit_operands`` with :meth:`operand_halves`' pairs) instead of ``pair``. With R > 4 call it only
        when ``s % steps_per_word == 0``."""
        for u in range(self.words_per_step):
            if self.words_per_step > 1:
                w = s * self.words_per_step + u
            elif self.steps_per_word > 1:
                w = s // self.steps_per_word
            else:
                w = s
            regs = [u * self.regs + i for i in range(self.regs)]        # chunk registers relative to step s
            out = [b_reg(c) if c < 4 else stash(c - 4) for c in regs]
            if operands is not None:
                program.emit(word(w), out, operands=operands)
                continue
            pairs = [pair(c % 4 // 2) for c in regs]
            sp = None if pairs[0][0] is None else [p[0] for p in pairs]
            zp = None if pairs[0][1] is None else [p[1] for p in pairs]
            program.emit(word(w), out, scale_pair=sp, zero_pair=zp)

    def operand_halves(self):
        """The n8 half of each output register of a word, the same for every word of a block where a step starts
        one word (b <= 4): the pairs to give ``emit_operands`` for a block's operand registers."""
        if self.words_per_step != 1:
            raise UnsupportedConfigError("8-bit words alternate their n8 halves; their operands are per word")
        return [c % 4 // 2 for c in range(self.regs)]

    def from_stash(self, s, c):
        """Stash index of B-fragment register ``c`` at a step ``s`` that does not start a word (R > 4)."""
        return 4 * (s % self.steps_per_word) - 4 + c


@dataclass(frozen=True)
class GemvConfig:
    """Tile configuration of the small-M path."""

    n_blocks: int = 2    # n16 blocks per warp: the warp's C tile is M x (16 * n_blocks)
    k_slices: int = 8    # warps per CTA, each a K slice; partial sums reduced through shared memory
    stages: int = 4      # depth of the per-thread cp.async weight ring (chunks in flight)
    min_blocks_per_sm: int = 2   # __launch_bounds__ minimum: 2 asks nvcc to fit two CTAs per SM in registers
    decode_variant: str = "shift"  # "marlin": two-mask int4 decode (fp16 only; 9 instead of 11 ops per 8 weights)
    #: activations and scales (and zeros) ride the weights' cp.async ring, ``stages - 1`` chunks ahead, instead of
    #: ``ld.global`` one chunk (activations) / zero chunks (scales) ahead of their use; "scales": only the scales
    #: (zeros). None: on for ``m_max`` <= 8 (H100, 8192^2 int4 M=1: 15.2 against 17.6-18.9 us); with 16 rows the
    #: ring's activation slots double and it lost (M=16: 21.5 against 18.5 us)
    operand_ring: bool | str | None = None
    #: the decoded weights are the mma's A operand (C^T = W A^T: an n16 block of weight rows is the m16 tile, 8
    #: tokens an n8 tile), so at M <= 8 one ``mma.sync m16n8k16`` per n16 block and k16 step does what two did with
    #: the weights as B (16 activation rows, M of them real), and no zero rows are moved into A fragments (H100,
    #: 8192^2 M=1: int4 14.8 against 15.5-17.8 us, int2 11.5-11.8 against 13.9, M=16 int4 17.2 against 18.9-19.4).
    #: False: the weights as B (C = A W^T, m16 tiles of activation rows)
    weights_as_a: bool = True
    #: programmatic dependent launch (:mod:`mmaemit.runtime.launch`): the kernel lets the next one in the stream start
    #: as its CTAs leave (``griddepcontrol.launch_dependents`` at entry); each warp then prefetches into L2 the first
    #: ``pdl_prefetch`` chunks of its weights (None: ``stages - 1``, what the ring's prologue loads first; 0: none)
    #: and waits for the kernel before it (``griddepcontrol.wait``) before it reads activations or scales or writes
    #: anything. None: on where the arch has ``griddepcontrol`` (sm_90+). H100, 8192^2 int4, back-to-back calls:
    #: M=1 13.3-13.7 against 14.7-15.0 us, M=16 15.6 against 16.8-17.3; prefetching the whole K slice lost (14.8)
    pdl: bool | None = None
    pdl_prefetch: int | None = None
    #: how a table format's (nf4's) codes become values: "registers" (the decode program: ``prmt`` lookups in byte
    #: planes of the 16 values held in registers, 23 ops per word of 8 codes) or "shared" (a table of the 256 value
    #: pairs in shared memory, :data:`PAIR_TABLE_ROWS` x :data:`PAIR_TABLE_COPIES`: one ``ld.shared.b32`` per two
    #: codes, 17 ops per word with the 4 loads; 32 KB of shared memory per CTA, filled at entry before
    #: ``griddepcontrol.wait``). None: "shared" for table formats where ``32 * k_slices`` divides or is a multiple of
    #: 256, else "registers"; other formats always decode in registers. H100, nf4 fp16 M=1 / 16: 8192^2 14.8-15.2 /
    #: 18.5-19.5 us against 18.8 / 22.3-23.3 (int4 13.3 / 15.9), 28672 x 8192 47.6-48.0 / 59.4-60.3 against
    #: 59.8-61.1 / 70.1-70.7
    lookup: str | None = None


def register_nibbles(program):
    """[(a, b) per output register]: the nibbles of a 4-bit word whose codes a decode program puts in the register's
    low and high halves (found by decoding words that differ in one nibble)."""
    import numpy as np

    base = program.evaluate(np.zeros(1, np.uint32))[0]
    slot_of = {}
    for n in range(8):
        changed = np.flatnonzero(program.evaluate(np.array([1 << (4 * n)], np.uint32))[0] != base)
        slot_of.update({int(c): n for c in changed})
    return [(slot_of.get(2 * r), slot_of.get(2 * r + 1)) for r in range(program.registers)]


def weight_a_registers(instr):
    """[PERM[r] for r in 0..3]: the A-fragment register of ``instr`` (an m16n8k16 mma) that holds what the kernel
    layout's B-fragment register r of an n16 block holds (n8 half r // 2, B register r % 2), for every lane, with
    the block's 16 weight rows as A's m. Derived from ``mma_fragment``; raises if no such permutation exists."""
    from mmaemit.layouts.fragment import mma_fragment

    a, b = mma_fragment(instr, "A"), mma_fragment(instr, "B")
    if a.regs != 4 or b.regs != 2 or a.elems_per_reg != b.elems_per_reg:
        raise UnsupportedConfigError(f"weights as A need an m16n8k16 mma with 4 A / 2 B registers, not {instr}")

    def held(frag, reg, swap_n):
        out = []
        for lane in range(32):
            for e in range(frag.elems_per_reg):
                x, y = frag.forward(lane, reg % frag.regs if swap_n else reg, e)
                out.append((y + 8 * (reg // 2), x) if swap_n else (x, y))     # (weight row, k)
        return out

    perm = []
    for r in range(4):
        want = held(b, r, True)
        hits = [ra for ra in range(4) if held(a, ra, False) == want]
        if len(hits) != 1:
            raise AssertionError(f"B-fragment register {r} of an n16 block has no A-fragment twin in {instr}")
        perm.append(hits[0])
    return perm


def make_dequant_gemv(M, N, K, group_size=128, dtype="float16", config: GemvConfig = GemvConfig(), arch=None, *,
                      weight_format="int4", zeros_mode=None, m_max=None, gated=None):
    """Build ``gemv(A, W, S, C)`` (``gemv(A, W, S, Z, C)`` with zeros): A [M, K], W int32 [N/16, K/64, 32, b]
    (``to_kernel_layout(codes, b)``, b = the format's bits), S [N/16, K/group, 4, 4] (``to_kernel_scales``, A's
    dtype), C [M, N]. sm_80+ (``arch``: the decode program's target; None = sm_80 programs).

    ``weight_format``: one of ``WEIGHT_FORMATS`` (:mod:`mmaemit.dequant.formats`): uint1/2/4/8, int1, int2/4/8
    (two's complement), int2_ob/4_ob/8_ob (offset binary), nf4, float4_e2m1fn, float8_e4m3fn, float8_e5m2; all
    W = s * value(q). ``zeros_mode`` (uint1/2/4/8 only): "original" W = (q - z) s, "rescale" W = q s - z (z in A's
    dtype, same layout as S), "quantized" W = (q - z) s with integer zero codes z (int16, same layout). Without zeros
    the scale is applied to the fp32 partial sums after the mma; with zeros the decode applies scale and zero to the
    weights (``decode_program`` modes). ``M=None``: a symbolic M (:func:`symbolic_m`), one kernel for every
    1 <= M <= ``m_max`` (default 16, at most 32 = ``GEMV_M_LIMIT``; rows >= M are never read or written). Above 16
    rows each lane holds 4 activation rows per chunk: ``GemvConfig(n_blocks=1)`` keeps every format within 128
    registers (int4 with ``n_blocks=2``, ``min_blocks_per_sm=1``: 170; ``kernel.resource_usage()`` shows spills).
    ``gated`` ("silu" / "gelu_tanh", :mod:`mmaemit.kernels.gated`): W holds gate and up rows interleaved by n16
    blocks (``interleave_gated``), ``n_blocks`` is even, and C [M, N / 2] = act(gate sums) * (up sums) in float32,
    rounded once. Returns ``(gemv, em)``: ``em`` the mma emitter used (with ``weights_as_a`` its m16 tiles are the
    n16 blocks).
    """
    from tvm.script import tirx as T

    bits, z_kind = check_scheme(weight_format, zeros_mode)
    plan = _WordPlan(bits)
    WPC, V, P, STASHED = plan.wpc, plan.vec, plan.pieces, plan.stash > 0
    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}")
    if M is not None and (not isinstance(M, int) or not 1 <= M <= GEMV_M_LIMIT):
        raise TileShapeError(f"the small-M path takes 1 <= M <= {GEMV_M_LIMIT}, not M={M}")
    M, MMAX = symbolic_m(M, 16 if M is None and m_max is None else m_max, GEMV_M_LIMIT)
    NB, KS = config.n_blocks, config.k_slices
    BN = 16 * NB
    GATED = check_gate(gated)
    if GATED and NB % 2:
        raise UnsupportedConfigError(f"gated={gated!r} pairs a gate and an up n16 block per CTA: n_blocks must be "
                                     f"even, not {NB}")
    OW = BN // 2 if GATED else BN       # output columns per CTA
    NC = N // 2 if GATED else N         # ... and of C
    G = K if group_size in (None, -1) else group_size
    if N % BN:
        raise TileShapeError(f"N={N} must be a multiple of 16 * n_blocks = {BN}")
    ST = config.stages
    if K % (CHUNK * KS * 2):
        raise TileShapeError(f"K={K} must be a multiple of 64 * k_slices * 2 = {CHUNK * KS * 2}")
    if ST < 2:
        raise UnsupportedConfigError(f"stages must be >= 2, not {ST}")
    if G % CHUNK or K % G:
        raise TileShapeError(f"group_size={group_size} must divide K and be a multiple of {CHUNK}")
    CH = K // CHUNK // KS
    MT = -(-MMAX // 16)                  # m16 tiles per warp: each decoded B fragment feeds MT mma
    SWAP = config.weights_as_a
    if SWAP not in (True, False):
        raise UnsupportedConfigError(f"weights_as_a={config.weights_as_a!r}; valid: True, False")
    # weights as A: C^T = W A^T, the warp's n16 blocks are the m16 tiles, its token rows g + 8 r the n8 tiles
    rows, cols, n_tile = (BN, 8 * -(-MMAX // 8), 8) if SWAP else (16 * MT, BN, 16)
    em = TensorCoreIntrinEmitter(dtype, dtype, "float32", b_transposed=True, block_row_warps=1, block_col_warps=1,
                                 warp_row_tiles=rows, warp_col_tiles=cols, chunk=16, n_tile=n_tile, arch=arch)
    WPERM = weight_a_registers(em.instruction) if SWAP else [0, 1, 2, 3]
    THREADS = 32 * KS
    GC = G // CHUNK                      # chunks per scale group
    # activation rows a lane holds: g + 8 r (weights as B: row r of m16 tile r // 2, its half r % 2; weights as A:
    # the B fragment of n8 token tile r)
    ROWS = -(-MMAX // 8) if SWAP else (1 if MMAX <= 8 else 2 * MT)
    MINB = config.min_blocks_per_sm
    PDL = config.pdl
    if PDL not in (None, True, False):
        raise UnsupportedConfigError(f"pdl={config.pdl!r}; valid: None (on from sm_90), True, False")
    if PDL is None:
        PDL = arch is not None and as_arch(arch).satisfies(isa.FEATURES["griddepcontrol"].min_arch)
    elif PDL:
        isa.require_feature("griddepcontrol", arch or "sm_80")
    PF = ST - 1 if config.pdl_prefetch is None else config.pdl_prefetch
    if not isinstance(PF, int) or PF < 0:
        raise UnsupportedConfigError(f"pdl_prefetch={config.pdl_prefetch!r}; valid: None (stages - 1) or a number of "
                                     f"chunks >= 0")
    PF = min(PF, CH)
    ring = MMAX <= 8 if config.operand_ring is None else config.operand_ring
    if ring not in (True, False, "scales"):
        raise UnsupportedConfigError(f"operand_ring={config.operand_ring!r}; valid: None, True, False, 'scales'")
    ORA, ORS = ring is True, ring is not False        # activations / scales (zeros) through the ring
    OUT_ITERS = (MMAX * OW + THREADS - 1) // THREADS
    # chunks per main-loop iteration: at m_max <= 8 a multiple of the ring depth (and of the 2 activation buffers)
    # where the slice allows, so every ring stage and buffer index in the loop body is a constant (H100 8192^2 M=1:
    # int2 10.7-10.8 against 11.4-11.5 us, nf4 20.3-20.6 against 20.9-21.3, int4 the same); with 16 rows and more
    # the longer body costs registers (int4 m_max=16: 128 and 19.1 against 106 and 17.2 us)
    UNR = next(u for u in (math.lcm(2, ST), 2) if CH % u == 0 and (u == 2 or MMAX <= 8))

    # one word of 32/b codes -> 16/b f16x2 / bf16x2 B registers (mmaemit.dequant.decode), split over k16 steps by plan
    POST_SCALE = zeros_mode is None
    program = kernel_decode_program(weight_format, dtype, "none" if POST_SCALE else zeros_mode, arch, config.decode_variant)
    ZD = dtype if z_kind == "act" else z_kind
    LUT = config.lookup
    if LUT is not None and LUT not in LOOKUPS:
        raise UnsupportedConfigError(f"lookup={config.lookup!r}; valid: None, {choices(LOOKUPS)}")
    fill_fits = not (THREADS % PAIR_TABLE_ROWS and PAIR_TABLE_ROWS % THREADS)
    LUT = (weight_format in TABLE_FORMATS and fill_fits) if LUT is None else LUT == "shared"
    if LUT:
        if weight_format not in TABLE_FORMATS:
            raise UnsupportedConfigError(f"lookup='shared' is for table formats ({choices(TABLE_FORMATS)}), not "
                                         f"{weight_format!r}")
        if not fill_fits:
            raise UnsupportedConfigError(f"lookup='shared' fills its table with 32 * k_slices threads, which must "
                                         f"divide or be a multiple of {PAIR_TABLE_ROWS}: k_slices a power of two, "
                                         f"not {KS}")
        pairing = register_nibbles(program)
        if pairing != [(k, k + 4) for k in range(4)]:
            raise AssertionError(f"lookup='shared' reads register k's codes from nibbles k and k + 4; the "
                                 f"{weight_format} decode pairs {pairing}")
    TAB_COLS = PAIR_TABLE_COPIES

    def fill_table(Tab, trow, tid):
        # entry i = the decode of a word holding code i & 15 in nibble 0 and i >> 4 in nibble 4 (output register 0
        # pairs nibbles 0 and 4), stored TAB_COLS times; a thread writes its rows' words in the order of its row XOR
        # the copy, so the lanes of a warp (consecutive rows) write distinct banks. (Not (row + copy) % 32: TVM
        # 0.27's simplifier turns row * 32 + (copy + row) % 32 into ((row + copy) & 31) * 33, a miscompile.)
        rpt = max(1, PAIR_TABLE_ROWS // THREADS)
        cpt = TAB_COLS // max(1, THREADS // PAIR_TABLE_ROWS)
        for i in range(rpt):
            row = tid + i * THREADS if THREADS <= PAIR_TABLE_ROWS else tid % PAIR_TABLE_ROWS
            first = 0 if THREADS <= PAIR_TABLE_ROWS else tid // PAIR_TABLE_ROWS * cpt
            word = T.Cast("uint32", row % 16) | (T.Cast("uint32", row // 16) << T.uint32(16))
            program.emit(word, [trow[0], trow[1], trow[2], trow[3]])
            for q in range(cpt):
                store(Tab, trow[0], (row * TAB_COLS + T.bitwise_xor(row, first + q) % TAB_COLS,))

    def lookup_step(s, nb, wb, WF, pv, tab_lane):
        # word s of the chunk (4-bit: one per k16 step): output register k pairs codes k and k + 4, whose entry is
        # row n_k | n_(k+4) << 4; pv[0] holds the rows of registers 0 / 2 in bytes 0 / 1, pv[1] those of 1 / 3.
        # Address: the lane's column of row 0 (a shared-window address, once per thread) + row * 128 bytes, one IMAD
        # after the byte is isolated (a TIR load of Tab[row * 32 + lane] costs nvcc one more op per lookup)
        w = wb[nb, s]
        lo, hi = T.uint32(0x0F0F0F0F), T.uint32(0xF0F0F0F0)
        store(pv, (w & lo) | ((w >> T.uint32(12)) & hi), (0,))
        store(pv, ((w >> T.uint32(4)) & lo) | ((w >> T.uint32(16)) & hi), (1,))
        for k in range(4):
            # the row's byte alone (prmt: nvcc cannot fold it into "(v << 7) & mask", which costs a third op)
            emit(T.ptx["prmt.b32"](pv[2 + k], pv[k % 2], T.uint32(0), T.uint32(0x4440 + k // 2)))
            emit(T.ptx["ld.shared.b32"](WF[nb, WPERM[k]], tab_lane[0] + (pv[2 + k] << T.uint32(7))))

    def decode_step(s, nb, wb, WF, stash, sreg, zreg, g):
        # appends the ops of the words step s starts (n16 block nb) into the weight fragment WF (B, or A with
        # weights_as_a: the kernel layout's B register r is WF register WPERM[r]); returns nothing to the parser
        def pair(h):
            if POST_SCALE:
                return None, None
            return pair_of_column(sreg[nb, 0], sreg[nb, 1], g, h), pair_of_column(zreg[nb, 0], zreg[nb, 1], g, h)
        plan.decode_step(program, s, lambda w: wb[nb, w], lambda r: WF[nb, WPERM[r]], lambda i: stash[nb, i], pair)

    def from_stash(s, nb, WF, stash):
        # a step that starts no word (2 / 1-bit): its four registers from the words' stash
        for r in range(4):
            store(WF, stash[nb, plan.from_stash(s, r)], (nb, WPERM[r]))

    def stash_buffer():
        # the later steps' registers of 2 / 1-bit words; none for 8 / 4-bit (each step decodes its own words)
        return T.alloc_local((NB, plan.stash), "uint32") if plan.stash else None

    def scale_to_f32(word, e):
        return T.Cast("float32", T.reinterpret(dtype, T.Cast("uint16", (word >> T.Cast("uint32", 16 * e))
                                                             & T.uint32(0xFFFF))))

    @T.inline
    def body(A, W, S, Z, C, cta, warp, lane):
        pool = T.SMEMPool()
        Ring = pool.alloc((ST, NB, P, KS * 32, V), "uint32", align=128)   # [stage, block, piece, thread, word]
        if ORA:     # per thread and stage: its 16 activation halfs of each row it holds
            ARing = pool.alloc((ST, ROWS, KS * 32, 8), "uint32", align=128)
        if ORS:     # ... and its scale (zero) words per block
            SRing = pool.alloc((ST, NB, KS * 32, 2), "uint32", align=128)
            ZRing = pool.alloc((ST, NB, KS * 32, 2), "uint32", align=128) if not POST_SCALE else SRing
        if LUT:     # the pair table (overwritten by Part after the main loop)
            Tab = pool.alloc((PAIR_TABLE_ROWS * TAB_COLS,), "uint32", align=128)
        pool.move_base_to(0)
        Part = pool.alloc((KS, MMAX, BN), "float32", align=128)           # partial sums (after the ring is drained)
        pool.commit()
        A_frag, B_frag, C_frag = em.alloc_fragments()
        WF = T.meta_var(A_frag if SWAP else B_frag)     # the decoded weights' fragment
        P_frag = T.alloc_local((em.warp_rows, em.warp_cols, em.local_size_c), "float32")   # unscaled group sums
        em.fill_accumulators(C_frag)
        em.fill_accumulators(P_frag)
        wb = T.alloc_local((NB, WPC), "uint32")
        stash = T.meta_var(stash_buffer())
        ab = T.alloc_local((2, ROWS, 8), "uint32")
        sreg = T.alloc_local((NB, 2), "uint32")
        zreg = T.alloc_local((NB, 2), "uint32")
        pv = T.alloc_local((6,), "uint32")
        trow = T.alloc_local((4,), "uint32")
        tab_lane = T.alloc_local((1,), "uint32")
        for q in T.unroll(16 * ROWS):
            ab[q // (8 * ROWS), q // 8 % ROWS, q % 8] = T.uint32(0)
        if not SWAP:                               # rows >= 8 of an m16 tile at M <= 8 stay 0
            for q in T.unroll(4 * MT):
                A_frag[q // 4, q % 4] = T.uint32(0)
        tid = T.meta_var(warp * 32 + lane)
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        # the lane's row of a group's 4 x 4 scales (zeros): the accumulator columns 2c, 2c + 1 of both n8 halves
        # (scales on the fp32 partials with weights as B), else the weight rows g and 8 + g (decode-time scaling, or
        # the partials' rows with weights as A)
        sc = T.meta_var(c if POST_SCALE and not SWAP else g // 2)

        @T.inline
        def issue_weights(j):
            # chunk j of this warp's K slice -> ring stage j % ST (4 b bytes per lane and n16 block); with the
            # operand ring also the chunk's activation rows < M and, at a group start, the group's scales (zeros)
            kc = T.meta_var(warp * CH + j)
            if ORA:
                for r in T.unroll(ROWS):
                    if g + 8 * r < M:
                        for half in T.unroll(2):
                            T.ptx["cp.async.cg.shared.global"](ARing.ptr_to([j % ST, r, tid, 4 * half]),
                                                               A.ptr_to([g + 8 * r, kc * CHUNK + 16 * c + 8 * half]),
                                                               16)
            if ORS:
                if kc % GC == 0 or j == 0:
                    for nb in T.unroll(NB):
                        T.ptx["cp.async.ca.shared.global"](SRing.ptr_to([j % ST, nb, tid, 0]),
                                                           S.ptr_to([cta * NB + nb, kc // GC, sc, 0]), 8)
                        if not POST_SCALE:
                            T.ptx["cp.async.ca.shared.global"](ZRing.ptr_to([j % ST, nb, tid, 0]),
                                                               Z.ptr_to([cta * NB + nb, kc // GC, sc, 0]), 8)
            for nb in T.unroll(NB):
                for p in T.unroll(P):
                    if V == 4:
                        T.ptx["cp.async.cg.shared.global"](Ring.ptr_to([j % ST, nb, p, tid, 0]),
                                                           W.ptr_to([cta * NB + nb, warp * CH + j, lane, 4 * p]), 16)
                    else:
                        T.ptx["cp.async.ca.shared.global"](Ring.ptr_to([j % ST, nb, p, tid, 0]),
                                                           W.ptr_to([cta * NB + nb, warp * CH + j, lane, 0]), 4 * V)

        @T.inline
        def load_a(buf, j):
            # activation rows < M for chunk j, one chunk ahead in registers
            kc = T.meta_var(warp * CH + j)
            for r in T.unroll(ROWS):
                if g + 8 * r < M:
                    for half in T.unroll(2):
                        T.ptx["ld.global.nc.v4.b32"](ab[buf, r, 4 * half], ab[buf, r, 4 * half + 1],
                                                     ab[buf, r, 4 * half + 2], ab[buf, r, 4 * half + 3],
                                                     A.ptr_to([g + 8 * r, kc * CHUNK + 16 * c + 8 * half]))

        @T.inline
        def compute(buf, j):
            kc = T.meta_var(warp * CH + j)
            T.ptx["cp.async.wait_group"](ST - 2)   # chunk j has landed (this thread's own bytes: no barrier)
            for nb in T.unroll(NB):
                for p in T.unroll(P):
                    if V == 4:
                        T.ptx["ld.shared.v4.b32"](wb[nb, 4 * p], wb[nb, 4 * p + 1], wb[nb, 4 * p + 2],
                                                  wb[nb, 4 * p + 3], Ring.ptr_to([j % ST, nb, p, tid, 0]))
                    elif V == 2:
                        T.ptx["ld.shared.v2.b32"](wb[nb, 0], wb[nb, 1], Ring.ptr_to([j % ST, nb, 0, tid, 0]))
                    else:
                        T.ptx["ld.shared.b32"](wb[nb, 0], Ring.ptr_to([j % ST, nb, 0, tid, 0]))
            if j + ST - 1 < CH:
                issue_weights(j + ST - 1)
            T.ptx["cp.async.commit_group"]()       # unconditional: keeps the group count uniform
            # a K slice may start or end inside a scale group: its share of the group is scaled on its own
            if ORA:                                # this chunk's activations (rows < M; the rest stay 0)
                for r in T.unroll(ROWS):
                    if g + 8 * r < M:
                        for half in T.unroll(2):
                            T.ptx["ld.shared.v4.b32"](ab[buf, r, 4 * half], ab[buf, r, 4 * half + 1],
                                                      ab[buf, r, 4 * half + 2], ab[buf, r, 4 * half + 3],
                                                      ARing.ptr_to([j % ST, r, tid, 4 * half]))
            if kc % GC == 0 or j == 0:             # first chunk of a group (in this slice): its scales (zeros)
                for nb in T.unroll(NB):
                    if ORS:                        # from the ring
                        T.ptx["ld.shared.v2.b32"](sreg[nb, 0], sreg[nb, 1], SRing.ptr_to([j % ST, nb, tid, 0]))
                        if not POST_SCALE:
                            T.ptx["ld.shared.v2.b32"](zreg[nb, 0], zreg[nb, 1], ZRing.ptr_to([j % ST, nb, tid, 0]))
                    else:
                        T.ptx["ld.global.nc.v2.b32"](sreg[nb, 0], sreg[nb, 1],
                                                     S.ptr_to([cta * NB + nb, kc // GC, sc, 0]))
                        if not POST_SCALE:
                            T.ptx["ld.global.nc.v2.b32"](zreg[nb, 0], zreg[nb, 1],
                                                         Z.ptr_to([cta * NB + nb, kc // GC, sc, 0]))
            for s in T.unroll(4):
                for r in T.unroll(ROWS):
                    if SWAP:                       # row g + 8 r: the B fragment of token tile r
                        B_frag[r, 0] = ab[buf, r, 2 * s]
                        B_frag[r, 1] = ab[buf, r, 2 * s + 1]
                    else:                          # row g + 8 r: tile r // 2, fragment rows g / g + 8 (r % 2)
                        A_frag[r // 2, r % 2] = ab[buf, r, 2 * s]
                        A_frag[r // 2, 2 + r % 2] = ab[buf, r, 2 * s + 1]
                for nb in T.unroll(NB):
                    if LUT:
                        lookup_step(s, nb, wb, WF, pv, tab_lane)
                    elif STASHED:                  # 2 / 1-bit: a word spans 2 / 4 steps
                        if s % plan.steps_per_word == 0:
                            decode_step(s, nb, wb, WF, stash, sreg, zreg, g)
                        else:
                            from_stash(s, nb, WF, stash)
                    else:
                        decode_step(s, nb, wb, WF, stash, sreg, zreg, g)
                if POST_SCALE:
                    em.mma(A_frag, B_frag, P_frag)
                else:
                    em.mma(A_frag, B_frag, C_frag)
            if POST_SCALE and (kc % GC == GC - 1 or j == CH - 1):   # group end in this slice: acc += s * partial
                if SWAP:                           # accumulator rows g, g + 8: weight rows of n8 half h = row // 8
                    for nb in T.unroll(NB):
                        for r in T.unroll(ROWS):
                            for q in T.unroll(em.local_size_c):
                                h = T.meta_var(em.c_layout.forward(0, q, 0)[0] // 8)
                                C_frag[nb, r, q] = (C_frag[nb, r, q]
                                                    + scale_to_f32(sreg[nb, h], g % 2) * P_frag[nb, r, q])
                                P_frag[nb, r, q] = T.float32(0)
                else:
                    for mt in T.unroll(MT):
                        for nb in T.unroll(NB):
                            for q in T.unroll(em.local_size_c):
                                e = T.meta_var(em.c_layout.forward(lane, q % 4, 0)[1] % 2)
                                C_frag[mt, nb, q] = (C_frag[mt, nb, q]
                                                     + scale_to_f32(sreg[nb, q // 4], e) * P_frag[mt, nb, q])
                                P_frag[mt, nb, q] = T.float32(0)

        if PDL:
            T.ptx.griddepcontrol.launch_dependents()
            if PF > 0 and lane == 0:               # the weights are read-only: an L2 prefetch before the wait is safe
                for nb in T.unroll(NB):
                    T.ptx["cp.async.bulk.prefetch.L2.global"](W.ptr_to([cta * NB + nb, warp * CH, 0, 0]),
                                                              T.uint32(PF * 32 * WPC * 4))
        if LUT:                                    # constants only: before the wait
            fill_table(Tab, trow, tid)
            tab_lane[0] = T.cuda.cvta_generic_to_shared(T.address_of(Tab[lane]))
        if PDL:
            T.ptx.griddepcontrol.wait()
        for j in T.unroll(ST - 1):
            if j < CH:
                issue_weights(j)
            T.ptx["cp.async.commit_group"]()
        if not ORA:
            load_a(0, 0)
        if LUT:
            T.cuda.cta_sync()                      # the pair table is complete
        for jj in T.serial(CH // UNR):
            for u in T.unroll(UNR):                # ring stage u % ST and register buffer u % 2 are constants
                if not ORA and UNR * jj + u + 1 < CH:
                    load_a((u + 1) % 2, UNR * jj + u + 1)
                compute(u % 2, UNR * jj + u)
        T.ptx["cp.async.wait_group"](0)
        T.cuda.cta_sync()                          # the ring is drained everywhere before Part overwrites it
        if SWAP:                                   # accumulator (weight row, token)
            for nb in T.unroll(NB):
                for r in T.unroll(ROWS):
                    for q in T.unroll(em.local_size_c):
                        rc = T.meta_var(em.c_layout.forward(lane, q, 0))
                        if 8 * r + rc[1] < M:
                            Part[warp, 8 * r + rc[1], nb * 16 + rc[0]] = C_frag[nb, r, q]
        else:
            for mt in T.unroll(MT):
                for j in T.unroll(em.warp_cols):
                    for r in T.unroll(em.local_size_c):
                        rc = T.meta_var(em.c_layout.forward(lane, r % 4, 0))
                        if 16 * mt + rc[0] < M:
                            Part[warp, 16 * mt + rc[0], j * 16 + r // 4 * 8 + rc[1]] = C_frag[mt, j, r]
        T.cuda.cta_sync()
        for t in T.unroll(OUT_ITERS):
            o = T.meta_var(tid + t * THREADS)
            if o < M * OW:
                acc = T.alloc_local((2,), "float32")
                acc[0] = T.float32(0)
                acc[1] = T.float32(0)
                if GATED is not None:              # output r: gate column 32 (r // 16) + r % 16, up 16 further
                    for w in T.unroll(KS):
                        acc[0] = acc[0] + Part[w, o // OW, o % OW // 16 * 32 + o % 16]
                        acc[1] = acc[1] + Part[w, o // OW, o % OW // 16 * 32 + 16 + o % 16]
                    C[o // OW, cta * OW + o % OW] = T.Cast(dtype, gate_tir(GATED, acc[0], acc[1]))
                else:
                    for w in T.unroll(KS):
                        acc[0] = acc[0] + Part[w, o // BN, o % BN]
                    C[o // BN, cta * BN + o % BN] = T.Cast(dtype, acc[0])

    if z_kind is None:
        @T.prim_func
        def gemv(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, K // CHUNK, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), C: T.Buffer((M, NC), dtype)):
            T.device_entry()
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": MINB})
            cta = T.cta_id([N // BN])
            warp = T.warp_id([KS])
            lane = T.lane_id([32])
            body(A, W, S, None, C, cta, warp, lane)
    else:
        @T.prim_func
        def gemv(A: T.Buffer((M, K), dtype), W: T.Buffer((N // 16, K // CHUNK, 32, WPC), "int32"),
                 S: T.Buffer((N // 16, K // G, 4, 4), dtype), Z: T.Buffer((N // 16, K // G, 4, 4), ZD),
                 C: T.Buffer((M, NC), dtype)):
            T.device_entry()
            T.attr({"tirx.launch_bounds_min_blocks_per_sm": MINB})
            cta = T.cta_id([N // BN])
            warp = T.warp_id([KS])
            lane = T.lane_id([32])
            body(A, W, S, Z, C, cta, warp, lane)

    return (programmatic_dependent_launch(gemv) if PDL else gemv), em


@dataclass(frozen=True)
class TiledConfig:
    """Tile configuration of the tiled path (M > 16)."""

    block_m: int = 128
    block_n: int = 128
    warp_m: int = 64
    warp_n: int = 64
    stages: int = 4
    panel: int = 8


def make_dequant_gemm_tiled(M, N, K, group_size=128, dtype="float16", config: TiledConfig = TiledConfig(),
                            arch=None, *, weight_format="int4", zeros_mode=None, m_max=None):
    """The tiled path: same arguments and layouts as :func:`make_dequant_gemv`, any M >= 1 (rows >= M masked).
    ``M=None``: a symbolic M (any M >= 1, ``m_max`` unused but checked if given); the grid is ceil(M / block_m) x
    N / block_n CTAs, the tile rows of one weight column adjacent (they share its weight tiles in L2).

    Per CTA (``block_m x block_n``) and 64-wide K chunk, one ``stages``-deep cp.async ring carries the A tile
    (swizzled, rows >= M zero-filled), the packed weight blocks (``block_n / 16 * 32 * b`` words, flat 16-byte
    ``cp.async.cg`` pieces) and their scales. A warp reads its A-fragment registers with 16-byte shared loads (the
    kernel layout's K permutation makes them contiguous), its b weight words per n16 block with conflict-free
    ``ld.shared.v4`` (two for 8-bit) / ``.v2`` / ``.b32``, decodes them with the group scale
    (``decode_program(..., mode="scale")``) straight into B fragments by the decode-slice rule and issues
    ``mma.sync m16n8k16``. Zeros (``zeros_mode``, uint1/2/4/8) travel with the scales.
    """
    from tvm.script import tirx as T

    bits, z_kind = check_scheme(weight_format, zeros_mode)
    plan = _WordPlan(bits)
    WPC, V, P, STASHED = plan.wpc, plan.vec, plan.pieces, plan.stash > 0
    from mmaemit import make_mma_swizzle_layout
    from mmaemit.layouts.raster import panel_swizzle

    dtype = canonical(dtype)
    if dtype not in ("float16", "bfloat16"):
        raise UnsupportedConfigError(f"activation dtype must be one of {choices(['float16', 'bfloat16'])}")
    cfg = config
    BM, BN, ST = cfg.block_m, cfg.block_n, cfg.stages
    G = K if group_size in (None, -1) else group_size
    if N % BN or BN % 16:
        raise TileShapeError(f"N={N} must be a multiple of block_n={BN} (itself a multiple of 16)")
    if K % CHUNK or G % CHUNK or K % G:
        raise TileShapeError(f"K={K} and group_size={group_size} must be multiples of {CHUNK}, the group dividing K")
    if M is not None and (not isinstance(M, int) or M < 1):
        raise TileShapeError(f"M must be >= 1, not {M}")
    DYN = M is None
    M, _ = symbolic_m(M, m_max if m_max is not None else (1 << 31) - 1)
    em = TensorCoreIntrinEmitter(dtype, dtype, "float32", b_transposed=True, block_row_warps=BM // cfg.warp_m,
                                 block_col_warps=BN // cfg.warp_n, warp_row_tiles=cfg.warp_m,
                                 warp_col_tiles=cfg.warp_n, chunk=16, n_tile=16, arch=arch)
    THREADS, NW = em.threads, em.num_warps
    GM, GN = (M + BM - 1) // BM, N // BN
    KT = K // CHUNK
    NBC = BN // 16                         # n16 blocks per CTA
    WR, WC = em.warp_rows, em.warp_cols    # m16 tiles / n16 blocks per warp
    A_PIECES = BM * 8                      # 16-byte pieces of one A chunk (64 halfs per row)
    PPB = 8 * WPC                          # 16-byte pieces of one n16 block's words of a chunk
    W_PIECES = NBC * PPB                   # 16-byte pieces of the packed weights of one chunk
    S_PIECES = NBC * 2                     # 16-byte pieces of the chunk's scales ([nb, 4, 4] halfs)
    for name, pieces in (("A", A_PIECES), ("W", W_PIECES)):
        if pieces % THREADS and THREADS % pieces:
            raise TileShapeError(f"{name} tile of {pieces} 16-byte pieces neither splits over nor divides "
                                 f"{THREADS} threads")
    A_IT, W_IT = -(-A_PIECES // THREADS), -(-W_PIECES // THREADS)   # copy iterations (the last may be partial)
    swz = make_mma_swizzle_layout((ST, BM, CHUNK), dtype)
    program = kernel_decode_program(weight_format, dtype, "scale" if zeros_mode is None else zeros_mode, arch)
    HAS_Z = z_kind is not None
    ZD = dtype if z_kind in (None, "act") else z_kind
    # nf4 "scale": the rows' scaled tables once per scale group (8 registers per row, 16 per n16 block, live across
    # the group). Up to 2 blocks per warp only: with 4 (64-wide warp tiles) the 64 table registers spill (ptxas,
    # sm_80: 280 bytes against 112 for the per-word form, whose identical builds ptxas merges to one per chunk)
    HOIST = program.hoist_operands and WC <= 2
    GC = G // CHUNK

    def decode_step(s, j, wb, B_frag, stash, sp, zp, opr):
        # appends the ops of the words step s starts (warp n16 block j); returns nothing to the parser
        plan.decode_step(program, s, lambda w: wb[j, w], lambda r: B_frag[j, r], lambda i: stash[j, i],
                         lambda h: (sp[j, h], zp[j, h] if HAS_Z else None), opr[j] if HOIST else None)

    def operand_registers():
        return program.alloc_operands(WC) if HOIST else None

    def build_operands(j, kt, sp, zp, opr):
        # HOIST only: block j's operand stage at the first chunk of each scale group (the group's pairs in sp / zp)
        if HOIST:
            halves = plan.operand_halves()
            with only_if(kt % GC == 0 if GC > 1 else None):
                program.emit_operands([sp[j, h] for h in halves], [zp[j, h] for h in halves] if HAS_Z else None,
                                      into=opr[j])

    def stash_buffer():
        # the later steps' registers of 2 / 1-bit words; none for 8 / 4-bit (each step decodes its own words)
        return T.alloc_local((WC, plan.stash), "uint32") if STASHED else None

    def w_piece(q):
        """16-byte piece q of a chunk's W tile -> (n16 block, shared piece p, lane, first word): a lane's words are
        16-byte pieces p (b >= 4; stored [p, lane] so a warp's loads are contiguous) or 4 / b lanes per piece."""
        nb, ql = q // PPB, q % PPB
        if P > 1:
            return nb, ql % P, ql // P, 4 * (ql % P)
        if WPC < 4:
            return nb, 0, ql * (4 // WPC), 0
        return nb, 0, ql, 0

    @T.inline
    def body(A, W, S, Z, C, pid, warp, lane):
        # a symbolic M makes the tile-row count a run-time divisor: compute the tile once into registers (as
        # expressions it would be re-derived, with integer divisions, at every use inside the K loop)
        tile = T.alloc_local((2,), "int32")
        if DYN:
            tile[0] = pid % GM
            tile[1] = pid // GM
        bm = T.meta_var(tile[0] if DYN else panel_swizzle(pid, GM, GN, cfg.panel)[0])
        bn = T.meta_var(tile[1] if DYN else panel_swizzle(pid, GM, GN, cfg.panel)[1])
        tid = T.meta_var(warp * 32 + lane)
        pool = T.SMEMPool()
        As = pool.alloc((ST, BM, CHUNK), dtype, align=1024)
        Ws = pool.alloc((ST, NBC, P, 32, V), "uint32", align=128)   # [stage, block, piece, lane, word]
        Ss = pool.alloc((ST, NBC, 16), dtype, align=128)
        Zs = pool.alloc((ST, NBC, 16), ZD, align=128)
        pool.commit()
        A_frag, B_frag, C_frag = em.alloc_fragments()
        em.fill_accumulators(C_frag)
        ab = T.alloc_local((WR, 2, 4), "uint32")      # A words: m16 tile, row g / g + 8, 4 words (2 k16 steps)
        wb = T.alloc_local((WC, WPC), "uint32")
        stash = T.meta_var(stash_buffer())
        sp = T.alloc_local((WC, 2), "uint32")         # {s, s} for the B-fragment columns g and 8 + g
        zp = T.alloc_local((WC, 2), "uint32")         # {z, z} likewise
        sv = T.alloc_local((2,), "uint32")
        opr = T.meta_var(operand_registers())
        g = T.meta_var(lane // 4)
        c = T.meta_var(lane % 4)
        wm = T.meta_var(em.warp_coords(warp)[0])
        wn = T.meta_var(em.warp_coords(warp)[1])

        @T.inline
        def issue(kt):
            st = T.meta_var(kt % ST)
            for t in T.unroll(A_IT):
                q = T.meta_var(tid + t * THREADS)
                r = T.meta_var(q // 8)
                row = T.meta_var(bm * BM + r)
                if q < A_PIECES:
                    # rows >= M: zero-filled (source size 0) from a valid address
                    T.ptx["cp.async.cg.shared.global"](As.ptr_to(swz(st, r, q % 8 * 8)),
                                                       A.ptr_to([T.min(row, M - 1), kt * CHUNK + q % 8 * 8]), 16,
                                                       T.Select(row < M, T.uint32(16), T.uint32(0)))
            for t in T.unroll(W_IT):
                q = T.meta_var(tid + t * THREADS)
                pc = T.meta_var(w_piece(q))
                if q < W_PIECES:
                    T.ptx["cp.async.cg.shared.global"](Ws.ptr_to([st, pc[0], pc[1], pc[2], 0]),
                                                       W.ptr_to([bn * NBC + pc[0], kt, pc[2], pc[3]]), 16)
            if tid < S_PIECES:
                T.ptx["cp.async.cg.shared.global"](Ss.ptr_to([st, tid // 2, tid % 2 * 8]),
                                                   S.ptr_to([bn * NBC + tid // 2, kt * CHUNK // G,
                                                             tid % 2 * 2, 0]), 16)
                if HAS_Z:
                    T.ptx["cp.async.cg.shared.global"](Zs.ptr_to([st, tid // 2, tid % 2 * 8]),
                                                       Z.ptr_to([bn * NBC + tid // 2, kt * CHUNK // G,
                                                                 tid % 2 * 2, 0]), 16)

        for s0 in T.unroll(ST - 1):
            if s0 < KT:
                issue(s0)
            T.ptx["cp.async.commit_group"]()
        for kt in T.serial(KT):
            T.ptx["cp.async.wait_group"](ST - 2)
            T.cuda.cta_sync()
            if kt + ST - 1 < KT:
                issue(kt + ST - 1)
            T.ptx["cp.async.commit_group"]()
            st = T.meta_var(kt % ST)
            for j in T.unroll(WC):
                nb = T.meta_var(wn * WC + j)
                for p in T.unroll(P):
                    if V == 4:
                        T.ptx["ld.shared.v4.b32"](wb[j, 4 * p], wb[j, 4 * p + 1], wb[j, 4 * p + 2], wb[j, 4 * p + 3],
                                                  Ws.ptr_to([st, nb, p, lane, 0]))
                    elif V == 2:
                        T.ptx["ld.shared.v2.b32"](wb[j, 0], wb[j, 1], Ws.ptr_to([st, nb, 0, lane, 0]))
                    else:
                        T.ptx["ld.shared.b32"](wb[j, 0], Ws.ptr_to([st, nb, 0, lane, 0]))
                # scales of this lane's B columns n = g and 8 + g: [h=0/1, c' = g // 2, e = g % 2] of [2, 4, 2]
                T.ptx["ld.shared.v2.b32"](sv[0], sv[1], Ss.ptr_to([st, nb, g // 2 * 4]))
                sp[j, 0] = pair_of_column(sv[0], sv[1], g, 0)
                sp[j, 1] = pair_of_column(sv[0], sv[1], g, 1)
                if HAS_Z:
                    T.ptx["ld.shared.v2.b32"](sv[0], sv[1], Zs.ptr_to([st, nb, g // 2 * 4]))
                    zp[j, 0] = pair_of_column(sv[0], sv[1], g, 0)
                    zp[j, 1] = pair_of_column(sv[0], sv[1], g, 1)
                build_operands(j, kt, sp, zp, opr)
            for half in T.unroll(2):
                for i in T.unroll(WR):
                    for r in T.unroll(2):
                        T.ptx["ld.shared.v4.b32"](ab[i, r, 0], ab[i, r, 1], ab[i, r, 2], ab[i, r, 3],
                                                  As.ptr_to(swz(st, wm * cfg.warp_m + 16 * i + 8 * r + g,
                                                                16 * c + 8 * half)))
                for s2 in T.unroll(2):
                    s = T.meta_var(2 * half + s2)
                    for j in T.unroll(WC):
                        if STASHED:                # 2 / 1-bit: a word spans 2 / 4 steps
                            if s % plan.steps_per_word == 0:
                                decode_step(s, j, wb, B_frag, stash, sp, zp, opr)
                            else:
                                for q in T.unroll(4):
                                    B_frag[j, q] = stash[j, plan.from_stash(s, q)]
                        else:
                            decode_step(s, j, wb, B_frag, stash, sp, zp, opr)
                    for i in T.unroll(WR):
                        A_frag[i, 0] = ab[i, 0, 2 * s2]
                        A_frag[i, 1] = ab[i, 1, 2 * s2]
                        A_frag[i, 2] = ab[i, 0, 2 * s2 + 1]
                        A_frag[i, 3] = ab[i, 1, 2 * s2 + 1]
                    em.mma(A_frag, B_frag, C_frag)
        T.ptx["cp.async.wait_group"](0)
        em.stmatrix(C_frag, C, warp=warp, lane=lane, block_row=bm, block_col=bn, row_limit=M, use_stmatrix=False)

    gemm = grid_kernel(body, M, N, K, G, WPC, dtype, ZD if HAS_Z else None, GM * GN, NW)
    return gemm, em


def make_dequant_gemm(M, N, K, group_size=128, dtype="float16", config=None, arch=None, *, weight_format="int4",
                      zeros_mode=None):
    """Dequant GEMM (W8A16 / W4A16 / W2A16 / W1A16) for any M with one weight layout: the GEMV path for M <= 16,
    the wgmma path (:mod:`mmaemit.kernels.dequant_gemm_wgmma`) for M > 128 on sm_90a, the mma.sync tiled path otherwise.
    A ``config`` of one path's type (GemvConfig, TiledConfig, WgmmaConfig) selects that path. ``arch`` None: the
    visible GPU's arch (sm_80 rules without one). Returns ``(func, emitter_or_config)``."""
    from mmaemit.arch import as_arch, device_arch
    from mmaemit.errors import ArchError

    from .dequant_gemm_wgmma import WgmmaConfig, default_wgmma_config, make_dequant_gemm_wgmma

    kw = dict(weight_format=weight_format, zeros_mode=zeros_mode)
    if arch is None:
        try:
            arch = device_arch().name
        except ArchError:
            arch = None
    hopper = arch is not None and as_arch(arch).satisfies("sm_90a")
    if isinstance(config, WgmmaConfig) or (config is None and M > 128 and hopper):
        return make_dequant_gemm_wgmma(M, N, K, group_size, dtype, config or default_wgmma_config(M), arch or "sm_90a",
                                       **kw)
    if isinstance(config, GemvConfig) or (config is None and M <= 16):
        return make_dequant_gemv(M, N, K, group_size, dtype, config or GemvConfig(), arch, **kw)
    return make_dequant_gemm_tiled(M, N, K, group_size, dtype, config or default_tiled_config(M, N), arch, **kw)


def default_tiled_config(M: int, N: int) -> TiledConfig:
    """The mma.sync tiled path's measured best by M (H100, 8192 x 8192, BENCHMARKS.md): 64 x 64 CTA tiles up to
    M = 64 (more CTAs on the weight stream), 128 x 128 above."""
    if M <= 64 and N % 64 == 0:
        return TiledConfig(64, 64, 32, 32, 4)
    return TiledConfig()
