#!/usr/bin/env bash
# Session 23's recipes on one H200 (run from the repository root by the device tool, $OUT set; .whl/ carried).
# Calls 1-3 used recipes that already exist; this script holds call 4's, which was typed inline:
#   call 1  TEST_LIMIT=270 bash benchmarks/device.sh gputests; DIAG_LIMIT=85 LOOP_LIMIT=85 bash results/h200/session22/device.sh diag
#   call 2  bash benchmarks/fused_mlp.sh network kernels
#   call 3  export DEEPGAP_QUANT_GEMM=persistent; DEFAULT_LIMIT=590 bash benchmarks/device.sh default
#   call 4  bash results/h200/session23/device.sh transformers
#   call 6  the loop half of `prefetch` (below) at batch 1 with a 110 s limit (call 5's start was refused)
# transformers: the bare CUDA-graph loop (benchmarks/transformer_quant.py) for vit_b_16 at batch 256 (fp16 eager and
#   compile-freeze, fp8 through cuBLASLt, fused on the grouped core, fused tuned per shape) and bert-large at
#   sequence 384, batch 128 (compile-freeze fp16, fp8 cuBLASLt, fp8 fused tuned)
# prefetch: the fused GEMVs' L2 prefetch under PDL (DEEPGAP_DECODE_PREFETCH=l2, issue 51): its GPU test (the
#   same logits), then the bare loop replaying deepgap's step at batches LOOP_BATCHES (1), PDL on, split KV,
#   without and with it
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
transformers)
    V=fp16-eager,fp16-compile-freeze,fp8-tensor-fast,fp8-tensor-fast-fused,fp8-tensor-fast-fused-tuned
    step vit 200 python benchmarks/transformer_quant.py --model vit_b_16 --seq 224 --batch 256 --variants $V \
        --out "$OUT" > "$OUT/vit.txt" 2>&1
    grep -v '^{' "$OUT/vit.txt" | tail -8
    step bertlarge 220 python benchmarks/transformer_quant.py --model bert-large --seq 384 --batch 128 \
        --variants fp16-compile-freeze,fp8-tensor-fast,fp8-tensor-fast-fused-tuned --out "$OUT" > "$OUT/bertlarge.txt" 2>&1
    grep -v '^{' "$OUT/bertlarge.txt" | tail -6 ;;
prefetch)
    step "L2 prefetch GPU test" 120 python -m pytest -q -m gpu tests/test_l2_prefetch.py -p no:cacheprovider \
        > "$OUT/prefetch-test.txt" 2>&1
    tail -n 3 "$OUT/prefetch-test.txt"
    step "loop, deepgap's step, prefetch off and l2" "${LOOP_LIMIT:-150}" python benchmarks/llm_decode_loop.py \
        --precision fp8 --batches "${LOOP_BATCHES:-1}" --pdl on --split-kv auto --prefetch off,l2 --harness deepgap \
        --out "$OUT" > "$OUT/prefetch-loop.txt" 2>&1
    grep "^{" "$OUT/prefetch-loop.txt" | cut -c1-700; grep -v "^{" "$OUT/prefetch-loop.txt" | grep -i "error\|Trace" | head ;;
*) sed -n 2,14p "$0"; exit 2 ;;
esac
