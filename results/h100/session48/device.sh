#!/usr/bin/env bash
# Session 48 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). The asks were for nvidia-h200; the machine that came was one H100 80GB HBM3.
# Usage: bash results/h100/session48/device.sh N (the README says each call's command and result).
set -uo pipefail
case ${1:-} in
1) bash results/h100/session47/device.sh 8 ;;  # issue 47: served ratio (HOLD_WITHIN's first GPU run), LoadGen x3, bs1
2) source benchmarks/device_lib.sh  # issue 51: can one program an SM stream the 8B step's weights through its barriers?
   step "stream ring" 330 python benchmarks/stream_ring.py --out "$OUT" > "$OUT/stream-ring.txt" 2>&1
   python3 - "$OUT/stream_ring.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r for r in rows if "us" in r]
for mode in ("flat", "nested", "none"):
    best = sorted((r for r in ok if r["mode"] == mode), key=lambda r: r["us"])[:3]
    for r in best:
        print(mode, r["per_sm"], f'{r["bn"]}x{r["bk"]}', "w", r["warps"], "st", r["stages"], r["us"], "us", r["TBps"], "TB/s", r["tok_s"], "tok/s")
print(len(ok), "timed,", len(rows) - len(ok), "not:", sorted({r.get("error", "")[:80] for r in rows if "error" in r}))
PY
   step "decode loop bs1 8b fp8 (the step today, same card)" 150 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap --precision fp8 --out "$OUT" \
       > "$OUT/loop-bs1.txt" 2>&1
   grep '^{' "$OUT/loop-bs1.txt" | python3 -c "import json,sys; [print(r['tpot_ms'], r['decode_tok_s'], \
r.get('decode_tok_s_sync')) for r in map(json.loads, sys.stdin)]" ;;
3) source benchmarks/device_lib.sh  # issue 51: the same walk with a producer warp (Gluon), beside step 2's best two
   step "stream ring, step 2's best flat and none again" 120 python benchmarks/stream_ring.py --out "$OUT" --per-sm 1 \
       --tiles 16x1024 --warps 8 --stages 8 --modes flat,none > "$OUT/stream-ring-again.txt" 2>&1
   step "stream ring, producer warp" 240 python benchmarks/stream_ring_ws.py --out "$OUT" > "$OUT/stream-ring-ws.txt" 2>&1
   cat "$OUT"/stream_ring.jsonl "$OUT"/stream_ring_ws.jsonl | cut -c1-240 ;;
4) source benchmarks/device_lib.sh  # step 3 with lighter consumers (8 warps; products summed across threads once a
   # phase, not once a tile): can the consumer catch up after a barrier from the tiles the producer loaded meanwhile?
   step "stream ring, step 2's best flat and none again" 120 python benchmarks/stream_ring.py --out "$OUT" --per-sm 1 \
       --tiles 16x1024 --warps 8 --stages 8 --modes flat,none > "$OUT/stream-ring-again.txt" 2>&1
   step "stream ring, producer warp, lighter consumers" 300 python benchmarks/stream_ring_ws.py --out "$OUT" \
       > "$OUT/stream-ring-ws.txt" 2>&1
   cat "$OUT"/stream_ring.jsonl "$OUT"/stream_ring_ws.jsonl | cut -c1-240 ;;
5) source benchmarks/device_lib.sh  # issue 47: wide tiles for the residual 1x1 layers (tiles.WIDE_RESIDUAL)
   S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "persistent GPU tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_quant_persistent_gpu.py \
       -k equal -rA -p no:cacheprovider > "$OUT/persistent-gputests.txt" 2>&1
   tail -n 3 "$OUT/persistent-gputests.txt"
   step "gemm_1x1 conv3 shapes bs1024" 150 python benchmarks/gemm_1x1.py --batch 1024 --precisions fp8,int8 \
       --layers layer1.0.conv3,layer2.0.conv3,layer3.0.conv3,layer4.0.conv3 --out "$OUT/gemm-1x1-conv3.jsonl" \
       > "$OUT/gemm-1x1-conv3.txt" 2>&1
   grep -A40 "^layer " "$OUT/gemm-1x1-conv3.txt" | head -n 40
   for mode in narrow persistent; do  # the engine before and with the wide tiles, fp8 at 1024
       step "resnet50 quant fp8 bs1024, DEEPGAP_QUANT_GEMM=$mode" 200 env DEEPGAP_QUANT_GEMM=$mode python -m deepgap \
           run --models resnet50 --engines quant --precisions fp8 --batch-sizes 1024 --sweeps 1 --no-cpu-baseline \
           --no-thermal-warmup --store "$S/wide-$mode.sqlite" > "$OUT/wide-$mode.txt" 2>&1
       grep "img/s" "$OUT/wide-$mode.txt" | tail -n 1
       python -m deepgap export "$S/wide-$mode.sqlite" -o "$OUT/wide-$mode.csv" > /dev/null 2>&1 || true
   done ;;
