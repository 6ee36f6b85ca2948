"""Emitters: plain-Python generators of warp-level PTX sequences, called inside ``@T.prim_func`` bodies."""
from .builder import emit  # noqa: F401
from .dequant import DequantBEmitter  # noqa: F401
from .mma import TensorCoreIntrinEmitter  # noqa: F401
from .wgmma import WgmmaIntrinEmitter  # noqa: F401
