#!/usr/bin/env bash
# Tenth H100 session. Usage on the device: bash results/h100/session10/device.sh STEP...
#   prelude — benchmarks/prelude_check.sh: serve and a one-GPU local fleet store their idle baseline and thermal
#             warm-up (stores packed into $OUT)
#   smoke   — a short two-sweep GPU run through the merged worker, records and precision table: ResNet-18 eager fp16
#             and quant int8 at batch 1 and 256
#   gputests — every test marked gpu (the ones CI skips)
set -uo pipefail
source benchmarks/device_lib.sh  # PYTHONPATH, the carried LoadGen wheel, step(), pack()
S=/tmp/s10; mkdir -p $S
for what in "$@"; do case $what in
prelude)
    step "prelude check" 240 bash benchmarks/prelude_check.sh $S/prelude > $OUT/prelude_check.txt 2>&1
    tail -40 $OUT/prelude_check.txt
    pack $S/prelude/serve.sqlite; pack $S/prelude/fleet.sqlite ;;
smoke)
    step "smoke sweep" 200 python -m deepgap run --models resnet18 --engines eager,quant --precisions fp16,int8 \
        --batch-sizes 1,256 --sweeps 2 --thermal-warmup --thermal-timeout 30 --store $S/smoke.sqlite \
        > $OUT/smoke.txt 2>&1
    tail -8 $OUT/smoke.txt; pack $S/smoke.sqlite ;;
gputests)
    N=(); python -c "import xdist" 2>/dev/null && N=(-n 4)
    step "GPU tests" "${TEST_LIMIT:-300}" python -m pytest -q -m gpu "${N[@]}" tests -p no:cacheprovider > $OUT/gputests.txt 2>&1
    tail -8 $OUT/gputests.txt ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
