"""``DequantBEmitter``: packed low-bit weight words -> mma.sync m16n8k16 B fragments (f16 / bf16), in registers.

The weight is stored as :func:`mmaemit.dequant.pack_for_mma` lays it out: ``words[nb, kb, lane]`` (one uint32 per
lane per BN x BK block, see :mod:`mmaemit.dequant.fragment_order`). One word decodes (with the ops of a
:class:`mmaemit.dequant.decode.DecodeProgram`) into R = 16 / bits f16x2 / bf16x2 registers: the b0, b1 of TN n8
tiles x TK k16 steps, register i being b_r of tile t = i // 2 (r = i % 2), tile t = (tn = t % TN, tk = t // TN)::

    bits   registers   tiles (tn, tk) in order                       B fragments filled per word
     8      2          (0,0)                                         one n8 tile (n_tile 8, or half n8 of 16)
     4      4          (0,0) (1,0)                                   one n_tile-16 micro tile, one k step
     2      8          (0,0) (1,0) (0,1) (1,1)                       n_tile 16, two k steps
     1     16          (0,0) (1,0) (0,1) (1,1) ... (1,3)             n_tile 16, four k steps

so with ``TensorCoreIntrinEmitter(..., n_tile=16)`` the registers of k step tk land in ``B_frag[j, 2*tn + r]`` of that
step's fragment buffer, exactly where ``mma_atom`` reads them.

Scales and zeros: register i of lane l holds rows ``n = nb*BN + n_off`` and columns ``k_off, k_off + 1`` of the
block, ``(n_off, k_off) = operand_coords(lane)[i]``; with an even group size both share the group
``gi(kb*BK + k_off)``, so the register's operand is the pair {S, S} (and {Z, Z}): load S[n, g] (a uint16 of
f16 / bf16 bits) and broadcast it with :func:`mmaemit.dequant.decode.emit_broadcast_half` (one PRMT), once per group.
For a group size that is a multiple of BK a word has TN distinct pairs (rows ``l // 4`` and ``8 + l // 4``).
nf4 with a scale (fast) builds one table per row from the pair of registers (0, 1) / (2, 3), whose rows are
``l // 4`` / ``8 + l // 4``: build them once per group with ``program.emit_operands`` and pass ``operands=``.
"""
from __future__ import annotations

from .. import isa
from ..arch import as_arch
from ..dequant.decode import DecodeProgram, decode_program, mode_of
from ..dequant.fragment_order import tiling
from ..errors import ArgumentError, UnsupportedConfigError
from ..layouts.fragment import mma_fragment

__all__ = ["DequantBEmitter"]


