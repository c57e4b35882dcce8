#!/usr/bin/env bash
# Session 49 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200; every call ran on one NVIDIA H100 80GB HBM3. Usage: bash results/h100/session49/device.sh N
# (the README says each call's commit, command and result). Calls 1-3 time DEEPGAP_DECODE_SPLIT_KV=ahead, removed
# after them: run them at the commits the README names (call 1 at f3a85f9, call 2 at d1c10f0, call 3 at b76ee3b).
set -uo pipefail
loop_rows() {  # the bare loop's JSON rows: the split mode, TPOT, pipelined and synchronized tokens/s
    cat "$@" | grep '^{' | python3 -c "import json,sys; [print(r.get('split_kv'), r['tpot_ms'], r['decode_tok_s'], \
r.get('decode_tok_s_sync')) for r in map(json.loads, sys.stdin)]"
}
case ${1:-} in
1) source benchmarks/device_lib.sh  # issue 51: the attention with the cache read before PDL's wait (one pass, no
   # combine kernel): its GPU tests, then the bare loop at batch 1, auto against ahead in two processes, both orders
   nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
   step "attention GPU tests" 240 python -m pytest -q -m gpu tests/measure/test_llm_attention.py -rA \
       -p no:cacheprovider > "$OUT/attention-gputests.txt" 2>&1
   tail -n 3 "$OUT/attention-gputests.txt"
   for order in auto,ahead ahead,auto; do
       step "decode loop bs1 8b fp8, split-kv $order" 230 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
           --batches 1 --pdl on --split-kv "$order" --harness deepgap --precision fp8 --out "$OUT" \
           > "$OUT/ahead-$order.txt" 2>&1
   done
   loop_rows "$OUT"/ahead-*.txt ;;
2) source benchmarks/device_lib.sh  # issue 51: call 1's one pass lost; now the split's own chunks (32 positions, 4
   # warps) read before PDL's wait, merged by the combine kernel: GPU tests, the A/B in three processes, a timeline
   step "attention GPU tests" 240 python -m pytest -q -m gpu tests/measure/test_llm_attention.py -rA \
       -p no:cacheprovider > "$OUT/attention-gputests-2.txt" 2>&1
   tail -n 3 "$OUT/attention-gputests-2.txt"
   for order in auto,ahead ahead,auto auto,ahead; do
       step "decode loop bs1 8b fp8, split-kv $order" 150 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
           --batches 1 --pdl on --split-kv "$order" --harness deepgap --precision fp8 --out "$OUT" \
           >> "$OUT/ahead-2.txt" 2>&1
   done
   loop_rows "$OUT/ahead-2.txt"
   step "decode loop bs1 8b fp8, ahead, timeline" 150 python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
       --batches 1 --pdl on --split-kv ahead --harness deepgap --precision fp8 --timeline --out "$OUT" \
       > "$OUT/timeline-ahead-2.txt" 2>&1
   grep -v '^{' "$OUT/timeline-ahead-2.txt" | tail -n 30 ;;
3) source benchmarks/device_lib.sh  # issue 51: call 2's GPU tests again (the test's own launch mended), and the
   # chunks read ahead with the last program's merge (no combine kernel), four turns in two processes
   step "attention GPU tests" 240 python -m pytest -q -m gpu tests/measure/test_llm_attention.py -rA \
       -p no:cacheprovider > "$OUT/attention-gputests-3.txt" 2>&1
   tail -n 3 "$OUT/attention-gputests-3.txt"
   for i in 1 2; do
       step "decode loop bs1 8b fp8, split-kv auto,ahead x combine kernel,last-block ($i)" 200 python \
           benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto,ahead \
           --combine kernel,last-block --harness deepgap --precision fp8 --out "$OUT" >> "$OUT/ahead-3.txt" 2>&1
   done
   grep '^{' "$OUT/ahead-3.txt" | python3 -c "import json,sys; [print(r.get('split_kv'), r.get('combine'), \
r['tpot_ms'], r['decode_tok_s'], r.get('decode_tok_s_sync')) for r in map(json.loads, sys.stdin)]" ;;
4|5|6) source benchmarks/device_lib.sh  # issue 51 served: does the simulator's over-prediction (session 45 on an
   # H200: measured/predicted 0.953, TPOT p50 26.75 ms against the curves' ~25.6 p99) come from calibrating a cold
   # GPU? 4: as session 45's call 2 (--no-thermal-warmup); 5: the default thermal warm-up (at most 60 s) first,
   # which was refused (eager asked for fp8); 6: the same after the warm-up became eager bf16
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   warm=$([ "$1" = 4 ] && echo --no-thermal-warmup || echo "--thermal-timeout 60")
   # shellcheck disable=SC2086
   step "serve 8b fp8 512 slots kv fp8 ($warm)" 540 python -m deepgap serve --model llama-3.1-8b --engine quant \
       --precision fp8 --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 \
       --find-capacity --verify-policies 1 --curve-iterations 20 $warm --kv-cache fp8 --store "$S/serve-$1.sqlite" \
       > "$OUT/serve8b-$1.txt" 2>&1
   python -m deepgap export "$S/serve-$1.sqlite" -o "$OUT/serve8b-$1.csv" > /dev/null 2>&1 || true
   grep -i "serve: \|capacity" "$OUT/serve8b-$1.txt" | tail -n 14 ;;
7) bash "$0" 6 ;;  # prepared, not yet run: call 6 again at the final commit, where the decode step is calibrated
   # at the load's mean decode position and a retired slot's row goes back to position 0; the capacity and the
   # simulator's measured / predicted against calls 4-5 (0.976, 1.000) and session 45's H200 (0.953)
*) echo "usage: $0 1|2|3|4|5|6|7"; exit 2 ;;
esac
