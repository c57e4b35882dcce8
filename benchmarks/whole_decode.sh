#!/usr/bin/env bash
# Issue 51, session 35: a batch-1 decode step's layers in one persistent kernel (`measure.llm_whole`,
# DEEPGAP_DECODE_WHOLE), written without a GPU; these are its first GPU steps.
# From the repository root on the device, $OUT set:   bash benchmarks/whole_decode.sh STEP...
# Three calls fit a session's device time: `tests phases` (all), then `loop`, then `run` (each under 600 s).
# Session 36 (no GPU) added the L2 lead (`Tiles.lead_kb`, mode l2) and the phases' variants; if the fastest
# variant is not a mode, make it `tiles_for`'s before the `loop` call.
# Session 37 timed `phases loop` on one H200 (results/h200/session37): 2.7× slower than off (148.0 against 395.8
# tok/s), every phase streaming at ~1 TB/s. Session 38 ran `tests` on one H100: all 8 pass (results/h100/session38);
# `run` has not run.
#   tests — its GPU tests (llama-tiny's compiled, graphed fp8 step against the per-layer path in each mode; one
#           layer at the 8B shape against each phase's reference; two programs an SM refused) and the fused path's
#   loop  — the bare loop replaying deepgap's own step (llama-3.1-8b fp8, batch 1, PDL on, split KV auto) with
#           the whole step off, on, with the 64 KB L2 lead (l2), and K steps loaded ahead (ahead)
#   phases — the kernel alone per variant (whole_decode_phases.VARIANTS: the modes, the lead at 32/128 KB, 32 KB
#           steps in every phase, ahead with the lead): its launch's ms and weight TB/s, each phase's µs and TB/s from
#           program 0's timer after each barrier, its hidden row against the first's (rel_vs_first)
#   run   — `deepgap run` of the same with DEEPGAP_DECODE_WHOLE=${RUN_MODE:-on} (`one`: best, the loop's fastest
#           mode): the harness against the loop (2%)
set -uo pipefail
source benchmarks/device_lib.sh
S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
for what in "${@:-all}"; do case $what in
all) bash "$0" tests phases ;;  # one device call (≤ 570 s); then loop, then run, a call each
# all four in one call (≤ 570 s; each step's earlier measured ~20-90 s): the timings first, the tests last
one) PHASES_S=190 LOOP_S=160 RUN_S=90 TESTS_S=130 WHOLE_MODES=${WHOLE_MODES:-off,on,l2,l2+o=8x4096+down=16x2048} \
     RUN_MODE=${RUN_MODE:-best} WHOLE_TESTS=tests/measure/test_llm_whole.py bash "$0" phases loop run tests ;;
phases)
    step "whole decode phases" "${PHASES_S:-270}" python benchmarks/whole_decode_phases.py --model llama-3.1-8b --precision fp8 \
        ${PHASE_MODES:+--modes "$PHASE_MODES"} --out "$OUT" > "$OUT/whole-decode-phases.txt" 2>&1
    tail -n 10 "$OUT/whole-decode-phases.txt" ;;
tests)
    step "whole decode GPU tests" "${TESTS_S:-300}" python -m pytest -q -m gpu \
        ${WHOLE_TESTS:-tests/measure/test_llm_whole.py tests/measure/test_llm_fused_rope.py} -rA -p no:cacheprovider \
        > "$OUT/whole-decode-gputests.txt" 2>&1
    tail -n 12 "$OUT/whole-decode-gputests.txt" ;;
loop)
    step "decode loop whole ${WHOLE_MODES:-off,on,l2,ahead}" "${LOOP_S:-420}" python benchmarks/llm_decode_loop.py --model llama-3.1-8b \
        --precision fp8 --batches 1 --pdl on --split-kv auto --whole "${WHOLE_MODES:-off,on,l2,ahead}" --harness deepgap \
        --out "$OUT" > "$OUT/whole-decode-loop.txt" 2>&1
    grep '^{' "$OUT/whole-decode-loop.txt" | tail -n 3 ;;
run)
    # RUN_MODE=best: the mode (not a variant: the switch takes modes) the loop step timed fastest in this call
    [ "${RUN_MODE:-on}" = best ] && RUN_MODE=$(python3 -c "import json,sys; rows=[json.loads(l) for l in \
open(sys.argv[1])]; print(max((r for r in rows if '+' not in r['whole_variant']), key=lambda r: r['decode_tok_s'])\
['whole_variant'] if rows else 'on')" "$OUT/llm_decode_loop.jsonl" 2>/dev/null || echo on) && echo "run mode: $RUN_MODE"
    step "deepgap run 8b fp8 bs1, whole ${RUN_MODE:-on}" "${RUN_S:-420}" env DEEPGAP_DECODE_WHOLE="${RUN_MODE:-on}" python -m deepgap run --workload decode \
        --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 \
        --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 \
        --store "$S/whole-decode.sqlite" > "$OUT/whole-decode-run.txt" 2>&1
    python -m deepgap export "$S/whole-decode.sqlite" --format csv -o "$OUT/whole-decode-run.csv" >/dev/null 2>&1
    python3 -c "import csv,sys; [print(r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], r['decode_pdl'], \
r['decode_attention']) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/whole-decode-run.csv" ;;
*) echo "unknown step $what (tests, phases, loop, run, all, one)"; exit 2 ;;
esac; done
