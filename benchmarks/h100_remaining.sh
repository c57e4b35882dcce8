#!/usr/bin/env bash
# What two device sessions (2026-11-23) left unmeasured on the H100, as device calls of ≤ 10 minutes each:
# `bash benchmarks/h100_remaining.sh PART` with PART in 1..3; output under $OUT/h100, one .tgz back.
# Each step has its own limit so that a slow one cannot take the others' time; stores come back whole
# (a killed `deepgap run` keeps every configuration it finished; `--resume` completes it).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=${OUT:-out}/h100; mkdir -p "$R"
step() { echo; echo "######## $1 ($(date +%T))"; shift; timeout "$@"; echo "rc=$?"; }
G="--batch-sizes 256,1 --warmup 5 --iterations 20 --repeats 2 --idle-time 0 --memory-formats channels_last"
case "${1:-}" in
1)  # issue 3: harness overhead in interleaved rounds; issue 5: ResNet-101 fp16 after the overflow fix;
    # issue 10: the three-tenant run after the thread-share fix
    step harness 260 python benchmarks/harness_overhead.py --rounds 6 --iterations 60 --out "$R"
    step r101-fp16 60 python -m deepgap run --models resnet101 --engines eager,cudagraph --precisions fp16 $G \
        --store "$R/engines.sqlite" --quiet
    step tenants 240 python -m deepgap serve --model resnet50 --engine cudagraph --precision fp16 \
        --memory-format channels_last --scenario server --tenants resnet50,resnet18,vit_b_16 --slo-p99 15ms \
        --store "$R/serving.sqlite" ;;
2)  # issue 5: fp32 (TF32 off) and NCHW tf32/fp32 for all three models
    step fp32 330 python -m deepgap run --models resnet50,resnet18,resnet101 --engines eager,cudagraph \
        --precisions fp32 $G --store "$R/engines.sqlite" --quiet
    step nchw 230 python -m deepgap run --models resnet50,resnet18,resnet101 --engines eager --precisions tf32,fp32 \
        --batch-sizes 256,1 --warmup 5 --iterations 20 --repeats 2 --idle-time 0 --memory-formats nchw \
        --store "$R/engines.sqlite" --quiet ;;
3)  # issue 5: `compile` for the rest of the grid (one compile per model, precision and batch: ~20–40 s each)
    step compile 560 python -m deepgap run --models resnet18,resnet101,resnet50 --engines compile \
        --precisions fp16,bf16,tf32,fp32 $G --store "$R/engines.sqlite" --quiet ;;
*)  echo "usage: bash benchmarks/h100_remaining.sh 1|2|3" >&2; exit 2 ;;
esac
cd "${OUT:-out}" && tar czf "h100-part${1}.tgz" h100   # one file back (the device returns at most 8)
