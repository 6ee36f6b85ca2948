"""Llama-3-8B-shaped blocks with int4 g128 QuantLinear vs the fp16 modules, same run (needs a GPU).

MLP: gate / up 4096 -> 14336, SiLU gating, down 14336 -> 4096. Attention projections: q / o 4096 -> 4096,
k / v 4096 -> 1024 (GQA, 8 KV heads). ``mlp_gated``: the quantized MLP with gate / up as one ``QuantGatedLinear``
(one GEMM, SiLU gating in the GEMV's epilogue at M <= 16) against the same fp16 ``mlp`` module. ``mlp_merged`` /
``attn_merged``: the same weights with gate / up and q / k / v
stacked into one layer on both sides (``QuantLinear`` of the stacked fp16 weight, equal to ``QuantLinear.concat`` of
the parts: per-row quantization; the fp16 side one ``nn.Linear``), as serving stacks deploy them. Random weights
(std 0.02), quantized round-to-nearest int4 with group 128 (``QuantLinear.from_linear``). Correctness first, at every
M: the quantized block against (a) the same block on the exactly dequantized weights in fp32 (the kernels' own error:
tight) and (b) the fp16 module (quantization error included: reported; random std-0.02 weights in int4 RTN g128 lose
~10 % per layer, ~21 % through the gated MLP, so that check only catches gross errors, at 0.3). Then both blocks are
captured in CUDA graphs and timed by CUDA-event medians of the replays (``mmaemit.runtime.timing.median_time``; GPU
time without Python overhead; the blocks' weights exceed the 50 MB L2, so no rotation).

    PYTHONPATH=. python3 benchmarks/bench_mlp.py [--ms 1 16 64 256 2048] [--dtype float16] [--out bench-results]
"""
import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mmaemit.bench.report import environment, header_lines  # noqa: E402
import mmaemit.nn as mmaemit_nn  # noqa: E402
from mmaemit.kernels.gated import gate_torch, split_gated  # noqa: E402
from mmaemit.nn import QuantGatedLinear, QuantLinear  # noqa: E402
from mmaemit.runtime.timing import median_time  # noqa: E402

HIDDEN, INTER, KV = 4096, 14336, 1024


def linear(k, n, dtype, gen):
    lin = torch.nn.Linear(k, n, bias=False, device="cuda", dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=gen, device="cuda") * 0.02)
    return lin


class MLP(torch.nn.Module):
    def __init__(self, gate, up, down):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Attn(torch.nn.Module):
    """The four projections of one attention layer (the attention itself is not a GEMM with weights)."""

    def __init__(self, q, k, v, o):
        super().__init__()
        self.q, self.k, self.v, self.o = q, k, v, o

    def forward(self, x):
        return torch.cat([self.o(self.q(x)), self.k(x), self.v(x)], dim=-1)


class MLPMerged(torch.nn.Module):
    def __init__(self, gate_up, down):
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x):
        g, u = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(g) * u)


class MLPGated(torch.nn.Module):
    """The quantized side of ``mlp_gated``: gate / up as one ``QuantGatedLinear`` (one GEMM over the interleaved
    weights, SiLU gating in the GEMV's epilogue at M <= 16), then down; its fp16 peer is the plain ``mlp`` module."""

    def __init__(self, gate_up, down):
        super().__init__()
        self.gate_up, self.down = gate_up, down

    def forward(self, x):
        return self.down(self.gate_up(x))


class _GatedTwin(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return gate_torch("silu", *split_gated(self.lin(x)))


class AttnMerged(torch.nn.Module):
    def __init__(self, qkv, o):
        super().__init__()
        self.qkv, self.o = qkv, o

    def forward(self, x):
        q, k, v = self.qkv(x).split([HIDDEN, KV, KV], dim=-1)
        return torch.cat([self.o(q), k, v], dim=-1)


def stacked(*lins):
    """One nn.Linear whose weight is the parts' weights stacked (same input)."""
    w = torch.cat([m.weight.detach() for m in lins])
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
    with torch.no_grad():
        lin.weight.copy_(w)
    return lin


def exact_twin(block, dtype, device="cuda"):
    """The same block with every QuantLinear replaced by an fp32 nn.Linear on its exactly dequantized weights (a
    QuantGatedLinear by that of its interleaved weight, then the float32 gate)."""
    mods = {}
    for name, m in block.named_children():
        w = m.dequantized_weight().to(device)
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=device, dtype=torch.float32)
        with torch.no_grad():
            lin.weight.copy_(w)
        mods[name] = _GatedTwin(lin) if isinstance(m, QuantGatedLinear) else lin
    return type(block)(**mods)


