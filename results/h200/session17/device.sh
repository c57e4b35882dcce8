#!/usr/bin/env bash
# Session 17 on one H200 (issue 50): transformers' Linear layers in fp8/int8. Usage, from the repository root:
# bash results/h200/session17/device.sh RECIPE...
#   explore  bare CUDA-graph loops (benchmarks/transformer_quant.py): bert-base seq 128 batch 256, every fp16 and
#            8-bit variant; vit_b_16 batch 256, the fp16 engines with and without unfused attention, and fp8
#   explore2 the fp8 scale choices (per row/channel or per tensor, fast accumulation) with their top kernels, on
#            bert-base 128 × 256, bert-large 384 × 64 and vit_b_16 × 256
#   transformers  deepgap run: bert-base 128 (batch 1, 256), vit_b_16 (256), bert-large 384 (64), eager and
#            compile-freeze fp16 beside quant fp8/int8; the bare loop; the Linear path's GPU tests
#   fused    benchmarks/fp8_gemm_gelu.py: one Triton kernel for an MLP's first fp8 GEMM + bias + GELU + the next
#            layer's fp8 quantization, against cuBLASLt + Inductor's GELU kernel, six tiles, three shapes
#   fused-bert  bert-base 128 × 256 fp8 with and without the fused MLP kernel (bare loop)
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "$@"; do case $what in
explore)
    step "bert-base" 260 python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 --out "$OUT" \
        --variants fp16-eager,fp16-compile-freeze,fp8-row,fp8-static,int8-row,int8-static,bf16-unfused-compile,fp8-row-freeze,fp8-row-autotune \
        > "$OUT/explore-bert.txt" 2>&1
    step "vit_b_16" 170 python benchmarks/transformer_quant.py --model vit_b_16 --seq 224 --batch 256 --out "$OUT" \
        --variants fp16-eager,fp16-compile-freeze,fp16-unfused-compile-freeze,fp8-row,fp8-static \
        > "$OUT/explore-vit.txt" 2>&1
    tail -n 3 "$OUT"/explore-*.txt ;;
explore2)
    # the fp8 scale granularities and fast accumulation, with each variant's top kernels (uncaptured, profiled)
    step "bert-base" 270 python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 --out "$OUT" \
        --profile 14 --variants bf16-unfused-compile,fp8-tensor-fast,fp8-row-fast,fp8-static-fast,fp8-row,fp8-tensor,fp16-unfused-compile,fp8-row-tensor-fast,int8-static \
        > "$OUT/explore2-bert.txt" 2>&1
    step "bert-large" 130 python benchmarks/transformer_quant.py --model bert-large --seq 384 --batch 64 --out "$OUT" \
        --profile 14 --variants bf16-unfused-compile,fp8-tensor-fast,fp8-row-fast > "$OUT/explore2-bert-large.txt" 2>&1
    step "vit_b_16" 80 python benchmarks/transformer_quant.py --model vit_b_16 --seq 224 --batch 256 --out "$OUT" \
        --profile 14 --variants bf16-unfused-compile,fp8-tensor-fast > "$OUT/explore2-vit.txt" 2>&1
    tail -n 2 "$OUT"/explore2-*.txt ;;
transformers)
    # deepgap run: the quant engine's Linear path beside the fp16 engines, one store; then a bare loop of the
    # same fp8 configuration and of compile-freeze fp16 (the independent check), and the Linear path's GPU tests
    T="$S/transformers.sqlite"; R=(--sweeps 1 --no-cpu-baseline --store "$T")
    step "bert-base 128" 200 python -m deepgap run --models bert-base --seq-lens 128 --batch-sizes 1,256 \
        --engines eager,compile-freeze,quant --precisions fp16,fp8,int8 --thermal-warmup --thermal-timeout 40 \
        "${R[@]}" 2>&1 | stamp > "$OUT/run-bert-base.txt"
    step "vit_b_16" 120 python -m deepgap run --models vit_b_16 --batch-sizes 256 --engines eager,compile-freeze,quant \
        --precisions fp16,fp8 --no-thermal-warmup "${R[@]}" 2>&1 | stamp > "$OUT/run-vit.txt"
    step "bert-large 384" 100 python -m deepgap run --models bert-large --seq-lens 384 --batch-sizes 64 \
        --engines compile-freeze,quant --precisions fp16,fp8 --no-thermal-warmup "${R[@]}" 2>&1 | stamp > "$OUT/run-bert-large.txt"
    python -m deepgap show "$T" --all > "$OUT/transformers-show.txt" 2>&1; pack "$T"
    step "bare loop" 90 python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 --out "$OUT" \
        --variants fp8-tensor-fast,fp16-compile-freeze,fp8-tensor-fast > "$OUT/bare-bert.txt" 2>&1
    step "GPU tests" 90 python -m pytest -q tests/test_quant_linear_gpu.py tests/test_bert_gpu.py -p no:cacheprovider -rA \
        > "$OUT/linear-gpu-tests.txt" 2>&1
    tail -n 3 "$OUT/linear-gpu-tests.txt"
    (cd "$OUT" && tar czf texts.tgz --remove-files run-*.txt transformers-show.txt bare-bert.txt linear-gpu-tests.txt \
        2>/dev/null) ;;
fused)
    # the fused fp8 GEMM + bias + GELU + quantization kernel against cuBLASLt + Inductor, per BERT/ViT MLP shape
    step "fused fp8 GEMM" "${FUSED_LIMIT:-90}" python benchmarks/fp8_gemm_gelu.py --out "$OUT" > "$OUT/fused.txt" 2>&1
    tail -n 4 "$OUT/fused.txt" ;;
fused-bert)
    # the fused MLP kernel inside the whole network (compiled, one CUDA graph) against the engine's default
    step "bert-base fused" "${FUSED_BERT_LIMIT:-60}" python benchmarks/transformer_quant.py --model bert-base --seq 128 \
        --batch 256 --out "$OUT" --variants fp8-tensor-fast,fp8-tensor-fast-fused > "$OUT/fused-bert.txt" 2>&1
    tail -n 2 "$OUT/fused-bert.txt" ;;
*) echo "unknown recipe $what"; exit 2 ;;
esac; done
