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
4) source benchmarks/device_lib.sh; timeout 200 python -m pytest -q -p no:cacheprovider -m gpu tests/roofline ;;  # call 5
5) source benchmarks/device_lib.sh  # call 6: the other GPU tests, 230 s of them
   timeout 230 python -m pytest -q -p no:cacheprovider -m gpu tests --ignore=tests/serving --ignore=tests/roofline \
       -k "not llm and not decode and not llama" -x ;;
7) # prepared (any card, carrying .carry; about 5 min): the 8B serve with serve's default thermal warm-up (at most
   # 60 s): does a warm calibration close the step's 1.4-2.8% (calls 1-3, calibrated cold at the power cap)?
   source benchmarks/device_lib.sh; S=/tmp/dg; mkdir -p $S
   nvidia-smi --query-gpu=utilization.gpu,power.draw,temperature.gpu,clocks.sm --format=csv,noheader -l 10 > "$OUT/smi.txt" &
   step "serve 8b fp8 512 slots, warmed" 540 python -m deepgap serve --model llama-3.1-8b --engine quant \
       --precision fp8 --device cuda --input-len-dist uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 \
       --find-capacity --verify-policies 1 --curve-iterations 20 --kv-cache fp8 --store $S/w.sqlite 2>&1 | stamp > "$OUT/warm.txt"
   kill %1; python -m deepgap export $S/w.sqlite -o "$OUT/serve8b-warm.csv" > /dev/null 2>&1 || true
   grep "serve: " "$OUT/warm.txt" | tail -n 24 ;;
8) # prepared (any card; about 4 min): the 1B decode sweep with its host-CPU part (on by default), which has only
   # run on the 2-core development machine (docs/llm.md, "Not yet built"): its time on a 16-core GPU host
   source benchmarks/device_lib.sh; S=/tmp/dg; mkdir -p $S
   step "decode 1b + host cpu" 500 python -m deepgap run --workload decode --models llama-3.2-1b --device cuda \
       --engines eager,cudagraph --precisions bf16 --batch-sizes 1,8 --input-lens 128 --output-lens 128 --repeats 3 \
       --sweeps 1 --no-thermal-warmup --store $S/d.sqlite 2>&1 | stamp > "$OUT/decode1b.txt"
   pack $S/d.sqlite; python -m deepgap show $S/d.sqlite > "$OUT/show.txt" 2>&1; tail -n 30 "$OUT/decode1b.txt" ;;
*) echo "usage: $0 1|2|3|4|5|7|8"; exit 2 ;;
esac
