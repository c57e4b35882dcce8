#!/usr/bin/env bash
# Issue 40: does MLPerf's LoadGen confirm deepgap's server capacity, run after run? Usage on the device:
#   bash benchmarks/loadgen_confirm.sh STEP...
#   int8-1 int8-2 int8-3 — ResNet-50 quant int8 channels_last: one `deepgap serve --find-capacity --loadgen` each
#   fp8-1 fp8-2 fp8-3    — the same, quant fp8
#   cg16-1 cg16-2 cg16-3 — the same, cudagraph fp16
#   summary              — benchmarks/loadgen_confirm.py over every store: $OUT/loadgen_confirm.md (both
#                          capacities, verdicts, p99s, the null-SUT floor) and PASS/FAIL of the issue's criterion
#   check                — the same commands on the CPU with tinycnn and short durations (no GPU): they parse and run
# One step is one serve run (2–4 min on an H100: calibration, capacity search, the null-SUT LoadGen run at deepgap's
# capacity, then LoadGen stepping down from it); run the three of a configuration back to back (consecutive runs).
# Each writes $OUT/<step>.txt (the result lines: deepgap's capacity, the LoadGen settings, the null-SUT floor,
# each LoadGen run with early stopping and LoadGen − deepgap per sample) and $OUT/<step>.log (progress); the runs of a configuration share the store $S/<config>.sqlite
# (PACK=1 also gzips it into $OUT: several MB, do not commit it). SERVE_ARGS: more serve flags, last (they win),
# e.g. SERVE_ARGS="--capacity-tol 0.01". The LoadGen wheel: benchmarks/device_lib.sh.
# On an H200 the same steps, once: bash benchmarks/loadgen_confirm.sh int8-1 fp8-1 summary
set -uo pipefail
[ $# -gt 0 ] || { sed -n 2,16p "$0"; exit 2; }
: "${OUT:?set OUT to the folder results go to}"
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=${S:-/tmp/loadgen40}; mkdir -p "$S"
MODEL=${MODEL:-resnet50}; DEVICE=${DEVICE:-cuda}; SLO=${SLO:-15ms}; LIMIT=${LIMIT:-590}
# a configuration's engine and precision; the CPU check serves tinycnn eager fp32 in their place
config() { case $1 in int8) echo quant int8 ;; fp8) echo quant fp8 ;; cg16) echo cudagraph fp16 ;;
                       *) echo "unknown configuration $1" >&2; return 2 ;; esac; }
serve_run() {  # serve_run STEP CONFIG EXTRA...: one find-capacity run with LoadGen, its text and log in $OUT
    local name=$1 cfg=$2; shift 2
    read -r engine precision < <(config "$cfg") || return 2
    [ -n "${CPU_ENGINE:-}" ] && read -r engine precision <<< "$CPU_ENGINE"
    step "$name: $MODEL $engine $precision" "$LIMIT" bash -c 'o=$1; shift; "$@" > "$o.txt" 2> "$o.log"' _ \
        "$OUT/$name" python -m deepgap serve --model "$MODEL" --engine "$engine" --precision "$precision" \
        --memory-format channels_last --device "$DEVICE" --scenario server --find-capacity --slo-p99 "$SLO" \
        --loadgen --verify-policies 1 --store "$S/$cfg.sqlite" "$@" ${SERVE_ARGS:-}
    tail -3 "$OUT/$name.log"; grep -E "^(server capacity|loadgen)" "$OUT/$name.txt"
    [ "${PACK:-0}" = 1 ] && pack "$S/$cfg.sqlite"
    return 0
}
for what in "$@"; do case $what in
int8-[123]|fp8-[123]|cg16-[123])
    serve_run "$what" "${what%-*}" --thermal-timeout 60 ;;
summary)
    step "summary" 300 python benchmarks/loadgen_confirm.py "$S"/*.sqlite --out "$OUT/loadgen_confirm.md"
    cat "$OUT/loadgen_confirm.md" ;;
check)
    MODEL=tinycnn DEVICE=cpu SLO=50ms CPU_ENGINE="eager fp32" S=$S/check LIMIT=300 bash "$0" check-run ;;
check-run)  # the CPU check's body (its variables set by `check`)
    mkdir -p "$S"
    serve_run check-int8 int8 --threads 1 --batch-sizes 1,2,4 --curve-iterations 5 --min-queries 64 \
        --min-duration 0.2s --loadgen-duration 0.3s --no-telemetry
    step "check summary" 120 python benchmarks/loadgen_confirm.py "$S"/*.sqlite --out "$OUT/check.md"
    cat "$OUT/check.md" ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
