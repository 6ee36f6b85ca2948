"""``compile``: PrimFunc -> ``Kernel`` for one CUDA arch, with the arch checked before any nvcc/JIT runs."""
from __future__ import annotations

import contextlib
import os
import threading
import warnings

from ..arch import KNOWN_ARCHS, as_arch, device_arch
from ..errors import ArchError, PerformanceWarning, ToolchainError, UnsupportedConfigError, choices
from .gating import check_instructions, ptx_instructions
from .kernel import Kernel, KernelSignature
from .launch import LAUNCH_PARAMS_ATTR, launch_pipeline
from .sass import parse_ptxas_log
from .toolchain import compile_cubin

__all__ = ["compile", "resolve_target", "cached_jit", "cubin_cache_enabled", "spill_check_enabled", "warn_on_spills",
           "device_launch_params"]

_JIT_CALLBACK = "tvm_callback_cuda_compile"
_JIT_LOCK = threading.RLock()


def cubin_cache_enabled(cubin_cache=None) -> bool:
    """``cubin_cache`` if given, else ``$MMAEMIT_CUBIN_CACHE`` ("1" = on; default off)."""
    if cubin_cache is not None:
        return bool(cubin_cache)
    return os.environ.get("MMAEMIT_CUBIN_CACHE", "0") not in ("", "0")


def spill_check_enabled(check_spills=None) -> bool:
    """``check_spills`` if given, else ``$MMAEMIT_CHECK_SPILLS`` ("0" = off; default on)."""
    if check_spills is not None:
        return bool(check_spills)
    return os.environ.get("MMAEMIT_CHECK_SPILLS", "1") not in ("", "0")


def warn_on_spills(kernel: Kernel, stacklevel: int = 2) -> list:
    """Warn (``PerformanceWarning``) for each kernel function whose ``ptxas -v`` report (the nvcc build of
    ``kernel.cuda_source`` for ``kernel.arch``, through the cubin cache) shows spill stores / loads or a stack frame;
    the message names the registers and bytes. Returns the ``ResourceUsage`` of those functions. Without nvcc there
    is no report and nothing to check: returns [] silently."""
    try:
        usage = parse_ptxas_log(kernel.cubin().ptxas_log)
    except ToolchainError:
        return []
    bad = [u for _, u in sorted(usage.items()) if u.uses_local_memory]
    for u in bad:
        warnings.warn(
            f"{u.describe()} on {kernel.arch.name} (ptxas): the kernel uses local memory (spilled registers or a "
            f"dynamically indexed register array), which is slow. Use smaller warp tiles (warp_row_tiles x "
            f"warp_col_tiles accumulators per warp), a smaller chunk or fewer fragments live at once; "
            f"Kernel.resource_usage() gives these numbers (check_spills=False / MMAEMIT_CHECK_SPILLS=0 skips this "
            f"check)", PerformanceWarning, stacklevel=stacklevel + 1)
    return bad


def _nvcc_available() -> bool:
    from .toolchain import find_nvcc

    try:
        find_nvcc()
        return True
    except ToolchainError:
        return False


def jit_through_cubin_cache(arch):
    """The CUDA JIT callback that :func:`cached_jit` installs: CUDA source -> cubin bytes for ``arch``, built by nvcc
    with ``toolchain.NVCC_FLAGS`` through the cubin cache (memory, then disk; nvcc only on a miss)."""
    a = as_arch(arch)

    def jit(code, *_):
        return bytearray(compile_cubin(str(code), a).data)

    return jit


@contextlib.contextmanager
def cached_jit(arch):
    """While active, TVM's CUDA JIT (the ``tvm_callback_cuda_compile`` global that ``tvm.compile`` calls on a
    machine with a CUDA driver) builds cubins with nvcc through mmaemit's cubin cache instead of NVRTC: a kernel
    compiled before, by any process, loads from ``$MMAEMIT_CACHE_DIR`` without running a compiler, and the cubin that
    runs is byte for byte the one ``Kernel.sass()`` disassembles. The previous callback is restored on exit."""
    import tvm_ffi

    with _JIT_LOCK:
        previous = tvm_ffi.get_global_func(_JIT_CALLBACK, allow_missing=True)
        tvm_ffi.register_global_func(_JIT_CALLBACK, jit_through_cubin_cache(arch), override=True)
        try:
            yield
        finally:
            if previous is not None:
                tvm_ffi.register_global_func(_JIT_CALLBACK, previous, override=True)
            else:
                tvm_ffi.remove_global_func(_JIT_CALLBACK)


def resolve_target(target=None):
    """``(Arch, tvm.target.Target)`` for None (the visible GPU), an arch name / number, an ``Arch`` or a Target."""
    import tvm

    if isinstance(target, tvm.target.Target):
        if target.kind.name != "cuda":
            raise UnsupportedConfigError(f"target kind {target.kind.name!r} is not supported; pass a CUDA target "
                                         f"or an arch name, one of {choices(KNOWN_ARCHS)}")
        arch = getattr(target, "arch", None)
        if not arch:
            raise ArchError(f"target {target} names no arch; pass one of {choices(KNOWN_ARCHS)}")
        return as_arch(str(arch)), target
    if target is None:
        try:
            arch = device_arch()
        except ArchError as e:
            raise ArchError(f"target=None means the arch of the visible GPU, but {e}; pass target= one of "
                            f"{choices(KNOWN_ARCHS)}") from e
    else:
        arch = as_arch(target)
    return arch, tvm.target.Target({"kind": "cuda", "arch": arch.name})


