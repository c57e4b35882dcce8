#!/usr/bin/env bash
# What the 2026-11-23 session could not run on the H100 (its device time ran out), as device calls of
# ≤ 10 minutes each: `bash benchmarks/h100_remaining.sh PART` with PART in 1..6, output under $OUT/h100.
# Each step has its own limit so that a slow one cannot take the others' time; the stores come back whole.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=${OUT:-out}/h100; mkdir -p "$R"
step() { echo; echo "######## $1 ($(date +%T))"; shift; timeout "$@"; echo "rc=$?"; }
case "${1:-}" in
1)  # issue 3: harness overhead; the default (gpu preset) sweep's wall time against its 10-minute budget
    step harness 200 python benchmarks/harness_overhead.py --out "$R"
    step default 380 bash -c "time python -m deepgap run --quiet --store $R/default.sqlite" ;;
2|5|6)  # issue 5: the engines grid, one model per call (2: resnet50 + ORT on the CPU, 5: resnet18, 6: resnet101)
    m=$([ "$1" = 2 ] && echo resnet50 || ([ "$1" = 5 ] && echo resnet18 || echo resnet101))
    step "engines-$m" 480 python benchmarks/engines.py --model "$m" --engines eager,cudagraph,compile-freeze \
        --batch-sizes 1,256 --iterations 30 --store "$R/engines-$m.sqlite"
    [ "$1" = 2 ] && step ort-cpu 60 python -m deepgap run --device cpu --models resnet50 --engines onnxruntime \
        --precisions fp32,int8 --batch-sizes 1,8 --threads 16 --iterations 20 --store "$R/engines-ort.sqlite" --quiet ;;
3)  # issue 7: peaks and rooflines; issue 8: the quant benchmark again (fixed int8 probe, compile-freeze baseline)
    step peaks 60 python -m deepgap peaks --store "$R/roofline.sqlite"
    step profile-infer 90 python -m deepgap profile --models resnet18,resnet50,resnet101 --precisions fp16 \
        --batch-sizes 64 --steps 10 --store "$R/roofline.sqlite" --quiet
    step profile-train 120 python -m deepgap profile --models resnet50,vit_b_16,mobilenet_v3_large --mode train \
        --precisions fp16 --batch-sizes 64 --steps 5 --store "$R/roofline.sqlite" --quiet
    step quant 300 python benchmarks/quant.py --batch-sizes 256,32,1 --budget-s 200 --out "$R/quant" ;;
4)  # issue 10: serving
    step serving 560 python benchmarks/serving.py --tenants resnet50,resnet18,vit_b_16 --store "$R/serving.sqlite" \
        --out "$R/serving.json" ;;
*)  echo "usage: bash benchmarks/h100_remaining.sh 1|2|3|4|5|6" >&2; exit 2 ;;
esac
cd "${OUT:-out}" && tar czf "h100-part${1}.tgz" h100   # one file back (the device returns at most 8)
