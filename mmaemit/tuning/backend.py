"""What the tuner needs from a machine, as one object: :class:`Backend`, and its GPU form :class:`CudaBackend`.

The tuner itself never touches TVM, CUDA or torch: it calls a backend, in three places.

* parent process: :meth:`~Backend.bind` (resolve device-dependent settings, e.g. the arch), :meth:`~Backend.fingerprint`
  (the device part of the table key), :meth:`~Backend.load` of the winner;
* compile workers: :meth:`~Backend.compile` of one candidate;
* the benchmark worker: :meth:`~Backend.setup` once, then per candidate :meth:`~Backend.load`, :meth:`~Backend.poison`
  of the outputs, :meth:`~Backend.run` + :meth:`~Backend.synchronize` for the correctness check, :meth:`~Backend.time`.

Backends are pickled into the worker processes: keep them small dataclasses. :class:`CudaBackend` is a thin adapter
over :func:`mmaemit.compile` (with the on-disk cubin cache) and :mod:`mmaemit.runtime.timing` (CUDA events, or
rotating input copies replayed as CUDA graphs for memory-bound kernels); tests inject a fake with the same methods.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["Backend", "CudaBackend", "prim_func_of", "default_check", "poison_tensor"]


#: whether this process has timed on the GPU yet (``CudaBackend.time``)
_GPU_WARM = False


class Backend:
    """Base class of tuning backends (override every method that raises)."""

    #: modules the worker processes import when they start (their cost is paid once per worker)
    preload: tuple = ()

    def bind(self) -> "Backend":
        """A copy with device-dependent settings resolved in the parent (default: self)."""
        return self

    def fingerprint(self) -> dict:
        """The device part of the table key: GPU, driver, toolchain and library versions."""
        raise NotImplementedError

    def compile(self, builder, args: dict, params: dict) -> dict:
        """Build candidate ``params`` (in a compile worker); returns facts to record (JSON-able), raises on failure."""
        raise NotImplementedError

    def load(self, builder, args: dict, params: dict):
        """The callable kernel of candidate ``params`` (cheap when :meth:`compile` ran before, in any process)."""
        raise NotImplementedError

    def setup(self) -> None:
        """Once per benchmark worker, before inputs are made."""

    def run(self, kernel, args) -> None:
        kernel(*args)

    def synchronize(self) -> None:
        """Wait for launched work (a GPU backend: so a failure or hang shows up inside the correctness check)."""

    def healthy(self) -> bool:
        """After a failed run: can this process go on measuring? (False: the worker is replaced.)"""
        return True

    def poison(self, value):
        """A fresh output buffer like ``value`` filled with a sentinel (NaN for floats) that a kernel must overwrite."""
        return poison_tensor(value)

    def time(self, kernel, args) -> float:
        """Seconds per call of ``kernel(*args)``."""
        raise NotImplementedError


def prim_func_of(built):
    """The PrimFunc of a builder's return value: a PrimFunc, or a tuple whose first item is one."""
    return built[0] if isinstance(built, tuple) else built


def poison_tensor(t):
    import torch

    if t.dtype.is_floating_point:
        if t.dtype.itemsize == 1:  # fp8: no NaN in every format; the largest-magnitude negative value instead
            return torch.full_like(t.float(), -torch.finfo(t.dtype).max).to(t.dtype)
        return torch.full_like(t, float("nan"))
    if t.dtype == torch.bool:
        return torch.zeros_like(t)
    return torch.full_like(t, torch.iinfo(t.dtype).min)


def default_check(outputs, expected, rtol: float) -> str | None:
    """None if every output matches its reference, else the reason. Integer outputs: exactly equal. Float outputs:
    finite, same shape, and ``||out - ref|| / ||ref|| <= rtol`` (Frobenius norms, computed in float64)."""
    import torch

    for i, (out, ref) in enumerate(zip(outputs, expected)):
        out_t, ref_t = torch.as_tensor(out), torch.as_tensor(ref)
        if tuple(out_t.shape) != tuple(ref_t.shape):
            return f"output {i}: shape {tuple(out_t.shape)}, reference {tuple(ref_t.shape)}"
        if not out_t.dtype.is_floating_point and not ref_t.dtype.is_floating_point:
            if not torch.equal(out_t.cpu().long(), ref_t.cpu().long()):
                bad = int((out_t.cpu().long() != ref_t.cpu().long()).sum())
                return f"output {i}: {bad} of {out_t.numel()} integers differ from the reference"
            continue
        o, r = out_t.double(), ref_t.to(out_t.device).double()
        if not torch.isfinite(o).all():
            return f"output {i}: {int((~torch.isfinite(o)).sum())} non-finite values (unwritten or overflow)"
        denom = r.norm().item() or 1.0
        rel = (o - r).norm().item() / denom
        if not rel <= rtol:
            return f"output {i}: relative error {rel:.2e} > rtol {rtol:.1e}"
    return None


