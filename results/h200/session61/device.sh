#!/usr/bin/env bash
# Session 61 (2026-12-07): this session's calls, from the repository root with $OUT set (benchmarks/device_lib.sh).
# The first were results/h100/session60/device.sh n (which ran its call g on the H200) and q; then the bare-loop tile
# turns t1-t4 below (run inline, as written here); then s or f, with qkv's tile pinned.
# Usage: bash results/h200/session61/device.sh f|r|s [short]|t1|t2|t3|t4   (s short: without int8's turns; on an H200
#   the ResNet-50 fp8 batch-1 bare loop first)
set -uo pipefail
source benchmarks/device_lib.sh
session_opening  # $gpu, $S and exp (benchmarks/device_lib.sh)
loop() {  # loop NAME TILES LIMIT [ENV=VALUE]: the 8B loop at batch 1, deepgap's step, the fused GEMVs' tiles in turns
   mkdir -p "$OUT/$1"
   step "loop 8b $1" $3 env ${4:-DEEPGAP_NOTHING=} python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --batches 1 --pdl on --precision ${PREC:-fp8} --harness deepgap --out "$OUT/$1" --tiles "$2" \
       > "$OUT/loop-$1.txt" 2>&1
   python3 -c "import json,sys
for r in map(json.loads, open(sys.argv[1])):
    print(r.get('forced_tiles'), 'tpot', r.get('tpot_ms'), r.get('decode_tok_s'), 'tok/s; sync', r.get('tpot_sync_ms'))
" "$OUT/$1/llm_decode_loop.jsonl"; }
case ${1:-} in
f) # (any card, ~8 min; the next session's first call) qkv's pinned tile (`gemv_fused.QKV_TILE`, the default since
   # this session): `deepgap run` 8B fp8 at batch 1; the loop with every fused GEMV's tiles timed in the step
   # (DEEPGAP_GEMV_TUNE=step, `quant.step_tiles`) against the pinned default, a process each; int8's loop, the
   # tuner's qkv tile against the pinned one in turns; the GPU tests of the fused qkv, the in-thread tiles, the search
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store $S/run8b.sqlite > "$OUT/run8b-bs1.txt" 2>&1
   exp run8b; grep -i "tok/s\|tokens/s" "$OUT/run8b-bs1.txt" | tail -n 1
   loop pinned "tuned;tuned" 80
   loop step "tuned;tuned" 100 DEEPGAP_GEMV_TUNE=step
   python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline()).get('tiles'))" "$OUT/step/llm_decode_loop.jsonl"
   PREC=int8 loop int8-qkv "tuned;4096x6144=4x1024w4t;tuned;4096x6144=4x1024w4t" 120 DEEPGAP_DECODE_QKV_TILE=tuned
   step "gpu tests" 150 python -m pytest -q -m gpu tests/measure/test_llm_fused_rope.py \
       tests/measure/quant/test_gemv_in_thread.py tests/measure/quant/test_step_tiles.py > "$OUT/gpu-tests.txt" 2>&1
   tail -n 3 "$OUT/gpu-tests.txt" ;;
s) # (any card, ~4 min; what was left of this session's device time) on an H200 call f without its GPU tests; on
   # another card the fp8 and int8 loops, the tuner's qkv tile against the pinned one in turns
   Q="tuned;4096x6144=4x1024w4t;tuned;4096x6144=4x1024w4t"
   case $gpu in
   *H200*) [ "${2:-}" != short ] || { step "resnet50 fp8 bs1 bare loop" 90 python benchmarks/quant_inputs.py \
              --models resnet50 --precisions fp8 --batch-sizes 1 --inputs default --out "$OUT/resnet-bs1-loop.jsonl" \
              > "$OUT/resnet-bs1-loop.txt" 2>&1; tail -n 4 "$OUT/resnet-bs1-loop.txt"; }  # issue 47: run vs loop
           step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b \
              --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup \
              --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 --store $S/run8b.sqlite \
              > "$OUT/run8b-bs1.txt" 2>&1
           exp run8b; grep -i "tok/s\|tokens/s" "$OUT/run8b-bs1.txt" | tail -n 1 ;;
   *) loop fp8-qkv "$Q" 100 DEEPGAP_DECODE_QKV_TILE=tuned ;;
   esac
   [ "${2:-}" = short ] || PREC=int8 loop int8-qkv "$Q" 100 DEEPGAP_DECODE_QKV_TILE=tuned ;;
r) # (an H200, ~2 min; after f on the warm machine) issue 47's batch 1: ResNet-50 quant's bare loop against the
   # 0.192 ms of this session's `deepgap run` (fp8; int8 0.212), the harness to be within 2% of it
   step "resnet50 fp8,int8 bs1 bare loop" 150 python benchmarks/quant_inputs.py --models resnet50 \
       --precisions fp8,int8 --batch-sizes 1 --inputs default --out "$OUT/resnet-bs1-loop.jsonl" \
       > "$OUT/resnet-bs1-loop.txt" 2>&1
   tail -n 6 "$OUT/resnet-bs1-loop.txt" ;;
t1) # (any card, ~2 min; calls 5-6 of this session, run inline as written here) qkv's tile: the tuner's against
   # gate_up's in-thread 4x2048 and o's 8x2048 (8 warps), the tiles timed on one matrix and on weights streamed from HBM
   Q=4096x6144
   for tune in cached streamed; do mkdir -p $OUT/$tune; DEEPGAP_GEMV_TUNE=$tune timeout 200 python \
       benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --precision fp8 --harness deepgap \
       --out $OUT/$tune --tiles "tuned;$Q=4x2048w4t;$Q=8x2048w8t;tuned;$Q=4x2048w4t;$Q=8x2048w8t" \
       > $OUT/loop-$tune.txt 2>&1; echo "== $tune rc=$?"; done ;;
t2|t3|t4) # (any card, ~1 min each; calls 8-10, run inline as written here) t2: qkv at 4x2048 in-thread and one
   # other GEMV's tile; t3: qkv's tiles; t4: qkv's tiles around 4x1024 in-thread and the others' beside it
   Q=4096x6144
   case $1 in
   t2) P=$Q=4x2048w4t; T="$P;$P,4096x4096=16x1024w8t;$P,14336x4096=16x2048w8t;$P,4096x28672=8x2048w8t" ;;
   t3) T="$Q=4x2048w4t;$Q=4x4096w4t;$Q=4x1024w4t;$Q=4x2048w8t;$Q=8x1024w4t" ;;
   t4) P=$Q=4x1024w4t
       T="$P;$Q=4x512w4t;$Q=4x1024w2t;$P,4096x28672=4x1024w4t;$P,14336x4096=16x2048w8t;$P,4096x4096=8x1024w8t" ;;
   esac
   mkdir -p $OUT/t; timeout 300 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on \
       --precision fp8 --harness deepgap --out $OUT/t --tiles "$T;$T" > $OUT/loop-t.txt 2>&1; echo "rc=$?" ;;
*) echo "usage: $0 f|s|t1|t2|t3|t4"; exit 2 ;;
esac
