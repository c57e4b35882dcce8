#!/usr/bin/env bash
# Fifth H100 session, last call (the machine's 30 held minutes end with it): finish the default sweep
# (resumed from /tmp/s5, where the previous call left it), serve quant int8 over a service curve, and
# benchmarks/serving.py for quant int8 (with LoadGen) and cudagraph fp16. Every store gzipped into $OUT.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
S=/tmp/s5; mkdir -p $S
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=$PYTHONPATH:/tmp/site
step() { local n=$1 l=$2; shift 2; echo "######## $n ($(date +%T), limit ${l}s)"; local t0=$SECONDS
         timeout "$l" "$@"; echo "######## $n: rc=$? in $((SECONDS - t0))s"; }
pack() { python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$1" \
         && gzip -c "$1" > "$OUT/$(basename "$1").gz"; }
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
