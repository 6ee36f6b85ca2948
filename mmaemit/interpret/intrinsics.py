"""TIR expression semantics for the interpreter: arithmetic nodes, casts, vectors and the builtin calls that survive
lowering (``address_of``, ``reinterpret``, ``if_then_else``, ``cvta_generic_to_shared``, ``__shfl_sync``, math).

C semantics throughout (what nvcc compiles the TIR into): integer division and ``%`` truncate (``Div``/``Mod``),
``FloorDiv``/``FloorMod`` floor, int32 arithmetic wraps, ``min``/``max`` on floats ignore NaN (``fminf``), float16 and
bfloat16 arithmetic rounds once to the narrow type (computed exactly in float64 first).
"""
from __future__ import annotations

import operator

import ml_dtypes
import numpy as np

from .. import ptx
from . import sync_exec, wgmma_exec
from .access import cvta_to_shared
from .values import INT_RANGE, NP_DTYPES, expr_dtype, np_dtype, split_dtype

__all__ = ["compile_node", "compile_call"]


def _wrapper_int(pyop, base):
    lo, hi, mod = INT_RANGE[base]

    def f(a, b):
        r = pyop(a, b)
        if type(r) is int and not lo <= r <= hi:
            r = (r - lo) % mod + lo
        return r
    return f


def _narrow_float(pyop, base):
    def f(a, b):
        r = pyop(np.asarray(a, np.float64), np.asarray(b, np.float64))
        if base == "float16":
            out = np.asarray(r).astype(np.float16)
        else:
            out = ptx.round_f64(np.asarray(r), 0.0, "bf16").view(ml_dtypes.bfloat16)
        return out[()] if out.ndim == 0 else out
    return f


def _tdiv(a, b):
    if np.ndim(a) == 0 and np.ndim(b) == 0 and type(a) is int and type(b) is int:
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b >= 0) else -q
    a_, b_ = np.asarray(a), np.asarray(b)
    q = np.floor_divide(a_, b_)
    adjust = (np.remainder(a_, b_) != 0) & ((a_ < 0) != (b_ < 0))
    out = q + adjust.astype(q.dtype)
    return out[()] if out.ndim == 0 else out


def _tmod(a, b):
    if type(a) is int and type(b) is int:
        return a - b * _tdiv(a, b)
    out = np.fmod(a, b)
    return out


def _binary_fn(t, base, is_float):
    from tvm import tirx

    table = {
        tirx.Add: operator.add, tirx.Sub: operator.sub, tirx.Mul: operator.mul,
        tirx.BitwiseAnd: operator.and_, tirx.BitwiseOr: operator.or_, tirx.BitwiseXor: operator.xor,
        tirx.LShift: operator.lshift, tirx.RShift: operator.rshift,
    }
    if t in table:
        op = table[t]
        if base in INT_RANGE:
            return _wrapper_int(op, base)
        if base in ("float16", "bfloat16"):
            return _narrow_float(op, base)
        return op
    if t is tirx.Div:
        if is_float:
            return _narrow_float(operator.truediv, base) if base in ("float16", "bfloat16") else operator.truediv
        return _tdiv
    if t is tirx.Mod:
        return (lambda a, b: np.fmod(a, b)) if is_float else _tmod
    if t is tirx.FloorDiv:
        return np.floor_divide if is_float else operator.floordiv
    if t is tirx.FloorMod:
        return np.remainder if is_float else operator.mod
    if t is tirx.Min:
        return np.fmin if is_float else (lambda a, b: np.minimum(a, b) if np.ndim(a) or np.ndim(b) else min(a, b))
    if t is tirx.Max:
        return np.fmax if is_float else (lambda a, b: np.maximum(a, b) if np.ndim(a) or np.ndim(b) else max(a, b))
    cmp = {tirx.EQ: operator.eq, tirx.NE: operator.ne, tirx.LT: operator.lt, tirx.LE: operator.le,
           tirx.GT: operator.gt, tirx.GE: operator.ge}
    if t in cmp:
        return cmp[t]
    if t is tirx.And:
        return np.logical_and
    if t is tirx.Or:
        return np.logical_or
    return None


