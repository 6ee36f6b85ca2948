"""Cost of register-A (RS) ``wgmma m64nNk16`` per SM against N: the question left open by the fused dequant kernel
(``docs/perf-notes.md``, "Third session", step 5: ~150 ns per 64-wide chunk per SM with almost no memory traffic,
whatever the consumer count, at N = block_m = 8 .. 64).

Every CTA (one per SM) runs ``wgs`` warpgroups; each issues ``iters`` times the 4 k16 steps of one 64-wide chunk
(``wgmma.fence``, 4 RS wgmmas into one accumulator, commit, ``wait_group 1``), the A registers and the shared B tile
all ones: the tensor-core work of the fused kernel's consumers without loads or decode. Reported: ns per
chunk per SM and cycles per wgmma per SM (at the SM clock read from the GPU). Prediction (the open hypothesis): at
N <= 64 the cycles per wgmma barely depend on N and 4 of them take ~250 cycles, the ablated kernel's floor; if
instead they scale with N, the tensor pipe is not what holds the fused kernel at M <= 64. Outcome (H100,
2026-11-27): 15-23 cycles per wgmma at N = 8 .. 32, 36-38 at N=64, then linear in N: refuted
(``docs/perf-notes.md``, "Fourth session").

    PYTHONPATH=. python3 benchmarks/wgmma_rs_rate.py [--ns 8 16 32 64 128 256] [--wgs 1 2 4] [--iters 4096]

Every accumulator ends at 64 x iters (64 products of ones per chunk, exact in fp32); each thread stores its first
one, which keeps the work alive and lets the script check the result.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHUNK = 64


def make_kernel(n, wgs, iters, sms=132, dtype="float16"):
    from tvm.script import tirx as T

    from mmaemit import WgmmaIntrinEmitter

    em = WgmmaIntrinEmitter(dtype, dtype, "float32", n, form="rs", block_k=CHUNK, swizzle_bytes=128, stages=(1,),
                            arch="sm_90a")
    NACC = em.local_size_c
    STEPS = em.k_steps

    @T.prim_func
    def rate(Out: T.Buffer((sms * wgs * 128,), "float32")):
        T.device_entry()
        cta = T.cta_id([sms])
        wg = T.warpgroup_id([wgs])
        tid = T.thread_id_in_wg([128])
        pool = T.SMEMPool()
        Bs = pool.alloc(em.b_shared_shape, dtype, align=1024)
        pool.commit()
        flat = T.decl_buffer((em.b_shared_shape[0] * em.b_shared_shape[1] * em.b_shared_shape[2],), dtype,
                             data=Bs.data, scope="shared.dyn")
        for i in T.serial((em.b_shared_shape[1] * em.b_shared_shape[2] + wgs * 128 - 1) // (wgs * 128)):
            if i * wgs * 128 + wg * 128 + tid < em.b_shared_shape[1] * em.b_shared_shape[2]:
                flat[i * wgs * 128 + wg * 128 + tid] = T.Cast(dtype, 1)
        T.ptx.fence.proxy.async_.shared__cta()
        T.cuda.cta_sync()
        acc = T.alloc_local((NACC,), "float32")
        af = T.alloc_local((4 * STEPS,), "uint32")
        for i in T.unroll(4 * STEPS):
            af[i] = T.uint32(0x3C003C00)
        desc = em.alloc_descriptor()
        em.init_descriptor(desc, Bs, "B")
        for it in T.serial(iters):
            em.fence()
            for ks in T.unroll(STEPS):
                em.mma([acc[i] for i in range(NACC)], [af[4 * ks + j] for j in range(4)], desc, ks, stage=(0,),
                       scale_d=it > 0 if ks == 0 else True)
            em.commit_group()
            em.wait_group(1)
        em.wait_group(0)
        em.pin_accumulators(acc)
        Out[(cta * wgs + wg) * 128 + tid] = acc[0]

    return rate


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    ap.add_argument("--wgs", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--iters", type=int, default=4096)
    args = ap.parse_args(argv)
    import torch

    import mmaemit
    from mmaemit.runtime.timing import median_time

    if not torch.cuda.is_available():
        print("wgmma_rs_rate needs an sm_90a GPU", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    sms = props.multi_processor_count
    clock_ghz = getattr(props, "clock_rate", 1755000) / 1e6      # kHz -> GHz (max SM clock)
    print(f"{props.name}, {sms} SMs, SM clock {clock_ghz:.3f} GHz (max; the run's clock may be lower)")
    print("| N | warpgroups / SM | ns per chunk per SM | cycles per wgmma per SM |")
    print("|---|---|---|---|")
    for n in args.ns:
        for wgs in args.wgs:
            if (n // 2 + 40) * 128 * wgs > 65536:
                # n/2 fp32 accumulators + ~40 registers per thread: more than the register file (ptxas refuses)
                print(f"| {n} | {wgs} | — (does not fit 64K registers) | — |", flush=True)
                continue
            k = mmaemit.compile(make_kernel(n, wgs, args.iters, sms), target="sm_90a")
            out = torch.empty(sms * wgs * 128, device="cuda")
            t = median_time(lambda: k(out), warmup=3, reps=10)
            if not bool((out == 64 * args.iters).all()):
                print(f"N={n} wgs={wgs}: wrong sums (expected {64 * args.iters}): {out.unique()[:4].tolist()}")
                return 1
            chunks = args.iters * wgs                    # per SM
            ns = t * 1e9 / chunks
            print(f"| {n} | {wgs} | {ns:.1f} | {ns * clock_ghz / 4:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