@dataclass(frozen=True)
class CudaBackend(Backend):
    """Tuning on the visible GPU through :func:`mmaemit.compile` and :mod:`mmaemit.runtime.timing`.

    ``arch``: None = the visible GPU's. ``rotate``: argument indices of inputs large enough that timing repeated
    calls on one copy would measure L2 (weights of a memory-bound kernel): each call of a timed round then reads its
    own copy (:func:`~mmaemit.runtime.timing.time_rotating`, copies >= 4x L2, rounds replayed as a CUDA graph).
    Otherwise CUDA-event timing (:func:`~mmaemit.runtime.timing.median_time`) of ``reps`` calls after ``warmup``, with
    ``reps`` lowered for slow kernels so one measurement takes about ``budget_s``.
    """

    arch: str | None = None
    rotate: tuple = ()
    warmup: int = 5
    reps: int = 30
    budget_s: float = 0.5
    preload: tuple = ("torch", "tvm", "mmaemit.runtime", "mmaemit.tuning.tasks")

    def bind(self) -> "CudaBackend":
        if self.arch is not None:
            return self
        from ..arch import device_arch

        return dataclasses.replace(self, arch=device_arch().name)

    def fingerprint(self) -> dict:
        from .fingerprint import device_fingerprint

        fp = dict(device_fingerprint())
        if self.arch is not None:
            fp["arch"] = self.arch
        return fp

    def _kernel(self, builder, args, params):
        import mmaemit

        built = prim_func_of(builder(**args, **params))
        if isinstance(built, mmaemit.Kernel):
            return built
        return mmaemit.compile(built, target=self.arch, cubin_cache=True)

    def compile(self, builder, args, params) -> dict:
        kernel = self._kernel(builder, args, params)
        kernel.cubin()  # the binary and its ptxas report (on a GPU machine the JIT just built it: a cache hit)
        usage = kernel.resource_usage()
        return {"registers": usage.registers, "spill_bytes": usage.spill_bytes,
                "static_smem_bytes": usage.static_smem_bytes}

    def load(self, builder, args, params):
        return self._kernel(builder, args, params)

    def setup(self) -> None:
        import torch

        torch.cuda.init()

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def healthy(self) -> bool:
        # a faulting kernel (illegal address, trap) leaves the CUDA context unusable: every later call fails
        import torch

        try:
            torch.cuda.synchronize()
            torch.empty(1, device="cuda").add_(1)
            torch.cuda.synchronize()
            return True
        except Exception:
            return False

    def time(self, kernel, args) -> float:
        import torch

        from ..runtime.timing import copies_needed, median_time, time_rotating

        if self.rotate:
            nbytes = sum(args[i].numel() * args[i].element_size() for i in self.rotate)
            sets = []
            for c in range(copies_needed(nbytes)):
                a = list(args)
                if c:
                    for i in self.rotate:
                        a[i] = args[i].clone()
                sets.append(a)
            # the process's first timing warms an idle GPU up fully (200 ms), later candidates find it warm
            global _GPU_WARM
            warm, _GPU_WARM = _GPU_WARM, True
            return time_rotating([lambda a=a: kernel(*a) for a in sets], warmup_ms=25.0 if warm else 200.0) * 1e-6
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        kernel(*args)
        end.record()
        end.synchronize()
        one = max(start.elapsed_time(end) * 1e-3, 1e-7)
        reps = int(max(3, min(self.reps, self.budget_s / one)))
        return median_time(lambda: kernel(*args), warmup=min(self.warmup, reps), reps=reps)
