#!/usr/bin/env bash
# Session 40 (2026-12-05), issue 51, asked as nvidia-h200: o's weights asked of L2 by the attention kernel's programs
# while HBM idles (DEEPGAP_DECODE_PREFETCH=attention, `l2_prefetch.spread`), against off; and session 39's pending
# H200 timing of the handed norm's sums read early (`GemvTile.early`, `fused_variants.py`).
# From the repository root on the device, $OUT set, `.whl/` carried:   bash results/h200/session40/device.sh N
set -uo pipefail
source benchmarks/device_lib.sh
loop() {  # loop NAME LIMIT EXTRA...: the bare loop replaying deepgap's own step (8B, batch 1, PDL on, split KV auto)
    local name=$1 limit=$2; shift 2
    step "decode loop $name" "$limit" python benchmarks/llm_decode_loop.py --model llama-3.1-8b --batches 1 \
        --pdl on --split-kv auto --harness deepgap "$@" --out "$OUT" > "$OUT/loop-$name.txt" 2>&1
    grep -v '^{' "$OUT/loop-$name.txt" | grep -v "^ *$" | tail -n 40
    grep '^{' "$OUT/loop-$name.txt" | python3 -c "import json,sys; [print(r['precision'], r['prefetch'], r['forced_tiles'], \
r['tpot_ms'], r['decode_tok_s'], r.get('timeline_step_us'), r.get('tiles', '')[:700]) for r in map(json.loads, sys.stdin)]"
}
case ${1:-} in
# 1 — the GPU tests (the PDL graph's logits bit for bit with each prefetch mode; the attention kernel's own); the
#     bare loop off against attention with `--timeline` (each kernel's share of the critical path); every fold per
#     tile with the handed sums early and late (`fused_variants.py`)
1) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gpu tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_l2_prefetch.py \
       tests/measure/test_llm_attention.py -rA -p no:cacheprovider > "$OUT/gputests-1.txt" 2>&1
   tail -n 12 "$OUT/gputests-1.txt"
   loop prefetch-1 240 --precision fp8 --prefetch off,attention --timeline
   step "fused variants" 120 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-1.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-1.txt" ;;
# 2 — `deepgap run` (8B fp8, batch 1, 128/128, the defaults); not run on its own (call 1's attention prefetch lost)
2) S=${DEVICE_WORK:-/tmp/deepgap-device}; mkdir -p "$S"
   step "deepgap run 8b fp8 bs1" 150 python -m deepgap run --workload decode \
       --models llama-3.1-8b --device cuda --input-lens 128 --output-lens 128 --repeats 3 --sweeps 1 \
       --no-thermal-warmup --no-cpu-baseline --engines quant --precisions fp8 --batch-sizes 1 \
       --store "$S/run.sqlite" > "$OUT/run-2.txt" 2>&1
   python -m deepgap export "$S/run.sqlite" --format csv -o "$OUT/run-2.csv" >/dev/null 2>&1
   python3 -c "import csv,sys; [print(r['decode_tokens_per_s'], r['pipelined_decode_tokens_per_s'], r['tpot_tail_label'], r['tpot_tail_ms'], \
r['decode_pdl'], r['decode_attention'], r['decode_tiles'][:160]) for r in csv.DictReader(open(sys.argv[1]))]" "$OUT/run-2.csv" ;;
# 3 — the GEMV's loads against its arithmetic: one tile with the math taken away in steps (`gemv_ceiling.py`); the
#     bare loop with o's GEMV forced to one-step tiles that are one wave with the whole band read before PDL's wait
#     (8 x 4096 with 4 warps: 128 registers, 4 programs an SM, 512 programs; 16 x 4096 with 8 warps: 2 an SM, 256)
3) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gemv ceiling" 200 python benchmarks/gemv_ceiling.py --out "$OUT" > "$OUT/gemv-ceiling-3.txt" 2>&1
   python3 -c "import json,sys; [print(r['shape'], r['codes'], r['tile'], r['math'], r.get('us'), r.get('TBps'), \
r.get('error', '')) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/gemv_ceiling.jsonl"
   tail -n 3 "$OUT/gemv-ceiling-3.txt"
   loop tiles-3 200 --precision fp8 --tiles "tuned;4096x4096=8x4096w4;4096x4096=16x4096w8" ;;
# 4 — step 3, and the codes made fp32 by integer ops (`gemv_bits`, GemvTile.bits, now among the tuner's candidates):
#     its GPU tests, every fold per tile (`fused_variants.py`), the bare loop tuned and with each GEMV forced to its
#     one-step tile without bits, with bits (4 and 8 warps), and o in one wave (16 x 4096, 8 warps)
4) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gpu tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_gemv_bits.py tests/measure/test_llm_fused.py \
       -rA -p no:cacheprovider > "$OUT/gputests-4.txt" 2>&1
   tail -n 8 "$OUT/gputests-4.txt"
   step "gemv ceiling" 150 python benchmarks/gemv_ceiling.py --out "$OUT" > "$OUT/gemv-ceiling-4.txt" 2>&1
   python3 -c "import json,sys; [print(r['shape'], r['codes'], r['tile'], r['math'], r.get('us'), r.get('TBps'), \
r.get('error', '')) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/gemv_ceiling.jsonl"
   step "fused variants" 120 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-4.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-4.txt"
   G=4096x28672 Q=4096x6144 O=4096x4096 D=14336x4096
   loop tiles-4 240 --precision fp8 --tiles "tuned;$G=4x4096w4,$Q=4x4096w4,$O=8x2048w8,$D=8x2048w8;\
$G=4x4096w4b,$Q=4x4096w4b,$O=8x2048w8b,$D=8x2048w8b;$G=4x4096w8b,$Q=4x4096w8b,$O=8x2048w8b,$D=8x2048w8b;$O=16x4096w8" ;;
# 5 — for an H200 after call 4 ran on an H100: the ceiling (down's tile now fitted to its K), and the bare loop in fp8
#     and int8, tuned (bits among the candidates) and with every GEMV forced to its one-step tile without and with bits
5) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gemv ceiling" 150 python benchmarks/gemv_ceiling.py --out "$OUT" > "$OUT/gemv-ceiling-5.txt" 2>&1
   python3 -c "import json,sys; [print(r['shape'], r['codes'], r['tile'], r['math'], r.get('us'), r.get('TBps'), \
r.get('error', '')[:80]) for r in map(json.loads, open(sys.argv[1]))]" "$OUT/gemv_ceiling.jsonl"
   G=4096x28672 Q=4096x6144 O=4096x4096 D=14336x4096
   T="tuned;$G=4x4096w4,$Q=4x4096w4,$O=8x2048w8,$D=8x2048w8;$G=4x4096w4b,$Q=4x4096w4b,$O=8x2048w8b,$D=8x2048w8b"
   loop bits-fp8-5 200 --precision fp8 --tiles "$T"
   loop bits-int8-5 200 --precision int8 --tiles "$T" ;;
