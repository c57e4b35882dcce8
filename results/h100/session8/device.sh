#!/usr/bin/env bash
# Eighth H100 session. Usage on the device: bash results/h100/session8/device.sh STEP...
#   quant    — (QUANT_NAME=quant2 after the stem's 4-channel padding) the quant engine, ResNet-18/50/101, int8/fp8, batches 1 and 256, one sweep: the per-layer
#              table with the stem and head rows (`deepgap layers`), after the head's pool-then-scale change
#   accuracy — benchmarks/accuracy_synthetic.py trains a ResNet-50 on 100 grating classes here, then accuracy
#              mode scores eager fp32 and quant int8/fp8 at batch 256 on 1,136 held-out images
#   stem     — benchmarks/stem_variants.py: formulations of the stem convolution timed at batches 1 and 256
#   session  — peaks, profile and serve through the run session and worker protocol (kinds in runs)
#   nvml     — a small eager sweep: telemetry, the environment and device memory through nvml_access.py
#   recheck  — ResNet-50 quant int8/fp8 at batch 256 and the stem variants, after the review's refactors
#   gputests — the quant engine's and the graph runner's GPU tests
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s8; mkdir -p $S
for what in "$@"; do case $what in
quant)
    step "quant sweep" "${QUANT_LIMIT:-300}" python -m deepgap run --models resnet18,resnet50,resnet101 \
        --engines quant --precisions int8,fp8 --batch-sizes 1,256 --sweeps 1 --thermal-timeout 60 --store $S/${QUANT_NAME:-quant}.sqlite
    python -m deepgap layers $S/${QUANT_NAME:-quant}.sqlite --top 4 --model resnet50 2>&1 | head -80
    pack $S/${QUANT_NAME:-quant}.sqlite ;;
accuracy)
    step "train on synthetic gratings" 240 python benchmarks/accuracy_synthetic.py --model resnet50 --out $S/acc \
        | tee $OUT/accuracy_synthetic.json
    for e in "eager fp32" "quant int8,fp8"; do set -- $e
        step "accuracy $1" 200 python -m deepgap run --models resnet50 --engines $1 --precisions $2 --batch-sizes 256 \
            --sweeps 1 --weights $S/acc/resnet50.pt --dataset $S/acc/eval --no-telemetry --store $S/accuracy.sqlite
    done
    python -m deepgap show $S/accuracy.sqlite 2>&1 | head -40
    pack $S/accuracy.sqlite ;;
stem)
    step "stem variants" 120 python benchmarks/stem_variants.py --batch-sizes 1,256 | tee $OUT/stem_variants.jsonl ;;
session)
    step "peaks in a worker" 120 python -m deepgap peaks --device cuda --store $S/session.sqlite
    step "profile in a worker" 150 python -m deepgap profile --model resnet50 --precision fp16 --batch-size 32 \
        --device cuda --store $S/session.sqlite
    step "serve (run session kind serve)" 150 python -m deepgap serve --model resnet50 --engine quant --precision int8 \
        --scenario offline --device cuda --store $S/session.sqlite --json
    python3 -c "import sqlite3,sys;c=sqlite3.connect(sys.argv[1])
for r in c.execute('select run_id, kind, status from runs'): print(r)" $S/session.sqlite
    pack $S/session.sqlite ;;
nvml)
    step "one small sweep (NVML through nvml_access)" 150 python -m deepgap run --models resnet18 --engines eager \
        --precisions fp16 --batch-sizes 1,32 --sweeps 1 --thermal-timeout 15 --store $S/nvml.sqlite
    python3 -c "import sqlite3,json,sys;c=sqlite3.connect(sys.argv[1])
for (e,) in c.execute('select env_json from runs'): d=json.loads(e); print({k: d.get(k) for k in ('device_name','gpu_name','nvml','driver','power_limit_w')})
for b,u,e in c.execute('select batch_size, device_mem_used_bytes, extra_json from results'):
    t=json.loads(e).get('telemetry',{}); print(b, u, t.get('energy_source'), t.get('joules_per_image'), t.get('n_samples'))" $S/nvml.sqlite
    pack $S/nvml.sqlite ;;
recheck)
    step "quant after the review" 200 python -m deepgap run --models resnet50 --engines quant --precisions int8,fp8 \
        --batch-sizes 256 --sweeps 1 --thermal-timeout 15 --store $S/recheck.sqlite
    python -m deepgap layers $S/recheck.sqlite --top 2 2>&1 | head -20
    step "stem variants" 60 python benchmarks/stem_variants.py --batch-sizes 256 | tee $OUT/stem_variants_recheck.jsonl
    pack $S/recheck.sqlite ;;
gputests)
    step "GPU tests" "${TEST_LIMIT:-240}" python -m pytest tests/test_quant_gpu.py tests/test_graph_runner_gpu.py \
        ${GPU_TESTS:-} -q -x -p no:cacheprovider 2>&1 | tail -30 | tee $OUT/gputests.txt ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
