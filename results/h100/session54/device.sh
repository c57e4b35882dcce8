#!/usr/bin/env bash
# Session 54 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Each call carried .carry (the compile caches). Call 1 asked for nvidia-h200, got an H100, and ran this script from
# results/h200/session54/ at commit 4deaa00; call 2 was results/h100/session52/device.sh 9 on the same machine.
# Usage: bash results/h100/session54/device.sh N (the README says each call's result).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
S=/tmp/dg
R8=(python -m deepgap run --workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128
    --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8)  # deepgap run, 8B
L1=(python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --precision fp8
    --out "$OUT" --harness deepgap)  # the bare loop at batch 1 on deepgap's step (8B fp8, PDL, split KV auto)
exp() { python -m deepgap export "$S/$1.sqlite" -o "$OUT/$1.csv" > /dev/null 2>&1 || true; }
summary() { grep -h '^{' "$@" | python3 -c "import json,sys; [print(r.get('forced_tiles'), r['tpot_ms'], \
r['decode_tok_s'], r['tpot_sync_ms']) for r in map(json.loads, sys.stdin)]"; }
# the turns of call 1: the tuner's tiles; then one GEMV's weights two K steps ahead of PDL's wait (o, qkv in
# gate_up's in-thread form, down, gate_up), qkv's in-thread form alone (session 53's prepared A/B), and together
O=4096x4096=8x2048w8ta2; Q=4096x6144=4x2048w4t; Q2=4096x6144=4x2048w4ta2; D=14336x4096=8x2048w8ta2
G=4096x28672=4x2048w4ta2
TURNS="tuned;$O;$Q;$Q2;4096x6144=2x2048w4ta2;$D;$G;$O,$Q2,$D;tuned"
ahead() {  # the turns of call 1, then the same in the reverse order in a second process, then two timelines
   step "loop: tiles ahead" 150 "${L1[@]}" --tiles "$TURNS" > "$OUT/ahead-1.txt" 2>&1
   summary "$OUT/ahead-1.txt"
   step "loop: tiles ahead, reversed" 150 "${L1[@]}" --tiles "tuned;$O,$Q2,$D;$G;$D;4096x6144=2x2048w4ta2;$Q2;$Q;$O;tuned" \
       > "$OUT/ahead-2.txt" 2>&1
   summary "$OUT/ahead-2.txt"
   for t in tuned "$O,$Q2,$D"; do
       step "timeline $t" 60 "${L1[@]}" --tiles "$t" --timeline > "$OUT/timeline-${t%%=*}.txt" 2>&1
       grep -v '^{' "$OUT/timeline-${t%%=*}.txt" | tail -n 19
   done; rm -f "$OUT"/*.json.gz
}
case ${1:-} in
1) source benchmarks/device_lib.sh  # issue 51, batch 1: weights loaded ahead of PDL's wait (about 8 min)
   ahead
   step "loop: streamed tuning" 80 env DEEPGAP_GEMV_TUNE=streamed "${L1[@]}" > "$OUT/streamed-1.txt" 2>&1
   summary "$OUT/streamed-1.txt"; grep -h '^{' "$OUT/streamed-1.txt" | python3 -c "import json,sys; \
[print(r.get('tiles', '')) for r in map(json.loads, sys.stdin)]"
   step "gpu tests: ahead" 90 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/quant/test_gemv_in_thread.py \
       2>&1 | tail -n 3 ;;
3) # prepared (any card, an H200 first; about 8 min): qkv's tile in gate_up's in-thread form, o two steps ahead, and
   # each GEMV with no weights before PDL's wait (ahead 0: does the early load slow its predecessor, the attention
   # above all?) and all four so, against the tuner's, in two processes (the turns reversed in the second); the
   # tiles timed on streamed weights in a third; each kernel's PDL trigger after its wait and before it, a process
   # each; then deepgap run at batch 1
   source benchmarks/device_lib.sh; mkdir -p $S
   Z="4096x4096=8x2048w8ta0;14336x4096=8x2048w8ta0;4096x28672=4x2048w4ta0;4096x6144=4x2048w4ta0"
   ALL0=${Z//;/,}
   step "loop: qkv in-thread, none or two ahead" 150 "${L1[@]}" --tiles "tuned;$Q;$O;$Z;$ALL0;tuned" \
       > "$OUT/tiles-3.txt" 2>&1
   summary "$OUT/tiles-3.txt"
   step "loop: the same, reversed" 150 "${L1[@]}" --tiles "tuned;$ALL0;$(echo "$Z" | tr ';' '\n' | tac | paste -sd';');$O;$Q;tuned" \
       > "$OUT/tiles-3r.txt" 2>&1
   summary "$OUT/tiles-3r.txt"
   step "loop: streamed tuning" 80 env DEEPGAP_GEMV_TUNE=streamed "${L1[@]}" > "$OUT/streamed-3.txt" 2>&1
   summary "$OUT/streamed-3.txt"
   for t in late early; do  # each kernel's trigger after its wait (DEEPGAP_PDL_TRIGGER, quant.gdc), then before
       step "loop: trigger $t" 60 env DEEPGAP_PDL_TRIGGER=$t "${L1[@]}" > "$OUT/trigger-$t-3.txt" 2>&1
       summary "$OUT/trigger-$t-3.txt"
   done
   step "deepgap run 8b fp8 bs1" 120 "${R8[@]}" --batch-sizes 1 --store $S/run-bs1.sqlite > "$OUT/run-bs1.txt" 2>&1
   exp run-bs1; grep -i "tok/s\|tokens/s" "$OUT/run-bs1.txt" | tail -n 3 ;;
4) source benchmarks/device_lib.sh  # prepared (any card; 3-6 min): the trigger's GPU tests; ResNet-50 at batch 1
   # with PDL timed against the plain graph, the trigger after each kernel's wait and before it (session 53's H200:
   # 0.291 ms with PDL, the early trigger, against 0.253 without)
   step "gpu tests: ahead, trigger; the quant PDL graph (late)" 200 env DEEPGAP_PDL_TRIGGER=late python -m pytest -q \
       -p no:cacheprovider -m gpu tests/measure/quant/test_gemv_in_thread.py tests/measure/quant/test_quant_gpu.py \
       tests/measure/test_llm_fused.py -k "ahead or in_thread or pdl" 2>&1 | tail -n 3
   for t in late early; do
       step "resnet50 bs1, PDL timed, trigger $t" 150 env DEEPGAP_PDL_TRIGGER=$t python benchmarks/quant_inputs.py \
           --models resnet50 --precisions fp8,int8 --batch-sizes 1 --inputs default \
           --out "$OUT/resnet-bs1-$t.jsonl" > "$OUT/resnet-bs1-$t.txt" 2>&1
       grep -A3 "^model" "$OUT/resnet-bs1-$t.txt"
   done ;;
*) echo "usage: $0 1|3|4"; exit 2 ;;
esac
