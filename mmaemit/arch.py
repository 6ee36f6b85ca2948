"""CUDA architecture names: parsing, ordering and feature gates.

``Arch("sm_90a")``: ``number`` is the compute capability times ten (90), ``suffix`` is "" or "a" (arch-specific
features such as wgmma and setmaxnreg exist only with the "a" suffix). Ordering compares ``number`` only.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import ArchError, choices

#: Architectures mmaemit targets (mma.sync m16n8k16 needs sm_80).
KNOWN_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_120a")
_ARCH_RE = re.compile(r"^(?:sm_?)?(\d{2,3})([a-z]?)$")


@dataclass(frozen=True, order=False)
class Arch:
    number: int
    suffix: str = ""

    @property
    def name(self) -> str:
        return f"sm_{self.number}{self.suffix}"

    def __str__(self) -> str:
        return self.name

    def at_least(self, other: "Arch | str | int") -> bool:
        return self.number >= as_arch(other).number

    def satisfies(self, min_arch: "Arch | str | int") -> bool:
        """True when this arch offers an instruction whose minimum arch is ``min_arch``.

        An arch-specific minimum ("sm_90a") needs the same suffix and the same major version: sm_90a features do not
        exist on sm_100 (PTX ISA: arch-specific features are not forward compatible).
        """
        need = min_arch if isinstance(min_arch, Arch) else _parse(str(min_arch))
        if need.suffix:
            return self.suffix == need.suffix and self.number // 10 == need.number // 10 and self.number >= need.number
        return self.number >= need.number


def as_arch(value) -> Arch:
    """Parse "sm_90a", "90a", 90, an ``Arch`` or a ``tvm.target.Target`` with an ``arch`` attribute."""
    if isinstance(value, Arch):
        return value
    if isinstance(value, int):
        value = str(value)
    if not isinstance(value, str):
        arch = getattr(value, "arch", None)
        if arch is None:
            attrs = getattr(value, "attrs", None)
            arch = attrs.get("arch") if attrs is not None else None
        if arch is None:
            raise ArchError(f"cannot read a CUDA arch from {value!r}; pass one of {choices(KNOWN_ARCHS)}")
        value = str(arch)
    arch = _parse(value)
    if arch.number < 80:
        raise ArchError(f"arch {value!r} is below sm_80; mmaemit needs mma.sync m16n8k16 (sm_80+): "
                        f"choose one of {choices(KNOWN_ARCHS)}")
    return arch


def _parse(value: str) -> Arch:
    m = _ARCH_RE.match(value.strip())
    if not m:
        raise ArchError(f"unknown CUDA arch {value!r}; expected one of {choices(KNOWN_ARCHS)}")
    return Arch(int(m.group(1)), m.group(2))


def device_arch(device_index: int = 0) -> Arch:
    """The arch of a visible CUDA GPU (through torch), with the "a" suffix on sm_90 (what nvcc/TVM use for it)."""
    import torch

    if not torch.cuda.is_available():
        raise ArchError("no CUDA GPU is visible; pass an explicit target such as 'sm_80' or 'sm_90a'")
    major, minor = torch.cuda.get_device_capability(device_index)
    number = major * 10 + minor
    return Arch(number, "a" if number >= 90 and number in (90, 100, 120) else "")


def device_sm_count(default: int = 132, device_index: int = 0) -> int:
    """The visible GPU's SM count (through torch); ``default`` without a GPU or torch (132: the H100 SXM, what the
    persistent kernels size their grid for when they are built on a machine without one)."""
    try:
        import torch
    except ImportError:
        return default
    if not torch.cuda.is_available():
        return default
    return torch.cuda.get_device_properties(device_index).multi_processor_count
