"""The compiler: a lowered device PrimFunc turned once into Python closures over the machine state (``machine``).

Statements (loops, branches, bindings, buffer allocations and stores) are compiled here; expressions and builtin calls
by ``intrinsics``; ``T.ptx`` instructions by ``ptx_exec`` and ``wgmma_exec`` (their families are looked up in
``PTX_FAMILIES``). Those modules receive the ``KernelProgram`` being built and use its public compile-time API:
``expr(e)`` (closure of an expression), ``buffer(node)`` (a buffer's ``BufMeta``), ``const(e)`` (a constant index or
None), ``unsupported(what)`` (the error to raise) and ``site`` (the statement being compiled).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedConfigError
from . import intrinsics, ptx_exec, wgmma_exec
from .access import MemRef, first_flagged, mem_read, mem_write
from .machine import Site, cta_barrier
from .memory import OFFSET_MASK, POISON, REGION_SHIFT
from .ptxcall import compile_ptx_call
from .values import NP_DTYPES, expr_dtype, is_py_int_dtype, np_dtype, split_dtype

__all__ = ["KernelProgram", "BufMeta", "PTX_FAMILIES"]

#: every ``T.ptx`` family the interpreter executes -> its compile function
PTX_FAMILIES = {**ptx_exec.FAMILIES, **wgmma_exec.FAMILIES}


class BufMeta:
    """Compile-time facts of one buffer of the lowered kernel: its slot in ``st.bufs``, name, numpy dtype, scope,
    constant shape (or None) and element offset; shared allocations also get their byte offset."""

    __slots__ = ("slot", "name", "npdt", "scope", "node", "shape", "elem_offset", "alloc_offset", "dyn")

    def __init__(self, slot, node):
        self.slot = slot
        self.node = node
        self.name = node.name
        self.npdt = np_dtype(node.dtype)
        if split_dtype(node.dtype)[1] != 1:
            raise UnsupportedConfigError(f"buffer {node.name} has vector dtype {node.dtype}; the interpreter "
                                         f"supports scalar element types")
        self.scope = node.scope()
        self.shape = [int(s) for s in node.shape] if all(hasattr(s, "value") for s in node.shape) else None
        eo = node.elem_offset
        self.elem_offset = int(eo.value) if hasattr(eo, "value") else None
        if self.elem_offset is None:
            raise UnsupportedConfigError(f"buffer {node.name} has a symbolic elem_offset")
        self.alloc_offset = None
        self.dyn = False


class KernelProgram:
    """A lowered device PrimFunc compiled to closures (built once per kernel and arch, reused for every CTA)."""

    def __init__(self, launch, arch, source_names):
        self.name = launch.kernel_name
        self.func = launch.device_func
        self.arch = arch
        self.slots = {}
        self.buf_index = {}
        self.bufs = []
        self.shared_allocs = []
        self.static_smem = 0
        self.site = None
        self.source_names = source_names
        self.thread_tags = {}
        self.dyn_align = 128          # alignment of the dynamic pool: the largest align= of its views (min 128)
        self.wgmma_bufs = wgmma_exec.operand_buffers(self.func)    # register buffers used as wgmma operands (hooked)
        self.cta_setup = []           # callables(st) run before each CTA (state of the instruction families used)
        self.cta_finish = []          # callables(st) run after each CTA (end-of-CTA checks)
        if self.wgmma_bufs:
            self.cta_setup.append(wgmma_exec.setup_cta)
            self.cta_finish.append(wgmma_exec.finish_cta)
        self.param_slots = [self._slot(p) for p in self.func.params]
        self.body = self._stmt(self.func.body)
        self.nslots = len(self.slots)

    # -- helpers ----------------------------------------------------------------------------------------------------

    def _slot(self, var):
        key = var.__chandle__()
        s = self.slots.get(key)
        if s is None:
            s = len(self.slots)
            self.slots[key] = s
        return s

    def buffer(self, node):
        """The ``BufMeta`` of a buffer node (created on first use)."""
        key = node.__chandle__()
        m = self.buf_index.get(key)
        if m is None:
            m = BufMeta(len(self.bufs), node)
            self.bufs.append(m)
            self.buf_index[key] = m
        return m

    def register_hook(self, buffer_node):
        """The hazard hook ``hook(st, slot, idx, site, name, write, thr=None)`` every ordinary access of a register
        buffer must call when the buffer is a wgmma operand (``wgmma_exec.register_access``), else None."""
        return wgmma_exec.register_access if buffer_node.__chandle__() in self.wgmma_bufs else None

    def unsupported(self, what):
        """The UnsupportedConfigError to raise for ``what``, located at the statement being compiled."""
        where = f" (at {self.site.text()})" if self.site is not None else ""
        return UnsupportedConfigError(f"the interpreter does not support {what}{where}")

    # -- statements -------------------------------------------------------------------------------------------------

    def _stmt(self, s):
        from tvm import tirx

        t = type(s)
        if t is tirx.SeqStmt:
            fns = [self._stmt(x) for x in s.seq]
            fns = [f for f in fns if f is not None]
            if len(fns) == 1:
                return fns[0]

            def seq(st, fns=tuple(fns)):
                for f in fns:
                    f(st)
            return seq
        prev = self.site
        self.site = Site(s, self.name)
        try:
            if t is tirx.Bind:
                return self._bind(s)
            if t is tirx.BufferStore:
                return self._store(s)
            if t is tirx.Evaluate:
                return self._evaluate(s)
            if t is tirx.For:
                return self._for(s)
            if t is tirx.IfThenElse:
                return self._if(s)
            if t is tirx.AttrStmt:
                return self._attr(s)
            if t is tirx.AllocBuffer:
                return self._alloc(s)
            if t is tirx.DeclBuffer:
                return self._decl(s)
            if t is tirx.While:
                return self._while(s)
            if t is tirx.AssertStmt:
                return self._assert(s)
            raise self.unsupported(f"{t.__name__} statements")
        finally:
            self.site = prev

    def _bind(self, s):
        slot = self._slot(s.var)
        fv = self.expr(s.value)

        def bind(st):
            v = fv(st)
            if type(v) is np.ndarray and v.base is not None:
                v = v.copy()     # a view into a register row must not change when the register does
            st.env[slot] = v
        return bind

    def _attr(self, s):
        key = str(s.attr_key)
        if key == "thread_extent":
            iv = s.node
            tag = str(iv.thread_tag)
            slot = self._slot(iv.var)
            body = self._stmt(s.body)
            self.thread_tags[tag] = slot
            if tag.startswith("blockIdx."):
                axis = "xyz".index(tag[-1])

                def bind_block(st):
                    st.env[slot] = int(st.cta[axis])
                    body(st)
                return bind_block
            if tag.startswith("threadIdx."):
                def bind_thread(st):
                    st.env[slot] = st.axes[tag]
                    body(st)
                return bind_thread
            raise self.unsupported(f"thread tag {tag}")
        return self._stmt(s.body)

    def _assert(self, s):
        fc = self.expr(s.condition)
        site = self.site

        def check(st):
            c = fc(st)
            bad = ~np.asarray(c, bool)
            if st.mask is not None and bad.ndim:
                bad = bad & st.mask
            if np.any(bad):
                st.rec.fault(st, "assert_failed", site, f"device assertion failed: {s.message}",
                             thread=first_flagged(bad) if np.ndim(bad) else None)
        return check

    def _alloc(self, s):
        meta = self.buffer(s.buffer)
        body = getattr(s, "body", None)
        fbody = self._stmt(body) if body is not None else None
        slot = meta.slot
        if meta.scope == "local":
            if meta.shape is None:
                raise self.unsupported(f"local buffer {meta.name} with a symbolic shape")
            size = int(np.prod(meta.shape)) if meta.shape else 1
            npdt = meta.npdt

            def alloc_local(st):
                arr = np.empty((size, st.T), npdt)
                arr.view(np.uint8)[...] = POISON
                st.bufs[slot] = arr
                if fbody is not None:
                    fbody(st)
            return alloc_local
        if meta.scope in ("shared", "shared.dyn"):
            if meta.scope == "shared.dyn":
                meta.dyn = True
                self.shared_allocs.append(meta)
                self.dyn_align = max(self.dyn_align, int(s.buffer.data_alignment))
            else:
                if meta.shape is None:
                    raise self.unsupported(f"static shared buffer {meta.name} with a symbolic shape")
                nbytes = int(np.prod(meta.shape)) * meta.npdt.itemsize
                align = max(16, int(s.buffer.data_alignment))     # codegen: __shared__ alignas(align)
                off = (self.static_smem + align - 1) // align * align
                meta.alloc_offset = off
                self.static_smem = off + nbytes
                self.shared_allocs.append(meta)

            def alloc_shared(st):
                off = meta.alloc_offset if not meta.dyn else st.smem.dyn_offset
                st.bufs[slot] = MemRef(st.smem, meta.npdt, off)
                if fbody is not None:
                    fbody(st)
            return alloc_shared
        raise self.unsupported(f"allocations in scope {meta.scope!r} (buffer {meta.name})")

    def _decl(self, s):
        meta = self.buffer(s.buffer)
        body = getattr(s, "body", None)
        fbody = self._stmt(body) if body is not None else None
        data = getattr(s, "data", None)
        if data is None:
            raise self.unsupported(f"DeclBuffer {meta.name} without data")
        fdata = self.expr(data)
        slot = meta.slot
        site = self.site
        if meta.scope == "local":
            raise self.unsupported(f"a local buffer view ({meta.name})")
        from tvm import ir

        if (isinstance(data, ir.Call) and getattr(data.op, "name", "") == "tirx.buffer_data"
                and data.args[0].scope() == "shared.dyn"):
            # a view of the dynamic pool asking align=N (T.SMEMPool): the pool is placed N-aligned
            self.dyn_align = max(self.dyn_align, int(s.buffer.data_alignment))

        def decl(st):
            ptr = fdata(st)
            if np.ndim(ptr):
                p = np.asarray(ptr)
                if not (p == p.flat[0]).all():
                    raise UnsupportedConfigError(f"buffer {meta.name} declared on a per-thread pointer ({site.text()})")
                ptr = p.flat[0]
            ptr = int(ptr)
            region = st.regions.get(ptr >> REGION_SHIFT)
            if region is None:
                raise UnsupportedConfigError(f"buffer {meta.name} is declared on an unknown pointer ({site.text()})")
            st.bufs[slot] = MemRef(region, meta.npdt, ptr & OFFSET_MASK)
            if fbody is not None:
                fbody(st)
        return decl

    def _for(self, s):
        from tvm import tirx

        # a VECTORIZED loop left after VectorizeLoop is one it could not vectorize: it runs serially
        if s.kind not in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED):
            raise self.unsupported(f"{s.kind} loops")
        slot = self._slot(s.loop_var)
        fmin = self.expr(s.min)
        fext = self.expr(s.extent)
        body = self._stmt(s.body)
        name = str(s.loop_var)
        step = getattr(s, "step", None)
        fstep = self.expr(step) if step is not None else None

        def loop(st):
            lo, ext = fmin(st), fext(st)
            inc = 1 if fstep is None else fstep(st)
            env = st.env
            if np.ndim(lo) == 0 and np.ndim(ext) == 0 and np.ndim(inc) == 0:
                lo, ext, inc = int(lo), int(ext), int(inc)
                entry = [name, lo]
                st.loops.append(entry)
                try:
                    for i in range(lo, lo + ext, inc):      # CUDA: for (i = min; i < min + extent; i += step)
                        entry[1] = i
                        env[slot] = i
                        body(st)
                finally:
                    st.loops.pop()
                return
            # per-thread bounds: iterate to the largest trip count, masking finished threads
            lo_a = np.broadcast_to(np.asarray(lo), (st.T,))
            ext_a = -(-np.broadcast_to(np.asarray(ext), (st.T,)) // inc)        # trip counts
            outer = st.mask
            active = ext_a > 0 if outer is None else (outer & (ext_a > 0))
            n = int(ext_a[active].max()) if active.any() else 0
            entry = [name, "<per-thread>"]
            st.loops.append(entry)
            try:
                for i in range(n):
                    m = active & (i < ext_a)
                    if not m.any():
                        break
                    st.mask = m
                    env[slot] = lo_a + i * inc
                    body(st)
            finally:
                st.mask = outer
                st.loops.pop()
        return loop

    def _while(self, s):
        fc = self.expr(s.condition)
        body = self._stmt(s.body)

        def loop(st):
            outer = st.mask
            try:
                while True:
                    c = fc(st)
                    if np.ndim(c) == 0:
                        if not c:
                            break
                        body(st)
                        continue
                    m = np.asarray(c, bool) if st.mask is None else (st.mask & c)
                    if not m.any():
                        break
                    st.mask = m
                    body(st)
            finally:
                st.mask = outer
        return loop

    def _if(self, s):
        fc = self.expr(s.condition)
        then = self._stmt(s.then_case)
        els = self._stmt(s.else_case) if s.else_case is not None else None

        def branch(st):
            c = fc(st)
            if np.ndim(c) == 0:
                if c:
                    then(st)
                elif els is not None:
                    els(st)
                return
            c = np.asarray(c, bool)
            outer = st.mask
            m = c if outer is None else (outer & c)
            try:
                if m.any():
                    st.mask = None if m.all() else m
                    then(st)
                if els is not None:
                    m2 = ~c if outer is None else (outer & ~c)
                    if m2.any():
                        st.mask = None if m2.all() else m2
                        els(st)
            finally:
                st.mask = outer
        return branch

    def _evaluate(self, s):
        from tvm import ir

        v = s.value
        if not isinstance(v, ir.Call):
            return None     # Evaluate(0) and friends
        op = getattr(v.op, "name", None)
        if op is None:
            raise self.unsupported(f"calls to {v.op}")
        if op.startswith("tirx.ptx.") and op != "tirx.ptx.addr":
            return compile_ptx_call(self, v, op[len("tirx.ptx."):], PTX_FAMILIES)
        if op in ("tirx.cuda.cta_sync", "tirx.tvm_storage_sync"):
            if op == "tirx.tvm_storage_sync":
                scope = str(v.args[0].value)
                if scope == "warp":
                    return None
                if scope != "shared":
                    raise self.unsupported(f"tvm_storage_sync({scope!r})")
            site = self.site
            return lambda st: cta_barrier(st, site, "__syncthreads")
        if op in ("tirx.cuda.warp_sync", "tirx.assume", "tirx.cuda.thread_fence", "tirx.cuda.printf",
                  "tirx.cuda.nano_sleep"):
            return None
        f = self.expr(v)
        return lambda st: f(st)

    def _store(self, s):
        meta = self.buffer(s.buffer)
        if len(s.indices) != 1:
            raise self.unsupported(f"multi-dimensional store to {meta.name} (expected a flattened buffer)")
        fi = self.expr(s.indices[0])
        fv = self.expr(s.value)
        site = self.site
        slot = meta.slot
        if meta.scope == "local":
            return _local_store(meta, fi, fv, site, self.const(s.indices[0]),
                                s.buffer.__chandle__() in self.wgmma_bufs)

        def store(st):
            mem_write(st, st.bufs[slot], meta, fi(st), fv(st), site)
        return store

    # -- expressions ------------------------------------------------------------------------------------------------

    @staticmethod
    def const(e):
        """The value of a constant integer expression, else None."""
        from tvm import tirx

        if isinstance(e, tirx.IntImm):
            return int(e.value)
        return None

    def expr(self, e):
        """The closure ``f(st)`` computing expression ``e``."""
        from tvm import ir, tirx

        t = type(e)
        if t is tirx.IntImm:
            base, _ = split_dtype(expr_dtype(e))
            v = int(e.value)
            if base == "bool":
                v = bool(v)
            elif not is_py_int_dtype(base):
                v = NP_DTYPES[base].type(v)
            return lambda st: v
        if t is tirx.FloatImm:
            v = np_dtype(expr_dtype(e)).type(float(e.value))
            return lambda st: v
        if t is ir.StringImm:
            v = str(e.value)
            return lambda st: v
        if t is ir.Var:
            key = e.__chandle__()
            if key not in self.slots:
                raise self.unsupported(f"the free variable {e}")
            slot = self.slots[key]
            return lambda st: st.env[slot]
        if t is ir.TensorLoad:
            return self._load(e)
        if t is ir.Call:
            return intrinsics.compile_call(self, e)
        if t is tirx.Let:
            slot = self._slot(e.var)
            fv = self.expr(e.value)
            fb = self.expr(e.body)

            def let(st):
                st.env[slot] = fv(st)
                return fb(st)
            return let
        return intrinsics.compile_node(self, e)

    def _load(self, e):
        meta = self.buffer(e.source)
        if len(e.indices) != 1:
            raise self.unsupported(f"multi-dimensional load from {meta.name} (expected a flattened buffer)")
        fi = self.expr(e.indices[0])
        site = self.site
        slot = meta.slot
        if meta.scope == "local":
            return _local_load(meta, fi, site, self.const(e.indices[0]), e.source.__chandle__() in self.wgmma_bufs)
        return lambda st: mem_read(st, st.bufs[slot], meta, fi(st), site)


# ======================================================================================================================
# registers (local buffers)
# ======================================================================================================================

def _local_oob(st, meta, site, idx, size):
    bad = (idx < 0) | (idx >= size)
    if st.mask is not None and np.ndim(bad):
        bad = bad & (st.mask[:, None] if np.ndim(bad) == 2 else st.mask)
    if np.any(bad):
        t = first_flagged(bad) if np.ndim(bad) else None
        i = int(np.asarray(idx)[t] if np.ndim(idx) and t is not None else np.asarray(idx).flat[0])
        st.rec.fault(st, "out_of_bounds", site, f"register index {i} outside {meta.name}[{size}]",
                     thread=t, buffer=meta.name, index=i)
        return True
    return False


def _guarded_register(fn, meta, fi, site, const, write):
    """``fn`` preceded by the wgmma hazard hook (the register buffer is a wgmma operand)."""
    slot, name = meta.slot, meta.name

    def guarded(st):
        if st.wg is not None:
            wgmma_exec.register_access(st, slot, const if const is not None else fi(st), site, name, write)
        return fn(st)
    return guarded


def _local_load(meta, fi, site, const, guard=False):
    if guard:
        return _guarded_register(_local_load(meta, fi, site, const), meta, fi, site, const, False)
    slot = meta.slot
    if const is not None:
        size = int(np.prod(meta.shape)) if meta.shape else 1
        if not 0 <= const < size:
            raise UnsupportedConfigError(f"register index {const} outside {meta.name}[{size}] at {site.text()}")
        return lambda st: st.bufs[slot][const]

    def load(st):
        arr = st.bufs[slot]
        idx = fi(st)
        size = arr.shape[0]
        if _local_oob(st, meta, site, idx, size):
            idx = np.clip(idx, 0, size - 1)
        if np.ndim(idx) == 0:
            return arr[int(idx)]
        idx = np.asarray(idx)
        if idx.ndim == 1 and idx.shape[0] == st.T:
            return arr[idx, st.tid]
        if idx.ndim == 1:               # uniform ramp (L,)
            return arr[idx].T
        return arr[idx, st.tid[:, None]]
    return load


def _local_store(meta, fi, fv, site, const, guard=False):
    if guard:
        return _guarded_register(_local_store(meta, fi, fv, site, const), meta, fi, site, const, True)
    slot = meta.slot
    if const is not None:
        size = int(np.prod(meta.shape)) if meta.shape else 1
        if not 0 <= const < size:
            raise UnsupportedConfigError(f"register index {const} outside {meta.name}[{size}] at {site.text()}")

        def store_c(st):
            v = fv(st)
            row = st.bufs[slot][const]
            if st.mask is None:
                row[...] = v
            else:
                np.copyto(row, v, where=st.mask, casting="unsafe")
        return store_c

    def store(st):
        arr = st.bufs[slot]
        idx = fi(st)
        v = fv(st)
        size = arr.shape[0]
        m = st.mask
        if _local_oob(st, meta, site, idx, size):
            bad = (np.asarray(idx) < 0) | (np.asarray(idx) >= size)
            idx = np.clip(idx, 0, size - 1)
            keep = ~bad if np.ndim(bad) == 1 else ~bad.any(axis=-1) if np.ndim(bad) == 2 else None
            if keep is not None:
                m = keep if m is None else (m & keep)
            elif bad:
                return
        if np.ndim(idx) == 0:
            row = arr[int(idx)]
            if m is None:
                row[...] = v
            else:
                np.copyto(row, v, where=m, casting="unsafe")
            return
        idx = np.asarray(idx)
        if idx.ndim == 1 and idx.shape[0] == st.T:
            vv = np.broadcast_to(np.asarray(v), (st.T,))
            if m is None:
                arr[idx, st.tid] = vv
            else:
                arr[idx[m], st.tid[m]] = vv[m]
            return
        if idx.ndim == 1:      # uniform ramp
            vv = np.broadcast_to(np.asarray(v), (st.T, idx.shape[0]))
            if m is None:
                arr[idx] = vv.T
            else:
                sub = arr[idx]
                np.copyto(sub, vv.T, where=m[None, :], casting="unsafe")
                arr[idx] = sub
            return
        vv = np.broadcast_to(np.asarray(v), idx.shape)
        rows = np.broadcast_to(st.tid[:, None], idx.shape)
        if m is None:
            arr[idx, rows] = vv
        else:
            arr[idx[m], rows[m]] = vv[m]
    return store
