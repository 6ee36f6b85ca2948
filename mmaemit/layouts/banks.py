"""The shared-memory bank model every conflict count in mmaemit uses (layout proofs and the interpreter alike).

Model (NVIDIA sm_80/sm_90): 32 banks, 4 bytes wide; bank = (byte_address // 4) % 32. A warp-wide access of
``access_bytes`` per lane is served in phases of ``128 // access_bytes`` lanes (32 lanes for 4-byte accesses, 16 for
8-byte, 8 for 16-byte; one ldmatrix/stmatrix 8x8 matrix = 8 row addresses of 16 bytes = one phase). Within a phase,
lanes reading the same 4-byte word are served together (broadcast); distinct words in one bank are serialised.
A phase therefore costs ``max over banks of distinct words in that bank`` wavefronts, and its conflicts are that
number minus one.
"""
from __future__ import annotations

from collections import defaultdict

NUM_BANKS = 32
BANK_BYTES = 4


def phase_wavefronts(byte_addresses, access_bytes: int) -> int:
    """Wavefronts for one phase: ``byte_addresses`` are the start addresses of the lanes in that phase."""
    words_per_bank = defaultdict(set)
    for addr in byte_addresses:
        if addr is None:
            continue
        if addr % access_bytes:
            raise ValueError(f"address {addr} is not aligned to the access size {access_bytes}")
        for w in range(max(1, access_bytes // BANK_BYTES)):
            word = addr // BANK_BYTES + w
            words_per_bank[word % NUM_BANKS].add(word)
    return max((len(s) for s in words_per_bank.values()), default=0)


def bank_conflicts(byte_addresses, access_bytes: int) -> int:
    """Extra wavefronts (0 = conflict-free) of one warp-wide access.

    ``byte_addresses``: 32 per-lane start addresses (``None`` for inactive lanes), in lane order.
    ``access_bytes``: 4, 8 or 16 bytes per lane (use 16 for ldmatrix/stmatrix row addresses).
    """
    if access_bytes not in (1, 2, 4, 8, 16):
        raise ValueError(f"access_bytes must be one of 1, 2, 4, 8, 16, not {access_bytes}")
    lanes_per_phase = 32 if access_bytes <= 4 else 128 // access_bytes
    addrs = list(byte_addresses)
    extra = 0
    for p in range(0, len(addrs), lanes_per_phase):
        phase = addrs[p:p + lanes_per_phase]
        if all(a is None for a in phase):
            continue
        extra += phase_wavefronts(phase, max(access_bytes, 1)) - 1 if access_bytes >= 4 else \
            _sub_word_wavefronts(phase) - 1
    return extra


def _sub_word_wavefronts(addresses) -> int:
    # 1- and 2-byte accesses: lanes hitting the same 4-byte word share it
    return phase_wavefronts([a - a % BANK_BYTES for a in addresses if a is not None], BANK_BYTES)
