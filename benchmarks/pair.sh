#!/usr/bin/env bash
# Issue 47's fused pair of 1×1 convolutions (`quant.pair`; on by default, DEEPGAP_QUANT_PAIRS=off leaves it out),
# from the repository root on the device, $OUT set:   bash benchmarks/pair.sh STEP...   (all = tests engine loop)
# Steps (session 28's times on one H200):
#   kernels — benchmarks/pair_bench.py: each ResNet-50 pair shape that has a tile, fused against the two layers'
#             best tiles alone, at $PAIR_BATCHES (1024,1) in fp8 and int8 → pair.jsonl, pair.txt (~45 s)
#   tests   — tests/measure/quant/test_quant_pair_gpu.py
#   engine  — `deepgap run` ResNet-50 quant fp8 and int8 at batch $PAIR_ENGINE_BATCH (1024), one sweep, no warm-up,
#             no CPU baseline, pairs off then on: each store's CSV export and the pairs the tuner kept
#   loop    — the independent CUDA-event loop (benchmarks/quant_inputs.py), fp8 and int8 at that batch, pairs on
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
B=${PAIR_ENGINE_BATCH:-1024}
for what in "${@:-all}"; do case $what in
all) bash "$0" tests engine loop ;;
kernels)
    step "pair kernels" "${PAIR_LIMIT:-300}" python benchmarks/pair_bench.py --batch-sizes "${PAIR_BATCHES:-1024,1}" \
        --precisions "${PAIR_PRECISIONS:-fp8,int8}" --out "$OUT/pair.jsonl" > "$OUT/pair.txt" 2>&1
    grep -v '^{' "$OUT/pair.txt" | tail -n 40 ;;
tests)
    step "pair GPU tests" 200 python -m pytest -q -m gpu tests/measure/quant/test_quant_pair_gpu.py -p no:cacheprovider \
        > "$OUT/pair-gputests.txt" 2>&1
    tail -n 15 "$OUT/pair-gputests.txt" ;;
engine)
    switch_ab DEEPGAP_QUANT_PAIRS "$B" pairs 200 pairs ;;
loop)
    step "bare loop, resnet50 quant bs$B, pairs on" 200 python benchmarks/quant_inputs.py --models resnet50 \
        --precisions fp8,int8 --batch-sizes "$B" --inputs default --out "$OUT/loop-pairs.jsonl" > "$OUT/loop-pairs.txt" 2>&1
    tail -n 6 "$OUT/loop-pairs.txt" ;;
*) echo "unknown step $what (kernels, tests, engine, loop, all)"; exit 2 ;;
esac; done
