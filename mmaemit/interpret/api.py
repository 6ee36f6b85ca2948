"""``interpret(kernel, *args)``: run a kernel's lowered device code on the CPU, writing outputs in place."""
from __future__ import annotations

import os
import time

import ml_dtypes
import numpy as np

from ..arch import as_arch
from ..errors import ArgumentError, choices
from .diagnostics import InterpretReport, KernelFault
from .compiler import KernelProgram
from .lowering import lower
from .machine import Recorder, run_launch
from .memory import FIRST_GLOBAL_RID, Region
from .values import NP_DTYPES, split_dtype

DEFAULT_ARCH = "sm_90a"


def enabled() -> bool:
    """True when ``MMAEMIT_INTERPRET`` asks ``Kernel.__call__`` to run on the interpreter (any value but "", "0")."""
    return os.environ.get("MMAEMIT_INTERPRET", "") not in ("", "0")


def interpret(kernel, *args, arch=None, on_error: str = "raise") -> InterpretReport:
    """Execute ``kernel`` on the CPU with exact PTX semantics and return an ``InterpretReport``.

    ``kernel``: a ``tvm.tirx.PrimFunc`` or any object with a ``.prim_func`` (e.g. ``mmaemit.runtime.Kernel``; its
    ``.arch`` is used when ``arch`` is not given; default "sm_90a"). ``args``: numpy arrays or CPU torch tensors
    (C-contiguous, matching the kernel's buffer shapes and dtypes) and Python scalars, in parameter order; outputs
    are written in place, like the GPU call. ``on_error``: "raise" (default) raises a ``KernelFault`` subclass at
    the first out-of-bounds access, uninitialized shared read, shared-memory race, cp.async read before its wait,
    misaligned access, divergent collective, wgmma operand touched before its wait_group, or missing wgmma.fence /
    fence.proxy.async; "report" records them in ``report.diagnostics`` and continues.
    Instructions the arch lacks raise ``ArchError`` before anything runs.
    """
    func = getattr(kernel, "prim_func", kernel)
    from tvm.tirx import PrimFunc

    if not isinstance(func, PrimFunc):
        raise ArgumentError(f"interpret needs a tvm.tirx.PrimFunc or an object with .prim_func, got "
                            f"{type(kernel).__name__}")
    if on_error not in ("raise", "report"):
        raise ArgumentError(f"on_error={on_error!r}; valid: {choices(['raise', 'report'])}")
    a = as_arch(arch if arch is not None else (getattr(kernel, "arch", None) or DEFAULT_ARCH))
    prog = lower(func, a)
    arrays, env = _bind_args(prog, args)
    regions = {}
    for i, (p, arr) in enumerate(zip(prog.params, arrays)):
        if p.is_buffer:
            r = Region(FIRST_GLOBAL_RID + i, p.name, "global", arr.reshape(-1).view(np.uint8), shape=arr.shape,
                       dtype=arr.dtype)
            regions[r.rid] = r
            env[p.var.__chandle__()] = r.base
    for var, value in prog.host_binds:
        env[var.__chandle__()] = _host_eval(value, env, prog)
    report = InterpretReport(kernel=prog.name, arch=a.name)
    rec = Recorder(report, on_error)
    compiled = prog.__dict__.setdefault("_compiled", {})
    names = prog.__dict__.get("_shared_names")
    if names is None:
        names = prog.__dict__["_shared_names"] = _source_shared_names(func)
    t0 = time.perf_counter()
    threads = 0
    try:
        with np.errstate(all="ignore"):
            for launch in prog.launches:
                kp = compiled.get(launch.kernel_name)
                if kp is None:
                    kp = KernelProgram(launch, a, names)
                    compiled[launch.kernel_name] = kp
                dev_args = [_host_eval(e, env, prog) for e in launch.arg_exprs]
                dims = {tag: int(_host_eval(v, env, prog)) for tag, v in zip(launch.launch_params, launch.launch_values)}
                threads = run_launch(kp, dev_args, dims, rec, regions, names)
    except KernelFault:
        _finish(report, rec, t0, threads)
        raise
    _finish(report, rec, t0, threads)
    return report


