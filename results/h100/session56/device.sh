#!/usr/bin/env bash
# Session 56 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Each call asked for nvidia-h200 (the README says which card each got).
# Usage: bash results/h100/session56/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
session_opening  # $gpu, $S and exp (benchmarks/device_lib.sh)
case ${1:-} in
1) # (any card, ~8 min) which kernel makes ResNet-50's batch-256 graph change between replays: the TMA 3×3
   # convolution alone on one input, repeated per tile, launch mode and descriptor form
   # (benchmarks/conv_tma_repeat.py); then the whole network's replays and eager steps (pdl_bits) with that kernel
   # off (the default since session 55); if that repeats, on with each descriptor form, else with the pair kernels
   # or the persistent 1×1 GEMM off
   step "conv_tma alone, repeated: fp8 bs256" 200 python benchmarks/conv_tma_repeat.py --precisions fp8 \
       --batch-sizes 256 --out "$OUT/conv-tma-repeat-fp8.jsonl" > "$OUT/conv-tma-repeat-fp8.txt" 2>&1
   grep -c '"differ": 0' "$OUT/conv-tma-repeat-fp8.jsonl"; grep -v '"differ": 0,' "$OUT/conv-tma-repeat-fp8.jsonl" | head -n 40
   # the whole network at batch 256 (the first of these tunes and compiles from nothing on a fresh machine)
   bits() { local l=$1; shift; local f="$OUT/bits-256-$(echo "$*" | tr ' =' '_-').txt"
            step "pdl bits bs256, $*" "$l" env "$@" python benchmarks/pdl_bits.py --batch 256 --triggers '' > "$f" 2>&1
            grep '^{' "$f"; }
   bits 200 DEEPGAP_QUANT_CONV_TMA=off
   if grep -q '"turn": "plain", "replays": \[{"differ": 0,.*{"differ": 0,.*{"differ": 0,' \
       "$OUT/bits-256-DEEPGAP_QUANT_CONV_TMA-off.txt"; then  # the default repeats: the TMA 3×3 on, each descriptor form
       bits 110 DEEPGAP_QUANT_CONV_TMA=on DEEPGAP_QUANT_CONV_TMA_DESC=host
       bits 110 DEEPGAP_QUANT_CONV_TMA=on DEEPGAP_QUANT_CONV_TMA_DESC=device
   else  # the default still changes: is another kernel to blame?
       bits 110 DEEPGAP_QUANT_PAIRS=off
       bits 110 DEEPGAP_QUANT_GEMM=off
   fi ;;
2) # (an H200, 6-8 min) issue 47's goals with session 55's defaults (PDL timed, each kernel's trigger after its wait,
   # the TMA 3×3 convolution off, the repeat check): deepgap run at batch 1 and 1024, fp8 and int8; the bare loop
   R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline --no-thermal-warmup)
   step "resnet50 quant fp8,int8 bs1" 150 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1 --store $S/r1.sqlite \
       > "$OUT/resnet-bs1.txt" 2>&1; exp r1
   grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 4
   step "resnet50 quant fp8,int8 bs1024" 280 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1024 \
       --store $S/r1024.sqlite > "$OUT/resnet-bs1024.txt" 2>&1; exp r1024
   grep -i "img/s\|error" "$OUT/resnet-bs1024.txt" | tail -n 4
   step "bare loop bs1, bs1024" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
       --batch-sizes 1,1024 --inputs default --out "$OUT/resnet-loop.jsonl" > "$OUT/resnet-loop.txt" 2>&1
   grep -A3 "^model" "$OUT/resnet-loop.txt" ;;
3) # (any card, ~4 min) the TMA 3×3 convolution at 2 stages (conv_tma.MAX_STAGES; 3 and 4 raced in call 1):
   # ResNet-50 at batch 1024 with the kernel off and on (the tuner's full-batch repeat check and the graph's in
   # both); then its tiles timed against the grouped kernel's best on layer2's shapes at batch 1024
   switch_ab DEEPGAP_QUANT_CONV_TMA 1024 conv-tma-1024 110 tma
   step "conv_tma tiles against the grouped kernel, layer2" 80 python benchmarks/conv_tma_bench.py --layers layer2 \
       --batch-sizes 1024 --precisions fp8 --out "$OUT/conv-tma-bench.jsonl" > "$OUT/conv-tma-bench.txt" 2>&1
   grep "grouped" "$OUT/conv-tma-bench.txt" ;;
