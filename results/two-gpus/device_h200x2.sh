#!/usr/bin/env bash
# Issue 11 on a two-GPU machine (device kind nvidia-h200-x2), from the repository root there, with .carry
# carried (see prepare_ray_carry.sh). Writes results/h200x2-like output under $OUT: one GPU, --devices all,
# --ray local, each into its own store, and prints the wall times and speed-ups (goal ≥ 1.9×).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
mkdir -p /tmp/site && tar xJf .carry/ray/ray-*-slim.tar.xz -C /tmp/site && \
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry/ray/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
SWEEP=(--models resnet18,resnet50 --precisions fp16 --batch-sizes 1,8,32,128 --iterations 50 --repeats 3
       --target-ci off --quiet --no-telemetry)
R=${OUT:-out}/h200x2; mkdir -p "$R"
now() { python3 -c 'import time; print(time.time())'; }
t() { local s; s=$(now); "$@"; local rc=$?; python3 -c "print($(now) - $s)" > "$R/.t"; return $rc; }
t python3 -m deepgap run "${SWEEP[@]}" --device cuda:0 --store "$R/one-gpu.sqlite"; T1=$(cat "$R/.t")
t python3 -m deepgap run "${SWEEP[@]}" --devices all --store "$R/devices-all.sqlite"; T2=$(cat "$R/.t")
t python3 -m deepgap run "${SWEEP[@]}" --ray local --store "$R/ray.sqlite"; T3=$(cat "$R/.t")
printf '| mode | wall s | speed-up over one GPU |\n|---|---:|---:|\n' | tee "$R/speedup.md"
for row in "one GPU:$T1" "--devices all:$T2" "--ray local:$T3"; do
  n=${row%%:*}; s=${row##*:}; printf '| %s | %.1f | %.2f× |\n' "$n" "$s" "$(python3 -c "print($T1 / $s)")" | tee -a "$R/speedup.md"
done
python3 -m deepgap merge "$R/one-gpu.sqlite" "$R/devices-all.sqlite" "$R/ray.sqlite" -o "$R/all.sqlite"
