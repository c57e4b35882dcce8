#!/usr/bin/env bash
# Session 45 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). Usage: bash results/h200/session45/device.sh N (the README says each).
set -uo pipefail
case ${1:-} in
1) # issue 51: the compiled prefill at batch 512 (the loop: eager, row kernel, compiled), then `deepgap run`
   # at batches 512 and 1024 with the compiled prefill (offline output tokens/s at the best batch)
   RUN_BATCHES=512,1024 RUN_LIMIT=360 bash results/h200/session44/device.sh 2 ;;
2) bash results/h200/session44/device.sh 3 ;;  # served 8B: admissions eager, then compiled
3) bash results/h200/session44/device.sh 1 ;;  # batch-1 decode row, shortcut branch A/B (prefill eager)
*) echo "usage: $0 1|2|3"; exit 2 ;;
esac
