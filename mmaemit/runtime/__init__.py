"""Compile tirx PrimFuncs for a CUDA arch, call them on torch tensors, and read their SASS.

* ``compile(prim_func, target=None, out_idx=None, *, name=None, cubin_cache=None, check_spills=None) -> Kernel``
  (arch-gated against ``mmaemit.isa``; warns ``PerformanceWarning`` when ptxas reports spills or a stack frame)
* ``Kernel``: ``__call__``, ``cuda_source``, ``sass()``, ``instruction_mix()``, ``opcode_histogram()``,
  ``resource_usage()``
* ``ptx_instructions(prim_func)`` / ``check_instructions(instrs, arch)``: the arch gate on its own
* ``instruction_mix_of_source(cuda_source, arch)`` / ``sass_of_source``: the SASS tools for any CUDA TU
"""
from __future__ import annotations

from .build import compile, resolve_target, warn_on_spills
from .gating import check_instructions, ptx_instructions
from .kernel import Kernel
from .sass import MIX_OPCODES, ResourceUsage, instruction_mix, opcode_histogram, parse_ptxas_log
from .toolchain import compile_cubin, find_cuobjdump, find_nvcc, sass_of_cubin

__all__ = ["compile", "warn_on_spills", "Kernel", "ResourceUsage", "ptx_instructions", "check_instructions", "resolve_target",
           "sass_of_source", "instruction_mix_of_source", "instruction_mix", "opcode_histogram", "parse_ptxas_log",
           "MIX_OPCODES", "compile_cubin", "sass_of_cubin", "find_nvcc", "find_cuobjdump"]


def sass_of_source(cuda_source: str, arch) -> str:
    """``cuobjdump -sass`` of a CUDA translation unit built with nvcc for ``arch`` (cached; no GPU needed)."""
    return sass_of_cubin(compile_cubin(cuda_source, arch))


def instruction_mix_of_source(cuda_source: str, arch) -> dict:
    """``instruction_mix`` of a CUDA translation unit built for ``arch``."""
    return instruction_mix(sass_of_source(cuda_source, arch))
