#!/usr/bin/env bash
# Session 28 (2026-12-04), one H200, issue 47's fused pair of 1×1 convolutions (`quant.pair`): the nine device
# calls as run, from the repository root with $OUT set, `.whl/` carried (plotly, narwhals, LoadGen cp312;
# benchmarks/device_lib.sh). Before each call, here: PYTHONPATH=/tmp/t36/site:src python benchmarks/compile_sm90.py
# (-j 2; --only pair for calls 1-4; all 212 ok before call 5).
# Calls 1-4 ran working trees between 8e032e5 and e52bd05, each with another form of the kernel (README.md says
# which); calls 5-7 ran the kernel as committed in e52bd05.
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
1) PAIR_LIMIT=440 bash benchmarks/pair.sh kernels ;;                     # chunked, one program per 128 rows
2) PAIR_LIMIT=300 bash benchmarks/pair.sh kernels ;;                     # persistent, weights resident
3 | 4) PAIR_LIMIT=300 PAIR_BATCHES=1024 bash benchmarks/pair.sh kernels ;; # reload / T-store variants
5) bash benchmarks/pair.sh tests engine loop ;;                         # e52bd05 less its PDL parameter
6) DEFAULT_LIMIT=585 bash benchmarks/device.sh default ;;               # e52bd05: the main job, cold caches
7)  # e52bd05: every GPU test, then the real-clock ones alone (the device.sh gputests recipe, shorter limits)
    ALONE=(tests/serving/test_loadgen_confirm.py tests/serving/test_serving_real_vs_simulator.py)
    N=(); python -c "import xdist" 2>/dev/null && N=(-n 4)
    step "GPU tests" 320 python -m pytest -v --durations=15 -m gpu "${N[@]}" tests "${ALONE[@]/#/--ignore=}" \
        -p no:cacheprovider > "$OUT/gputests.txt" 2>&1
    step "GPU tests, alone" 110 python -m pytest -q -m gpu "${ALONE[@]}" -p no:cacheprovider \
        > "$OUT/gputests-alone.txt" 2>&1 ;;
8)  # the tiles of two 64-row programs an SM added (committed after this README's first form): the kernels at
    # 1024, then ResNet-50 fp8 at 1024 in `deepgap run` with pairs on (one sweep, no warm-up)
    PAIR_LIMIT=120 PAIR_BATCHES=1024 bash benchmarks/pair.sh kernels
    step "rn50 fp8 1024 pairs on" 100 python -m deepgap run --models resnet50 --engines quant --precisions fp8 \
        --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store /tmp/on.sqlite > "$OUT/on.txt" 2>&1
    python -m deepgap export /tmp/on.sqlite -o "$OUT/on.csv" > /dev/null 2>&1 ;;
9)  # the same tree, the machine still warm: the bare loop at 1024
    step "bare loop fp8,int8 1024" 95 python benchmarks/quant_inputs.py --models resnet50 --precisions fp8,int8 \
        --batch-sizes 1024 --inputs default --pdl off --out "$OUT/loop-x2.jsonl" > "$OUT/loop-x2.txt" 2>&1 ;;
*) echo "usage: bash results/h200/session28/device.sh 1|2|...|9"; exit 2 ;;
esac
