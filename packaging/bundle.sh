#!/usr/bin/env bash
# Builds the epx release bundles into OUT (default: target/dist):
#
#   epx-<version>-<os>-<arch>/            an install prefix: unpack it under /usr/local or anywhere
#     bin/epx
#     lib/libepx.so  lib/libepx.a  lib/pkgconfig/epx.pc
#     include/epx.h  include/epx_plugin.h
#     lib/epx/plugins/<name>/{plugin.toml, libepx_<name>.so}   every plugin of this repository
#     lib/epx/adapters/libepx_ort_plugin_ep.so   hosts ONNX Runtime plugin-EP libraries (a
#                                          plugin.toml with [onnxruntime_ep], pip packages)
#     share/epx/python/epx/                the Python package (finds <prefix>/lib/libepx.so);
#                                          packaging/wheel.sh makes a pip wheel of it instead
#     share/epx/sdk/plugin-api/            the Rust plugin SDK's source (`epx new-plugin --lang rust`
#                                          makes a plugin that depends on it by path; it has no
#                                          dependencies, so the plugin builds offline)
#     share/doc/epx/{LICENSE, README.md}
#     SHA256SUMS
#   epx-<version>-<os>-<arch>.tar.gz
#   plugins/epx-plugin-<name>-<version>-<os>-<arch>/{plugin.toml, libepx_<name>.so, LICENSE,
#     SHA256SUMS} and its .tar.gz: what a vendor ships; unpack it into a plugin folder.
#
# Each plugin.toml in a bundle pins its library's SHA-256 (the `sha256` key), so the host refuses
# a library that is not the one packaged.
#
#   bash packaging/bundle.sh [--profile release|dev] [--no-build] [--out DIR] [--plugins a,b]
#
# --profile dev assembles from target/debug (what the test suite builds); --no-build assembles
# from what is already built; --plugins bundles only the plugins named. The default builds the
# release profile first and bundles every plugin.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"

PROFILE=release
BUILD=1
ONLY=""
OUT="$ROOT/target/dist"
while (($#)); do
    case "$1" in
        --profile) PROFILE=${2:?--profile needs release or dev}; shift ;;
        --no-build) BUILD=0 ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        --plugins) ONLY=${2:?--plugins needs a comma-separated list}; shift ;;
        -h | --help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "bundle.sh: unknown argument \`$1\` (try --help)" >&2; exit 2 ;;
    esac
    shift
done
case "$PROFILE" in
    release) ARTIFACTS="${CARGO_TARGET_DIR:-$ROOT/target}/release" ;;
    dev | debug) PROFILE=dev; ARTIFACTS="${CARGO_TARGET_DIR:-$ROOT/target}/debug" ;;
    *) echo "bundle.sh: --profile is release or dev, not \`$PROFILE\`" >&2; exit 2 ;;
