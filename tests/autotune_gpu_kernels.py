"""A real kernel for the autotuner's GPU tests: Y = 2 X, and per thread ``spin`` x ``spin`` steps of an integer
recurrence seeded from X and stored to Z (so no compiler can drop or fold it). ``spin`` = 2**20: about 10^12
dependent steps, a kernel that does not finish in any test's lifetime."""
from tvm.script import tirx as T


def spin_kernel(n, *, spin):
    @T.prim_func
    def spin_scale(X: T.Buffer((n,), "float32"), Y: T.Buffer((n,), "float32"), Z: T.Buffer((n,), "uint32")):
        T.device_entry()
        bx = T.cta_id([n // 128])
        warp = T.warp_id([4])
        lane = T.lane_id([32])
        i = T.meta_var(bx * 128 + warp * 32 + lane)
        acc = T.alloc_local((1,), "uint32")
        acc[0] = T.reinterpret("uint32", X[i])
        for a in T.serial(spin):
            for b in T.serial(spin):
                # quadratic, not affine: an affine recurrence composes into one affine map (the H100 ran spin=256
                # in 40 us, as fast as spin=0 under load: ptxas folded it), x * x + c does not
                acc[0] = acc[0] * acc[0] + T.uint32(1013904223)
        Z[i] = acc[0]
        Y[i] = X[i] * T.float32(2)

    return spin_scale


def spin_inputs(args):
    import torch

    X = torch.randn(args["n"], device="cuda")
    return X, torch.empty_like(X), torch.empty(args["n"], dtype=torch.uint32, device="cuda")


def spin_reference(args, arguments):
    return arguments[0] * 2
