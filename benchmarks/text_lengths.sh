#!/usr/bin/env bash
# Mixed-length text batches on one GPU (issue 50): bert-large at sequence 384 over full sequences, packed sequences
# (padding removed, as MLPerf's BERT runs SQuAD) and the same sequences padded, beside MLPerf's BERT-99 anchor.
# The lengths: uniform:32:320, mean 176 tokens, about SQuAD v1.1's mean at 384 (54% padding: 177 real tokens);
# a stated uniform draw with SQuAD's mean, not SQuAD's histogram (no dataset is downloaded here).
# Usage on the device: bash benchmarks/text_lengths.sh STEP...
#   serve     — `deepgap serve` bert-large fp16 (eager: text serving's engine) at the same lengths, padding removed
#               (packed) and padded to the batch's longest, each --find-capacity at p99 ≤ 130 ms (MLPerf BERT
#               Server's bound); the console and `deepgap show` to $OUT, the store packed; SERVE_LIMIT (240 s) each
#   bertbase  — issue 50's loop check in one call: bert-base seq 128 quant fp8 batch 256 in `deepgap run` (one sweep,
#               pipelined figure beside it), then the bare loop of the same engine choice on the same machine;
#               $OUT/bertbase.txt, bertbase.csv, transformer_quant.jsonl; BASE_LIMIT (300 s)
#   gputests  — tests/measure/test_text_input_gpu.py (varlen against padded attention, every engine on the input)
#   bertlarge — compile-freeze fp16 and quant fp8 at batch 256, inputs default, packed and padded, into one store;
#               the console (stamped), `deepgap show`, the CSV export to $OUT, the store gzipped (pack); LIMIT (420 s)
#   loop      — the independent loop (benchmarks/transformer_quant.py) on the same packed batch: the quant engine's
#               choice (fp8-tensor-fast-fused-engine-tanh) and fp16 compile-freeze, into $OUT/transformer_quant.jsonl
# DRY=1: print the bertlarge step's `deepgap run` arguments, one line, and run nothing (tests check them).
# SMOKE=1: the same step on this machine's CPU with tinybert at sequence 64 (lengths uniform:8:56), batch 4.
set -uo pipefail
S=/tmp/text_lengths
if [ "${DRY:-0}" != 1 ]; then
    OUT=${OUT:-$S/out}; mkdir -p "$S" "$OUT"
    source benchmarks/device_lib.sh  # PYTHONPATH, step(), pack()
fi
if [ "${SMOKE:-0}" = 1 ]; then
    GRID=(--models tinybert --seq-lens 64 --seq-len-dist uniform:8:56 --engines eager,compile-freeze
          --precisions fp32 --device cpu --batch-sizes 4 --threads 1 --warmup 1 --iterations 3 --repeats 2
          --max-time 2 --no-telemetry --idle-time 0)
else
    GRID=(--models bert-large --seq-lens 384 --seq-len-dist uniform:32:320 --engines compile-freeze,quant
          --precisions fp16,fp8 --device cuda --batch-sizes 256 --sweeps 1 --no-cpu-baseline)
fi
for what in "$@"; do case $what in
bertlarge)
    args=("${GRID[@]}" --inputs default,packed,padded --store "$S/lengths.sqlite")
    if [ "${DRY:-0}" = 1 ]; then echo "${args[*]}"; continue; fi
    step "bert-large, mixed lengths" "${LIMIT:-420}" python -m deepgap run "${args[@]}" 2>&1 | stamp > "$OUT/lengths.txt"
    tail -12 "$OUT/lengths.txt"
    python -m deepgap show "$S/lengths.sqlite" > "$OUT/lengths.show.txt" 2>&1
    python -m deepgap export "$S/lengths.sqlite" -o "$OUT/lengths.csv" > /dev/null 2>&1
    pack "$S/lengths.sqlite" ;;
loop)
    if [ "${DRY:-0}" = 1 ] || [ "${SMOKE:-0}" = 1 ]; then continue; fi
    step "bare loop, packed" "${LOOP_LIMIT:-240}" python benchmarks/transformer_quant.py --model bert-large --seq 384 \
        --batch 256 --lengths uniform:32:320 --packing packed --out "$OUT" \
        --variants fp8-tensor-fast-fused-engine-tanh,fp16-compile-freeze > "$OUT/loop.txt" 2>&1
    tail -4 "$OUT/loop.txt" ;;
serve)
    if [ "${DRY:-0}" = 1 ] || [ "${SMOKE:-0}" = 1 ]; then continue; fi
    for padding in packed longest; do
        step "serve bert-large, $padding" "${SERVE_LIMIT:-240}" python -m deepgap serve --model bert-large \
            --precision fp16 --device cuda --seq-len-dist uniform:32:320 --padding "$padding" \
            --batch-sizes 8,32,64,128 --find-capacity --slo-p99 130ms --verify-policies 1 \
            --store "$S/serve.sqlite" > "$OUT/serve-$padding.txt" 2>&1
        tail -4 "$OUT/serve-$padding.txt"
    done
    python -m deepgap show "$S/serve.sqlite" > "$OUT/serve.show.txt" 2>&1
    pack "$S/serve.sqlite" ;;
bertbase)
    if [ "${DRY:-0}" = 1 ] || [ "${SMOKE:-0}" = 1 ]; then continue; fi
    step "bert-base quant, run and loop" "${BASE_LIMIT:-300}" bash -c "python -m deepgap run --models bert-base \
        --seq-lens 128 --engines quant --precisions fp8 --batch-sizes 256 --device cuda --sweeps 1 \
        --no-cpu-baseline --store $S/base.sqlite && python -m deepgap export $S/base.sqlite -o $OUT/bertbase.csv \
        && python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 --out $OUT \
        --variants fp8-tensor-fast-fused-engine-tanh" > "$OUT/bertbase.txt" 2>&1
    tail -6 "$OUT/bertbase.txt" ;;
gputests)
    if [ "${DRY:-0}" = 1 ]; then continue; fi
    step "GPU tests" 300 python -m pytest -q -m gpu tests/measure/test_text_input_gpu.py \
        tests/serving/test_serving_text_packed.py -p no:cacheprovider \
        > "$OUT/gputests.txt" 2>&1
    tail -8 "$OUT/gputests.txt" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