t) # (~1 min; ran after call 2) the GPU tests of the TMA 3×3 tiles and of the graph's repeat at batch 256
   step "gpu tests" 280 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/quant/test_quant_conv_tma_gpu.py \
       tests/measure/quant/test_quant_gpu.py -k "repeats or offered" 2>&1 | tail -n 15 ;;
4) # (~1 min) the kernel alone at batch 1024, fp8 and int8, 1-4 stages; then its GPU tests (2 and 1 stages now)
   step "repeat 1024" 100 python benchmarks/conv_tma_repeat.py --precisions fp8,int8 --batch-sizes 1024 \
       --modes graph,burst --descriptors device --out $OUT/conv-tma-repeat-1024-4.jsonl > $OUT/conv-tma-repeat-1024-4.txt 2>&1
   grep -o '"precision": "[a-z0-9]*", "tile": "[^"]*", "mode": "[a-z]*", "differ": [0-9]*' $OUT/conv-tma-repeat-1024-4.jsonl
   step "gpu test conv_tma" 60 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/quant/test_quant_conv_tma_gpu.py \
       2>&1 | tail -n 2 ;;
5) # (prepared for an H200; ~9 min) issue 47's goals with today's defaults: ResNet-50 quant at batch 1; at 1024
   # after a thermal warm-up (at most 60 s), then the bare loop at once on the warm card (call 2's 1.025x came from
   # a cold run against a warm loop); the 2-stage TMA 3x3 off and on at 1024; then issue 51's 8B run at batch 1
   R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline)
   step "resnet50 quant fp8,int8 bs1" 120 "${R50[@]}" --no-thermal-warmup --precisions fp8,int8 --batch-sizes 1 \
       --store $S/r1.sqlite > "$OUT/resnet-bs1.txt" 2>&1; exp r1
   grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 4
   step "resnet50 quant fp8,int8 bs1024, warm" 200 "${R50[@]}" --thermal-warmup --thermal-window 15 \
       --thermal-timeout 60 --precisions fp8,int8 --batch-sizes 1024 --store $S/r1024.sqlite > "$OUT/resnet-bs1024.txt" 2>&1
   exp r1024; grep -i "img/s\|error" "$OUT/resnet-bs1024.txt" | tail -n 4
   step "bare loop bs1024, bs1" 90 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
       --batch-sizes 1024,1 --inputs default --out "$OUT/resnet-loop.jsonl" > "$OUT/resnet-loop.txt" 2>&1
   grep -A3 "^model" "$OUT/resnet-loop.txt"
   switch_ab DEEPGAP_QUANT_CONV_TMA 1024 conv-tma-1024 110 tma
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store $S/run8b.sqlite > "$OUT/run8b-bs1.txt" 2>&1
   exp run8b; grep -i "tok/s\|tokens/s" "$OUT/run8b-bs1.txt" | tail -n 1 ;;
6) # (prepared, any card, ~1 min) the 3-4 stage race on one warpgroup: the tuner's tile on 8 and 4 warps, 1-4 stages
   step "repeat, 8 and 4 warps" 100 python benchmarks/conv_tma_repeat.py --precisions fp8 --batch-sizes 256 \
       --modes graph,burst --descriptors device --warps 8,4 --out $OUT/conv-tma-warps.jsonl > $OUT/conv-tma-warps.txt 2>&1
   grep -o '"layer": "[^"]*", "batch": [0-9]*, "precision": "[a-z0-9]*", "tile": "[^"]*", "mode": "[a-z]*", "differ": [0-9]*' \
       $OUT/conv-tma-warps.jsonl ;;
*) echo "usage: $0 1|2|t|3|4|5|6"; exit 2 ;;
esac
