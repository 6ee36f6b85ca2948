"""Layouts: register-fragment maps, ldmatrix/stmatrix maps, shared-memory swizzles and the bank model."""
from .banks import bank_conflicts, phase_wavefronts  # noqa: F401
