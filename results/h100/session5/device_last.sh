#!/usr/bin/env bash
# Fifth H100 session, last call (the machine's 30 held minutes end with it): finish the default sweep
# (resumed from /tmp/s5, where the previous call left it), serve quant int8 over a service curve, and
# benchmarks/serving.py for quant int8 (with LoadGen) and cudagraph fp16. Every store gzipped into $OUT.
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s5; mkdir -p $S
step "default sweep, resumed" 150 python -m deepgap run --resume --store $S/default.sqlite
pack $S/default.sqlite
step "serve quant int8 offline" 70 python -m deepgap serve --model resnet50 --engine quant --precision int8 \
    --memory-format channels_last --scenario offline --batch-sizes 1,8,32,64,128,256 --store $S/serve-quant.sqlite
pack $S/serve-quant.sqlite
step "serving quant int8" 200 python benchmarks/serving.py --engine quant --precision int8 --memory-format channels_last \
    --batch-sizes 32,64,128,256 --slo 15ms --loadgen --serve-args "--verify-policies 1" \
    --store $S/serving-int8.sqlite --out $OUT/serving-int8.json
pack $S/serving-int8.sqlite
step "serving cudagraph fp16" 110 python benchmarks/serving.py --engine cudagraph --precision fp16 \
    --memory-format channels_last --batch-sizes 16,32,64,128 --slo 15ms --serve-args "--verify-policies 1" \
    --store $S/serving-fp16.sqlite --out $OUT/serving-fp16.json
pack $S/serving-fp16.sqlite
