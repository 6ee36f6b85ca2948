"""Binding of ``T.ptx.*`` calls in the lowered kernel to the semantics in ``ptx.py`` and the memory model.

A call is decoded with TVM's own PTX table (``tvm.backend.cuda.ptx.table``): the trailing string arguments are the
modifier tokens of the table entry, the leading arguments its operands in PTX order. Each supported family gets a
closure; anything else is rejected at compile time with the list of supported families. Instructions are checked
against the target arch with ``mmaemit.isa`` before anything runs (ptxas would reject the whole kernel).
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..errors import UnsupportedConfigError, choices
from . import ptx
from .intrinsics import cvta_to_shared
from .machine import _UINT_OF, SHARED_RID, _expr_dtype, _shared_check, cta_barrier, np_dtype
from .memory import OFFSET_MASK, REGION_SHIFT

#: PTX mma operand token -> canonical mmaemit dtype (to look the instruction up in mmaemit.isa)
_MMA_DTYPE = {"f16": "float16", "bf16": "bfloat16", "tf32": "float32", "f32": "float32", "e4m3": "float8_e4m3fn",
              "e5m2": "float8_e5m2", "s8": "int8", "u8": "uint8", "s4": "int4", "u4": "uint4", "s32": "int32"}


def _decode(call, entry):
    from tvm.backend.cuda.ptx.table import mods, operand_layout

    args = list(call.args)
    n_slots = len(entry.slots)
    flags = str(args[-1].value).split(",")
    tokens = [str(a.value) for a in args[len(args) - n_slots - 1:-1]]
    rest = args[: len(args) - n_slots - 1]
    mod_map = mods(entry, tokens)
    layout = operand_layout(entry, mod_map)
    sunk = {int(f[1:]) for f in flags if f.startswith("s") and f[1:].isdigit()}
    ops, pos = {}, 0
    for slot, i, lanes in layout:
        nodes = []
        for lane in range(lanes):
            if i + lane in sunk:
                nodes.append(None)
            else:
                nodes.append(rest[pos])
                pos += 1
        ops[slot.name] = (slot, nodes)
    pred = rest[pos] if "pred" in flags else None
    return mod_map, ops, pred


class _Operands:
    """Compile-time access to one decoded PTX call's operands."""

    def __init__(self, kp, ops, family):
        self.kp = kp
        self.ops = ops
        self.family = family

    def nodes(self, name):
        return self.ops[name][1] if name in self.ops else []

    def imm(self, name):
        (node,) = self.nodes(name)
        if not hasattr(node, "value"):
            raise self.kp._unsupported(f"a non-constant immediate operand {name}")
        return int(node.value)

    def value(self, name, i=0):
        return self.kp._expr(self.nodes(name)[i])

    def bits(self, name):
        """Closures returning each register of operand ``name`` as unsigned bit patterns (uniform or (T,))."""
        out = []
        for node in self.nodes(name):
            if node is None:
                out.append(None)
                continue
            f = self.kp._expr(node)
            dt = np_dtype(_expr_dtype(node))
            u = _UINT_OF[dt.itemsize]

            def g(st, f=f, dt=dt, u=u):
                a = np.asarray(f(st))
                if a.dtype != dt:
                    a = a.astype(dt)
                return a.view(u)
            out.append(g)
        return out

    def writers(self, name):
        return [None if n is None else _writer(self.kp, n) for n in self.nodes(name)]


def _writer(kp, node):
    """A destination register: ``w(st, bits, thr=None)`` stores bit patterns into a register buffer element,
    for the active threads (``thr``: explicit thread indices, values aligned with them)."""
    from tvm import ir

    if not isinstance(node, ir.TensorLoad):
        raise kp._unsupported(f"the PTX destination {node} (expected a register buffer element)")
    meta = kp._buf(node.source)
    if meta.scope != "local":
        raise kp._unsupported(f"a PTX destination in {meta.scope} buffer {meta.name} (expected registers)")
    npdt = meta.npdt
    const = kp._const(node.indices[0])
    fi = kp._expr(node.indices[0])
    slot = meta.slot
    guard = node.source.__chandle__() in kp.wgmma_bufs
    site = kp.site

    def write(st, vals, thr=None):
        if guard and st.wg is not None:
            from .wgmma_exec import register_access
            register_access(st, slot, const if const is not None else fi(st), site, meta.name, True, thr)
        vals = np.asarray(vals)
        if vals.dtype != npdt:
            vals = vals.view(npdt) if vals.dtype.itemsize == npdt.itemsize else vals.astype(npdt)
        arr = st.bufs[slot]
        idx = const if const is not None else fi(st)
        if np.ndim(idx) == 0:
            row = arr[int(idx)]
            if thr is None:
                if st.mask is None:
                    row[...] = vals
                else:
                    np.copyto(row, np.broadcast_to(vals, row.shape), where=st.mask, casting="unsafe")
            else:
                row[thr] = vals
            return
        idx = np.asarray(idx)
        if thr is None:
            t = st.tid if st.mask is None else np.nonzero(st.mask)[0]
            arr[idx[t], t] = np.broadcast_to(vals, (st.T,))[t]
        else:
            arr[idx[thr], thr] = vals
    return write


