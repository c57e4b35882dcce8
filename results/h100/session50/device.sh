#!/usr/bin/env bash
# Session 50 (2026-12-06): the calls of this session, from the repository root with $OUT set (benchmarks/device_lib.sh).
# Every ask was for nvidia-h200; every call ran on one NVIDIA H100 80GB HBM3. Usage: bash results/h100/session50/device.sh N
# (the README says each call's commit, command and result).
set -uo pipefail
SERVE=(python -m deepgap serve --model llama-3.1-8b --engine quant --precision fp8 --device cuda --input-len-dist
       uniform:64:256 --output-len-dist fixed:128 --batch-sizes 512 --find-capacity --verify-policies 1
       --curve-iterations 20 --kv-cache fp8)
case ${1:-} in
1) # at 069b1f2: session 49's prepared call 7 (its call 6 again, thermal warm-up included), chosen on the card
   if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash results/h100/session46/device.sh 5
   else bash results/h100/session49/device.sh 7; fi ;;
2) source benchmarks/device_lib.sh  # at 069b1f2: call 1 without the warm-up; stacks dumped (SIGABRT, PYTHONFAULTHANDLER)
   # if no "simulating" line came within 240 s, with nvidia-smi's view of the GPU then
   S=/tmp/dg; mkdir -p $S; export PYTHONFAULTHANDLER=1
   "${SERVE[@]}" --no-thermal-warmup --store $S/d.sqlite > "$OUT/diag.txt" 2>&1 &
   pid=$!; t0=$SECONDS
   for _ in $(seq 1 48); do sleep 5; grep -q "simulating" "$OUT/diag.txt" && break; done
   if ! grep -q simulating "$OUT/diag.txt"; then nvidia-smi > "$OUT/smi.txt"; pgrep -af python > "$OUT/ps.txt"
       py=$(pgrep -f "deepgap serve|multiprocessing"); kill -ABRT $py; sleep 5; kill -9 $py 2>/dev/null; fi
   wait $pid; echo "rc=$? after $((SECONDS - t0)) s" ;;
3) source benchmarks/device_lib.sh  # call 2 at 069b1f2 and at 7f8ca28 (session 49 call 6's source, which built
   # in that session), 200 s each; the variant's source from `git archive 7f8ca28 src` under variants/v0/
   for v in head:$PWD/src v0:$PWD/variants/v0/src; do name=${v%%:*}; t0=$SECONDS
       PYTHONPATH=${v#*:}:/tmp/site "${SERVE[@]}" --no-thermal-warmup --store /tmp/dg/$name.sqlite > "$OUT/$name.txt" 2>&1 &
       pid=$!; while [ $((SECONDS - t0)) -lt 200 ]; do sleep 20; grep -q simulating "$OUT/$name.txt" && break; done
       echo "$name: simulating? $(grep -c simulating "$OUT/$name.txt") after $((SECONDS - t0)) s"
       pkill -9 -f "deepgap serve"; pkill -9 -f multiprocessing; pkill -9 -f compile_worker; wait $pid; sleep 3
   done ;;
4) source benchmarks/device_lib.sh  # the set-up's phases said as they end (deepgap.core.progress), each line
   # stamped with its second: where the 8B server's set-up spends its minutes, or where it stops
   S=/tmp/dg; mkdir -p $S
   nvidia-smi --query-gpu=utilization.gpu,power.draw,temperature.gpu --format=csv,noheader -l 10 > "$OUT/smi.txt" &
   step "serve 8b fp8 512 slots, set-up phases" ${LIMIT:-300} "${SERVE[@]}" --no-thermal-warmup --store $S/p.sqlite \
       2>&1 | stamp > "$OUT/phases.txt"
   kill %1; python -m deepgap export $S/p.sqlite -o "$OUT/serve8b-phases.csv" > /dev/null 2>&1 || true
   grep "serve: " "$OUT/phases.txt" | tail -n 20 ;;
5) # prepared (any card, cold): call 4 given 520 s, then the compile caches saved into $OUT (`cache_save`). Here:
   # `cat out-compile-cache.txz.* > .carry/compile-cache.tar.xz`, and carry ".carry" in the calls after it
   source benchmarks/device_lib.sh; LIMIT=520 bash "$0" 4; cache_save ;;
6) # prepared (carry .carry from call 5): call 4 again from the carried caches, to its capacity (540 s): the
   # set-up's phases against call 5's, and measured / predicted against session 49's 0.976 (cold, H100)
   source benchmarks/device_lib.sh; LIMIT=540 bash "$0" 4 ;;
*) echo "usage: $0 1|2|3|4|5|6"; exit 2 ;;
esac
