"""TMA tensor copies bound to the machine: ``cp.async.bulk.tensor.{1..5}d`` loads (global -> shared, completing on an
mbarrier) and stores (shared -> global, bulk async-groups), with the semantics of ``mmaemit.ptx.tma``; L2 prefetches
(``cp.async.bulk.prefetch.tensor``) are checked (map, rank) and have no effect.

Model. A load reads the global box when issued and lands it later: it writes shared memory, as the TMA agent of the
mbarrier it signals (``sync_exec``), and completes ``complete_tx`` of the box's bytes on that barrier's current phase
only when nothing else in the CTA can make progress (``machine.land_async``), first for the wait of the context
that ran last, so copies land in any order and as late as a legal schedule allows. Until then its bytes are in
flight: reading them is a ``tma_before_wait`` error (e.g. a parity wait that passed on an earlier phase of the
barrier, which a ring whose waiters do not meet every round of a stage allows), writing them a race, and a CTA that
ends with a load in flight a ``tma_before_wait`` error. Landed bytes are ordered only for warps that waited for a
phase that includes the load (or learned of it through later synchronization): reading them earlier is a
``tma_before_wait`` error, overwriting shared memory that warps read without a release / acquire chain (the ring's
"empty" barrier, checked when the load is issued) is a race. A store reads its shared box when
issued (through the async proxy: generic writes need a ``fence.proxy.async`` first), writes the in-tensor elements to
global memory, and keeps the shared bytes "being read" until a ``cp.async.bulk.wait_group.read`` (or ``wait_group``)
of the issuing thread retires its bulk group: writing them earlier is a ``tma_before_wait`` error, and so is a CTA
that ends with such reads outstanding. Clusters are of one CTA: ``.multicast::cluster`` is not implemented.

Shared destinations and sources must be 128-byte aligned. Each 16-byte chunk a load writes records the global offset
of its first element, which lets ``wgmma_exec`` check that a matrix descriptor reads the tile the way the tensor
map's box and swizzle laid it out (``tma_layout_mismatch``).

Copies the H100 was measured to reject with an illegal instruction (``mmaemit.ptx.tma.hardware_fault``: a store whose
box starts at a negative coordinate; a rank-1 copy whose box is not entirely inside the tensor) are "tma" errors,
instead of being filled / clipped silently.
"""
from __future__ import annotations

import numpy as np

from .. import isa
from ..ptx.mbarrier import MbarrierStateError
from ..ptx.tma import TensorMap, box_chunk_origins, box_smem_addresses, gather_box, hardware_fault, scatter_box
from .access import active_threads, as_thread_vector, shared_addresses, shared_check, shared_fault
from .memory import OFFSET_MASK, REGION_SHIFT, SHARED_RID
from .ptxcall import family_registry
from .sync_exec import mbarrier_entry, mbarrier_release

__all__ = ["FAMILIES", "BulkGroups", "setup_cta", "finish_cta", "SMEM_ALIGN"]

#: family name -> compile function (filled by ``@_family`` below)
FAMILIES, _family = family_registry()

#: required alignment of a tensor copy's shared address
SMEM_ALIGN = 128


class BulkGroups:
    """Per-thread bulk async-groups of one CTA (TMA stores whose shared-memory reads are in flight)."""

    def __init__(self, T):
        self.committed = np.zeros(T, np.int64)
        self.ops = []      # (thread, group, shared bytes (N,), description)


def setup_cta(st):
    """Before a CTA of a kernel with tensor copies: no bulk groups, no loads in flight, no tensor maps seen."""
    st.bulk = BulkGroups(st.T)
    st.units["tma_maps"] = []
    st.units["tma_loads"] = []
    st.units.setdefault("landers", []).append(_land)


def _land(st, barriers) -> bool:
    """Land the loads in flight that signal one of ``barriers`` (all of them, in issue order), or with None the
    oldest load; False when there is none."""
    loads = st.units["tma_loads"]
    if barriers is None:
        pick = loads[:1]
    else:
        want = {int(a) for a in barriers}
        pick = [ld for ld in loads if ld["e"].addr in want]
    if not pick:
        return False
    chosen = {id(ld) for ld in pick}
    loads[:] = [ld for ld in loads if id(ld) not in chosen]
    for ld in pick:
        smem, b, e = st.smem, ld["b"], ld["e"]
        np.add.at(smem.tma_pending, b, -1)
        smem.note_writes(b, np.full(len(b), e.agent, np.int64), clock=ld["clock"], initialize=True, generic=False)
        smem.data[b] = ld["data"]
        smem.tma_origin[ld["chunk"]] = ld["origin"]
        smem.tma_map[ld["chunk"]] = ld["map"]
        try:
            mbarrier_release(st, e, ld["know"], tx_done=ld["tx"])
        except MbarrierStateError as err:
            st.rec.fault(st, "mbarrier", ld["site"], f"{ld['what']}: {err} ({e.name})", thread=ld["t"])
    return True


