#!/usr/bin/env bash
# Fetches the ONNX Runtime CPU wheel the epx ONNX Runtime adapter is tested against and unpacks
# its shared libraries into .testdata/onnxruntime/capi/ (repo-root relative), the folder the
# tests put in EPX_ORT_SEARCH_PATH. Idempotent: a stamp file naming the version skips the work
# when it is already done. Needs python3 with pip and access to PyPI; nothing is downloaded at
# build time.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

ORT_VERSION="${EPX_ORT_VERSION:-1.31.1}"
WHEELS=.testdata/wheels
DEST=.testdata/onnxruntime/capi
STAMP=.testdata/onnxruntime/.stamp

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "onnxruntime==$ORT_VERSION" ]] && compgen -G "$DEST/libonnxruntime.so*" >/dev/null; then
    echo "onnxruntime $ORT_VERSION already in $DEST"
    exit 0
fi

mkdir -p "$WHEELS"
python3 -m pip download --disable-pip-version-check --no-deps --only-binary=:all: \
    "onnxruntime==$ORT_VERSION" -d "$WHEELS"

shopt -s nullglob
wheels=("$WHEELS"/onnxruntime-"$ORT_VERSION"-*.whl)
if [[ ${#wheels[@]} -eq 0 ]]; then
    echo "fetch-runtime.sh: no onnxruntime $ORT_VERSION wheel in $WHEELS after pip download" >&2
    exit 1
fi

rm -rf "$DEST"
mkdir -p "$DEST"
python3 - "${wheels[0]}" "$DEST" <<'PY'
import os, sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
n = 0
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        base = os.path.basename(name)
        if name.startswith("onnxruntime/capi/") and base.startswith("lib") and ".so" in base and "/" not in name[len("onnxruntime/capi/"):]:
            with z.open(name) as src, open(os.path.join(dest, base), "wb") as out:
                out.write(src.read())
            os.chmod(os.path.join(dest, base), 0o755)
            n += 1
if n == 0:
    sys.exit(f"fetch-runtime.sh: {wheel} holds no onnxruntime/capi/*.so*")
print(f"extracted {n} libraries from {os.path.basename(wheel)} into {dest}")
PY
# The wheel ships only the versioned file (libonnxruntime.so.1.x.y); add the names a loader asks for.
for lib in "$DEST"/libonnxruntime.so.*.*.*; do
    ln -sf "$(basename "$lib")" "$DEST/libonnxruntime.so.1"
    ln -sf "$(basename "$lib")" "$DEST/libonnxruntime.so"
done
echo "onnxruntime==$ORT_VERSION" > "$STAMP"
echo "onnxruntime $ORT_VERSION ready in $DEST"
