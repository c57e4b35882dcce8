#!/usr/bin/env bash
# Session 44 (2026-12-05): the calls of this session, from the repository root with $OUT set and `.whl/`
# carried (benchmarks/device_lib.sh). Usage: bash results/h200/session44/device.sh N (the README says each).
set -uo pipefail
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
decode_rows() {  # decode_rows CSV: cache, batch, decode and pipelined tokens/s, TTFT, output tokens/s, prefill, relL2
    python3 -c "import csv,sys; [print(r.get('kv_cache') or 'auto', r['batch_size'], r['decode_tokens_per_s'], \
r['pipelined_decode_tokens_per_s'], r['ttft_median_ms'], r['output_tokens_per_s'], r.get('decode_prefill', ''), \
r.get('logits_rel_l2_vs_fp32', ''), r['status']) for r in csv.DictReader(open(sys.argv[1]))]" "$1"
}
case ${1:-} in
1) # the H200's batch-1 decode row and bare loop (session 41's step 7), then the shortcut branch's A/B at batch 1
   # (session 41's step 8); the prefill kept eager here, as in the rows these are compared with
   export DEEPGAP_DECODE_PREFILL=eager
   bash results/h200/session42/device.sh 4
   bash results/h200/session42/device.sh 3 ;;
2) source benchmarks/device_lib.sh  # issue 51: the prefill compiled (llm_steps.make_prefill) against eager, 8B fp8
   step "decode loop bs512 kv fp8, prefill eager, row kernel, compiled" 300 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 512 --precision fp8 --harness deepgap --kv-cache fp8 --prefill eager,eager-row-kernel,compiled \
       --out "$OUT" > "$OUT/prefill-loop-2.txt" 2>&1
   grep '^{' "$OUT/prefill-loop-2.txt" | python3 -c "import json,sys; [print(r['prefill'], r['batch'], r['ttft_ms'], \
r['tpot_ms'], r['decode_tok_s'], r['output_tok_s']) for r in map(json.loads, sys.stdin)]"
   tail -n 3 "$OUT/prefill-loop-2.txt"
   step "deepgap run 8b fp8 bs${RUN_BATCHES:-512} kv fp8, prefill compiled" "${RUN_LIMIT:-280}" python -m deepgap run --workload decode \
       --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 \
       --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes "${RUN_BATCHES:-512}" --kv-caches fp8 \
       --store "$S/prefill-512.sqlite" > "$OUT/prefill-run-2.txt" 2>&1
   python -m deepgap export "$S/prefill-512.sqlite" --format csv -o "$OUT/prefill-run-2.csv" >/dev/null 2>&1
   decode_rows "$OUT/prefill-run-2.csv"; tail -n 4 "$OUT/prefill-run-2.txt" ;;
3) source benchmarks/device_lib.sh  # issue 51: served 8B fp8, 512 slots, fp8 cache: admissions eager, then compiled
   step "packed compiled GPU test" 200 python -m pytest -q -m gpu tests/serving/test_llm_packed_compile.py -rA \
       -p no:cacheprovider > "$OUT/packed-gputest-3.txt" 2>&1
   tail -n 3 "$OUT/packed-gputest-3.txt"
   for how in auto compiled; do
       T="$S/serve8b-prefill-$how.sqlite"
       step "serve 8b fp8 512 slots kv fp8, DEEPGAP_DECODE_PREFILL=$how" 300 env DEEPGAP_DECODE_PREFILL=$how \
           python -m deepgap serve --model llama-3.1-8b --engine quant --precision fp8 --device cuda \
           --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 --find-capacity \
           --verify-policies 1 --curve-iterations 20 --no-thermal-warmup --kv-cache fp8 --store "$T" \
           > "$OUT/serve8b-prefill-$how-3.txt" 2>&1
       python -m deepgap export "$T" -o "$OUT/serve8b-prefill-$how-3.csv" > /dev/null 2>&1 || true
       grep -i "capacity" "$OUT/serve8b-prefill-$how-3.txt" | tail -n 3
   done ;;
*) echo "usage: $0 1|2|3"; exit 2 ;;
esac
