#!/usr/bin/env bash
# Session 34 (2026-12-05), one H200, issue 47: the whole-network kernel (`quant.whole`) at batch 1. The device calls
# as run, from the repository root with $OUT set, `.whl/` carried (benchmarks/device_lib.sh). A third call (the
# kernel with K steps of 128, the next row read before each barrier, the epilogue's operands before the K loop,
# and dataflow counters in place of barriers: `bash results/h200/session34/device.sh 3`) found no machine, and
# then loans were paused for the session.
# Usage: bash results/h200/session34/device.sh N
set -uo pipefail
case ${1:-} in
1) bash benchmarks/whole_net.sh tests ab ;;   # 07740d0: GPU tests; rn50 quant fp8/int8 bs1, DEEPGAP_QUANT_WHOLE off/on
2) source benchmarks/device_lib.sh            # aa3b332: where the time goes, phase by phase
   step "whole phases" 560 python benchmarks/whole_phases.py --models resnet50 --precisions fp8,int8 \
       --out "$OUT/whole-phases.jsonl" > "$OUT/whole-phases.txt" 2>&1 ;;
3) source benchmarks/device_lib.sh            # not run (no machine): the same on the later kernel, then its GPU tests
   step "whole phases" 400 python benchmarks/whole_phases.py --models resnet50 --precisions fp8 \
       --out "$OUT/whole-phases.jsonl" > "$OUT/whole-phases.txt" 2>&1
   step "whole GPU tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_quant_whole_gpu.py -x -rA \
       -p no:cacheprovider > "$OUT/whole-gputests.txt" 2>&1
   bash benchmarks/whole_net.sh ab ;;         # the engine's choice (barriers and dataflow plans), off and on
*) echo "usage: $0 1|2|3"; exit 2 ;;
esac
