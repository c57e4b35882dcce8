#!/usr/bin/env bash
# Session 16 on one H200 (issue 47): the int8-pixel stem and the int8-resident input mode, measured by deepgap and
# by a bare CUDA-event loop. Usage, from the repository root: bash results/h200/session16/device.sh RECIPE...
#   tests    the quant engine's GPU tests (kernels exact, both input modes prepared and run through deepgap run)
#   inputs   ResNet-50 int8/fp8 at batch 1, 256, 1024 and ResNet-18/101 fp8 at 256, each in both input modes,
#            one store; show, layers, report CSVs; then the bare loop on the same machine
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "$@"; do case $what in
tests)
    step "quant GPU tests" "${TEST_LIMIT:-240}" python -m pytest -q tests/test_quant_gpu.py -p no:cacheprovider -rA \
        > "$OUT/quant-gpu-tests.txt" 2>&1
    tail -n 4 "$OUT/quant-gpu-tests.txt" ;;
inputs)
    Q="$S/inputs.sqlite"
    step "resnet50, both inputs" 300 python -m deepgap run --models resnet50 --engines quant --precisions int8,fp8 \
        --memory-formats channels_last --batch-sizes 1,256,1024 --inputs default,int8-resident --sweeps 1 \
        --no-cpu-baseline --store "$Q" 2>&1 | stamp > "$OUT/inputs-resnet50.txt"
    step "resnet18/101, both inputs" 150 python -m deepgap run --models resnet18,resnet101 --engines quant \
        --precisions fp8 --memory-formats channels_last --batch-sizes 256 --inputs default,int8-resident --sweeps 1 \
        --no-cpu-baseline --no-thermal-warmup --store "$Q" 2>&1 | stamp > "$OUT/inputs-resnet18-101.txt"
    python -m deepgap show "$Q" --all > "$OUT/inputs-show.txt" 2>&1
    python -m deepgap layers "$Q" --model resnet50 --precision fp8 --batch-size 1024 --top 60 --sort order \
        > "$OUT/layers-resnet50-fp8-bs1024.txt" 2>&1
    python -m deepgap layers "$Q" --model resnet50 --precision fp8 --batch-size 256 --top 12 \
        > "$OUT/layers-resnet50-fp8-bs256.txt" 2>&1
    step "report" 90 python -m deepgap report "$Q" -o "$S/inputs-report/report.html" --static > "$OUT/report.txt" 2>&1
    report_csvs "$S/inputs-report"; pack "$Q"
    step "bare loop" 150 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8 \
        --batch-sizes 1,256,1024 --out "$OUT/quant_inputs.jsonl" > "$OUT/quant_inputs.txt" 2>&1
    tail -n 8 "$OUT/quant_inputs.txt"
    # few files come back from the device: the small ones travel in one archive
    (cd "$OUT" && tar czf texts.tgz --remove-files inputs-report-csv report.txt quant_inputs.txt inputs-*.txt \
        layers-*.txt quant-gpu-tests.txt 2>/dev/null) ;;
*) echo "unknown recipe $what"; exit 2 ;;
esac; done