def finish_cta(st):
    """End of a CTA: TMA loads still in flight into, and TMA stores still reading, shared memory that is about to be
    freed."""
    loads = st.units.get("tma_loads")
    if loads:
        ld = loads[0]
        shared_fault(st, None, "tma_before_wait", int(ld["b"][0]), ld["t"],
                     f"the CTA finished with {len(loads)} TMA load(s) in flight into its shared memory (first: "
                     f"{ld['what']} on {ld['e'].name}); wait for their mbarrier phase before the CTA exits")
        loads.clear()
    if st.bulk is not None and st.bulk.ops:
        t, _g, b, desc = st.bulk.ops[0]
        shared_fault(st, None, "tma_before_wait", int(b[0]), int(t),
                     f"the CTA finished with {len(st.bulk.ops)} TMA store(s) whose shared-memory reads were never "
                     f"waited for (first: {desc}); wait with cp.async.bulk.wait_group.read before the CTA exits")


def _map_id(st, tm):
    maps = st.units["tma_maps"]
    for i, m in enumerate(maps):
        if m is tm:
            return i
    maps.append(tm)
    return len(maps) - 1


def _tensor_map(st, site, v, thread, what):
    if isinstance(v, np.ndarray) and v.dtype == object:
        v = v.flat[0]
    if not isinstance(v, TensorMap):
        st.rec.fault(st, "tma", site, f"{what}: the tensor-map operand is not a tensor map encoded on the host "
                     f"(pass T.address_of(map) of a T.tensormap_encode_tiled map)", thread=int(thread))
        return None
    return v


def _global_region(st, site, tm, thread, what):
    region = st.regions.get(int(tm.global_address) >> REGION_SHIFT)
    if region is None or region.rid == SHARED_RID:
        st.rec.fault(st, "tma", site, f"{what}: {tm.describe()} does not point into a global buffer",
                     thread=int(thread))
        return None, 0
    return region, int(tm.global_address) & OFFSET_MASK


def _box_bytes(st, site, tm, addr, thread, what):
    """Shared byte addresses (N * elem,) of the box at shared address ``addr`` (None after reporting a bad one)."""
    smem = st.smem
    if addr % SMEM_ALIGN:
        st.rec.fault(st, "misaligned", site, f"{what}: shared address {addr} is not {SMEM_ALIGN}-byte aligned",
                     thread=int(thread), buffer="shared", index=int(addr))
        return None, None
    elems = box_smem_addresses(tm, addr)
    b = (elems[:, None] + np.arange(tm.elem_bytes)).reshape(-1)
    if b.min() < 0 or b.max() >= smem.nbytes:
        st.rec.fault(st, "out_of_bounds", site, f"{what}: the {tm.box_bytes}-byte box at shared address {addr} "
                     f"extends past the CTA's {smem.nbytes}-byte shared memory ({tm.describe()})",
                     thread=int(thread), buffer="shared", index=int(addr))
        return None, None
    return elems, b


def _check_rank(st, site, tm, coords, thread, what):
    if len(coords) != tm.rank:
        st.rec.fault(st, "tma", site, f"{what}: a {len(coords)}d copy through a rank-{tm.rank} tensor map "
                     f"({tm.describe()})", thread=int(thread))
        return False
    return True


def _check_hardware(st, site, tm, coords, thread, what, store):
    """Report a copy the H100 rejects (``mmaemit.ptx.tma.hardware_fault``); the copy then runs as modelled (filled /
    clipped), so that ``on_error="report"`` goes on to the rest of the kernel."""
    msg = hardware_fault(tm.global_dims, tm.box_dims, coords, store=store)
    if msg is not None:
        st.rec.fault(st, "tma", site, f"{what}: {msg} ({tm.describe()})", thread=int(thread))


