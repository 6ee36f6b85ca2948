"""Execution of Hopper ``wgmma`` in the interpreter: the asynchronous model, its operands and its diagnostics.

Model (PTX ISA 9.7.15, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"). A warpgroup is 4 consecutive
warps (warp ``w`` belongs to warpgroup ``w // 4``); every ``wgmma.*`` instruction is executed by whole warpgroups.

* ``wgmma.mma_async`` (issue): reads its A registers (RS form) or A matrix (SS form), its B matrix from shared memory
  through the matrix descriptors, and records a pending operation. Its accumulator registers are neither read nor
  written yet.
* ``wgmma.commit_group`` closes a group over the warpgroup's uncommitted operations; ``wgmma.wait_group N``
  retires every operation of the warpgroup's groups except the N most recent ones, in issue order: each reads its
  accumulators (when ``scale-d`` is true), multiplies, and writes them. Uncommitted operations are never retired.

Diagnostics (errors unless stated otherwise):

* ``wgmma_before_wait``: an ordinary instruction reads or writes an accumulator or A register of a wgmma that has
  not been retired by a ``wgmma.wait_group``; shared memory a pending wgmma reads is written; the CTA ends with
  operations never retired.
* ``wgmma_missing_fence``: a wgmma uses a register (accumulator or A fragment) that an ordinary instruction of the
  thread accessed since the warpgroup's last ``wgmma.fence``, or a warpgroup issues its first wgmma without a fence.
* ``missing_proxy_fence``: a wgmma (async proxy) reads shared memory written through the generic proxy (st.shared,
  stmatrix, cp.async) with no ``fence.proxy.async`` by the writing warp in between.
* ``wgmma_operand``: a descriptor or ``scale-d`` that differs between the threads of a warpgroup.

Supported: every dense wgmma type in the RS and SS forms (``.f32`` / ``.f16`` accumulators of f16 / bf16, tf32 and
e4m3 / e5m2 operands, ``.s32{.satfinite}`` of s8 / u8), operands from shared memory in the K-major canonical layouts
and, for f16 / bf16 (``imm-trans-a/b`` = 1), the MN-major ones (no swizzle, 32-, 64-, 128-byte swizzle) with base
offset 0. b1 is refused with ``UnsupportedConfigError``.
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..errors import UnsupportedConfigError
from ..ptx import wgmma as W
from .access import (WARPGROUP, as_thread_vector, cvta_to_shared, full_warpgroups, shared_check,
                     warpgroup_threads)
from .ptxcall import decode_call, family_registry, register_writer

#: family name -> compile function (filled by ``@_family`` below)
FAMILIES, _family = family_registry()

#: kernels whose register buffers are wgmma operands get these hooks; see ``operand_buffers``
_MMA_FAMILIES = tuple(f"wgmma_{t}_{form}" for t in ("f16", "f16_f16acc", "bf16", "tf32", "fp8", "fp8_f16acc", "int")
                      for form in ("rs", "ss"))
_ALL_MMA_FAMILIES = tuple(f"wgmma_{t}_{form}" for t in ("f16", "f16_f16acc", "bf16", "tf32", "fp8", "fp8_f16acc",
                                                         "int", "b1") for form in ("rs", "ss"))


class WgmmaState:
    """Per-CTA wgmma bookkeeping: pending operations, committed-group counters, register shadows."""

    def __init__(self, T):
        nwg = max(T // WARPGROUP, 1)
        self.committed = np.zeros(nwg, np.int64)
        self.fenced = np.zeros(nwg, bool)        # warpgroup executed a wgmma.fence at least once
        self.ops = []
        self.busy = {}       # register slot -> int16 (size, T): pending wgmma operations using the register
        self.touched = {}    # register slot -> bool (size, T): accessed by an ordinary instruction since the fence


# ----------------------------------------------------------------------------------------------------------------------
# compile time: which register buffers are wgmma operands
# ----------------------------------------------------------------------------------------------------------------------

def _stmts(stmt):
    from tvm import tirx

    stack = [stmt]
    while stack:
        s = stack.pop()
        if s is None:
            continue
        yield s
        if isinstance(s, tirx.SeqStmt):
            stack.extend(s.seq)
            continue
        for attr in ("body", "then_case", "else_case", "block"):
            child = getattr(s, attr, None)
            if isinstance(child, tirx.Stmt):
                stack.append(child)


def operand_buffers(func) -> set:
    """Handles of the register buffers passed as accumulator or A-fragment operands of a ``wgmma.mma_async`` in
    the lowered device function (their loads and stores are checked against pending wgmma operations)."""
    from tvm import ir, tirx
    from tvm.backend.cuda.ptx.table import TABLE

    out = set()
    for s in _stmts(func.body):
        if not (isinstance(s, tirx.Evaluate) and isinstance(s.value, ir.Call)):
            continue
        name = getattr(s.value.op, "name", "") or ""
        fam = name[len("tirx.ptx."):] if name.startswith("tirx.ptx.") else ""
        if fam not in _ALL_MMA_FAMILIES:
            continue
        _mods, ops, _pred = decode_call(s.value, TABLE[fam])
        for operand in ("d", "a"):
            for node in ops.get(operand, (None, []))[1]:
                if isinstance(node, ir.TensorLoad):
                    out.add(node.source.__chandle__())
    return out


# ----------------------------------------------------------------------------------------------------------------------
# register hooks (called by the compiled register accesses of operand buffers)
# ----------------------------------------------------------------------------------------------------------------------

def register_access(st, slot, idx, site, name, write, thr=None):
    """An ordinary instruction accesses register ``name[idx]`` (a wgmma operand buffer): report it if a pending
    wgmma uses the register, and remember the access for the wgmma.fence check."""
    wg = st.wg
    if wg is None:
        return
    arr = st.bufs[slot]
    if arr is None:
        return
    threads = thr if thr is not None else (st.tid if st.mask is None else np.nonzero(st.mask)[0])
    if len(threads) == 0:
        return
    ii = np.asarray(idx, np.int64)
    if ii.ndim == 0:
        rows = np.broadcast_to(ii, (len(threads), 1))
    elif ii.ndim == 1 and ii.shape[0] == st.T:
        rows = ii[threads][:, None]
    elif ii.ndim == 1:
        rows = np.broadcast_to(ii, (len(threads), ii.shape[0]))
    else:
        rows = ii[threads]
    rows = np.clip(rows, 0, arr.shape[0] - 1)       # out-of-bounds indices are reported by the access itself
    cols = np.broadcast_to(np.asarray(threads)[:, None], rows.shape)
    busy = wg.busy.get(slot)
    if busy is not None and wg.ops:
        hit = busy[rows, cols] > 0
        if hit.any():
            k = np.argwhere(hit)[0]
            st.rec.fault(st, "wgmma_before_wait", site,
                         f"{'write to' if write else 'read of'} register {name}[{int(rows[k[0], k[1]])}] while a "
                         f"wgmma.mma_async that uses it is in flight (missing wgmma.commit_group / "
                         f"wgmma.wait_group before this access)", thread=int(cols[k[0], k[1]]), buffer=name,
                         index=int(rows[k[0], k[1]]))
    touched = wg.touched.get(slot)
    if touched is None or touched.shape != arr.shape:
        touched = wg.touched[slot] = np.zeros(arr.shape, bool)
    touched[rows, cols] = True


# ----------------------------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------------------------

class _Reg:
    """A register operand (an element of a local buffer), read and written directly (no hazard hooks: the wgmma
    itself accesses it)."""

    def __init__(self, kp, node):
        from tvm import ir

        if not isinstance(node, ir.TensorLoad):
            raise kp.unsupported(f"the wgmma register operand {node} (expected a register buffer element)")
        meta = kp.buffer(node.source)
        if meta.scope != "local":
            raise kp.unsupported(f"a wgmma register operand in {meta.scope} buffer {meta.name}")
        self.slot = meta.slot
        self.name = meta.name
        self.const = kp.const(node.indices[0])
        self.fi = None if self.const is not None else kp.expr(node.indices[0])
        self.npdt = meta.npdt
        if meta.npdt.itemsize != 4:
            raise kp.unsupported(f"wgmma register {meta.name} of dtype {meta.npdt} (32-bit registers expected)")

    def rows(self, st, t, site):
        """Register index per thread of ``t`` (an out-of-range index is reported and clamped)."""
        idx = self.const if self.const is not None else self.fi(st)
        rows = np.broadcast_to(np.asarray(idx, np.int64), (st.T,))[t]
        size = st.bufs[self.slot].shape[0]
        bad = (rows < 0) | (rows >= size)
        if bad.any():
            k = int(np.argmax(bad))
            st.rec.fault(st, "out_of_bounds", site, f"wgmma register operand index {int(rows[k])} outside "
                         f"{self.name}[{size}]", thread=int(t[k]), buffer=self.name, index=int(rows[k]))
            rows = np.clip(rows, 0, size - 1)
        return rows

    def read_bits(self, st, rows, t):
        return st.bufs[self.slot][rows, t].view(np.uint32)

    def write_bits(self, st, rows, t, bits):
        st.bufs[self.slot][rows, t] = np.asarray(bits, np.uint32).view(self.npdt)


def _uniform(st, site, vals, t, what):
    """The warpgroup-uniform value of per-thread ``vals`` (T,) over threads ``t``; reports non-uniform values (and
    goes on with the first thread's)."""
    v = vals[t]
    if not (v == v[0]).all():
        k = int(np.argmax(v != v[0]))
        show = (lambda x: bool(x)) if v.dtype == bool else (lambda x: f"{int(x):#018x}")
        st.rec.fault(st, "wgmma_operand", site, f"{what} differs between the threads of warpgroup {t[0] // 128} "
                     f"(thread {int(t[0])}: {show(v[0])}, thread {int(t[k])}: {show(v[k])}); it must be "
                     f"warpgroup-uniform", thread=int(t[k]))
    return v[0]


def _check_tma_layout(st, site, d, addr, rows, t, what, operand, mn_major=False):
    """When TMA loads (one tensor map) wrote every chunk the descriptor reads, the chunks must hold consecutive K
    bytes of consecutive rows of the tensor: global offset = origin + row * pitch + 16 * chunk. A swizzle or box the
    descriptor does not assume breaks that (``tma_layout_mismatch``). MN-major (``mn_major``): ``rows`` are the K
    rows of a [K, M / N] tensor and the chunks run along M / N (over every 64-column box, which lie side by side in
    the tensor), so the same rule holds."""
    smem = st.smem
    inside = (addr >= 0) & (addr + 16 <= smem.nbytes)
    if not inside.all():
        return
    idx = addr // 16
    maps = smem.tma_map[idx]
    if maps[0] < 0 or (maps != maps[0]).any():
        return
    o = smem.tma_origin[idx].reshape(rows, -1)
    pitch = int(o[1, 0] - o[0, 0]) if rows > 1 else 0
    want = o[0, 0] + pitch * np.arange(rows)[:, None] + 16 * np.arange(o.shape[1])[None, :]
    bad = o != want
    if not bad.any():
        return
    r, j = (int(x) for x in np.argwhere(bad)[0])
    tm = st.units["tma_maps"][int(maps[0])]
    row, along = ("K row", "M/N bytes") if mn_major else ("row", "K bytes")
    at = int(addr[r * o.shape[1] + j])
    st.rec.fault(st, "tma_layout_mismatch", site,
                 f"{what}: the {operand} descriptor ({d.swizzle_bytes or 'no'}-byte swizzle, LBO {d.lbo}, SBO {d.sbo}) "
                 f"reads its {row} {r}, {along} {16 * j}..{16 * j + 15} at shared byte {at}, where the TMA load put "
                 f"global byte {int(o[r, j])} of the tensor, not {int(want[r, j])} (rows {pitch} bytes apart, as rows "
                 f"0 and 1 are): the box / swizzle of {tm.describe()} disagrees with the layout the descriptor assumes",
                 thread=int(t[0]), buffer="shared", index=at)


def _read_matrix(st, site, desc_bits, t, rows, what, operand, ebits=16, mn_major=False):
    """(rows, 32 bytes of K) elements of an operand read through a matrix descriptor (``ebits``-bit elements:
    (rows, 16) uint16, (rows, 32) uint8 or (rows, 8) uint32), with the memory checks. ``mn_major``: the operand is
    MN-major (``imm-trans`` = 1, 16-bit only): the descriptor names 16-byte chunks of 8 consecutive rows at one k.
    Returns (elements, byte addresses (N,) read) for the pending-read bookkeeping."""
    d = W.decode_matrix_descriptor(desc_bits)
    if d.swizzle_bytes and d.base_offset:
        raise UnsupportedConfigError(f"{what}: {operand} descriptor with base offset {d.base_offset}; the interpreter "
                                     f"implements base offset 0 (swizzle patterns starting on their repeat boundary)")
    kbytes = 32                                                   # every wgmma reads 32 bytes of K per row
    if mn_major:
        if ebits != 16:
            raise UnsupportedConfigError(f"{what}: an MN-major {operand} of {ebits}-bit elements; wgmma transposes "
                                         f"16-bit operands only")
        k_rows = kbytes * 8 // ebits
        addr = W.mnmajor_chunk_addresses(d, k_rows, rows * ebits // 128).reshape(-1)    # (k_rows * rows / 8,)
    else:
        addr = W.kmajor_chunk_addresses(d, rows).reshape(-1)      # (rows * 2,)
    smem = st.smem
    _check_tma_layout(st, site, d, addr, kbytes * 8 // ebits if mn_major else rows, t, what, operand, mn_major)
    bad = (addr < 0) | (addr + 16 > smem.nbytes)
    if bad.any():
        k = int(np.argmax(bad))
        st.rec.fault(st, "out_of_bounds", site, f"{what}: {operand} chunk {k} reads shared bytes {int(addr[k])}.."
                     f"{int(addr[k]) + 15}, outside the CTA's {smem.nbytes}-byte shared memory (descriptor "
                     f"start {d.start}, LBO {d.lbo}, SBO {d.sbo}, {d.swizzle_bytes or 'no'}-byte swizzle)",
                     thread=int(t[0]), buffer="shared", index=int(addr[k]))
    ok = ~bad
    b = addr[ok][:, None] + np.arange(16)
    if len(b):
        # the four warps of the warpgroup all read the operand: a write by any warp needs a barrier before it
        reps = len(b)
        warps_t = t[::32][:4]
        shared_check(st, site, np.tile(b, (len(warps_t), 1)), np.repeat(warps_t, reps), write=False)
        unf = smem.unfenced[b]
        if unf.any():
            k = np.argwhere(unf)[0]
            byte = int(b[k[0], k[1]])
            name, elem, text = smem.describe(byte)
            st.rec.fault(st, "missing_proxy_fence", site,
                         f"{what} reads {operand} from shared memory written through the generic proxy (st.shared / "
                         f"stmatrix / cp.async) by warp {int(smem.w_warp[byte])} with no fence.proxy.async by that "
                         f"warp in between (wgmma reads shared memory through the async proxy)",
                         thread=int(t[0]), buffer=name, index=elem, detail=text or f"shared byte {byte}")
    data = np.zeros((len(addr), 16), np.uint8)
    data[ok] = smem.data[b]
    if mn_major:                 # (k rows, rows) -> (rows, k)
        return data.reshape(kbytes * 8 // ebits, rows * 2).view(np.uint16).T.copy(), b.reshape(-1)
    return data.reshape(rows, 32).view({8: np.uint8, 16: np.uint16, 32: np.uint32}[ebits]), b.reshape(-1)


# ----------------------------------------------------------------------------------------------------------------------
# the instructions
# ----------------------------------------------------------------------------------------------------------------------

@_family(*_MMA_FAMILIES)
def _wgmma_mma(kp, ops, mod, site):
    isa.require_feature("wgmma", kp.arch)
    shape, dtype, atype, btype = mod["shape"], mod["dtype"], mod["atype"], mod["btype"]
    n, kdim = (int(x) for x in shape[len("m64n"):].split("k"))
    rs = ops.family.endswith("_rs")
    satfinite = bool(mod.get("satfinite"))
    what = (f"wgmma.mma_async.sync.aligned.{shape}{'.satfinite' if satfinite else ''}.{dtype}.{atype}.{btype} "
            f"({'RS' if rs else 'SS'})")
    trans_b = ops.imm("trans_b") if ops.nodes("trans_b") else 0
    trans_a = ops.imm("trans_a") if ops.nodes("trans_a") else 0
    if (trans_a or trans_b) and atype not in ("f16", "bf16"):
        raise UnsupportedConfigError(f"{what} with imm-trans-a={trans_a}, imm-trans-b={trans_b} at {site.text()}: "
                                     f"MN-major operands exist for f16 / bf16 only")
    scale_a = ops.imm("scale_a") if ops.nodes("scale_a") else 1
    scale_b = ops.imm("scale_b") if ops.nodes("scale_b") else 1
    d_regs = [_Reg(kp, node) for node in ops.nodes("d")]
    per_reg = 2 if dtype == "f16" else 1                 # f16 accumulators: two per 32-bit register
    if len(d_regs) * per_reg != n // 2:
        raise kp.unsupported(f"{what} with {len(d_regs)} accumulator registers (expected {n // 2 // per_reg})")
    a_regs = [_Reg(kp, node) for node in ops.nodes("a")] if rs else []
    fa_desc = None if rs else ops.bits("a_desc")[0]
    fb_desc = ops.bits("b_desc")[0]
    fscale = ops.value("scale_d")
    ebits = W.WGMMA_ELEMENT_BITS[atype]
    ar, ac = W.wgmma_a_coords(atype)

    def run(st):
        wgs = full_warpgroups(st, site, what)
        if len(wgs) == 0:
            return
        state = st.wg
        bdesc = as_thread_vector(st, np.asarray(fb_desc(st), np.uint64))
        adesc = None if rs else as_thread_vector(st, np.asarray(fa_desc(st), np.uint64))
        scale_d = as_thread_vector(st, np.asarray(fscale(st)).astype(bool))
        for g in wgs:
            t = warpgroup_threads(g)
            regs = [(r, r.rows(st, t, site)) for r in d_regs + a_regs]
            if not state.fenced[g]:
                st.rec.fault(st, "wgmma_missing_fence", site, f"{what}: warpgroup {g} issues its first "
                             f"wgmma.mma_async without a wgmma.fence before it", thread=int(t[0]))
            for r, rows in regs:
                touched = state.touched.get(r.slot)
                if touched is not None and touched.shape == st.bufs[r.slot].shape:
                    hit = touched[rows, t]
                    if hit.any():
                        k = int(np.argmax(hit))
                        role = "accumulator" if r in d_regs else "A-fragment"
                        st.rec.fault(st, "wgmma_missing_fence", site,
                                     f"{what}: {role} register {r.name}[{int(rows[k])}] was accessed by an ordinary "
                                     f"instruction since the last wgmma.fence (issue wgmma.fence.sync.aligned "
                                     f"between the register access and the wgmma)", thread=int(t[k]),
                                     buffer=r.name, index=int(rows[k]))
            b_el, b_bytes = _read_matrix(st, site, _uniform(st, site, bdesc, t, "the B descriptor"), t, n, what, "B",
                                         W.WGMMA_ELEMENT_BITS[btype], mn_major=bool(trans_b))
            if rs:
                bits = np.stack([r.read_bits(st, rows, t) for r, rows in regs[len(d_regs):]], -1)   # (128, 4)
                per = 32 // ebits
                parts = [(bits >> np.uint32(e * ebits)) & np.uint32((1 << ebits) - 1) if ebits < 32 else bits
                         for e in range(per)]
                elems = np.stack(parts, -1).reshape(WARPGROUP, -1)
                a_el = np.zeros((W.WGMMA_M, kdim), np.uint32)
                a_el[ar, ac] = elems
                a_bytes = np.zeros(0, np.int64)
            else:
                a_el, a_bytes = _read_matrix(st, site, _uniform(st, site, adesc, t, "the A descriptor"), t,
                                             W.WGMMA_M, what, "A", ebits, mn_major=bool(trans_a))
            sd = bool(_uniform(st, site, scale_d, t, "scale-d"))
            smem_bytes = np.concatenate([b_bytes, a_bytes])
            np.add.at(st.smem.wg_reading, smem_bytes, 1)
            warps_g = np.arange(4 * int(g), 4 * int(g) + 4)
            issue_clocks = st.smem.clocks.own(warps_g)
            for r, rows in regs:
                busy = state.busy.get(r.slot)
                if busy is None or busy.shape != st.bufs[r.slot].shape:
                    busy = state.busy[r.slot] = np.zeros(st.bufs[r.slot].shape, np.int16)
                np.add.at(busy, (rows, t), 1)
            state.ops.append({"wg": int(g), "group": int(state.committed[g]), "t": t, "regs": regs,
                              "d_regs": regs[:len(d_regs)], "a": a_el, "b": b_el.T, "scale_d": sd,
                              "smem": smem_bytes, "n": n, "atype": atype, "btype": btype, "dtype": dtype,
                              "satfinite": satfinite, "scale_a": scale_a, "scale_b": scale_b,
                              "warps": warps_g, "issue_clocks": issue_clocks})
        st.rec.count("wgmma", len(wgs))

    return run


def _retire_reads(st, op):
    """A retired wgmma's shared reads are complete for every warp that retired it (the whole warpgroup executes
    the wait_group): move them from the issuing warps' read records to the warpgroup's wgmma agent, whose new clock
    the warps learn, so that any of them releasing the buffer (e.g. one elected thread arriving on the ring's empty
    barrier) orders the reads before a later write."""
    smem = st.smem
    clocks = smem.clocks
    b = np.unique(op["smem"])
    agent = clocks.wgmma_agent(op["wg"])
    tick = clocks.agent_tick(agent)
    for w, c in zip(op["warps"], op["issue_clocks"]):
        col = smem.r_clock[b, w]
        smem.r_clock[b, w] = np.where(col == c, 0, col)
    smem.r_clock[b, agent] = tick
    for w in op["warps"]:
        clocks.vc[w, agent] = max(clocks.vc[w, agent], tick)


def _retire(st, wgs, keep_newest):
    """Complete, in issue order, the pending operations of warpgroups ``wgs`` older than their ``keep_newest``
    most recent committed groups."""
    state = st.wg
    waiting = set(int(g) for g in wgs)
    remaining = []
    for op in state.ops:
        g = op["wg"]
        if g not in waiting or op["group"] >= state.committed[g] - keep_newest:
            remaining.append(op)
            continue
        t = op["t"]
        n, dtype = op["n"], op["dtype"]
        bits = np.stack([r.read_bits(st, rows, t) for r, rows in op["d_regs"]], -1)          # (128, regs)
        dr, dc = W.wgmma_d_coords(n)
        if dtype == "f16":
            d_in = np.stack([bits & 0xFFFF, bits >> 16], -1).reshape(WARPGROUP, -1).astype(np.uint16).view(np.float16)
        else:
            d_in = bits.view(np.int32 if dtype == "s32" else np.float32)
        D = np.zeros((W.WGMMA_M, n), d_in.dtype)
        D[dr, dc] = d_in
        out = W.wgmma_mma(n, op["atype"], op["a"], op["b"], D, op["scale_d"], op["scale_a"], op["scale_b"],
                          btype=op["btype"], dtype=dtype, satfinite=op["satfinite"])
        vals = out[dr, dc]
        if dtype == "f16":
            h = vals.view(np.uint16).astype(np.uint32).reshape(WARPGROUP, -1, 2)
            vals = h[..., 0] | (h[..., 1] << np.uint32(16))
        else:
            vals = vals.view(np.uint32)
        for j, (r, rows) in enumerate(op["d_regs"]):
            r.write_bits(st, rows, t, vals[:, j])
        for r, rows in op["regs"]:
            np.add.at(state.busy[r.slot], (rows, t), -1)
        np.add.at(st.smem.wg_reading, op["smem"], -1)
        _retire_reads(st, op)
    state.ops = remaining


@_family("wgmma_fence")
def _wgmma_fence(kp, ops, mod, site):
    isa.require_feature("wgmma", kp.arch)

    def run(st):
        wgs = full_warpgroups(st, site, "wgmma.fence.sync.aligned")
        state = st.wg
        state.fenced[wgs] = True
        t = np.concatenate([warpgroup_threads(g) for g in wgs]) if len(wgs) else np.zeros(0, np.int64)
        for touched in state.touched.values():
            touched[:, t] = False
    return run


@_family("wgmma_commit_group")
def _wgmma_commit(kp, ops, mod, site):
    isa.require_feature("wgmma", kp.arch)

    def run(st):
        st.wg.committed[full_warpgroups(st, site, "wgmma.commit_group.sync.aligned")] += 1
    return run


@_family("wgmma_wait_group")
def _wgmma_wait(kp, ops, mod, site):
    isa.require_feature("wgmma", kp.arch)
    n = ops.imm("group")

    def run(st):
        _retire(st, full_warpgroups(st, site, f"wgmma.wait_group.sync.aligned {n}"), n)
    return run


def setup_cta(st):
    """Before a CTA of a kernel with wgmma operands: fresh wgmma bookkeeping."""
    st.wg = WgmmaState(st.T)


def finish_cta(st):
    """End of a CTA: operations never retired by a wgmma.wait_group leave their accumulators undefined."""
    if st.wg is not None and st.wg.ops:
        op = st.wg.ops[0]
        st.rec.fault(st, "wgmma_before_wait", None,
                     f"the CTA finished with {len(st.wg.ops)} wgmma.mma_async operation(s) never retired by a "
                     f"wgmma.wait_group (first: warpgroup {op['wg']}, m64n{op['n']}k16); their accumulators are "
                     f"undefined", thread=int(op["t"][0]))


# ----------------------------------------------------------------------------------------------------------------------
# T.cuda.wgmma.encode_matrix_descriptor
# ----------------------------------------------------------------------------------------------------------------------

def compile_encode_descriptor(kp, args):
    """``tirx.cuda.wgmma_encode_matrix_descriptor(address_of(desc[i]), smem_ptr, ldo, sdo, swizzle)``: writes the
    descriptor (``wgmma.encode_matrix_descriptor``) into the uint64 register ``desc[i]``."""
    from tvm import ir

    dst = args[0]
    if not (isinstance(dst, ir.Call) and getattr(dst.op, "name", "") == "tirx.address_of"):
        raise kp.unsupported(f"wgmma_encode_matrix_descriptor into {dst} (expected T.address_of(desc[i]))")
    write = register_writer(kp, dst.args[0])
    fptr, fldo, fsdo, fswz = (kp.expr(a) for a in args[1:5])
    site = kp.site

    def run(st):
        sa = cvta_to_shared(st, fptr(st), site)
        v = W.encode_matrix_descriptor(np.asarray(sa).astype(np.int64), np.asarray(fldo(st)),
                                       np.asarray(fsdo(st)), np.asarray(fswz(st)))
        write(st, as_thread_vector(st, np.asarray(v, np.uint64)))
        return None
    return run


__all__ = ["FAMILIES", "WgmmaState", "operand_buffers", "register_access", "setup_cta", "finish_cta",
           "compile_encode_descriptor", "WARPGROUP"]
