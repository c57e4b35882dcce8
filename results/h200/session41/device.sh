#!/usr/bin/env bash
# Session 41 (2026-12-05), issue 47 (ResNet-50 at batch 1; calls 1-4) and issue 51 (call 5; session 40's
# `device.sh 8` before it): the device calls as run, from the repository root with
# $OUT set and `.whl/` carried (benchmarks/device_lib.sh). Each call ran on the card its README row names.
# Usage: bash results/h200/session41/device.sh N
set -uo pipefail
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
# bs1 NAME ENV...: `deepgap run` ResNet-50 quant fp8 and int8 at batch 1 (one sweep, no warm-up, no CPU baseline)
# with the environment ENV; its CSV export and the split-K/deep tiles the engine kept into $OUT/bs1-NAME.*
bs1() {  # bs1 NAME ENV...  (KEPT=what engine_kept.py reports; split unless set)
    local name=$1; shift
    step "resnet50 quant bs1, $*" 200 env "$@" python -m deepgap run --models resnet50 --engines quant \
        --precisions fp8,int8 --batch-sizes 1 --sweeps 1 --no-cpu-baseline --no-thermal-warmup \
        --store "$S/bs1-$name.sqlite" > "$OUT/bs1-$name.txt" 2>&1
    grep "img/s" "$OUT/bs1-$name.txt" | tail -n 2
    python -m deepgap export "$S/bs1-$name.sqlite" -o "$OUT/bs1-$name.csv" > /dev/null 2>&1 || true
    python benchmarks/engine_kept.py "$S/bs1-$name.sqlite" "${KEPT:-split}" 2>&1 | tee "$OUT/bs1-$name-kept.txt"
}
case ${1:-} in
1) bash results/h200/session34/device.sh 3 ;;  # the later whole-network kernel: phases, GPU tests, the switch's A/B
2) source benchmarks/device_lib.sh            # ran at e808c44 (deep tiles, L2 prefetch), removed in d591f3b: lost
   step "small-batch GPU tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_quant_small_batch_gpu.py \
       -x -rA -p no:cacheprovider > "$OUT/small-batch-gputests.txt" 2>&1
   tail -n 3 "$OUT/small-batch-gputests.txt"
   step "whole phases" 200 python benchmarks/whole_phases.py --models resnet50 --precisions fp8 \
       --out "$OUT/whole-phases.jsonl" > "$OUT/whole-phases.txt" 2>&1
   grep -v '^{' "$OUT/whole-phases.txt" | tail -n 24
   bs1 split DEEPGAP_QUANT_SMALL_BATCH=split   # the engine as it was: split-K tiles, 4 stages
   bs1 deep DEEPGAP_QUANT_SMALL_BATCH=on       # with the deep-pipeline tiles (the default now)
   bs1 deep-l2 DEEPGAP_QUANT_SMALL_BATCH=on DEEPGAP_QUANT_PREFETCH=l2
   step "bare loop bs1" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
       --batch-sizes 1 --inputs default --out "$OUT/loop.jsonl" > "$OUT/loop.txt" 2>&1
   grep -v '^{' "$OUT/loop.txt" | tail -n 6 ;;
3) source benchmarks/device_lib.sh            # spread split-K tiles (split_k.spread_sum) against split ones
   step "small-batch GPU tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_quant_small_batch_gpu.py \
       -x -rA -p no:cacheprovider > "$OUT/small-batch-gputests.txt" 2>&1
   tail -n 3 "$OUT/small-batch-gputests.txt"
   step "split tiles" 240 python benchmarks/split_tiles.py --models resnet50 --precisions fp8,int8 \
       --out "$OUT/split-tiles.jsonl" > "$OUT/split-tiles.txt" 2>&1
   grep -v '^{' "$OUT/split-tiles.txt" | tail -n 50
   bs1 split DEEPGAP_QUANT_SMALL_BATCH=split   # the engine before: split-K tiles, no spread ones
   bs1 spread DEEPGAP_QUANT_SMALL_BATCH=on     # spread ones offered too (the default)
   step "bare loop bs1" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
       --batch-sizes 1 --inputs default --out "$OUT/loop.jsonl" > "$OUT/loop.txt" 2>&1
   grep -v '^{' "$OUT/loop.txt" | tail -n 6 ;;
4) source benchmarks/device_lib.sh            # the bare loop both ways, interleaved: the network's own A/B
   for k in 1 2; do for mode in split on; do
       step "bare loop bs1, DEEPGAP_QUANT_SMALL_BATCH=$mode ($k)" 100 env DEEPGAP_QUANT_SMALL_BATCH=$mode \
           python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 --batch-sizes 1 \
           --inputs default --out "$OUT/loop-ab.jsonl" > "$OUT/loop-$mode-$k.txt" 2>&1
       grep -v '^{' "$OUT/loop-$mode-$k.txt" | tail -n 2
   done; done ;;
