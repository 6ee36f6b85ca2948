"""Layouts: register-fragment maps, ldmatrix/stmatrix maps, shared-memory swizzles and the bank model."""
from .banks import bank_conflicts, phase_wavefronts  # noqa: F401
from .fragment import FragmentLayout, mma_fragment  # noqa: F401
from .ldmatrix import MatrixMoveLayout, matrix_move_layout  # noqa: F401
