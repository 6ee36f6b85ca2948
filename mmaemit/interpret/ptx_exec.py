"""``T.ptx`` instruction families bound to the machine: each compile function turns one decoded call (``ptxcall``)
into a closure ``run(st)`` that reads its operands, applies the instruction's semantics from ``mmaemit.ptx`` and
writes registers / memory through ``access`` with the memory model's checks. Instructions are checked against the
target arch with ``mmaemit.isa`` before anything runs (ptxas would reject the whole kernel). Hopper ``wgmma`` is in
``wgmma_exec``.
"""
from __future__ import annotations

import numpy as np

from .. import isa, ptx
from ..errors import UnsupportedConfigError, choices
from ..ptx import UINT_OF_SIZE
from .access import (active_threads, as_thread_vector, full_warps, global_bytes, global_write, proxy_fence,
                     shared_addresses, shared_check, shared_rows)
from .machine import cta_barrier, named_barrier
from .ptxcall import family_registry

__all__ = ["FAMILIES"]

#: family name -> compile function (filled by ``@_family`` below)
FAMILIES, _family = family_registry()

#: PTX mma operand token -> canonical mmaemit dtype (to look the instruction up in mmaemit.isa)
_MMA_DTYPE = {"f16": "float16", "bf16": "bfloat16", "tf32": "float32", "f32": "float32", "e4m3": "float8_e4m3fn",
              "e5m2": "float8_e5m2", "s8": "int8", "u8": "uint8", "s4": "int4", "u4": "uint4", "s32": "int32"}


