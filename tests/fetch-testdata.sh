#!/usr/bin/env bash
# Fetches the ONNX backend node tests (onnx/backend/test/data/node/**) from the onnx 1.22.0
# wheel on PyPI into .testdata/onnx-node/ at the repository root, so that e.g.
# .testdata/onnx-node/test_abs/model.onnx exists; then generates onnx 1.23.2's node tests (that
# wheel ships no data: its case scripts, onnx.backend.test.case.node, are fed to
# onnx.backend.test.cmd_tools.generate_data) into .testdata/onnx-node-1.23.2/, in a virtual
# environment at .testdata/onnx-1.23.2-venv. Needs python3 with pip and network access to PyPI.
# Safe to run again: once a set's stamp file is written, it is kept.
set -euo pipefail

ONNX_VERSION=1.22.0

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
testdata="$repo_root/.testdata"
wheels="$testdata/wheels"
dest="$testdata/onnx-node"
stamp="$dest/.fetched-onnx-$ONNX_VERSION"

generate_1_23() {
    local version=1.23.2
    local out="$testdata/onnx-node-$version"
    local venv="$testdata/onnx-$version-venv"
    if [[ -f "$out/.generated-onnx-$version" ]]; then
        echo "onnx $version node tests already in $out"
        return 0
    fi
    if ! "$venv/bin/python" -c "import onnx; assert onnx.__version__ == '$version'" 2>/dev/null; then
        rm -rf "$venv"
        python3 -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
            "onnx==$version" numpy==2.4.6 ml_dtypes==0.7.0
    fi
    local tmp="$testdata/.onnx-node-$version.tmp.$$"
    rm -rf "$tmp" "$out"
    "$venv/bin/python" - "$tmp" <<'EOF'
import argparse, sys, warnings
warnings.simplefilter("ignore")
import numpy as np
np.seterr(all="ignore")
from onnx.backend.test import cmd_tools
from onnx.backend.test.case import node
# generate_data writes the cases model_test collects: here, every node case.
cmd_tools.model_test.collect_testcases = lambda: node.collect_testcases(None)
cmd_tools.generate_data(argparse.Namespace(output=sys.argv[1]))
EOF
    mv "$tmp/node" "$out"
    rm -rf "$tmp"
    touch "$out/.generated-onnx-$version"
    echo "generated $(find "$out" -mindepth 1 -maxdepth 1 -type d | wc -l) onnx $version node test cases into $out"
}

if [[ -f "$stamp" ]]; then
    echo "onnx node tests already in $dest"
    generate_1_23
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
generate_1_23
