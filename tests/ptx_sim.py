"""Bit-exact numpy simulators of the PTX instructions the transposed loads use, transcribed from the PTX ISA text
(independently of mmaemit):

* ldmatrix (9.7.14.5.15): lanes 8i..8i+7 give the 16-byte rows of 8x8 b16 matrix i; "each thread receives a fragment
  of a row, thread 0 the first, a group of four threads an entire row" (lower-indexed element in the low half);
  ``.trans``: "the matrix is loaded in column-major format", i.e. the same distribution of the transposed matrix.
* prmt.b32 (9.7.10.7), no mode: ``tmp64 = (b << 32) | a``; byte i of d is byte ``c[4i+2:4i]`` of tmp64, or, when
  selector bit ``4i+3`` is set, that byte's msb replicated over 8 bits.
* lop3.b32 (9.7.9.6): bit j of d = bit ``4 a_j + 2 b_j + c_j`` of immLut (``immLut = F(0xF0, 0xCC, 0xAA)``).
* shl.b32 / shr.b32 (9.7.9.8/9): logical shifts, zero fill.
* movmatrix.sync.aligned.m8n8.trans.b16 (9.7.14.5.17): source in the ldmatrix (row) fragment layout; lane
  ``l`` of the result holds the transposed matrix's row ``l/4``, columns ``2(l%4)``, ``2(l%4)+1`` (the PTX text:
  "each thread holds a fragment of a column of the result matrix", a column of the source being a row of the result).
"""
import numpy as np


def sim_ldmatrix(smem, addrs, num, trans):
    regs = np.zeros((32, num), dtype=np.uint32)
    for i in range(num):
        mat = np.stack([smem[a:a + 16].view("<u2") for a in addrs[8 * i:8 * i + 8]])
        if trans:
            mat = mat.T
        flat = mat.reshape(-1).astype(np.uint32)
        regs[:, i] = flat[0::2] | (flat[1::2] << 16)
    return regs


def sim_prmt(a, b, sel):
    tmp = (b.astype(np.uint64) << np.uint64(32)) | a.astype(np.uint64)
    out = np.zeros_like(a, dtype=np.uint32)
    for i in range(4):
        ctl = (sel >> (4 * i)) & 0xF
        byte = ((tmp >> np.uint64(8 * (ctl & 7))) & np.uint64(0xFF)).astype(np.uint32)
        if ctl & 8:
            byte = np.where(byte & 0x80, np.uint32(0xFF), np.uint32(0))
        out |= byte << np.uint32(8 * i)
    return out


def sim_lop3(a, b, c, lut):
    out = np.zeros_like(a, dtype=np.uint32)
    for j in range(32):
        idx = (((a >> j) & 1) << 2) | (((b >> j) & 1) << 1) | ((c >> j) & 1)
        out |= ((np.uint32(lut) >> idx) & 1).astype(np.uint32) << np.uint32(j)
    return out


def sim_movmatrix_trans(a):
    halves = np.stack([a & 0xFFFF, a >> 16], axis=1).reshape(8, 8)   # row l/4, cols 2(l%4), 2(l%4)+1
    flat = halves.T.reshape(-1).astype(np.uint32)
    return flat[0::2] | (flat[1::2] << 16)


def run_plan(plan, smem, byte_address):
    """Execute a ``TransposedLoadPlan`` on ``smem`` (uint8 array); ``byte_address(k, mn)`` locates the group's rows.
    Returns {virtual register: uint32[32 lanes]}."""
    regs = {}
    for ld in plan.loads:
        addrs = []
        for lane in range(32):
            k, mn = plan.lane_address(ld.index, lane)
            addrs.append(byte_address(k, mn))
        out = sim_ldmatrix(smem, addrs, ld.num, trans=True)
        for q, name in enumerate(ld.dst):
            regs[name] = out[:, q]
    for op in plan.ops:
        s = [regs[n] for n in op.srcs]
        if op.op == "prmt":
            regs[op.dst] = sim_prmt(s[0], s[1], op.imm[0])
        elif op.op == "shl":
            regs[op.dst] = (s[0] << np.uint32(op.imm[0])).astype(np.uint32)
        elif op.op == "shr":
            regs[op.dst] = s[0] >> np.uint32(op.imm[0])
        elif op.op == "lop3":
            regs[op.dst] = sim_lop3(s[0], s[1], np.full(32, op.imm[0], dtype=np.uint32), op.imm[1])
        else:
            raise AssertionError(f"unknown op {op.op}")
    return regs


