#!/usr/bin/env bash
# Session 57 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Each call asked for nvidia-h200 (the README says which card each got).
# DEEPGAP_QUANT_STEM_POOL_SWAP (the pooled swapped stem offered) was named DEEPGAP_QUANT_STEM_SWAP when calls b and 1
# ran; that name now switches the unfused swapped convolution (call c).
# Usage: bash results/h100/session57/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
session_opening  # $gpu, $S and exp (benchmarks/device_lib.sh)
case ${1:-} in
1) # (any card, ~4 min) issue 47: the stem's convolution at batch 1024, first GPU timing of session 29's swapped
   # kernel (weights as the MMA's M side, `stem_s2d.SWAP_TILES`) beside every super-pixel and 4-byte-pixel tile
   # and the max-pool, and the whole stem with the pool inside the swapped kernel (`stem_swap_pool`, session 57)
   # (benchmarks/stem_split.py, fp8, each output checked bit for bit); the GPU tests of both
   step "stem split bs1024" 240 python benchmarks/stem_split.py --batch-sizes 1024 --formats fp8 --parts s2d \
       > "$OUT/stem-split-1024.jsonl" 2>&1
   grep '"summary"' "$OUT/stem-split-1024.jsonl" | python3 -c "import json,sys
for r in map(json.loads, sys.stdin):
    print(r['out_fmt'], 'conv', r['conv_ms'], 'pool', r['pool_ms'], 'stem', r['stem_ms'])
    print('  s2d', r['conv_s2d_ms'], 'quantize', r['quantize_ms'])
    print('  stem s2d', r['stem_s2d_ms'])"
   grep -i "error\|traceback\|mismatch" "$OUT/stem-split-1024.jsonl" | head -n 5
   step "gpu tests: s2d stem" 150 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/quant/test_quant_stem_s2d.py tests/measure/quant/test_quant_stem_swap_pool.py \
       2>&1 | tail -n 4 ;;
2) # (any card, ~5 min) ResNet-50 at 1024, fp8 and int8, with the pooled swapped stem offered to the engine's
   # choice (DEEPGAP_QUANT_STEM_POOL_SWAP) off, then on; what each build chose and timed
   switch_ab DEEPGAP_QUANT_STEM_POOL_SWAP 1024 stem-swap-1024 150 stem ;;
3) # (any card, ~3 min) the same at batch 1
   switch_ab DEEPGAP_QUANT_STEM_POOL_SWAP 1 stem-swap-1 80 stem ;;
a) # (any card, at most 9 min; for a session with little device time left) the pooled stem's GPU test, then call 2's
   # A/B at batch 1024, then call 1's timings
   step "gpu test: pooled swapped stem" 90 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/quant/test_quant_stem_swap_pool.py 2>&1 | tail -n 4
   switch_ab DEEPGAP_QUANT_STEM_POOL_SWAP 1024 stem-swap-1024 150 stem
   step "stem split bs1024" 170 python benchmarks/stem_split.py --batch-sizes 1024 --formats fp8 --parts s2d \
       > "$OUT/stem-split-1024.jsonl" 2>&1
   grep '"summary"' "$OUT/stem-split-1024.jsonl" | python3 -c "import json,sys
for r in map(json.loads, sys.stdin):
    print(r['out_fmt'], 'conv', r['conv_ms'], 'pool', r['pool_ms'])
    print('  s2d', r['conv_s2d_ms'], 'quantize', r['quantize_ms'])
    print('  stem s2d', r['stem_s2d_ms'])"
   grep -o '"form": "[^"]*", "bit_equal": [a-z]*, "ms": [0-9.]*' "$OUT/stem-split-1024.jsonl" ;;
b) # (any card, at most 6 min; for even less device time) the pooled stem's GPU test; ResNet-50 fp8 at 1024 with the
   # pooled stem offered, then not; what each build chose
   step "gpu test: pooled swapped stem" 80 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/quant/test_quant_stem_swap_pool.py 2>&1 | tail -n 4
   for mode in on off; do
       step "resnet50 fp8 bs1024, stem swap $mode" 130 env DEEPGAP_QUANT_STEM_POOL_SWAP=$mode python -m deepgap run \
           --models resnet50 --engines quant --precisions fp8 --batch-sizes 1024 --sweeps 1 --no-cpu-baseline \
           --no-thermal-warmup --store $S/swap-$mode.sqlite > "$OUT/stem-swap-1024-fp8-$mode.txt" 2>&1
       grep "img/s" "$OUT/stem-swap-1024-fp8-$mode.txt" | tail -n 1
       exp swap-$mode; python benchmarks/engine_kept.py $S/swap-$mode.sqlite stem 2>&1 | tee "$OUT/stem-swap-$mode-kept.txt"
   done ;;
c) # (any card, ~4 min) ResNet-50 fp8 at 1024 with the swapped convolution (then the pool) offered to the stem
   # choice (DEEPGAP_QUANT_STEM_SWAP, on by default), then not; what each build chose
   for mode in on off; do
       step "resnet50 fp8 bs1024, swapped conv $mode" 130 env DEEPGAP_QUANT_STEM_SWAP=$mode python -m deepgap run \
           --models resnet50 --engines quant --precisions fp8 --batch-sizes 1024 --sweeps 1 --no-cpu-baseline \
           --no-thermal-warmup --store $S/conv-swap-$mode.sqlite > "$OUT/conv-swap-1024-fp8-$mode.txt" 2>&1
       grep "img/s" "$OUT/conv-swap-1024-fp8-$mode.txt" | tail -n 1
       exp conv-swap-$mode; python benchmarks/engine_kept.py $S/conv-swap-$mode.sqlite stem 2>&1 \
           | tee "$OUT/conv-swap-$mode-kept.txt"
   done ;;
d) # (any card, ~2 min; the last of the session's device time) ResNet-50 fp8 at 1024 with today's defaults, the
   # swapped convolution offered: its build's stem choice times it beside the int8s2d tiles
   step "resnet50 fp8 bs1024, defaults" 150 python -m deepgap run --models resnet50 --engines quant --precisions fp8 \
       --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store $S/d.sqlite > "$OUT/default-1024.txt" 2>&1
   grep "img/s" "$OUT/default-1024.txt" | tail -n 1
   exp d; python benchmarks/engine_kept.py $S/d.sqlite stem 2>&1 | tee "$OUT/default-1024-kept.txt" ;;
*) echo "usage: $0 1|2|3|a|b|c|d"; exit 2 ;;
esac
