#!/usr/bin/env bash
# Issue 47, session 34: the whole-network kernel (`quant.whole`: every quantized convolution in one persistent
# kernel, grid barriers between phases), offered at batch ≤ 8 and kept where timed faster than the per-layer graph.
# From the repository root on the device, $OUT set:   bash benchmarks/whole_net.sh STEP...  (all = every step)
#   tests — its GPU tests (ResNet-50 at batch 1 on every SM against each layer's reference; graph replays;
#           the engine's choice at batch 1)
#   ab    — `deepgap run` ResNet-50 quant fp8 and int8 at batch 1 with DEEPGAP_QUANT_WHOLE off, then on: the
#           answer's latency both ways and what the engine timed and kept (engine_kept.py whole)
#   loop  — the bare loop at batch 1 (ResNet-18/50/101, fp8 and int8): synchronized ms per call against the
#           engine's, with the whole kernel's choice in each row
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests ab loop ;;
tests)
    step "whole GPU tests" 240 python -m pytest -q -m gpu tests/measure/quant/test_quant_whole_gpu.py -x -rA \
        -p no:cacheprovider > "$OUT/whole-gputests.txt" 2>&1
    tail -n 12 "$OUT/whole-gputests.txt" ;;
ab) switch_ab DEEPGAP_QUANT_WHOLE 1 whole 200 whole ;;
loop)
    step "bare loop bs1" 300 python benchmarks/quant_inputs.py --models "${LOOP_MODELS:-resnet50,resnet18,resnet101}" \
        --precisions fp8,int8 --batch-sizes 1 --inputs default --pdl off --out "$OUT/whole-loop.jsonl" \
        > "$OUT/whole-loop.txt" 2>&1
    grep -v '^{' "$OUT/whole-loop.txt" | tail -n 8 ;;
*) echo "unknown step $what (tests, ab, loop, all)"; exit 2 ;;
esac; done