def _T(st, v):
    """A uniform or per-thread value as a (T,) array."""
    return np.broadcast_to(np.asarray(v), (st.T,))


def _warps(st, site, what):
    """(warp indices, thread indices) of the fully active warps; reports partially active warps as divergence."""
    if st.mask is None:
        return np.arange(st.W), st.tid
    m = st.mask.reshape(st.W, 32)
    full = m.all(axis=1)
    part = m.any(axis=1) & ~full
    if part.any():
        w = int(np.argmax(part))
        st.rec.fault(st, "divergence", site, f"{what} executed by {int(m[w].sum())} of 32 lanes of warp {w}: "
                     f".sync.aligned instructions need every lane of the warp", thread=w * 32 + int(np.argmin(m[w])))
    wsel = np.nonzero(full)[0]
    if len(wsel) == 0:
        return None
    return wsel, (wsel[:, None] * 32 + np.arange(32)).reshape(-1)


def _shared_addr(st, v, site):
    """Shared-window byte addresses (T,) int64 from a shared-space address operand (uint32 or generic pointer)."""
    a = np.asarray(v)
    if a.size and int(a.max()) >= (1 << 32):       # a generic pointer (region id in the high bits): cvta it
        a = np.asarray(cvta_to_shared(st, a, site))
    return _T(st, a.astype(np.int64))


def _rows(st, site, starts, thr, width, what, write=False, data=None, align=None):
    """Read (returns (N, width) uint8) or write ``data`` (N, width) of ``width``-byte shared rows at ``starts``
    (N,) for threads ``thr`` (N,), with bounds, alignment and shadow-state checks."""
    smem = st.smem
    align = width if align is None else align
    bad = (starts < 0) | (starts + width > smem.nbytes)
    mis = (starts % align) != 0
    ok = ~(bad | mis)
    if bad.any():
        k = int(np.argmax(bad))
        st.rec.fault(st, "out_of_bounds", site, f"{what}: shared address {int(starts[k])} (+{width} bytes) is "
                     f"outside the CTA's {smem.nbytes}-byte shared memory", thread=int(thr[k]), buffer="shared",
                     index=int(starts[k]))
    if mis.any():
        k = int(np.argmax(mis))
        st.rec.fault(st, "misaligned", site, f"{what}: shared address {int(starts[k])} is not {align}-byte aligned",
                     thread=int(thr[k]), buffer="shared", index=int(starts[k]))
    s, t = starts[ok], thr[ok]
    b = s[:, None] + np.arange(width)
    if len(s):
        _shared_check(st, site, b, t, write)
    if write:
        smem.data[b] = data[ok]
        return None
    out = np.zeros((len(starts), width), np.uint8)
    out[ok] = smem.data[b]
    return out


