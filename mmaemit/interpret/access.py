"""Memory accesses of the interpreted kernel with their checks: bounds, alignment, the shared-memory shadow state
(uninitialized reads, races, reads of data in flight), bank-conflict accounting, and the thread sets that execute an
instruction (the active threads, the fully active warps).

Everything here works on a CTA state ``st`` (``machine.CTAState``): ``st.smem`` (``memory.SharedMemory``),
``st.regions``, ``st.mask`` (None = all threads active), ``st.rec`` (``machine.Recorder``).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedConfigError
from .memory import OFFSET_MASK, REGION_SHIFT, SHARED_RID

#: threads of a warpgroup (4 consecutive warps)
WARPGROUP = 128

__all__ = ["WARPGROUP", "full_warpgroups", "warpgroup_threads", "MemRef", "first_flagged", "as_thread_vector", "active_threads", "full_warps", "mem_read", "mem_write",
           "shared_check", "shared_fault", "cvta_to_shared", "shared_addresses", "shared_rows", "global_bytes",
           "global_write", "proxy_fence"]


class MemRef:
    """Runtime binding of a shared/global buffer: its region, typed flat view and element offset into it."""

    __slots__ = ("region", "arr", "elem0", "limit", "item")

    def __init__(self, region, npdt, byte_off):
        self.region = region
        self.item = npdt.itemsize
        if byte_off % self.item:
            raise UnsupportedConfigError(f"buffer view at byte offset {byte_off} is not aligned to its "
                                         f"{self.item}-byte elements")
        self.arr = region.view(npdt)
        self.elem0 = byte_off // self.item
        self.limit = self.arr.size


def first_flagged(bad):
    """Index of the first thread flagged in ``bad`` (T,) or (T, L)."""
    b = np.asarray(bad)
    if b.ndim > 1:
        b = b.reshape(b.shape[0], -1).any(axis=1)
    return int(np.argmax(b))


def describe_element(st, ref, elem, meta):
    """(buffer name, flat index, detail text) for an element of a buffer access."""
    name = meta.name if meta is not None else ref.region.name
    flat = int(elem) - ref.elem0 - (meta.elem_offset if meta is not None else 0)
    detail = ""
    if ref.region.rid == SHARED_RID:
        _n, _e, text = st.smem.describe(int(elem) * ref.item)
        detail = text
    elif ref.region.shape is not None:
        try:
            idx = np.unravel_index(int(elem), ref.region.shape)
            detail = f"{ref.region.name}[{', '.join(str(int(i)) for i in idx)}]"
        except ValueError:
            detail = ""
    return name, flat, detail


def per_thread_index(st, elem):
    """Element indices broadcast to (T,) or (T, L)."""
    e = np.asarray(elem, np.int64)
    if e.ndim == 0:
        return np.broadcast_to(e, (st.T,))
    if e.ndim == 1 and e.shape[0] != st.T:
        return np.broadcast_to(e, (st.T, e.shape[0]))
    return e


def bounds_mask(st, ref, e, meta, site, act):
    """Mask of in-bounds per-thread accesses (reporting the first violation)."""
    bad = (e < 0) | (e >= ref.limit)
    if act is not None:
        bad = bad & (act[:, None] if bad.ndim == 2 else act)
    if bad.any():
        t = first_flagged(bad)
        ei = e[t] if e.ndim == 1 else e[t][np.argmax(bad[t])]
        name, flat, detail = describe_element(st, ref, ei, meta)
        st.rec.fault(st, "out_of_bounds", site,
                     f"{ref.region.scope} access to {name}[{flat}] is outside the {ref.region.nbytes}-byte "
                     f"{ref.region.scope} allocation {ref.region.name}", thread=t, buffer=name, index=flat,
                     detail=detail)
        ok_thr = ~bad if bad.ndim == 1 else ~bad.any(axis=1)
        return ok_thr if act is None else (act & ok_thr)
    return act


def shared_check(st, site, b, thr, write, name_hint=None, initialize=True):
    """Shadow-state checks and bookkeeping for shared bytes ``b`` (N, width) accessed by threads ``thr`` (N,)."""
    smem = st.smem
    width = b.shape[1]
    bf = b.reshape(-1)
    w = np.repeat(st.warp_of[thr], width).astype(np.int64)
    if write:
        # asynchronous operations in flight on the bytes: (their counters, the fault kind, what the write breaks)
        for busy, kind, what in (
                (smem.wg_reading, "wgmma_before_wait", "a wgmma.mma_async in flight reads (missing wgmma.wait_group "
                                                       "before overwriting its operand)"),
                (smem.tma_pending, "race", "a TMA load in flight also writes (its mbarrier phase was not waited for)"),
                (smem.bulk_reading, "tma_before_wait", "a TMA store in flight still reads (missing "
                                                       "cp.async.bulk.wait_group.read before reusing the buffer)")):
            hit = busy[bf] > 0
            if hit.any():
                k = int(np.argmax(hit))
                shared_fault(st, site, kind, bf[k], int(thr[k // width]), f"write to shared memory that {what}")
        race = smem.write_hazards(bf, w)
        if race.any():
            k = int(np.argmax(race))
            shared_fault(st, site, "race", bf[k], int(thr[k // width]),
                         f"shared-memory race: write by warp {int(w[k])} conflicts with "
                         f"{smem.conflicts(int(bf[k]), int(w[k]), 'write')} with no barrier in between")
        smem.note_writes(bf, w, initialize=initialize)
        return
    pend, tpend, uninit, race = smem.read_hazards(bf, w)
    if tpend.any():
        k = int(np.argmax(tpend))
        shared_fault(st, site, "tma_before_wait", bf[k], int(thr[k // width]),
                     "read of shared memory that a TMA load writes, before waiting for the mbarrier phase the load "
                     "completes: the data has not landed (no wait, or a parity wait that passed on an earlier phase "
                     "of the barrier)")
    if pend.any():
        k = int(np.argmax(pend))
        shared_fault(st, site, "cp_async_before_wait", bf[k], int(thr[k // width]),
                     "read of shared memory whose cp.async data has not landed (missing cp.async.wait_group / "
                     "wait_all before this read)")
    if uninit.any():
        k = int(np.argmax(uninit))
        shared_fault(st, site, "uninitialized_read", bf[k], int(thr[k // width]),
                     "read of shared memory that no thread has written")
    if race.any():
        agent = race & (smem.w_warp[bf] >= smem.clocks.W)
        if agent.any():
            k = int(np.argmax(agent))
            x = int(smem.w_warp[bf[k]])
            shared_fault(st, site, "tma_before_wait", bf[k], int(thr[k // width]),
                         f"read by warp {int(w[k])} of shared memory that a TMA load writes, before waiting for the "
                         f"mbarrier phase that load completes ({smem.clocks.writer_name(x)}): wait on that mbarrier "
                         f"(mbarrier.try_wait.parity) before reading the tile")
        plain = race & ~agent
        if plain.any():
            k = int(np.argmax(plain))
            shared_fault(st, site, "race", bf[k], int(thr[k // width]),
                         f"shared-memory race: read by warp {int(w[k])} of data written by warp "
                         f"{int(smem.w_warp[bf[k]])} with no barrier in between")
    smem.note_reads(bf, w)


def shared_fault(st, site, kind, byte, thread, message):
    name, elem, text = st.smem.describe(int(byte))
    st.rec.fault(st, kind, site, message, thread=thread, buffer=name, index=elem,
                 detail=text or f"shared byte {int(byte)}")


def mem_read(st, ref, meta, idx, site):
    """Load of ``meta`` buffer elements ``idx`` (scalar, (T,), (L,) or (T, L)) through the runtime binding ``ref``."""
    off = ref.elem0 + meta.elem_offset
    act = st.mask
    arr = ref.arr
    if np.ndim(idx) == 0 and act is None and ref.region.rid != SHARED_RID:
        e = int(idx) + off
        if 0 <= e < ref.limit:
            return arr[e]
    e = per_thread_index(st, np.asarray(idx, np.int64) + off)
    ok = bounds_mask(st, ref, e, meta, site, act)
    if ok is not None:      # inactive or out-of-bounds threads must not index (their addresses may be garbage)
        e = np.where(ok[:, None] if e.ndim == 2 else ok, e, 0)
    if ref.region.rid == SHARED_RID:
        _plain_shared_access(st, site, ref, e, ok, write=False, meta=meta)
    out = arr[e]
    if np.ndim(idx) == 0 and st.mask is None and ok is None:
        return out[0]
    if np.ndim(idx) == 1 and np.asarray(idx).shape[0] != st.T and st.mask is None and ok is None:
        return out[0]
    return out


def mem_write(st, ref, meta, idx, value, site):
    off = ref.elem0 + meta.elem_offset
    act = st.mask
    e = per_thread_index(st, np.asarray(idx, np.int64) + off)
    ok = bounds_mask(st, ref, e, meta, site, act)
    if ok is not None and not ok.any():
        return
    v = np.broadcast_to(np.asarray(value).astype(ref.arr.dtype, copy=False), e.shape)
    if ref.region.rid == SHARED_RID:
        _plain_shared_access(st, site, ref, e, ok, write=True, meta=meta)
    if ok is None:
        ref.arr[e] = v
    else:
        ref.arr[e[ok]] = v[ok]


def _plain_shared_access(st, site, ref, e, act, write, meta):
    """Shadow checks and bank-conflict accounting of a plain shared load/store (per-thread element indices e)."""
    item = ref.item
    thr = st.tid if act is None else np.nonzero(act)[0]
    ee = e[thr]
    if ee.ndim == 1:
        ee = ee[:, None]
    b = ((ee * item)[:, :, None] + np.arange(item)).reshape(len(thr), -1)
    shared_check(st, site, b, thr, write)
    lanes = ee.shape[1]
    contiguous = lanes == 1 or bool((np.diff(ee, axis=1) == 1).all())
    start = np.zeros(st.T, np.int64)
    start[thr] = ee[:, 0] * item
    st.rec.bank(st, site, "st.shared" if write else "ld.shared", start, item * lanes if contiguous else item, act)


def cvta_to_shared(st, p, site):
    """``__cvta_generic_to_shared``: generic pointer -> 32-bit shared-window address."""
    p = np.asarray(p, np.int64)
    rid = p >> REGION_SHIFT
    bad = rid != SHARED_RID
    if st.mask is not None and bad.ndim:
        bad = bad & st.mask
    if np.any(bad):
        t = int(np.argmax(bad)) if bad.ndim else None
        st.rec.fault(st, "out_of_bounds", site, "cvta.to.shared of a pointer that does not point into shared memory",
                     thread=t)
    out = (p & OFFSET_MASK).astype(np.uint32)
    return out[()] if out.ndim == 0 else out


def as_thread_vector(st, v):
    """A uniform or per-thread value as a (T,) array."""
    return np.broadcast_to(np.asarray(v), (st.T,))


def full_warps(st, site, what):
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


def shared_addresses(st, v, site):
    """Shared-window byte addresses (T,) int64 from a shared-space address operand (uint32 or generic pointer)."""
    a = np.asarray(v)
    if a.size and int(a.max()) >= (1 << 32):       # a generic pointer (region id in the high bits): cvta it
        a = np.asarray(cvta_to_shared(st, a, site))
    return as_thread_vector(st, a.astype(np.int64))


def shared_rows(st, site, starts, thr, width, what, write=False, data=None, align=None):
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
        shared_check(st, site, b, t, write)
    if write:
        smem.data[b] = data[ok]
        return None
    out = np.zeros((len(starts), width), np.uint8)
    out[ok] = smem.data[b]
    return out


def global_bytes(st, site, ptrs, counts, width, thr, what):
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


def global_write(st, site, ptrs, data, thr, what):
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


def active_threads(st):
    """Indices of the active threads (all threads when ``st.mask`` is None)."""
    return st.tid if st.mask is None else np.nonzero(st.mask)[0]


def proxy_fence(st):
    """``fence.proxy.async``: generic-proxy shared writes of the executing warps become visible to the async proxy."""
    smem = st.smem
    if st.mask is None:
        smem.unfenced[:] = False
        return
    warps = np.unique(st.warp_of[active_threads(st)])
    if len(warps):
        smem.unfenced[np.isin(smem.w_warp, warps.astype(smem.w_warp.dtype))] = False


def full_warpgroups(st, site, what, family="wgmma"):
    """(warpgroup indices, thread indices) of the fully active warpgroups; partial ones are divergence errors."""
    nwg = st.W // 4
    act = np.ones(st.T, bool) if st.mask is None else st.mask
    tail = act[nwg * WARPGROUP:]
    if tail.any():
        t = nwg * WARPGROUP + int(np.argmax(tail))
        st.rec.fault(st, "divergence", site, f"{what} executed by warp {t // 32}, which is not part of a complete "
                     f"warpgroup ({st.W} warps per CTA): {family} needs 4 consecutive warps", thread=t)
    m = act[: nwg * WARPGROUP].reshape(nwg, WARPGROUP)
    full = m.all(axis=1)
    part = m.any(axis=1) & ~full
    if part.any():
        g = int(np.argmax(part))
        st.rec.fault(st, "divergence", site, f"{what} executed by {int(m[g].sum())} of the {WARPGROUP} threads of "
                     f"warpgroup {g}: .sync.aligned {family} instructions need every thread of the warpgroup",
                     thread=g * WARPGROUP + int(np.argmin(m[g])))
    return np.nonzero(full)[0]


def warpgroup_threads(g):
    """Thread indices of warpgroup ``g``."""
    return g * WARPGROUP + np.arange(WARPGROUP)
