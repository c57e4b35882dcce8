#!/usr/bin/env bash
# Session 52 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200. Usage: bash results/h100/session52/device.sh N (the README says each call's commit,
# command and result).
set -uo pipefail
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
echo "device: $gpu"
case ${1:-} in
1) # an H200: issue 47's served capacity and LoadGen x3 (carry .whl); any other card: issue 51's 1B decode with
   # its host-CPU part (session 51's prepared call 8)
   case $gpu in
   *H200*) LIMIT=170 bash results/h100/session46/device.sh 5 ;;
   *) bash results/h100/session51/device.sh 8 ;;
   esac ;;
*) echo "usage: $0 1"; exit 2 ;;
esac
