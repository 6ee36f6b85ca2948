import torch, mmaemit
from mmaemit.kernels.gemm_mma import GemmConfig, make_gemm
from mmaemit.kernels.tuned import gemm_inputs, gemm_reference

@mmaemit.autotune("tile", [(128, 128, 32), (256, 128, 64)])          # stacked decorators: axes multiply
@mmaemit.autotune(stages=[3, 4], inputs=gemm_inputs, reference=gemm_reference, outputs=[2])
def gemm(M, N, K, dtype, arch, *, tile, stages):
    return make_gemm(M, N, K, dtype, config=GemmConfig(*tile, 64, 64, stages), arch=arch)[0]

if __name__ == "__main__" and torch.cuda.is_available():
    arch = mmaemit.arch.device_arch().name
    kernel = gemm(4096, 4096, 4096, "float16", arch)       # the winner for this key, compiled: kernel(A, B, C)
    print(gemm.tune(4096, 4096, 4096, "float16", arch).table())   # every candidate, timed or skipped and why
elif __name__ == "__main__":
    print(gemm.candidates(4096, 4096, 4096, "float16", "sm_90a"))  # no GPU: the candidate set only
