# Shared by the benchmarks/device.sh recipes and the dated results/<machine>/session*/device.sh scripts (source it): the LoadGen wheel from .whl/ if carried,
# `step NAME LIMIT_S CMD...` (a timed, labelled, time-limited step: SIGTERM at the limit, SIGKILL 10 s later, so
# a step that ignores SIGTERM cannot hold the rest of the call, as a hung GPU test did in session 18) and `pack STORE` (checkpoint the WAL,
# gzip the store into $OUT). Stores live outside the repository folder on the device, because the device
# tool's working-tree sync deletes untracked files there between calls.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    # one wheel at a time: a compiled wheel for another Python (cp311 on a 3.12 device) is refused alone
    for w in .whl/*.whl; do
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w" \
            2>/dev/null || echo "device_lib: $(basename "$w") does not install on this Python; skipped"
    done
    export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
# Compile caches (Triton's and Inductor's) under $COMPILE_CACHE: a fresh machine compiles the 8B server's step
# and prefills for minutes with its GPU idle (session 50: still compiling 243 s in, on an H100; session 49, on a
# machine warm from earlier calls, built in under 2 min). A call that carries .carry/compile-cache.tar.xz
# starts from it; `cache_save` packs the caches into $OUT as out-compile-cache.txz.NN (parts of 15 MiB, the
# device tool's 16 MiB a file), which `cat out-compile-cache.txz.* > .carry/compile-cache.tar.xz` here
# joins for the next call's `carry` (an ignored folder).
COMPILE_CACHE=${COMPILE_CACHE:-/tmp/compile-cache}
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$COMPILE_CACHE/triton}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$COMPILE_CACHE/inductor}
if [ -f .carry/compile-cache.tar.xz ] && [ ! -e "$COMPILE_CACHE/.restored" ]; then
    mkdir -p "$COMPILE_CACHE" && tar -xJf .carry/compile-cache.tar.xz -C "$COMPILE_CACHE" \
        && touch "$COMPILE_CACHE/.restored" \
        && echo "device_lib: compile caches restored from .carry ($(du -sh "$COMPILE_CACHE" | cut -f1))"
fi
cache_save() {
    [ -d "$COMPILE_CACHE" ] || { echo "device_lib: no compile cache to save"; return 0; }
    rm -f "$OUT"/out-compile-cache.txz.*
    tar -cf - -C "$COMPILE_CACHE" --exclude=.restored . | xz -T0 -6 | split -b 15M -d - "$OUT/out-compile-cache.txz."
    echo "device_lib: compile caches ($(du -sh "$COMPILE_CACHE" | cut -f1)) saved as" \
        "$(find "$OUT" -name 'out-compile-cache.txz.*' | wc -l) part(s), $(du -ch "$OUT"/out-compile-cache.txz.* | tail -n 1 | cut -f1)"
    # a call carries at most 64 MiB with the ~10 MB tree: past ~45 MiB the archive cannot travel back
    [ "$(cat "$OUT"/out-compile-cache.txz.* | wc -c)" -le $((45 * 1048576)) ] \
        || echo "device_lib: the compile caches are over 45 MiB packed: too large to carry with the tree"
}
step() { local n=$1 l=$2; shift 2; echo "######## $n ($(date +%T), limit ${l}s)"; local t0=$SECONDS
         timeout -k 10 "$l" "$@"; echo "######## $n: rc=$? in $((SECONDS - t0))s"; }
# pack STORE: the store gzipped into $OUT (to read here, never to commit), and its CSV export beside it, the
# form results are committed in (docs/results.md).
pack() { python3 -c "import sqlite3,sys; sqlite3.connect(sys.argv[1]).execute('PRAGMA wal_checkpoint(TRUNCATE)')" "$1" \
         && gzip -c "$1" > "$OUT/$(basename "$1").gz" \
         && python -m deepgap export "$1" --format csv -o "$OUT/$(basename "$1" .sqlite).csv" >/dev/null 2>&1; }
# report_csvs DIR: a report's CSV tables (answer.csv, configurations.csv, ...) into $OUT/DIR-csv/.
report_csvs() { mkdir -p "$OUT/$(basename "$1")-csv" && cp "$1"/report_files/*.csv "$OUT/$(basename "$1")-csv/" 2>/dev/null; }
# switch_ab ENV BATCH NAME LIMIT WHAT: ResNet-50 quant fp8 and int8 at BATCH in `deepgap run` (one sweep, no
# warm-up, no CPU baseline) with the engine switch ENV off, then on; each store's CSV export and what the engine
# kept (`engine_kept.py WHAT`) into $OUT/NAME-off.*, NAME-on.*. Stores under $S (or /tmp/deepgap-device).
switch_ab() {
    local env=$1 batch=$2 name=$3 limit=$4 what=$5 mode store
    for mode in off on; do
        store="${S:-/tmp/deepgap-device}/$name-$mode.sqlite"; mkdir -p "$(dirname "$store")"
        step "resnet50 quant bs$batch, $env=$mode" "$limit" env "$env=$mode" python -m deepgap run --models resnet50 \
            --engines quant --precisions fp8,int8 --batch-sizes "$batch" --sweeps 1 --no-cpu-baseline \
            --no-thermal-warmup --store "$store" > "$OUT/$name-$mode.txt" 2>&1
        grep "img/s" "$OUT/$name-$mode.txt" | tail -n 2
        python -m deepgap export "$store" -o "$OUT/$name-$mode.csv" > /dev/null 2>&1 || true
        python benchmarks/engine_kept.py "$store" "$what" 2>&1 | tee "$OUT/$name-$mode-kept.txt"
    done
}
# stamp: prefix each line of stdin with the seconds since it started (where a long run's time goes).
stamp() { python3 -u -c 'import sys, time
t0 = time.monotonic()
for line in sys.stdin: sys.stdout.write(f"{time.monotonic() - t0:7.1f} {line}")'; }
# bundle: the device tool returns at most 8 files from $OUT (session 25 lost two JSON files that way), so when a
# recipe's shell exits with more than 8 there, every file but earlier bundles goes into one archive, out-N.tar.gz
# (a recipe that runs another recipe bundles at each exit; the archives add up, and none is packed again).
bundle() {
    [ -n "${OUT:-}" ] && [ -d "$OUT" ] || return 0
    local n k=1; n=$(find "$OUT" -type f | wc -l); [ "$n" -gt 8 ] || return 0
    while [ -e "$OUT/out-$k.tar.gz" ]; do k=$((k + 1)); done  # out-*: earlier bundles, saved caches
    (cd "$OUT" && find . -type f ! -name 'out-*' -print0 | tar czf "out-$k.tar.gz" --null -T - --remove-files) \
        && echo "device_lib: $n files in \$OUT packed into out-$k.tar.gz (the device tool returns 8)"
}
trap bundle EXIT
# session_opening: what a dated session script does first: the card's name into $gpu (and printed), a folder $S
# for stores (/tmp/dg, outside the repository), and `exp NAME`, $S/NAME.sqlite's CSV export into $OUT/NAME.csv
# (nothing where the store is missing: the step that made it failed, and said so).
session_opening() {
    gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
    echo "device: $gpu"
    S=/tmp/dg; mkdir -p $S
}
exp() { python -m deepgap export "$S/$1.sqlite" -o "$OUT/$1.csv" > /dev/null 2>&1 || true; }
