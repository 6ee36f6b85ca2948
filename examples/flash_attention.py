"""FlashAttention forward from mmaemit's pieces: a walkthrough of ``mmaemit/kernels/flash_attention.py``.

The kernel is two GEMMs per K/V block with an online softmax between them:

    S = Q K^T          TensorCoreIntrinEmitter (ldmatrix Q, ldmatrix K [keys, d], mma.sync m16n8k16 -> f32)
    softmax (fp32)     row max over the 4 lanes of a row (shfl.sync.bfly), exp2 in log2 units, running max / sum
    P -> A fragments   accumulator_as_operand: two n8 accumulator tiles ARE one k16 A step (same lane), one cvt each
    O += P V           TensorCoreIntrinEmitter (A = P in registers, ldmatrix.trans V [keys, d])

with K / V blocks streamed through a 2-stage cp.async ring (CpAsyncTile, zero-fill at the tensor end).

    PYTHONPATH=. python3 examples/flash_attention.py        # GPU: vs torch SDPA; no GPU: the interpreter
"""
import torch

from mmaemit.kernels.flash_attention import flash_attention, make_flash_attention, reference
from mmaemit.layouts.accumulator_operand import accumulator_as_operand

# 1. The layout fact behind "P stays in registers": enumerate both fragment maps over all lanes.
reuse = accumulator_as_operand("float16", "float32")
reuse.check()                                    # raises LayoutError if any lane would need another lane's value
A, C = reuse.a_layout, reuse.c_layout
for reg, elems in enumerate(reuse.pack_order()):
    src = ", ".join(f"n8 tile {h} acc {c}" for h, c, _ in elems)
    print(f"A reg {reg} (rows/cols of lane 5: {[A.forward(5, reg, e) for e in range(2)]}) <- {src}")

# 2. The kernel for one problem: a PrimFunc you can print, compile, or interpret.
func, cfg = make_flash_attention(batch=1, max_seqlen_q=70, total_q=70, total_k=70, heads=2, kv_heads=1,
                                 head_dim=64, dtype="float16", causal=True, arch="sm_80")
print(cfg)

# 3. Run it: on the GPU against SDPA, otherwise on the CPU interpreter against float64.
device = "cuda" if torch.cuda.is_available() else "cpu"
B, S, H, HK, D = (2, 1024, 8, 2, 128) if device == "cuda" else (1, 70, 2, 1, 64)
q = torch.randn(B, S, H, D, device=device, dtype=torch.float16)
k, v = (torch.randn(B, S, HK, D, device=device, dtype=torch.float16) for _ in range(2))
o, lse = flash_attention(q, k, v, causal=True)          # O [B, S, H, D], LSE [B, H, S] (float32)
ro, rl = reference(q, k, v, causal=True)                # float64 on the CPU
print(f"{device}: max |O - ref| = {(o.cpu().double() - ro).abs().max():.2e}, "
      f"max |LSE - ref| = {(lse.cpu().double() - rl).abs().max():.2e}")

# 4. On Hopper the same call runs the TMA + mbarrier + wgmma kernel (mmaemit/kernels/flash_attention_hopper.py).
if device == "cuda" and torch.cuda.get_device_capability() == (9, 0):
    o2, lse2 = flash_attention(q, k, v, causal=True, implementation="wgmma")
    print(f"wgmma: max |O - ref| = {(o2.cpu().double() - ro).abs().max():.2e}")