6) source benchmarks/device_lib.sh  # step 5's GPU tests again, the early-residual variants as the kernel now takes them
   step "persistent GPU tests" 240 python -m pytest -q -m gpu tests/measure/quant/test_quant_persistent_gpu.py \
       -rA -p no:cacheprovider > "$OUT/persistent-gputests-again.txt" 2>&1
   tail -n 4 "$OUT/persistent-gputests-again.txt" ;;
7) source benchmarks/device_lib.sh  # issue 51: where today's batch-1 step goes on this card (the last timeline: session 38)
   step "decode loop bs1 8b fp8, timeline" 200 python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 \
       --pdl on --split-kv auto --harness deepgap --precision fp8 --timeline --out "$OUT" > "$OUT/timeline-bs1.txt" 2>&1
   grep -v '^{' "$OUT/timeline-bs1.txt" | tail -n 30 ;;
8) source benchmarks/device_lib.sh  # issue 51: call 7's qkv (8x512, 4 stages) and o at 1.45-1.49x a plain read: do
   # tiles that load more before PDL's wait (gate_up's and down's forms) do better in the step?
   step "decode loop bs1 8b fp8, qkv and o tiles forced" 270 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap --precision fp8 --out "$OUT" \
       --tiles "tuned;4096x6144=4x2048w4t;4096x6144=8x2048w8t;4096x6144=4x4096w4;4096x4096=4x2048w4t;4096x4096=16x1024w8t" \
       > "$OUT/tiles-bs1.txt" 2>&1
   grep '^{' "$OUT/tiles-bs1.txt" | python3 -c "import json,sys; [print(r['forced_tiles'], r['tpot_ms'], \
r['decode_tok_s']) for r in map(json.loads, sys.stdin)]" ;;
9) source benchmarks/device_lib.sh  # step 8's winner for qkv, with o's tile forced too (o hands the norm on: BN >= 8)
   step "decode loop bs1 8b fp8, qkv 4x2048t and o tiles forced" 170 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap --precision fp8 --out "$OUT" \
       --tiles "tuned;4096x6144=4x2048w4t;4096x6144=4x2048w4t,4096x4096=16x1024w8t;4096x6144=4x2048w4t,4096x4096=8x4096w8" \
       > "$OUT/tiles-bs1-o.txt" 2>&1
   grep '^{' "$OUT/tiles-bs1-o.txt" | python3 -c "import json,sys; [print(r['forced_tiles'], r['tpot_ms'], \
r['decode_tok_s']) for r in map(json.loads, sys.stdin)]"; grep -v '^{' "$OUT/tiles-bs1-o.txt" | tail -n 3 ;;
10) source benchmarks/device_lib.sh  # prepared for an H200, not yet run: step 8's qkv A/B there, and the cached and
   # streamed tuners' own choices (DEEPGAP_GEMV_TUNE), two processes each (about 4 min)
   for i in 1 2; do
       step "decode loop bs1 8b fp8, qkv forced, process $i" 120 python benchmarks/llm_decode_loop.py \
           --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap --precision fp8 --out "$OUT" \
           --tiles "tuned;4096x6144=4x2048w4t" > "$OUT/h200-tiles-$i.txt" 2>&1
       step "decode loop bs1 8b fp8, streamed tuning, process $i" 90 env DEEPGAP_GEMV_TUNE=streamed python \
           benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 --pdl on --split-kv auto --harness deepgap \
           --precision fp8 --out "$OUT" > "$OUT/h200-streamed-$i.txt" 2>&1
   done
   cat "$OUT"/h200-*.txt | grep '^{' | python3 -c "import json,sys; [print(r['forced_tiles'], r['tpot_ms'], \
r['decode_tok_s'], r.get('tiles', '')[:300]) for r in map(json.loads, sys.stdin)]" ;;
11) source benchmarks/device_lib.sh  # call 10 (run as these lines): both stream-ring benchmarks after the review
   step "stream ring after review" 70 python benchmarks/stream_ring.py --out "$OUT" --per-sm 1 --tiles 16x1024 \
       --warps 8 --stages 8 --modes flat,none > "$OUT/ring.txt" 2>&1
   step "ws after review" 70 python benchmarks/stream_ring_ws.py --out "$OUT" --variants 32x256:16:4:1 > "$OUT/ws.txt" 2>&1
   cat "$OUT"/*.jsonl ;;
*) echo "usage: $0 1|2|3|4|5|6|7|8|9|10|11"; exit 2 ;;
esac
