#!/usr/bin/env bash
# What four device sessions (2026-11-23) left open on the H100, as one device call of <= 10 minutes:
# `bash results/h100/device_remaining.sh`; output under $OUT/h100, one .tgz back.
# Eager ResNet-50 fp16 at batches 1 and 32 has no 2% harness verdict: on the machines lent so far the
# host's launch pace wandered by more than 2% for the bare loop itself (results/h100/README.md, "Fourth
# device session"). On a quieter host, paired rounds added to the committed three may decide it; the
# JSON is rewritten after every round, so the step limit costs at most the round in flight.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=${OUT:-out}/h100; mkdir -p "$R"
cp results/h100/harness_overhead_paired.json "$R/"
echo "######## harness, eager, paired ($(date +%T))"
timeout 540 python benchmarks/harness_overhead.py --mode paired --batch-sizes 1,32,256 --iterations 60 \
    --blocks 6 --rounds 5 --continue --out "$R"
echo "rc=$?"
cd "${OUT:-out}" && tar czf h100-remaining.tgz h100   # one file back
