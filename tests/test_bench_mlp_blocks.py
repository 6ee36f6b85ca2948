"""The merged blocks of ``benchmarks/bench_mlp.py`` compute what the separate ones do (CPU, QuantLinear's reference
op): gate / up stacked with ``QuantLinear.concat`` and split back by ``chunk``."""
import os
import sys

import torch

from mmaemit.nn import QuantLinear

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_mlp  # noqa: E402


def test_merged_mlp_equals_the_separate_mlp():
    torch.manual_seed(0)
    lins = [torch.nn.Linear(k, n, bias=False).half() for k, n in ((256, 128), (256, 128), (128, 256))]
    gate, up, down = (QuantLinear.from_linear(m, "int4") for m in lins)
    sep = bench_mlp.MLP(gate, up, down)
    merged = bench_mlp.MLPMerged(QuantLinear.concat([gate, up]), down)
    x = torch.randn(5, 256).half()
    assert torch.equal(merged(x), sep(x))
    # the stacked fp16 linear quantizes to the concat of the parts (per-row groups)
    stacked = QuantLinear.from_linear(bench_mlp.stacked(lins[0], lins[1]), "int4")
    assert torch.equal(stacked.dequantized_weight(), merged.gate_up.dequantized_weight())