class DequantBEmitter:
    """Emit the decode of packed weight words straight into mma B-fragment registers.

    Args:
        scheme: a ``QuantScheme`` (format + mode) or a format name (then ``mode`` gives the mode).
        out_dtype: "float16" or "bfloat16" (the mma operand dtype).
        mode: "none" | "scale" | "original" | "rescale" | "quantized" when ``scheme`` is a format name.
        arch: target arch (sm_80+): selects sub.bf16x2 (sm_90+) vs fma, gates cvt e4m3x2 (sm_89+).
        fast: magic-number / LUT / cvt decode (True) or the reference converter (False).
        variant: "shift" or "marlin" (4-bit -> f16 fast path).
    """

    def __init__(self, scheme, out_dtype="float16", mode=None, *, arch="sm_80", fast=True, variant="shift"):
        from ..dequant.scaling import QuantScheme

        if isinstance(scheme, QuantScheme):
            if mode is not None:
                raise ArgumentError("pass either a QuantScheme or a format name with mode=, not both")
            fmt, mode = scheme.format, mode_of(scheme)
        else:
            fmt, mode = scheme, "none" if mode is None else mode
        self.arch = as_arch(arch)
        self.program: DecodeProgram = decode_program(fmt, out_dtype, mode, self.arch, fast=fast, variant=variant)
        self.instruction: isa.MmaInstr = isa.select_mma(self.program.out_dtype, self.program.out_dtype, "float32",
                                                        k=16, arch=self.arch)
        self.tiling = tiling(self.program.bits)

    bits = property(lambda self: self.program.bits)
    registers = property(lambda self: self.program.registers, doc="f16x2 / bf16x2 registers per word")
    k_steps = property(lambda self: self.tiling["TK"], doc="k16 steps one word covers")
    n_tiles = property(lambda self: self.tiling["TN"], doc="n8 tiles one word covers")
    block_n = property(lambda self: self.tiling["BN"], doc="n extent of one word block")
    block_k = property(lambda self: self.tiling["BK"], doc="k extent of one word block")

    def __repr__(self):
        return (f"DequantBEmitter({self.program.format} -> {self.program.out_dtype}, mode {self.program.mode}, "
                f"{'fast' if self.program.fast else 'reference'}, {self.arch.name}, {self.block_n}x{self.block_k} "
                f"per word)")

    def fragment_slots(self) -> tuple:
        """(tk, tn, r) of each output register: k16 step, n8 tile, b0 / b1."""
        tn_count = self.n_tiles
        return tuple((i // 2 // tn_count, i // 2 % tn_count, i % 2) for i in range(self.registers))

    def operand_coords(self, lane) -> tuple:
        """(n_off, k_off) inside the BN x BK block of the low element of each register (``lane``: int or PrimExpr
        for ``n_off``; ``k_off`` then is an expression too). The register's scale / zero is that of row n_off and
        the group of column k_off."""
        frag = mma_fragment(self.instruction, "B")
        out = []
        for tk, tn, r in self.fragment_slots():
            k_in, n_in = frag.forward(lane, r, 0)
            out.append((8 * tn + n_in, 16 * tk + k_in))
        return tuple(out)

    def b_targets(self, B_frag, j=0, n8=0) -> list:
        """The uint32 lvalues register i is written to: ``B_frag[tk][j, 2*(tn + n8) + r]``.

        ``B_frag``: a sequence of ``k_steps`` fragment buffers shaped like ``TensorCoreIntrinEmitter``'s
        ``[warp_cols, local_size_b]`` (one per k step), or one buffer with a leading k-step axis
        ``[k_steps, warp_cols, local_size_b]``. ``n8``: the n8 half to fill for 8-bit words (one n8 tile each).
        """
        if n8 and self.n_tiles != 1:
            raise UnsupportedConfigError(f"a {self.bits}-bit word fills both n8 halves; n8 is for 8-bit words only")
        seq = isinstance(B_frag, (list, tuple))
        if seq and len(B_frag) != self.k_steps:
            raise ArgumentError(f"a {self.bits}-bit word covers {self.k_steps} k steps; pass that many B fragment "
                                f"buffers (got {len(B_frag)})")
        stacked = not seq and len(B_frag.shape) == 3
        if not seq and not stacked and self.k_steps != 1:
            raise ArgumentError(f"a {self.bits}-bit word covers {self.k_steps} k steps; pass a list of buffers or "
                                f"one [k_steps, warp_cols, local_size_b] buffer")
        out = []
        for tk, tn, r in self.fragment_slots():
            slot = 2 * (tn + n8) + r
            out.append(B_frag[tk][j, slot] if seq else B_frag[tk, j, slot] if stacked else B_frag[j, slot])
        return out

    def decode(self, word, B_frag, j=0, *, n8=0, scale_pair=None, zero_pair=None, operands=None) -> tuple:
        """Emit the decode of ``word`` (a uint32 / int32 register) into B micro tile ``j`` (see :meth:`b_targets`).

        ``scale_pair`` / ``zero_pair``: one uint32 pair expression, or one per register (see the module doc).
        ``operands``: instead, the registers ``self.program.emit_operands(...)`` filled once for the group (what
        a table-building program, ``program.hoist_operands``, wants). Returns the ops emitted.
        """
        return self.program.emit(word, self.b_targets(B_frag, j, n8), scale_pair, zero_pair, operands=operands)
