#!/usr/bin/env bash
# Session 60 (2026-12-07): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Usage: bash results/h100/session60/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
session_opening  # $gpu, $S and exp (benchmarks/device_lib.sh)
# turns NAME PRECISIONS BATCHES LIMIT: ResNet-50 built once a configuration, its PDL graph captured again in turns
# after/ahead/after/ahead (`quant_inputs.py --constants`), into $OUT/resnet-NAME.jsonl and .txt
turns() {
   step "resnet50 $2 bs$3 constants turns" $4 python benchmarks/quant_inputs.py --models resnet50 --precisions $2 \
       --batch-sizes $3 --inputs default --constants after,ahead,after,ahead \
       --out "$OUT/resnet-$1.jsonl" > "$OUT/resnet-$1.txt" 2>&1
   grep -A14 "^model" "$OUT/resnet-$1.txt"; }
case ${1:-} in
b) # (any card, ~5 min) does DEEPGAP_PDL_CONSTANTS=ahead, which won at batch 1, cost anything at the throughput
   # batches? ResNet-50 fp8 at batch 256 and 1024 and int8 at 1024, the graph captured in turns after/ahead
   turns big-constants fp8 256,1024 250
   turns int8-constants int8 1024 150 ;;
g) # (an H200, ~9 min) issue 47's goals and issue 51's 8B batch 1 with the constants ahead (the default since this
   # session): ResNet-50 quant fp8,int8 at batch 1; fp8 at 1024 after a thermal warm-up (at most 60 s, for J/img); the
   # bare loop at 1 and 1024 on the warm card, its PDL graph captured in turns after/ahead; the 8B run at batch 1
   R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline)
   step "resnet50 quant fp8,int8 bs1" 100 "${R50[@]}" --no-thermal-warmup --precisions fp8,int8 --batch-sizes 1 \
       --store $S/r1.sqlite > "$OUT/resnet-bs1.txt" 2>&1; exp r1
   grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 2
   step "resnet50 quant fp8 bs1024, warm" 140 "${R50[@]}" --thermal-warmup --thermal-window 15 --thermal-timeout 60 \
       --precisions fp8 --batch-sizes 1024 --store $S/r1024.sqlite > "$OUT/resnet-bs1024.txt" 2>&1
   exp r1024; grep -i "img/s\|error" "$OUT/resnet-bs1024.txt" | tail -n 2
   turns loop fp8 1024,1 110  # the bare loop at 1024 and 1 on the warm card
   step "deepgap run 8b fp8 bs1" 140 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store $S/run8b.sqlite > "$OUT/run8b-bs1.txt" 2>&1
   exp run8b; grep -i "tok/s\|tokens/s" "$OUT/run8b-bs1.txt" | tail -n 1 ;;
c) # (any card, ~4 min; what is left of a session's device time) call b cut to fp8 at batch 1024
   turns 1024-constants fp8 1024 230 ;;
q) # (any card, ~4 min) issue 51: with the constants ahead, qkv's tile (`8x512 st4`) needs 136 registers and fits three
   # programs an SM; capped at 128 (12 bytes spilled, to L1) it fits four. The 8B loop at batch 1, deepgap's step,
   # the tuner's tiles against qkv forced to the capped tile and to gate_up's in-thread form, in turns
   Q=4096x6144
   step "loop 8b fp8 bs1 qkv tiles" 260 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 \
       --pdl on --precision fp8 --harness deepgap --out "$OUT" \
       --tiles "tuned;$Q=8x512w4s4br128;$Q=4x2048w4t;tuned;$Q=8x512w4s4br128;$Q=4x2048w4t" > "$OUT/loop-qkv.txt" 2>&1
   python3 -c "import json,sys
for r in map(json.loads, open(sys.argv[1])):
    print(r.get('forced_tiles'), 'tpot', r.get('tpot_ms'), r.get('decode_tok_s'), 'tok/s; sync', r.get('tpot_sync_ms'))
" "$OUT/llm_decode_loop.jsonl"; tail -n 2 "$OUT/loop-qkv.txt" ;;
n) # (the next session's first call, ~8-9 min) on an H200 call g; on another card call q, then call b's fp8 at
   # 256 and 1024 (call c's script with 256 added)
   case $gpu in
   *H200*) bash "$0" g ;;
   *) bash "$0" q
      turns big-constants fp8 256,1024 280 ;;
   esac ;;
*) echo "usage: $0 b|c|g|n|q"; exit 2 ;;
esac
