#!/usr/bin/env bash
# Session 53 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200; four found no machine (361 s), then one NVIDIA H200 came and held for calls 1-9.
# Each call carried .whl and .carry. Calls 1-6 ran at commit e1b05cb; calls 7-9 at e1b05cb with one line of
# ba0b7c0 already in the tree (core/switches.py: DEEPGAP_DECODE_ANGLES defaults to kernel; the bare loop then kept
# its own default, inductor, so call 8 timed the formula). Usage: bash results/h200/session53/device.sh N
# (the README says each call's result).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
S=/tmp/dg
R8=(python -m deepgap run --workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128
    --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8)  # deepgap run, 8B
L1=(python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --precision fp8
    --out "$OUT")  # the bare loop at batch 1 on deepgap's step (8B fp8, PDL, split KV auto)
exp() { python -m deepgap export "$S/$1.sqlite" -o "$OUT/$1.csv" > /dev/null 2>&1 || true; }
case ${1:-} in
1) bash results/h100/session52/device.sh 10 ;;  # angles from one kernel x greedy in the graph: GPU tests, bare loop
2) LIMIT=170 bash results/h100/session46/device.sh 5 ;;  # issue 47: served capacity and LoadGen x3 (carry .whl)
3) source benchmarks/device_lib.sh  # issue 51's best batch by the bare loop; issue 47's per-batch gap (serve_gap)
   step "decode loop bs1024 kv fp8, prefill compiled" 240 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 1024 --precision fp8 --harness deepgap --kv-cache fp8 --prefill compiled \
       --out "$OUT" > "$OUT/loop-1024.txt" 2>&1
   step "serve gap fp8 128" 200 python benchmarks/serve_gap.py --precision fp8 --batch 128 --rounds 3 \
       --out "$OUT/serve_gap.jsonl" > "$OUT/serve_gap.txt" 2>&1 ;;
4) source benchmarks/device_lib.sh; mkdir -p $S  # issue 51, batch 1: deepgap run with the angle kernel, the loop
   step "deepgap run 8b fp8 bs1 angles=kernel" 200 env DEEPGAP_DECODE_ANGLES=kernel "${R8[@]}" --batch-sizes 1 \
       --store $S/run-bs1-kernel.sqlite > "$OUT/run-bs1-kernel.txt" 2>&1; exp run-bs1-kernel
   step "loop bs1 again" 150 "${L1[@]}" --angles kernel,inductor --harness deepgap > "$OUT/loop-angles-2.txt" 2>&1 ;;
5) source benchmarks/device_lib.sh; mkdir -p $S  # issue 51's best batch by deepgap run; issue 47 at batch 1
   step "deepgap run 8b fp8 bs1024 kv fp8" 290 "${R8[@]}" --batch-sizes 1024 --kv-caches fp8 \
       --store $S/run-bs1024.sqlite > "$OUT/run-bs1024.txt" 2>&1; exp run-bs1024
   step "resnet50 quant fp8,int8 bs1" 150 python -m deepgap run --models resnet50 --engines quant \
       --precisions fp8,int8 --batch-sizes 1 --sweeps 1 --no-cpu-baseline --no-thermal-warmup \
       --store "$S/r1.sqlite" > "$OUT/resnet-bs1.txt" 2>&1
   python -m deepgap export "$S/r1.sqlite" -o "$OUT/resnet-bs1.csv" > /dev/null 2>&1 || true ;;
6) source benchmarks/device_lib.sh; mkdir -p $S  # issue 47: batch 1024 (img/s, mJ/img); the bare loop at batch 1
   step "resnet50 quant fp8 bs1024" 200 python -m deepgap run --models resnet50 --engines quant --precisions fp8 \
       --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store "$S/r1024.sqlite" \
       > "$OUT/resnet-bs1024.txt" 2>&1
   python -m deepgap export "$S/r1024.sqlite" -o "$OUT/resnet-bs1024.csv" > /dev/null 2>&1 || true
   step "bare loop bs1" 120 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 --batch-sizes 1 \
       --inputs default --out "$OUT/resnet-bs1-loop.jsonl" > "$OUT/resnet-bs1-loop.txt" 2>&1 ;;
7) source benchmarks/device_lib.sh; mkdir -p $S  # the angle kernel as the default: the LLM GPU tests, deepgap run
   step "gpu tests: llm" 200 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/test_llm_angles.py \
       tests/measure/test_llm_graph_tokens.py tests/measure/test_llm_fused.py tests/measure/models/test_llm_kv_fp8.py \
       2>&1 | tail -n 3
   step "deepgap run 8b fp8 bs1 default" 150 "${R8[@]}" --batch-sizes 1 --store $S/run-bs1-default.sqlite \
       > "$OUT/run-bs1-default.txt" 2>&1; exp run-bs1-default ;;
8|9) source benchmarks/device_lib.sh  # the step's timeline by kernel: 8 with the loop's then default angles
   # (inductor), 9 with the kernel (the loop's default since this session)
   a=$([ "$1" = 8 ] && echo inductor || echo kernel)
   step "timeline $a" 150 "${L1[@]}" --harness deepgap --angles $a --timeline > "$OUT/timeline-bs1-$a.txt" 2>&1
   grep -v '^{' "$OUT/timeline-bs1-$a.txt" | tail -n 22; rm -f "$OUT"/*.json.gz ;;
10) # prepared (carry .carry). On an H200 (about 3 min): qkv's 1.69x over a plain read (calls 8-9). Its tile forced
   # to gate_up's form against the tuner's 8x512 st4, in one process, then the tiles timed on weights streamed
   # from HBM (DEEPGAP_GEMV_TUNE=streamed; the cached tuner times qkv's 25 MB from L2) in a second. Session 48
   # timed this A/B on an H100, so any other card runs session 52's prepared serve instead (about 6 min: does a
   # 200-step calibration close the 8B serve's 1.7% TPOT p99 gap to the simulator?). In session 53 the ask got an
   # H100 and this call then stopped at once, before the other card's branch was added
   case $gpu in *H200*) ;; *) exec bash results/h100/session52/device.sh 9 ;; esac
   source benchmarks/device_lib.sh
   step "qkv forced 4x2048 in-thread" 130 "${L1[@]}" --harness deepgap --tiles "tuned;4096x6144=4x2048w4t" \
       > "$OUT/qkv-tiles.txt" 2>&1
   step "streamed tuning" 100 env DEEPGAP_GEMV_TUNE=streamed "${L1[@]}" --harness deepgap > "$OUT/streamed.txt" 2>&1
   cat "$OUT"/qkv-tiles.txt "$OUT"/streamed.txt | grep '^{' | python3 -c "import json,sys; [print(r.get('forced_tiles'), \
r['tpot_ms'], r['decode_tok_s'], r['tpot_sync_ms'], r.get('tiles', '')[:240]) for r in map(json.loads, sys.stdin)]" ;;
*) echo "usage: $0 1-10"; exit 2 ;;
esac
