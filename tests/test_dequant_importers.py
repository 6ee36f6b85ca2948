"""GPTQ / BitBLAS importers: tensors packed here from scratch (python-int loops, not mmaemit's packer) must import
and dequantize to the values the format defines."""
import ml_dtypes as md
import numpy as np
import pytest
import torch

from mmaemit.dequant import from_bitblas, from_gptq
from mmaemit.errors import ArgumentError, UnsupportedConfigError

rng = np.random.default_rng(99)


# ------------------------------------------------------------------------------------------------------------- GPTQ
def gptq_pack_rows(q_kn, bits):
    """AutoGPTQ qweight layout: int32 [K*b/32, N], value (k, n) at bits b*(k % per) of row k // per."""
    k, n = q_kn.shape
    per = 32 // bits
    out = np.zeros((k // per, n), dtype=np.uint64)
    for kk in range(k):
        out[kk // per] |= q_kn[kk].astype(np.uint64) << np.uint64(bits * (kk % per))
    return out.astype(np.uint32).view(np.int32)


def gptq_pack_cols(z_gn, bits):
    """AutoGPTQ qzeros layout: int32 [G, N*b/32], value (g, n) at bits b*(n % per) of column n // per."""
    g, n = z_gn.shape
    per = 32 // bits
    out = np.zeros((g, n // per), dtype=np.uint64)
    for nn in range(n):
        out[:, nn // per] |= z_gn[:, nn].astype(np.uint64) << np.uint64(bits * (nn % per))
    return out.astype(np.uint32).view(np.int32)


def _gptq_case(bits, k=256, n=64, group=64, act=False, zero_lo=1):
    q = rng.integers(0, 1 << bits, size=(k, n))
    groups = k // group
    z = rng.integers(zero_lo, 1 << bits, size=(groups, n))
    s = (rng.uniform(0.002, 0.02, size=(groups, n))).astype(np.float16)
    g_idx = (rng.permutation(np.arange(k) // group) if act else np.arange(k) // group).astype(np.int32)
    want = ((q.T - z[g_idx].T) * s[g_idx].astype(np.float64).T)  # [N, K]
    return q, z, s, g_idx, want


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("zeros_mode", ["original", "rescale", "quantized"])
@pytest.mark.parametrize("act", [False, True])
def test_gptq_v1_import(bits, zeros_mode, act):
    q, z, s, g_idx, want = _gptq_case(bits, act=act)
    qw = from_gptq(torch.from_numpy(gptq_pack_rows(q, bits)), torch.from_numpy(gptq_pack_cols(z - 1, bits)),
                   torch.from_numpy(s), torch.from_numpy(g_idx), bits=bits, group_size=64, zeros_mode=zeros_mode)
    assert qw.scheme.act_order == act and (qw.g_idx is None) == (not act)
    assert qw.scheme.format == f"uint{bits}" and qw.shape == (64, 256)
    assert np.array_equal(qw.dequantize().numpy(), want.astype(np.float32))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_gptq_v2_sym_and_per_channel(bits):
    q, z, s, g_idx, want = _gptq_case(bits, zero_lo=0)
    qw = from_gptq(torch.from_numpy(gptq_pack_rows(q, bits)), torch.from_numpy(gptq_pack_cols(z, bits)),
                   torch.from_numpy(s), torch.from_numpy(g_idx), bits=bits, group_size=64, version=2)
    assert np.array_equal(qw.dequantize().numpy(), want.astype(np.float32))
    # sym: every zero is 2^(b-1) -> offset-binary codes with scales only
    zs = np.full_like(z, 1 << (bits - 1))
    want_sym = (q.T - (1 << (bits - 1))) * s[g_idx].astype(np.float64).T
    qs = from_gptq(torch.from_numpy(gptq_pack_rows(q, bits)), torch.from_numpy(gptq_pack_cols(zs - 1, bits)),
                   torch.from_numpy(s), torch.from_numpy(g_idx), bits=bits, group_size=64, sym=True)
    assert qs.scheme.format == f"int{bits}_ob" and qs.zeros is None
    assert np.array_equal(qs.dequantize().numpy(), want_sym.astype(np.float32))
    with pytest.raises(ArgumentError, match="sym=False"):
        from_gptq(torch.from_numpy(gptq_pack_rows(q, bits)), torch.from_numpy(gptq_pack_cols(z - 1, bits)),
                  torch.from_numpy(s), bits=bits, group_size=64, sym=True)
    # per-channel (group_size -1): one group
    q1, z1, s1, _, want1 = _gptq_case(bits, group=256)
    qc = from_gptq(torch.from_numpy(gptq_pack_rows(q1, bits)), torch.from_numpy(gptq_pack_cols(z1 - 1, bits)),
                   torch.from_numpy(s1), None, bits=bits, group_size=-1)
    assert qc.scheme.group_size == -1 and np.array_equal(qc.dequantize().numpy(), want1.astype(np.float32))


def test_gptq_v1_all_ones_zero_field():
    bits = 4
    q, z, s, g_idx, _ = _gptq_case(bits)
    stored = z - 1
    stored[0, 3] = 15  # AutoGPTQ reads 16, BitBLAS's repack reads 0
    args = (torch.from_numpy(gptq_pack_rows(q, bits)), torch.from_numpy(gptq_pack_cols(stored, bits)),
            torch.from_numpy(s))
    with pytest.raises(ArgumentError, match="zeros_mode='original'"):
        from_gptq(*args, bits=bits, group_size=64)
    orig = from_gptq(*args, bits=bits, group_size=64, zeros_mode="original").dequantize().numpy()
    assert np.array_equal(orig[3, :64], ((q[:64, 3] - 16) * s[0, 3].astype(np.float64)).astype(np.float32))
    wrap = from_gptq(*args, bits=bits, group_size=64, v1_zero_wrap=True).dequantize().numpy()
    assert np.array_equal(wrap[3, :64], (q[:64, 3] * s[0, 3].astype(np.float64)).astype(np.float32))


def test_gptq_bad_inputs():
    q, z, s, g_idx, _ = _gptq_case(4)
    qweight, qzeros = torch.from_numpy(gptq_pack_rows(q, 4)), torch.from_numpy(gptq_pack_cols(z - 1, 4))
    with pytest.raises(UnsupportedConfigError, match="2, 4, 8"):
        from_gptq(qweight, qzeros, torch.from_numpy(s), bits=3, group_size=64)
    with pytest.raises(UnsupportedConfigError, match="version"):
        from_gptq(qweight, qzeros, torch.from_numpy(s), bits=4, group_size=64, version=3)
    with pytest.raises(ArgumentError, match="qzeros must be"):
        from_gptq(qweight, qzeros, torch.from_numpy(s), bits=4, group_size=128)
    with pytest.raises(ArgumentError, match="divisor"):
        from_gptq(qweight, qzeros, torch.from_numpy(s), bits=4, group_size=100)
    with pytest.raises(ArgumentError, match="int32"):
        from_gptq(qweight.to(torch.int64), qzeros, torch.from_numpy(s), bits=4, group_size=64)
    with pytest.raises(ArgumentError, match="g_idx"):
        from_gptq(qweight, qzeros, torch.from_numpy(s), torch.zeros(7, dtype=torch.int32), bits=4, group_size=64)


# ---------------------------------------------------------------------------------------------------------- BitBLAS
def bitblas_pack(codes, bits):
    """BitBLAS general_compress layout: int8 bytes along the last axis, element j of a byte at bits b*j."""
    per = 8 // bits
    rows, cols = codes.shape
    out = np.zeros((rows, cols // per), dtype=np.uint8)
    for c in range(cols):
        out[:, c // per] |= (codes[:, c].astype(np.uint8) << np.uint8(bits * (c % per))).astype(np.uint8)
    return out.view(np.int8)


def bitblas_lop3(codes, bits):
    """BitBLAS fp16 LOP3 permutation from its rule: per 32-bit word of 32/b elements along K, element j at bit
    (j % 2) * 16 + (j // 2) * b; for 2-bit, bytes 1 and 2 of the word are then swapped."""
    e = 32 // bits
    rows, cols = codes.shape
    out = np.zeros((rows, cols // e), dtype=np.uint64)
    for c in range(cols):
        j = c % e
        out[:, c // e] |= codes[:, c].astype(np.uint64) << np.uint64((j % 2) * 16 + (j // 2) * bits)
    if bits == 2:
        b1, b2 = (out >> np.uint64(8)) & np.uint64(0xFF), (out >> np.uint64(16)) & np.uint64(0xFF)
        out = (out & np.uint64(0xFF0000FF)) | (b1 << np.uint64(16)) | (b2 << np.uint64(8))
    return out.astype(np.uint32).view(np.uint8).reshape(rows, -1).view(np.int8)


NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]


def _bitblas_values(source_format, bits, n, k):
    """(stored codes, the values they mean) built from each format's definition."""
    if source_format == "uint":
        q = rng.integers(0, 1 << bits, (n, k))
        return q, q.astype(float)
    if source_format == "int" and bits == 1:
        q = rng.integers(0, 2, (n, k))
        return q, 2.0 * q - 1
    if source_format == "int":
        v = rng.integers(-(1 << (bits - 1)), 1 << (bits - 1), (n, k))
        return (v & 0xFF if bits == 8 else v + (1 << (bits - 1))), v.astype(float)
    if source_format == "nf":
        q = rng.integers(0, 16, (n, k))
        return q, np.array(NF4, dtype=np.float32).astype(float)[q]
    ml = {"fp": md.float4_e2m1fn, "fp_e4m3": md.float8_e4m3fn, "fp_e5m2": md.float8_e5m2}[source_format]
    q = rng.integers(0, 1 << bits, (n, k))
    if source_format != "fp":
        q[(q & 0x7F) >= 0x7C] = 0x11  # NaN/inf codes out of the arithmetic comparison
    return q, q.astype(np.uint8).view(ml).astype(float)


BITBLAS_CASES = [("uint", 1), ("uint", 2), ("uint", 4), ("uint", 8), ("int", 1), ("int", 2), ("int", 4), ("int", 8),
                 ("nf", 4), ("fp", 4), ("fp_e4m3", 8), ("fp_e5m2", 8)]


@pytest.mark.parametrize("source_format,bits", BITBLAS_CASES)
def test_bitblas_formats_with_and_without_scales(source_format, bits):
    n, k, g = 32, 128, 32
    q, vals = _bitblas_values(source_format, bits, n, k)
    qweight = torch.from_numpy(bitblas_pack(q, bits))
    plain = from_bitblas(qweight, bits=bits, source_format=source_format)
    assert np.array_equal(plain.dequantize().numpy(), vals.astype(np.float32))
    s = rng.uniform(-2, 2, (n, k // g)).astype(np.float16)
    scaled = from_bitblas(qweight, torch.from_numpy(s), bits=bits, source_format=source_format, group_size=g)
    want = vals * s.astype(np.float64)[:, np.arange(k) // g]
    assert np.array_equal(scaled.dequantize().numpy(), want.astype(np.float32))


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
@pytest.mark.parametrize("zeros_mode", ["original", "rescale", "quantized"])
def test_bitblas_zeros_modes(bits, zeros_mode):
    n, k, g = 32, 256, 64
    q = rng.integers(0, 1 << bits, (n, k))
    s = rng.uniform(0.01, 0.1, (n, k // g)).astype(np.float16)
    gi = np.arange(k) // g
    sk = s.astype(np.float64)[:, gi]
    if zeros_mode == "quantized":
        zc = rng.integers(0, 1 << bits, (n, k // g))
        zeros = torch.from_numpy(bitblas_pack(zc.T.copy(), bits))  # [G, N*b/8], packed along N
        want = (q - zc[:, gi]) * sk
    else:
        zv = rng.uniform(-4, 4, (n, k // g)).astype(np.float16)
        zeros = torch.from_numpy(zv)
        z = zv.astype(np.float64)[:, gi]
        want = (q - z) * sk if zeros_mode == "original" else q * sk - z
    qw = from_bitblas(torch.from_numpy(bitblas_pack(q, bits)), torch.from_numpy(s), zeros, bits=bits,
                      source_format="uint", group_size=g, zeros_mode=zeros_mode)
    assert np.array_equal(qw.dequantize().numpy(), want.astype(np.float32))


@pytest.mark.parametrize("source_format,bits", [("uint", 4), ("int", 4), ("uint", 2), ("int", 2)])
def test_bitblas_lop3_interleaved_weights(source_format, bits):
    n, k = 16, 128
    q, vals = _bitblas_values(source_format, bits, n, k)
    qweight = torch.from_numpy(bitblas_lop3(q, bits))
    assert not torch.equal(qweight, torch.from_numpy(bitblas_pack(q, bits)))
    qw = from_bitblas(qweight, bits=bits, source_format=source_format, lop3_interleaved=True)
    assert np.array_equal(qw.dequantize().numpy(), vals.astype(np.float32))
    assert torch.equal(qw.packed, torch.from_numpy(bitblas_pack(q, bits)))


def test_bitblas_bad_inputs():
    q = torch.from_numpy(bitblas_pack(rng.integers(0, 16, (16, 64)), 4))
    s = torch.ones(16, 2, dtype=torch.float16)
    with pytest.raises(UnsupportedConfigError, match="uint/4"):
        from_bitblas(q, bits=4, source_format="fp_e4m3")
    with pytest.raises(UnsupportedConfigError, match="'uint' only"):
        from_bitblas(q, s, torch.zeros(16, 2, dtype=torch.float16), bits=4, source_format="int", group_size=32,
                     zeros_mode="original")
    with pytest.raises(UnsupportedConfigError, match="2, 4"):
        from_bitblas(torch.from_numpy(bitblas_pack(rng.integers(0, 2, (16, 64)), 1)), bits=1, lop3_interleaved=True)
    with pytest.raises(ArgumentError, match=r"\[16, 2\]"):
        from_bitblas(q, torch.ones(16, 3, dtype=torch.float16), bits=4, group_size=32)
    with pytest.raises(ArgumentError, match="packed along N"):
        from_bitblas(q, s, torch.zeros(2, 3, dtype=torch.int8), bits=4, group_size=32, zeros_mode="quantized")
    with pytest.raises(ArgumentError, match="int8 or uint8"):
        from_bitblas(q.to(torch.int32), bits=4)


def test_bitblas_uint8_default_reading_and_bitblas_signed_cast():
    """Issue 12: BitBLAS stores uint8 codes as int8 bytes and decodes them with a plain signed cast. The importer
    reads "uint" 8-bit codes as 0 .. 255 by default; ``uint8_signed_cast=True`` reproduces BitBLAS's numbers."""
    repro = np.array([[-56, 100, -128, 127]], np.int8)
    assert from_bitblas(repro, bits=8, source_format="uint").dequantize().tolist() == [[200, 100, 128, 127]]
    bb = from_bitblas(repro, bits=8, source_format="uint", uint8_signed_cast=True)
    assert bb.dequantize().tolist() == [[-56, 100, -128, 127]] and bb.scheme.format == "int8"
    n, k, g = 32, 128, 32
    q = rng.integers(0, 256, (n, k))
    signed = np.where(q >= 128, q - 256, q).astype(np.float64)        # the int8 cast, written out
    qweight = torch.from_numpy(bitblas_pack(q, 8))
    s = rng.uniform(-2, 2, (n, k // g)).astype(np.float16)
    sk = s.astype(np.float64)[:, np.arange(k) // g]
    for cast, vals in ((False, q.astype(np.float64)), (True, signed)):
        plain = from_bitblas(qweight, bits=8, source_format="uint", uint8_signed_cast=cast)
        assert np.array_equal(plain.dequantize().numpy(), vals.astype(np.float32)), cast
        scaled = from_bitblas(qweight, torch.from_numpy(s), bits=8, source_format="uint", group_size=g,
                              uint8_signed_cast=cast)
        assert np.array_equal(scaled.dequantize().numpy(), (vals * sk).astype(np.float32)), cast
    with pytest.raises(UnsupportedConfigError, match="uint8_signed_cast"):
        from_bitblas(qweight, bits=4, source_format="uint", uint8_signed_cast=True)
    with pytest.raises(UnsupportedConfigError, match="zeros"):
        from_bitblas(qweight, torch.from_numpy(s), torch.from_numpy(s), bits=8, source_format="uint", group_size=g,
                     zeros_mode="original", uint8_signed_cast=True)
