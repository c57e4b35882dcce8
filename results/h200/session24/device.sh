#!/usr/bin/env bash
# Session 24's recipes on one H200 (run from the repository root by the device tool, $OUT set; .whl/ carried).
#   call 1  TEST_LIMIT=300 bash benchmarks/device.sh gputests   (25 decode tests failed: Triton 3.6 and attend_rows)
#   call 2  bash results/h200/session24/device.sh decode
#   call 3  DEFAULT_LIMIT=590 bash benchmarks/device.sh default
#   call 4  bash benchmarks/fused_mlp.sh engine epilogue      (GELU erf: then the default; now DEEPGAP_QUANT_GELU=erf)
#   call 5  export DEEPGAP_QUANT_GELU=tanh; DEVICE_WORK=/tmp/dg-tanh bash benchmarks/fused_mlp.sh engine   (now the default)
#   call 6  source benchmarks/device_lib.sh; step loop 110 python benchmarks/transformer_quant.py --model bert-base \
#             --seq 128 --batch 256 --variants fp8-tensor-fast-fused-engine-tanh --out "$OUT"
# decode: the GPU tests of the files call 1 failed in (after the fix), the bare loop replaying deepgap's batch-1
#   fp8 step with the attention in the qkv GEMV or by the split kernel, and the max-pool fused int8 stem beside
#   the unfused pair
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
decode)
    # (the tree's paths since the tests moved into package folders later this session; call 2 ran the flat ones)
    T=(tests/measure/test_llm_attention.py tests/measure/test_llm_decode_sweep.py tests/measure/test_llm_fused.py
       tests/measure/test_llm_fused_rope.py tests/measure/test_llm_qkv_attention.py tests/measure/quant/test_l2_prefetch.py
       tests/serving/test_serving_llm_engines.py tests/measure/quant/test_quant_linear_gpu.py)
    step "decode GPU tests" 150 python -m pytest -q -m gpu -n 4 "${T[@]}" -p no:cacheprovider > "$OUT/decode-tests.txt" 2>&1
    grep -E "FAILED|ERROR" "$OUT/decode-tests.txt" | cut -c1-200; tail -n 2 "$OUT/decode-tests.txt"
    step "loop, deepgap's step" 130 python benchmarks/llm_decode_loop.py --precision fp8 --batches 1 --pdl on \
        --split-kv auto --attention triton,qkv --harness deepgap --out "$OUT" \
        > "$OUT/decode-loop.txt" 2>&1
    grep "^{" "$OUT/decode-loop.txt" | cut -c1-600; grep -v "^{" "$OUT/decode-loop.txt" | grep -i "error\|Trace" | head
    step "stem pool" 40 python benchmarks/stem_pool.py --batch-sizes 1,256,1024 > "$OUT/stem-pool.txt" 2>&1
    tail -n 14 "$OUT/stem-pool.txt" ;;
*) sed -n 2,9p "$0"; exit 2 ;;
esac
