"""Cubin cache: in memory, and on disk under ``$MMAEMIT_CACHE_DIR`` (default ``~/.cache/mmaemit``).

An entry is ``<key>.cubin`` plus ``<key>.json`` (the ptxas report and the cubin's sha256). Both are written to a
temporary file and renamed into place, the JSON last, so a reader sees a whole entry or none; an entry whose JSON
does not parse, whose hash does not match or whose cubin is not an ELF file is ignored (and rewritten).
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

__all__ = ["CompileCache", "cache_dir", "cache_key"]

_FORMAT = 1
_ELF_MAGIC = b"\x7fELF"


def cache_dir() -> Path:
    """``$MMAEMIT_CACHE_DIR`` or ``~/.cache/mmaemit``, read at each use (so tests and users can redirect it)."""
    env = os.environ.get("MMAEMIT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "mmaemit"


def cache_key(source: str, arch: str, flags: tuple, tool_version: str) -> str:
    blob = json.dumps([_FORMAT, source, arch, list(flags), tool_version])
    return hashlib.sha256(blob.encode()).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class CompileCache:
    """Maps a key to ``(cubin bytes, ptxas log)``. Counts ``memory_hits``, ``disk_hits`` and ``misses``."""

    def __init__(self):
        self._memory: dict = {}
        self.memory_hits = 0
        self.disk_hits = 0
        self.misses = 0

    def clear_memory(self) -> None:
        self._memory.clear()

    def get(self, key: str):
        hit = self._memory.get(key)
        if hit is not None:
            self.memory_hits += 1
            return hit
        hit = self._read_disk(key)
        if hit is not None:
            self.disk_hits += 1
            self._memory[key] = hit
            return hit
        self.misses += 1
        return None

    def put(self, key: str, cubin: bytes, ptxas_log: str) -> None:
        self._memory[key] = (cubin, ptxas_log)
        directory = cache_dir()
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _atomic_write(directory / f"{key}.cubin", cubin)
            meta = {"format": _FORMAT, "sha256": hashlib.sha256(cubin).hexdigest(), "ptxas_log": ptxas_log}
            _atomic_write(directory / f"{key}.json", json.dumps(meta).encode())
        except OSError:
            pass  # a read-only or full disk only costs recompiles

    @staticmethod
    def _read_disk(key: str):
        directory = cache_dir()
        try:
            meta = json.loads((directory / f"{key}.json").read_text())
            data = (directory / f"{key}.cubin").read_bytes()
        except (OSError, ValueError):
            return None
        if (not isinstance(meta, dict) or meta.get("format") != _FORMAT or not data.startswith(_ELF_MAGIC)
                or meta.get("sha256") != hashlib.sha256(data).hexdigest()
                or not isinstance(meta.get("ptxas_log"), str)):
            return None
        return data, meta["ptxas_log"]
