"""The persistent tuning table: winners per (kernel source, candidate set, key, device), on disk, file-locked.

One JSON file per tuned kernel under ``$MMAEMIT_CACHE_DIR/autotune/`` (``~/.cache/mmaemit/autotune/``)::

    {"format": 1, "entries": {<entry key>: {"kernel": ..., "key": {...}, "device": {...}, "source": <sha256>,
                                            "space": <sha256>, "winner": {...}, "time_s": ..., "candidates": [...],
                                            "date": ..., "tuning_s": ...}}}

The entry key is the sha256 of the kernel name, its source hash, its candidate-set hash, the key values and the device
fingerprint (:func:`entry_key`), so a change of any of them is a miss. Every read and every read-modify-write holds
``<file>.lock`` (``filelock``); writes go to a temporary file renamed into place, so a crash never leaves half a file.
A file that does not parse is treated as empty (and rewritten on the next store). :meth:`TuningTable.tuning_lock` is a
second, per-entry lock that a process holds while it tunes, so two processes never time kernels on the same GPU for
the same entry at once: the second waits, then finds the first one's winner.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from filelock import FileLock

from ..runtime.cache import cache_dir
from .space import digest

__all__ = ["TuningTable", "entry_key", "table_dir"]

_FORMAT = 1


def table_dir() -> Path:
    """``$MMAEMIT_CACHE_DIR/autotune`` (read at each use)."""
    return cache_dir() / "autotune"


def entry_key(kernel: str, source: str, space: str, key: dict, device: dict) -> str:
    return digest({"format": _FORMAT, "kernel": kernel, "source": source, "space": space, "key": key,
                   "device": device})


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:150] or "kernel"


class TuningTable:
    """The on-disk table of one tuned kernel (``name``: its qualified name)."""

    def __init__(self, name: str, directory=None):
        self.name = name
        self.directory = Path(directory) if directory is not None else table_dir()
        self.path = self.directory / f"{_safe(name)}.json"
        self.lock_path = self.directory / f"{_safe(name)}.json.lock"

    def _lock(self, timeout: float = 120.0) -> FileLock:
        self.directory.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.lock_path), timeout=timeout)

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
            return {}
        return data["entries"]

    def entries(self) -> dict:
        """Every entry (entry key -> entry dict)."""
        if not self.path.exists():
            return {}
        with self._lock():
            return self._read()

    def get(self, key: str):
        """The entry stored under ``key``, or None."""
        if not self.path.exists():
            return None
        with self._lock():
            return self._read().get(key)

    def _write(self, entries: dict) -> None:
        blob = json.dumps({"format": _FORMAT, "entries": entries}, indent=1, sort_keys=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=self.path.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(blob)
            os.replace(tmp, self.path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def put(self, key: str, entry: dict) -> None:
        """Store ``entry`` under ``key`` (read-modify-write under the lock, atomic replace)."""
        with self._lock():
            entries = self._read()
            entries[key] = entry
            self._write(entries)

    def remove(self, key: str) -> bool:
        """Drop one entry; True if it was there."""
        with self._lock():
            entries = self._read()
            if key not in entries:
                return False
            del entries[key]
            self._write(entries)
            return True

    def tuning_lock(self, key: str, timeout: float = -1) -> FileLock:
        """The lock a process holds while it tunes entry ``key`` (``timeout`` -1: wait as long as it takes)."""
        d = self.directory / "locks"
        d.mkdir(parents=True, exist_ok=True)
        return FileLock(str(d / f"{key[:32]}.lock"), timeout=timeout)
