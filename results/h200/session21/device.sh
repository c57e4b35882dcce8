#!/usr/bin/env bash
# Session 21's recipes on one H200 (run from the repository root by the device tool, $OUT set):
#   pdl      the bare decode loop (benchmarks/llm_decode_loop.py), 8B fp8, batch 1, graphs captured without and
#            with programmatic dependent launch (DEEPGAP_DECODE_PDL=off,on), the top kernels of each
#   hbm      benchmarks/hbm_read.py --pdl: a plain streaming read at the 8B weight matrices' sizes (the GEMVs' ceiling)
#   linear   benchmarks/decode_linear.py --rows 1: every one-row GEMV tile (the reduce-each ones new) per 8B shape
#   sweep8b  deepgap run --workload decode, 8B quant fp8 at batches SWEEP_FP8 (1,512): PDL chosen by timing (auto)
#   serve8b  as session 19's (results/h200/session19/device.sh serve8b); DEEPGAP_SERVE_PREFILL picks the admission
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
pdl)
    step "loop fp8 pdl off,on" "${LOOP_LIMIT:-200}" python benchmarks/llm_decode_loop.py --precision fp8 \
        --batches "${LOOP_BATCHES:-1}" --pdl off,on --profile --out "$OUT" > "$OUT/pdl.txt" 2>&1
    grep "^{" "$OUT/pdl.txt" | cut -c1-600; grep -v "^{" "$OUT/pdl.txt" | tail -n 60 | cut -c1-160 ;;
hbm)
    step "hbm read" "${HBM_LIMIT:-120}" python benchmarks/hbm_read.py --pdl --out "$OUT" > "$OUT/hbm.txt" 2>&1
    tail -n 5 "$OUT/hbm.txt"
    python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]
best={}
for r in rows: best[(r['size'],r['pdl'])]=max(best.get((r['size'],r['pdl']),r), r, key=lambda x:x['TBps'])
[print(k, v) for k, v in best.items()]" "$OUT/hbm_read.jsonl" ;;
linear)
    step "decode linears, one row" "${LINEAR_LIMIT:-150}" python benchmarks/decode_linear.py --rows 1 --out "$OUT" \
        > "$OUT/linear.txt" 2>&1
    python3 -c "import json,sys; rows=[json.loads(l) for l in open(sys.argv[1])]
best={}
for r in rows:
    if r['path'] == 'gemv' and 'tuned' not in (r['tile'] or ''): best[r['shape']]=max(best.get(r['shape'],r), r, key=lambda x:x['GBps'])
[print(k, v['us'], v['GBps'], v['tile']) for k, v in best.items()]" "$OUT/decode_linear.jsonl" ;;
sweep8b|serve8b)
    bash results/h200/session19/device.sh "$1" ;;
*) sed -n 2,8p "$0"; exit 2 ;;
esac
