"""feature_of_ptx: which FEATURES entry gates a PTX mnemonic (arch facts checked against ptxas 13.0)."""
import pytest

from mmaemit import isa


@pytest.mark.parametrize("mnemonic, feature", [
    ("cp.async.cg.shared.global", "cp.async"),
    ("cp.async.ca.shared.global", "cp.async"),
    ("cp.async.wait_group", "cp.async"),
    ("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes", "cp.async.bulk"),
    ("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32", "cp.async.bulk"),
    ("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16", "stmatrix"),
    ("cvt.rn.f16x2.e4m3x2", "cvt.e4m3x2"),
    ("cvt.rn.satfinite.e5m2x2.f32", "cvt.e5m2x2"),
    ("cvt.rn.f16x2.e2m1x2", "cvt.e2m1x2"),
    ("sub.bf16x2", "add.bf16x2"),
    ("mul.rn.bf16x2", "add.bf16x2"),
    ("add.rn.bf16", "add.bf16x2"),
    ("fence.proxy.async.shared::cta", "fence.proxy.async"),
    ("fence.proxy.async", "fence.proxy.async"),
    ("wgmma.wait_group.sync.aligned", "wgmma"),
    ("setmaxnreg.dec.sync.aligned.u32", "setmaxnreg"),
    ("mbarrier.try_wait.parity.shared::cta.b64", "mbarrier.tx"),
    ("mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.tx"),
    ("elect.sync", "elect.sync"),
    ("barrier.cluster.wait.aligned", "barrier.cluster"),
    ("mapa.shared::cluster.u32", "cluster.address"),
    ("griddepcontrol.wait", "griddepcontrol"),
    ("tcgen05.commit.cta_group::1.mbarrier::arrive::one.b64", "tcgen05"),
])
def test_gated_mnemonics(mnemonic, feature):
    assert isa.feature_of_ptx(mnemonic).name == feature


@pytest.mark.parametrize("mnemonic", [
    "fma.rn.bf16x2", "sub.f16x2", "fence.proxy.alias", "mbarrier.arrive.shared.b64",
    "mbarrier.test_wait.parity.shared::cta.b64", "bar.sync", "lop3.b32", "prmt.b32",
])
def test_ungated_mnemonics(mnemonic):
    # all of these assemble on sm_80 (ptxas 13.0)
    assert isa.feature_of_ptx(mnemonic) is None
