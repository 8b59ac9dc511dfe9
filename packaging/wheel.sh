#!/usr/bin/env bash
# Builds the epx wheel into target/wheels/ (or --out): the Python package of host/python with
# libepx, the `epx` CLI and every plugin of the release bundle (packaging/bundle.sh) inside it:
#
#   epx/__init__.py, epx/onnxruntime/, ...       the Python API (ctypes over libepx)
#   epx/lib/libepx.so
#   epx/lib/epx/plugins/<name>/{plugin.toml, libepx_<name>.so}   found by libepx next to itself
#   epx/lib/epx/adapters/libepx_ort_plugin_ep.so  hosts ONNX Runtime plugin-EP libraries
#   epx/bin/epx                                   the CLI, also installed as the `epx` command
#   epx/sdk/plugin-api/                           the Rust plugin SDK's source (epx new-plugin)
#   epx/_native.abi3.so                           the native per-call path (CPython 3.11+)
#
# The wheel is tagged py3-none-<platform>: its one CPython extension (the per-call path, stable
# ABI 3.11+) is optional; older Pythons use ctypes, so one wheel serves every Python 3. It
# installs without Rust: `pip install target/wheels/epx-*.whl`.
#
#   bash packaging/wheel.sh [--profile release|dev] [--no-build] [--out DIR]
#
# --profile and --no-build are bundle.sh's (dev: from target/debug, as the test suite builds it).
# Building the wheel needs pip; it fetches setuptools from PyPI into an isolated build environment.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

PROFILE=release
BUNDLE_ARGS=()
OUT="$ROOT/target/wheels"
while (($#)); do
    case "$1" in
        --profile) PROFILE=${2:?--profile needs release or dev}; shift ;;
        --no-build) BUNDLE_ARGS+=(--no-build) ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        -h | --help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "wheel.sh: unknown argument \`$1\` (try --help)" >&2; exit 2 ;;
    esac
    shift
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

case "$PROFILE" in
    release) ARTIFACTS="${CARGO_TARGET_DIR:-$ROOT/target}/release" ;;
    *) ARTIFACTS="${CARGO_TARGET_DIR:-$ROOT/target}/debug" ;;
esac
# The native per-call path (host/python/native: a CPython 3.11+ stable-ABI extension).
if [[ " ${BUNDLE_ARGS[*]} " != *" --no-build "* ]]; then
    cargo build --profile "$PROFILE" -p epx-python
fi
[[ -f "$ARTIFACTS/lib_native.so" ]] || { echo "wheel.sh: $ARTIFACTS/lib_native.so is missing; build it first (or drop --no-build)" >&2; exit 1; }

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
bash packaging/bundle.sh --profile "$PROFILE" "${BUNDLE_ARGS[@]}" --out "$stage/dist" >/dev/null
prefixes=("$stage"/dist/epx-*-linux-*/)
prefix="${prefixes[0]}"
[[ -f "$prefix/lib/libepx.so" ]] || { echo "wheel.sh: the bundle has no lib/libepx.so" >&2; exit 1; }

src="$stage/src"
mkdir -p "$src"
cp host/python/pyproject.toml host/python/setup.py host/python/README.md packaging/LICENSE "$src/"
cp -r host/python/epx "$src/epx"
find "$src/epx" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$src/epx/lib" "$src/epx/bin"
cp "$prefix/lib/libepx.so" "$src/epx/lib/"
cp -r "$prefix/lib/epx" "$src/epx/lib/epx"
cp "$prefix/bin/epx" "$src/epx/bin/epx"
cp -r "$prefix/share/epx/sdk" "$src/epx/sdk"
rm -f "$src"/epx/_native*.so  # a developer's link to a build, not to be shipped or written through
cp "$ARTIFACTS/lib_native.so" "$src/epx/_native.abi3.so"

rm -f "$OUT"/epx-*.whl
python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$OUT" "$src"
wheel="$(ls "$OUT"/epx-*.whl)"
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1), $(ls "$prefix/lib/epx/plugins" | wc -l) plugins)"
