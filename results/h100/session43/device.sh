#!/usr/bin/env bash
# Session 43 (2026-12-05): the device calls as run, on one H100 (the device tool gave an H100 for nvidia-h200),
# from the repository root with $OUT set and `.whl/` carried (benchmarks/device_lib.sh). README.md says what
# each call measured. Calls 1 and 2 are session 42's prepared steps, run as they stood:
#   call 1: nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv; bash results/h200/session42/device.sh 1
#   call 2: bash results/h200/session42/device.sh 2; bash results/h200/session42/device.sh 3
#           (step 2, the batch-512 loop, stopped at its first step: an unset --pdl reached the switch as '',
#           mended after the call in benchmarks/llm_decode_loop.py; step 3 = session 41's `device.sh 8`)
# Call 4 ran session 42's step 6 spelled out inline with each serve's limit at 280 s; case 4 runs that step so.
# Usage: bash results/h100/session43/device.sh 3|4|5
set -uo pipefail
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
source benchmarks/device_lib.sh
case ${1:-} in
3) bash results/h200/session42/device.sh 4       # issue 51: 8B fp8 batch 1, `deepgap run` and the bare loop
   step "resnet50 fp8 bs1024, default and int8-resident" 280 python -m deepgap run --models resnet50 --engines quant \
       --precisions fp8 --batch-sizes 1024 --inputs default,int8-resident --sweeps 1 --no-cpu-baseline \
       --no-thermal-warmup --store "$S/inputs.sqlite" > "$OUT/inputs-5.txt" 2>&1
   grep "img/s" "$OUT/inputs-5.txt" | tail -n 2
   python -m deepgap export "$S/inputs.sqlite" -o "$OUT/inputs-5.csv" > /dev/null 2>&1 ;;
4) SERVE_LIMIT=280 bash results/h200/session42/device.sh 6 ;;  # issue 51: served, 512 slots, each cache
5) step "deepgap run 8b fp8 bs1024, kv auto,fp8" 370 python -m deepgap run --workload decode --models llama-3.1-8b \
       --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1024 --kv-caches auto,fp8 --store "$S/kv-1024.sqlite" \
       > "$OUT/kv-run-1024.txt" 2>&1
   python -m deepgap export "$S/kv-1024.sqlite" --format csv -o "$OUT/kv-run-1024.csv" >/dev/null 2>&1
   grep -B1 -A2 "decode tokens/s" "$OUT/kv-run-1024.txt" | head -n 12 ;;
*) echo "usage: $0 3|4|5 (calls 1 and 2: the header)"; exit 2 ;;
esac
