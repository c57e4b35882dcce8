#!/usr/bin/env bash
# Issue 47, written in session 29 after its last device call: the head's Triton pool (`quant.head_pool`, chosen
# by time at build) and the stem's swapped convolution (`stem_s2d.stem_swap_kernel`, not offered until timed).
# From the repository root on the device, $OUT set:   bash benchmarks/head_stem.sh STEP...  (all = every step)
#   tests   — the GPU tests of both, and the PDL graph's logits at batch 1 (the pool kernel waits under PDL)
#   stems   — benchmarks/stem_split.py at batch 1024, 256, 1: every stem tile, the swapped ones beside them
#   engine  — `deepgap run` ResNet-50 quant fp8 at batch 1 and 1024 (one sweep, no warm-up): the head's choice
#             and the head row, from engine_kept.py
#   loop    — the bare loop at 1024 (fp8): back to back and synchronized, against the engine's two figures
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests stems engine loop ;;
tests)
    step "head + s2d + pdl GPU tests" 200 python -m pytest -q -m gpu tests/measure/quant/test_quant_head_pool.py \
        tests/measure/quant/test_quant_stem_s2d.py tests/measure/quant/test_quant_gpu.py -k "head or s2d or swap or pdl" \
        -p no:cacheprovider > "$OUT/head-stem-gputests.txt" 2>&1
    tail -n 5 "$OUT/head-stem-gputests.txt" ;;
stems)
    step "stem split" 200 python benchmarks/stem_split.py --batch-sizes 1024,256,1 > "$OUT/stem-split.jsonl" 2>&1
    grep summary "$OUT/stem-split.jsonl" | cut -c1-700 ;;
engine)
    step "rn50 quant fp8 bs1,1024" 200 python -m deepgap run --models resnet50 --engines quant --precisions fp8 \
        --batch-sizes 1,1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store "$S/head.sqlite" \
        > "$OUT/head-run.txt" 2>&1
    grep "img/s" "$OUT/head-run.txt" | tail -n 2
    python -m deepgap export "$S/head.sqlite" -o "$OUT/head-run.csv" > /dev/null 2>&1 || true
    python benchmarks/engine_kept.py "$S/head.sqlite" head 2>&1 | tee "$OUT/head-kept.txt" ;;
loop)
    step "bare loop fp8 1024" 120 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
        --batch-sizes 1024 --inputs default --pdl off --out "$OUT/loop.jsonl" > "$OUT/loop.txt" 2>&1
    grep -v '^{' "$OUT/loop.txt" | tail -n 4 ;;
*) echo "unknown step $what (tests, stems, engine, loop, all)"; exit 2 ;;
esac; done
