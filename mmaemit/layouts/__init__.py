"""Layouts: register-fragment maps, ldmatrix/stmatrix maps, shared-memory swizzles, the bank model and CTA raster
orders (pictures of each: :mod:`mmaemit.layouts.pictures`)."""
from .banks import bank_conflicts, phase_wavefronts  # noqa: F401
from .fragment import FragmentLayout, mma_fragment  # noqa: F401
from .ldmatrix import MatrixMoveLayout, matrix_move_layout  # noqa: F401
from .raster import RASTER_ORDERS, RasterOrder, panel_swizzle, raster_order  # noqa: F401
from .swizzle import SwizzleLayout, auto_swizzle_bytes, make_mma_swizzle_layout  # noqa: F401
from .transposed_load import TransposedLoadPlan, transposed_load_plan  # noqa: F401
from .wgmma import (WarpgroupFragmentLayout, WgmmaOperandLayout, make_wgmma_layout, wgmma_a_layout,  # noqa: F401
                    wgmma_accumulator_layout, wgmma_operand_layout)

__all__ = ["FragmentLayout", "mma_fragment", "MatrixMoveLayout", "matrix_move_layout", "SwizzleLayout",
           "make_mma_swizzle_layout", "auto_swizzle_bytes", "bank_conflicts", "phase_wavefronts", "TransposedLoadPlan",
           "transposed_load_plan", "RasterOrder", "raster_order", "RASTER_ORDERS", "panel_swizzle",
           "WgmmaOperandLayout", "make_wgmma_layout", "wgmma_operand_layout", "WarpgroupFragmentLayout",
           "wgmma_accumulator_layout", "wgmma_a_layout"]
