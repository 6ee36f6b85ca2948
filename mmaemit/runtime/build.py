"""``compile``: PrimFunc -> ``Kernel`` for one CUDA arch, with the arch checked before any nvcc/JIT runs."""
from __future__ import annotations

from ..arch import KNOWN_ARCHS, as_arch, device_arch
from ..errors import ArchError, UnsupportedConfigError, choices
from .gating import check_instructions, ptx_instructions
from .kernel import Kernel, KernelSignature

__all__ = ["compile", "resolve_target"]


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


def compile(prim_func, target=None, out_idx=None, *, name: str | None = None) -> Kernel:  # noqa: A001
    """Compile a tirx PrimFunc for one CUDA arch and return a callable ``Kernel``.

    ``target``: None (the visible GPU's arch; ``ArchError`` with no GPU), "sm_80" / "sm_86" / "sm_89" / "sm_90" /
    "sm_90a", an ``Arch`` or a CUDA ``tvm.target.Target``. Every PTX instruction in the PrimFunc is checked against
    ``mmaemit.isa`` first: ``ArchError`` names any the arch lacks, and a ``PerformanceWarning`` each one it emulates.
    Compiles with ``tvm.compile(..., tir_pipeline="tirx")`` inside ``with target:`` (that pins the JIT's arch). On a
    machine without a GPU this yields a source-only module: ``cuda_source``, ``sass()`` and ``instruction_mix()`` work,
    calling does not. ``out_idx``: index or indices (negative allowed) of output parameters the call allocates and
    returns. ``name``: the function / kernel symbol (default: the PrimFunc's ``global_symbol``).
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
    with tgt:
        executable = tvm.compile(func, target=tgt, tir_pipeline="tirx")
    return Kernel(func, arch, tgt, executable, symbol, instructions=instructions, signature=signature)
