#!/usr/bin/env bash
# Session 29 (2026-12-04), one H200, issue 47: the TMA-fed 3×3 convolution timed, and the stem on space-to-depth
# pixels (`quant.stem_s2d`). The device calls as run, from the repository root with $OUT set, `.whl/` carried
# (plotly, narwhals, LoadGen cp312; benchmarks/device_lib.sh). Before each call, here:
# PYTHONPATH=/tmp/t36/site:src python benchmarks/compile_sm90.py -j 2 (all ok). Call 2 ran 20a9fa2 less its pruning of
# STEM_VARIANTS; call 3 ran 20a9fa2 (beside uncommitted docs and benchmark edits the main job does not use), calls 4-5
# ran 88a0b24 (the same engine).
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
kept() {  # a store's stem choice and the layers that kept a TMA 3×3 tile
    python - "$1" <<'PY'
import json, sqlite3, sys
for prec, bs, extra in sqlite3.connect(sys.argv[1]).execute("select precision, batch_size, extra_json from results"):
    info = json.loads(extra or "{}").get("engine_info", {})
    tma = [(t["name"], t.get("config"), t.get("q_s")) for t in info.get("layers", []) if "tma-conv" in str(t.get("config"))]
    stem = info.get("stem", {})
    print(prec, bs, "stem", stem.get("chosen"), {k: round(v * 1e3, 4) for k, v in stem.get("seconds", {}).items()}, "tma", tma)
PY
}
case ${1:-} in
1) CONV_TMA_LIMIT=230 bash benchmarks/conv_tma.sh all > "$OUT/call1.log" 2>&1 ;;  # f4d4d7c: tests, kernels, engine
2)  # the s2d stem and the TMA tile on by default (pruned): GPU tests, the stem's kernels apart, the engine at 1024
    step "s2d + resident GPU tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_quant_stem_s2d.py \
        tests/measure/quant/test_quant_gpu.py -k "s2d or resident" -p no:cacheprovider > "$OUT/s2d-gputests.txt" 2>&1
    tail -n 5 "$OUT/s2d-gputests.txt"
    step "stem split" 150 python benchmarks/stem_split.py --batch-sizes 1,256,1024 > "$OUT/stem-split.jsonl" 2>&1
    grep summary "$OUT/stem-split.jsonl" | cut -c1-600
    step "rn50 quant fp8,int8 1024" 170 python -m deepgap run --models resnet50 --engines quant --precisions fp8,int8 \
        --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store "$S/s2d.sqlite" > "$OUT/s2d-run.txt" 2>&1
    grep "img/s" "$OUT/s2d-run.txt" | tail -n 2
    python -m deepgap export "$S/s2d.sqlite" -o "$OUT/s2d-run.csv" > /dev/null 2>&1
    kept "$S/s2d.sqlite" | tee "$OUT/s2d-kept.txt" ;;
3) DEFAULT_LIMIT=585 bash benchmarks/device.sh default ;;  # the main job, cold caches, STEM_VARIANTS pruned
4)  # the same tree, cold start: the bare loop at 1024 (fp8, int8), then every GPU test, then the real-clock ones alone
    step "bare loop fp8,int8 1024" 100 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
        --batch-sizes 1024 --inputs default --pdl off --out "$OUT/loop.jsonl" > "$OUT/loop.txt" 2>&1
    grep -v '^{' "$OUT/loop.txt" | tail -n 6
    ALONE=(tests/serving/test_loadgen_confirm.py tests/serving/test_serving_real_vs_simulator.py)
    N=(); python -c "import xdist" 2>/dev/null && N=(-n 4)
    step "GPU tests" 240 python -m pytest -v --durations=15 -m gpu "${N[@]}" tests "${ALONE[@]/#/--ignore=}" \
        -p no:cacheprovider > "$OUT/gputests.txt" 2>&1
    step "GPU tests, alone" 100 python -m pytest -q -m gpu "${ALONE[@]}" -p no:cacheprovider > "$OUT/gputests-alone.txt" 2>&1
    grep -E "FAILED|ERROR" "$OUT/gputests.txt" | cut -c1-200; tail -n 3 "$OUT/gputests.txt" "$OUT/gputests-alone.txt" ;;
5)  # the same machine as call 4, still warm: `deepgap run` ResNet-50 fp8 at 1024, one sweep, no warm-up
    step "rn50 fp8 1024 same host" 90 python -m deepgap run --models resnet50 --engines quant --precisions fp8 \
        --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store /tmp/same.sqlite > "$OUT/same-host.txt" 2>&1
    grep "img/s" "$OUT/same-host.txt" | tail -2; python -m deepgap export /tmp/same.sqlite -o "$OUT/same-host.csv" > /dev/null 2>&1 ;;
*) echo "usage: bash results/h200/session29/device.sh 1|2|3|4|5"; exit 2 ;;
esac
