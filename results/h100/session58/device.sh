#!/usr/bin/env bash
# Session 58 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Each call asked for nvidia-h200 (the README says which card each got).
# Usage: bash results/h100/session58/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
session_opening  # $gpu, $S and exp (benchmarks/device_lib.sh)
# the three steps calls 1 and s share: the GPU tests; ResNet-50 at batch 1 (precisions $1), one build each, its PDL
# graph captured again per turn (quant_inputs.py --constants); the 8B bare loop on deepgap's step, turns alternating
gpu_tests() { step "gpu tests: constants ahead" 100 python -m pytest -q -p no:cacheprovider -m gpu \
                  tests/measure/quant/test_constants_ahead.py 2>&1 | tail -n 4; }
resnet_turns() {
   step "resnet50 $1 bs1 constants turns" $2 python benchmarks/quant_inputs.py --models resnet50 --precisions $1 \
       --batch-sizes 1 --inputs default --constants after,ahead,after,ahead,after,ahead \
       --out "$OUT/resnet-bs1-constants.jsonl" > "$OUT/resnet-bs1-constants.txt" 2>&1
   grep -A12 "^model" "$OUT/resnet-bs1-constants.txt"; }
loop_turns() {
   step "loop 8b fp8 bs1 constants turns" $1 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 \
       --pdl on --precision fp8 --harness deepgap --constants after,ahead,after,ahead --out "$OUT" \
       > "$OUT/loop-constants.txt" 2>&1
   python3 -c "import json,sys
for r in map(json.loads, open(sys.argv[1])):
    print(r.get('pdl_constants'), 'tpot', r.get('tpot_ms'), r.get('decode_tok_s'), 'tok/s; sync', r.get('tpot_sync_ms'),
          r.get('decode_tok_s_sync'))" "$OUT/llm_decode_loop.jsonl"
   tail -n 3 "$OUT/loop-constants.txt"; }
case ${1:-} in
1) # (any card, ~7 min) each kernel's epilogue constants before PDL's wait (DEEPGAP_PDL_CONSTANTS=ahead,
   # `quant.launch.constants_ahead`): the shared steps for fp8 and int8, and `deepgap run` at batch 1 with the switch
   # off then on
   gpu_tests
   resnet_turns fp8,int8 200
   for mode in after ahead; do
       step "deepgap run resnet50 bs1, constants $mode" 100 env DEEPGAP_PDL_CONSTANTS=$mode python -m deepgap run \
           --models resnet50 --engines quant --precisions fp8,int8 --batch-sizes 1 --sweeps 1 --no-cpu-baseline \
           --no-thermal-warmup --store $S/bs1-$mode.sqlite > "$OUT/run-bs1-$mode.txt" 2>&1
       grep "img/s" "$OUT/run-bs1-$mode.txt" | tail -n 2; exp bs1-$mode
   done
   loop_turns 200 ;;
s) # (any card, ~5 min; call 1 cut to what little device time was left) the shared steps, fp8 only
   gpu_tests
   resnet_turns fp8 130
   loop_turns 150 ;;
2) # (an H200, ~9 min) issue 47's goals and issue 51's 8B run at batch 1 as session 56's call 5 prepared them, with
   # each kernel's constants before PDL's wait (CONST=after for the old order)
   export DEEPGAP_PDL_CONSTANTS=${CONST:-ahead}
   bash results/h100/session56/device.sh 5 ;;
*) echo "usage: $0 1|s|2"; exit 2 ;;
esac
