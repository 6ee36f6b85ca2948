"""Kernels users import, built from mmaemit's building blocks (library code; ``examples/`` holds short compositions).

* :mod:`mmaemit.kernels.gemm_mma` - the mma.sync GEMM for every dtype and operand major (``make_gemm``, ``GemmConfig``)
* :mod:`mmaemit.kernels.dequant_gemm` - low-bit weight GEMV / GEMM for every M (``make_dequant_gemm``)
* :mod:`mmaemit.kernels.dequant_gemm_wgmma` - the Hopper wgmma path of the dequant GEMM (M > 128 on sm_90a)
* :mod:`mmaemit.kernels.dequant_gemm_hopper` - the fused Hopper dequant GEMM (TMA + mbarrier ring, warp-specialized,
  int4 decoded into RS wgmma; DequantGemm's ``fused*`` paths, M = 17 .. 2047 on sm_90a)
* :mod:`mmaemit.kernels.dequant_dispatch` - ``DequantGemm``: one compiled kernel set for every M, a plan of paths by
  M; :mod:`mmaemit.kernels.dequant_plan` measures that plan on the GPU (``measure_plan``) and stores it
* :mod:`mmaemit.kernels.dequant_parts` - pieces both dequant kernels share (formats, decode program, PrimFunc)
* :mod:`mmaemit.kernels.flash_attention` - FlashAttention forward on mma.sync (``flash_attention``,
  ``flash_attention_varlen``, ``make_flash_attention``); :mod:`mmaemit.kernels.attention_op` registers it as
  ``torch.ops.mmaemit.flash_attention``
* :mod:`mmaemit.kernels.tuned` - the autotuned entry points (``tuned_gemm``, ``tuned_dequant_gemm``, ``gemm_kernel``,
  ``dequant_gemm_kernel``) and the GEMM family registry
"""