def compile_node(kp, e):
    """Closure for an arithmetic / logic / vector node."""
    from tvm import tirx

    t = type(e)
    if hasattr(e, "a") and hasattr(e, "b"):
        base = split_dtype(expr_dtype(e.a))[0]
        is_float = base.startswith(("float", "bfloat"))
        fn = _binary_fn(t, base, is_float)
        if fn is None:
            raise kp.unsupported(f"the expression node {t.__name__}")
        fa, fb = kp.expr(e.a), kp.expr(e.b)
        return lambda st: fn(fa(st), fb(st))
    if t is tirx.Not:
        fa = kp.expr(e.a)
        return lambda st: np.logical_not(fa(st))
    if t is tirx.BitwiseNot:
        fa = kp.expr(e.a)
        return lambda st: ~fa(st)
    if t is tirx.Select:
        fc, ft, ff = kp.expr(e.condition), kp.expr(e.true_value), kp.expr(e.false_value)

        def select(st):
            c, a, b = fc(st), ft(st), ff(st)
            if np.ndim(c) == 0:
                return a if c else b
            return _where(c, a, b)
        return select
    if t is tirx.Cast:
        return _cast(kp, e)
    if t is tirx.Ramp:
        fb, fs = kp.expr(e.base), kp.expr(e.stride)
        lanes = int(e.lanes)
        ar = np.arange(lanes)

        def ramp(st):
            b, s = fb(st), fs(st)
            if np.ndim(b) == 0 and np.ndim(s) == 0:
                return b + s * ar
            return np.asarray(b)[..., None] + np.asarray(s)[..., None] * ar
        return ramp
    if t is tirx.Broadcast:
        fv = kp.expr(e.value)
        lanes = int(e.lanes)
        npdt = np_dtype(expr_dtype(e))

        def bcast(st):
            v = fv(st)
            if np.ndim(v) == 0:
                return np.full(lanes, v, npdt)
            return np.repeat(np.asarray(v)[:, None], lanes, axis=1)
        return bcast
    if t is tirx.Shuffle:
        fvs = [kp.expr(v) for v in e.vectors]
        idx = [int(i) for i in e.indices]

        def shuffle(st):
            parts = [np.asarray(f(st)) for f in fvs]
            parts = [p[..., None] if p.ndim == 0 or (p.ndim == 1 and p.shape[0] == st.T) else p for p in parts]
            cat = np.concatenate(np.broadcast_arrays(*parts) if len(parts) > 1 else parts, axis=-1)
            out = cat[..., idx]
            return out[..., 0] if len(idx) == 1 else out
        return shuffle
    raise kp.unsupported(f"the expression node {t.__name__}")


def _cast(kp, e):
    to_base, lanes = split_dtype(expr_dtype(e))
    from_base = split_dtype(expr_dtype(e.value))[0]
    fv = kp.expr(e.value)
    to = np_dtype(to_base)
    from_float = from_base.startswith(("float", "bfloat"))
    to_int = to.kind in "iu"

    def cast(st):
        v = fv(st)
        if np.ndim(v) == 0 and to_base in INT_RANGE and not from_float and type(v) in (int, bool):
            lo, hi, mod = INT_RANGE[to_base]
            v = int(v)
            return v if lo <= v <= hi else (v - lo) % mod + lo
        a = np.asarray(v)
        if to_base == "bool":
            out = a != 0
        elif from_float and to_int:
            out = np.trunc(a.astype(np.float64)).astype(to)
        elif to_base == "bfloat16" and a.dtype != np.float32:
            out = a.astype(np.float32).astype(to)
        else:
            out = a.astype(to)
        if out.ndim == 0:
            return int(out) if to_base in INT_RANGE else out[()]
        return out
    return cast


