#!/usr/bin/env bash
# Session 42 (2026-12-05): prepared for the next GPU session, NOT run (no device machine was lent this session).
# From the repository root with $OUT set and `.whl/` carried (benchmarks/device_lib.sh), on an H200.
# Usage: bash results/h200/session42/device.sh N   (the README says each step's purpose and its time)
set -uo pipefail
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
decode_rows() {  # decode_rows CSV: each row's cache, batch, decode and pipelined tokens/s, TPOT tail, KV bytes, relL2
    python3 -c "import csv,sys; [print(r.get('kv_cache') or 'auto', r['batch_size'], r['decode_tokens_per_s'], \
r['pipelined_decode_tokens_per_s'], r['tpot_tail_label'], r['tpot_tail_ms'], r.get('kv_cache_bytes', ''), \
r.get('logits_rel_l2_vs_fp32', ''), r['status']) for r in csv.DictReader(open(sys.argv[1]))]" "$1"
}
case ${1:-} in
1) source benchmarks/device_lib.sh            # issue 51: the fp8 KV cache's GPU tests, then 8B at batch 512 both ways
   step "fp8 KV GPU tests" 200 python -m pytest -q -m gpu tests/measure/models/test_llm_kv_fp8.py \
       tests/measure/test_llm_attention.py tests/measure/test_llm_fused_rope.py -rA -p no:cacheprovider \
       > "$OUT/kv-gputests-1.txt" 2>&1
   tail -n 6 "$OUT/kv-gputests-1.txt"
   step "deepgap run 8b fp8 bs512, kv auto,fp8" 400 python -m deepgap run --workload decode --models llama-3.1-8b \
       --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 512 --kv-caches auto,fp8 --store "$S/kv-512.sqlite" \
       > "$OUT/kv-run-1.txt" 2>&1
   python -m deepgap export "$S/kv-512.sqlite" --format csv -o "$OUT/kv-run-1.csv" >/dev/null 2>&1
   decode_rows "$OUT/kv-run-1.csv" ;;
2) source benchmarks/device_lib.sh            # issue 51: the independent loop at batch 512, each cache (deepgap's step);
   # fp8 codes also with 32-position attention steps (96 registers against 64's 168 at sm_90)
   for run in "auto 64" "fp8 64" "fp8 32"; do set -- $run
       step "decode loop bs512 kv $1 block $2" 200 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
           --batches 512 --precision fp8 --harness deepgap --kv-cache $1 --attention-block $2 --out "$OUT" \
           > "$OUT/kv-loop-$1-$2-2.txt" 2>&1
       grep '^{' "$OUT/kv-loop-$1-$2-2.txt" | python3 -c "import json,sys; [print(r['kv_cache'], \
r['attention_block'], r['batch'], r['tpot_ms'], r['decode_tok_s'], r['output_tok_s']) for r in map(json.loads, sys.stdin)]"
   done ;;
3) bash results/h200/session41/device.sh 8 ;;  # issue 47: the shortcut convolutions on a second stream (not yet run)
4) bash results/h200/session41/device.sh 7 ;;  # issue 51: the H200's batch-1 decode row with the in-thread tiles
5) source benchmarks/device_lib.sh            # issue 47: the int8-resident line and LoadGen 3/3 on today's engine
   step "resnet50 fp8 bs1024, default and int8-resident" 300 python -m deepgap run --models resnet50 --engines quant \
       --precisions fp8 --batch-sizes 1024 --inputs default,int8-resident --sweeps 1 --no-cpu-baseline \
       --no-thermal-warmup --store "$S/inputs.sqlite" > "$OUT/inputs-5.txt" 2>&1
   grep "img/s" "$OUT/inputs-5.txt" | tail -n 2
   python -m deepgap export "$S/inputs.sqlite" -o "$OUT/inputs-5.csv" > /dev/null 2>&1 || true
   LIMIT=${LIMIT:-200} bash benchmarks/loadgen_confirm.sh fp8-1 fp8-2 fp8-3 summary ;;
6) source benchmarks/device_lib.sh            # issue 51: served at MLPerf's limits, 512 slots, each cache (session 21's load)
   for kv in auto fp8; do
       T="$S/serve8b-$kv.sqlite"
       step "serve 8b fp8 512 slots kv $kv" "${SERVE_LIMIT:-300}" python -m deepgap serve --model llama-3.1-8b --engine quant \
           --precision fp8 --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 \
           --find-capacity --verify-policies 1 --curve-iterations 20 --no-thermal-warmup --kv-cache $kv --store "$T" \
           > "$OUT/serve8b-$kv-6.txt" 2>&1
       python -m deepgap export "$T" -o "$OUT/serve8b-$kv-6.csv" > /dev/null 2>&1 || true
       grep -i "capacity" "$OUT/serve8b-$kv-6.txt" | tail -n 3
   done ;;
*) echo "usage: $0 1|2|3|4|5|6"; exit 2 ;;
esac
