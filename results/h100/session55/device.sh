#!/usr/bin/env bash
# Session 55 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Each call carried .carry (the compile caches) and asked for nvidia-h200; every one got an H100 (the README says
# each call's result). Calls 1-4 ran from results/h200/session55/ (moved here after the session); call 5 (conv_tma
# off, the kept scratch) found no machine; call 6 holds it for the next session.
# Usage: bash results/h100/session55/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
S=/tmp/dg; mkdir -p $S
R8=(python -m deepgap run --workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128
    --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8)  # deepgap run, 8B
L1=(python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --precision fp8
    --out "$OUT" --harness deepgap)  # the bare loop at batch 1 on deepgap's step (8B fp8, PDL)
exp() { python -m deepgap export "$S/$1.sqlite" -o "$OUT/$1.csv" > /dev/null 2>&1 || true; }
summary() { grep -h '^{' "$@" | python3 -c "import json,sys; [print(r['split_kv'], r['combine'], r['attention_block'], \
r.get('forced_tiles'), r['tpot_ms'], r['decode_tok_s'], r['tpot_sync_ms']) for r in map(json.loads, sys.stdin)]"; }
Q=4096x6144=4x2048w4t  # qkv's tile in gate_up's in-thread form (H100: -0.86% in sessions 48 and 54)
case ${1:-} in
1) # issue 51, batch 1 (about 8 min): the attention as one pass bound by the cache (split KV wide) against the split
   # and its combine kernel; the last program's merge; qkv's in-thread tile; each kernel's PDL trigger after its
   # wait; then deepgap run at batch 1
   step "gpu tests: the attention (auto, wide)" 120 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/test_llm_attention.py 2>&1 | tail -n 3
   step "loop: split auto, wide" 120 "${L1[@]}" --split-kv auto,wide,auto,wide > "$OUT/wide-1.txt" 2>&1
   summary "$OUT/wide-1.txt"
   step "loop: wide in blocks of 256, auto" 100 "${L1[@]}" --split-kv wide,auto --attention-block 256 \
       > "$OUT/wide256-1.txt" 2>&1
   summary "$OUT/wide256-1.txt"
   step "loop: combine kernel, last block" 100 "${L1[@]}" --split-kv auto --combine last-block,kernel \
       > "$OUT/combine-1.txt" 2>&1
   summary "$OUT/combine-1.txt"
   step "loop: qkv in-thread" 100 "${L1[@]}" --split-kv auto --tiles "tuned;$Q;tuned;$Q" > "$OUT/qkv-1.txt" 2>&1
   summary "$OUT/qkv-1.txt"
   for t in late early; do  # each kernel's trigger after its wait (DEEPGAP_PDL_TRIGGER, quant.gdc), then before
       step "loop: trigger $t" 60 env DEEPGAP_PDL_TRIGGER=$t "${L1[@]}" --split-kv auto > "$OUT/trigger-$t-1.txt" 2>&1
       summary "$OUT/trigger-$t-1.txt"
   done
   step "deepgap run 8b fp8 bs1" 120 "${R8[@]}" --batch-sizes 1 --store $S/run-bs1.sqlite > "$OUT/run-bs1.txt" 2>&1
   exp run-bs1; grep -i "tok/s\|tokens/s" "$OUT/run-bs1.txt" | tail -n 3 ;;
2) # (any card; 3-6 min): the trigger's GPU tests; ResNet-50 at batch 1 with PDL timed against the plain graph, the
   # trigger after each kernel's wait and before it (session 53's H200: 0.291 ms with PDL, the early trigger,
   # against 0.253 without)
   step "gpu tests: ahead, trigger; the quant PDL graph (late)" 200 env DEEPGAP_PDL_TRIGGER=late python -m pytest -q \
       -p no:cacheprovider -m gpu tests/measure/quant/test_gemv_in_thread.py tests/measure/quant/test_quant_gpu.py \
       tests/measure/test_llm_fused.py -k "ahead or in_thread or pdl" 2>&1 | tail -n 3
   for t in late early; do
       step "resnet50 bs1, PDL timed, trigger $t" 150 env DEEPGAP_PDL_TRIGGER=$t python benchmarks/quant_inputs.py \
           --models resnet50 --precisions fp8,int8 --batch-sizes 1 --inputs default \
           --out "$OUT/resnet-bs1-$t.jsonl" > "$OUT/resnet-bs1-$t.txt" 2>&1
       grep -A3 "^model" "$OUT/resnet-bs1-$t.txt"
   done ;;
