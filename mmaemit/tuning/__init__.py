"""Autotuning: parameter spaces, parallel compilation in worker processes, isolated and checked benchmarks, and a
persistent on-disk table of winners.

* ``autotune`` (decorator; stack several), ``tune`` (function form), ``TunedKernel``, ``TuneResult``,
  ``CandidateResult``, ``autotune_mode`` (:mod:`.tuner`)
* ``Space``, ``jsonable`` (:mod:`.space`); ``TuningTable`` (:mod:`.table`); ``Backend``, ``CudaBackend``,
  ``default_check`` (:mod:`.backend`); ``device_fingerprint``, ``source_hash`` (:mod:`.fingerprint`);
  ``WorkerPool``, ``FunctionRef`` (:mod:`.pool`)
"""
from .backend import Backend, CudaBackend, default_check
from .fingerprint import device_fingerprint, source_hash
from .pool import FunctionRef, WorkerPool, shutdown_shared_pools
from .space import Space, jsonable
from .table import TuningTable, table_dir
from .tuner import CandidateResult, TunedKernel, TuneResult, autotune, autotune_mode, tune

__all__ = ["autotune", "tune", "TunedKernel", "TuneResult", "CandidateResult", "autotune_mode", "Space", "jsonable",
           "TuningTable", "table_dir", "Backend", "CudaBackend", "default_check", "device_fingerprint",
           "source_hash", "FunctionRef", "WorkerPool", "shutdown_shared_pools"]
