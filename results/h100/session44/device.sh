#!/usr/bin/env bash
# Session 44 (2026-12-05): the four calls that ran, on one H100 (asked for nvidia-h200), from the repository root
# with $OUT set and `.whl/` carried. Usage: bash results/h100/session44/device.sh N (N = 1..4, the README's calls).
set -uo pipefail
case ${1:-} in
1) source benchmarks/device_lib.sh  # issue 51: the prefill eager, then compiled (llm_steps.make_prefill's form)
   nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
   step "decode loop bs512 kv fp8, prefill eager then compiled" 400 python benchmarks/llm_decode_loop.py \
       --model llama-3.1-8b --batches 512 --precision fp8 --harness deepgap --kv-cache fp8 --steps 31 \
       --prefill eager,compiled --out "$OUT" > "$OUT/prefill-loop-3.txt" 2>&1
   grep '^{' "$OUT/prefill-loop-3.txt" | cut -c1-300; tail -n 4 "$OUT/prefill-loop-3.txt" ;;
2) source benchmarks/device_lib.sh >/dev/null 2>&1  # the row-quant kernel's GPU tests
   timeout 90 python -m pytest -q -p no:cacheprovider -m gpu tests/measure/quant/test_quant_row_quant_gpu.py -rA \
       2>&1 | tail -n 12 | tee "$OUT/rowquant-gputests-4.txt" ;;
3) source benchmarks/device_lib.sh >/dev/null 2>&1  # the compile engine's decode (its prefill compiled) against fp32
   timeout -k 5 95 python -m pytest -q -p no:cacheprovider -m gpu \
       "tests/measure/test_llm_decode_sweep.py::test_gpu_steps_agree_with_fp32[compile]" -rA 2>&1 | tail -n 6 \
       | tee "$OUT/prefill-gputest-5.txt" ;;
4) source benchmarks/device_lib.sh >/dev/null 2>&1  # the same, compile-reduce-overhead
   timeout -k 5 70 python -m pytest -q -p no:cacheprovider -m gpu \
       "tests/measure/test_llm_decode_sweep.py::test_gpu_steps_agree_with_fp32[compile-reduce-overhead]" -rA 2>&1 \
       | tail -n 3 | tee "$OUT/prefill-gputest-6.txt" ;;
*) echo "usage: $0 1|2|3|4"; exit 2 ;;
esac
