"""How a ``T.ptx`` call of the lowered kernel reaches its semantics: decoding the call with TVM's own PTX table
(``tvm.backend.cuda.ptx.table``), compile-time access to its operands, destination registers, predication, and the
per-module family registries the instruction modules (``ptx_exec``, ``wgmma_exec``) fill.

A call's trailing string arguments are the modifier tokens of the table entry and a flags string; the leading
arguments are its operands in PTX order (sunk operands, ``_``, are absent).
"""
from __future__ import annotations

import numpy as np

from ..errors import UnsupportedConfigError, choices
from ..ptx import UINT_OF_SIZE
from .values import expr_dtype, np_dtype

__all__ = ["decode_call", "Operands", "register_writer", "family_registry", "compile_ptx_call"]


def family_registry():
    """(FAMILIES dict, decorator): ``@family("name", ...)`` registers a compile function ``f(kp, ops, mods, site)``
    returning the closure ``run(st)`` of one call of that ``T.ptx`` family."""
    families = {}

    def family(*names):
        def deco(fn):
            for n in names:
                families[n] = fn
            return fn
        return deco
    return families, family


def decode_call(call, entry):
    """(modifier map, {operand slot name: (slot, [nodes])}, predicate node or None) of one ``T.ptx`` call decoded
    with its TVM table entry."""
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


class Operands:
    """Compile-time access to one decoded PTX call's operands."""

    def __init__(self, kp, ops, family):
        self.kp = kp
        self.ops = ops
        self.family = family

    def nodes(self, name):
        """The operand's expression nodes (None for sunk lanes)."""
        return self.ops[name][1] if name in self.ops else []

    def imm(self, name):
        """The value of a constant (immediate) operand."""
        (node,) = self.nodes(name)
        if not hasattr(node, "value"):
            raise self.kp.unsupported(f"a non-constant immediate operand {name}")
        return int(node.value)

    def value(self, name, i=0):
        """The closure computing lane ``i`` of operand ``name``."""
        return self.kp.expr(self.nodes(name)[i])

    def bits(self, name):
        """Closures returning each register of operand ``name`` as unsigned bit patterns (uniform or (T,))."""
        out = []
        for node in self.nodes(name):
            if node is None:
                out.append(None)
                continue
            f = self.kp.expr(node)
            dt = np_dtype(expr_dtype(node))
            u = UINT_OF_SIZE[dt.itemsize]

            def g(st, f=f, dt=dt, u=u):
                a = np.asarray(f(st))
                if a.dtype != dt:
                    a = a.astype(dt)
                return a.view(u)
            out.append(g)
        return out

    def writers(self, name):
        """A ``register_writer`` per lane of destination operand ``name`` (None for sunk lanes)."""
        return [None if n is None else register_writer(self.kp, n) for n in self.nodes(name)]


def register_writer(kp, node):
    """A destination register: ``w(st, bits, thr=None)`` stores bit patterns into a register buffer element,
    for the active threads (``thr``: explicit thread indices, values aligned with them)."""
    from tvm import ir

    if not isinstance(node, ir.TensorLoad):
        raise kp.unsupported(f"the PTX destination {node} (expected a register buffer element)")
    meta = kp.buffer(node.source)
    if meta.scope != "local":
        raise kp.unsupported(f"a PTX destination in {meta.scope} buffer {meta.name} (expected registers)")
    npdt = meta.npdt
    const = kp.const(node.indices[0])
    fi = kp.expr(node.indices[0])
    slot = meta.slot
    hook = kp.register_hook(node.source)
    site = kp.site

    def write(st, vals, thr=None):
        if hook is not None:
            hook(st, slot, const if const is not None else fi(st), site, meta.name, True, thr)
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


def _predicated(fn, fpred):
    """``fn`` run only for the threads whose predicate ``fpred`` holds."""
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


def compile_ptx_call(kp, call, name, families):
    """Closure executing one ``T.ptx`` call (statement) of the lowered kernel."""
    from tvm.backend.cuda.ptx.table import TABLE

    entry = TABLE.get(name)
    handler = families.get(name)
    if entry is None or handler is None:
        raise UnsupportedConfigError(
            f"the interpreter does not implement the PTX instruction family {name!r} (at {kp.site.text()}); "
            f"implemented: {choices(families)}")
    mod_map, ops, pred = decode_call(call, entry)
    fn = handler(kp, Operands(kp, ops, name), mod_map, kp.site)
    fpred = kp.expr(pred) if pred is not None else None
    return _predicated(fn, fpred)