def _global_bytes(st, site, ptrs, counts, width, thr, what):
    """(N, width) uint8: the first ``counts`` bytes at generic pointers ``ptrs`` (rest zero), bounds-checked."""
    out = np.zeros((len(ptrs), width), np.uint8)
    rid = ptrs >> REGION_SHIFT
    off = ptrs & OFFSET_MASK
    for r in np.unique(rid):
        sel = (rid == r) & (counts > 0)
        if not sel.any():
            continue
        region = st.regions.get(int(r))
        if region is None or region.rid == SHARED_RID:
            k = int(np.argmax(sel))
            st.rec.fault(st, "out_of_bounds", site, f"{what}: source pointer does not point into a global buffer",
                         thread=int(thr[k]))
            continue
        o, c = off[sel], counts[sel]
        bad = o + c > region.nbytes
        if bad.any():
            k = int(np.nonzero(sel)[0][np.argmax(bad)])
            item = region.dtype.itemsize if region.dtype is not None else 1
            detail = ""
            if region.shape is not None and (off[k] // item) < int(np.prod(region.shape)):
                detail = f"{region.name}[{', '.join(str(int(i)) for i in np.unravel_index(off[k] // item, region.shape))}]"
            st.rec.fault(st, "out_of_bounds", site, f"{what}: reads {int(counts[k])} bytes at byte {int(off[k])} of "
                         f"global buffer {region.name} ({region.nbytes} bytes)", thread=int(thr[k]),
                         buffer=region.name, index=int(off[k]) // item, detail=detail)
        idx = np.nonzero(sel)[0][~bad]
        o, c = o[~bad], c[~bad]
        cols = np.arange(width)
        b = np.minimum(o[:, None] + cols, region.nbytes - 1)
        vals = region.data[b]
        out[idx] = np.where(cols < c[:, None], vals, 0)
    return out


def _global_write(st, site, ptrs, data, thr, what):
    width = data.shape[1]
    rid = ptrs >> REGION_SHIFT
    off = ptrs & OFFSET_MASK
    for r in np.unique(rid):
        sel = rid == r
        region = st.regions.get(int(r))
        if region is None or region.rid == SHARED_RID:
            st.rec.fault(st, "out_of_bounds", site, f"{what}: pointer does not point into a global buffer",
                         thread=int(thr[int(np.argmax(sel))]))
            continue
        o = off[sel]
        bad = o + width > region.nbytes
        if bad.any():
            k = int(np.nonzero(sel)[0][np.argmax(bad)])
            st.rec.fault(st, "out_of_bounds", site, f"{what}: writes {width} bytes at byte {int(off[k])} of global "
                         f"buffer {region.name} ({region.nbytes} bytes)", thread=int(thr[k]), buffer=region.name)
        good = np.nonzero(sel)[0][~bad]
        region.data[off[good][:, None] + np.arange(width)] = data[good]


def _active(st):
    return st.tid if st.mask is None else np.nonzero(st.mask)[0]


def _guarded(fn, fpred):
    if fpred is None:
        return fn

    def run(st):
        p = fpred(st)
        if np.ndim(p) == 0:
            if p:
                fn(st)
            return
        outer = st.mask
        m = np.asarray(p, bool) if outer is None else (outer & np.asarray(p, bool))
        if not m.any():
            return
        st.mask = m
        try:
            fn(st)
        finally:
            st.mask = outer
    return run


# ----------------------------------------------------------------------------------------------------------------------

_FAMILIES = {}


def _family(*names):
    def deco(fn):
        for n in names:
            _FAMILIES[n] = fn
        return fn
    return deco


def compile_ptx(kp, call, name):
    """Closure executing one ``T.ptx`` call (statement) of the lowered kernel."""
    from tvm.backend.cuda.ptx.table import TABLE

    entry = TABLE.get(name)
    handler = _FAMILIES.get(name)
    if entry is None or handler is None:
        raise UnsupportedConfigError(
            f"the interpreter does not implement the PTX instruction family {name!r} (at {kp.site.text()}); "
            f"implemented: {choices(_FAMILIES)}")
    mod_map, ops, pred = _decode(call, entry)
    fn = handler(kp, _Operands(kp, ops, name), mod_map, kp.site)
    fpred = kp._expr(pred) if pred is not None else None
    return _guarded(fn, fpred)


@_family("ldmatrix")
def _ldmatrix(kp, ops, mod, site):
    num = int(mod["num"][1:])
    trans = mod["trans"] == "trans"
    isa.matrix_move("ldmatrix", num, trans, kp.arch)
    writers = ops.writers("r")
    faddr = ops.value("p")
    what = f"ldmatrix.x{num}{'.trans' if trans else ''}"

    def run(st):
        sel = _warps(st, site, what)
        if sel is None:
            return
        wsel, thr = sel
        addr = _shared_addr(st, faddr(st), site).reshape(st.W, 32)[wsel][:, :8 * num]
        prov = (wsel[:, None] * 32 + np.arange(8 * num)).reshape(-1)
        rows = _rows(st, site, addr.reshape(-1), prov, 16, what)
        mats = rows.view(np.uint16).reshape(len(wsel), num, 8, 8)
        regs = ptx.ldmatrix(mats, trans)
        for m, w in enumerate(writers):
            w(st, regs[:, :, m].reshape(-1), thr)
        full = np.zeros(st.T, np.int64)
        full[prov] = addr.reshape(-1)
        act = np.zeros(st.T, bool)
        act[prov] = True
        st.rec.bank(st, site, what, full, 16, act)
        st.rec.count("ldmatrix", len(wsel))
    return run


@_family("stmatrix")
def _stmatrix(kp, ops, mod, site):
    num = int(mod["num"][1:])
    trans = mod["trans"] == "trans"
    isa.matrix_move("stmatrix", num, trans, kp.arch)
    regs_f = ops.bits("r")
    faddr = ops.value("p")
    what = f"stmatrix.x{num}{'.trans' if trans else ''}"

    def run(st):
        sel = _warps(st, site, what)
        if sel is None:
            return
        wsel, _thr = sel
        regs = np.stack([_T(st, f(st)).astype(np.uint32) for f in regs_f], -1).reshape(st.W, 32, num)[wsel]
        mats = ptx.stmatrix(regs, trans)                         # (nW, num, 8, 8)
        addr = _shared_addr(st, faddr(st), site).reshape(st.W, 32)[wsel][:, :8 * num]
        prov = (wsel[:, None] * 32 + np.arange(8 * num)).reshape(-1)
        _rows(st, site, addr.reshape(-1), prov, 16, what, write=True,
              data=mats.reshape(-1, 8).view(np.uint8).reshape(-1, 16))
        full = np.zeros(st.T, np.int64)
        full[prov] = addr.reshape(-1)
        act = np.zeros(st.T, bool)
        act[prov] = True
        st.rec.bank(st, site, what, full, 16, act)
        st.rec.count("stmatrix", len(wsel))
    return run


@_family("mma", "mma_f16acc", "mma_int")
def _mma(kp, ops, mod, site):
    shape_tok = mod["shape"]
    m, n, k = (int(x) for x in shape_tok[1:].replace("n", " ").replace("k", " ").split())
    if mod["alayout"] != "row" or mod["blayout"] != "col":
        raise kp._unsupported(f"mma with .{mod['alayout']}.{mod['blayout']} layouts (mma.sync m16n8 is row.col)")
    if mod.get("bitop"):
        raise kp._unsupported("b1 mma")
    dtype, atype, btype, ctype = mod["dtype"], mod["atype"], mod["btype"], mod["ctype"]
    satfinite = mod.get("satfinite") == "satfinite"
    want = (m, n, k, _MMA_DTYPE[atype], _MMA_DTYPE[btype], _MMA_DTYPE[dtype])
    hits = [e for e in isa.MMA_TABLE if (e.m, e.n, e.k, e.a_dtype, e.b_dtype, e.accum_dtype) == want]
    text = f"mma.sync.aligned.{shape_tok}.row.col.{dtype}.{atype}.{btype}.{ctype}"
    if not hits:
        raise UnsupportedConfigError(f"{text} is not in mmaemit's instruction table; the interpreter executes: "
                                     f"{choices(e.ptx() for e in isa.MMA_TABLE)}")
    isa.check_mma_arch(hits[0], kp.arch)
    fa, fb, fc = ops.bits("a"), ops.bits("b"), ops.bits("c")
    writers = ops.writers("d")

    def run(st):
        sel = _warps(st, site, "mma.sync")
        if sel is None:
            return
        wsel, thr = sel

        def regs(fs):
            return np.stack([_T(st, f(st)).astype(np.uint32) for f in fs], -1).reshape(st.W, 32, len(fs))[wsel]
        d = ptx.mma_sync((m, n, k), atype, btype, ctype, dtype, regs(fa), regs(fb), regs(fc), satfinite=satfinite)
        for j, w in enumerate(writers):
            w(st, d[:, :, j].reshape(-1), thr)
        st.rec.count("mma", len(wsel))
    return run


@_family("cp_async_ca", "cp_async_cg", "cp_async_ca_src_size", "cp_async_cg_src_size", "cp_async_ca_ignore_src",
         "cp_async_cg_ignore_src")
def _cp_async(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)
    size = ops.imm("cp_size")
    fdst, fsrc = ops.value("dst_mem"), ops.value("src_mem")
    fsrc_size = ops.value("src_size") if ops.nodes("src_size") else None
    fignore = ops.value("ignore_src") if ops.nodes("ignore_src") else None
    what = f"cp.async.{mod['cop']}.shared.global [{size} bytes]"

    def run(st):
        thr = _active(st)
        if len(thr) == 0:
            return
        dst = _shared_addr(st, fdst(st), site)[thr]
        src = _T(st, np.asarray(fsrc(st), np.int64))[thr]
        counts = np.full(len(thr), size, np.int64)
        if fsrc_size is not None:
            counts = np.minimum(_T(st, np.asarray(fsrc_size(st), np.int64))[thr], size)
        if fignore is not None:
            counts = np.where(_T(st, np.asarray(fignore(st), bool))[thr], 0, counts)
        data = _global_bytes(st, site, src, counts, size, thr, what)
        smem = st.smem
        bad = (dst < 0) | (dst + size > smem.nbytes) | (dst % size != 0)
        if bad.any():
            k = int(np.argmax(bad))
            kind = "misaligned" if 0 <= dst[k] and dst[k] + size <= smem.nbytes else "out_of_bounds"
            st.rec.fault(st, kind, site, f"{what}: destination shared address {int(dst[k])} is "
                         f"{'not %d-byte aligned' % size if kind == 'misaligned' else 'outside shared memory'}",
                         thread=int(thr[k]), buffer="shared", index=int(dst[k]))
            thr, dst, data = thr[~bad], dst[~bad], data[~bad]
        b = dst[:, None] + np.arange(size)
        # the copy writes its destination from issue until it lands: a write for the race detector already now
        _shared_check(st, site, b, thr, write=True, initialize=False)
        np.add.at(smem.pending, b.reshape(-1), 1)
        st.cp.ops.append({"thr": thr, "group": st.cp.committed[thr].copy(), "dst": dst, "data": data,
                          "size": size})
        st.rec.count("cp.async", len(thr))
    return run


def _land(st, thr_waiting, keep_newest):
    """Complete the cp.async groups of ``thr_waiting`` older than their ``keep_newest`` most recent groups."""
    waiting = np.zeros(st.T, bool)
    waiting[thr_waiting] = True
    smem = st.smem
    remaining = []
    for op in st.cp.ops:
        thr = op["thr"]
        done = waiting[thr] & (op["group"] < st.cp.committed[thr] - keep_newest)
        if done.any():
            b = op["dst"][done][:, None] + np.arange(op["size"])
            smem.data[b] = op["data"][done]
            np.add.at(smem.pending, b.reshape(-1), -1)
            w = np.repeat(st.warp_of[thr[done]], op["size"]).astype(np.int16)
            smem.note_writes(b.reshape(-1), w, st.epoch, initialize=True)
        if not done.all():
            keep = ~done
            remaining.append({**op, "thr": thr[keep], "group": op["group"][keep], "dst": op["dst"][keep],
                              "data": op["data"][keep]})
    st.cp.ops = remaining


@_family("cp_async_commit_group")
def _cp_commit(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)

    def run(st):
        st.cp.committed[_active(st)] += 1
    return run


@_family("cp_async_wait_group")
def _cp_wait(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)
    n = ops.imm("group")

    def run(st):
        _land(st, _active(st), n)
    return run


@_family("cp_async_wait_all")
def _cp_wait_all(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)

    def run(st):
        thr = _active(st)
        st.cp.committed[thr] += 1
        _land(st, thr, 0)
    return run


@_family("bar_sync", "barrier_sync", "bar_sync_count", "barrier_sync_count")
def _bar(kp, ops, mod, site):
    fcount = ops.value("b") if ops.nodes("b") else None
    what = "bar.sync" if mod.get("aligned", "") == "" else "barrier.sync.aligned"

    def run(st):
        if fcount is not None:
            c = int(np.asarray(fcount(st)).flat[0])
            if c != st.T:
                raise UnsupportedConfigError(f"{what} with a thread count of {c} (named barriers over part of the CTA)"
                                             f" is not supported by the interpreter; the CTA has {st.T} threads")
        cta_barrier(st, site, what)
    return run


@_family("bar_warp_sync", "fence", "fence_proxy")
def _noop(kp, ops, mod, site):
    if mod.get("proxykind") == "async":
        isa.require_feature("fence.proxy.async", kp.arch)
        from .wgmma_exec import proxy_fence
        return proxy_fence
    return lambda st: None


def _elementwise(kp, ops, out_name, in_names, fn, site):
    ins = [ops.bits(n)[0] for n in in_names]
    (w,) = ops.writers(out_name)

    def run(st):
        w(st, _T(st, fn(*[f(st) for f in ins])))
    return run


@_family("lop3")
def _lop3(kp, ops, mod, site):
    lut = ops.imm("immLut")
    return _elementwise(kp, ops, "d", ("a", "b", "c"), lambda a, b, c: ptx.lop3(a, b, c, lut), site)


@_family("prmt")
def _prmt(kp, ops, mod, site):
    mode = mod.get("mode", "")
    return _elementwise(kp, ops, "d", ("a", "b", "c"), lambda a, b, c: ptx.prmt(a, b, c, mode), site)


@_family("shf")
def _shf(kp, ops, mod, site):
    d, m = mod["dir"], mod["mode"]
    return _elementwise(kp, ops, "d", ("a", "b", "c"), lambda a, b, c: ptx.shf(a, b, c, d, m), site)


@_family("shl", "shr")
def _shift(kp, ops, mod, site):
    t = mod["type"]
    bits = int(t[1:])
    if bits > 32:
        raise kp._unsupported(f"64-bit shifts ({t})")
    if ops.family == "shl":
        return _elementwise(kp, ops, "d", ("a", "b"), lambda a, b: ptx.shl(a, b, bits), site)
    return _elementwise(kp, ops, "d", ("a", "b"), lambda a, b: ptx.shr(a, b, bits, signed=t[0] == "s"), site)


@_family("and", "or", "xor", "not")
def _logic(kp, ops, mod, site):
    fam = ops.family
    if fam == "not":
        return _elementwise(kp, ops, "d", ("a",), lambda a: ~np.asarray(a), site)
    f = {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[fam]
    return _elementwise(kp, ops, "d", ("a", "b"), f, site)


@_family("mov")
def _mov(kp, ops, mod, site):
    return _elementwise(kp, ops, "d", ("a",), lambda a: a, site)


@_family("mov_pack_b16x2")
def _pack(kp, ops, mod, site):
    lo, hi = ops.bits("a")
    (w,) = ops.writers("d")
    return lambda st: w(st, _T(st, ptx.pack_b32(lo(st), hi(st))))


@_family("mov_unpack_b16x2")
def _unpack(kp, ops, mod, site):
    (fa,) = ops.bits("a")
    wlo, whi = ops.writers("d")

    def run(st):
        lo, hi = ptx.split_b32(fa(st))
        if wlo is not None:
            wlo(st, _T(st, lo))
        if whi is not None:
            whi(st, _T(st, hi))
    return run


@_family("add_int", "sub_int", "mul_int")
def _int_arith(kp, ops, mod, site):
    t = mod["type"]
    if t not in ("u32", "s32") or mod.get("sat"):
        raise kp._unsupported(f"integer arithmetic on .{t}{' with .sat' if mod.get('sat') else ''} "
                              f"(the interpreter implements .u32/.s32 wrap-around)")
    fam = ops.family
    mode = mod.get("mode", "lo")

    def fn(a, b):
        a64, b64 = np.asarray(a).astype(np.uint64), np.asarray(b).astype(np.uint64)
        if fam == "add_int":
            return (a64 + b64).astype(np.uint32)
        if fam == "sub_int":
            return (a64 - b64).astype(np.uint32)
        if mode == "hi":
            if t == "s32":
                p = np.asarray(a).view(np.int32).astype(np.int64) * np.asarray(b).view(np.int32).astype(np.int64)
                return (p >> 32).astype(np.uint32)
            return ((a64 * b64) >> np.uint64(32)).astype(np.uint32)
        return (a64 * b64).astype(np.uint32)
    return _elementwise(kp, ops, "d", ("a", "b"), fn, site)


@_family("add_half", "sub_half", "mul_half", "fma_half")
def _half(kp, ops, mod, site):
    t = mod["type"]
    fam = ops.family
    op = fam.split("_")[0]
    if t.startswith("bf16") and op in ("add", "sub", "mul"):
        isa.require_feature("add.bf16x2", kp.arch)
    if mod.get("oob"):
        raise kp._unsupported("fma.oob")
    kw = dict(ftz=bool(mod.get("ftz")), sat=bool(mod.get("sat")), relu=bool(mod.get("relu")))
    names = ("a", "b", "c") if op == "fma" else ("a", "b")
    return _elementwise(kp, ops, "d", names, lambda *xs: ptx.half_arith(op, t, *xs, **kw), site)


@_family("bfe")
def _bfe(kp, ops, mod, site):
    from ..dequant import regops   # the one definition of bfe / set / directed f32 fma (see regops)

    t = mod["type"]
    if t not in ("u32", "s32"):
        raise kp._unsupported(f"bfe.{t} (the interpreter implements bfe.u32 and bfe.s32)")
    f = regops.bfe_u32 if t == "u32" else regops.bfe_s32
    return _elementwise(kp, ops, "d", ("a", "b", "c"), f, site)


@_family("set")
def _set(kp, ops, mod, site):
    from ..dequant import regops

    cmp, dt, stype = mod["cmp"], mod["dtype"], mod["stype"]
    if cmp not in ("eq", "ne") or dt != "u32" or stype not in ("u32", "b32", "s32"):
        raise kp._unsupported(f"set.{cmp}.{dt}.{stype} (the interpreter implements set.{{eq,ne}}.u32 on 32-bit ints)")
    return _elementwise(kp, ops, "d", ("a", "b"), lambda a, b: regops.set_cmp(cmp, a, b), site)


@_family("add", "sub", "mul", "fma")
def _f32(kp, ops, mod, site):
    t = mod["type"]
    fam = ops.family
    rnd = mod.get("rnd") or "rn"
    if fam == "fma" and t == "f32" and rnd != "rn" and not mod.get("srctype") and not mod.get("ftz") \
            and not mod.get("sat"):
        from ..dequant import regops

        return _elementwise(kp, ops, "d", ("a", "b", "c"), lambda a, b, c: regops.fma_f32(a, b, c, rnd), site)
    if t != "f32" or mod.get("srctype") or rnd != "rn":
        raise kp._unsupported(f"{fam}.{rnd}.{t} (the interpreter implements .rn.f32 and fma.{{rz,rm,rp}}.f32)")
    ftz, sat = bool(mod.get("ftz")), bool(mod.get("sat"))

    def f64(x):
        v = np.asarray(x).astype(np.uint32).view(np.float32).astype(np.float64)
        if ftz:
            v = np.where(np.abs(v) < 2.0 ** -126, np.copysign(0.0, v), v)
        return v

    def fn(*xs):
        vs = [f64(x) for x in xs]
        with np.errstate(all="ignore"):
            if fam == "add":
                hi, lo = ptx._two_sum(vs[0], vs[1])
            elif fam == "sub":
                hi, lo = ptx._two_sum(vs[0], -vs[1])
            elif fam == "mul":
                hi, lo = vs[0] * vs[1], np.zeros_like(vs[0])
            else:
                hi, lo = ptx._two_sum(vs[0] * vs[1], vs[2])
        if sat:
            nan = np.isnan(hi)
            lo = np.where((hi <= 0) | (hi >= 1), 0.0, lo)
            hi = np.where(nan, 0.0, np.clip(hi, 0.0, 1.0))
        out = ptx.round_f64(hi, lo, "f32")
        if ftz:
            sub = ((out & 0x7F800000) == 0) & ((out & 0x7FFFFF) != 0)
            out = np.where(sub, out & np.uint32(0x80000000), out).astype(np.uint32)
        return out
    names = ("a", "b", "c") if fam == "fma" else ("a", "b")
    return _elementwise(kp, ops, "d", names, fn, site)


@_family("cvt_f16x2_f32", "cvt_bf16x2_f32")
def _cvt_x2(kp, ops, mod, site):
    fmt = "f16" if mod["dtype"] == "f16x2" else "bf16"
    kw = dict(rnd=mod["rnd"], relu=bool(mod.get("relu")), satfinite=bool(mod.get("satfinite")))
    return _elementwise(kp, ops, "d", ("a", "b"),
                        lambda a, b: ptx.cvt_f32_to_x2(np.asarray(a).view(np.float32),
                                                       np.asarray(b).view(np.float32), fmt, **kw), site)


@_family("cvt")
def _cvt_scalar(kp, ops, mod, site):
    dtype, atype = mod["dtype"], mod["atype"]
    if dtype not in ptx._SCALAR or atype not in ptx._SCALAR:
        raise kp._unsupported(f"cvt.{dtype}.{atype}")
    kw = dict(sat=bool(mod.get("sat")), relu=bool(mod.get("relu")), satfinite=bool(mod.get("satfinite")),
              ftz=bool(mod.get("ftz")))
    rnd = mod.get("rnd", "")
    return _elementwise(kp, ops, "d", ("a",), lambda a: ptx.cvt(a, dtype, atype, rnd, **kw), site)


@_family("cvt_tf32_f32")
def _cvt_tf32(kp, ops, mod, site):
    rnd, sat, relu = mod["rnd"], bool(mod.get("satfinite")), bool(mod.get("relu"))

    def fn(a):
        out = ptx.cvt_tf32(np.asarray(a).view(np.float32), rnd, sat)
        if relu:
            out = np.where((out & 0x80000000) != 0, np.uint32(0), out).astype(np.uint32)
        return out
    return _elementwise(kp, ops, "d", ("a",), fn, site)


@_family("cvt_f16x2_f8x2")
def _cvt_f8_f16(kp, ops, mod, site):
    fmt = mod["atype"][:4]
    isa.require_feature(f"cvt.{fmt}x2", kp.arch)
    relu = bool(mod.get("relu"))
    return _elementwise(kp, ops, "d", ("a",), lambda a: ptx.cvt_f8x2_to_f16x2(a, fmt, relu), site)


@_family("cvt_f8x2_f32")
def _cvt_f32_f8(kp, ops, mod, site):
    fmt = mod["dtype"][:4]
    isa.require_feature(f"cvt.{fmt}x2", kp.arch)
    relu, sat = bool(mod.get("relu")), bool(mod.get("satfinite"))
    return _elementwise(kp, ops, "d", ("a", "b"),
                        lambda a, b: ptx.cvt_f32_to_f8x2(np.asarray(a).view(np.float32),
                                                         np.asarray(b).view(np.float32), fmt, relu, sat), site)


@_family("ld", "ld_vec", "st", "st_vec")
def _ld_st(kp, ops, mod, site):
    fam = ops.family
    space = mod.get("space", "")
    if space not in ("shared", "shared::cta", "global"):
        raise kp._unsupported(f"{fam.split('_')[0]}.{space or 'generic'} (the interpreter implements the shared "
                              f"and global spaces)")
    store = fam.startswith("st")
    width = int(mod["type"][1:]) // 8
    vec = int(mod.get("vec", "v1")[1:]) if mod.get("vec") else 1
    faddr = ops.value("addr")
    what = f"{'st' if store else 'ld'}.{space}{'.v%d' % vec if vec > 1 else ''}.{mod['type']}"
    regs = ops.bits("value") if store else None
    writers = None if store else ops.writers("d")
    total = width * vec

    def run(st):
        thr = _active(st)
        if len(thr) == 0:
            return
        a = faddr(st)
        if space.startswith("shared"):
            addr = _shared_addr(st, a, site)[thr]
            if store:
                vals = np.stack([_T(st, f(st)).astype(_UINT_OF[width]) for f in regs], -1)[thr]
                _rows(st, site, addr, thr, total, what, write=True,
                      data=vals.view(np.uint8).reshape(len(thr), total), align=total)
            else:
                raw = _rows(st, site, addr, thr, total, what, align=total)
            full = np.zeros(st.T, np.int64)
            full[thr] = addr
            act = None if st.mask is None else st.mask
            st.rec.bank(st, site, what, full, total, act)
        else:
            ptrs = _T(st, np.asarray(a, np.int64))[thr]
            if store:
                vals = np.stack([_T(st, f(st)).astype(_UINT_OF[width]) for f in regs], -1)[thr]
                _global_write(st, site, ptrs, vals.view(np.uint8).reshape(len(thr), total), thr, what)
            else:
                raw = _global_bytes(st, site, ptrs, np.full(len(thr), total), total, thr, what)
        if not store:
            vals = raw.view(_UINT_OF[width]).reshape(len(thr), vec)
            for i, w in enumerate(writers):
                if w is not None:
                    w(st, vals[:, i], thr)
    return run


@_family("shfl_sync", "shfl_sync_p")
def _shfl(kp, ops, mod, site):
    mode = mod["mode"]
    fa, fb, fc = ops.bits("a")[0], ops.bits("b")[0], ops.bits("c")[0]
    (wd,) = ops.writers("d")
    wp = ops.writers("p")[0] if ops.nodes("p") else None

    def run(st):
        sel = _warps(st, site, f"shfl.sync.{mode}")
        if sel is None:
            return
        wsel, thr = sel
        v = _T(st, fa(st)).reshape(st.W, 32)[wsel]
        b = _T(st, fb(st)).reshape(st.W, 32)[wsel]
        c = _T(st, fc(st)).reshape(st.W, 32)[wsel]
        d, p = ptx.shfl(v, mode, b, c)
        wd(st, d.reshape(-1), thr)
        if wp is not None:
            wp(st, p.reshape(-1), thr)
        st.rec.count("shfl", len(wsel))
    return run


__all__ = ["compile_ptx"]

from . import wgmma_exec as _wgmma_exec  # noqa: E402,F401  (registers the wgmma families above)
