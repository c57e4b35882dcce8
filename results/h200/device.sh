#!/usr/bin/env bash
# The H200 half of "two GPUs side by side" (issue 25), in device calls of <= 10 minutes each, on kind
# nvidia-h200 (torch 2.11+cu130, no internet), in the repository root:
#
#   bash results/h200/device.sh sweep      # call 1 (<= 9 min; the H100 ran the old grid in 9): `deepgap run` with
#                                      #   no grid arguments (the default GPU sweep) into
#                                      #   results/h200/default.sqlite; when that store exists, its unfinished
#                                      #   run is resumed instead (exit 2 and a note when it had finished)
#   bash results/h200/device.sh measure    # call 2 (<= 9 min): `deepgap peaks`, benchmarks/quant.py, serving
#                                      #   capacity for cudagraph fp16 and for the fastest engine
#   bash results/h200/device.sh post       # here, no GPU: export, report, merge with results/h100, compare, plan
#
# Each device stage writes under results/h200/ of the device's copy and copies that folder to $OUT/h200 at
# the end (and after every step, so a step limit loses only the step in flight). Put the returned files in
# results/h200/ here: the next call carries them (untracked, not ignored), which is how `sweep` resumes.
# If the sweep stage ends with "unfinished", run `sweep` again before `measure`.
# The fastest engine for serving: H200_FAST_ENGINE / H200_FAST_PRECISION (default compile-freeze fp16, the
# fastest fp16 engine of the H100's quant benchmark; the quant int8 engine was faster still but is not a
# `deepgap serve` path yet measured anywhere).
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=results/h200
mkdir -p "$R"
FAST=${H200_FAST_ENGINE:-compile-freeze}
FAST_PREC=${H200_FAST_PRECISION:-fp16}

back() {  # copy what exists to $OUT (device calls return only $OUT)
    [ -n "${OUT:-}" ] || return 0
    mkdir -p "$OUT/h200" && cp -r "$R"/. "$OUT/h200/"
}
step() {  # step NAME LIMIT_S CMD...: one bounded step, its exit code and duration logged
    local name=$1 limit=$2; shift 2
    echo "######## $name ($(date +%T), limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@"
    local rc=$?
    echo "######## $name: rc=$rc in $((SECONDS - t0))s"
    back
    return $rc
}

case "${1:-}" in
sweep)
    nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total,driver_version --format=csv | tee "$R/gpu.txt"
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$R/gpu.txt"
    if [ -f "$R/default.sqlite" ]; then
        step "default sweep, resumed" 540 python -m deepgap run --resume --store "$R/default.sqlite" --quiet
    else
        step "default sweep" 540 python -m deepgap run --store "$R/default.sqlite" --quiet
    fi
    rc=$?
    [ $rc -eq 124 ] && echo "unfinished: the sweep hit its limit; run 'bash results/h200/device.sh sweep' again"
    [ $rc -eq 2 ] && [ -f "$R/default.sqlite" ] && echo "(exit 2 on --resume: the sweep had already finished)"
    ;;
measure)
    # ~9 min at most: peaks ~1 min, quant ~2.5 min, serving 2 + 3 min (compiling each batch size)
    step "peaks" 75 python -m deepgap peaks --store "$R/roofline.sqlite"
    step "quant" 150 python benchmarks/quant.py --batch-sizes 256,32,1 --iterations 30 --budget-s 80 \
        --out "$R/quant"
    step "serving cudagraph fp16" 120 python benchmarks/serving.py --engine cudagraph --precision fp16 \
        --store "$R/serving.sqlite" --out "$R/serving-cudagraph-fp16.json"
    step "serving $FAST $FAST_PREC" 180 python benchmarks/serving.py --engine "$FAST" --precision "$FAST_PREC" \
        --store "$R/serving.sqlite" --out "$R/serving-$FAST-$FAST_PREC.json"
    ;;
post)
    D=results/two-gpus
    mkdir -p "$D"
    stores=()
    for f in default roofline serving; do [ -f "$R/$f.sqlite" ] && stores+=("$R/$f.sqlite"); done
    set -e
    python -m deepgap export "$R/default.sqlite" --format csv -o "$R/default.csv"
    rm -f "$R/all.sqlite"
    python -m deepgap merge "${stores[@]}" -o "$R/all.sqlite"
    python -m deepgap report "$R/all.sqlite" -o "$R/report/report.html"
    rm -f "$D/all.sqlite"
    python -m deepgap merge results/h100/all.sqlite "$R/all.sqlite" -o "$D/all.sqlite"
    P="NVIDIA H200,NVIDIA H100 80GB HBM3"
    python -m deepgap compare "$D/all.sqlite" --platforms "$P" -o "$D/compare.csv" > "$D/compare.txt"
    python -m deepgap compare "$D/all.sqlite" --platforms "$P" --json > "$D/compare.json"
    python -m deepgap compare "$D/all.sqlite" --paper --best-only --platforms "$P" -o "$D/compare-paper.csv" \
        > "$D/compare-paper.txt"
    for obj in devices watts; do
        python -m deepgap plan "$D/all.sqlite" --qps 100000 --slo-p99 15ms --model resnet50 --objective $obj \
            > "$D/plan-resnet50-$obj.txt"
        python -m deepgap plan "$D/all.sqlite" --qps 100000 --slo-p99 15ms --model resnet50 --objective $obj \
            --json > "$D/plan-resnet50-$obj.json"
    done
    python -m deepgap report "$D/all.sqlite" -o "$D/report/report.html"
    ls -la "$R" "$D"
    ;;
*)
    echo "usage: bash results/h200/device.sh sweep|measure|post (see the header)" >&2
    exit 2
    ;;
esac
