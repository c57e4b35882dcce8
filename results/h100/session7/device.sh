#!/usr/bin/env bash
# Seventh H100 session. Usage on the device: bash results/h100/session7/device.sh STEP...
#   buildtime — benchmarks/quant_build_time.py twice, each in a fresh process (what the disk caches save)
#   mem       — ResNet-50 eager fp16 at batch 256, 1 sweep: the peak-memory fields (torch, NVML sampled max)
#   default   — the default GPU sweep (`gpu` preset; resumable)
#   quantbench — benchmarks/quant.py (ResNet-50 headline rows, per-layer table) into /tmp/s7/quant
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s7; mkdir -p $S
for what in "$@"; do case $what in
buildtime)
    step "quant build, cold process 1" 150 python benchmarks/quant_build_time.py --model resnet50 --precision int8 --batch 1
    step "quant build, cold process 2" 150 python benchmarks/quant_build_time.py --model resnet50 --precision int8 --batch 1 ;;
mem)
    step "peak memory" 120 python -m deepgap run --models resnet50 --engines eager --precisions fp16 \
        --batch-sizes 256 --sweeps 1 --store $S/mem.sqlite
    python -m deepgap show --store $S/mem.sqlite 2>&1 | tail -20
    python3 -c "import sqlite3,json,sys;c=sqlite3.connect(sys.argv[1])
for a,r,d,e in c.execute('select peak_mem_allocated_bytes, peak_mem_reserved_bytes, device_mem_used_bytes, extra_json from results'):
    print('torch peak allocated', a, 'reserved', r, 'NVML used (max sampled)', d, 'prepare peak', json.loads(e).get('prepare_peak_mem_bytes'))" $S/mem.sqlite
    pack $S/mem.sqlite ;;
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
