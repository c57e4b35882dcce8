#!/usr/bin/env bash
# Issue 34 on a multi-GPU host (device kinds nvidia-h100-x2/x4, nvidia-h200-x2/x4), from the repository root:
#   bash benchmarks/fleet_gpus.sh STEP...      (results under $OUT/fleet, stores under $S)
# Steps (run in this order; each is one device call's worth, ≤ 10 min, unless the sweep is made smaller):
#   tests   — the two-or-more-GPU test (tests/fleet/test_fleet_gpus.py) and the guards' CPU tests
#   all     — the sweep with --devices $ALL (default: all)            → devices-all.sqlite
#   one     — the same sweep on one GPU of the same host ($ONE)        → one-gpu.sqlite
#   lanes2  — the same sweep on 2 lanes ($TWO)                         → lanes-2.sqlite
#   lanes4  — the same sweep on 4 lanes ($FOUR; skipped with < 4)      → lanes-4.sqlite
#   agree   — per-configuration agreement of every lanes store with one-gpu.sqlite (benchmarks/fleet_agreement.py)
#             and the speed-ups from the recorded wall times
#   cards   — $CARDS_SWEEP on every card (--every-card) → cards.sqlite, the card-to-card table and a report
#   ray     — the sweep with --ray local, if a repacked Ray wheel was carried (.carry/ray-wheel/*.whl,
#             benchmarks/repack_ray.sh)                            → ray.sqlite
# Parameters (environment): SWEEP (default "--preset gpu --sweeps 2"), CARDS_SWEEP, ALL, ONE, TWO, FOUR, S.
# Each run gets fresh compiler caches (Triton, Inductor, deepgap's engine cache), so none profits from another's.
# On a CPU (checks the script, not the numbers): ALL=fake-cpu:0,fake-cpu:1 ONE=cpu TWO=fake-cpu:0,fake-cpu:1
#   FOUR=fake-cpu:0,fake-cpu:1,fake-cpu:2,fake-cpu:3 SWEEP="--models tinycnn --resolution 32 ..." OUT=/tmp/o
set -uo pipefail
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/out}; R=$OUT/fleet; S=${S:-/tmp/fleet34}; mkdir -p "$R" "$S"
read -r -a SW <<< "${SWEEP:---preset gpu --sweeps 2}"
read -r -a CS <<< "${CARDS_SWEEP:---models resnet50,resnet18 --engines compile-freeze,cudagraph --precisions fp16 --batch-sizes 1,256 --sweeps 2}"
ALL=${ALL:-all}; ONE=${ONE:-cuda:0}; TWO=${TWO:-cuda:0,cuda:1}; FOUR=${FOUR:-cuda:0,cuda:1,cuda:2,cuda:3}
NGPU=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)

fresh() {  # fresh compiler caches for the next run only
    local c; c=$(mktemp -d "$S/cache.XXXX")
    export TRITON_CACHE_DIR=$c/triton TORCHINDUCTOR_CACHE_DIR=$c/inductor DEEPGAP_CACHE=$c/deepgap
}
pack() { python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$1" \
         && gzip -c "$1" > "$R/$(basename "$1").gz"; }
sweep() {  # sweep NAME DEVICE-FLAGS...: the sweep into $S/NAME.sqlite, its wall time into $R/NAME.wall_s
    local name=$1; shift; rm -f "$S/$name.sqlite"*; fresh
    local cmd=(python3 -m deepgap run "${SW[@]}" "$@" --store "$S/$name.sqlite")
    echo "\$ deepgap ${cmd[*]:3}" | tee "$R/$name.cmd"
    local t0; t0=$(date +%s.%N)
    "${cmd[@]}" > "$R/$name.log" 2>&1; local rc=$?
    python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 1))" "$t0" "$(date +%s.%N)" \
        > "$R/$name.wall_s"
    echo "$name: rc=$rc in $(cat "$R/$name.wall_s") s"; tail -3 "$R/$name.log"; pack "$S/$name.sqlite"
}

for what in "$@"; do case $what in
tests)
    python3 -m pytest -q -p no:cacheprovider tests/fleet/test_fleet_gpus.py tests/core/test_guards.py -rA > "$R/tests.txt" 2>&1
    tail -6 "$R/tests.txt" ;;
all)    sweep devices-all --devices "$ALL" ;;
one)    sweep one-gpu --device "$ONE" ;;
lanes2) sweep lanes-2 --devices "$TWO" ;;
lanes4) if [ "$NGPU" -ge 4 ] || [[ $FOUR == fake-cpu* ]]; then sweep lanes-4 --devices "$FOUR"
        else echo "lanes4: skipped, $NGPU GPU(s) visible"; fi ;;
agree)
    T1=$(cat "$R/one-gpu.wall_s" 2>/dev/null || echo nan)
    { echo "| run | wall s | speed-up over one GPU | agreement |"; echo "|---|---:|---:|---|"; } > "$R/speedup.md"
    for name in devices-all lanes-2 lanes-4 ray; do
        [ -f "$S/$name.sqlite" ] || continue
        python3 benchmarks/fleet_agreement.py "$S/one-gpu.sqlite" "$S/$name.sqlite" --label "$name" --out "$R"
        verdict=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('met' if d['met'] else 'NOT met', \
            f\"({100*d['share_within_3pct']:.0f}% within 3%, worst {100*d['worst_rel_diff']:.1f}%)\")" "$R/agreement-$name.json")
        W=$(cat "$R/$name.wall_s" 2>/dev/null || echo nan)
        python3 -c "import sys; w, t = float(sys.argv[2]), float(sys.argv[3]); \
            print(f'| {sys.argv[1]} | {w:.0f} | {t / w:.2f}x | {sys.argv[4]} |')" "$name" "$W" "$T1" "$verdict" \
            >> "$R/speedup.md"
    done
    cat "$R/speedup.md" ;;
cards)
    rm -f "$S/cards.sqlite"*; fresh
    echo "\$ deepgap run ${CS[*]} --devices $ALL --every-card --store cards.sqlite" | tee "$R/cards.cmd"
    python3 -m deepgap run "${CS[@]}" --devices "$ALL" --every-card --store "$S/cards.sqlite" > "$R/cards.log" 2>&1
    echo "cards: rc=$?"; tail -3 "$R/cards.log"
    python3 - "$S/cards.sqlite" > "$R/cards.md" <<'EOF'
import sys
from deepgap.analysis.cards_section import spread_rows
from deepgap.analysis.frame import prepare
from deepgap.store import Store
s = Store(sys.argv[1], readonly=True); rows = spread_rows(prepare(s.results_frame())); s.close()
print(rows.to_markdown(index=False) if len(rows) else "no configuration measured on two or more cards")
EOF
    cat "$R/cards.md"
    python3 -m deepgap report "$S/cards.sqlite" -o "$R/cards-report/report.html" > /dev/null 2>&1 || echo "report failed"
    pack "$S/cards.sqlite" ;;
ray)
    if ls .carry/ray-wheel/*.whl > /dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --target /tmp/ray-site .carry/ray-wheel/*.whl \
            && export PYTHONPATH=$PYTHONPATH:/tmp/ray-site && sweep ray --ray local
    else echo "ray: no repacked wheel carried (.carry/ray-wheel/, see benchmarks/repack_ray.sh)"; fi ;;
*) echo "unknown step $what"; exit 2 ;;
esac; done
