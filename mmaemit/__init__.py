"""mmaemit: warp-level tensor-core building blocks for hand-written TIR kernels on apache-tvm 0.27.

Public API (imported lazily, so ``import mmaemit`` does not load TVM until you use something that needs it):

* ``TensorCoreIntrinEmitter`` - ldmatrix / mma.sync / stmatrix sequences for a warp tile (``mmaemit.emitters``)
* ``WgmmaIntrinEmitter`` - Hopper wgmma.mma_async (SS / RS) for a warpgroup, descriptors derived from the swizzle
  layouts (``mmaemit.emitters``, layouts in ``mmaemit.layouts.wgmma``)
* ``make_mma_swizzle_layout`` - bank-conflict-free shared-memory swizzles (``mmaemit.layouts``)
* ``compile`` / ``Kernel`` - build a PrimFunc for an arch, call it on torch tensors, read its SASS (``mmaemit.runtime``)
* ``isa`` - the instruction table every check reads
* ``dequant`` - exact low-bit weight formats, quantize / pack / fragment order, GPTQ and BitBLAS import
* ``autotune`` / ``tune`` - parameter spaces, parallel compilation, checked benchmarks, a persistent table of winners
  (``mmaemit.tuning``)
"""
from __future__ import annotations

import importlib

from . import isa
from .arch import Arch, as_arch
from .errors import (ArchError, ArgumentError, LayoutError, MmaemitError, PerformanceWarning, TileShapeError,
                     ToolchainError, TuningError, UnsupportedConfigError)

__version__ = "0.1.0"

_LAZY = {
    "TensorCoreIntrinEmitter": "mmaemit.emitters",
    "WgmmaIntrinEmitter": "mmaemit.emitters",
    "make_mma_swizzle_layout": "mmaemit.layouts",
    "compile": "mmaemit.runtime",
    "Kernel": "mmaemit.runtime",
    "interpret": "mmaemit.interpret",
    "InterpretReport": "mmaemit.interpret",
    "KernelFault": "mmaemit.interpret",
    "dequant": "mmaemit.dequant",
    "autotune": "mmaemit.tuning",
    "tune": "mmaemit.tuning",
    "tuning": "mmaemit.tuning",
}

__all__ = ["isa", "Arch", "as_arch", "MmaemitError", "ArchError", "ArgumentError", "TileShapeError",
           "UnsupportedConfigError", "LayoutError", "ToolchainError", "TuningError", "PerformanceWarning", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"mmaemit.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'mmaemit' has no attribute {name!r}")
