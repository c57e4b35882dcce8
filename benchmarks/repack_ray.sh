#!/usr/bin/env bash
# Repack Ray's wheel small enough for one device call's 64 MiB carry (issue 34), and print the sizes.
# Ray's cp312 manylinux wheel is ~79 MB (75.6 MiB). deepgap's Ray backend needs neither the dashboard's web
# client (ray/dashboard/client/build: the browser UI, its source maps and the speedscope viewer) nor the Java
# worker jar (ray/jars/ray_dist.jar, 31 MiB compressed: only cross-language Java tasks load it). The result is
# still a wheel (RECORD rewritten to list what is left), so `pip install --no-deps --target DIR` takes it.
#
#   bash benchmarks/repack_ray.sh [RAY_VERSION] [OUT_DIR]   (defaults: the venv's ray, .carry/ray-wheel)
#
# Writes OUT_DIR/ray-V-0slim-...whl (ignored by git; never commit it), OUT_DIR/sizes.txt and the few dependency
# wheels; carry OUT_DIR (run's carry: [".carry/ray-wheel"]) and `benchmarks/fleet_gpus.sh ray` installs them.
set -euo pipefail
V=${1:-$(python3 -c 'import ray; print(ray.__version__)')}
OUT=${2:-.carry/ray-wheel}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
mkdir -p "$OUT"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$TMP" "ray==$V"
python3 - "$TMP"/ray-*.whl "$OUT" <<'EOF'
import base64, hashlib, os, sys, zipfile

src, out = sys.argv[1], sys.argv[2]
WEB = ("ray/dashboard/client/build/",)  # the dashboard's web client: HTML, JS, CSS, source maps, fonts
JAVA = ("ray/jars/",)  # the Java worker's jar


def repack(drop, tag):
    dst = os.path.join(out, os.path.basename(src).replace("-cp", f"-0{tag}-cp", 1))
    zin = zipfile.ZipFile(src)
    record = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    kept, lines = [], []
    with zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename == record or info.filename.startswith(drop):
                continue
            data = zin.read(info)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            lines.append(f"{info.filename},sha256={digest},{len(data)}")
        lines.append(f"{record},,")
        zout.writestr(record, "\n".join(lines) + "\n")
    return dst


mib = lambda p: os.path.getsize(p) / 2**20
rows = [("original wheel", src)]
rows.append(("without the dashboard web client", repack(WEB, "noweb")))
rows.append(("without the web client and the Java jar", repack(WEB + JAVA, "slim")))
with open(os.path.join(out, "sizes.txt"), "w") as fh:
    for name, path in rows:
        line = f"{name}: {mib(path):.1f} MiB ({os.path.getsize(path) / 1e6:.1f} MB), fits 64 MiB: {mib(path) <= 64}"
        print(line)
        fh.write(line + "\n")
os.remove(rows[1][1])  # only the slim one is kept
EOF
# Ray's dependencies the device machine lacks (benchmarks/fleet/prepare_ray_carry.sh found these), as wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d "$OUT" jsonschema jsonschema-specifications referencing rpds-py attrs
du -ch "$OUT"/*.whl | tail -1
ls -l "$OUT"