def _finish(report, rec, t0, threads):
    report.bank_conflicts = list(rec.banks.values())
    stats = {"seconds": round(time.perf_counter() - t0, 4), "threads_per_cta": threads,
             "warps_per_cta": threads // 32}
    stats.update(rec.counts)
    report.stats = stats


# ----------------------------------------------------------------------------------------------------------------------
# arguments
# ----------------------------------------------------------------------------------------------------------------------

def _to_numpy(x, name):
    try:
        import torch
    except ImportError:     # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ArgumentError(f"argument {name}: the interpreter runs on the CPU; pass a CPU tensor "
                                f"(got device {x.device})")
        if not x.is_contiguous():
            raise ArgumentError(f"argument {name}: tensor must be contiguous (the kernel assumes compact strides)")
        x = x.detach()
        special = {torch.bfloat16: (torch.int16, ml_dtypes.bfloat16),
                   torch.float8_e4m3fn: (torch.uint8, ml_dtypes.float8_e4m3fn),
                   torch.float8_e5m2: (torch.uint8, ml_dtypes.float8_e5m2)}
        if x.dtype in special:
            carrier, npdt = special[x.dtype]
            return x.view(carrier).numpy().view(npdt)
        if x.dtype == torch.uint32:
            return x.view(torch.int32).numpy().view(np.uint32)
        return x.numpy()
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ArgumentError(f"argument {name}: array must be C-contiguous (the kernel assumes compact strides)")
        return x
    raise ArgumentError(f"argument {name}: expected a numpy array or a CPU torch tensor, got {type(x).__name__}")


def _bind_args(prog, args):
    params = prog.params
    sig = ", ".join(f"{p.name}: {p.dtype}{list(p.shape) if p.is_buffer else ''}" for p in params)
    if len(args) != len(params):
        raise ArgumentError(f"{prog.name} takes {len(params)} arguments ({sig}), got {len(args)}")
    env, arrays = {}, []
    for p, x in zip(params, args):
        if not p.is_buffer:
            if not np.isscalar(x) and not (isinstance(x, np.ndarray) and x.ndim == 0):
                raise ArgumentError(f"argument {p.name}: expected a {p.dtype} scalar, got {type(x).__name__}")
            v = NP_DTYPES[split_dtype(p.dtype)[0]].type(x)
            env[p.var.__chandle__()] = int(v) if p.dtype in ("int32", "int64") else v
            arrays.append(None)
            continue
        arr = _to_numpy(x, p.name)
        want = NP_DTYPES.get(split_dtype(p.dtype)[0])
        if arr.dtype != want:
            raise ArgumentError(f"argument {p.name}: dtype {arr.dtype} does not match the kernel's {p.dtype}")
        if arr.ndim != len(p.shape):
            raise ArgumentError(f"argument {p.name}: expected {len(p.shape)} dimensions {list(p.shape)}, got "
                                f"shape {tuple(arr.shape)}")
        arrays.append(arr)
    # shape variables first (a dimension may be a plain Var), then check every dimension
    for p, arr in zip(params, arrays):
        if arr is None:
            continue
        from tvm import ir

        for d, n in zip(p.shape, arr.shape):
            if isinstance(d, ir.Var) and d.__chandle__() not in env:
                env[d.__chandle__()] = int(n)
    for p, arr in zip(params, arrays):
        if arr is None:
            continue
        for i, (d, n) in enumerate(zip(p.shape, arr.shape)):
            want = int(_host_eval(d, env, prog))
            if want != n:
                raise ArgumentError(f"argument {p.name}: dimension {i} is {n}, the kernel expects {want} "
                                    f"(shape {list(p.shape)})")
    return arrays, env


