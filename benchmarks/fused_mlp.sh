#!/usr/bin/env bash
# Issue 50's fused MLP kernel on the persistent TMA GEMM core, first GPU run (device kind nvidia-h200), from the
# repository root, $OUT set:   bash benchmarks/fused_mlp.sh STEP...   (all = kernels network: one call)
# Steps (each well inside one device call; estimates, not yet run):
#   tests    — tests/measure/quant/test_quant_linear_persistent_gpu.py: every persistent tile vs cuBLASLt at bert-base's and
#              ViT-B/16's four Linear shapes (batch 256), tinybert fused on it compiled and captured (~2 min)
#   kernels  — benchmarks/fp8_gemm_gelu.py: per shape, cuBLASLt + Inductor vs the grouped fused kernel's tiles vs
#              the persistent ones; a table of the best of each at the end (~3-4 min) → fp8_gemm_gelu.jsonl
#   network  — bert-base seq 128 batch 256 by benchmarks/transformer_quant.py's bare loop: fp16 compile-freeze,
#              fp8 (cuBLASLt + Inductor), fp8 fused on the grouped core, on the persistent core, and tuned per
#              shape; a table of seq/s and the ratio to fp16 compile-freeze at the end (~2-3 min)
#   epilogue — benchmarks/fp8_epilogue.py: the persistent fused kernel at bert-base's and ViT's ff1 with more of
#              its epilogue each time (bias bf16; bias fp8; bias + erf GELU bf16; + erf GELU fp8, today's;
#              + tanh GELU fp8; + erf-poly GELU fp8), cuBLASLt beside; µs, TFLOP/s, µs beyond bias-only per tile
#              (~40-60 s)
#   engine   — deepgap run, one sweep: bert-base seq 128 and vit_b_16 at batch 256, eager fp16, compile-freeze
#              fp16 and quant fp8 (fused MLP + tuned Linears: DEEPGAP_QUANT_FUSED=tuned, the default since session 24); no thermal warm-up,
#              no CPU baseline; store packed and exported to CSV, each quant row's kernels printed (~120-190 s)
#              (ENGINE_MODELS, ENGINE_SEQ, ENGINE_BATCH change the three: ENGINE_MODELS=bert-large ENGINE_SEQ=384
#              ENGINE_BATCH=128 for issue 50's bert-large goal)
#   engine-network — the bare loop of the engine's choice: bert-base fp8 -fused-engine, -fused-engine-erfpoly,
#              -fused-engine-tanh, beside fp16 compile-freeze and fp8 cuBLASLt (~2-3 min)
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, step(), pack()
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
[ $# -gt 0 ] || { sed -n 2,22p "$0"; exit 2; }
[ "$*" = all ] && set -- kernels network
for what in "$@"; do case $what in
tests)
    step "fused MLP GPU tests" 300 python -m pytest -v -rA tests/measure/quant/test_quant_linear_persistent_gpu.py \
        tests/measure/quant/test_quant_linear_gpu.py -k "fused or persistent" -p no:cacheprovider > "$OUT/fused-gputests.txt" 2>&1
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/fused-gputests.txt" | cut -c1-220 ;;
kernels)
    step "fused kernels per shape" 330 python benchmarks/fp8_gemm_gelu.py --out "$OUT" > "$OUT/fp8_gemm_gelu.txt" 2>&1
    grep -v '^{' "$OUT/fp8_gemm_gelu.txt" | tail -n 40 ;;
network)
    step "bert-base network" 240 python benchmarks/transformer_quant.py --model bert-base --seq 128 --batch 256 \
        --variants fp16-compile-freeze,fp8-tensor-fast,fp8-tensor-fast-fused,fp8-tensor-fast-fused-persistent,fp8-tensor-fast-fused-tuned \
        --out "$OUT" > "$OUT/fused-network.txt" 2>&1
    grep -v '^{' "$OUT/fused-network.txt" | tail -n 12; grep -o '"tuned_tiles": {[^}]*}' "$OUT/fused-network.txt" ;;
epilogue)
    step "fused epilogue, part by part" 90 python benchmarks/fp8_epilogue.py --out "$OUT" > "$OUT/fp8_epilogue.txt" 2>&1
    grep -v '^{' "$OUT/fp8_epilogue.txt" | tail -n 16 ;;
engine)
    E="$S/engine.sqlite"; rm -f "$E"
    step "engine: ${ENGINE_MODELS:-bert-base,vit_b_16}" 230 env DEEPGAP_QUANT_FUSED="${QUANT_FUSED:-tuned}" python -m deepgap run \
        --models "${ENGINE_MODELS:-bert-base,vit_b_16}" --seq-lens "${ENGINE_SEQ:-128}" --batch-sizes "${ENGINE_BATCH:-256}" --engines eager,compile-freeze,quant --precisions fp16,fp8 --sweeps 1 --no-thermal-warmup \
        --no-cpu-baseline --store "$E" 2>&1 | stamp > "$OUT/engine.txt"
    tail -n 14 "$OUT/engine.txt"; pack "$E"
    python -m deepgap export "$E" --format json -o "$OUT/engine.json" >/dev/null 2>&1
    python3 - "$OUT/engine.json" <<'PY'
import json, sys
def walk(v):  # every engine_info that names its Linears' kernels, wherever the export nests it
    if isinstance(v, dict):
        if "linear_kernels" in v:
            yield v
        for x in v.values():
            yield from walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from walk(x)
for info in walk(json.load(open(sys.argv[1]))):
    print("fused:", info.get("fused"))
    for k in info["linear_kernels"]:
        print(f"  {k['shape']:>18} {k['kernel']:<22} {k['tile']:<48} {len(k['names']):>3}x {k['epilogue']}")
PY
    ;;
engine-network)
    step "bert-base network, the engine's choice" 240 python benchmarks/transformer_quant.py --model bert-base --seq 128 \
        --batch 256 --variants fp16-compile-freeze,fp8-tensor-fast,fp8-tensor-fast-fused-engine,fp8-tensor-fast-fused-engine-erfpoly,fp8-tensor-fast-fused-engine-tanh \
        --out "$OUT" > "$OUT/engine-network.txt" 2>&1
    grep -v '^{' "$OUT/engine-network.txt" | tail -n 8; grep -o '"tuned_tiles": {[^}]*}' "$OUT/engine-network.txt" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
