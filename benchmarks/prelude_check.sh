#!/usr/bin/env bash
# The run-level prelude (idle baseline, thermal warm-up) of serve and of a local fleet, on one GPU (~1-2 min).
# Usage, from the repository root on the device: bash benchmarks/prelude_check.sh [OUT_DIR]   (default /tmp/prelude)
#   1. deepgap serve: resnet18 fp16, offline scenario (at most 3 levels, one per candidate batch), with a
#      thermal warm-up capped at 20 s; its run row, idle and thermal rows go to OUT_DIR/serve.sqlite
#   2. deepgap run --devices cuda:0: a one-GPU local fleet of two tiny configurations (tinycnn, batches 1
#      and 2), the same warm-up cap; OUT_DIR/fleet.sqlite
#   then deepgap show on each store and the stored idle / thermal summaries of each run.
set -euo pipefail
OUT_DIR=${1:-/tmp/prelude}
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/serve.sqlite* "$OUT_DIR"/fleet.sqlite*
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
WARM=(--thermal-warmup --thermal-timeout 20 --thermal-window 10)

echo "== serve: resnet18 fp16, offline, thermal warm-up capped at 20 s"
time "$PY" -m deepgap serve --model resnet18 --precision fp16 --device cuda --scenario offline \
    --batch-sizes 1,8,32,64 --curve-iterations 30 --min-queries 2048 --min-duration 1s "${WARM[@]}" \
    --store "$OUT_DIR/serve.sqlite"

echo "== fleet: --devices cuda:0, tinycnn batches 1 and 2"
time "$PY" -m deepgap run --devices cuda:0 --models tinycnn --engines eager --precisions fp32 \
    --batch-sizes 1,2 --sweeps 1 --warmup 5 --iterations 20 --repeats 2 --target-ci off "${WARM[@]}" \
    --store "$OUT_DIR/fleet.sqlite"

for store in "$OUT_DIR/serve.sqlite" "$OUT_DIR/fleet.sqlite"; do
    echo "== deepgap show $store"
    "$PY" -m deepgap show "$store" --runs
    "$PY" -m deepgap show "$store"
    echo "-- idle / thermal of each run"
    "$PY" - "$store" <<'EOF'
import sys

from deepgap.store import Store
from deepgap.drive.prelude import run_summaries

s = Store(sys.argv[1], readonly=True)
for run in s.runs():
    summ = run_summaries(s, run["run_id"])
    print(f"run {run['run_id']} kind={run.get('kind')} status={run['status']} "
          f"device={run['env'].get('device_name', '')}")
    for idle in summ["idle"]:
        print(f"  idle: {idle.get('status')}, {idle.get('idle_power_w')} W, backend {idle.get('backend')}")
    for t in summ["thermal"]:
        print(f"  thermal: {t.get('status')}, stopped by {t.get('stopped_by')} after {t.get('duration_s')} s, "
              f"{t.get('temp_start_c')} -> {t.get('temp_end_c')} C, steady SM clock {t.get('steady_sm_clock_mhz')} MHz")
    if not summ["idle"]:
        print("  NO idle baseline stored")
s.close()
EOF
done
