#!/usr/bin/env bash
# Issue 50's fused MLP kernel on the persistent TMA GEMM core, first GPU run (device kind nvidia-h200), from the
# repository root, $OUT set:   bash benchmarks/fused_mlp.sh STEP...   (all = kernels network: one call)
# Steps (each well inside one device call; estimates, not yet run):
#   tests    — tests/test_quant_linear_persistent_gpu.py: every persistent tile vs cuBLASLt at bert-base's and
#              ViT-B/16's four Linear shapes (batch 256), tinybert fused on it compiled and captured (~2 min)
#   kernels  — benchmarks/fp8_gemm_gelu.py: per shape, cuBLASLt + Inductor vs the grouped fused kernel's tiles vs
#              the persistent ones; a table of the best of each at the end (~3-4 min) → fp8_gemm_gelu.jsonl
#   network  — bert-base seq 128 batch 256 by benchmarks/transformer_quant.py's bare loop: fp16 compile-freeze,
#              fp8 (cuBLASLt + Inductor), fp8 fused on the grouped core, on the persistent core, and tuned per
#              shape; a table of seq/s and the ratio to fp16 compile-freeze at the end (~2-3 min)
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, step()
[ $# -gt 0 ] || { sed -n 2,10p "$0"; exit 2; }
[ "$*" = all ] && set -- kernels network
for what in "$@"; do case $what in
tests)
    step "fused MLP GPU tests" 300 python -m pytest -v -rA tests/test_quant_linear_persistent_gpu.py \
        tests/test_quant_linear_gpu.py -k "fused or persistent" -p no:cacheprovider > "$OUT/fused-gputests.txt" 2>&1
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/fused-gputests.txt" | cut -c1-220 ;;
kernels)
    step "fused kernels per shape" 330 python benchmarks/fp8_gemm_gelu.py --out "$OUT" > "$OUT/fp8_gemm_gelu.txt" 2>&1
    grep -v '^{' "$OUT/fp8_gemm_gelu.txt" | tail -n 40 ;;
network)
    step "bert-base network" 240 python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 \
        --variants fp16-compile-freeze,fp8-tensor-fast,fp8-tensor-fast-fused,fp8-tensor-fast-fused-persistent,fp8-tensor-fast-fused-tuned \
        --out "$OUT" > "$OUT/fused-network.txt" 2>&1
    grep -v '^{' "$OUT/fused-network.txt" | tail -n 12; grep -o '"tuned_tiles": {[^}]*}' "$OUT/fused-network.txt" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
