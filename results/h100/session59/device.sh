#!/usr/bin/env bash
# Session 59 (2026-12-07): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Usage: bash results/h100/session59/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
S=/tmp/dg; mkdir -p $S
case ${1:-} in
h) # (any card, ~5 min; the first call where device time is short) session 58's lever, then issue 47's batch-1 goal
   # with whichever order won: the GPU tests of DEEPGAP_PDL_CONSTANTS=ahead; ResNet-50 fp8 at batch 1, its PDL graph
   # captured in turns after/ahead (quant_inputs.py --constants); `deepgap run` fp8,int8 at batch 1 with the order
   # whose median turn was faster and kept the logits (after if the tests failed)
   step "gpu tests: constants ahead" 100 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/quant/test_constants_ahead.py > "$OUT/gpu-tests.txt" 2>&1
   tail -n 3 "$OUT/gpu-tests.txt"
   tests_ok=0; grep -q ": rc=0 in" "$OUT/gpu-tests.txt" && tests_ok=1  # step's own line says pytest's exit status
   step "resnet50 fp8 bs1 constants turns" 130 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
       --batch-sizes 1 --inputs default --constants after,ahead,after,ahead,after,ahead \
       --out "$OUT/resnet-bs1-constants.jsonl" > "$OUT/resnet-bs1-constants.txt" 2>&1
   grep -A8 "^model" "$OUT/resnet-bs1-constants.txt"
   best=$(python3 -c "import json, statistics, sys
turns = [t for r in map(json.loads, open(sys.argv[1])) for t in r.get('constants_turns', [])]
med = {c: statistics.median(t['img_s'] for t in turns if t['constants'] == c) for c in ('after', 'ahead')
       if all(t['same_logits'] for t in turns if t['constants'] == c) and any(t['constants'] == c for t in turns)}
print('ahead' if sys.argv[2] == '1' and med.get('ahead', 0) > med.get('after', 0) else 'after')
" "$OUT/resnet-bs1-constants.jsonl" $tests_ok 2>/dev/null || echo after)
   echo "constants for the run: $best"
   step "deepgap run resnet50 bs1, constants $best" 110 env DEEPGAP_PDL_CONSTANTS=$best python -m deepgap run \
       --models resnet50 --engines quant --precisions fp8,int8 --batch-sizes 1 --sweeps 1 --no-cpu-baseline \
       --no-thermal-warmup --store $S/bs1.sqlite > "$OUT/run-bs1-$best.txt" 2>&1
   grep "img/s" "$OUT/run-bs1-$best.txt" | tail -n 2
   python -m deepgap export $S/bs1.sqlite -o "$OUT/resnet-bs1-$best.csv" > /dev/null 2>&1 || true ;;
t) # (any card, what is left of a session's device time, ~3 min) the batch-1 turns alone: ResNet-50 fp8, its PDL
   # graph captured in four turns (after, ahead, after, ahead), each turn's logits against the kept graph's
   step "resnet50 fp8 bs1 constants turns" 200 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
       --batch-sizes 1 --inputs default --constants after,ahead,after,ahead \
       --out "$OUT/resnet-bs1-constants.jsonl" > "$OUT/resnet-bs1-constants.txt" 2>&1
   grep -A8 "^model" "$OUT/resnet-bs1-constants.txt" ;;
*) echo "usage: $0 h|t"; exit 2 ;;
esac
