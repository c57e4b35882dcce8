#!/usr/bin/env bash
# Session 47 (2026-12-06): the calls of this session, from the repository root with $OUT set and `.whl/` carried
# (benchmarks/device_lib.sh). The asks were for nvidia-h200; the machine that came was one H100 80GB HBM3.
# Usage: bash results/h100/session47/device.sh N (the README says each call's command and result).
set -uo pipefail
case ${1:-} in
1) bash results/h100/session46/device.sh 6 ;;  # issue 47: bound-input GPU tests; ResNet-50 bs1 run + bare loop
2) bash results/h100/session46/device.sh 5 ;;  # issue 47: served ratio at --capacity-tol 0.01, LoadGen x3
3) source benchmarks/device_lib.sh  # issue 47: where serve's compute per batch parts from the engine alone
   step "serve gap fp8 bs128" 240 python benchmarks/serve_gap.py --precision fp8 --batch 128 --rounds 3 \
       --out "$OUT/serve-gap.jsonl" > "$OUT/serve-gap.txt" 2>&1
   grep -v '^{' "$OUT/serve-gap.txt" | tail -n 8 ;;
4) source benchmarks/device_lib.sh  # issue 47: the normaliser as one Triton kernel: its GPU tests, step 3 again
   step "normalise GPU tests" 150 python -m pytest -q -m gpu tests/serving/test_normalise_kernel.py -rA \
       -p no:cacheprovider > "$OUT/normalise-gputests.txt" 2>&1
   tail -n 3 "$OUT/normalise-gputests.txt"
   step "serve gap fp8 bs128, Triton normaliser" 240 python benchmarks/serve_gap.py --precision fp8 --batch 128 \
       --rounds 3 --out "$OUT/serve-gap-kernel.jsonl" > "$OUT/serve-gap-kernel.txt" 2>&1
   grep -v '^{' "$OUT/serve-gap-kernel.txt" | tail -n 9 ;;
5) bash results/h100/session46/device.sh 5 ;;  # issue 47: step 2 again, with the Triton normaliser
6) source benchmarks/device_lib.sh  # step 4's timing with the kernel's N specialised (vectorised), then step 5
   step "serve gap fp8 bs128, Triton normaliser, N specialised" 150 python benchmarks/serve_gap.py --precision fp8 \
       --batch 128 --rounds 3 --out "$OUT/serve-gap-kernel2.jsonl" > "$OUT/serve-gap-kernel2.txt" 2>&1
   grep -v '^{' "$OUT/serve-gap-kernel2.txt" | tail -n 8
   bash results/h100/session46/device.sh 5 ;;
7) source benchmarks/device_lib.sh  # every serving GPU test, with the Triton normaliser in serve's path
   step "serving GPU tests" 200 python -m pytest -q -m gpu tests/serving -p no:cacheprovider -x \
       > "$OUT/serving-gputests.txt" 2>&1
   tail -n 5 "$OUT/serving-gputests.txt" ;;
8) # prepared for an H200 (issue 47's goals are there), one call of about 8 min: the served ratio with the Triton
   # normaliser and LoadGen x3 first (its first GPU run of the held engine's candidates, `server.HOLD_WITHIN`),
   # then batch 1 in `deepgap run` and the bare loop
   bash results/h100/session46/device.sh 5
   bash results/h100/session46/device.sh 6 ;;
*) echo "usage: $0 1|2|3|4|5|6|7|8"; exit 2 ;;
esac