# ----------------------------------------------------------------------------------------------------------------------
# calls
# ----------------------------------------------------------------------------------------------------------------------

_EXTERN_UNARY = {
    "__int_as_float": ("int32", "float32"), "__float_as_int": ("float32", "int32"),
    "__uint_as_float": ("uint32", "float32"), "__float_as_uint": ("float32", "uint32"),
}
_MATH = {
    "tirx.exp": np.exp, "tirx.exp2": np.exp2, "tirx.log": np.log, "tirx.log2": np.log2, "tirx.sqrt": np.sqrt,
    "tirx.fabs": np.abs, "tirx.abs": np.abs, "tirx.floor": np.floor, "tirx.ceil": np.ceil, "tirx.trunc": np.trunc,
    "tirx.round": np.rint, "tirx.nearbyint": np.rint, "tirx.tanh": np.tanh, "tirx.sin": np.sin, "tirx.cos": np.cos,
    "tirx.rsqrt": lambda x: 1.0 / np.sqrt(x), "tirx.sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "tirx.isnan": np.isnan, "tirx.isinf": np.isinf, "tirx.isfinite": np.isfinite,
}
_EXTERN_MATH = {"expf": np.exp, "__expf": np.exp, "exp2f": np.exp2, "logf": np.log, "__logf": np.log,
                "sqrtf": np.sqrt, "fabsf": np.abs, "floorf": np.floor, "ceilf": np.ceil, "tanhf": np.tanh,
                "rsqrtf": lambda x: 1.0 / np.sqrt(x), "__frcp_rn": lambda x: 1.0 / x, "truncf": np.trunc,
                "roundf": np.round, "rintf": np.rint, "hexp": np.exp, "hsqrt": np.sqrt}


def _pointer_of(st, kp_meta, ref, idx):
    item = ref.item
    return ref.region.base + (ref.elem0 + kp_meta.elem_offset + np.asarray(idx, np.int64)) * item


