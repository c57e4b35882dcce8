#!/usr/bin/env bash
# Session 39 (2026-12-05), issue 51, asked as nvidia-h200: the RMSNorm handed from the GEMV that writes a row to the
# one that reads it (`norm_handoff`, DEEPGAP_DECODE_NORM=handoff) against the norm folded into its reader (fold).
# From the repository root on the device, $OUT set, `.whl/` carried:   bash results/h200/session39/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
loop() {  # loop NAME LIMIT EXTRA...: the bare loop replaying deepgap's own step (8B fp8, batch 1, PDL on, split KV auto)
    local name=$1 limit=$2; shift 2
    step "decode loop $name" "$limit" python benchmarks/llm_decode_loop.py --model llama-3.1-8b --precision fp8 \
        --batches 1 --pdl on --split-kv auto --harness deepgap "$@" --out "$OUT" > "$OUT/loop-$name.txt" 2>&1
    grep -v '^{' "$OUT/loop-$name.txt" | grep -v "^ *$" | tail -n 30
    grep '^{' "$OUT/loop-$name.txt" | python3 -c "import json,sys; [print(r['norm'], r['attention'], r['combine'], r['tpot_ms'], r['decode_tok_s'], \
r.get('timeline_step_us'), r.get('tiles', '')[:700]) for r in map(json.loads, sys.stdin)]"
}
case ${1:-} in
# 1 — the hand-off's GPU tests and the fused layer's (compiled graph against the plain layers; PDL bit for bit);
#     the bare loop with the norm folded, then handed over, each with `--timeline` (each kernel's share of the
#     critical path); every fold's cost per tile (`fused_variants.py`, now with the handed readers and the writers)
1) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gpu tests" 120 python -m pytest -q -m gpu tests/measure/quant/test_norm_handoff.py \
       tests/measure/test_llm_fused.py tests/measure/test_llm_fused_rope.py -rA -p no:cacheprovider \
       > "$OUT/gputests-1.txt" 2>&1
   tail -n 12 "$OUT/gputests-1.txt"
   loop norms-1 220 --norm fold,handoff --timeline
   step "fused variants" 120 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-1.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-1.txt" ;;
# 2 — `deepgap run` (8B fp8, batch 1, 128/128, the default: the norm handed over) against the bare loop (2%)
2) S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "deepgap run 8b fp8 bs1" 130 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store "$S/run.sqlite" > "$OUT/run-2.txt" 2>&1
   python -m deepgap export "$S/run.sqlite" --format csv -o "$OUT/run-2.csv" >/dev/null 2>&1
   python3 -c "import csv,sys; [print(r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], \
r['decode_pdl'], r['decode_attention']) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/run-2.csv" ;;
# 3 — the GPU tests of the kernels whose code this session changed beside (the attention in the qkv GEMV, split or not,
#     and the one-kernel step: `finish` now takes the norm's root)
3) step "other gpu tests" 170 python -m pytest -q -m gpu tests/measure/test_llm_qkv_attention.py \
       tests/measure/test_llm_qkv_split.py tests/measure/test_llm_whole.py -rA -p no:cacheprovider \
       > "$OUT/gputests-3.txt" 2>&1
   tail -n 16 "$OUT/gputests-3.txt" ;;
# 4 — with the norm handed over: the attention kernel against the attention in the qkv GEMV's programs (qkv-split,
#     whose qkv folds its norm: down hands over to nobody, o still to gate_up); int8 with the norm folded and handed
4) loop split-4 150 --norm handoff --attention triton,qkv-split
   step "decode loop int8" 150 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --precision int8 \
       --batches 1 --pdl on --split-kv auto --harness deepgap --norm fold,handoff --out "$OUT" > "$OUT/loop-int8-4.txt" 2>&1
   grep '^{' "$OUT/loop-int8-4.txt" | python3 -c "import json,sys; [print(r['precision'], r['norm'], r['tpot_ms'], \
r['decode_tok_s']) for r in map(json.loads, sys.stdin)]" ;;
# 5 — the handed norm's sums read early too (`GemvTile.early`, the tuner times both) and the last-block merge of the
#     split attention in one round of loads (`llm_merge.merge_group`): their GPU tests, every fold per tile, the bare
#     loop with the combine kernel and the last-block merge, then `deepgap run` (step 2)
5) step "gpu tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_norm_handoff.py \
       tests/measure/test_llm_attention.py tests/measure/test_llm_fused.py -k "gpu or pdl or graph" -rA \
       -p no:cacheprovider > "$OUT/gputests-5.txt" 2>&1
   tail -n 14 "$OUT/gputests-5.txt"
   step "fused variants" 120 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-5.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-5.txt"
   loop combine-5 150 --norm handoff --combine kernel,last-block
   bash "$0" 2 ;;
# 6 — step 5's timings again, for whichever card comes: every fold per tile (the handed sums early and late), the loop
6) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "fused variants" 120 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-6.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-6.txt"
   loop handoff-6 120 --norm handoff ;;
*) echo "usage: $0 1|2|3|4|5|6"; exit 2 ;;
esac