# 6 — the next K step's weights loaded while this one is summed (`gemv_steps`, tiles with prefetch among the tuner's
#     candidates): the GPU tests, every fold per tile, the bare loop tuned and with down forced to 8 x 2048 without and
#     with it, fp8 and int8
6) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   step "gpu tests" 150 python -m pytest -q -m gpu tests/measure/quant/test_gemv_steps.py tests/measure/test_llm_fused.py \
       -rA -p no:cacheprovider > "$OUT/gputests-6.txt" 2>&1
   tail -n 9 "$OUT/gputests-6.txt"
   step "fused variants" 150 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-6.txt" 2>&1
   tail -n 12 "$OUT/fused-variants-6.txt"
   T="tuned;14336x4096=8x2048w8;14336x4096=8x2048w8p"
   loop ahead-fp8-6 200 --precision fp8 --tiles "$T"
   loop ahead-int8-6 200 --precision int8 --tiles "$T" ;;
# 7 — the session's last tree end to end: `deepgap run` (8B fp8, batch 1, 128/128, the defaults) and the bare loop;
#     on an H200 also the GEMV ceiling, which only an H100 has run
7) nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
   bash "$0" 2
   loop final-7 120 --precision fp8
   if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
       step "gemv ceiling" 120 python benchmarks/gemv_ceiling.py --out "$OUT" > "$OUT/gemv-ceiling-7.txt" 2>&1
       python3 -c "import json,sys; [print(r['shape'], r['codes'], r['tile'], r['math'], r.get('us'), r.get('TBps')) \
for r in map(json.loads, open(sys.argv[1]))]" "$OUT/gemv_ceiling.jsonl"
   fi ;;
# 8 — NOT RUN in session 40 (its device time was spent): each step's products summed within the thread, across
#     threads once (`gemv.IN_THREAD_TILES`, not yet among the tuner's candidates): down's GEMV with it against
#     without at the 8B shape (fp8, bf16 tolerance); the ceiling's gemv-in-thread mode; every fold per tile with the
#     in-thread tiles too; the bare loop tuned and with down forced to 8 x 2048 each way (about 250 s)
8) nvidia-smi --query-gpu=name --format=csv,noheader
   step "in-thread check" 60 python -c "
import torch, dataclasses
from deepgap.measure.quant import gemv
from deepgap.measure.quant.gemv_fused import Fusion, fused_gemv
g = torch.Generator(device='cuda').manual_seed(0)
codes = (torch.randn(4096, 14336, device='cuda', generator=g) * 40).clamp(-440, 440).to(torch.float8_e4m3fn)
x, s = torch.randn(1, 14336, device='cuda').bfloat16(), torch.rand(4096, device='cuda') / 40
f, t = Fusion(residual=torch.randn(1, 4096, device='cuda').bfloat16()), gemv.GemvTile(8, 2048, 1, 8, 1, 0, 1)
a, b = (fused_gemv(x, codes, s, f, u).float() for u in (t, dataclasses.replace(t, reduce_each=2)))
print('in-thread against reduce-each: max rel', float((a - b).abs().max() / a.abs().max()))
assert torch.allclose(a, b, rtol=2**-7, atol=1e-2)"
   step "gemv ceiling" 120 python benchmarks/gemv_ceiling.py --out "$OUT" > "$OUT/gemv-ceiling-8.txt" 2>&1
   python3 -c "import json,sys; [print(r['shape'], r['codes'], r['tile'], r['math'], r.get('us'), r.get('TBps')) \
for r in map(json.loads, open(sys.argv[1])) if r['math'] in ('load', 'gemv', 'gemv-in-thread')]" "$OUT/gemv_ceiling.jsonl"
   step "fused variants" 150 python benchmarks/fused_variants.py --out "$OUT" > "$OUT/fused-variants-8.txt" 2>&1
   grep -h "reduce_each=2" "$OUT/fused_variants.jsonl" | python3 -c "import json,sys; [print(r['shape'], r['variant'], \
r['tile'][8:60], r['us']) for r in map(json.loads, sys.stdin)]"
   tail -n 12 "$OUT/fused-variants-8.txt"
   loop in-thread-8 150 --precision fp8 --tiles "tuned;14336x4096=8x2048w8;14336x4096=8x2048w8t" ;;
*) echo "usage: $0 1|2|3|4|5|6|7|8"; exit 2 ;;
esac
