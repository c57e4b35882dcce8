#!/usr/bin/env bash
# Fifth H100 device session: the default GPU sweep with the fastest engines (issue 19), serve with the
# quant engine at several batch sizes, the new GPU tests, and serving at the hardware's pace (issue 23).
# Stages, each one device call of <= 10 minutes, in the repository root of the device machine:
#   bash results/h100/session5/device.sh check     # GPU tests + serve quant int8/fp8 over a service curve
#   bash results/h100/session5/device.sh sweep     # `deepgap run` with no grid arguments (resumes when the store exists)
#   bash results/h100/session5/device.sh serving   # benchmarks/serving.py: quant int8 and cudagraph fp16
# Every stage copies results/h100/session5/ to $OUT/session5 after each step; put them back here between calls.
set -uo pipefail
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
R=results/h100/session5
mkdir -p "$R"
back() { [ -n "${OUT:-}" ] || return 0; mkdir -p "$OUT/session5" && cp -r "$R"/. "$OUT/session5/"; }
step() {  # step NAME LIMIT_S CMD...
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
check)
    nvidia-smi --query-gpu=name,power.limit,clocks.max.sm,memory.total,driver_version --format=csv | tee "$R/gpu.txt"
    python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$R/gpu.txt"
    step "gpu tests" 300 python -m pytest -q -x -m gpu -rA tests/test_graph_runner_gpu.py tests/test_accuracy_gpu.py \
        tests/test_serving_cli.py 2>&1 | tee "$R/gpu-tests.log"
    for p in int8 fp8; do
        step "serve quant $p offline" 100 python -m deepgap serve --model resnet50 --engine quant --precision $p \
            --memory-format channels_last --scenario offline --batch-sizes 1,8,32,64,128,256 \
            --store "$R/serve-quant.sqlite"
    done
    ;;
sweep)
    if [ -f "$R/default.sqlite" ]; then
        step "default sweep, resumed" 560 python -m deepgap run --resume --store "$R/default.sqlite" --quiet
    else
        step "default sweep" 560 python -m deepgap run --store "$R/default.sqlite" --quiet
    fi
    ;;
serving)
    shift
    step "serving" 560 "$@"
    ;;
*) echo "usage: $0 check|sweep|serving CMD..."; exit 2 ;;
esac
