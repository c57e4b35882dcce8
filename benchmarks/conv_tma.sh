#!/usr/bin/env bash
# Issue 47's TMA-fed 3×3 convolution (`quant.conv_tma`; offered only with DEEPGAP_QUANT_CONV_TMA=on until a GPU has
# timed it), from the repository root on the device, $OUT set:   bash benchmarks/conv_tma.sh STEP...  (all = tests
# kernels engine). Written in session 28 without a GPU: no step has run yet.
#   tests   — tests/measure/quant/test_quant_conv_tma_gpu.py: every offered tile against conv_gemm_kernel
#   kernels — benchmarks/conv_tma_bench.py: each ResNet-50 3×3 shape (7, strided too) at batch 1024 and 256, fp8 and
#             int8, the grouped kernel's best tile against the TMA tiles → conv_tma.jsonl, conv_tma.txt
#   engine  — `deepgap run` ResNet-50 quant fp8 and int8 at batch 1024, one sweep, no warm-up, no CPU baseline,
#             the switch off then on: each store's CSV export and which layers kept a TMA tile
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests kernels engine ;;
tests)
    step "conv-tma GPU tests" 200 python -m pytest -q -m gpu tests/measure/quant/test_quant_conv_tma_gpu.py \
        -p no:cacheprovider > "$OUT/conv-tma-gputests.txt" 2>&1
    tail -n 15 "$OUT/conv-tma-gputests.txt" ;;
kernels)
    step "conv-tma kernels" "${CONV_TMA_LIMIT:-360}" env PYTHONPATH="$PYTHONPATH:benchmarks" python benchmarks/conv_tma_bench.py \
        --batch-sizes "${CONV_TMA_BATCHES:-1024,256}" --out "$OUT/conv_tma.jsonl" > "$OUT/conv_tma.txt" 2>&1
    grep -v '^{' "$OUT/conv_tma.txt" | tail -n 20 ;;
engine)
    for mode in off on; do
        step "resnet50 quant bs1024, DEEPGAP_QUANT_CONV_TMA=$mode" 200 env DEEPGAP_QUANT_CONV_TMA=$mode \
            python -m deepgap run --models resnet50 --engines quant --precisions fp8,int8 --batch-sizes 1024 --sweeps 1 \
            --no-cpu-baseline --no-thermal-warmup --store "$S/conv-tma-$mode.sqlite" > "$OUT/conv-tma-$mode.txt" 2>&1
        grep "img/s" "$OUT/conv-tma-$mode.txt" | tail -n 2
        python -m deepgap export "$S/conv-tma-$mode.sqlite" -o "$OUT/conv-tma-$mode.csv" > /dev/null 2>&1 || true
        python - "$S/conv-tma-$mode.sqlite" <<'PY' 2>&1 | tee "$OUT/conv-tma-$mode-kept.txt"
import json, sqlite3, sys
for prec, extra in sqlite3.connect(sys.argv[1]).execute("select precision, extra_json from results"):
    layers = json.loads(extra or "{}").get("engine_info", {}).get("layers", [])
    print(prec, [(t["name"], t.get("config"), t.get("q_s")) for t in layers if "tma-conv" in str(t.get("config"))])
PY
    done ;;
*) echo "unknown step $what (tests, kernels, engine, all)"; exit 2 ;;
esac; done
