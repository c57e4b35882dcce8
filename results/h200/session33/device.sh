#!/usr/bin/env bash
# Session 33 (2026-12-05), one H200, issues 50 and 47. The device calls as run, from the repository root with $OUT
# set, `.whl/` carried (plotly, narwhals, LoadGen cp312; benchmarks/device_lib.sh). Before the first, here:
# PYTHONPATH=/tmp/t36/site:src python benchmarks/compile_sm90.py -j 2 (323 compiles, all ok). Calls 1-4 ran eece19b
# beside an uncommitted CPU-only change (the output-onto-a-store check, committed as d79359a); one machine, warm
# from call 1 to call 4. Usage: bash results/h200/session33/device.sh N
set -uo pipefail
case ${1:-} in
1) LIMIT=400 bash benchmarks/text_lengths.sh bertlarge gputests ;;   # bert-large full, packed, padded; text GPU tests
2) LOOP_LIMIT=200 bash benchmarks/text_lengths.sh loop              # the bare loop on the packed batch
   bash benchmarks/head_stem.sh tests engine ;;                     # head pool + s2d + PDL GPU tests; rn50 fp8 bs 1, 1024
3) TEST_LIMIT=470 bash benchmarks/device.sh gputests ;;             # every GPU test, then the real-clock ones alone
4) bash benchmarks/head_stem.sh loop ;;                             # the bare loop, rn50 fp8 at 1024
*) echo "usage: $0 1|2|3|4"; exit 2 ;;
esac
