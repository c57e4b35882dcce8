#!/usr/bin/env bash
# Session 27 (2026-12-04), one H200, issue 47's batch-1 split-K: the four device calls as run, from the
# repository root with $OUT set, `.whl/` carried (plotly, narwhals, LoadGen cp312; benchmarks/device_lib.sh).
# Before each call, here: PYTHONPATH=/tmp/t36/site:src python benchmarks/compile_sm90.py -j 2 (all ok).
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
case ${1:-} in
1)  # 5fd4450: split-K and the fused head behind DEEPGAP_QUANT_SMALL_BATCH=on, first timing; all GPU tests
    bash benchmarks/small_batch.sh all
    TEST_LIMIT=240 bash benchmarks/device.sh gputests ;;
2)  # three splits a tile, unrolled reduction, three head variants: the same steps, then batch 1024 harness
    # against the bare loop
    bash benchmarks/small_batch.sh all
    step "resnet50 quant fp8 bs1024 harness" 200 python -m deepgap run --models resnet50 --engines quant \
        --precisions fp8 --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup \
        --store "$S/bs1024.sqlite" > "$OUT/bs1024.txt" 2>&1
    python -m deepgap export "$S/bs1024.sqlite" -o "$OUT/bs1024.csv" > /dev/null 2>&1
    step "bare loop bs1024 fp8" 200 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
        --batch-sizes 1024 --inputs default --out "$OUT/loop-bs1024.jsonl" > "$OUT/loop-bs1024.txt" 2>&1 ;;
3)  # 86fb816: split-K on by default, the head gone: the main job from cold caches
    DEFAULT_LIMIT=585 bash benchmarks/device.sh default ;;
4)  # 86fb816: the split-K GPU test after the counters fix, harness and bare loop at batch 1 and 1024 after a
    # thermal warm-up, then the quant GPU tests until the call's time ran out
    bash benchmarks/small_batch.sh tests
    step "harness rn50 quant bs1,1024" 110 python -m deepgap run --models resnet50 --engines quant \
        --precisions fp8,int8 --batch-sizes 1,1024 --sweeps 1 --no-cpu-baseline --thermal-warmup \
        --thermal-timeout 30 --store "$S/check.sqlite" > "$OUT/check.txt" 2>&1
    python -m deepgap export "$S/check.sqlite" -o "$OUT/check.csv" > /dev/null 2>&1
    step "bare loop rn50 bs1,1024" 100 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
        --batch-sizes 1,1024 --inputs default --out "$OUT/loop.jsonl" > "$OUT/loop.txt" 2>&1
    step "quant GPU tests" 75 python -m pytest -q -m gpu tests/measure/quant/test_quant_gpu.py -p no:cacheprovider \
        > "$OUT/quant-gputests.txt" 2>&1 ;;
*) echo "usage: bash results/h200/session27/device.sh 1|2|3|4"; exit 2 ;;
esac
