#!/usr/bin/env bash
# Session 18 on one H200 (issue 51): decoder LLMs. Usage, from the repository root: bash results/h200/session18/device.sh RECIPE...
#   linear   benchmarks/decode_linear.py: Llama-3.1-8B's Linear shapes at 1-64 rows, bf16 cuBLAS vs the fp8
#            weight-only GEMV (tiles) vs compiled weight-only vs per-token fp8 _scaled_mm, in GB/s of weights
#   decode8b deepgap run --workload decode: llama-3.1-8b batch 1, 128 in / 128 out: compile-reduce-overhead bf16
#            and quant fp8 (weight-only GEMV, compiled, one graph)
#   loop     benchmarks/llm_decode_loop.py, the bare loop: llama-3.1-8b bf16 and fp8 at batch 1 (with the top
#            kernels), fp8 at LOOP_BATCHES (64,256)
#   sweep8b  deepgap run --workload decode, llama-3.1-8b 128 in / 128 out: quant fp8 at SWEEP_FP8 (1,16,256,512)
#            and compile-reduce-overhead bf16 at SWEEP_BF16 (1,256), one store
#   gtests   the GPU tests of this session's decode work: the attention kernel, the GEMV, the decode sweep's
#            steps, the served decoder's slot step, the decode answer's host-CPU run
#   serve8b  deepgap serve llama-3.1-8b bf16 cudagraph, Poisson arrivals, prompts uniform 64-256, 128 out,
#            slots SLOTS (64,128,256), capacity at TTFT p99 <= 2 s and TPOT p99 <= 100 ms
#   dtests   the decode GPU tests (tests/test_llm_decode_sweep.py, the 8-bit decode test)
#   decode1b benchmarks/llm_decode.sh decode1b (llama-3.2-1b bf16 eager and cudagraph, batch 1-128)
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
D8=(--workload decode --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1
    --no-thermal-warmup --no-cpu-baseline)
for what in "$@"; do case $what in
linear)
    step "decode linears" "${LINEAR_LIMIT:-240}" python benchmarks/decode_linear.py --out "$OUT" > "$OUT/linear.txt" 2>&1
    grep -v '"tile": "GemvTile' "$OUT/linear.txt" | tail -n 40 ;;
loop)
    [ -n "${SKIP_BF16:-}" ] || step "loop bf16" 150 python benchmarks/llm_decode_loop.py --precision bf16 --batches 1 \
        --profile --out "$OUT" >> "$OUT/loop.txt" 2>&1
    step "loop fp8" "${LOOP_LIMIT:-200}" python benchmarks/llm_decode_loop.py --precision fp8 --batches 1,${LOOP_BATCHES:-64,256} \
        --profile --out "$OUT" >> "$OUT/loop.txt" 2>&1
    grep -v "^-\|^ *$" "$OUT/loop.txt" | cut -c1-160 | tail -n 60 ;;
decode8b)
    T="$S/decode8b.sqlite"
    [ -n "${SKIP_BF16:-}" ] || step "8b bf16 bs1" 150 python -m deepgap run "${D8[@]}" --engines compile-reduce-overhead --precisions bf16 \
        --batch-sizes ${B8:-1} --store "$T" > "$OUT/decode8b.txt" 2>&1
    step "8b fp8 bs1" 200 python -m deepgap run "${D8[@]}" --engines quant --precisions fp8 \
        --batch-sizes ${B8:-1} --store "$T" >> "$OUT/decode8b.txt" 2>&1
    python -m deepgap show "$T" >> "$OUT/decode8b.txt" 2>&1
    tail -n 40 "$OUT/decode8b.txt"; pack "$T" ;;
sweep8b)
    T="$S/sweep8b.sqlite"
    step "8b fp8 sweep" "${FP8_LIMIT:-330}" python -m deepgap run "${D8[@]}" --engines quant --precisions fp8 \
        --batch-sizes ${SWEEP_FP8:-1,16,256,512} --store "$T" > "$OUT/sweep8b.txt" 2>&1
    step "8b bf16 sweep" "${BF16_LIMIT:-200}" python -m deepgap run "${D8[@]}" --engines compile-reduce-overhead --precisions bf16 \
        --batch-sizes ${SWEEP_BF16:-1,256} --store "$T" >> "$OUT/sweep8b.txt" 2>&1
    python -m deepgap show "$T" >> "$OUT/sweep8b.txt" 2>&1
    grep -v "^┃\|^┏\|^┡\|^└" "$OUT/sweep8b.txt" | tail -n 30; pack "$T" ;;
gtests)
    step "GPU tests" "${GTESTS_LIMIT:-300}" python -m pytest -q -m gpu tests/test_llm_attention.py tests/test_llm_slots.py \
        tests/test_llm_decode_sweep.py tests/test_llm_answer.py tests/test_quant_linear_gpu.py -k "not tinybert and not fused" \
        -p no:cacheprovider > "$OUT/gtests.txt" 2>&1
    tail -n 6 "$OUT/gtests.txt" ;;
serve8b)
    T="$S/serve8b.sqlite"
    step "serve 8b" "${SERVE_LIMIT:-170}" python -m deepgap serve --model llama-3.1-8b --engine cudagraph --precision bf16 \
        --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes ${SLOTS:-64,128,256} \
        --find-capacity --verify-policies 1 --curve-iterations 20 --min-duration 10s --no-thermal-warmup \
        --store "$T" > "$OUT/serve8b.txt" 2>&1
    python -m deepgap show "$T" >> "$OUT/serve8b.txt" 2>&1
    grep -v "^┃\|^┏\|^┡\|^└\|^│ *│" "$OUT/serve8b.txt" | tail -n 40; pack "$T" ;;
dtests)
    step "decode GPU tests" 200 python -m pytest -q -m gpu tests/test_llm_decode_sweep.py tests/test_quant_linear_gpu.py \
        -k "decode or llama or gpu_steps or gemv" -p no:cacheprovider > "$OUT/dtests.txt" 2>&1
    tail -n 15 "$OUT/dtests.txt" ;;
decode1b)
    OUT=$OUT bash benchmarks/llm_decode.sh decode1b ;;
*) echo "unknown recipe $what"; exit 2 ;;
esac; done