3) # (5-7 min) issue 47 at batch 1 with the new defaults (PDL timed against the plain graph, QuantOptions.pdl auto; each
   # kernel's trigger after its wait): deepgap run fp8 and int8, the bare loop; batch 1024 (img/s, mJ/img); then
   # issue 51's deepgap run at batch 1 with the late trigger
   R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline --no-thermal-warmup)
   step "resnet50 quant fp8,int8 bs1" 150 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1 --store $S/r1.sqlite \
       > "$OUT/resnet-bs1.txt" 2>&1; exp r1
   grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 4
   step "bare loop bs1" 120 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 --batch-sizes 1 \
       --inputs default --out "$OUT/resnet-bs1-loop.jsonl" > "$OUT/resnet-bs1-loop.txt" 2>&1
   grep -A3 "^model" "$OUT/resnet-bs1-loop.txt"
   step "resnet50 quant fp8 bs1024" 200 "${R50[@]}" --precisions fp8 --batch-sizes 1024 --store $S/r1024.sqlite \
       > "$OUT/resnet-bs1024.txt" 2>&1; exp r1024
   grep -i "img/s" "$OUT/resnet-bs1024.txt" | tail -n 3
   step "deepgap run 8b fp8 bs1" 120 "${R8[@]}" --batch-sizes 1 --store $S/run-bs1.sqlite > "$OUT/run-bs1.txt" 2>&1
   exp run-bs1; grep -i "tok/s\|tokens/s" "$OUT/run-bs1.txt" | tail -n 1 ;;
4) # (4-6 min) why batch 1024's PDL graph gave other logits than the plain one (call 3): the plain graph replayed
   # against itself, a PDL capture per trigger, and the steps run eagerly to the first differing tensor; on an H200
   # also ResNet-50 at batch 1 with the new defaults, deepgap run and the bare loop
   step "pdl bits: resnet50 fp8 bs1024" 200 python benchmarks/pdl_bits.py --batch 1024 > "$OUT/pdl-bits-1024.txt" 2>&1
   grep '^{' "$OUT/pdl-bits-1024.txt"; grep -v '^{' "$OUT/pdl-bits-1024.txt" | tail -n 5
   if [[ $gpu == *H200* ]]; then
       R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline --no-thermal-warmup)
       step "resnet50 quant fp8,int8 bs1" 150 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1 --store $S/r1.sqlite \
           > "$OUT/resnet-bs1.txt" 2>&1; exp r1
       grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 4
       step "bare loop bs1" 120 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
           --batch-sizes 1 --inputs default --out "$OUT/resnet-bs1-loop.jsonl" > "$OUT/resnet-bs1-loop.txt" 2>&1
       grep -A3 "^model" "$OUT/resnet-bs1-loop.txt"
   else
       step "pdl bits: resnet50 fp8 bs256" 150 python benchmarks/pdl_bits.py --batch 256 > "$OUT/pdl-bits-256.txt" 2>&1
       grep '^{' "$OUT/pdl-bits-256.txt"
   fi ;;
6) # (prepared; 5-6 min, any card) which kernel makes batch 256's graph change between replays: the eager steps'
   # first differing tensor and the graph's replays with the TMA 3×3 convolution off (the default since session 55),
   # on, on with the TMA descriptors' scratch never reused, and with the pair kernels or the persistent 1×1 GEMM off
   for sw in DEEPGAP_QUANT_CONV_TMA=off DEEPGAP_QUANT_CONV_TMA=on DEEPGAP_QUANT_PAIRS=off DEEPGAP_QUANT_GEMM=off; do
       step "pdl bits bs256, $sw" 100 env $sw python benchmarks/pdl_bits.py --batch 256 --triggers '' \
           > "$OUT/bits-256-${sw#DEEPGAP_QUANT_}.txt" 2>&1
       grep '^{' "$OUT/bits-256-${sw#DEEPGAP_QUANT_}.txt"
   done
   step "pdl bits bs256, conv_tma on, --keep-scratch" 100 env DEEPGAP_QUANT_CONV_TMA=on python benchmarks/pdl_bits.py \
       --batch 256 --triggers '' --keep-scratch > "$OUT/bits-256-keep.txt" 2>&1
   grep '^{' "$OUT/bits-256-keep.txt"
   step "gpu test: the graph repeats at 256" 150 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/quant/test_quant_gpu.py -k repeats 2>&1 | tail -n 3 ;;
7) # (prepared; 6-8 min, an H200) issue 47's goals with session 55's defaults (PDL timed, each kernel's trigger after
   # its wait, the TMA 3×3 convolution off, the repeat check): deepgap run at batch 1 and 1024, fp8 and int8, and the
   # bare loop at both
   R50=(python -m deepgap run --models resnet50 --engines quant --sweeps 1 --no-cpu-baseline --no-thermal-warmup)
   step "resnet50 quant fp8,int8 bs1" 150 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1 --store $S/r1.sqlite \
       > "$OUT/resnet-bs1.txt" 2>&1; exp r1
   grep -i "img/s" "$OUT/resnet-bs1.txt" | tail -n 4
   step "resnet50 quant fp8,int8 bs1024" 300 "${R50[@]}" --precisions fp8,int8 --batch-sizes 1024 \
       --store $S/r1024.sqlite > "$OUT/resnet-bs1024.txt" 2>&1; exp r1024
   grep -i "img/s\|error" "$OUT/resnet-bs1024.txt" | tail -n 4
   step "bare loop bs1, bs1024" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
       --batch-sizes 1,1024 --inputs default --out "$OUT/resnet-loop.jsonl" > "$OUT/resnet-loop.txt" 2>&1
   grep -A3 "^model" "$OUT/resnet-loop.txt" ;;
*) echo "usage: $0 1|2|3|4|6|7"; exit 2 ;;
esac
