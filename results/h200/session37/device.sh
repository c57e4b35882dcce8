#!/usr/bin/env bash
# Session 37 (2026-12-05), one H200, issue 51: the one-kernel decode step's first timing. The device call as run,
# from the repository root with $OUT set, `.whl/` carried (benchmarks/device_lib.sh), on tree 264bf02. Fourteen
# earlier asks found no machine or lost it before the end; this one used 131 s of the 340 s it was given.
# Usage: bash results/h200/session37/device.sh 1
set -uo pipefail
case ${1:-} in
1) nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
   PHASES_S=150 LOOP_S=150 WHOLE_MODES=off,on,l2,l2+o=8x4096+down=16x2048 bash benchmarks/whole_decode.sh phases loop ;;
*) echo "usage: $0 1"; exit 2 ;;
esac