esac
[[ "$ARTIFACTS" = /* ]] || ARTIFACTS="$ROOT/$ARTIFACTS"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
OS="$(uname -s | tr '[:upper:]' '[:lower:]')"
ARCH="$(uname -m)"
SUFFIX="$VERSION-$OS-$ARCH"
[[ "$OS" == linux ]] || { echo "bundle.sh: only Linux bundles are made so far (this is $OS)" >&2; exit 2; }

# Every plugin of the repository: folder name, manifest, library file.
MANIFESTS=()
for m in plugins/openvino/plugin.toml plugins/onnxruntime/eps/*/plugin.toml; do
    name="$(sed -n 's/^name = "\(.*\)"/\1/p' "$m" | head -n1)"
    if [[ -z "$ONLY" || ",$ONLY," == *",$name,"* ]]; then
        MANIFESTS+=("$m")
    fi
done
((${#MANIFESTS[@]})) || { echo "bundle.sh: no plugin matches --plugins $ONLY" >&2; exit 2; }

if ((BUILD)); then
    packages=(-p epx-cli -p epx-capi -p epx-openvino -p epx-ort-plugin-ep)
    for m in plugins/onnxruntime/eps/*/Cargo.toml; do
        packages+=(-p "$(sed -n 's/^name = "\(.*\)"/\1/p' "$m" | head -n1)")
    done
    cargo build --profile "$PROFILE" "${packages[@]}"
fi

need() {
    [[ -f "$1" ]] || { echo "bundle.sh: $1 is missing; build it first (or drop --no-build)" >&2; exit 1; }
}
# Installs SRC as DEST, without debug information when `strip` is there (the symbols stay).
install_file() {
    local src=$1 dest=$2 mode=$3
    need "$src"
    install -D -m "$mode" "$src" "$dest"
    if command -v strip >/dev/null; then
        strip --strip-debug "$dest"
    fi
}
# plugin.toml with `sha256 = "<digest of LIB>"` added before the first table (replacing any pin).
pinned_manifest() {
    local manifest=$1 lib=$2 digest
    digest="$(sha256sum "$lib" | cut -d' ' -f1)"
    awk -v pin="sha256 = \"$digest\"" '
        /^[[:space:]]*sha256[[:space:]]*=/ { next }
        !done && /^\[/ { print "# The SHA-256 of the library below, added by packaging/bundle.sh."; print pin; print ""; done = 1 }
        { print }
        END { if (!done) print pin }' "$manifest"
}
library_of() { # the Linux library file a manifest names
    sed -n '/^\[library\]/,/^\[/s/^linux = "\(.*\)"/\1/p' "$1" | head -n1
}

PREFIX="$OUT/epx-$SUFFIX"
rm -rf "$PREFIX" "$OUT/plugins"
install_file "$ARTIFACTS/epx" "$PREFIX/bin/epx" 755
install_file "$ARTIFACTS/libepx.so" "$PREFIX/lib/libepx.so" 755
install_file "$ARTIFACTS/libepx.a" "$PREFIX/lib/libepx.a" 644
install_file "$ARTIFACTS/libepx_ort_plugin_ep.so" "$PREFIX/lib/epx/adapters/libepx_ort_plugin_ep.so" 755
install -D -m 644 include/epx.h "$PREFIX/include/epx.h"
install -D -m 644 include/epx_plugin.h "$PREFIX/include/epx_plugin.h"
while IFS= read -r f; do
    install -D -m 644 "host/python/$f" "$PREFIX/share/epx/python/$f"
done < <(cd host/python && find epx -name '*.py' -o -name py.typed | LC_ALL=C sort)
while IFS= read -r f; do
    install -D -m 644 "plugin-api/$f" "$PREFIX/share/epx/sdk/plugin-api/$f"
done < <(cd plugin-api && find Cargo.toml README.md LICENSE cbindgen.toml src -type f \( -name '*.rs' -o ! -path 'src/*' \) | LC_ALL=C sort)
install -D -m 644 packaging/LICENSE "$PREFIX/share/doc/epx/LICENSE"
install -D -m 644 README.md "$PREFIX/share/doc/epx/README.md"
mkdir -p "$PREFIX/lib/pkgconfig"
# Relocatable: paths are relative to the .pc file. The rpath lets programs built against the
# bundle run without LD_LIBRARY_PATH.
cat >"$PREFIX/lib/pkgconfig/epx.pc" <<PC
prefix=\${pcfiledir}/../..
libdir=\${prefix}/lib
includedir=\${prefix}/include
plugindir=\${libdir}/epx/plugins

Name: epx
Description: run ONNX models on execution providers shipped as plugins (C API of the epx host)
Version: $VERSION
URL: https://github.com/epx-rs/epx
Libs: -L\${libdir} -lepx -Wl,-rpath,\${libdir}
Libs.private: -lpthread -ldl -lm -lrt -lgcc_s
Cflags: -I\${includedir}
PC

for manifest in "${MANIFESTS[@]}"; do
    name="$(sed -n 's/^name = "\(.*\)"/\1/p' "$manifest" | head -n1)"
    lib="$(library_of "$manifest")"
    [[ -n "$name" && -n "$lib" ]] || { echo "bundle.sh: $manifest has no name or Linux library" >&2; exit 1; }
    dest="$PREFIX/lib/epx/plugins/$name"
    install_file "$ARTIFACTS/$lib" "$dest/$lib" 755
    pinned_manifest "$manifest" "$dest/$lib" >"$dest/plugin.toml"
    chmod 644 "$dest/plugin.toml"
    # The vendor bundle: the same folder, with the license and checksums.
    vendor="$OUT/plugins/epx-plugin-$name-$SUFFIX"
    mkdir -p "$vendor"
    cp "$dest/$lib" "$dest/plugin.toml" "$vendor/"
    install -m 644 packaging/LICENSE "$vendor/LICENSE"
    (cd "$vendor" && sha256sum plugin.toml "$lib" LICENSE >SHA256SUMS)
    tar -C "$OUT/plugins" -czf "$vendor.tar.gz" "$(basename "$vendor")"
done

sums="$(cd "$PREFIX" && find . -type f ! -name SHA256SUMS -printf '%P\n' | LC_ALL=C sort | xargs sha256sum)"
printf '%s\n' "$sums" >"$PREFIX/SHA256SUMS"
tar -C "$OUT" -czf "$PREFIX.tar.gz" "$(basename "$PREFIX")"
(cd "$OUT" && sha256sum "$(basename "$PREFIX").tar.gz" plugins/*.tar.gz >SHA256SUMS)
echo "bundle:         $PREFIX.tar.gz ($(du -sh "$PREFIX" | cut -f1) unpacked, ${#MANIFESTS[@]} plugins)"
echo "plugin bundles: $OUT/plugins/*.tar.gz"
echo "checksums:      $OUT/SHA256SUMS"
