"""The executor: a lowered device PrimFunc compiled once into Python closures, run CTA by CTA.

Execution model. All threads of a CTA run in lockstep, vectorized with numpy: a per-thread value is an array of
shape (T,) (T = threads per CTA), a uniform value is a scalar, a TIR vector value adds a trailing lane axis. Control
flow that differs between threads runs under a boolean activity mask (divergence); warp-collective instructions
(``ldmatrix``, ``stmatrix``, ``mma``, ``shfl``) execute per warp on the warps whose 32 lanes are all active and
report a divergence error for partially active warps; ``bar.sync``/``__syncthreads`` must be reached by every
thread and starts a new barrier interval ("epoch") that the race detector uses (memory.py). Because every warp
reaches a barrier before any proceeds past it, executing the warps in lockstep between barriers is one legal
schedule; races are detected from the epoch bookkeeping, not from the schedule. Hopper ``wgmma`` (warpgroup
collective and asynchronous: issue, commit, retire at ``wait_group``) is modelled in ``wgmma_exec``; register buffers
used as its operands get load/store hooks that report accesses before the wait and missing ``wgmma.fence``.

Shared memory: static allocations at their ``align`` (``alignas`` in the generated CUDA), then the dynamic pool at
the largest ``align=`` of its views (at least 128): shared-window addresses are byte offsets from the CTA's shared
base, which is taken as 1024-byte aligned, so address-bit swizzles (wgmma descriptors) see the GPU's bits.

Registers (``local`` buffers) are arrays (size, T); shared memory is one byte array per CTA; global buffers alias
the caller's arrays, so outputs are written in place.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from ..errors import UnsupportedConfigError, choices
from ..layouts import banks as _banks
from .diagnostics import BankConflictStat, Diagnostic
from .memory import OFFSET_MASK, POISON, REGION_SHIFT, SHARED_RID, SharedMemory

_NP = {
    "float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "float8_e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "float8_e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "int8": np.dtype(np.int8), "int16": np.dtype(np.int16), "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
    "uint8": np.dtype(np.uint8), "uint16": np.dtype(np.uint16), "uint32": np.dtype(np.uint32),
    "uint64": np.dtype(np.uint64), "bool": np.dtype(np.bool_), "handle": np.dtype(np.int64),
}
_UINT_OF = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def split_dtype(dt) -> tuple:
    """("float16", 8) for "float16x8"; ("handle", 1) for pointers."""
    s = str(dt)
    if s.startswith("handle") or s == "":
        return "handle", 1
    import tvm

    d = tvm.DataType(s)
    lanes = int(d.lanes)
    base = s[: -len(f"x{lanes}")] if lanes > 1 and s.endswith(f"x{lanes}") else s
    return base, lanes


def np_dtype(dt) -> np.dtype:
    base, _ = split_dtype(dt)
    if base not in _NP:
        raise UnsupportedConfigError(f"the interpreter does not support dtype {base!r}; supported: {choices(_NP)}")
    return _NP[base]


def _expr_dtype(e) -> str:
    from tvm.ir.type import PrimType

    ty = getattr(e, "ty", None)
    if isinstance(ty, PrimType):
        return str(ty.dtype)
    return "handle"


def _is_py_int_dtype(base):
    return base in ("int32", "int64")


_INT_RANGE = {"int32": (-(1 << 31), (1 << 31) - 1, 1 << 32), "int64": (-(1 << 63), (1 << 63) - 1, 1 << 64)}


class Site:
    """A statement of the lowered kernel: where a diagnostic points."""

    __slots__ = ("stmt", "kernel", "_text")

    def __init__(self, stmt, kernel):
        self.stmt = stmt
        self.kernel = kernel
        self._text = None

    def text(self) -> str:
        if self._text is None:
            self._text = _stmt_text(self.stmt)
        return f"{self.kernel}: {self._text}"


def _stmt_text(stmt) -> str:
    from tvm import tirx

    try:
        if isinstance(stmt, tirx.For):
            head = f"for {stmt.loop_var} in range({stmt.min}, {stmt.min} + {stmt.extent}): ..."
        elif isinstance(stmt, tirx.IfThenElse):
            head = f"if {stmt.condition}: ..."
        elif isinstance(stmt, tirx.While):
            head = f"while {stmt.condition}: ..."
        else:
            # the printer declares free buffers/vars first; the statement itself is the last line
            lines = [ln.strip() for ln in stmt.script().splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")]
            head = lines[-1] if lines else type(stmt).__name__
    except Exception:  # printing is best effort; never hide the real diagnostic
        head = type(stmt).__name__
    return head if len(head) <= 400 else head[:397] + "..."


class _MemRef:
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


class _BufMeta:
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


class CpAsyncQueue:
    """Per-thread cp.async groups of one CTA: data is read at issue and lands in shared memory at the wait."""

    def __init__(self, T):
        self.committed = np.zeros(T, np.int64)
        self.ops = []      # dicts: thr, group, dst (N,), data (N, size), size, site


class CTAState:
    __slots__ = ("env", "bufs", "mask", "T", "W", "tid", "warp_of", "lane_of", "epoch", "cta", "loops", "smem",
                 "regions", "cp", "rec", "axes", "tid2d", "wg")


class Recorder:
    """Collects diagnostics and bank-conflict stats; raises on the first error in ``on_error="raise"`` mode."""

    def __init__(self, report, on_error):
        self.report = report
        self.raise_errors = on_error == "raise"
        self.seen = {}
        self.banks = {}
        self.bank_memo = {}
        self.counts = {}

    def fault(self, st, kind, site, message, thread=None, buffer=None, index=None, detail=""):
        from .diagnostics import ERROR_KINDS

        key = (kind, id(site))
        prev = self.seen.get(key)
        if prev is not None:
            prev.count += 1
            return
        loops = ", ".join(f"{n}={v}" for n, v in st.loops) if st.loops else ""
        loc = site.text() if site is not None else ""
        if loops:
            loc += f"  [{loops}]"
        d = Diagnostic(kind=kind, message=message, buffer=buffer, index=None if index is None else int(index),
                       thread=None if thread is None else int(thread),
                       warp=None if thread is None else int(thread) // 32,
                       lane=None if thread is None else int(thread) % 32, location=loc, cta=tuple(st.cta),
                       detail=detail)
        self.seen[key] = d
        self.report.diagnostics.append(d)
        if self.raise_errors and kind in ERROR_KINDS:
            raise ERROR_KINDS[kind](d, self.report)

    def count(self, name, n=1):
        self.counts[name] = self.counts.get(name, 0) + n

    def bank(self, st, site, op, byte_addr, access_bytes, act):
        """Record bank conflicts of one warp-wide shared access for every warp with an active lane.

        ``byte_addr``: (T,) start addresses, ``act``: (T,) bool or None (all active).
        """
        if access_bytes not in (1, 2, 4, 8, 16):
            return
        stat = self.banks.get(id(site))
        if stat is None:
            stat = BankConflictStat(op=op, location=site.text())
            self.banks[id(site)] = stat
        addr = np.broadcast_to(np.asarray(byte_addr, np.int64), (st.T,)).reshape(st.W, 32)
        aligned = (addr % access_bytes) == 0       # misaligned lanes were reported as errors; not a bank question
        act2 = aligned if act is None else (np.asarray(act).reshape(st.W, 32) & aligned)
        if act2.all():
            act2 = None
        for w in range(st.W):
            m = None if act2 is None else act2[w]
            if m is not None and not m.any():
                continue
            a = addr[w]
            base = (int(a.min()) // 128) * 128
            key = (access_bytes, (a - base).tobytes(), b"" if m is None or m.all() else m.tobytes())
            c = self.bank_memo.get(key)
            if c is None:
                lst = [int(x) - base if (m is None or m[i]) else None for i, x in enumerate(a)]
                c = _banks.bank_conflicts(lst, access_bytes)
                self.bank_memo[key] = c
            stat.executions += 1
            stat.conflicts += c
            stat.worst = max(stat.worst, c)


def _first(bad):
    """Index of the first thread flagged in ``bad`` (T,) or (T, L)."""
    b = np.asarray(bad)
    if b.ndim > 1:
        b = b.reshape(b.shape[0], -1).any(axis=1)
    return int(np.argmax(b))


# ======================================================================================================================
# compiler
# ======================================================================================================================

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
        from .wgmma_exec import operand_buffers
        self.wgmma_bufs = operand_buffers(self.func)    # register buffers used as wgmma operands (hooked)
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

    def _buf(self, node):
        key = node.__chandle__()
        m = self.buf_index.get(key)
        if m is None:
            m = _BufMeta(len(self.bufs), node)
            self.bufs.append(m)
            self.buf_index[key] = m
        return m

    def _unsupported(self, what):
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
            raise self._unsupported(f"{t.__name__} statements")
        finally:
            self.site = prev

    def _bind(self, s):
        slot = self._slot(s.var)
        fv = self._expr(s.value)

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
            raise self._unsupported(f"thread tag {tag}")
        return self._stmt(s.body)

    def _assert(self, s):
        fc = self._expr(s.condition)
        site = self.site

        def check(st):
            c = fc(st)
            bad = ~np.asarray(c, bool)
            if st.mask is not None and bad.ndim:
                bad = bad & st.mask
            if np.any(bad):
                st.rec.fault(st, "assert_failed", site, f"device assertion failed: {s.message}",
                             thread=_first(bad) if np.ndim(bad) else None)
        return check

    def _alloc(self, s):
        meta = self._buf(s.buffer)
        body = getattr(s, "body", None)
        fbody = self._stmt(body) if body is not None else None
        slot = meta.slot
        if meta.scope == "local":
            if meta.shape is None:
                raise self._unsupported(f"local buffer {meta.name} with a symbolic shape")
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
                    raise self._unsupported(f"static shared buffer {meta.name} with a symbolic shape")
                nbytes = int(np.prod(meta.shape)) * meta.npdt.itemsize
                align = max(16, int(s.buffer.data_alignment))     # codegen: __shared__ alignas(align)
                off = (self.static_smem + align - 1) // align * align
                meta.alloc_offset = off
                self.static_smem = off + nbytes
                self.shared_allocs.append(meta)

            def alloc_shared(st):
                off = meta.alloc_offset if not meta.dyn else st.smem.dyn_offset
                st.bufs[slot] = _MemRef(st.smem, meta.npdt, off)
                if fbody is not None:
                    fbody(st)
            return alloc_shared
        raise self._unsupported(f"allocations in scope {meta.scope!r} (buffer {meta.name})")

    def _decl(self, s):
        meta = self._buf(s.buffer)
        body = getattr(s, "body", None)
        fbody = self._stmt(body) if body is not None else None
        data = getattr(s, "data", None)
        if data is None:
            raise self._unsupported(f"DeclBuffer {meta.name} without data")
        fdata = self._expr(data)
        slot = meta.slot
        site = self.site
        if meta.scope == "local":
            raise self._unsupported(f"a local buffer view ({meta.name})")
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
            st.bufs[slot] = _MemRef(region, meta.npdt, ptr & OFFSET_MASK)
            if fbody is not None:
                fbody(st)
        return decl

    def _for(self, s):
        from tvm import tirx

        # a VECTORIZED loop left after VectorizeLoop is one it could not vectorize: it runs serially
        if s.kind not in (tirx.ForKind.SERIAL, tirx.ForKind.UNROLLED, tirx.ForKind.VECTORIZED):
            raise self._unsupported(f"{s.kind} loops")
        slot = self._slot(s.loop_var)
        fmin = self._expr(s.min)
        fext = self._expr(s.extent)
        body = self._stmt(s.body)
        name = str(s.loop_var)
        step = getattr(s, "step", None)
        fstep = self._expr(step) if step is not None else None

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
        fc = self._expr(s.condition)
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
        fc = self._expr(s.condition)
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
            raise self._unsupported(f"calls to {v.op}")
        if op.startswith("tirx.ptx.") and op != "tirx.ptx.addr":
            from .ptx_exec import compile_ptx
            return compile_ptx(self, v, op[len("tirx.ptx."):])
        if op in ("tirx.cuda.cta_sync", "tirx.tvm_storage_sync"):
            if op == "tirx.tvm_storage_sync":
                scope = str(v.args[0].value)
                if scope == "warp":
                    return None
                if scope != "shared":
                    raise self._unsupported(f"tvm_storage_sync({scope!r})")
            site = self.site
            return lambda st: cta_barrier(st, site, "__syncthreads")
        if op in ("tirx.cuda.warp_sync", "tirx.assume", "tirx.cuda.thread_fence", "tirx.cuda.printf",
                  "tirx.cuda.nano_sleep"):
            return None
        f = self._expr(v)
        return lambda st: f(st)

    def _store(self, s):
        meta = self._buf(s.buffer)
        if len(s.indices) != 1:
            raise self._unsupported(f"multi-dimensional store to {meta.name} (expected a flattened buffer)")
        fi = self._expr(s.indices[0])
        fv = self._expr(s.value)
        site = self.site
        slot = meta.slot
        if meta.scope == "local":
            return _local_store(meta, fi, fv, site, self._const(s.indices[0]),
                                s.buffer.__chandle__() in self.wgmma_bufs)

        def store(st):
            mem_write(st, st.bufs[slot], meta, fi(st), fv(st), site)
        return store

    # -- expressions ------------------------------------------------------------------------------------------------

    @staticmethod
    def _const(e):
        from tvm import tirx

        if isinstance(e, tirx.IntImm):
            return int(e.value)
        return None

    def _expr(self, e):
        from tvm import ir, tirx

        t = type(e)
        if t is tirx.IntImm:
            base, _ = split_dtype(_expr_dtype(e))
            v = int(e.value)
            if base == "bool":
                v = bool(v)
            elif not _is_py_int_dtype(base):
                v = _NP[base].type(v)
            return lambda st: v
        if t is tirx.FloatImm:
            v = np_dtype(_expr_dtype(e)).type(float(e.value))
            return lambda st: v
        if t is ir.StringImm:
            v = str(e.value)
            return lambda st: v
        if t is ir.Var:
            key = e.__chandle__()
            if key not in self.slots:
                raise self._unsupported(f"the free variable {e}")
            slot = self.slots[key]
            return lambda st: st.env[slot]
        if t is ir.TensorLoad:
            return self._load(e)
        if t is ir.Call:
            from .intrinsics import compile_call
            return compile_call(self, e)
        if t is tirx.Let:
            slot = self._slot(e.var)
            fv = self._expr(e.value)
            fb = self._expr(e.body)

            def let(st):
                st.env[slot] = fv(st)
                return fb(st)
            return let
        from .intrinsics import compile_node
        return compile_node(self, e)

    def _load(self, e):
        meta = self._buf(e.source)
        if len(e.indices) != 1:
            raise self._unsupported(f"multi-dimensional load from {meta.name} (expected a flattened buffer)")
        fi = self._expr(e.indices[0])
        site = self.site
        slot = meta.slot
        if meta.scope == "local":
            return _local_load(meta, fi, site, self._const(e.indices[0]), e.source.__chandle__() in self.wgmma_bufs)
        return lambda st: mem_read(st, st.bufs[slot], meta, fi(st), site)


# ======================================================================================================================
# registers (local buffers)
# ======================================================================================================================

def _local_oob(st, meta, site, idx, size):
    bad = (idx < 0) | (idx >= size)
    if st.mask is not None and np.ndim(bad):
        bad = bad & (st.mask[:, None] if np.ndim(bad) == 2 else st.mask)
    if np.any(bad):
        t = _first(bad) if np.ndim(bad) else None
        i = int(np.asarray(idx)[t] if np.ndim(idx) and t is not None else np.asarray(idx).flat[0])
        st.rec.fault(st, "out_of_bounds", site, f"register index {i} outside {meta.name}[{size}]",
                     thread=t, buffer=meta.name, index=i)
        return True
    return False


def _guarded_register(fn, meta, fi, site, const, write):
    """``fn`` preceded by the wgmma hazard hook (the register buffer is a wgmma operand)."""
    from .wgmma_exec import register_access

    slot, name = meta.slot, meta.name

    def guarded(st):
        if st.wg is not None:
            register_access(st, slot, const if const is not None else fi(st), site, name, write)
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


# ======================================================================================================================
# shared / global memory accesses
# ======================================================================================================================

def _describe(st, ref, elem, meta):
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


def _per_thread(st, elem):
    """Element indices broadcast to (T,) or (T, L)."""
    e = np.asarray(elem, np.int64)
    if e.ndim == 0:
        return np.broadcast_to(e, (st.T,))
    if e.ndim == 1 and e.shape[0] != st.T:
        return np.broadcast_to(e, (st.T, e.shape[0]))
    return e


def _bounds(st, ref, e, meta, site, act):
    """Mask of in-bounds per-thread accesses (reporting the first violation)."""
    bad = (e < 0) | (e >= ref.limit)
    if act is not None:
        bad = bad & (act[:, None] if bad.ndim == 2 else act)
    if bad.any():
        t = _first(bad)
        ei = e[t] if e.ndim == 1 else e[t][np.argmax(bad[t])]
        name, flat, detail = _describe(st, ref, ei, meta)
        st.rec.fault(st, "out_of_bounds", site,
                     f"{ref.region.scope} access to {name}[{flat}] is outside the {ref.region.nbytes}-byte "
                     f"{ref.region.scope} allocation {ref.region.name}", thread=t, buffer=name, index=flat,
                     detail=detail)
        ok_thr = ~bad if bad.ndim == 1 else ~bad.any(axis=1)
        return ok_thr if act is None else (act & ok_thr)
    return act


def _shared_check(st, site, b, thr, write, name_hint=None, initialize=True):
    """Shadow-state checks and bookkeeping for shared bytes ``b`` (N, width) accessed by threads ``thr`` (N,)."""
    smem = st.smem
    width = b.shape[1]
    bf = b.reshape(-1)
    w = np.repeat(st.warp_of[thr], width).astype(np.int16)
    ep = st.epoch
    if write:
        wgr = smem.wg_reading[bf] > 0
        if wgr.any():
            k = int(np.argmax(wgr))
            _shared_fault(st, site, "wgmma_before_wait", bf[k], int(thr[k // width]),
                          "write to shared memory that a wgmma.mma_async in flight reads (missing "
                          "wgmma.wait_group before overwriting its operand)")
        race = smem.write_hazards(bf, w, ep)
        if race.any():
            k = int(np.argmax(race))
            _shared_fault(st, site, "race", bf[k], int(thr[k // width]),
                          f"shared-memory race: write by warp {int(w[k])} conflicts with "
                          f"{smem.other_warp(int(bf[k]), int(w[k]), ep, 'write')} with no barrier in between")
        smem.note_writes(bf, w, ep, initialize)
        return
    pend, uninit, race = smem.read_hazards(bf, w, ep)
    if pend.any():
        k = int(np.argmax(pend))
        _shared_fault(st, site, "cp_async_before_wait", bf[k], int(thr[k // width]),
                      "read of shared memory whose cp.async data has not landed (missing cp.async.wait_group / "
                      "wait_all before this read)")
    if uninit.any():
        k = int(np.argmax(uninit))
        _shared_fault(st, site, "uninitialized_read", bf[k], int(thr[k // width]),
                      "read of shared memory that no thread has written")
    if race.any():
        k = int(np.argmax(race))
        _shared_fault(st, site, "race", bf[k], int(thr[k // width]),
                      f"shared-memory race: read by warp {int(w[k])} of data written by warp "
                      f"{int(smem.w_warp[bf[k]])} with no barrier in between")
    smem.note_reads(bf, w, ep)


def _shared_fault(st, site, kind, byte, thread, message):
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
    e = _per_thread(st, np.asarray(idx, np.int64) + off)
    ok = _bounds(st, ref, e, meta, site, act)
    if ok is not None:      # inactive or out-of-bounds threads must not index (their addresses may be garbage)
        e = np.where(ok[:, None] if e.ndim == 2 else ok, e, 0)
    if ref.region.rid == SHARED_RID:
        _shared_access(st, site, ref, e, ok, write=False, meta=meta)
    out = arr[e]
    if np.ndim(idx) == 0 and st.mask is None and ok is None:
        return out[0]
    if np.ndim(idx) == 1 and np.asarray(idx).shape[0] != st.T and st.mask is None and ok is None:
        return out[0]
    return out


def mem_write(st, ref, meta, idx, value, site):
    off = ref.elem0 + meta.elem_offset
    act = st.mask
    e = _per_thread(st, np.asarray(idx, np.int64) + off)
    ok = _bounds(st, ref, e, meta, site, act)
    if ok is not None and not ok.any():
        return
    v = np.broadcast_to(np.asarray(value).astype(ref.arr.dtype, copy=False), e.shape)
    if ref.region.rid == SHARED_RID:
        _shared_access(st, site, ref, e, ok, write=True, meta=meta)
    if ok is None:
        ref.arr[e] = v
    else:
        ref.arr[e[ok]] = v[ok]


def _shared_access(st, site, ref, e, act, write, meta):
    """Shadow checks and bank-conflict accounting of a plain shared load/store (per-thread element indices e)."""
    item = ref.item
    thr = st.tid if act is None else np.nonzero(act)[0]
    ee = e[thr]
    if ee.ndim == 1:
        ee = ee[:, None]
    b = ((ee * item)[:, :, None] + np.arange(item)).reshape(len(thr), -1)
    _shared_check(st, site, b, thr, write)
    lanes = ee.shape[1]
    contiguous = lanes == 1 or bool((np.diff(ee, axis=1) == 1).all())
    start = np.zeros(st.T, np.int64)
    start[thr] = ee[:, 0] * item
    st.rec.bank(st, site, "st.shared" if write else "ld.shared", start, item * lanes if contiguous else item, act)


# ======================================================================================================================
# barriers
# ======================================================================================================================

def cta_barrier(st, site, what):
    if st.mask is not None and not st.mask.all():
        n = int(st.mask.sum())
        st.rec.fault(st, "divergence", site, f"{what} reached by {n} of {st.T} threads: every thread of the CTA "
                     f"must reach the barrier (deadlock / undefined behaviour on the GPU)",
                     thread=int(np.argmin(st.mask)))
    st.epoch += 1
    st.rec.count("barriers")


# ======================================================================================================================
# running
# ======================================================================================================================

class _NoCTA:
    """Stand-in state for launch-level diagnostics (no CTA, no loops)."""

    loops = ()
    cta = ()


def run_launch(kp: KernelProgram, args, dims, rec, regions, source_shared_names):
    """Execute every CTA of one kernel launch. ``args``: values for the device params (pointers as ints)."""
    from .wgmma_exec import WgmmaState, finish_cta

    bx, by, bz = dims.get("blockIdx.x", 1), dims.get("blockIdx.y", 1), dims.get("blockIdx.z", 1)
    tx, ty, tz = dims.get("threadIdx.x", 1), dims.get("threadIdx.y", 1), dims.get("threadIdx.z", 1)
    T = tx * ty * tz
    if T % 32:
        raise UnsupportedConfigError(f"{kp.name}: {T} threads per CTA is not a whole number of warps")
    W = T // 32
    dyn = int(dims.get("tirx.use_dyn_shared_memory", 0))
    # the dynamic pool follows the static allocations, aligned to the largest align= of its views (>= 128)
    dyn_offset = (kp.static_smem + kp.dyn_align - 1) // kp.dyn_align * kp.dyn_align
    smem_total = dyn_offset + dyn
    tid = np.arange(T, dtype=np.int32)
    axes = {"threadIdx.x": (tid % tx).astype(np.int32), "threadIdx.y": ((tid // tx) % ty).astype(np.int32),
            "threadIdx.z": (tid // (tx * ty)).astype(np.int32)}
    names = []
    for meta in kp.shared_allocs:
        if not meta.dyn:
            names.append((meta.alloc_offset, meta.alloc_offset + int(np.prod(meta.shape)) * meta.npdt.itemsize,
                          meta.name, tuple(meta.shape), meta.npdt))
    for start, end, name, shape, dt, alloc_name in source_shared_names:
        base = dyn_offset if alloc_name == "<dyn>" else next(
            (m.alloc_offset for m in kp.shared_allocs if m.name == alloc_name and not m.dyn), None)
        if base is not None:
            names.append((base + start, base + end, name, shape, dt))
    rec.count("launches")
    if kp.static_smem and kp.dyn_align > 128 and dyn:
        rec.fault(_NoCTA, "assumed_alignment", None,
                  f"{kp.name}: the interpreter places the dynamic shared pool {kp.dyn_align}-byte aligned (after "
                  f"{kp.static_smem} bytes of static shared memory) as its views ask, but the generated CUDA declares "
                  f"the pool with a smaller alignment: on the GPU it may start unaligned")
    with np.errstate(all="ignore"):
        for z in range(bz):
            for y in range(by):
                for x in range(bx):
                    st = CTAState()
                    st.T, st.W = T, W
                    st.tid = tid
                    st.warp_of = tid // 32
                    st.lane_of = tid % 32
                    st.axes = axes
                    st.cta = (x, y, z)
                    st.env = [None] * kp.nslots
                    st.bufs = [None] * len(kp.bufs)
                    st.mask = None
                    st.epoch = 0
                    st.loops = []
                    st.smem = SharedMemory(smem_total, names)
                    st.smem.dyn_offset = dyn_offset
                    st.regions = dict(regions)
                    st.regions[SHARED_RID] = st.smem
                    st.cp = CpAsyncQueue(T)
                    st.wg = WgmmaState(T) if kp.wgmma_bufs else None
                    st.rec = rec
                    for slot, a in zip(kp.param_slots, args):
                        st.env[slot] = a
                    kp.body(st)
                    finish_cta(st)
                    rec.count("ctas")
    return T


__all__ = ["KernelProgram", "Recorder", "run_launch", "np_dtype", "split_dtype"]