5) source benchmarks/device_lib.sh            # issue 51: the in-thread GEMV tiles among the tuner's candidates
   step "in-thread GPU tests" 180 python -m pytest -q -m gpu tests/measure/quant/test_gemv_in_thread.py \
       tests/measure/test_llm_fused.py -rA -p no:cacheprovider > "$OUT/llm-gputests-5.txt" 2>&1
   tail -n 8 "$OUT/llm-gputests-5.txt"
   for q in fp8 int8; do
       step "decode loop $q" 120 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on \
           --split-kv auto --harness deepgap --precision $q --out "$OUT" > "$OUT/llm-loop-$q-5.txt" 2>&1
       grep '^{' "$OUT/llm-loop-$q-5.txt" | python3 -c "import json,sys; [print(r['precision'], r['tpot_ms'], \
r['decode_tok_s'], r.get('tiles', '')[:600]) for r in map(json.loads, sys.stdin)]"
   done
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store "$S/llm-run.sqlite" > "$OUT/llm-run-5.txt" 2>&1
   python -m deepgap export "$S/llm-run.sqlite" --format csv -o "$OUT/llm-run-5.csv" >/dev/null 2>&1
   python3 -c "import csv,sys; [print(r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], r['tpot_tail_label'], \
r['tpot_tail_ms'], r['decode_tiles'][:400]) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/llm-run-5.csv" ;;
6) source benchmarks/device_lib.sh            # call 5's GPU test again (it had asked a hand-off writer for 4-row bands)
   step "in-thread GPU test" 120 python -m pytest -q -m gpu tests/measure/quant/test_gemv_in_thread.py -rA \
       -p no:cacheprovider > "$OUT/llm-gputests-6.txt" 2>&1
   tail -n 4 "$OUT/llm-gputests-6.txt"
   step "decode loop fp8" 120 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on \
       --split-kv auto --harness deepgap --precision fp8 --out "$OUT" > "$OUT/llm-loop-fp8-6.txt" 2>&1
   grep '^{' "$OUT/llm-loop-fp8-6.txt" | python3 -c "import json,sys; [print(r['precision'], r['tpot_ms'], \
r['decode_tok_s'], r.get('tiles', '')[:600]) for r in map(json.loads, sys.stdin)]" ;;
7) source benchmarks/device_lib.sh            # issue 51 on the H200: the decode row and the bare loop, in-thread tuned
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store "$S/llm-run.sqlite" > "$OUT/llm-run-7.txt" 2>&1
   python -m deepgap export "$S/llm-run.sqlite" --format csv -o "$OUT/llm-run-7.csv" >/dev/null 2>&1
   grep -A1 "decode tokens/s" "$OUT/llm-run-7.txt" | head -n 2
   step "decode loop fp8" 120 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on \
       --split-kv auto --harness deepgap --precision fp8 --out "$OUT" > "$OUT/llm-loop-fp8-7.txt" 2>&1
   grep '^{' "$OUT/llm-loop-fp8-7.txt" | python3 -c "import json,sys; [print(r['precision'], r['tpot_ms'], \
r['decode_tok_s'], r.get('tiles', '')[:600]) for r in map(json.loads, sys.stdin)]" ;;
8) source benchmarks/device_lib.sh            # not run yet (no device time left): the shortcut convs on a second stream
   step "branch GPU tests" 200 python -m pytest -q -m gpu tests/measure/quant/test_quant_branch_gpu.py -x -rA \
       -p no:cacheprovider > "$OUT/branch-gputests-8.txt" 2>&1
   tail -n 4 "$OUT/branch-gputests-8.txt"
   KEPT=branch bs1 branch-off DEEPGAP_QUANT_BRANCH=off
   KEPT=branch bs1 branch-auto DEEPGAP_QUANT_BRANCH=auto
   step "bare loop bs1, branch auto" 100 env DEEPGAP_QUANT_BRANCH=auto python benchmarks/quant_inputs.py \
       --models resnet50 --precisions fp8,int8 --batch-sizes 1 --inputs default --out "$OUT/loop-branch-8.jsonl" \
       > "$OUT/loop-branch-8.txt" 2>&1
   grep -v '^{' "$OUT/loop-branch-8.txt" | tail -n 3 ;;
*) echo "usage: $0 1|2|3|4|5|6|7|8"; exit 2 ;;
esac
