#!/usr/bin/env bash
# Session 22's recipes on one H200 (run from the repository root by the device tool, $OUT set):
#   levers   the bare decode loop (benchmarks/llm_decode_loop.py), 8B fp8, PDL on, batches 1 and 4: the qkv GEMV
#            with and without RoPE + cache write folded in (DEEPGAP_DECODE_ROPE=fused), each with the one-pass and
#            the split-KV attention (--split-kv off,auto), the top kernels at batch 1
#   harness  the bare loop at batch 1, RoPE fused and the split KV, replaying its own graph and deepgap's graph step
#            (`--harness own,deepgap`), PDL on and auto: where deepgap's figure and the loop's part (issue 51)
#   diag     (prepared for the next session) why `deepgap run` decodes at 357 tok/s where the loop runs its step at
#            392.6: deepgap run at batch 1 with and without telemetry, then the loop with deepgap's step; each row
#            says its GEMV tiles (decode_tiles / tiles) and its PDL choice; the loop also times the split's merge
#            by its own kernel and by the attention's last program (DEEPGAP_DECODE_COMBINE=kernel,last-block)
#   sweep8b  deepgap run --workload decode, 8B quant fp8 at batches SWEEP_FP8 (1): as session 21's, with whatever
#            DEEPGAP_DECODE_* switches the caller sets
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
levers)
    for rope in mix fused; do
        step "loop fp8 rope $rope" "${LOOP_LIMIT:-150}" env DEEPGAP_DECODE_ROPE=$rope python benchmarks/llm_decode_loop.py \
            --precision fp8 --batches "${LOOP_BATCHES:-1,4}" --pdl on --split-kv off,auto --profile --out "$OUT" \
            > "$OUT/levers-$rope.txt" 2>&1
        grep "^{" "$OUT/levers-$rope.txt" | cut -c1-400; grep -v "^{" "$OUT/levers-$rope.txt" | grep -i "error\|Trace" | head
    done ;;
harness)
    step "loop fp8 own vs deepgap step" "${LOOP_LIMIT:-150}" env DEEPGAP_DECODE_ROPE=fused python benchmarks/llm_decode_loop.py \
        --precision fp8 --batches 1 --pdl on,auto --split-kv auto --harness own,deepgap --profile --out "$OUT" \
        > "$OUT/harness.txt" 2>&1
    grep "^{" "$OUT/harness.txt" | cut -c1-400; grep -v "^{" "$OUT/harness.txt" | grep -i "error\|Trace" | head ;;
diag)
    S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
    for tel in telemetry no-telemetry; do
        flag=(); [ $tel = no-telemetry ] && flag=(--no-telemetry)
        step "8b fp8 bs1, $tel" "${DIAG_LIMIT:-100}" python -m deepgap run --workload decode --models llama-3.1-8b \
            --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 --no-thermal-warmup \
            --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 "${flag[@]}" \
            --store "$S/diag-$tel.sqlite" > "$OUT/diag-$tel.txt" 2>&1
        python -m deepgap export "$S/diag-$tel.sqlite" --format csv -o "$OUT/diag-$tel.csv" >/dev/null 2>&1
        python3 -c "import csv,sys; [print(sys.argv[2], r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], \
r['decode_pdl'], r['decode_tiles'][:400]) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/diag-$tel.csv" $tel
    done
    step "loop, deepgap's step" "${LOOP_LIMIT:-100}" python benchmarks/llm_decode_loop.py --precision fp8 --batches 1,4 \
        --pdl auto --combine kernel,last-block --harness deepgap --out "$OUT" > "$OUT/diag-loop.txt" 2>&1
    grep "^{" "$OUT/diag-loop.txt" | cut -c1-900 ;;
sweep8b)
    bash results/h200/session19/device.sh sweep8b ;;
*) sed -n 2,12p "$0"; exit 2 ;;
esac
