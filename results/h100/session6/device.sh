#!/usr/bin/env bash
# Sixth H100 session. Usage on the device: bash results/h100/session6/device.sh STEP...
#   quant    — quant int8/fp8, ResNet-18/50/101, every paper batch size (1 sweep; resumable)
#   serving  — benchmarks/serving.py, quant int8 with LoadGen (its Server capacity searched) and cudagraph fp16
#   harness  — benchmarks/harness_overhead.py --mode paired for compile-freeze fp16 and quant int8
#   default  — the default GPU sweep (`gpu` preset; resumable)
#   quantbench — benchmarks/quant.py (ResNet-50 headline rows, per-layer table, ablations) into /tmp/s6/quant
# Stores live in /tmp/s6 on the device (the tool's working-tree sync deletes files in the repository
# folder between calls) and are gzipped into $OUT after every step.
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s6; mkdir -p $S
for what in "$@"; do case $what in
quant)
    R=(); [ -f $S/quant-batches.sqlite ] && R=(--resume)
    step "quant, every paper batch" "${QUANT_LIMIT:-540}" python -m deepgap run --models resnet18,resnet50,resnet101 \
        --engines quant --precisions int8,fp8 --memory-formats channels_last \
        --batch-sizes 1,2,4,8,16,32,64,128,256,384,512 --sweeps 1 --store $S/quant-batches.sqlite "${R[@]}"
    pack $S/quant-batches.sqlite ;;
serving)
    step "serving quant int8" 260 python benchmarks/serving.py --engine quant --precision int8 \
        --memory-format channels_last --batch-sizes 32,64,128,256 --slo 15ms --loadgen \
        --serve-args "--verify-policies 1" --store $S/serving-int8.sqlite --out $OUT/serving-int8.json
    pack $S/serving-int8.sqlite ;;
harness)
    step "harness overhead compile-freeze" 240 python benchmarks/harness_overhead.py --mode paired \
        --engine compile-freeze --batch-sizes 1,32,256 --rounds 1 --blocks 2 --out $OUT
    step "harness overhead quant int8" 120 python benchmarks/harness_overhead.py --mode paired \
        --engine quant --precision int8 --batch-sizes 1,32,256 --rounds 1 --blocks 2 --out $OUT ;;
default)
    R=(); [ -f $S/default.sqlite ] && R=(--resume)
    step "default GPU sweep" "${DEFAULT_LIMIT:-560}" python -m deepgap run --store $S/default.sqlite "${R[@]}"
    pack $S/default.sqlite ;;
quantbench)
    step "benchmarks/quant.py" 300 python benchmarks/quant.py --batch-sizes 256,1 --iterations 30 --budget-s 60 \
        --out $S/quant
    cp $S/quant/quant.json $OUT/quant${QB_TAG:-}.json; pack $S/quant/quant.sqlite
    mv $OUT/quant.sqlite.gz $OUT/quant${QB_TAG:-}.sqlite.gz ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
