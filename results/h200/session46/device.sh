#!/usr/bin/env bash
# Session 46 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). Usage: bash results/h200/session46/device.sh N (the README says each).
set -uo pipefail
case ${1:-} in
1) bash results/h200/session45/device.sh 4 ;;  # issue 51, batch 1: GEMV tiles timed cached vs streamed
2) # issue 47: served capacity against the engine alone held >= 1 s back to back (its burst beside it), and
   # LoadGen at that capacity, three consecutive runs of quant fp8, then the summary
   S=${DEVICE_WORK:-/tmp/deepgap-device}/loadgen LIMIT=${LIMIT:-150} bash benchmarks/loadgen_confirm.sh \
       fp8-1 fp8-2 fp8-3 summary
   grep -h "engine alone" "$OUT"/fp8-*.txt ;;
*) echo "usage: $0 1|2"; exit 2 ;;
esac
