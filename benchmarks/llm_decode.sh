#!/usr/bin/env bash
# Issue 51's decode sweeps on one GPU (device kind nvidia-h200), from the repository root, $OUT set:
#   bash benchmarks/llm_decode.sh STEP...
# Steps (each well inside one device call):
#   tests    — the decode GPU tests: the compile and CUDA-graph steps against fp32 (tests/measure/test_llm_decode_sweep.py)
#   decode1b — llama-3.2-1b, bf16, eager and cudagraph, batches 1,8,32,128, 128 in / 128 out, 3 repeats, one
#              sweep, no thermal warm-up (estimated ~2-3 min, not yet run) → decode1b.sqlite(.gz) and .csv
# Parameters (environment): DECODE (the sweep's flags, replacing decode1b's), S (where stores go).
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, step(), pack()
S=${S:-/tmp/deepgap-decode}; mkdir -p "$S"
read -r -a SWEEP <<< "${DECODE:---models llama-3.2-1b --device cuda --engines eager,cudagraph --precisions bf16 \
--batch-sizes 1,8,32,128 --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup}"
[ $# -gt 0 ] || { sed -n 2,8p "$0"; exit 2; }
for what in "$@"; do case $what in
tests)
    step "decode GPU tests" 400 python -m pytest -q -m gpu tests/measure/test_llm_decode_sweep.py -p no:cacheprovider \
        > "$OUT/decode-gputests.txt" 2>&1
    tail -n 15 "$OUT/decode-gputests.txt" ;;
decode1b)
    step "decode sweep" 540 python -m deepgap run --workload decode "${SWEEP[@]}" --store "$S/decode1b.sqlite" \
        > "$OUT/decode1b.txt" 2>&1
    python -m deepgap show "$S/decode1b.sqlite" >> "$OUT/decode1b.txt" 2>&1
    tail -n 40 "$OUT/decode1b.txt"; pack "$S/decode1b.sqlite" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
