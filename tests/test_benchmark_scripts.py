"""Pieces of the benchmark scripts that can be checked without a GPU: ``bench_mlp``'s merged blocks compute what the
separate ones do (QuantLinear's reference op); ``wgmma_rs_rate``'s kernel runs clean on the interpreter;
``profile_dequant_path`` runs and checks a plan path on the interpreter."""
import os
import sys

import torch

from mmaemit.nn import QuantLinear

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

import bench_mlp  # noqa: E402
import profile_dequant_path  # noqa: E402
import wgmma_rs_rate  # noqa: E402


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


def test_gated_mlp_and_its_exact_twin_match_the_separate_mlp():
    """``mlp_gated``'s quantized block (QuantGatedLinear + down) computes the separate MLP (down(silu(g) * u), the
    gate in float32 instead of after rounding g and u: within 2e-3), and ``exact_twin`` handles its gated layer."""
    from mmaemit.nn import QuantGatedLinear

    torch.manual_seed(0)
    lins = [torch.nn.Linear(k, n, bias=False).half() for k, n in ((256, 128), (256, 128), (128, 256))]
    gate, up, down = (QuantLinear.from_linear(m, "int4") for m in lins)
    sep = bench_mlp.MLP(gate, up, down)
    gated = bench_mlp.MLPGated(QuantGatedLinear.from_layers(gate, up), down)
    x = torch.randn(5, 256).half()
    y, r = gated(x).double(), sep(x).double()
    assert ((y - r).norm() / r.norm()).item() < 2e-3
    twin = bench_mlp.exact_twin(gated, torch.float16, device="cpu")
    assert ((y - twin(x.float()).double()).norm() / r.norm()).item() < 2e-3


def test_wgmma_rs_rate_kernel_on_the_interpreter():
    """The RS wgmma rate kernel (fence, 4 RS wgmmas, commit, wait_group 1 per chunk; A and B all ones) on 2 CTAs of
    2 warpgroups, 3 chunks: no fault, and every stored sum is 64 products per chunk x 3 chunks."""
    import numpy as np

    import mmaemit

    out = np.full(2 * 2 * 128, np.nan, np.float32)
    report = mmaemit.interpret(wgmma_rs_rate.make_kernel(16, 2, 3, sms=2), out, arch="sm_90a")
    assert report.ok and np.array_equal(out, np.full_like(out, 64 * 3))


def test_profile_dequant_path_on_the_interpreter(capsys):
    """The profiling entry runs a DequantGemm path (fused160 at a ragged M: with N = 128 the plan's one-wave
    160 x 64 k_split tile) on a NaN-poisoned output, checks it and exits 0; an unknown path names the runnable ones."""
    import pytest

    from mmaemit.errors import ArgumentError

    assert profile_dequant_path.main(["--shape", "128x1024", "--path", "fused160", "--m", "140", "--interpret",
                                      "--launches", "1"]) == 0
    assert "fused160 M=140 128x1024 int4" in capsys.readouterr().out
    with pytest.raises(ArgumentError, match="runnable: .*fused64"):
        profile_dequant_path.main(["--shape", "128x1024", "--path", "fused999", "--m", "5", "--interpret"])


def test_stream_k_study_checks_on_the_interpreter():
    """``stream_k_study``'s check (poisoned outputs, tolerance, repeat launches) passes for the stream-K and the
    data-parallel kernels of a small plan on the interpreter, whose last wave is in pieces; case strings parse."""
    import stream_k_study

    assert stream_k_study.parse_case("28672x8192:fused128:100,128") == (28672, 8192, "fused128", [100, 128])
    assert stream_k_study.check_on_interpreter() <= 0.05


def test_wave_fill_study_checks_on_the_interpreter():
    """``wave_fill_study``'s check (poisoned output, tolerance) passes for both plans of a small problem where the
    wave-filling plan takes fused32 in two rows and the M-only plan fused64; ``--set``-style settings of the stream-K
    study parse."""
    import stream_k_study
    import wave_fill_study

    assert wave_fill_study.check_on_interpreter() == ("fused32", "fused64")
    assert stream_k_study.parse_setting("handover=parallel") == ("handover", "parallel")
    assert stream_k_study.parse_setting("stream_k_waves=None") == ("stream_k_waves", None)
    # --field: another bool field off and on, the rest of the path's default config kept
    objs = stream_k_study.plans([(4096, 4096, "fused128x2", [300])], "float16", field="fit_rows")
    cfgs = {on: objs[(4096, 4096, "fused128x2", on)].configs["fused128x2"] for on in (False, True)}
    assert [c.fit_rows for c in cfgs.values()] == [False, True] and cfgs[False].stream_k == cfgs[True].stream_k
