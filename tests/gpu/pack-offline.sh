#!/usr/bin/env bash
# Packs what check-cuda.sh needs for a GPU machine without network access or Rust:
#   OUTDIR/ort-site.tar.xz  onnxruntime/capi/ from the onnxruntime-gpu wheel, the CUDA provider
#                           library keeping code for one GPU architecture only (keep_arch.py)
#   OUTDIR/bin.tar.xz       epx, libepx_cuda.so, libepx_tensorrt.so (release, stripped)
#   OUTDIR/run.sh           unpacks both and runs check-cuda.sh offline
# The CUDA, cuDNN (and TensorRT) libraries must already be on the GPU machine in a Python
# site-packages folder (nvidia/*/lib, tensorrt_libs), as a PyTorch CUDA 13 install has them.
#
#   bash tests/gpu/pack-offline.sh OUTDIR [SM]      # SM: 90 (Hopper) unless given
# On the GPU machine, from the repository root: bash OUTDIR/run.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUTDIR=${1:?usage: pack-offline.sh OUTDIR [SM]}
SM=${2:-90}
ORT_PIN="onnxruntime-gpu==1.31.1"
mkdir -p "$OUTDIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m pip download --disable-pip-version-check --no-cache-dir --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 -d "$work" "$ORT_PIN"
mkdir -p "$work/site/onnxruntime/capi"
(cd "$work" && unzip -q -o ./*.whl 'onnxruntime/capi/lib*.so*' -d wheel)
capi="$work/wheel/onnxruntime/capi"
cp "$capi"/libonnxruntime.so.1.* "$capi"/libonnxruntime_providers_shared.so \
    "$capi"/libonnxruntime_providers_tensorrt.so "$work/site/onnxruntime/capi/"
python3 tests/gpu/keep_arch.py "$capi/libonnxruntime_providers_cuda.so" \
    "$work/site/onnxruntime/capi/libonnxruntime_providers_cuda.so" "$SM"
tar -C "$work/site" -cf - onnxruntime | xz -9e -T0 >"$OUTDIR/ort-site.tar.xz"

cargo build --release -p epx-cli -p epx-ort-cuda -p epx-ort-tensorrt
mkdir -p "$work/bin"
for f in epx libepx_cuda.so libepx_tensorrt.so; do
    strip -o "$work/bin/$f" "target/release/$f"
done
tar -C "$work/bin" -cf - . | xz -9e -T0 >"$OUTDIR/bin.tar.xz"

cat >"$OUTDIR/run.sh" <<'RUN'
#!/usr/bin/env bash
# Unpacks the libraries and binaries next to this script into /tmp and runs the GPU check
# offline. CUDA libraries come from python3's site-packages (nvidia/*/lib). Run from the repo root.
set -u
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p /tmp/epx-gpu/site /tmp/epx-gpu/bin
tar -xJf "$here/ort-site.tar.xz" -C /tmp/epx-gpu/site && tar -xJf "$here/bin.tar.xz" -C /tmp/epx-gpu/bin || exit 3
capi=/tmp/epx-gpu/site/onnxruntime/capi
ln -sf "$(basename "$(ls "$capi"/libonnxruntime.so.1.*)")" "$capi/libonnxruntime.so.1"
pysite=$(python3 -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
exec bash tests/gpu/check-cuda.sh --site /tmp/epx-gpu/site --site "$pysite" --prebuilt /tmp/epx-gpu/bin
RUN
chmod +x "$OUTDIR/run.sh"
ls -la "$OUTDIR"
