#!/usr/bin/env bash
# Fetches the OpenVINO runtime the `openvino` EP plugin loads at run time, from the `openvino`
# wheel on PyPI, into .testdata/openvino/libs/ at the repository root. Only the libraries the
# CPU device needs are extracted: the C API (libopenvino_c.so.*), the core (libopenvino.so.*),
# the ONNX frontend, the CPU plugin and oneTBB/hwloc; the GPU and NPU plugins and the other
# frontends are skipped (~60 MB less). Needs python3 with pip and network access to PyPI.
# Safe to run again: once the stamp file is written, it does nothing.
#
# The tests point the plugin at the folder with EPX_OPENVINO_SEARCH_PATH.
set -euo pipefail

OPENVINO_VERSION=2026.4.1

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
testdata="$repo_root/.testdata"
wheels="$testdata/wheels"
dest="$testdata/openvino/libs"
stamp="$testdata/openvino/.fetched-openvino-$OPENVINO_VERSION"

if [[ -f "$stamp" && -d "$dest" ]]; then
    echo "OpenVINO $OPENVINO_VERSION runtime already in $dest"
    exit 0
fi

mkdir -p "$wheels"
cd "$repo_root"

if ! compgen -G "$wheels/openvino-$OPENVINO_VERSION-*.whl" >/dev/null; then
    if ! log="$(python3 -m pip download --quiet --no-deps --only-binary=:all: \
        "openvino==$OPENVINO_VERSION" -d "$wheels" 2>&1)"; then
        echo "$log" >&2
        echo "error: could not download the openvino==$OPENVINO_VERSION wheel with pip" >&2
        exit 1
    fi
fi

wheel="$(compgen -G "$wheels/openvino-$OPENVINO_VERSION-*.whl" | sort | head -n 1)"
if [[ -z "$wheel" ]]; then
    echo "error: pip reported success but no openvino-$OPENVINO_VERSION wheel is in $wheels" >&2
    exit 1
fi

# Extract into a scratch folder first and move it into place, so that an interrupted run
# never leaves a half-filled folder that looks complete.
tmp="$testdata/.openvino-libs.tmp.$$"
rm -rf "$tmp"
trap 'rm -rf "$tmp"' EXIT

summary="$(python3 - "$wheel" "$tmp" <<'EOF'
import os
import re
import sys
import zipfile

wheel, out = sys.argv[1], sys.argv[2]
prefix = "openvino/libs/"
# What the CPU device needs at run time. The core finds its device plugins and frontends by
# file name next to libopenvino.so (the wheel has no plugins.xml).
wanted = [
    r"libopenvino_c\.so(\.\d+)*",
    r"libopenvino\.so(\.\d+)*",
    r"libopenvino_onnx_frontend\.so(\.\d+)*",
    r"libopenvino_ir_frontend\.so(\.\d+)*",
    r"libopenvino_intel_cpu_plugin\.so",
    r"libopenvino_auto_plugin\.so",
    r"libopenvino_hetero_plugin\.so",
    r"libtbb[a-z_0-9]*\.so(\.\d+)*",
    r"libhwloc\.so(\.\d+)*",
    r"plugins\.xml",
]
pattern = re.compile("|".join(f"(?:{w})" for w in wanted))
total = 0
names = []
with zipfile.ZipFile(wheel) as zf:
    for info in zf.infolist():
        name = info.filename
        if not name.startswith(prefix) or info.is_dir():
            continue
        rel = name[len(prefix):]
        if "/" in rel or rel in ("", ".", ".."):
            continue
        if not pattern.fullmatch(rel):
            continue
        target = os.path.join(out, rel)
        os.makedirs(out, exist_ok=True)
        with zf.open(info) as src, open(target, "wb") as dst:
            while True:
                chunk = src.read(1 << 20)
                if not chunk:
                    break
                dst.write(chunk)
        os.chmod(target, 0o755 if ".so" in rel else 0o644)
        total += info.file_size
        names.append(rel)
must = [r"libopenvino_c\.so.*", r"libopenvino\.so.*", r"libopenvino_intel_cpu_plugin\.so",
        r"libopenvino_onnx_frontend\.so.*", r"libtbb\.so.*"]
for m in must:
    if not any(re.fullmatch(m, n) for n in names):
        sys.exit(f"{wheel}: no {prefix}{m} in the wheel (found: {sorted(names)})")
# The CPU runtime is ~100 MB; far less means a truncated or unexpected wheel, far more that
# the selection above picked up things it should not.
if not 20 << 20 <= total <= 400 << 20:
    sys.exit(f"extracted {total} bytes from {wheel}: not the expected ~100 MB")
print(f"{len(names)} files, {total >> 20} MB")
EOF
)"

rm -rf "$dest"
mkdir -p "$(dirname "$dest")"
mv "$tmp" "$dest"
trap - EXIT
touch "$stamp"
echo "fetched the OpenVINO $OPENVINO_VERSION runtime ($summary) into $dest"
