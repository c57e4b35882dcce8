#!/usr/bin/env bash
# Session 46 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). The asks were for nvidia-h200; the machine that came was one H100 80GB HBM3.
# Usage: bash results/h100/session46/device.sh N (the README says each call's command and result).
set -uo pipefail
case ${1:-} in
1) # issue 47: served capacity against the engine alone held >= 1 s back to back (its burst beside it), and
   # LoadGen at that capacity, three consecutive runs of quant fp8, then the summary
   S=${DEVICE_WORK:-/tmp/deepgap-device}/loadgen LIMIT=${LIMIT:-150} bash benchmarks/loadgen_confirm.sh \
       fp8-1 fp8-2 fp8-3 summary
   grep -h "engine alone" "$OUT"/fp8-*.txt ;;
2) # issue 51, batch 1: the GEMV tiles timed cached vs streamed (session 45's step 4): its GPU test, three bare
   # loops and one `deepgap run` each way. The loops stopped at their first GEMV in this call (the loop's tile
   # wrapper lacked `weights=`, fixed after it: tune-cached-failed-1.txt); its GPU test and runs stand
   bash results/h200/session45/device.sh 4 ;;
3) source benchmarks/device_lib.sh  # the loops of step 2 again, fixed, two processes a mode (interleaved)
   for i in 1 2; do for mode in cached streamed; do
       step "loop bs1 $mode $i" 100 env DEEPGAP_GEMV_TUNE=$mode python benchmarks/llm_decode_loop.py \
           --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap --precision fp8 \
           --out "$OUT" > "$OUT/tune-$mode-$i.txt" 2>&1
       grep '^{' "$OUT/tune-$mode-$i.txt" | python3 -c "import json,sys; [print('$mode', r['tpot_ms'], \
r['decode_tok_s'], r.get('decode_tok_s_sync'), str(r.get('tiles', ''))[:300]) for r in map(json.loads, sys.stdin)]"
   done; done ;;
4) bash results/h200/session45/device.sh 9 ;;  # issue 47: the sweep's own rate at batch 128, sync and pipelined
5) # prepared for an H200 (issue 47's goal is there): step 1 with the search's bracket at 1% (--capacity-tol),
   # so that the ratio's two ends (capacity, lowest failing rate) lie within 1% of each other
   S=${DEVICE_WORK:-/tmp/deepgap-device}/loadgen LIMIT=${LIMIT:-170} SERVE_ARGS="--capacity-tol 0.01" \
       bash benchmarks/loadgen_confirm.sh fp8-1 fp8-2 fp8-3 summary
   grep -h "engine alone" "$OUT"/fp8-*.txt ;;
6) source benchmarks/device_lib.sh  # prepared: issue 47, batch 1 with the batch in the graph's own input buffer
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"  # (graph_runner.bound_input: no copy before a replay)
   step "bound input GPU tests" 150 python -m pytest -q -m gpu tests/measure/test_bound_input.py -rA \
       -p no:cacheprovider > "$OUT/bound-gputests.txt" 2>&1
   tail -n 3 "$OUT/bound-gputests.txt"
   step "resnet50 quant fp8,int8 bs1" 150 python -m deepgap run --models resnet50 --engines quant \
       --precisions fp8,int8 --batch-sizes 1 --sweeps 1 --no-cpu-baseline --no-thermal-warmup \
       --store "$S/bs1.sqlite" > "$OUT/resnet-bs1.txt" 2>&1
   python -m deepgap export "$S/bs1.sqlite" -o "$OUT/resnet-bs1.csv" > /dev/null 2>&1 || true
   step "bare loop bs1" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
       --batch-sizes 1 --inputs default --out "$OUT/resnet-bs1-loop.jsonl" > "$OUT/resnet-bs1-loop.txt" 2>&1
   grep -v '^{' "$OUT/resnet-bs1-loop.txt" | tail -n 4 ;;
*) echo "usage: $0 1|2|3|4|5|6"; exit 2 ;;
esac