def compile_call(kp, e):
    from tvm import ir

    op = getattr(e.op, "name", None)
    if op is None:
        raise kp.unsupported(f"calls to {e.op}")
    args = list(e.args)
    out_dt = expr_dtype(e)

    if op == "tirx.buffer_data":
        meta = kp.buffer(args[0])
        slot = meta.slot
        if meta.scope == "local":
            raise kp.unsupported(f"taking the address of register buffer {meta.name}")
        return lambda st: st.bufs[slot].region.base + st.bufs[slot].elem0 * st.bufs[slot].item
    if op == "tirx.address_of":
        load = args[0]
        if isinstance(load, ir.Var):           # a kernel parameter passed by value (a tensor map): the object itself
            return kp.expr(load)
        if not isinstance(load, ir.TensorLoad):
            raise kp.unsupported("address_of a non-buffer expression")
        meta = kp.buffer(load.source)
        if meta.scope == "local":
            raise kp.unsupported(f"taking the address of register buffer {meta.name}")
        fi = kp.expr(load.indices[0])
        slot = meta.slot
        return lambda st: _pointer_of(st, meta, st.bufs[slot], fi(st))
    if op == "tirx.tvm_access_ptr":
        dt = np_dtype(expr_dtype(args[0]))
        fdata, foff = kp.expr(args[1]), kp.expr(args[2])
        return lambda st: fdata(st) + np.asarray(foff(st), np.int64) * dt.itemsize
    if op == "tirx.type_annotation":
        return lambda st: None
    if op == "tirx.cuda.wgmma_encode_matrix_descriptor":
        return wgmma_exec.compile_encode_descriptor(kp, args)
    if op == "tirx.cuda.cvta_generic_to_shared":
        fp = kp.expr(args[0])
        site = kp.site
        return lambda st: cvta_to_shared(st, fp(st), site)
    if op == "tirx.ptx.addr":
        fb, fo = kp.expr(args[0]), kp.expr(args[1])

        def addr(st):
            b = fb(st)
            o = fo(st)
            if isinstance(b, np.ndarray) or isinstance(b, np.generic):
                return (np.asarray(b).astype(np.int64) + int(o)).astype(np.asarray(b).dtype)
            return b + int(o)
        return addr
    if op == "tirx.reinterpret":
        fv = kp.expr(args[0])
        src = split_dtype(expr_dtype(args[0]))[0]
        dst = split_dtype(out_dt)[0]
        if src == "handle" or dst == "handle":
            return fv
        sdt, ddt = np_dtype(src), np_dtype(dst)

        def reinterpret(st):
            out = np.asarray(fv(st)).astype(sdt, copy=False).view(ddt)
            if out.ndim == 0:
                return int(out) if dst in INT_RANGE else out[()]
            return out
        return reinterpret
    if op == "tirx.if_then_else":
        return _if_then_else(kp, args)
    if op in ("tirx.likely", "tirx.assume"):
        return kp.expr(args[0])
    if op == "tirx.isnullptr":
        return lambda st: False
    if op in ("tirx.bitwise_and", "tirx.bitwise_or", "tirx.bitwise_xor", "tirx.shift_left", "tirx.shift_right"):
        fa, fb = kp.expr(args[0]), kp.expr(args[1])
        base = split_dtype(out_dt)[0]
        pyop = {"tirx.bitwise_and": operator.and_, "tirx.bitwise_or": operator.or_,
                "tirx.bitwise_xor": operator.xor, "tirx.shift_left": operator.lshift,
                "tirx.shift_right": operator.rshift}[op]
        fn = _wrapper_int(pyop, base) if base in INT_RANGE else pyop
        return lambda st: fn(fa(st), fb(st))
    if op == "tirx.bitwise_not":
        fa = kp.expr(args[0])
        return lambda st: ~fa(st)
    if op in ("tirx.cuda.__shfl_sync", "tirx.cuda.__shfl_up_sync", "tirx.cuda.__shfl_down_sync",
              "tirx.cuda.__shfl_xor_sync"):
        return _shfl_intrinsic(kp, op, args)
    if op == "tirx.cuda.__activemask":
        def activemask(st):
            m = np.ones(st.T, bool) if st.mask is None else st.mask
            bits = (m.reshape(st.W, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1)
            return np.repeat(bits.astype(np.uint32), 32)
        return activemask
    if op == "tirx.cuda.mov_sreg" and "cluster" in str(getattr(args[-1], "value", "")):
        raise kp.unsupported(f"the cluster special register %{args[-1].value}: the interpreter runs clusters of one "
                             f"CTA (thread-block clusters, distributed shared memory and TMA multicast are not "
                             f"implemented)")
    if op == "tirx.cuda.elect_sync":
        kp.use_unit(sync_exec)
        return sync_exec.compile_elect_sync(kp, args)
    if op == "tirx.cuda.thread_rank":
        return lambda st: st.tid
    if op in ("tirx.cuda.uint_as_float", "tirx.cuda.float_as_uint"):
        fv = kp.expr(args[0])
        src, dst = (np.uint32, np.float32) if op.endswith("uint_as_float") else (np.float32, np.uint32)
        return lambda st: _view(fv(st), src, dst)
    if op in ("tirx.cuda.half2float", "tirx.cuda.bfloat162float"):
        fv = kp.expr(args[0])
        return lambda st: np.asarray(fv(st)).astype(np.float32)
    if op == "tirx.cuda.fdividef":
        fa, fb = kp.expr(args[0]), kp.expr(args[1])
        return lambda st: np.float32(1) * fa(st) / fb(st)
    if op in ("tirx.call_extern", "tirx.call_pure_extern"):
        name = str(args[0].value)
        rest = [kp.expr(a) for a in args[1:]]
        if name in _EXTERN_UNARY:
            s, d = _EXTERN_UNARY[name]
            return lambda st: _view(rest[0](st), NP_DTYPES[s], NP_DTYPES[d])
        if name in _EXTERN_MATH:
            fn = _EXTERN_MATH[name]
            npdt = np_dtype(out_dt)
            return lambda st: np.asarray(fn(np.asarray(rest[0](st)))).astype(npdt)
        if name in ("__half2float", "__bfloat162float"):
            return lambda st: np.asarray(rest[0](st)).astype(np.float32)
        if name in ("__float2half_rn", "__float2bfloat16_rn"):
            npdt = np_dtype(out_dt)
            return lambda st: np.asarray(rest[0](st)).astype(npdt)
        if name in ("fmaf", "__fmaf_rn"):
            def fmaf(st):
                a, b, c = (np.asarray(f(st), np.float64) for f in rest)
                hi, lo = ptx.two_sum(a * b, c)   # a*b is exact in float64 for float32 inputs
                return ptx.round_f64(hi, lo, "f32").view(np.float32)
            return fmaf
        raise kp.unsupported(f"the extern function {name!r}")
    if op in _MATH:
        fn = _MATH[op]
        fa = kp.expr(args[0])
        npdt = np_dtype(out_dt)
        return lambda st: np.asarray(fn(np.asarray(fa(st)))).astype(npdt)[()]
    if op == "tirx.fma":
        fa, fb, fc = (kp.expr(a) for a in args)
        return lambda st: fa(st) * fb(st) + fc(st)
    if op == "tirx.popcount":
        fa = kp.expr(args[0])
        return lambda st: np.bitwise_count(np.asarray(fa(st)))
    raise kp.unsupported(f"the intrinsic {op}")


def _where(c, a, b):
    c = np.asarray(c)
    if c.ndim == 1 and max(np.ndim(a), np.ndim(b)) == 2:
        c = c[:, None]
    return np.where(c, a, b)


def _view(v, src, dst):
    out = np.asarray(v).astype(src, copy=False).view(dst)
    return out[()] if out.ndim == 0 else out


def _if_then_else(kp, args):
    fc, fa, fb = (kp.expr(a) for a in args)

    def ite(st):
        c = fc(st)
        if np.ndim(c) == 0:
            return fa(st) if c else fb(st)
        c = np.asarray(c, bool)
        outer = st.mask
        try:
            m = c if outer is None else outer & c
            st.mask = m
            a = fa(st) if m.any() else 0
            m2 = ~c if outer is None else outer & ~c
            st.mask = m2
            b = fb(st) if m2.any() else 0
        finally:
            st.mask = outer
        return _where(c, a, b)
    return ite


def _shfl_intrinsic(kp, op, args):
    """CUDA ``__shfl*_sync(mask, var, lane/delta, width)`` = ``shfl.sync`` with c = ((32-width)<<8) | clamp."""
    fmask, fv, fl, fw = (kp.expr(a) for a in args)
    mode = {"tirx.cuda.__shfl_sync": "idx", "tirx.cuda.__shfl_up_sync": "up",
            "tirx.cuda.__shfl_down_sync": "down", "tirx.cuda.__shfl_xor_sync": "bfly"}[op]
    npdt = np_dtype(expr_dtype(args[1]))

    def shfl(st):
        v = np.broadcast_to(np.asarray(fv(st)).astype(npdt, copy=False), (st.T,)).reshape(st.W, 32)
        width = np.asarray(fw(st), np.int64)
        c = ((32 - width) << 8) | (0 if mode == "up" else 0x1F)
        b = np.broadcast_to(np.asarray(fl(st), np.int64), (st.T,)).reshape(st.W, 32)
        d, _p = ptx.shfl(v, mode, b, np.broadcast_to(c, (st.T,)).reshape(st.W, 32))
        st.rec.count("shfl")
        return d.reshape(st.T)
    return shfl
