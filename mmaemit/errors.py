"""Typed errors. Every error names the valid choices so the user can fix the call without reading our source."""


class MmaemitError(ValueError):
    """Base class of every error mmaemit raises for bad user input."""


class UnsupportedConfigError(MmaemitError):
    """A dtype / shape / layout combination that no instruction in the table implements."""


class ArchError(MmaemitError):
    """The target architecture lacks an instruction the configuration needs."""


class TileShapeError(MmaemitError):
    """A tile or problem size that is not a multiple of what the instruction or tile needs."""


class ArgumentError(MmaemitError):
    """A kernel argument that does not match the compiled signature (device, dtype, shape, contiguity)."""


class ToolchainError(RuntimeError):
    """A CUDA tool mmaemit needs (nvcc, cuobjdump) is missing or failed; the message says how to get it."""


class PerformanceWarning(UserWarning):
    """The kernel is valid but takes a known slow path on the target (e.g. an mma.sync that ptxas emulates)."""


def choices(values) -> str:
    """Render valid choices for an error message, sorted and quoted."""
    vals = set(values)
    key = (lambda v: v) if all(isinstance(v, (int, float)) for v in vals) else str
    return ", ".join(repr(v) for v in sorted(vals, key=key))


class LayoutError(MmaemitError):
    """A layout map failed its own proof (not a bijection, inverse mismatch) or got coordinates outside its tile."""


class TuningError(MmaemitError):
    """Autotuning found no usable candidate (every one was pruned, failed, timed out or computed a wrong result), or
    could not set up its benchmark; the message lists each candidate with its reason."""
