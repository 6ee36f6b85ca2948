"""Measured plans (``mmaemit.kernels.dequant_plan``) and ``DequantGemm.set_plan``: span validation, the choice per
bucket from a cost model (no kernels run), a set plan's calls on the interpreter, and on the GPU a real measurement
stored, found again and used by ``torch.ops.mmaemit.dequant_linear``."""
import dataclasses

import pytest
import torch

from mmaemit import dequant as D
from mmaemit.dequant.kernel_layout import kernel_arguments
from mmaemit.errors import ArgumentError, UnsupportedConfigError
from mmaemit.kernels.dequant_dispatch import DequantGemm, span_path
from mmaemit.kernels.dequant_plan import (PLAN_STEP, MeasuredPlan, measure_plan, plan_buckets, plan_candidates,
                                          stored_plan)


def _gemm(n=4096, k=14336, **kw):
    return DequantGemm(n, k, arch="sm_90a", interpret=True, **kw)


def _covers(ranges):
    nxt = 1
    for p, lo, hi in ranges:
        assert lo == nxt, ranges
        nxt = None if hi is None else hi + 1
    assert nxt is None, ranges


def test_set_plan_spans_and_errors():
    g = _gemm()
    rules = list(g.rule_ranges)
    g.set_plan([("gemv8", 1, 8), ("gemv16", 9, 16), ("fused64", 17, 100)])
    _covers(g.ranges)
    assert g.path_for(17) == g.path_for(100) == "fused64"
    assert all(g.path_for(m) == span_path(rules, m) for m in (101, 200, 600, 5000))
    assert g.spec()["plan"] == [("gemv8", 1, 8), ("gemv16", 9, 16), ("fused64", 17, 100)]
    assert DequantGemm(**g.spec()).ranges == g.ranges          # a worker rebuilds the same plan
    # a span joined to the rules' span of the same path above it
    g.set_plan([("gemv8", 1, 8), ("gemv16", 9, 16), ("fused32", 17, 20)])
    assert ("fused32", 17, 32) in g.ranges
    assert g.set_plan(None).ranges == rules and g.spec()["plan"] is None
    for bad, err, text in [
            ([("gemv8", 2, 8)], ArgumentError, "start at 1"),
            ([("gemv8", 1, 8), ("gemv16", 10, 16)], ArgumentError, "start at 9"),
            ([("gemv8", 1, 16)], ArgumentError, "M <= 8"),
            ([("fused64", 1, 0)], ArgumentError, "start at 1"),
            ([("nope", 1, 8)], UnsupportedConfigError, "valid:"),
            ([("gemv8", 1, 8.0)], ArgumentError, "int bounds"),
            ([("gemv8", 1)], ArgumentError, "(path, first M, last M)"),
            ([], ArgumentError, "at least one span")]:
        with pytest.raises(err, match=text.replace("(", r"\(").replace(")", r"\)")):
            g.set_plan(bad)
    assert g.ranges == rules                                    # a rejected plan leaves the plan in use alone


