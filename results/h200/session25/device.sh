#!/usr/bin/env bash
# Session 25's recipes on one H200 (run from the repository root by the device tool, $OUT set; .whl/ carried).
#   call 1  bash benchmarks/transformers_preset.sh preset       (the whole transformers preset, one store, timed)
#   call 2  bash results/h200/session25/device.sh probe
#   call 3  bash results/h200/session25/device.sh confirm      (cuDNN attention first, then the quant engine's default;
#           its preset step stopped at once: --engines quant needs --precisions fp8 with the preset's fp32/fp16)
#   call 4  bash results/h200/session25/device.sh profile      (where bert-large's and bert-base's quant time goes)
#   call 5  TEST_LIMIT=240 bash benchmarks/device.sh gputests; (cd $OUT && tar czf gputests.tar.gz gputests*.txt)
# probe: the GPU tests of the files this session touched; SDPA's backends at the encoders' shapes; bert-large at
#   sequence 384 in the bare loop (the engine's choice with the tanh GELU, its top kernels profiled, under each
#   SDPA backend); the decode step with the last-block merge (issue 51); ResNet-50 quant at batch 1024 (issue 47)
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
probe)
    T=(tests/measure/quant/test_quant_linear_gpu.py tests/measure/quant/test_quant_linear_persistent_gpu.py
       tests/measure/engines/test_bert_gpu.py)
    step "GPU tests" 150 python -m pytest -q -m gpu -n 4 "${T[@]}" -p no:cacheprovider > "$OUT/probe-tests.txt" 2>&1
    grep -E "FAILED|ERROR" "$OUT/probe-tests.txt" | cut -c1-200; tail -n 2 "$OUT/probe-tests.txt"
    step "SDPA backends" 60 python benchmarks/sdpa_backends.py --out "$OUT" > "$OUT/sdpa.txt" 2>&1
    cut -c1-200 "$OUT/sdpa.txt"
    for sdpa in auto cudnn; do
        v=fp8-tensor-fast-fused-engine-tanh; [ $sdpa = auto ] && v=fp16-compile-freeze,$v
        step "bert-large 384, sdpa $sdpa" 150 python benchmarks/transformer_quant.py --model bert-large --seq 384 \
            --batch 128 --variants $v --sdpa $sdpa --profile $([ $sdpa = auto ] && echo 30 || echo 0) \
            --iters 10 --out "$OUT" > "$OUT/bertlarge-$sdpa.txt" 2>&1
        grep -v "^{" "$OUT/bertlarge-$sdpa.txt" | tail -n 6
    done
    step "decode loop, last-block merge" 130 python benchmarks/llm_decode_loop.py --precision fp8 --batches 1 \
        --pdl on --split-kv auto --combine kernel,last-block --harness deepgap --out "$OUT" > "$OUT/decode-loop.txt" 2>&1
    grep "^{" "$OUT/decode-loop.txt" | cut -c1-400; grep -v "^{" "$OUT/decode-loop.txt" | grep -i "error\|Trace" | head
    step "resnet50 quant bs1024" 120 python -m deepgap run --models resnet50 --engines quant --precisions fp8,int8 \
        --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store /tmp/rn50-1024.sqlite \
        > "$OUT/rn50-1024.txt" 2>&1
    tail -n 6 "$OUT/rn50-1024.txt"; pack /tmp/rn50-1024.sqlite ;;
confirm)
    # the fixed GPU tests; `deepgap run` for bert-base and ViT (fused_mlp.sh engine) and the bare loop for bert-base
    # and bert-large with cuDNN first; the preset's quant rows again. One archive back (the tool returns 8 files).
    T=(tests/measure/quant/test_quant_linear_gpu.py tests/measure/quant/test_quant_linear_persistent_gpu.py
       tests/measure/engines/test_bert_gpu.py)
    step "GPU tests" 150 python -m pytest -q -m gpu -n 4 "${T[@]}" -p no:cacheprovider > "$OUT/confirm-tests.txt" 2>&1
    grep -E "FAILED|ERROR" "$OUT/confirm-tests.txt" | cut -c1-200; tail -n 2 "$OUT/confirm-tests.txt"
    DEVICE_WORK=/tmp/dg-cudnn bash benchmarks/fused_mlp.sh engine
    for m in "bert-base 128 256" "bert-large 384 128"; do set -- $m
        step "$1 $2 loop, cuDNN first" 120 python benchmarks/transformer_quant.py --model $1 --seq $2 --batch $3 \
            --variants fp8-tensor-fast-fused-engine-tanh --sdpa cudnn --out "$OUT" > "$OUT/loop-$1.txt" 2>&1
        grep -v "^{" "$OUT/loop-$1.txt" | tail -n 3
    done
    step "preset's quant rows" 240 python -m deepgap run --preset transformers --engines quant --thermal-timeout 30 \
        --store /tmp/preset-quant.sqlite 2>&1 | stamp > "$OUT/preset-quant.txt"
    tail -n 14 "$OUT/preset-quant.txt"; pack /tmp/preset-quant.sqlite
    (cd "$OUT" && tar czf confirm.tar.gz --exclude confirm.tar.gz . && find . -type f ! -name confirm.tar.gz -delete) ;;
profile)
    # the engine's choice (tanh GELU, torch's SDPA order) in the bare loop, its top 40 kernels by GPU time
    for m in "bert-large 384 128" "bert-base 128 256"; do set -- $m
        step "$1 $2 profile" 120 python benchmarks/transformer_quant.py --model $1 --seq $2 --batch $3 \
            --variants fp8-tensor-fast-fused-engine-tanh --profile 40 --out "$OUT" > "$OUT/profile-$1.txt" 2>&1
        grep -v "^{" "$OUT/profile-$1.txt" | tail -n 3
    done
    python3 - "$OUT/transformer_quant.jsonl" <<'PY'
import json, sys
for row in map(json.loads, open(sys.argv[1])):
    print(row["model"], row.get("per_s"), row.get("ms"))
    for k in row.get("kernels", [])[:25]:
        print(f'  {k["share"]:6.3f} {k["us_per_call"]:9.1f} us x{k["count"]:<3} {k["kernel"][:80]}')
PY
    ;;
*) sed -n 2,11p "$0"; exit 2 ;;
esac
