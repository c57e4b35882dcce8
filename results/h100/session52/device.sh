#!/usr/bin/env bash
# Session 52 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200. Usage: bash results/h100/session52/device.sh N (the README says each call's commit,
# command and result).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
case ${1:-} in
1) # an H200: issue 47's served capacity and LoadGen x3 (carry .whl); any other card: issue 51's 1B decode with
   # its host-CPU part (session 51's prepared call 8)
   case $gpu in
   *H200*) LIMIT=170 bash results/h100/session46/device.sh 5 ;;
   *) bash results/h100/session51/device.sh 8 ;;
   esac ;;
2) bash results/h100/session51/device.sh 7 ;;  # carrying .carry: the 8B serve with its thermal warm-up
5) # call 3 (machines were scarce, so one call's 600 s): greedy's token taken in the graph step
   # (llm_steps.feed_tail): its GPU tests, the bare loop's A/B (greedy outside the graph, as before, against inside;
   # alternating, one process, so one tiling), deepgap run at batch 1; then the 8B serve's prelude with the
   # warm-up's decoder drawn in parallel and no reference (90421c1): the GPU's idle seconds before the warm-up's
   # load (call 2: about 140 s), a 30 s warm-up, stopped once set-up begins
   source benchmarks/device_lib.sh; S=/tmp/dg; mkdir -p $S
   step "gpu tests: graph tokens, fused, fp8 cache" 120 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/test_llm_graph_tokens.py tests/measure/test_llm_fused.py tests/measure/models/test_llm_kv_fp8.py \
       2>&1 | tail -n 4
   step "decode loop bs1 8b fp8, greedy outside/inside" 170 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --batches 1 --pdl on --split-kv auto --precision fp8 --out "$OUT" \
       --harness deepgap-outside,deepgap,deepgap-outside,deepgap > "$OUT/loop-bs1.txt" 2>&1
   grep '^{' "$OUT/loop-bs1.txt" | python3 -c "import json,sys; [print(r['harness'], r['tpot_ms'], r['decode_tok_s'], \
r['tpot_sync_ms'], r['decode_tok_s_sync']) for r in map(json.loads, sys.stdin)]"
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode --models llama-3.1-8b --device cuda \
       --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup --no-cpu-baseline \
       --engines quant --precisions fp8 --batch-sizes 1 --store $S/bs1.sqlite > "$OUT/run-bs1.txt" 2>&1
   python -m deepgap export $S/bs1.sqlite -o "$OUT/run-bs1.csv" > /dev/null 2>&1 || true
   grep -A1 "decode tokens/s" "$OUT/run-bs1.txt" | head -n 4
   nvidia-smi --query-gpu=utilization.gpu,power.draw,temperature.gpu --format=csv,noheader -l 5 > "$OUT/smi-prelude.txt" &
   step "serve 8b prelude" 140 python -m deepgap serve --model llama-3.1-8b --engine quant --precision fp8 \
       --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 --find-capacity \
       --thermal-timeout 30 --kv-cache fp8 --store $S/p.sqlite 2>&1 | stamp > "$OUT/prelude.txt"
   kill %1; head -n 8 "$OUT/prelude.txt"; grep -c "^100 %" "$OUT/smi-prelude.txt" ;;
6) source benchmarks/device_lib.sh  # call 4 (run as these lines, on call 3's machine): the loop's A/B again, a second
   # process, the other order
   step "loop again" 150 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto \
       --precision fp8 --out "$OUT" --harness deepgap,deepgap-outside,deepgap,deepgap-outside > "$OUT/loop-bs1-b.txt" 2>&1
   grep '^{' "$OUT/loop-bs1-b.txt" | python3 -c "import json,sys; [print(r['harness'], r['tpot_ms'], r['decode_tok_s'], \
r['tpot_sync_ms'], r['decode_tok_s_sync']) for r in map(json.loads, sys.stdin)]" ;;
7) source benchmarks/device_lib.sh  # call 5 (run as these lines, on the same machine): the step's timeline now
   step "timeline" 120 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto \
       --precision fp8 --out "$OUT" --harness deepgap --timeline > "$OUT/timeline-bs1.txt" 2>&1
   grep -v '^{' "$OUT/timeline-bs1.txt" | tail -n 30; rm -f "$OUT"/*.json.gz ;;
9) # prepared (any card, carrying .carry; about 6 min): does a longer calibration close the step's gap under load?
   # Call 2's passing rate ran TPOT p99 1.7% over the simulated after a warm-up; its decode step was calibrated on
   # 20 synchronised steps (--curve-iterations 20, about 0.3 s; serve's default is 100), the serve runs them for 20 s
   # at the 700 W cap. 200 steps here (about 2.6 s)
   source benchmarks/device_lib.sh; S=/tmp/dg; mkdir -p $S
   step "serve 8b fp8 512 slots, 200 calibration steps" 540 python -m deepgap serve --model llama-3.1-8b --engine quant \
       --precision fp8 --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 \
       --find-capacity --verify-policies 1 --curve-iterations 200 --kv-cache fp8 --store $S/c.sqlite 2>&1 \
       | stamp > "$OUT/calib200.txt"
   python -m deepgap export $S/c.sqlite -o "$OUT/serve8b-calib200.csv" > /dev/null 2>&1 || true
   grep "serve: " "$OUT/calib200.txt" | tail -n 16 ;;
10) # prepared (any card; about 4 min): RoPE's angles from one kernel (DEEPGAP_DECODE_ANGLES=kernel, off until
   # timed): its GPU test, then the bare loop with the angles and greedy's token each both ways (one process, so
   # one tiling): on an H200 it gives issue 51's goal figure with both
   source benchmarks/device_lib.sh
   step "gpu tests: angles, graph tokens" 150 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/measure/test_llm_angles.py tests/measure/test_llm_graph_tokens.py 2>&1 | tail -n 4
   step "decode loop bs1 8b fp8, angles x greedy" 240 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --batches 1 --pdl on --split-kv auto --precision fp8 --out "$OUT" --angles inductor,kernel \
       --harness deepgap-outside,deepgap > "$OUT/loop-angles.txt" 2>&1
   grep '^{' "$OUT/loop-angles.txt" | python3 -c "import json,sys; [print(r['angles'], r['harness'], r['tpot_ms'], \
r['decode_tok_s'], r['tpot_sync_ms'], r['decode_tok_s_sync']) for r in map(json.loads, sys.stdin)]" ;;
*) echo "usage: $0 1|2|5|6|7|9|10"; exit 2 ;;
esac
