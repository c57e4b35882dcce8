#!/usr/bin/env bash
# Ninth H100 session. Usage on the device: bash results/h100/session9/device.sh STEP...
#   setup    — benchmarks/setup_time.py: quant and compile-freeze set-up in fresh processes, caches cold then
#              warm (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR, DEEPGAP_CACHE under $S/cache)
#   precompile — the quant engine's cold set-up with and without compiling the tile candidates on a thread pool,
#              then the quant engine's GPU tests
#   default  — the default GPU sweep (`deepgap run`, gpu preset) from cold caches of its own; a second call with
#              the same step resumes it (DEFAULT_LIMIT: this call's time limit)
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s9; mkdir -p $S
for what in "$@"; do case $what in
setup)
    export TRITON_CACHE_DIR=$S/cache/triton TORCHINDUCTOR_CACHE_DIR=$S/cache/inductor DEEPGAP_CACHE=$S/cache/deepgap
    rm -rf $S/cache
    for c in "quant resnet18 int8 1" "quant resnet18 int8 256" "quant resnet18 int8 256" "quant resnet101 int8 256" \
             "quant resnet101 int8 256" "compile-freeze resnet101 fp16 256" "compile-freeze resnet101 fp16 256"; do
        set -- $c
        step "setup $c" 120 python benchmarks/setup_time.py --engine $1 --model $2 --precision $3 --batch $4 \
            --top 30 --json $OUT/setup_time.jsonl > $OUT/setup-$1-$2-$3-$4-$(date +%s).txt 2>&1
        tail -1 $OUT/setup_time.jsonl | cut -c1-400
    done ;;
precompile)
    # the quant engine's set-up with cold caches, tile candidates compiled one by one vs on a thread pool
    for w in 0 16 0 16; do
        export TRITON_CACHE_DIR=$S/pc$w/triton DEEPGAP_CACHE=$S/pc$w/deepgap; rm -rf $S/pc$w
        step "quant set-up, cold caches, precompile workers $w" 150 python benchmarks/setup_time.py --engine quant \
            --model resnet50 --precision int8 --batch 1 --no-profile --precompile-workers $w --json $OUT/precompile.jsonl
        tail -1 $OUT/precompile.jsonl | cut -c1-600
    done
    step "quant GPU tests" 300 python -m pytest -q -x tests -k "quant or stem or graph_runner" -p no:cacheprovider 2>&1 | tail -5 ;;
default)
    export TRITON_CACHE_DIR=$S/dc/triton TORCHINDUCTOR_CACHE_DIR=$S/dc/inductor DEEPGAP_CACHE=$S/dc/deepgap
    R=(); if [ -f $S/default.sqlite ]; then R=(--resume); else rm -rf $S/dc; fi
    step "default GPU sweep" "${DEFAULT_LIMIT:-560}" python -m deepgap run --store $S/default.sqlite "${R[@]}"
    pack $S/default.sqlite ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