@_family("ldmatrix")
def _ldmatrix(kp, ops, mod, site):
    num = int(mod["num"][1:])
    trans = mod["trans"] == "trans"
    isa.matrix_move("ldmatrix", num, trans, kp.arch)
    writers = ops.writers("r")
    faddr = ops.value("p")
    what = f"ldmatrix.x{num}{'.trans' if trans else ''}"

    def run(st):
        sel = full_warps(st, site, what)
        if sel is None:
            return
        wsel, thr = sel
        addr = shared_addresses(st, faddr(st), site).reshape(st.W, 32)[wsel][:, :8 * num]
        prov = (wsel[:, None] * 32 + np.arange(8 * num)).reshape(-1)
        rows = shared_rows(st, site, addr.reshape(-1), prov, 16, what)
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
        sel = full_warps(st, site, what)
        if sel is None:
            return
        wsel, _thr = sel
        regs = np.stack([as_thread_vector(st, f(st)).astype(np.uint32) for f in regs_f], -1).reshape(st.W, 32, num)[wsel]
        mats = ptx.stmatrix(regs, trans)                         # (nW, num, 8, 8)
        addr = shared_addresses(st, faddr(st), site).reshape(st.W, 32)[wsel][:, :8 * num]
        prov = (wsel[:, None] * 32 + np.arange(8 * num)).reshape(-1)
        shared_rows(st, site, addr.reshape(-1), prov, 16, what, write=True,
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
        raise kp.unsupported(f"mma with .{mod['alayout']}.{mod['blayout']} layouts (mma.sync m16n8 is row.col)")
    if mod.get("bitop"):
        raise kp.unsupported("b1 mma")
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
        sel = full_warps(st, site, "mma.sync")
        if sel is None:
            return
        wsel, thr = sel

        def regs(fs):
            return np.stack([as_thread_vector(st, f(st)).astype(np.uint32) for f in fs], -1).reshape(st.W, 32, len(fs))[wsel]
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
        thr = active_threads(st)
        if len(thr) == 0:
            return
        dst = shared_addresses(st, fdst(st), site)[thr]
        src = as_thread_vector(st, np.asarray(fsrc(st), np.int64))[thr]
        counts = np.full(len(thr), size, np.int64)
        if fsrc_size is not None:
            counts = np.minimum(as_thread_vector(st, np.asarray(fsrc_size(st), np.int64))[thr], size)
        if fignore is not None:
            counts = np.where(as_thread_vector(st, np.asarray(fignore(st), bool))[thr], 0, counts)
        data = global_bytes(st, site, src, counts, size, thr, what)
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
        shared_check(st, site, b, thr, write=True, initialize=False)
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
            smem.note_writes(b.reshape(-1), w, initialize=True)
        if not done.all():
            keep = ~done
            remaining.append({**op, "thr": thr[keep], "group": op["group"][keep], "dst": op["dst"][keep],
                              "data": op["data"][keep]})
    st.cp.ops = remaining


@_family("cp_async_commit_group")
def _cp_commit(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)

    def run(st):
        st.cp.committed[active_threads(st)] += 1
    return run


@_family("cp_async_wait_group")
def _cp_wait(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)
    n = ops.imm("group")

    def run(st):
        _land(st, active_threads(st), n)
    return run


@_family("cp_async_wait_all")
def _cp_wait_all(kp, ops, mod, site):
    isa.require_feature("cp.async", kp.arch)

    def run(st):
        thr = active_threads(st)
        st.cp.committed[thr] += 1
        _land(st, thr, 0)
    return run


@_family("bar_sync", "barrier_sync", "bar_sync_count", "barrier_sync_count", "bar_arrive", "barrier_arrive")
def _bar(kp, ops, mod, site):
    fid = ops.value("a")
    count_node = ops.nodes("b")[0] if ops.nodes("b") else None
    fcount = kp.expr(count_node) if count_node is not None else None
    arrive = ops.family.endswith("arrive")
    what = f"{'bar' if ops.family.startswith('bar_') else 'barrier'}.{'arrive' if arrive else 'sync'}"
    if arrive:
        kp.blocking = True              # a producer / consumer hand-off: only meaningful with concurrent contexts
    elif count_node is not None:
        kp.barrier_counts.append(kp.const(count_node))

    def run(st):
        c = None if fcount is None else int(np.asarray(fcount(st)).flat[0])
        if st.sched is None:            # one lockstep context: every barrier is the whole CTA (counts checked above)
            cta_barrier(st, site, what)
            return
        named_barrier(st, site, int(np.asarray(fid(st)).flat[0]), c, what, wait=not arrive)
    return run


@_family("bar_warp_sync", "fence", "fence_proxy")
def _noop(kp, ops, mod, site):
    if mod.get("proxykind") == "async":
        isa.require_feature("fence.proxy.async", kp.arch)
        return proxy_fence
    return lambda st: None


@_family("griddepcontrol")
def _griddepcontrol(kp, ops, mod, site):
    # programmatic dependent launch: the interpreter runs one kernel at a time, so the grid a kernel depends on has
    # completed before it starts (wait) and no dependent grid can start early (launch_dependents)
    isa.require_feature("griddepcontrol", kp.arch)
    return lambda st: None


@_family("cp_async_bulk_prefetch")
def _bulk_prefetch(kp, ops, mod, site):
    # an L2 hint with no effect on memory contents: its range is checked like a load (16-byte aligned address and
    # size, inside one global buffer), then dropped
    isa.require_feature("cp.async.bulk", kp.arch)
    fsrc, fsize = ops.value("src_mem"), ops.value("size")
    what = "cp.async.bulk.prefetch.L2.global"

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        src = as_thread_vector(st, np.asarray(fsrc(st), np.int64))[thr]
        size = as_thread_vector(st, np.asarray(fsize(st), np.int64))[thr]
        bad = (size % 16 != 0) | (size <= 0) | (src % 16 != 0)
        if bad.any():
            k = int(np.argmax(bad))
            st.rec.fault(st, "misaligned", site, f"{what}: address {int(src[k])} and size {int(size[k])} must be "
                         f"positive multiples of 16 bytes", thread=int(thr[k]))
            return
        global_bytes(st, site, src, size, 16, thr, what)      # bounds of the whole range; the bytes are not used
        st.rec.count("prefetch.l2", len(thr))
    return run


def _elementwise(kp, ops, out_name, in_names, fn, site):
    ins = [ops.bits(n)[0] for n in in_names]
    (w,) = ops.writers(out_name)

    def run(st):
        w(st, as_thread_vector(st, fn(*[f(st) for f in ins])))
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
        raise kp.unsupported(f"64-bit shifts ({t})")
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
    return lambda st: w(st, as_thread_vector(st, ptx.pack_b32(lo(st), hi(st))))


@_family("mov_unpack_b16x2")
def _unpack(kp, ops, mod, site):
    (fa,) = ops.bits("a")
    wlo, whi = ops.writers("d")

    def run(st):
        lo, hi = ptx.split_b32(fa(st))
        if wlo is not None:
            wlo(st, as_thread_vector(st, lo))
        if whi is not None:
            whi(st, as_thread_vector(st, hi))
    return run


@_family("add_int", "sub_int", "mul_int")
def _int_arith(kp, ops, mod, site):
    t = mod["type"]
    if t not in ("u32", "s32") or mod.get("sat"):
        raise kp.unsupported(f"integer arithmetic on .{t}{' with .sat' if mod.get('sat') else ''} "
                             f"(the interpreter implements .u32/.s32 wrap-around)")
    op = ops.family.split("_")[0]
    mode = mod.get("mode", "lo")
    return _elementwise(kp, ops, "d", ("a", "b"), lambda a, b: ptx.int_arith(op, a, b, t, mode), site)


@_family("add_half", "sub_half", "mul_half", "fma_half")
def _half(kp, ops, mod, site):
    t = mod["type"]
    fam = ops.family
    op = fam.split("_")[0]
    if t.startswith("bf16") and op in ("add", "sub", "mul"):
        isa.require_feature("add.bf16x2", kp.arch)
    if mod.get("oob"):
        raise kp.unsupported("fma.oob")
    kw = dict(ftz=bool(mod.get("ftz")), sat=bool(mod.get("sat")), relu=bool(mod.get("relu")))
    names = ("a", "b", "c") if op == "fma" else ("a", "b")
    return _elementwise(kp, ops, "d", names, lambda *xs: ptx.half_arith(op, t, *xs, **kw), site)


@_family("bfe")
def _bfe(kp, ops, mod, site):
    t = mod["type"]
    if t not in ("u32", "s32"):
        raise kp.unsupported(f"bfe.{t} (the interpreter implements bfe.u32 and bfe.s32)")
    f = ptx.bfe_u32 if t == "u32" else ptx.bfe_s32
    return _elementwise(kp, ops, "d", ("a", "b", "c"), f, site)


@_family("set")
def _set(kp, ops, mod, site):
    cmp, dt, stype = mod["cmp"], mod["dtype"], mod["stype"]
    if cmp not in ("eq", "ne") or dt != "u32" or stype not in ("u32", "b32", "s32"):
        raise kp.unsupported(f"set.{cmp}.{dt}.{stype} (the interpreter implements set.{{eq,ne}}.u32 on 32-bit ints)")
    return _elementwise(kp, ops, "d", ("a", "b"), lambda a, b: ptx.set_cmp(cmp, a, b), site)


@_family("add", "sub", "mul", "fma")
def _f32(kp, ops, mod, site):
    t = mod["type"]
    fam = ops.family
    rnd = mod.get("rnd") or "rn"
    ftz, sat = bool(mod.get("ftz")), bool(mod.get("sat"))
    directed_fma = fam == "fma" and rnd != "rn" and not ftz and not sat
    if t != "f32" or mod.get("srctype") or (rnd != "rn" and not directed_fma):
        raise kp.unsupported(f"{fam}.{rnd}.{t} (the interpreter implements .rn.f32 and fma.{{rz,rm,rp}}.f32)")
    names = ("a", "b", "c") if fam == "fma" else ("a", "b")
    return _elementwise(kp, ops, "d", names, lambda *xs: ptx.f32_arith(fam, *xs, rnd=rnd, ftz=ftz, sat=sat), site)


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
    if dtype not in ptx.SCALAR_TYPES or atype not in ptx.SCALAR_TYPES:
        raise kp.unsupported(f"cvt.{dtype}.{atype}")
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
        raise kp.unsupported(f"{fam.split('_')[0]}.{space or 'generic'} (the interpreter implements the shared "
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
        thr = active_threads(st)
        if len(thr) == 0:
            return
        a = faddr(st)
        if space.startswith("shared"):
            addr = shared_addresses(st, a, site)[thr]
            if store:
                vals = np.stack([as_thread_vector(st, f(st)).astype(UINT_OF_SIZE[width]) for f in regs], -1)[thr]
                shared_rows(st, site, addr, thr, total, what, write=True,
                      data=vals.view(np.uint8).reshape(len(thr), total), align=total)
            else:
                raw = shared_rows(st, site, addr, thr, total, what, align=total)
            full = np.zeros(st.T, np.int64)
            full[thr] = addr
            act = None if st.mask is None else st.mask
            st.rec.bank(st, site, what, full, total, act)
        else:
            ptrs = as_thread_vector(st, np.asarray(a, np.int64))[thr]
            if store:
                vals = np.stack([as_thread_vector(st, f(st)).astype(UINT_OF_SIZE[width]) for f in regs], -1)[thr]
                global_write(st, site, ptrs, vals.view(np.uint8).reshape(len(thr), total), thr, what)
            else:
                raw = global_bytes(st, site, ptrs, np.full(len(thr), total), total, thr, what)
        if not store:
            vals = raw.view(UINT_OF_SIZE[width]).reshape(len(thr), vec)
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
        sel = full_warps(st, site, f"shfl.sync.{mode}")
        if sel is None:
            return
        wsel, thr = sel
        v = as_thread_vector(st, fa(st)).reshape(st.W, 32)[wsel]
        b = as_thread_vector(st, fb(st)).reshape(st.W, 32)[wsel]
        c = as_thread_vector(st, fc(st)).reshape(st.W, 32)[wsel]
        d, p = ptx.shfl(v, mode, b, c)
        wd(st, d.reshape(-1), thr)
        if wp is not None:
            wp(st, p.reshape(-1), thr)
        st.rec.count("shfl", len(wsel))
    return run




#: atom / red operations on 32-bit integers: new value from (old, operand), on uint32 bit patterns (signed min / max
#: compare as int32)
_ATOM_INT_OPS = {
    "add": lambda o, v, s: (o + v) & 0xFFFFFFFF,
    "and": lambda o, v, s: o & v, "or": lambda o, v, s: o | v, "xor": lambda o, v, s: o ^ v,
    "min": lambda o, v, s: (min(o, v, key=lambda x: x - (1 << 32) if s and x >> 31 else x)),
    "max": lambda o, v, s: (max(o, v, key=lambda x: x - (1 << 32) if s and x >> 31 else x)),
    "inc": lambda o, v, s: 0 if o >= v else o + 1, "dec": lambda o, v, s: v if o == 0 or o > v else o - 1,
}


@_family("atom", "red")
def _atom(kp, ops, mod, site):
    # global-memory atomics, one active thread after another in thread order (a serialization the hardware may
    # also choose); atom returns each thread's old value. CTAs run one after another here, so an atomic counter
    # between CTAs sees the arrivals in CTA order.
    fam = ops.family
    space, op, typ = mod.get("space", ""), mod["op"], mod["type"]
    what = f"{fam}.{space or 'generic'}.{op}.{typ}"
    if space not in ("global", ""):
        raise kp.unsupported(f"{what} (the interpreter implements global atomics)")
    if typ not in ("s32", "u32", "b32") or (typ == "b32" and op not in ("and", "or", "xor")):
        raise kp.unsupported(f"{what} (the interpreter implements 32-bit integer atomics: "
                             f"{choices(sorted(_ATOM_INT_OPS))} on .s32 / .u32, and / or / xor on .b32)")
    signed = typ == "s32"
    faddr = ops.value("addr")
    (fval,) = ops.bits("value")
    wd = ops.writers("d")[0] if fam == "atom" else None

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        ptrs = as_thread_vector(st, np.asarray(faddr(st), np.int64))[thr]
        vals = as_thread_vector(st, fval(st)).astype(np.int64)[thr] & 0xFFFFFFFF
        olds = np.zeros(len(thr), np.uint32)
        for k in range(len(thr)):
            one = np.array([k])
            raw = global_bytes(st, site, ptrs[one], np.array([4]), 4, thr[one], what)
            old = int(raw.view(np.uint32)[0, 0])
            new = _ATOM_INT_OPS[op](old, int(vals[k]), signed)
            global_write(st, site, ptrs[one], np.array([new], np.uint32).view(np.uint8).reshape(1, 4), thr[one],
                         what)
            olds[k] = old
        if wd is not None:
            wd(st, olds.view(np.int32) if signed else olds, thr)
        st.rec.count("atomics", len(thr))
    return run
