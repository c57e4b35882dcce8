#!/usr/bin/env bash
# Session 45 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). Usage: bash results/h200/session45/device.sh N (the README says each; 4 to 9 are
# prepared for the next session).
set -uo pipefail
case ${1:-} in
1) # issue 51: the compiled prefill at batch 512 (the loop: eager, row kernel, compiled), then `deepgap run`
   # at batches 512 and 1024 with the compiled prefill (offline output tokens/s at the best batch)
   RUN_BATCHES=512,1024 RUN_LIMIT=360 bash results/h200/session44/device.sh 2 ;;
2) bash results/h200/session44/device.sh 3 ;;  # served 8B: admissions eager, then compiled
3) bash results/h200/session44/device.sh 1 ;;  # batch-1 decode row, shortcut branch A/B (prefill eager)
4) source benchmarks/device_lib.sh  # prepared, not yet run: issue 51's GEMV tiles timed cached vs streamed
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "streamed tuning GPU test" 120 python -m pytest -q -m gpu tests/measure/quant/test_quant_streamed.py -rA \
       -p no:cacheprovider > "$OUT/tune-gputest.txt" 2>&1
   tail -n 3 "$OUT/tune-gputest.txt"
   for mode in cached streamed; do  # each process times its own tiles: three loops a mode, then the harness
       for i in 1 2 3; do
           step "decode loop bs1, DEEPGAP_GEMV_TUNE=$mode, process $i" 90 env DEEPGAP_GEMV_TUNE=$mode \
               python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto \
               --harness deepgap --precision fp8 --out "$OUT" > "$OUT/tune-$mode-$i.txt" 2>&1
           grep '^{' "$OUT/tune-$mode-$i.txt" | python3 -c "import json,sys; [print('$mode', r['tpot_ms'], \
r['decode_tok_s'], r.get('decode_tok_s_sync'), r.get('tiles', '')[:400]) for r in map(json.loads, sys.stdin)]"
       done
       step "deepgap run 8b fp8 bs1, DEEPGAP_GEMV_TUNE=$mode" 150 env DEEPGAP_GEMV_TUNE=$mode python -m deepgap run \
           --workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 \
           --sweeps 1 --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 \
           --store "$S/tune-$mode.sqlite" > "$OUT/tune-run-$mode.txt" 2>&1
       python -m deepgap export "$S/tune-$mode.sqlite" --format csv -o "$OUT/tune-run-$mode.csv" >/dev/null 2>&1
       grep -A1 "decode tokens/s" "$OUT/tune-run-$mode.txt" | head -n 2
   done ;;
5) source benchmarks/device_lib.sh  # prepared, not yet run: issue 51's offline output tokens/s past batch 1024
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "decode loop bs1024 kv fp8, prefill compiled" 240 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 1024 --precision fp8 --harness deepgap --kv-cache fp8 --prefill compiled \
       --out "$OUT" > "$OUT/loop-1024.txt" 2>&1  # the best batch's figure (26,706) reproduced by the bare loop
   grep '^{' "$OUT/loop-1024.txt" | python3 -c "import json,sys; [print(r['prefill'], r['batch'], r['ttft_ms'], \
r['tpot_ms'], r['decode_tok_s'], r['output_tok_s']) for r in map(json.loads, sys.stdin)]"
   step "deepgap run 8b fp8 bs1536,2048 kv fp8" 420 python -m deepgap run --workload decode --models llama-3.1-8b \
       --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1536,2048 --kv-caches fp8 --store "$S/big.sqlite" \
       > "$OUT/big-run.txt" 2>&1
   python -m deepgap export "$S/big.sqlite" --format csv -o "$OUT/big-run.csv" >/dev/null 2>&1
   tail -n 4 "$OUT/big-run.txt" ;;
6) source benchmarks/device_lib.sh  # prepared, not yet run: issue 51 served; 512 slots held 443 running on average
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"  # and queued the rest (TTFT-bound, TPOT 27 ms of 100)
   # with the thermal warm-up (the default) this time: call 2's calibration, on a cold GPU, over-predicted the
   # capacity (measured/predicted 0.953, TPOT p50 26.75 ms against the curves' ~25.5): bursts at boost clocks
   # against 20 s probes at the 700 W cap?
   step "serve 8b fp8 slots 512,768,1024 kv fp8, compiled admissions" 560 python -m deepgap serve \
       --model llama-3.1-8b --engine quant --precision fp8 --device cuda --input-len-dist uniform:64:256 \
       --output-len-dist fixed:128 --batch-sizes 512,768,1024 --find-capacity --verify-policies 1 \
       --curve-iterations 20 --thermal-timeout 60 --kv-cache fp8 --store "$S/serve-slots.sqlite" \
       > "$OUT/serve-slots.txt" 2>&1
   python -m deepgap export "$S/serve-slots.sqlite" -o "$OUT/serve-slots.csv" > /dev/null 2>&1 || true
   grep -i "capacity" "$OUT/serve-slots.txt" | tail -n 3 ;;
7) source benchmarks/device_lib.sh  # prepared, not yet run: issue 51, where batch 512's 12.5 ms step goes
   step "decode loop bs512 kv fp8, timeline" 300 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --batches 512 --precision fp8 --harness deepgap --kv-cache fp8 --timeline --out "$OUT" \
       > "$OUT/timeline-512.txt" 2>&1  # 15.5 TFLOP a step at 1024: 648 TFLOPS, a third of fp8's dense peak
   tail -n 40 "$OUT/timeline-512.txt" ;;
8) source benchmarks/device_lib.sh  # prepared, not yet run: issue 51, TensorRT-LLM's second anchor (1000 in / 1000 out)
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"  # its table: 17,744 output tokens/s on one H200
   step "deepgap run 8b fp8 1000/1000 bs256,512 kv fp8" 540 python -m deepgap run --workload decode \
       --models llama-3.1-8b --device cuda --input-lens 1000 --output-lens 1000 --repeats 2 --sweeps 1 \
       --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 256,512 --kv-caches fp8 \
       --store "$S/long.sqlite" > "$OUT/long-run.txt" 2>&1
   python -m deepgap export "$S/long.sqlite" --format csv -o "$OUT/long-run.csv" >/dev/null 2>&1
   tail -n 4 "$OUT/long-run.txt" ;;
9) source benchmarks/device_lib.sh  # prepared, not yet run: issue 47, the engine alone at batch 128 sustained
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"  # serve's "engine alone" is a burst of a few batches;
   # its capacity runs 20 s probes at the power cap (0.943-0.947 of the burst in call 4): the run's pipelined
   # windows (>= 1 s each) give the sustained rate at the same batch to set beside it
   step "resnet50 quant fp8,int8 bs128" 200 python -m deepgap run --models resnet50 --engines quant \
       --precisions fp8,int8 --batch-sizes 128 --sweeps 1 --no-cpu-baseline --no-thermal-warmup \
       --store "$S/bs128.sqlite" > "$OUT/bs128.txt" 2>&1
   python -m deepgap export "$S/bs128.sqlite" -o "$OUT/bs128.csv" > /dev/null 2>&1 || true
   python3 -c "import csv,sys; [print(r['precision'], r['throughput_ips'], r['throughput_pipelined_ips']) \
for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/bs128.csv" ;;
*) echo "usage: $0 1|2|3|4|5|6|7|8|9"; exit 2 ;;
esac