def test_buckets_and_candidates():
    assert plan_buckets(64) == [(17, 32), (33, 48), (49, 64)]
    for bad in (40, 16, 0, True, 64.0):
        with pytest.raises(ArgumentError, match="multiple of 16"):
            plan_buckets(bad)
    g = _gemm()
    for lo, hi in plan_buckets(512):
        c = plan_candidates(g, lo, hi)
        assert g.path_for(hi) in c and len(set(c)) == len(c)
        for p in c:
            bm = g.configs[p].block_m
            assert -(-hi // bm) <= 8
            # every M of the bucket gives each candidate the same tile rows as the timed one
            assert len({-(-m // bm) for m in range(lo, hi + 1)}) == 1, (p, lo, hi)
    assert "fused256" not in plan_candidates(g, 17, 32) and "fused32" in plan_candidates(g, 17, 32)
    two = plan_candidates(g, 497, 512, max_rows=2)
    assert "fused128x2" in two                                  # the rules' path, at 4 rows
    assert all(-(-512 // g.configs[p].block_m) <= 2 for p in two if p != "fused128x2") and "fused128" not in two


def _model(g, fast, factor):
    """A cost model: µs = rows of tiles x tile height (the padded M), ``fast`` paths ``factor`` of that."""
    def timer(path, M, base):
        bm = g.configs[path].block_m
        return -(-M // bm) * bm * (factor if path in fast else 1.0) + 5.0
    return timer


def test_measure_plan_choice_from_a_cost_model():
    g = _gemm()
    rules = list(g.rule_ranges)
    calls = []
    model = _model(g, {"fused64"}, 0.9)
    plan = measure_plan(g, max_m=256, timer=lambda p, m, b: calls.append((p, m, b)) or model(p, m, b),
                        progress=False, rounds=2)
    assert isinstance(plan, MeasuredPlan) and plan.max_m == 256 and g.ranges[-1] == rules[-1]
    _covers(g.ranges)
    assert all(b == span_path(rules, m) for _, m, b in calls)
    his = {hi for _, hi in plan_buckets(256)}
    assert his <= {m for _, m, _ in calls} <= his | {lo for lo, _ in plan_buckets(256)}
    # the rules' path is timed first in each round
    firsts = [calls[i] for i in range(len(calls)) if i == 0 or calls[i - 1][1] != calls[i][1]]
    assert all(p == b for p, _, b in firsts)
    for m, t in plan.times.items():
        best = min(t, key=t.get)
        r = plan.rule[m]
        assert set(t) == set(plan_candidates(g, m - PLAN_STEP + 1, m))
        if t[best] < t[r] * (1 - 0.03):
            lo = plan.low[m]
            assert lo["rule"] == span_path(rules, m - PLAN_STEP + 1) and best in lo["times"]
            assert plan.chosen[m] is not None and g.path_for(m) == g.path_for(m - PLAN_STEP + 1) == plan.chosen[m]
            c = plan.chosen[m]
            assert plan.gain(m) == pytest.approx(min(t[r] / t[c], lo["times"][lo["rule"]] / lo["times"][c]))
            assert plan.gain(m) > 1 / 0.97
        else:
            assert plan.chosen[m] is None and plan.gain(m) == 1.0 and m not in plan.low
            assert all(g.path_for(x) == span_path(rules, x) for x in range(m - PLAN_STEP + 1, m + 1))
    assert any(plan.chosen.values()) and not all(plan.chosen.values())
    assert all(g.path_for(m) == p for p, lo, hi in rules if hi is not None and hi <= 16 for m in range(lo, hi + 1))
    assert "rules" in plan.text() and "x)" in plan.text()
    again = MeasuredPlan.from_json(plan.to_json())
    assert again == plan
    assert DequantGemm(**dict(g.spec(), plan=again)).ranges == g.ranges


def test_measure_plan_first_m_of_a_bucket():
    """A path that wins at a bucket's last M but loses at its first M (a nearly empty last tile row) is not
    chosen; one that wins at both is."""
    g = _gemm(4096, 4096)

    def timer(p, m, base):
        if p == "fused32" and m > 32:                         # two rows: fast at 48, slow at 33
            return 8.0 if m % 16 == 0 else 12.0
        return 10.0
    plan = measure_plan(g, max_m=48, timer=timer, progress=False, adopt=False)
    assert plan.rule[48] == "fused48" and plan.times[48]["fused32"] == 8.0 and plan.low[48]["times"]["fused32"] == 12
    assert plan.chosen[48] is None and plan.spans[-1] == ("fused48", 33, 48)
    plan = measure_plan(g, max_m=48, timer=lambda p, m, b: 8.0 if p == "fused32" else 10.0, progress=False)
    assert plan.chosen[48] == "fused32" and plan.gain(48) == pytest.approx(1.25) and g.path_for(33) == "fused32"


def test_measure_plan_margin_drops_and_errors():
    g = _gemm()
    plan = measure_plan(g, max_m=128, timer=_model(g, {"fused64", "fused32", "fused96", "fused128"}, 0.98),
                        progress=False, adopt=False)
    assert g.ranges == g.rule_ranges                           # adopt=False
    for m, c in plan.chosen.items():                           # 2 % faster is noise under the 3 % margin
        if c is not None:
            assert plan.times[m][c] < 0.97 * plan.times[m][plan.rule[m]]
    plan0 = measure_plan(g, max_m=128, timer=_model(g, {"fused64", "fused32", "fused96", "fused128"}, 0.98),
                         margin=0.0, progress=False, adopt=False)
    assert sum(c is not None for c in plan0.chosen.values()) >= sum(c is not None for c in plan.chosen.values())

    def failing(p, m, b):
        return None if p == "fused64" else 10.0
    plan = measure_plan(g, max_m=64, timer=failing, progress=False, adopt=False)
    assert all("fused64" not in t for t in plan.times.values()) and "fused64" in plan_candidates(g, 49, 64)
    assert plan.dropped[48]["fused64"] == plan.dropped[64]["fused64"] == "timer returned None"
    with pytest.raises(RuntimeError, match="rules' path"):
        measure_plan(g, max_m=64, timer=lambda p, m, b: None, progress=False)
    with pytest.raises(ArgumentError, match="CUDA GPU"):
        measure_plan(g, max_m=64, progress=False)
    for kw in (dict(rounds=0), dict(margin=1.0), dict(rtol=0), dict(max_rows=0), dict(rounds=True)):
        with pytest.raises(ArgumentError, match="valid:"):
            measure_plan(g, max_m=64, timer=failing, progress=False, **kw)
    with pytest.raises(ArgumentError, match="fused Hopper paths"):
        measure_plan(DequantGemm(4096, 4096, arch="sm_80", interpret=True), timer=failing, progress=False)
    assert stored_plan(g) is None                               # the interpreter: nothing stored


def test_custom_op_adopts_a_stored_plan_or_warns(monkeypatch):
    """``torch.ops.mmaemit.dequant_linear``'s shared DequantGemm takes the stored plan of its problem; one that no
    longer fits (a path that does not run the problem) leaves the rules' plan with a warning, not an error."""
    import mmaemit.kernels.dequant_plan as dp
    import mmaemit.nn.ops as ops

    g = _gemm(4096, 4096)
    good = MeasuredPlan([("gemv8", 1, 8), ("gemv16", 9, 16), ("fused64", 17, 64)], 64, {}, {}, {})
    monkeypatch.setattr(dp, "stored_plan", lambda gemm: good)
    ops._adopt_stored_plan(g)
    assert g.path_for(20) == "fused64" and g.ranges != g.rule_ranges
    g.set_plan(None)
    bad = MeasuredPlan([("gemv8", 1, 8), ("gemv16", 9, 16), ("tiled999", 17, 64)], 64, {}, {}, {})
    monkeypatch.setattr(dp, "stored_plan", lambda gemm: bad)
    with pytest.warns(RuntimeWarning, match="does not fit it"):
        ops._adopt_stored_plan(g)
    assert g.ranges == g.rule_ranges
    monkeypatch.setattr(dp, "stored_plan", lambda gemm: None)
    ops._adopt_stored_plan(g)
    assert g.ranges == g.rule_ranges


def test_set_plan_calls_on_the_interpreter():
    """A set plan's path serves its M, bit-identical to running that path by name (N=128: two 64-row tiles)."""
    n, k, m = 128, 1024, 40
    gen = torch.Generator().manual_seed(3)
    qw = D.quantize(torch.randn(n, k, generator=gen).half(), D.QuantScheme("int4", 128))
    tensors, _ = kernel_arguments(qw)
    A = torch.randn(m, k, generator=gen).half()
    base = DequantGemm(n, k, 128, "float16", arch="sm_90a", interpret=True).configs
    g = DequantGemm(n, k, 128, "float16", arch="sm_90a", interpret=True,
                    configs={"fused64": dataclasses.replace(base["fused64"], num_sms=2)},
                    plan=[("gemv8", 1, 8), ("gemv16", 9, 16), ("fused64", 17, 48)])
    assert g.path_for(m) == "fused64" and g.rule_ranges[2][0] != "fused64"
    C = g(A, *tensors, out=torch.full((m, n), float("nan"), dtype=torch.float16))
    ref = A.double() @ qw.dequantize().double().T
    assert ((C.double() - ref).norm() / ref.norm()).item() < 2e-3
    assert torch.equal(C, g.run_path("fused64", A, *tensors))


@pytest.mark.gpu
def test_measured_plan_on_the_gpu(tmp_path, monkeypatch):
    """A real measurement (1024 x 4096, M up to 64): stored, found again by a new object and by the custom op's
    shared DequantGemm, and every M of the plan within tolerance of the fp32 product."""
    import mmaemit.nn.ops as ops

    monkeypatch.setenv("MMAEMIT_CACHE_DIR", str(tmp_path))
    n, k = 1024, 4096
    g = DequantGemm(n, k, 128, "float16")
    plan = measure_plan(g, max_m=64, rounds=1, progress=False)
    assert set(plan.times) == {32, 48, 64} and all(plan.rule[m] in plan.times[m] for m in plan.times)
    assert all(v > 0 for t in plan.times.values() for v in t.values())
    assert stored_plan(DequantGemm(n, k, 128, "float16")) == plan
    t0 = plan.seconds
    assert measure_plan(DequantGemm(n, k, 128, "float16"), max_m=64, progress=False).seconds == t0   # stored
    monkeypatch.setattr(ops, "_GEMMS", {})
    shared = ops.gemm_for(n, k, 128, torch.float16, "int4", "", "cuda")
    assert shared.ranges == g.ranges
    monkeypatch.setattr(ops, "_GEMMS", {})
    monkeypatch.setenv("MMAEMIT_DEQUANT_PLAN", "rules")
    assert ops.gemm_for(n, k, 128, torch.float16, "int4", "", "cuda").ranges == g.rule_ranges
    monkeypatch.setenv("MMAEMIT_DEQUANT_PLAN", "bogus")
    monkeypatch.setattr(ops, "_GEMMS", {})
    with pytest.raises(ArgumentError, match="'rules'"):
        ops.gemm_for(n, k, 128, torch.float16, "int4", "", "cuda")
    qw = D.quantize(torch.randn(n, k, device="cuda").half(), D.QuantScheme("int4", 128))
    tensors = [t.cuda() for t in kernel_arguments(qw)[0]]
    dense = qw.dequantize().float().cuda()
    for m in (1, 17, 23, 33, 47, 64, 65):
        A = torch.randn(m, k, device="cuda").half()
        C = g(A, *tensors, out=torch.full((m, n), float("nan"), dtype=torch.float16, device="cuda"))
        ref = A.float() @ dense.T
        assert not torch.isnan(C).any()
        assert ((C.float() - ref).norm() / ref.norm()).item() < 3e-3, (m, g.path_for(m))
