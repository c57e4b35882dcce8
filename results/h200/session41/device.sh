#!/usr/bin/env bash
# Session 41 (2026-12-05), one H200, issue 47: the device calls as run, from the repository root with $OUT set and
# `.whl/` carried (benchmarks/device_lib.sh).
# Usage: bash results/h200/session41/device.sh N
set -uo pipefail
case ${1:-} in
1) bash results/h200/session34/device.sh 3 ;;  # the later whole-network kernel: phases, GPU tests, the switch's A/B
*) echo "usage: $0 1"; exit 2 ;;
esac