def _single_prim_func(func):
    import tvm

    if isinstance(func, tvm.IRModule):
        funcs = [f for f in func.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
        if len(funcs) != 1:
            raise UnsupportedConfigError(f"expected an IRModule with one PrimFunc, got {len(funcs)}")
        return funcs[0]
    if not isinstance(func, tvm.tirx.PrimFunc):
        raise UnsupportedConfigError(f"mmaemit.compile takes a @T.prim_func (tvm.tirx.PrimFunc), got "
                                     f"{type(func).__name__}")
    return func


def compile(prim_func, target=None, out_idx=None, *, name: str | None = None,  # noqa: A001
            cubin_cache: bool | None = None, check_spills: bool | None = None) -> Kernel:
    """Compile a tirx PrimFunc for one CUDA arch and return a callable ``Kernel``.

    ``target``: None (the visible GPU's arch; ``ArchError`` with no GPU), "sm_80" / "sm_86" / "sm_89" / "sm_90" /
    "sm_90a", an ``Arch`` or a CUDA ``tvm.target.Target``. Every PTX instruction in the PrimFunc is checked against
    ``mmaemit.isa`` first: ``ArchError`` names any the arch lacks, and a ``PerformanceWarning`` each one it emulates.
    Compiles with ``tvm.compile`` and TVM's ``tirx`` pipeline (plus the launch tag of kernels marked by
    :func:`mmaemit.runtime.launch.programmatic_dependent_launch`) inside ``with target:`` (that pins the JIT's
    arch). On a machine without a GPU this yields a source-only module: ``cuda_source``, ``sass()`` and
    ``instruction_mix()`` work, calling does not. ``out_idx``: index or indices (negative allowed) of output
    parameters the call allocates and returns. ``name``: the function / kernel symbol (default: the PrimFunc's
    ``global_symbol``).
    ``cubin_cache``: True builds the GPU binary with nvcc through the on-disk cubin cache (:func:`cached_jit`; a
    kernel built before by any process loads without compiling; the autotuner always does this); False keeps TVM's
    own JIT (NVRTC); None (default) reads ``$MMAEMIT_CUBIN_CACHE`` ("1" = True, otherwise False).
    ``check_spills``: True builds the kernel with nvcc through the cubin cache (on a GPU machine that build is also
    the binary that runs, instead of NVRTC's: one compile per kernel) and warns with a ``PerformanceWarning`` when ``ptxas -v`` reports spill
    stores / loads or a stack frame, naming registers and bytes (:func:`warn_on_spills`); skipped without nvcc.
    None (default) reads ``$MMAEMIT_CHECK_SPILLS`` ("0" = False, otherwise True).
    """
    import tvm

    func = _single_prim_func(prim_func)
    arch, tgt = resolve_target(target)
    if name is not None:
        func = func.with_attr("global_symbol", name)
    attrs = func.attrs
    symbol = str(attrs["global_symbol"]) if attrs is not None and "global_symbol" in attrs else "main"
    instructions = check_instructions(ptx_instructions(func), arch, stacklevel=2)
    signature = KernelSignature(func, symbol, out_idx)  # a bad out_idx fails before the compile
    check = spill_check_enabled(check_spills)
    # the spill check reads ptxas's report of an nvcc build: let that same build be the binary that runs (one
    # compile per kernel, not NVRTC's plus nvcc's)
    use_nvcc = cubin_cache_enabled(cubin_cache) or (check and _nvcc_available())
    jit = cached_jit(arch) if use_nvcc else contextlib.nullcontext()
    with tgt, jit:
        executable = tvm.compile(func, target=tgt, tir_pipeline=launch_pipeline())
    kernel = Kernel(func, arch, tgt, executable, symbol, instructions=instructions, signature=signature)
    if check:
        warn_on_spills(kernel, stacklevel=2)
    return kernel


def device_launch_params(prim_func, target="sm_90a") -> dict:
    """{device kernel name: its launch-parameter tags} as :func:`compile` lowers ``prim_func`` for ``target`` (no
    code generation, no GPU): the thread axes, ``mmaemit.runtime.launch.PDL_TAG`` for a kernel marked by
    ``programmatic_dependent_launch``, dynamic shared memory last. What TVM's runtime reads to launch the kernel."""
    import tvm

    _, tgt = resolve_target(target)
    host = tvm.target.Target("llvm" if tvm.runtime.enabled("llvm") else "c")
    mod = tvm.tirx.transform.BindTarget(tvm.target.Target(tgt).with_host(host))(tvm.IRModule.from_expr(prim_func))
    lower, _, _ = tvm.tirx.get_tir_pipeline(launch_pipeline())
    with tgt:
        mod = lower(mod)
    return {gv.name_hint: [str(t) for t in f.attrs[LAUNCH_PARAMS_ATTR]] for gv, f in mod.functions.items()
            if f.attrs is not None and LAUNCH_PARAMS_ATTR in f.attrs}
