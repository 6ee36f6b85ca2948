"""Packing, interleave and mma fragment order: independent re-derivations and exact inverses for every bits."""
import numpy as np
import pytest
import torch

from mmaemit import isa
from mmaemit.dequant import (bit_positions, deinterleave, fragment_coord, fragment_slot, from_fragment_order,
                             interleave, pack, pack_for_mma, tiling, to_fragment_order, unpack, unpack_from_mma)
from mmaemit.dequant.fastdecode_reference import fast_decode
from mmaemit.errors import ArgumentError, TileShapeError, UnsupportedConfigError

BITS = (1, 2, 4, 8)
STORAGE = {"int32": (32, np.int32), "int8": (8, np.int8), "uint8": (8, np.uint8)}
rng = np.random.default_rng(7)


def _naive_pack_rows(codes, bits, sb):
    """Independent packer: python ints, one word at a time, element j of a word at bit bits*j."""
    per = sb // bits
    out = []
    for row in codes.tolist():
        words = []
        for w0 in range(0, len(row), per):
            v = 0
            for j, c in enumerate(row[w0:w0 + per]):
                v |= c << (bits * j)
            words.append(v - (1 << sb) if sb == 32 and v >= 1 << 31 else v)
        out.append(words)
    return out


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("storage", sorted(STORAGE))
def test_pack_matches_independent_packer_and_round_trips(bits, storage):
    sb, npd = STORAGE[storage]
    codes = rng.integers(0, 1 << bits, size=(5, 64)).astype(np.uint8)
    want = np.array(_naive_pack_rows(codes, bits, sb), dtype=np.int64)
    if storage == "int8":
        want = np.where(want >= 128, want - 256, want)
    got = pack(codes, bits, axis=-1, storage=storage)
    assert got.dtype == npd and np.array_equal(got.astype(np.int64), want)
    got_t = pack(torch.from_numpy(codes), bits, axis=-1, storage=storage)
    assert np.array_equal(got_t.numpy(), got)
    assert np.array_equal(unpack(got, bits, axis=-1), codes)
    assert np.array_equal(unpack(got_t, bits, axis=-1).numpy(), codes)
    # along axis 0 (GPTQ qweight packs along K = rows)
    got0 = pack(codes.T.copy(), bits, axis=0, storage=storage)
    assert np.array_equal(got0, got.T) and np.array_equal(unpack(got0, bits, axis=0), codes.T)


def test_pack_bad_inputs():
    with pytest.raises(UnsupportedConfigError, match="1, 2, 4, 8"):
        pack(np.zeros((2, 8), np.uint8) + 1, 3)
    with pytest.raises(UnsupportedConfigError, match="int32"):
        pack(np.ones((2, 8), np.uint8), 4, storage="int16")
    with pytest.raises(TileShapeError, match="multiple of 8"):
        pack(np.ones((2, 12), np.uint8), 4)
    with pytest.raises(ArgumentError, match=r"\[0, 15\]"):
        pack(np.full((2, 8), 16, np.uint8), 4)
    with pytest.raises(ArgumentError, match="integer"):
        pack(torch.ones(2, 8), 4)
    with pytest.raises(ArgumentError, match="dtype"):
        unpack(torch.ones(2, 8, dtype=torch.int16), 4)


def test_interleave_4bit_nibble_order_is_e0_e2_e4_e6_e1_e3_e5_e7():
    codes = rng.integers(0, 16, size=(100, 8))
    plain = pack(codes.astype(np.uint8), 4, storage="int32")[:, 0]
    inter = interleave(plain, 4).astype(np.int64) & 0xFFFFFFFF
    order = [0, 2, 4, 6, 1, 3, 5, 7]
    want = sum(codes[:, e].astype(np.int64) << (4 * slot) for slot, e in enumerate(order))
    assert np.array_equal(inter, want)


