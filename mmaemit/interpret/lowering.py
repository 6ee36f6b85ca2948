"""Lower a PrimFunc exactly as ``tvm.compile(..., tir_pipeline="tirx")`` does for CUDA and keep what codegen sees.

The interpreter must execute the kernel the GPU runs, not a re-derivation, so this module runs TVM's own ``tirx``
pipeline (``tvm.tirx.get_tir_pipeline("tirx")``: LowerTIRx, FlattenBuffer, VectorizeLoop, UnrollLoop, CSE,
SplitHostDevice, MakePackedAPI, storage legalization) followed by the device finalization passes
(LowerWarpMemory, StmtSimplify, LowerIntrin) that ``tvm.tirx.build`` applies right before CUDA codegen. The device
PrimFuncs are taken from that final module.

The host side is read from the module right after ``SplitHostDevice`` (captured with a pass instrument, before
MakePackedAPI turns it into FFI argument unpacking): it holds the ``call_ffi_kernel`` launches, their arguments and
launch dimensions as expressions of the kernel's parameters, and the host statements before them (bindings and
``T.tensormap_encode_tiled`` calls, which ``interpret`` evaluates in order).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..arch import Arch, as_arch
from ..errors import UnsupportedConfigError

__all__ = ["Param", "Launch", "LoweredProgram", "lower"]


@dataclass
class Param:
    """One parameter of the source PrimFunc: a buffer (``shape`` entries are ints or tvm Vars) or a scalar."""

    name: str
    var: object
    is_buffer: bool
    dtype: str
    shape: tuple = ()


@dataclass
class Launch:
    """One ``call_ffi_kernel``: the device PrimFunc, its argument expressions and launch dimensions (host exprs)."""

    kernel_name: str
    device_func: object
    arg_exprs: list
    launch_params: list
    launch_values: list


@dataclass
class LoweredProgram:
    name: str
    arch: Arch
    source_func: object
    params: list
    launches: list
    host_decls: dict = field(default_factory=dict)   # buffer handle -> data expr (host DeclBuffers)
    host_steps: list = field(default_factory=list)   # ("bind", var, value) / ("call", Call), host statements in order


_CACHE: dict = {}
_CACHE_MAX = 32


def lower(func, arch="sm_90a") -> LoweredProgram:
    """Run TVM's tirx pipeline on ``func`` for ``arch`` and return the device kernels and host launches.

    Results are cached per (PrimFunc object, arch).
    """
    import tvm

    a = as_arch(arch)
    key = (func.__chandle__(), a.name)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is func:
        return hit[1]

    from tvm.tirx.build import split_host_device_mods

    target = tvm.target.Target({"kind": "cuda", "arch": a.name})
    host = "llvm" if tvm.runtime.enabled("llvm") else "c"
    captured = {}

    @tvm.instrument.pass_instrument
    class _CaptureSplit:
        def run_after_pass(self, mod, info):
            if info.name.endswith("SplitHostDevice"):
                captured["mod"] = mod

    with target:
        mod = tvm.IRModule.from_expr(func)
        mod = tvm.tirx.transform.BindTarget(target.with_host(host))(mod)
        pipeline, _finalize_host, finalize_device = tvm.tirx.get_tir_pipeline("tirx")
        with tvm.transform.PassContext(instruments=[_CaptureSplit()]):
            mod = pipeline(mod)
        _host_mod, device_mods = split_host_device_mods(mod)
        device_funcs = {}
        for dmod in device_mods.values():
            dmod = finalize_device()(dmod)
            for gv, f in dmod.functions.items():
                device_funcs[gv.name_hint] = f
    if "mod" not in captured:
        raise UnsupportedConfigError("TVM's tirx pipeline did not run SplitHostDevice; is this a device kernel?")

    split = captured["mod"]
    host_funcs = [(gv, f) for gv, f in split.functions.items() if gv.name_hint not in device_funcs]
    if len(host_funcs) != 1:
        raise UnsupportedConfigError(f"expected one host function, found {[gv.name_hint for gv, _ in host_funcs]}")
    gv, hf = host_funcs[0]
    params = [_param(p) for p in hf.params]
    prog = LoweredProgram(name=gv.name_hint, arch=a, source_func=func, params=params, launches=[])
    _read_host(hf.body, prog, device_funcs)
    if not prog.launches:
        raise UnsupportedConfigError(f"{gv.name_hint} launches no device kernel (no T.device_entry()?)")
    if len(_CACHE) >= _CACHE_MAX:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (func, prog)
    return prog


def _param(p) -> Param:
    from tvm.ir.type import PrimType

    ty = p.ty
    if isinstance(ty, PrimType):
        return Param(name=p.name, var=p, is_buffer=False, dtype=str(ty.dtype))
    # buffer parameter (a tirx buffer is a Var of buffer type carrying shape/dtype)
    return Param(name=p.name, var=p, is_buffer=True, dtype=str(p.dtype), shape=tuple(p.shape))


def _read_host(stmt, prog, device_funcs):
    from tvm import ir, tirx

    if isinstance(stmt, tirx.SeqStmt):
        for s in stmt.seq:
            _read_host(s, prog, device_funcs)
    elif isinstance(stmt, tirx.DeclBuffer):
        prog.host_decls[stmt.buffer.__chandle__()] = stmt.data
        body = getattr(stmt, "body", None)
        if body is not None:
            _read_host(body, prog, device_funcs)
    elif isinstance(stmt, tirx.Bind):
        prog.host_steps.append(("bind", stmt.var, stmt.value))
    elif isinstance(stmt, tirx.AttrStmt):
        _read_host(stmt.body, prog, device_funcs)
    elif isinstance(stmt, tirx.AssertStmt):
        pass
    elif isinstance(stmt, tirx.Evaluate):
        call = stmt.value
        if isinstance(call, ir.Call) and getattr(call.op, "name", "") == "tirx.call_ffi_kernel":
            name = str(call.args[0].value)
            if name not in device_funcs:
                raise UnsupportedConfigError(f"host launches {name!r} but no such device function was lowered")
            n = len(device_funcs[name].params)
            rest = list(call.args[1:])
            tags = [str(t) for t in call.attrs.launch_params]
            prog.launches.append(Launch(kernel_name=name, device_func=device_funcs[name], arg_exprs=rest[:n],
                                        launch_params=tags, launch_values=rest[n:]))
        elif isinstance(call, ir.Call) and getattr(call.op, "name", "") == "tirx.tensormap_encode_tiled":
            prog.host_steps.append(("call", call))
    else:
        raise UnsupportedConfigError(
            f"the interpreter supports straight-line host code around kernel launches; found "
            f"{type(stmt).__name__} on the host side")
