#!/usr/bin/env bash
# What three device sessions (2026-11-23) left unmeasured on the H100, as device calls of ≤ 10 minutes each:
# `bash benchmarks/h100_remaining.sh PART` with PART in 1..2; output under $OUT/h100, one .tgz back.
# Each step has its own limit so that a slow one cannot take the others' time; stores come back whole
# (a killed `deepgap run` keeps every configuration it finished; the harness rewrites its JSON per round).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=${OUT:-out}/h100; mkdir -p "$R"
step() { echo; echo "######## $1 ($(date +%T))"; shift; timeout "$@"; echo "rc=$?"; }
B="--warmup 5 --iterations 20 --repeats 2 --idle-time 0 --store $R/engines.sqlite --quiet"
case "${1:-}" in
1)  # issue 3: more interleaved rounds on top of the committed six (same settings), until bs 1 and 32 decide;
    # issue 10: the three tenants with the per-request-copy server
    cp results/h100/harness_overhead.json "$R/"
    step harness 330 python benchmarks/harness_overhead.py --batch-sizes 1,32,256 --iterations 60 --rounds 8 \
        --continue --out "$R"
    step tenants 240 python -m deepgap serve --model resnet50 --engine cudagraph --precision fp16 \
        --memory-format channels_last --scenario server --tenants resnet50,resnet18,vit_b_16 --slo-p99 15ms \
        --store "$R/serving-tenants.sqlite" ;;
2)  # issue 5: compile at batch 1 beyond fp16, ResNet-101 compile fp32, ResNet-101 NCHW fp16 after the fix,
    # ORT int8 on the host CPU (its calibration needs more than 150 s there)
    step r101-nchw 40 python -m deepgap run --models resnet101 --engines eager --precisions fp16 --batch-sizes 256,1 \
        --memory-formats nchw $B
    step compile 330 python -m deepgap run --models resnet101,resnet18,resnet50 --engines compile \
        --precisions fp32,fp16,bf16,tf32 --batch-sizes 1 --memory-formats channels_last $B
    step compile-r101 60 python -m deepgap run --models resnet101 --engines compile --precisions fp32 \
        --batch-sizes 256 --memory-formats channels_last $B
    step ort-int8 150 python -m deepgap run --models resnet50 --engines onnxruntime --precisions int8 --device cpu \
        --threads 16 --batch-sizes 32,1 --warmup 3 --iterations 20 --repeats 2 --idle-time 0 \
        --store "$R/ort-cpu.sqlite" --quiet ;;
*)  echo "usage: bash benchmarks/h100_remaining.sh 1|2" >&2; exit 2 ;;
esac
cd "${OUT:-out}" && tar czf "h100-part${1}.tgz" h100   # one file back (the device returns at most 8)
