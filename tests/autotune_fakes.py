"""Fake kernels and a fake backend for the autotuner's CPU tests (imported by name in the worker processes).

A fake "kernel" computes ``out = x * scale`` on CPU tensors; its ``mode`` makes it misbehave in one way: fail or hang
while compiling (the hang spawns a ``sleep`` grandchild, as a stuck ptxas under nvcc would be), be rejected as an
invalid configuration, raise or hang when run, or compute a wrong result. Its time is its ``speed`` parameter, so the
expected winner is known. Every compile / load is appended, with the pid, to the file named by ``FakeBackend.log``.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

import torch

from mmaemit.errors import TileShapeError
from mmaemit.tuning import Backend, autotune

FINGERPRINT = (("gpu", "FakeGPU 80GB"), ("arch", "sm_90a"), ("driver", "580.1"), ("cuda", "driver 13.0, runtime 13.0"),
               ("tvm", "0.27.0"), ("mmaemit", "0.1.0"), ("torch", "2.13"), ("nvcc", "13.0"))


def log(event: str, detail: str = "") -> None:
    path = os.environ.get("AUTOTUNE_FAKES_LOG")
    if path:
        with open(path, "a") as f:
            f.write(f"{event} {os.getpid()} {detail}\n")


def read_log(path) -> list:
    try:
        return [ln.split(" ", 2) for ln in open(path).read().splitlines()]
    except OSError:
        return []


@dataclass(frozen=True)
class FakeProgram:
    n: int
    scale: float
    speed: float
    mode: str

    def __call__(self, x, out):
        if self.mode == "run_hang":
            time.sleep(3600)
        if self.mode == "run_error":
            raise RuntimeError("illegal memory access (fake)")
        out.copy_(x * self.scale + (1.0 if self.mode == "wrong" else 0.0))


def fake_builder(n, scale=2.0, *, speed, mode="ok"):
    if mode == "invalid":
        raise TileShapeError(f"n={n} is not a multiple of the fake tile")
    if mode == "compile_error":
        raise RuntimeError("ptxas fatal: fake internal error")
    if mode == "compile_hang":
        child = subprocess.Popen(["sleep", "3600"])
        log("hang", f"{child.pid}")
        child.wait()
    return FakeProgram(n, scale, speed, mode)


@dataclass(frozen=True)
class FakeBackend(Backend):
    fp: tuple = FINGERPRINT
    log: str = ""
    preload: tuple = ("torch", "mmaemit.tuning.tasks", "autotune_fakes")

    def fingerprint(self) -> dict:
        return dict(self.fp)

    def compile(self, builder, args, params) -> dict:
        os.environ["AUTOTUNE_FAKES_LOG"] = self.log
        log("compile", repr(sorted(params.items())))
        prog = builder(**args, **params)
        return {"fake": True, "mode": prog.mode}

    def load(self, builder, args, params):
        os.environ["AUTOTUNE_FAKES_LOG"] = self.log
        log("load", repr(sorted(params.items())))
        return builder(**args, **params)

    def time(self, kernel, args) -> float:
        kernel(*args)
        return kernel.speed * 1e-6


def fake_inputs(args):
    x = torch.arange(args["n"], dtype=torch.float32)
    return x, torch.empty_like(x)


def fake_reference(args, arguments):
    return arguments[0] * args["scale"]


def failing_reference(args, arguments):
    raise ValueError("reference exploded (fake)")


def always_keep(params, args):
    return True


# a decorated builder (stacked decorators), as a user would write one
@autotune("speed", [3.0, 2.0, 5.0])
@autotune(mode=["ok"], inputs=fake_inputs, reference=fake_reference, outputs=[1], backend=FakeBackend(),
          default={"speed": 5.0}, progress=False)
def stacked_builder(n, scale=2.0, *, speed, mode):
    return fake_builder(n, scale, speed=speed, mode=mode)


def main_tune_in_subprocess(n: int, cache_dir: str, log_path: str) -> None:
    """Used by the two-process tests: tune (or look up) stacked_builder for n and print what happened."""
    import json

    os.environ["MMAEMIT_CACHE_DIR"] = cache_dir
    tk = stacked_builder.with_options(backend=FakeBackend(log=log_path))
    t0 = time.perf_counter()
    result = tk.tune(n)
    kernel = tk(n)
    print(json.dumps({"source": result.source, "winner": result.winner, "seconds": time.perf_counter() - t0,
                      "kernel_speed": kernel.speed}))