def _load(st, site, t, tm, coords, dst, bar, what):
    if not _check_rank(st, site, tm, coords, t, what):
        return
    _check_hardware(st, site, tm, coords, t, what, store=False)
    region, base = _global_region(st, site, tm, t, what)
    if region is None:
        return
    elems, b = _box_bytes(st, site, tm, dst, t, what)
    if b is None:
        return
    e = mbarrier_entry(st, site, bar, what, t)
    if e is None:
        return
    data, _inb, outside = gather_box(tm, region.data, base, coords)
    if outside.any():
        st.rec.fault(st, "out_of_bounds", site, f"{what}: {tm.describe()} at coordinates {list(coords)} reads past "
                     f"the end of global buffer {region.name} ({region.nbytes} bytes)", thread=int(t),
                     buffer=region.name)
    smem = st.smem
    clocks = smem.clocks
    w = int(st.warp_of[t])
    know = clocks.widen(clocks.release(w))        # the copy is ordered after everything its issuer did
    know[e.agent] = clocks.agent_tick(e.agent)
    agent = np.full(len(b), e.agent, np.int64)
    if (smem.wg_reading[b] > 0).any():
        k = int(np.argmax(smem.wg_reading[b] > 0))
        shared_fault(st, site, "wgmma_before_wait", b[k], int(t), f"{what} overwrites shared memory that a "
                     f"wgmma.mma_async in flight reads (missing wgmma.wait_group before refilling the stage)")
    if (smem.bulk_reading[b] > 0).any():
        k = int(np.argmax(smem.bulk_reading[b] > 0))
        shared_fault(st, site, "tma_before_wait", b[k], int(t), f"{what} overwrites shared memory that a TMA store "
                     f"in flight still reads (missing cp.async.bulk.wait_group.read)")
    race = smem.write_hazards(b, agent, know)
    if race.any():
        k = int(np.argmax(race))
        shared_fault(st, site, "race", b[k], int(t),
                     f"shared-memory race: {what} (issued by warp {w}) overwrites shared memory with no ordering "
                     f"after {smem.conflicts(int(b[k]), int(e.agent), 'write', know)} (missing wait on the barrier "
                     f"the readers release, e.g. the ring's 'empty' mbarrier)")
    tp = smem.tma_pending[b] > 0
    if tp.any():
        k = int(np.argmax(tp))
        shared_fault(st, site, "race", b[k], int(t), f"{what} writes shared memory that another TMA load in flight "
                     f"also writes (its mbarrier phase was not waited for)")
    per = max(16 // tm.elem_bytes, 1)
    chunk = elems[::per] // 16
    # in flight until it lands (machine.land_async -> _land): the bytes are the TMA agent's from now on
    np.add.at(smem.tma_pending, b, 1)
    st.units["tma_loads"].append({"b": b, "data": data.reshape(-1), "e": e, "know": know, "clock": know[e.agent],
                                  "tx": tm.box_bytes, "chunk": chunk, "origin": base + box_chunk_origins(tm, coords),
                                  "map": _map_id(st, tm), "t": int(t), "site": site, "what": what})
    st.rec.count("tma.load")


def _store(st, site, t, tm, coords, src, what):
    if not _check_rank(st, site, tm, coords, t, what):
        return
    _check_hardware(st, site, tm, coords, t, what, store=True)
    region, base = _global_region(st, site, tm, t, what)
    if region is None:
        return
    _elems, b = _box_bytes(st, site, tm, src, t, what)
    if b is None:
        return
    smem = st.smem
    shared_check(st, site, b[None, :], np.asarray([t]), write=False)
    unf = smem.unfenced[b]
    if unf.any():
        k = int(np.argmax(unf))
        shared_fault(st, site, "missing_proxy_fence", b[k], int(t),
                     f"{what} reads shared memory written through the generic proxy (st.shared / stmatrix) by warp "
                     f"{int(smem.w_warp[b[k]])} with no fence.proxy.async by that warp in between (TMA reads shared "
                     f"memory through the async proxy)")
    data = smem.data[b].reshape(-1, tm.elem_bytes)
    _inb, outside = scatter_box(tm, region.data, base, coords, data)
    if outside.any():
        st.rec.fault(st, "out_of_bounds", site, f"{what}: {tm.describe()} at coordinates {list(coords)} writes past "
                     f"the end of global buffer {region.name} ({region.nbytes} bytes)", thread=int(t),
                     buffer=region.name)
    np.add.at(smem.bulk_reading, b, 1)
    st.bulk.ops.append((int(t), int(st.bulk.committed[t]), b, f"{what} at coordinates {list(coords)}"))
    st.rec.count("tma.store")


def _thread_maps(st, site, ftmap, fcoords, thr, what):
    """(index, thread, tensor map, coordinates) of each active thread ``thr`` that issues a tensor op through a valid
    map (an invalid one is reported by ``_tensor_map`` and skipped)."""
    tmv = ftmap(st)
    coords = np.stack([as_thread_vector(st, np.asarray(f(st), np.int64)) for f in fcoords], -1)[thr]
    for i, t in enumerate(thr):
        tm = _tensor_map(st, site, tmv, t, what)
        if tm is not None:
            yield i, t, tm, [int(x) for x in coords[i]]


@_family("cp_async_bulk_tensor_g2s_cluster", "cp_async_bulk_tensor_g2s_cta", "cp_async_bulk_tensor_s2g")
def _tensor_copy(kp, ops, mod, site):
    isa.require_feature("cp.async.bulk", kp.arch)
    load = ops.family != "cp_async_bulk_tensor_s2g"
    if mod.get("load_mode") not in (None, "", "tile"):
        raise kp.unsupported(f"cp.async.bulk.tensor .{mod['load_mode']} (the interpreter implements .tile)")
    if mod.get("multicast"):
        raise kp.unsupported("cp.async.bulk.tensor .multicast::cluster (the interpreter runs clusters of one CTA)")
    if mod.get("cta_group"):
        raise kp.unsupported(f"cp.async.bulk.tensor .{mod['cta_group']}")
    dim = int(mod["dim"][0])
    what = (f"cp.async.bulk.tensor.{dim}d." + ("shared::cluster.global.mbarrier::complete_tx::bytes" if load
                                               else "global.shared::cta.bulk_group"))
    ftmap = ops.value("tmap")
    fcoords = [kp.expr(n) for n in ops.nodes("coords")]
    fsmem = ops.value("dst_mem" if load else "src_mem")
    fbar = ops.value("mbar") if load else None

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        smem_addr = shared_addresses(st, fsmem(st), site)[thr]
        bars = shared_addresses(st, fbar(st), site)[thr] if load else None
        for i, t, tm, c in _thread_maps(st, site, ftmap, fcoords, thr, what):
            if load:
                _load(st, site, int(t), tm, c, int(smem_addr[i]), int(bars[i]), what)
            else:
                _store(st, site, int(t), tm, c, int(smem_addr[i]), what)
    return run


@_family("cp_async_bulk_tensor_prefetch")
def _tensor_prefetch(kp, ops, mod, site):
    # an L2 hint with no effect on memory contents: checked like a load (a valid map of the copy's rank), then dropped
    isa.require_feature("cp.async.bulk", kp.arch)
    if mod.get("load_mode") not in (None, "", "tile"):
        raise kp.unsupported(f"cp.async.bulk.prefetch.tensor .{mod['load_mode']} (the interpreter implements .tile)")
    dim = int(mod["dim"][0])
    what = f"cp.async.bulk.prefetch.tensor.{dim}d.L2.global.tile"
    ftmap = ops.value("tmap")
    fcoords = [kp.expr(n) for n in ops.nodes("coords")]

    def run(st):
        thr = active_threads(st)
        if len(thr) == 0:
            return
        for _i, t, tm, c in _thread_maps(st, site, ftmap, fcoords, thr, what):
            if _check_rank(st, site, tm, c, t, what):
                st.rec.count("tma.prefetch")
    return run


@_family("cp_async_bulk_commit_group")
def _commit(kp, ops, mod, site):
    isa.require_feature("cp.async.bulk", kp.arch)

    def run(st):
        st.bulk.committed[active_threads(st)] += 1
    return run


@_family("cp_async_bulk_wait_group")
def _wait(kp, ops, mod, site):
    isa.require_feature("cp.async.bulk", kp.arch)
    n = ops.imm("group")

    def run(st):
        waiting = np.zeros(st.T, bool)
        waiting[active_threads(st)] = True
        keep = []
        for op in st.bulk.ops:
            t, g, b, _desc = op
            if waiting[t] and g < st.bulk.committed[t] - n:
                np.add.at(st.smem.bulk_reading, b, -1)
            else:
                keep.append(op)
        st.bulk.ops = keep
    return run