def _host_eval(e, env, prog):
    """Evaluate a host-side integer/pointer expression (launch dims, kernel arguments)."""
    from tvm import ir, tirx

    if isinstance(e, (int, float)):
        return e
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    if isinstance(e, tirx.FloatImm):
        return float(e.value)
    if isinstance(e, ir.Var):
        key = e.__chandle__()
        if key not in env:
            raise ArgumentError(f"cannot evaluate host variable {e} (not bound by the arguments)")
        return env[key]
    if isinstance(e, ir.Call) and getattr(e.op, "name", "") == "tirx.buffer_data":
        buf = e.args[0]
        key = buf.__chandle__()
        if key in env:
            return env[key]
        if key in prog.host_decls:
            return _host_eval(prog.host_decls[key], env, prog)
        raise ArgumentError(f"cannot resolve the data pointer of host buffer {buf.name}")
    if isinstance(e, tirx.Cast):
        v = _host_eval(e.value, env, prog)
        return int(v) if split_dtype(str(e.ty.dtype))[0].startswith(("int", "uint")) else v
    ops = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
           tirx.FloorDiv: lambda a, b: a // b, tirx.FloorMod: lambda a, b: a % b,
           tirx.Div: lambda a, b: int(a / b) if isinstance(a, int) else a / b,
           tirx.Mod: lambda a, b: a - b * int(a / b), tirx.Min: min, tirx.Max: max}
    fn = ops.get(type(e))
    if fn is not None:
        return fn(_host_eval(e.a, env, prog), _host_eval(e.b, env, prog))
    raise ArgumentError(f"cannot evaluate host expression {e}")


# ----------------------------------------------------------------------------------------------------------------------
# names of shared buffers in the source PrimFunc (for diagnostics in the user's own coordinates)
# ----------------------------------------------------------------------------------------------------------------------

def _walk(stmt):
    from tvm import tirx

    stack = [stmt]
    while stack:
        s = stack.pop()
        if s is None:
            continue
        yield s
        if isinstance(s, tirx.SeqStmt):
            stack.extend(reversed(list(s.seq)))
            continue
        for attr in ("body", "then_case", "else_case", "block"):
            child = getattr(s, attr, None)
            if isinstance(child, tirx.Stmt):
                stack.append(child)


def _source_shared_names(func):
    """[(start_byte, end_byte, name, shape, dtype, alloc_name or "<dyn>")] for shared buffers of the source."""
    from tvm import ir, tirx

    allocs = {}
    out = []
    try:
        nodes = list(_walk(func.body))
    except Exception:
        return out
    for s in nodes:
        if isinstance(s, tirx.AllocBuffer):
            b = s.buffer
            scope = b.scope()
            if scope.startswith("shared"):
                allocs[b.__chandle__()] = "<dyn>" if scope == "shared.dyn" else b.name
                try:
                    shape = tuple(int(x) for x in b.shape)
                    npdt = NP_DTYPES[split_dtype(str(b.dtype))[0]]
                    if np.prod(shape) > 0:
                        out.append((0, int(np.prod(shape)) * npdt.itemsize, b.name, shape, npdt,
                                    allocs[b.__chandle__()]))
                except (TypeError, ValueError, KeyError):
                    pass
    for s in nodes:
        if isinstance(s, tirx.DeclBuffer):
            b = s.buffer
            data = getattr(s, "data", None)
            if not (isinstance(data, ir.Call) and getattr(data.op, "name", "") == "tirx.buffer_data"):
                continue
            alloc = allocs.get(data.args[0].__chandle__())
            if alloc is None:
                continue
            try:
                shape = tuple(int(x) for x in b.shape)
                npdt = NP_DTYPES[split_dtype(str(b.dtype))[0]]
                start = int(b.elem_offset) * npdt.itemsize
            except (TypeError, ValueError, KeyError):
                continue
            out.append((start, start + int(np.prod(shape)) * npdt.itemsize, b.name, shape, npdt, alloc))
    return out
