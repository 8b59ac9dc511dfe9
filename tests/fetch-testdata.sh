#!/usr/bin/env bash
# Fetches the ONNX backend node tests (onnx/backend/test/data/node/**) from the onnx 1.22.0
# wheel on PyPI into .testdata/onnx-node/ at the repository root, so that e.g.
# .testdata/onnx-node/test_abs/model.onnx exists. Needs python3 with pip and network access to
# PyPI. Safe to run again: once the stamp file is written, it does nothing.
set -euo pipefail

ONNX_VERSION=1.22.0

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
testdata="$repo_root/.testdata"
wheels="$testdata/wheels"
dest="$testdata/onnx-node"
stamp="$dest/.fetched-onnx-$ONNX_VERSION"

if [[ -f "$stamp" ]]; then
    echo "onnx node tests already in $dest"
    exit 0
fi

mkdir -p "$wheels"
cd "$repo_root"

if ! compgen -G "$wheels/onnx-$ONNX_VERSION-*.whl" >/dev/null; then
    if ! log="$(python3 -m pip download --quiet --no-deps --only-binary=:all: \
        "onnx==$ONNX_VERSION" -d "$wheels" 2>&1)"; then
        echo "$log" >&2
        echo "error: could not download the onnx==$ONNX_VERSION wheel with pip" >&2
        exit 1
    fi
fi

wheel="$(compgen -G "$wheels/onnx-$ONNX_VERSION-*.whl" | sort | head -n 1)"
if [[ -z "$wheel" ]]; then
    echo "error: pip reported success but no onnx-$ONNX_VERSION wheel is in $wheels" >&2
    exit 1
fi

# Extract into a scratch folder first and move it into place, so that an interrupted run
# never leaves a half-filled folder that looks complete.
tmp="$testdata/.onnx-node.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT

count="$(python3 - "$wheel" "$tmp" <<'EOF'
import os
import sys
import zipfile

wheel, out = sys.argv[1], sys.argv[2]
prefix = "onnx/backend/test/data/node/"
cases = set()
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if not name.startswith(prefix) or info.is_dir():
            continue
        rel = name[len(prefix):]
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts):
            sys.exit(f"refusing suspicious path in wheel: {name!r}")
        target = os.path.join(out, *parts)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
        cases.add(parts[0])
if not cases:
    sys.exit(f"no {prefix} entries in {wheel}")
print(len(cases))
EOF
)"

rm -rf "$dest"
mv "$tmp" "$dest"
trap - EXIT
touch "$stamp"
echo "fetched $count onnx $ONNX_VERSION node test cases into $dest"
