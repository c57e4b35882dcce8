#!/usr/bin/env bash
# Issue 47's TMA-fed 3×3 convolution (`quant.conv_tma`; on by default where session 29 timed it faster, layer2-wide
# outputs; DEEPGAP_QUANT_CONV_TMA=off leaves it out), from the repository root on the device, $OUT set:
#   bash benchmarks/conv_tma.sh STEP...  (all = tests kernels engine; first run in session 29, results/h200/session29)
#   tests   — tests/measure/quant/test_quant_conv_tma_gpu.py: every explored tile against conv_gemm_kernel
#   kernels — benchmarks/conv_tma_bench.py: each ResNet-50 3×3 shape (7, strided too) at batch 1024 and 256, fp8 and
#             int8, the grouped kernel's best tile against every explored TMA tile → conv_tma.jsonl, conv_tma.txt
#   engine  — `deepgap run` ResNet-50 quant fp8 and int8 at batch 1024, one sweep, no warm-up, no CPU baseline,
#             the switch off then on: each store's CSV export and which layers kept a TMA tile
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests kernels engine ;;
tests)
    step "conv-tma GPU tests" 200 python -m pytest -q -m gpu tests/measure/quant/test_quant_conv_tma_gpu.py \
        -p no:cacheprovider > "$OUT/conv-tma-gputests.txt" 2>&1
    tail -n 15 "$OUT/conv-tma-gputests.txt" ;;
kernels)
    step "conv-tma kernels" "${CONV_TMA_LIMIT:-360}" env PYTHONPATH="$PYTHONPATH:benchmarks" python benchmarks/conv_tma_bench.py \
        --batch-sizes "${CONV_TMA_BATCHES:-1024,256}" --out "$OUT/conv_tma.jsonl" > "$OUT/conv_tma.txt" 2>&1
    grep -v '^{' "$OUT/conv_tma.txt" | tail -n 20 ;;
engine)
    switch_ab DEEPGAP_QUANT_CONV_TMA 1024 conv-tma 200 tma ;;
*) echo "unknown step $what (tests, kernels, engine, all)"; exit 2 ;;
esac; done
