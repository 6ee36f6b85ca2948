"""What a tuning result depends on besides the key: the kernel's source and the machine it was measured on.

* :func:`source_hash` - sha256 over the builder's own source and the files of the modules / packages it depends on
  (``depends``; a package means every ``.py`` file under it), so editing the kernel code invalidates its entries.
* :func:`device_fingerprint` - GPU name, arch, NVIDIA driver, CUDA (driver API, torch runtime, nvcc), TVM and mmaemit
  versions: a winner measured on another card or toolchain is not reused.

Both are memoised per process (a hit in the on-disk table must cost milliseconds).
"""
from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import re
from pathlib import Path

__all__ = ["source_hash", "device_fingerprint", "software_versions", "nvidia_driver_version"]


def _module_files(name: str) -> list:
    mod = importlib.import_module(name)
    paths = getattr(mod, "__path__", None)
    if paths:  # a package: every .py file under it
        files = []
        for root in paths:
            files.extend(p for p in Path(root).rglob("*.py") if "__pycache__" not in p.parts)
        return sorted(set(files))
    file = getattr(mod, "__file__", None)
    return [Path(file)] if file else []


@functools.lru_cache(maxsize=None)
def _files_digest(names: tuple) -> str:
    h = hashlib.sha256()
    for name in names:
        for path in _module_files(name):
            h.update(str(path.name).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def source_hash(fn, depends=()) -> str:
    """sha256 hex over ``fn``'s module file (its own source where there is no file) and the files of ``depends``
    (module or package names)."""
    names = [getattr(fn, "__module__", None) or ""]
    names += [d for d in depends if d not in names]
    h = hashlib.sha256()
    try:
        h.update(inspect.getsource(fn).encode())
    except (OSError, TypeError):
        h.update(getattr(fn, "__qualname__", repr(fn)).encode())
    importable = []
    for name in names:
        try:
            importlib.import_module(name)
            importable.append(name)
        except ImportError:
            h.update(f"<unimportable {name}>".encode())
    h.update(_files_digest(tuple(importable)).encode())
    return h.hexdigest()


def nvidia_driver_version() -> str:
    """The NVIDIA kernel module version ("580.159.04") from ``/proc/driver/nvidia/version``; "unknown" without it."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return "unknown"
    m = re.search(r"Kernel Module(?: for [\w.]+)?\s+([0-9][0-9.]+)", text)
    return m.group(1) if m else "unknown"


@functools.lru_cache(maxsize=None)
def software_versions() -> dict:
    """TVM, mmaemit, torch and nvcc versions (nvcc "none" where it is missing)."""
    import torch
    import tvm

    import mmaemit

    from ..errors import ToolchainError
    from ..runtime.toolchain import nvcc_version

    try:
        nvcc = nvcc_version()
    except ToolchainError:
        nvcc = "none"
    return {"tvm": str(tvm.__version__), "mmaemit": mmaemit.__version__, "torch": str(torch.__version__),
            "nvcc": nvcc}


@functools.lru_cache(maxsize=None)
def device_fingerprint(device_index: int = 0) -> dict:
    """The tuning-relevant facts of the visible GPU and toolchain (needs a GPU)."""
    import torch

    from ..arch import device_arch

    driver_api = torch._C._cuda_getDriverVersion() if hasattr(torch._C, "_cuda_getDriverVersion") else 0
    return {
        "gpu": torch.cuda.get_device_name(device_index),
        "arch": device_arch(device_index).name,
        "driver": nvidia_driver_version(),
        "cuda": f"driver {driver_api // 1000}.{driver_api % 1000 // 10}, runtime {torch.version.cuda}",
        **software_versions(),
    }
