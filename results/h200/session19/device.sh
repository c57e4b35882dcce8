#!/usr/bin/env bash
# Session 19 on one H200 (issue 51): the batch-1 fused decode layer, the bare loop, served decoders.
# Usage, from the repository root: bash results/h200/session19/device.sh RECIPE...
#   loop      benchmarks/llm_decode_loop.py fp8 at batch 1 (profiled) and LOOP_BATCHES (512): the bare loop
#   ablate    the bare loop at fp8 batch 1 without the fused layer (DEEPGAP_DECODE_FUSED=0), then with SDPA's
#             attention instead of deepgap's kernel (DEEPGAP_DECODE_ATTENTION=sdpa)
#   sweep8b   deepgap run --workload decode, llama-3.1-8b 128 in / 128 out, quant fp8 at SWEEP_FP8 (1,512)
#   stests    the GPU tests of this session's changes: served engines and slots, the quant Linear and engine, the fused layer
#   serve8b   deepgap serve llama-3.1-8b at MLPerf's limits (TTFT p99 <= 2 s, TPOT p99 <= 100 ms), ENGINE
#             (quant) PRECISION (fp8), slots SLOTS (256,512), prompts uniform 64-256, 128 out, probes of 20 s
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
D8=(--workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1
    --no-thermal-warmup --no-cpu-baseline)
for what in "$@"; do case $what in
loop)
    step "loop fp8" "${LOOP_LIMIT:-150}" python benchmarks/llm_decode_loop.py --precision fp8 \
        --batches 1,${LOOP_BATCHES:-512} --profile --out "$OUT" >> "$OUT/loop.txt" 2>&1
    grep -v "^-\|^ *$" "$OUT/loop.txt" | cut -c1-160 | tail -n 30 ;;
ablate)
    step "loop fp8 unfused" 90 env DEEPGAP_DECODE_FUSED=0 python benchmarks/llm_decode_loop.py --precision fp8 \
        --batches 1 --profile --out "$OUT" >> "$OUT/ablate.txt" 2>&1
    step "loop fp8 sdpa" 90 env DEEPGAP_DECODE_ATTENTION=sdpa python benchmarks/llm_decode_loop.py --precision fp8 \
        --batches 1 --out "$OUT" >> "$OUT/ablate.txt" 2>&1
    grep "^{" "$OUT/ablate.txt" | cut -c1-400 ;;
sweep8b)
    T="$S/sweep8b.sqlite"
    step "8b fp8 sweep" "${FP8_LIMIT:-240}" python -m deepgap run "${D8[@]}" --engines quant --precisions fp8 \
        --batch-sizes ${SWEEP_FP8:-1,512} --store "$T" > "$OUT/sweep8b.txt" 2>&1
    python -m deepgap show "$T" >> "$OUT/sweep8b.txt" 2>&1
    grep -v "^┃\|^┏\|^┡\|^└" "$OUT/sweep8b.txt" | tail -n 30; pack "$T" ;;
serve8b)
    T="$S/serve8b.sqlite"
    step "serve 8b" "${SERVE_LIMIT:-240}" python -m deepgap serve --model llama-3.1-8b --engine "${ENGINE:-quant}" \
        --precision "${PRECISION:-fp8}" --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 \
        --batch-sizes ${SLOTS:-256,512} --find-capacity --verify-policies 1 --curve-iterations 20 \
        --no-thermal-warmup --store "$T" > "$OUT/serve8b.txt" 2>&1
    python -m deepgap show "$T" >> "$OUT/serve8b.txt" 2>&1
    grep -v "^┃\|^┏\|^┡\|^└\|^│ *│" "$OUT/serve8b.txt" | tail -n 40; pack "$T" ;;
stests)
    step "serving GPU tests" "${STESTS_LIMIT:-130}" python -m pytest -q -m gpu -n 4 tests/serving/test_serving_llm_engines.py \
        tests/test_llm_slots.py tests/test_quant_linear_gpu.py tests/test_quant_gpu.py tests/test_llm_fused.py \
        -p no:cacheprovider > "$OUT/stests.txt" 2>&1
    tail -n 12 "$OUT/stests.txt" ;;
*) echo "unknown recipe $what"; exit 2 ;;
esac; done
