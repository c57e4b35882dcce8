#!/usr/bin/env bash
# The transformers preset on one GPU (issue 50): `deepgap run --preset transformers` as one step, sized for the
# device's 10-minute command limit (35 configurations: bert-base and bert-large at sequence 128 and 384, and
# vit_b_16; eager fp32/fp16 at batch 1 and 256, cudagraph fp16 at 1, compile-freeze fp16 and quant fp8 at 256).
# Usage on the device: bash benchmarks/transformers_preset.sh STEP...
#   preset    — the whole preset into one store; the console (stamped), `deepgap show`, the CSV export and the
#               report's CSV tables go to $OUT, the store gzipped beside them (pack); PRESET_LIMIT seconds (590)
#   gputests  — tests/measure/engines/test_bert_gpu.py (SDPA's fused kernels in fp16/bf16, CUDA graphs, compile)
# DRY=1: print the step's `deepgap run` arguments, one line, and run nothing (tests check them).
# SMOKE=1: the same step on this machine's CPU with tinybert and tinycnn, sequence 16 and 32, batch 1 and 2.
set -uo pipefail
S=/tmp/transformers
if [ "${DRY:-0}" != 1 ]; then
    OUT=${OUT:-$S/out}; mkdir -p "$S" "$OUT"
    source benchmarks/device_lib.sh  # PYTHONPATH, step(), pack()
fi
if [ "${SMOKE:-0}" = 1 ]; then
    MODELS=(--models tinybert,tinycnn --seq-lens 16,32)
    SIZE=(--device cpu --batch-sizes 1,2 --threads 1 --warmup 1 --iterations 3 --repeats 2 --max-time 2
          --no-telemetry --idle-time 0)
else
    MODELS=(); SIZE=(--device cuda)
fi
for what in "$@"; do case $what in
preset)
    args=(--preset transformers "${MODELS[@]}" "${SIZE[@]}" --store "$S/preset.sqlite")
    if [ "${DRY:-0}" = 1 ]; then echo "${args[*]}"; continue; fi
    step "transformers preset" "${PRESET_LIMIT:-590}" python -m deepgap run "${args[@]}" \
        --report "$S/preset/report.html" 2>&1 | stamp > "$OUT/preset.txt"
    tail -12 "$OUT/preset.txt"
    python -m deepgap show "$S/preset.sqlite" > "$OUT/preset.show.txt" 2>&1
    pack "$S/preset.sqlite"; report_csvs "$S/preset" ;;
gputests)
    if [ "${DRY:-0}" = 1 ]; then continue; fi
    step "GPU tests" 300 python -m pytest -q -m gpu tests/measure/engines/test_bert_gpu.py -p no:cacheprovider > "$OUT/gputests.txt" 2>&1
    tail -8 "$OUT/gputests.txt" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
