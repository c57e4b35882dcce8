#!/usr/bin/env bash
# Session 51 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200; each call ran on one NVIDIA H100 80GB HBM3. Usage: bash results/h100/session51/device.sh N
# (the README says each call's commit, command and result). Calls 1-2 were session 50's prepared calls 5 and 6.
set -uo pipefail
case ${1:-} in
1) bash results/h100/session50/device.sh 5 ;;  # at 6b73e95: cold, then the compile caches saved
2) bash results/h100/session50/device.sh 6 ;;  # at 6b73e95, carrying .carry from call 1
3) # the prefill traced once (specialize_float), the check on the prepared 512-slot step, the first prefill bucket
   # said apart; carrying .carry from call 1 (the decode step's entries hit, the prefill's are new): the GPU test
   # of compiled packed buckets, the serve to its capacity, the caches saved, then the serve again on warm caches
   source benchmarks/device_lib.sh
   step "gpu test: packed buckets compiled" 60 python -m pytest -q -p no:cacheprovider -m gpu \
       tests/serving/test_llm_packed_compile.py 2>&1 | tail -n 3
   LIMIT=300 bash results/h100/session50/device.sh 4; mv "$OUT/phases.txt" "$OUT/phases-cold.txt"
   mv "$OUT/serve8b-phases.csv" "$OUT/serve8b-cold.csv"; mv "$OUT/smi.txt" "$OUT/smi-cold.txt"; cache_save
   LIMIT=170 bash results/h100/session50/device.sh 4 ;;
*) echo "usage: $0 1|2|3"; exit 2 ;;
esac
