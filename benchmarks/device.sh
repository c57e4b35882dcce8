#!/usr/bin/env bash
# The one device script: named recipes for the GPU machine (the `device` tool runs it from the repository root,
# with $OUT set). Usage: bash benchmarks/device.sh RECIPE... ; every store is packed gzipped into $OUT.
#   default   the README's main command (gpu preset, 2 sweeps, report), timed; DEFAULT_LIMIT seconds (590);
#             DEFAULT_CONFIG=FILE.toml runs that sweep file instead (a variant of the grid, timed the same way)
#   smoke     a short two-sweep run through every layer: ResNet-18 eager fp16 and quant int8 at batch 1 and 256
#   gputests  every test marked gpu (the ones CI skips), the LoadGen ones alone after; TEST_LIMIT s each (300)
#   prelude   serve and a one-GPU fleet store their idle baseline and thermal warm-up (benchmarks/prelude_check.sh)
#   kinds     every kind of run once through the one driver into one store: peaks, profile, serve, a one-GPU fleet
# Recipes of one feature live in their own script beside this one and are listed by `bash benchmarks/device.sh list`.
# Dated scripts of earlier sessions sit beside the results they made (results/<machine>/session*/device.sh).
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried wheels, step(), pack()
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
[ $# -gt 0 ] || { sed -n 3,11p "$0"; exit 2; }
for what in "$@"; do case $what in
default)
    # from cold compiler caches (inductor, Triton, deepgap's quant tuning), each line stamped with its second
    rm -rf /tmp/torchinductor_"$(id -un)" "$HOME/.triton" "$HOME/.cache/deepgap"
    step "default sweep" "${DEFAULT_LIMIT:-590}" python -m deepgap run ${DEFAULT_CONFIG:+--config "$DEFAULT_CONFIG"} \
        --store "$S/default.sqlite" \
        --report "$S/report/report.html" 2>&1 | stamp > "$OUT/default.txt"
    tail -30 "$OUT/default.txt"; pack "$S/default.sqlite"; report_csvs "$S/report" ;;
smoke)
    step "smoke sweep" 200 python -m deepgap run --models resnet18 --engines eager,quant --precisions fp16,int8 \
        --batch-sizes 1,256 --sweeps 2 --thermal-warmup --thermal-timeout 30 --store "$S/smoke.sqlite" \
        > "$OUT/smoke.txt" 2>&1
    tail -8 "$OUT/smoke.txt"; pack "$S/smoke.sqlite" ;;
gputests)
    # The real-clock tests run after the others, alone on the GPU and the host: beside other GPU tests (-n 4)
    # LoadGen's light SUT fell to 19.6k of 20k queries/s (INVALID, session 13), and the real server's mean
    # latency came out 4.2x the simulator's, past its bound of 3 (session 20, in both of its attempts).
    ALONE=(tests/serving/test_loadgen_confirm.py tests/serving/test_serving_real_vs_simulator.py)
    N=(); python -c "import xdist" 2>/dev/null && N=(-n 4)
    # -v: a line per test as it ends, so a run stopped at its limit still says which failed (session 20's did not)
    step "GPU tests" "${TEST_LIMIT:-300}" python -m pytest -v --durations=15 -m gpu "${N[@]}" tests "${ALONE[@]/#/--ignore=}" \
        -p no:cacheprovider > "$OUT/gputests.txt" 2>&1
    step "GPU tests, alone" "${TEST_LIMIT:-300}" python -m pytest -q -m gpu "${ALONE[@]}" -p no:cacheprovider \
        > "$OUT/gputests-alone.txt" 2>&1
    grep -E "FAILED|ERROR" "$OUT/gputests.txt" | cut -c1-200; tail -n 4 "$OUT/gputests.txt" "$OUT/gputests-alone.txt" ;;
prelude)
    step "prelude check" 240 bash benchmarks/prelude_check.sh "$S/prelude" > "$OUT/prelude_check.txt" 2>&1
    tail -40 "$OUT/prelude_check.txt"; pack "$S/prelude/serve.sqlite"; pack "$S/prelude/fleet.sqlite" ;;
kinds)
    K="$S/kinds.sqlite"
    step "peaks" 120 python -m deepgap peaks --only fp16,memory --store "$K" > "$OUT/kinds.txt" 2>&1
    step "profile" 120 python -m deepgap profile --model resnet50 --precision fp16 --batch-size 64 --store "$K" \
        >> "$OUT/kinds.txt" 2>&1
    step "serve" 150 python -m deepgap serve --model resnet50 --precision fp16 --scenario offline --min-duration 5 \
        --no-thermal-warmup \
        --store "$K" >> "$OUT/kinds.txt" 2>&1
    step "fleet" 150 python -m deepgap run --devices all --models resnet18 --engines eager --precisions fp16 \
        --batch-sizes 1,64 --no-thermal-warmup \
        --store "$K" >> "$OUT/kinds.txt" 2>&1
    python -m deepgap show "$K" --runs >> "$OUT/kinds.txt" 2>&1
    tail -40 "$OUT/kinds.txt"; pack "$K" ;;
list)
    sed -n 3,11p "$0"; ls benchmarks/*.sh ;;
*) echo "unknown recipe $what (bash benchmarks/device.sh list)"; exit 2 ;;
esac; done
