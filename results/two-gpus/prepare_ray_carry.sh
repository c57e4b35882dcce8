#!/usr/bin/env bash
# Build .carry/ray/ for the device machine (issue 11's two-GPU run): Ray's wheel is ~79 MB, over one call's
# 64 MiB carry limit. Unpacked, minus the Java jars and the dashboard's web client (unused by deepgap),
# and packed with xz it is ~21 MB; jsonschema and its dependencies (absent there) travel as wheels.
# Run here, in the repository root: bash results/two-gpus/prepare_ray_carry.sh [RAY_VERSION]
set -euo pipefail
V=${1:-2.60.0}
OUT=.carry/ray; TMP=$(mktemp -d)
mkdir -p "$OUT"
PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$TMP" "ray==$V"
python3 -m pip download -q --no-deps "${PLAT[@]}" -d "$OUT" jsonschema jsonschema-specifications referencing \
    rpds-py attrs
(cd "$TMP" && unzip -q ray-*.whl && rm -rf ray/jars ray/dashboard/client && \
    tar cf - ray ray-*.dist-info | xz -6 -T0 > "$OLDPWD/$OUT/ray-$V-slim.tar.xz")
rm -rf "$TMP"
du -sh "$OUT"
