"""Post-training INT8/FP8 quantization of torchvision ResNets for Hopper/Ampere tensor cores, no TensorRT.

The pipeline, one module per step:
  fold.py       torchvision ResNet → a small graph of convolutions with BatchNorm folded in
  calibrate.py  static per-tensor activation ranges from N seeded inputs, cached on disk
  layers.py     per-channel weight quantization, epilogue coefficients, the exact pure-PyTorch reference
                of every quantized layer and the torch (``_int_mm``/``_scaled_mm``) fallback path
  kernels.py    Triton kernels: implicit-GEMM convolution with fused epilogue, maxpool+quantize, epilogue
  stem_kernels.py  the fused stem: 7×7/2 convolution of the image as one GEMM, 8-bit output, 8-bit max-pool
  stem_int8.py  the int8 stem on 4-byte pixels; stem_s2d.py the same on 16-byte space-to-depth pixels
  conv_tma.py   the TMA-fed 3×3 convolution (Hopper), offered where it was timed faster
  tiles.py      tile configurations, activation formats and the per-layer quantized-vs-fp16 choice
  network.py    the quantized network, run step by step (stem, convolutions, head)
  tuning.py     per-layer timing and self-checks; tunecache.py keeps each layer's winning tile on disk
  prepare.py    builds the network for the GPU, times the per-layer candidates, captures a CUDA graph

Only ``prepare.py``, the kernel modules and the timing helpers need a GPU; everything else (and every kernel,
through the Triton interpreter) runs on the CPU for tests. This package is the implementation; the engine
plug-in that registers it as ``--engines quant`` is `deepgap.measure.engines.quant`.
"""
