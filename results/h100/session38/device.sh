#!/usr/bin/env bash
# Session 38 (2026-12-05), issue 51, asked as nvidia-h200 and run on one H100 80GB HBM3 each time: where a batch-1 8B fp8 decode step's time goes, kernel by kernel,
# and the attention split in programs appended to the qkv GEMV (DEEPGAP_DECODE_ATTENTION=qkv-split).
# From the repository root on the device, $OUT set, `.whl/` carried:   bash results/h100/session38/device.sh N
#   1 — qkv-split's GPU tests; the bare loop replaying deepgap's own step (split KV auto) with PDL on and off,
#       attention triton and qkv-split, each with `--timeline`: ten steps under the profiler, each kernel's share
#       of the step's critical path (`deepgap.roofline.timeline`), the traces saved; then the one-kernel step's
#       GPU tests (session 37 left `ahead` suspect)
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
1) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "qkv-split GPU tests" 130 python -m pytest -q -m gpu tests/measure/test_llm_qkv_split.py -rA \
       -p no:cacheprovider > "$OUT/split-gputests-1.txt" 2>&1
   tail -n 8 "$OUT/split-gputests-1.txt"
   step "decode loop timeline" 300 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --precision fp8 \
       --batches 1 --pdl on,off --split-kv auto --attention triton,qkv-split --harness deepgap --timeline \
       --out "$OUT" > "$OUT/timeline-1.txt" 2>&1
   grep -v '^{' "$OUT/timeline-1.txt" | grep -v "^ *$" | tail -n 90
   python3 -c "import json,sys; [print(r['pdl'], r['attention'], r['tpot_ms'], r['decode_tok_s'], r.get('timeline_step_us'), \
r.get('wait_gave_up', '')) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/llm_decode_loop.jsonl"
   step "whole decode GPU tests" 120 python -m pytest -q -m gpu tests/measure/test_llm_whole.py -rA \
       -p no:cacheprovider > "$OUT/whole-gputests-1.txt" 2>&1
   tail -n 12 "$OUT/whole-gputests-1.txt" ;;
# 3 — call 1's steps again (whichever Hopper card comes), the one-kernel tests with the attention phase held to the
#     split kernel's GPU tolerance, and the plain HBM read of the GEMVs' sizes with PDL (`hbm_read.py`: their ceiling)
3) bash "$0" 1
   step "hbm read" 120 python benchmarks/hbm_read.py --pdl --out "$OUT" > "$OUT/hbm-read-3.txt" 2>&1
   tail -n 14 "$OUT/hbm-read-3.txt" ;;
# 4 — what each fold costs the qkv and gate_up GEMVs (`fused_variants.py`: plain, norm, pairs, both; every tile)
4) step "fused variants" 240 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-4.txt" 2>&1
   tail -n 8 "$OUT/fused-variants-4.txt" ;;
# 5 — the norm's γ before PDL's wait (DEEPGAP_DECODE_GAMMA=early): the fold variants both ways, then the bare loop.
#     Ran on tree 39b7197; the switch and `fused_variants.py --gamma` were removed after (within noise)
5) step "fused variants gamma" 150 python benchmarks/fused_variants.py --gamma loop,early --out "$OUT" \
       > "$OUT/fused-variants-5.txt" 2>&1
   tail -n 14 "$OUT/fused-variants-5.txt"
   for g in loop early; do
       step "decode loop gamma $g" 120 env DEEPGAP_DECODE_GAMMA=$g python benchmarks/llm_decode_loop.py \
           --model llama-3.1-8b --precision fp8 --batches 1 --pdl on --split-kv auto --harness deepgap \
           --out "$OUT" > "$OUT/loop-gamma-$g-5.txt" 2>&1
       grep '^{' "$OUT/loop-gamma-$g-5.txt" | cut -c1-300
   done ;;
# 6 — the default step's timeline (PDL on, attention triton) and the folds' cost, for whichever card comes
6) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "decode loop timeline" 150 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --precision fp8 \
       --batches 1 --pdl on --split-kv auto --harness deepgap --timeline --out "$OUT" > "$OUT/timeline-6.txt" 2>&1
   grep -v '^{' "$OUT/timeline-6.txt" | grep -v "^ *$" | tail -n 12
   step "fused variants" 100 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-6.txt" 2>&1
   tail -n 8 "$OUT/fused-variants-6.txt" ;;
# 2 — confirmation: the bare loop (PDL on, split KV auto) with attention triton and ${ATTN:-qkv-split}, then
#     `deepgap run` (8B fp8, batch 1, 128/128) with each, the harness against the loop (2%)
2) S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "decode loop triton,${ATTN:-qkv-split}" 200 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --precision fp8 --batches 1 --pdl on --split-kv auto --attention "triton,${ATTN:-qkv-split}" --harness deepgap \
       --out "$OUT" > "$OUT/loop-2.txt" 2>&1
   grep '^{' "$OUT/loop-2.txt" | cut -c1-400
   for a in ${ATTN:-qkv-split} triton; do
       step "deepgap run 8b fp8 bs1, attention $a" 150 env DEEPGAP_DECODE_ATTENTION="$a" python -m deepgap run \
           --workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 \
           --sweeps 1 --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 \
           --store "$S/run-$a.sqlite" > "$OUT/run-$a-2.txt" 2>&1
       python -m deepgap export "$S/run-$a.sqlite" --format csv -o "$OUT/run-$a-2.csv" >/dev/null 2>&1
       python3 -c "import csv,sys; [print(r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], \
r['decode_pdl'], r['decode_attention']) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/run-$a-2.csv"
   done ;;
*) echo "usage: $0 1|2|3|4|5|6"; exit 2 ;;
esac