@pytest.mark.parametrize("bits", BITS)
def test_interleave_puts_pairs_in_halves_and_inverts(bits):
    e = 32 // bits
    codes = rng.integers(0, 1 << bits, size=(300, e)).astype(np.uint8)
    plain = pack(codes, bits, storage="int32")[:, 0]
    inter = interleave(plain, bits)
    assert inter.dtype == np.int32
    u = inter.astype(np.int64) & 0xFFFFFFFF
    mask = (1 << bits) - 1
    for j in range(e):
        # the decode of pair i reads (word >> bits*i) & mask at bit 0 (low half) and 16 (high half); 8-bit: bytes
        want_pos = 8 * j if bits == 8 else (j % 2) * 16 + (j // 2) * bits
        assert np.array_equal((u >> want_pos) & mask, codes[:, j])
    assert np.array_equal(deinterleave(inter, bits), plain)
    assert np.array_equal(deinterleave(interleave(torch.from_numpy(plain), bits), bits).numpy(), plain)
    assert np.array_equal(interleave(plain.view(np.uint32), bits), inter.view(np.uint32))
    assert sorted(bit_positions(bits)) == [bits * j for j in range(e)]


def _ptx_b_coord(lane, j):
    """PTX ISA, m16n8k16 .f16/.bf16 B fragment, transcribed: b_j of lane -> (k, n)."""
    group_id, tig = lane >> 2, lane % 4
    row = tig * 2 + (j & 1) + (8 if j >= 2 else 0)
    return row, group_id


def test_fragment_coord_uses_the_ptx_b_fragment_map():
    """Inside one tile (lane, slot e < 4) the block map is the PTX B map; tiles then step by 8 in n, 16 in k."""
    for bits in BITS:
        tl = tiling(bits)
        for lane in range(32):
            for e in range(tl["E"]):
                t, j = e // 4, e % 4
                k, n = _ptx_b_coord(lane, j)
                want = (8 * (t % tl["TN"]) + n, 16 * (t // tl["TN"]) + k)
                assert tuple(int(v) for v in fragment_coord(bits, lane, e)) == want
    assert not hasattr(isa.MmaInstr, "b_fragment_coord")  # the layout fact lives in mmaemit.layouts only


@pytest.mark.parametrize("bits", BITS)
def test_fragment_maps_are_inverse_bijections(bits):
    tl = tiling(bits)
    lanes, slots = np.meshgrid(np.arange(32), np.arange(tl["E"]), indexing="ij")
    n_off, k_off = fragment_coord(bits, lanes, slots)
    assert n_off.max() < tl["BN"] and k_off.max() < tl["BK"]
    assert len(set(zip(n_off.ravel().tolist(), k_off.ravel().tolist()))) == 32 * tl["E"] == tl["BN"] * tl["BK"]
    lane_back, slot_back = fragment_slot(bits, n_off, k_off)
    assert np.array_equal(lane_back, lanes) and np.array_equal(slot_back, slots)


@pytest.mark.parametrize("bits", BITS)
def test_fragment_order_round_trip_numpy_and_torch(bits):
    tl = tiling(bits)
    codes = rng.integers(0, 1 << bits, size=(tl["BN"] * 3, tl["BK"] * 2)).astype(np.uint8)
    frag = to_fragment_order(codes, bits)
    assert frag.shape == (3, 2, 32, tl["E"])
    assert np.array_equal(from_fragment_order(frag, bits), codes)
    words = pack_for_mma(codes, bits)
    assert words.shape == (3, 2, 32) and words.dtype == np.int32
    assert np.array_equal(unpack_from_mma(words, bits), codes)
    words_t = pack_for_mma(torch.from_numpy(codes), bits)
    assert np.array_equal(words_t.numpy(), words)
    assert np.array_equal(unpack_from_mma(words_t, bits).numpy(), codes)


@pytest.mark.parametrize("bits", BITS)
def test_warp_decode_of_mma_words_yields_ptx_b_fragments(bits):
    """Emulate the kernel: each lane loads its word, fast-decodes it (uint, f16) and feeds register pairs to mma;
    every register half must be the B element the PTX fragment map assigns to that lane."""
    tl = tiling(bits)
    nblk, kblk = 2, 3
    codes = rng.integers(0, 1 << bits, size=(tl["BN"] * nblk, tl["BK"] * kblk))
    words = pack_for_mma(codes.astype(np.uint8), bits).view(np.uint32)
    vals = fast_decode(words, f"uint{bits}", "float16")           # [nb, kb, lane, E] in decode order
    for nb in range(nblk):
        for kb in range(kblk):
            for lane in range(32):
                for t in range(tl["T"]):                              # mma tile t of this word
                    tn, tk = t % tl["TN"], t // tl["TN"]
                    for j in range(4):                                # b_j = register j//2, half j%2
                        k, n = _ptx_b_coord(lane, j)
                        got = vals[nb, kb, lane, 4 * t + j]
                        want = codes[nb * tl["BN"] + 8 * tn + n, kb * tl["BK"] + 16 * tk + k]
                        assert got == want


def test_fragment_order_bad_shapes():
    with pytest.raises(TileShapeError, match="N % 16 == 0 and K % 16 == 0"):
        pack_for_mma(np.zeros((24, 16), np.uint8), 4)
    with pytest.raises(TileShapeError, match="K % 64"):
        pack_for_mma(np.zeros((16, 32), np.uint8), 1)
    with pytest.raises(ArgumentError, match="2-D"):
        to_fragment_order(np.zeros((16,), np.uint8), 4)
    with pytest.raises(ArgumentError, match="shape"):
        from_fragment_order(np.zeros((1, 1, 32, 4), np.uint8), 4)
