#!/usr/bin/env bash
# Issue 47's persistent TMA kernel for the 1×1 convolutions, first GPU run (device kind nvidia-h200), from the
# repository root, $OUT set:   bash benchmarks/gemm_1x1.sh STEP...
# Steps (each well inside one device call; estimates, not yet run):
#   tests    — tests/measure/quant/test_quant_persistent_gpu.py: every persistent tile vs conv_gemm_kernel at ResNet-50's 1×1
#              shapes, and ResNet-50 int8/fp8 with the persistent tiles (the default since session 23) vs fp32
#   kernels  — benchmarks/gemm_1x1.py at batch 256: today's tuned tile vs the persistent tiles per shape (~3 min)
#              → gemm_1x1.jsonl; SWEEP=1 adds the wider grid on layer1/layer2 → gemm_1x1_sweep.jsonl
#   network  — ResNet-50 fp8 and int8 at batch 256 by benchmarks/quant_inputs.py's bare loop, the grouped GEMMs
#              alone (DEEPGAP_QUANT_GEMM=off) and then with the persistent tiles (each tuned afresh)
#              → net-off/net-persistent.jsonl (session 22 named the first net-default)
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, step()
[ $# -gt 0 ] || { sed -n 2,10p "$0"; exit 2; }
for what in "$@"; do case $what in
tests)
    step "persistent GPU tests" 400 python -m pytest -v -rA tests/measure/quant/test_quant_persistent_gpu.py -p no:cacheprovider \
        > "$OUT/persistent-gputests.txt" 2>&1
    grep -E "PASSED|FAILED|ERROR|SKIPPED|tuned|persistent on" "$OUT/persistent-gputests.txt" | cut -c1-220 ;;
kernels)
    step "1x1 kernels" 480 python benchmarks/gemm_1x1.py --out "$OUT/gemm_1x1.jsonl" > "$OUT/gemm_1x1.txt" 2>&1
    tail -n 130 "$OUT/gemm_1x1.txt" | grep -v '^{'
    if [ "${SWEEP:-0}" = 1 ]; then
        step "1x1 sweep" 540 python benchmarks/gemm_1x1.py --layers layer1,layer2 --sweep \
            --out "$OUT/gemm_1x1_sweep.jsonl" > "$OUT/gemm_1x1_sweep.txt" 2>&1
        tail -n 60 "$OUT/gemm_1x1_sweep.txt" | grep -v '^{'
    fi ;;
network)
    for mode in off persistent; do
        step "network, $mode GEMMs" 280 env DEEPGAP_QUANT_GEMM=$mode python benchmarks/quant_inputs.py \
            --models resnet50 --precisions fp8,int8 --batch-sizes 256 --inputs default --pdl off \
            --out "$OUT/net-$mode.jsonl" > "$OUT/net-$mode.txt" 2>&1
        tail -n 4 "$OUT/net-$mode.txt"
    done ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
