#!/usr/bin/env bash
# Transformers on the H100 (issue 38): the device runs that fill docs/transformers.md's headline table.
# Usage on the device: bash benchmarks/transformers_h100.sh STEP...   (each step sized for the 10-minute command
# limit; the minutes below are estimates from the eager timings, not measurements)
#   bert-eager         — bert-base and bert-large at sequence 128 and 384: eager fp32/fp16 at batch 1, 64, 256,
#                        cudagraph fp16 at batch 1 (--preset transformers)                        ~6 min
#   bert-base-compile  — bert-base, compile-freeze fp16 at batch 64 and 256, sequence 128 and 384  ~5 min
#   bert-large-compile — the same for bert-large                                                   ~7 min
#   vit                — vit_b_16 through the preset's engines (quant fp8 too)                ~6 min
#   gputests           — tests/measure/engines/test_bert_gpu.py (SDPA's fused kernels in fp16/bf16, CUDA graphs, compile)
# Stores are gzipped into $OUT (pack); merge them with `deepgap merge *.sqlite -o transformers.sqlite` and
# commit under results/h100/ with this script's output. Then read tokens/s with `deepgap show` / `deepgap report`.
# DRY=1: print each step's `deepgap run` arguments, one line per step, and run nothing (tests check them).
# SMOKE=1: the same steps on this machine's CPU with tinybert and tinycnn, sequence 16 and 32, batch 1 and 2.
set -uo pipefail
S=/tmp/transformers
if [ "${DRY:-0}" != 1 ]; then
    OUT=${OUT:-$S/out}; mkdir -p "$S" "$OUT"
    source benchmarks/device_lib.sh  # PYTHONPATH, step(), pack()
fi
if [ "${SMOKE:-0}" = 1 ]; then
    BB=tinybert; BL=tinybert; BOTH=tinybert; VIT=tinycnn; SEQ=16,32
    SIZE=(--device cpu --batch-sizes 1,2 --threads 1 --warmup 1 --iterations 3 --repeats 2 --max-time 2
          --no-telemetry --idle-time 0)
else
    BB=bert-base; BL=bert-large; BOTH=bert-base,bert-large; VIT=vit_b_16; SEQ=128,384
    SIZE=(--device cuda)
fi
sweep() {  # sweep NAME LIMIT_S ARGS...: one `deepgap run --preset transformers` into its own store
    local name=$1 limit=$2; shift 2
    local args=(--preset transformers "$@" "${SIZE[@]}" --store "$S/$name.sqlite" --quiet)
    if [ "${DRY:-0}" = 1 ]; then echo "${args[*]}"; return; fi
    step "$name" "$limit" python -m deepgap run "${args[@]}" > "$OUT/$name.txt" 2>&1
    tail -4 "$OUT/$name.txt"; python -m deepgap show "$S/$name.sqlite" > "$OUT/$name.show.txt" 2>&1
    pack "$S/$name.sqlite"
}
for what in "$@"; do case $what in
bert-eager)         sweep bert-eager 560 --models $BOTH --seq-lens $SEQ --engines eager,cudagraph ;;
bert-base-compile)  sweep bert-base-compile 560 --models $BB --seq-lens $SEQ --engines compile-freeze --precisions fp16 ;;
bert-large-compile) sweep bert-large-compile 580 --models $BL --seq-lens $SEQ --engines compile-freeze --precisions fp16 ;;
vit)                sweep vit 560 --models $VIT ;;
gputests)
    if [ "${DRY:-0}" = 1 ]; then continue; fi
    step "GPU tests" 300 python -m pytest -q -m gpu tests/measure/engines/test_bert_gpu.py -p no:cacheprovider > "$OUT/gputests.txt" 2>&1
    tail -8 "$OUT/gputests.txt" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
