#!/usr/bin/env bash
# Issue 47's batch-1 split-K convolutions (`quant.split_k`; on by default, DEEPGAP_QUANT_SMALL_BATCH=off
# leaves them out), from the repository root on the device, $OUT set:
#   bash benchmarks/small_batch.sh STEP...   (all = tests engine loop)
# Steps (session 27's times on one H200):
#   tests   — tests/measure/quant/test_quant_small_batch_gpu.py: every split tile offered at batch 1 for
#             three ResNet-50 layers against the exact reference, repeated and replayed in a CUDA graph (~50 s)
#   engine  — `deepgap run` ResNet-50 quant fp8 and int8 at batch 1, one sweep, no warm-up, no CPU baseline,
#             with the switch off then on: the two stores' CSV exports, each row's median and p99, and which
#             tiles the tuner kept (engine_info) (41 and 34 s)
#   loop    — the independent CUDA-event loop (benchmarks/quant_inputs.py) at batch 1, switch on, for the
#             harness-within-2% check of the engine step's rows (35 s)
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests engine loop ;;
tests)
    step "small-batch GPU tests" 120 python -m pytest -q -m gpu tests/measure/quant/test_quant_small_batch_gpu.py \
        -p no:cacheprovider > "$OUT/small-batch-tests.txt" 2>&1
    tail -n 15 "$OUT/small-batch-tests.txt" ;;
engine)
    switch_ab DEEPGAP_QUANT_SMALL_BATCH 1 bs1 150 split ;;
loop)
    step "bare loop, resnet50 quant bs1, DEEPGAP_QUANT_SMALL_BATCH=on" 150 env DEEPGAP_QUANT_SMALL_BATCH=on \
        python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 --batch-sizes 1 --inputs default \
        --out "$OUT/loop-bs1.jsonl" > "$OUT/loop-bs1.txt" 2>&1
    tail -n 6 "$OUT/loop-bs1.txt" ;;
*) echo "unknown step $what (tests, engine, loop, all)"; exit 2 ;;
esac; done
