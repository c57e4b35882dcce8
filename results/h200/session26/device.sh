#!/usr/bin/env bash
# Session 26's recipes on one H200 (run from the repository root by the device tool, $OUT set; .whl/ carried).
#   call 1  DEFAULT_CONFIG=benchmarks/gpu-quant1024.toml DEFAULT_LIMIT=590 bash benchmarks/device.sh default
#           (the main job with quant at batch 1 and 1024; that sweep file is now the gpu preset and was removed)
#   call 2  bash results/h200/session26/device.sh stem; TEST_LIMIT=240 bash benchmarks/device.sh gputests
#   call 3  DEFAULT_LIMIT=590 bash benchmarks/device.sh default   (the README's main job on the final tree)
# stem: the int8-pixel stem's convolution and max-pool timed apart (benchmarks/stem_split.py), then ResNet-50 quant
#   at batch 1024 in `deepgap run` with the persistent convolution and the max-pool on codes offered
set -uo pipefail
source benchmarks/device_lib.sh
case ${1:-} in
stem)
    step "stem split" 150 python benchmarks/stem_split.py --batch-sizes 1,256,1024 > "$OUT/stem_split.txt" 2>&1
    grep summary "$OUT/stem_split.txt" | cut -c1-700; grep -i "error\|Trace" "$OUT/stem_split.txt" | head -5
    step "resnet50 quant bs1024" 150 python -m deepgap run --models resnet50 --engines quant --precisions fp8,int8 \
        --batch-sizes 1024 --sweeps 1 --no-cpu-baseline --no-thermal-warmup --store /tmp/rn50-1024.sqlite \
        > "$OUT/rn50-1024.txt" 2>&1
    tail -n 6 "$OUT/rn50-1024.txt"
    python -m deepgap export /tmp/rn50-1024.sqlite -o "$OUT/rn50-1024.csv" > /dev/null 2>&1 || true
    python - <<'PY' 2>&1 | tee "$OUT/rn50-1024-stem.txt"
import json, sqlite3
con = sqlite3.connect("/tmp/rn50-1024.sqlite")
for (extra,) in con.execute("select extra_json from results"):
    info = json.loads(extra or "{}").get("engine_info", {})
    st = info.get("stem", {})
    print(json.dumps({"stem": st.get("chosen"), "seconds": st.get("seconds")})[:900])
PY
    ;;
*) echo "usage: $0 stem" >&2; exit 2 ;;
esac
