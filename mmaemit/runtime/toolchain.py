"""The CUDA tools behind ``Kernel.sass``: find nvcc and cuobjdump, build a cubin (cached), disassemble it.

Works without a GPU: nvcc only compiles. The nvcc flags mirror TVM's own nvcc JIT mode (``tvm/support/nvcc.py``:
``-O3 --use_fast_math``, half/bfloat16 operators enabled, ``ptxas -v``), so the SASS is the code that runs.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..arch import Arch, as_arch
from ..errors import ToolchainError
from .cache import CompileCache, cache_key

__all__ = ["NVCC_FLAGS", "Cubin", "find_nvcc", "find_cuobjdump", "arch_flags", "compile_cubin", "sass_of_cubin",
           "COMPILE_CACHE", "nvcc_version"]

#: Flags besides the arch: TVM's nvcc JIT flags, plus -diag-suppress for the unused-variable noise TVM code makes.
NVCC_FLAGS = (
    "-O3",
    "-std=c++17",
    "--use_fast_math",
    "--expt-relaxed-constexpr",
    "-U__CUDA_NO_HALF_OPERATORS__",
    "-U__CUDA_NO_HALF_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT16_OPERATORS__",
    "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_BFLOAT162_OPERATORS__",
    "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
    "-diag-suppress=177,550",
    "--ptxas-options=-v,--register-usage-level=10,--warn-on-local-memory-usage",
)

#: The process-wide cubin cache (memory, plus disk under ``$MMAEMIT_CACHE_DIR`` or ``~/.cache/mmaemit``).
COMPILE_CACHE = CompileCache()


@dataclass(frozen=True)
class Cubin:
    """A compiled cubin and the ``ptxas -v`` report that came with it."""

    data: bytes
    ptxas_log: str
    arch: str
    key: str


def _cuda_home_bins():
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            yield Path(os.environ[env]) / "bin"
    yield Path("/usr/local/cuda/bin")


def find_nvcc() -> str:
    """nvcc from ``$MMAEMIT_NVCC``, PATH, ``$CUDA_HOME/bin`` or /usr/local/cuda/bin; ``ToolchainError`` if none."""
    if os.environ.get("MMAEMIT_NVCC"):
        return os.environ["MMAEMIT_NVCC"]
    found = shutil.which("nvcc")
    if found:
        return found
    for d in _cuda_home_bins():
        if (d / "nvcc").is_file():
            return str(d / "nvcc")
    raise ToolchainError("nvcc not found (needed to build cubins for SASS inspection): install the CUDA toolkit and "
                         "put nvcc on PATH, set CUDA_HOME, or set MMAEMIT_NVCC to its path")


def find_cuobjdump() -> str:
    """cuobjdump from ``$MMAEMIT_CUOBJDUMP``, PATH, the CUDA toolkit, or the ``nvidia-cuda-cuobjdump`` wheel."""
    if os.environ.get("MMAEMIT_CUOBJDUMP"):
        return os.environ["MMAEMIT_CUOBJDUMP"]
    found = shutil.which("cuobjdump")
    if found:
        return found
    dirs = list(_cuda_home_bins())
    try:
        dirs.insert(0, Path(find_nvcc()).parent)
    except ToolchainError:
        pass
    try:
        import nvidia  # namespace package of the NVIDIA pip wheels

        for root in nvidia.__path__:
            for sub in ("cu13/bin", "cu12/bin", "cuda_cuobjdump/bin"):
                dirs.append(Path(root) / sub)
    except ImportError:
        pass
    for d in dirs:
        if (d / "cuobjdump").is_file():
            return str(d / "cuobjdump")
    raise ToolchainError("cuobjdump not found (needed for SASS): `pip install nvidia-cuda-cuobjdump` (gives "
                         "nvidia/cu13/bin/cuobjdump), put the CUDA toolkit's bin on PATH, or set MMAEMIT_CUOBJDUMP")


def arch_flags(arch) -> list:
    """``-gencode=arch=compute_XX,code=sm_XX``: the form that also works for "a" archs (``-arch=sm_90a`` may run a
    plain sm_90 pass that rejects wgmma/setmaxnreg)."""
    a: Arch = as_arch(arch)
    n = f"{a.number}{a.suffix}"
    return [f"-gencode=arch=compute_{n},code=sm_{n}"]


@functools.lru_cache(maxsize=None)
def _nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except OSError as e:
        raise ToolchainError(f"cannot run {nvcc}: {e}") from e
    return out.strip().splitlines()[-1] if out.strip() else "unknown"


def nvcc_version() -> str:
    """The last line of ``nvcc --version`` (e.g. "Build cuda_13.0.r13.0/compiler.36424714_0"), memoised."""
    return _nvcc_version(find_nvcc())


def _invoke_nvcc(cmd: list) -> subprocess.CompletedProcess:
    """The one place nvcc runs to build a cubin (tests count calls here to prove cache hits)."""
    return subprocess.run(cmd, capture_output=True, text=True)


def compile_cubin(source: str, arch, flags=NVCC_FLAGS, cache: CompileCache | None = None) -> Cubin:
    """Compile a CUDA translation unit to a cubin for ``arch``; cached by (source, arch, flags, nvcc version)."""
    a = as_arch(arch)
    cache = COMPILE_CACHE if cache is None else cache
    nvcc = find_nvcc()
    key = cache_key(source, a.name, tuple(flags), _nvcc_version(nvcc))
    hit = cache.get(key)
    if hit is not None:
        data, log = hit
        return Cubin(data, log, a.name, key)
    with tempfile.TemporaryDirectory(prefix="mmaemit-") as tmp:
        src, out = Path(tmp) / "kernel.cu", Path(tmp) / "kernel.cubin"
        src.write_text(source)
        cmd = [nvcc, "-cubin", *arch_flags(a), *flags, "-o", str(out), str(src)]
        proc = _invoke_nvcc(cmd)
        log = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0 or not out.is_file():
            errors = [ln for ln in log.splitlines() if "error" in ln.lower()] or log.splitlines()[-20:]
            raise ToolchainError(f"nvcc failed for {a.name} (exit {proc.returncode}):\n" + "\n".join(errors[:20]))
        data = out.read_bytes()
    ptxas_log = "\n".join(ln for ln in log.splitlines() if ln.startswith("ptxas") or "bytes stack frame" in ln)
    cache.put(key, data, ptxas_log)
    return Cubin(data, ptxas_log, a.name, key)


_SASS_MEMO: dict = {}


def sass_of_cubin(cubin: Cubin) -> str:
    """``cuobjdump -sass`` of the cubin (memoised per cubin)."""
    text = _SASS_MEMO.get(cubin.key)
    if text is not None:
        return text
    tool = find_cuobjdump()
    with tempfile.TemporaryDirectory(prefix="mmaemit-") as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin.data)
        proc = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolchainError(f"cuobjdump -sass failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
    _SASS_MEMO[cubin.key] = proc.stdout
    return proc.stdout