def graph_time(block, x):
    """µs per call of ``block(x)`` captured in a CUDA graph (GPU time: no Python / op-dispatch overhead on either
    side), CUDA-event median of graph replays."""
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            block(x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            block(x)
    t = median_time(graph.replay) * 1e6
    del graph
    return t


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[1, 16, 64, 256, 2048])
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16"])
    ap.add_argument("--blocks", nargs="+", default=["mlp", "attn"],
                    choices=["mlp", "attn", "mlp_merged", "attn_merged", "mlp_gated"])
    ap.add_argument("--out", default="bench-results")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mlp needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator(device="cuda").manual_seed(0)
    fp = {"mlp": MLP(linear(HIDDEN, INTER, dtype, gen), linear(HIDDEN, INTER, dtype, gen),
                     linear(INTER, HIDDEN, dtype, gen)),
          "attn": Attn(linear(HIDDEN, HIDDEN, dtype, gen), linear(HIDDEN, KV, dtype, gen),
                       linear(HIDDEN, KV, dtype, gen), linear(HIDDEN, HIDDEN, dtype, gen))}
    fp["mlp_merged"] = MLPMerged(stacked(fp["mlp"].gate, fp["mlp"].up), fp["mlp"].down)
    fp["attn_merged"] = AttnMerged(stacked(fp["attn"].q, fp["attn"].k, fp["attn"].v), fp["attn"].o)
    lines = header_lines(environment(), "python3 benchmarks/bench_mlp.py " + " ".join(argv or sys.argv[1:]))
    lines += ["", f"int4 g128 QuantLinear (mmaemit DequantGemm) vs the {args.dtype} module (cuBLAS via torch), "
              f"same run; µs = CUDA-event median of CUDA-graph replays of the whole block", "",
              "| block | M | mmaemit µs | fp16 module µs | speedup | rel err vs exact dequant | rel err vs fp16 module |",
              "|---|---|---|---|---|---|---|"]
    failed = False
    for name in args.blocks:
        block = fp["mlp" if name == "mlp_gated" else name]
        t0 = time.time()
        if name == "mlp_gated":
            q = MLPGated(QuantGatedLinear.from_linears(block.gate, block.up, "int4", group_size=128),
                         QuantLinear.from_linear(block.down, "int4", group_size=128))
        else:
            q = type(block)(**{n: QuantLinear.from_linear(m, "int4", group_size=128)
                               for n, m in block.named_children()})
        twin = exact_twin(q, dtype)
        print(f"{name}: quantized and repacked in {time.time() - t0:.1f} s", flush=True)
        print(f"{name}: every M path of every layer shape compiled in {mmaemit_nn.warmup(q):.1f} s "
              f"(mmaemit.nn.warmup, worker processes)", flush=True)
        for M in args.ms:
            x = torch.randn(M, HIDDEN, device="cuda", generator=gen).to(dtype)
            t0 = time.time()
            with torch.no_grad():
                y = q(x)
                torch.cuda.synchronize()
                first = time.time() - t0
                e_exact = rel(y, twin(x.float()))
                e_fp = rel(y, block(x))
            ok = not torch.isnan(y).any().item() and e_exact < (1e-2 if dtype == torch.float16 else 3e-2) \
                and e_fp < 0.3
            failed |= not ok
            with torch.no_grad():
                tq = graph_time(q, x)
                tf = graph_time(block, x)
            row = (f"| {name} | {M} | {tq:.1f} | {tf:.1f} | {tf / tq:.2f}x | {e_exact:.1e} | {e_fp:.1e}"
                   f"{'' if ok else ' WRONG'} |")
            print(row + f"  (first call incl. compile {first:.1f} s)", flush=True)
            lines.append(row)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "mlp.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
