#!/usr/bin/env bash
# Installs ONNX Runtime plugin-EP packages from PyPI, as a user's `pip install` would, into
# .testdata/ort-plugin-eps/ (repo-root relative): the tests put that folder in PYTHONPATH and
# check what epx finds there (tests/ort_plugin_ep.rs). The wheels are pinned by version and
# SHA-256. Idempotent: a stamp file naming them skips the work when it is already done. Needs
# python3 with pip and access to PyPI.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

DEST=.testdata/ort-plugin-eps
STAMP="$DEST/.stamp"
REQUIREMENTS="$(cat <<'REQ'
onnxruntime-ep-openvino==1.8.1 --hash=sha256:3832643158c8c187fcab6db661cde2a8c06a2b3559d95d0f2411ac0e51c5e924
onnxruntime-ep-webgpu==0.4.0 --hash=sha256:5d8c961eda91a88961cad1fb7621f389f006b18497d6ea9ecf96f729f066cbfb
REQ
)"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$REQUIREMENTS" ]]; then
    echo "ONNX Runtime plugin-EP packages already in $DEST"
    exit 0
fi
if [[ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]]; then
    echo "fetch-plugin-eps.sh: the pinned wheels are for Linux x86-64; nothing installed" >&2
    exit 0
fi
rm -rf "$DEST"
mkdir -p "$DEST"
req="$(mktemp)"
trap 'rm -f "$req"' EXIT
printf '%s\n' "$REQUIREMENTS" >"$req"
# The packages alone: ONNX Runtime itself comes from fetch-runtime.sh.
python3 -m pip install --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
    --require-hashes --target "$DEST" -r "$req"
# pip may leave group-writable files under a permissive umask; epx refuses libraries others
# could replace.
chmod -R go-w "$DEST"
printf '%s\n' "$REQUIREMENTS" >"$STAMP"
echo "ONNX Runtime plugin-EP packages ready in $DEST"
