#!/usr/bin/env bash
# GPU check: runs examples/models/mnist-cnn.onnx through epx on ONNX Runtime's CUDA and TensorRT
# EPs (the `cuda` and `tensorrt` plugins), on NVIDIA's TensorRT-RTX plugin-EP library
# (onnxruntime-ep-nv-tensorrt-rtx-cu13, hosted through epx's adapter) and on epx's own CPU EP, and
# compares the outputs.
# See tests/gpu/README.md. Needs an NVIDIA GPU with a working driver (`nvidia-smi`) new enough for
# CUDA 13, network access to PyPI (and to pypi.nvidia.com for TensorRT), python3 with pip, and a
# Rust toolchain. Everything it downloads or builds stays inside the repository (.testdata/ and
# target/, both git-ignored); pip runs with --no-cache-dir.
#
#   bash tests/gpu/check-cuda.sh                 # the whole check
#   bash tests/gpu/check-cuda.sh --dry-run       # print the steps, run nothing
#   bash tests/gpu/check-cuda.sh --require-tensorrt   # a TensorRT that cannot be set up is a FAIL
#   bash tests/gpu/check-cuda.sh --no-gpu        # skip the nvidia-smi check (testing the script
#                                                # itself on a machine without a GPU: cuda FAILs)
#   bash tests/gpu/check-cuda.sh --site DIR ...  # offline: libraries already unpacked in DIR
#                                                # (site-packages layout; repeatable), no download
#   bash tests/gpu/check-cuda.sh --prebuilt DIR  # offline: epx and the plugins already built in DIR
#
# Exit status: 0 when every EP checked passed (TensorRT may be SKIPPED unless --require-tensorrt),
# 1 on any FAIL, 2 on bad usage or a missing prerequisite.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT="$PWD"

DRY_RUN=0
REQUIRE_TRT=0
NO_GPU=0
SITES=()
PREBUILT=""
while (($#)); do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --require-tensorrt) REQUIRE_TRT=1 ;;
        --no-gpu) NO_GPU=1 ;;
        --site | --prebuilt)
            [[ $# -ge 2 && -d $2 ]] || {
                echo "check-cuda.sh: $1 needs an existing folder" >&2
                exit 2
            }
            if [[ $1 == --site ]]; then SITES+=("$(cd "$2" && pwd)"); else PREBUILT="$(cd "$2" && pwd)"; fi
            shift
            ;;
        -h | --help)
            sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *)
            echo "check-cuda.sh: unknown argument \`$1\` (try --help)" >&2
            exit 2
            ;;
    esac
    shift
done

# --- Pins ---------------------------------------------------------------------------------------
# onnxruntime-gpu 1.31.1 on PyPI is built for CUDA 13 (its libonnxruntime_providers_cuda.so needs
# libcudart.so.13, libcublas.so.13, libcublasLt.so.13, libcurand.so.10; cuDNN 9 is loaded at run
# time; libonnxruntime_providers_tensorrt.so needs libnvinfer.so.10 and libnvonnxparser.so.10).
# Its `cuda`/`cudnn` extras name nvidia-cuda-runtime~=13.0, nvidia-cuda-nvrtc~=13.0,
# nvidia-cufft~=12.0, nvidia-curand~=10.0 and nvidia-cudnn-cu13~=9.0. The versions below were the
# newest on PyPI that satisfy them (`pip index versions`), plus what those wheels require
# themselves (nvidia-cublas <- cudnn, nvidia-cuda-nvrtc <- cublas, nvidia-nvjitlink <- cufft). All
# are downloaded with --no-deps, so this list is the complete set.
ORT_PIN="onnxruntime-gpu==1.31.1"
CUDA_PINS=(
    "nvidia-cuda-runtime==13.5.37"
    "nvidia-cublas==13.10.0.20"
    "nvidia-cuda-nvrtc==13.5.37"
    "nvidia-cudnn-cu13==9.28.1.4"
    "nvidia-cufft==12.5.0.14"
    "nvidia-curand==10.4.5.25"
    "nvidia-nvjitlink==13.5.37"
)
# TensorRT 10 (libnvinfer.so.10; TensorRT 11 has .so.11 and does not fit), CUDA 13 build. On PyPI
# this is only a stub that fetches the real wheel from NVIDIA's index, so it is fetched from there
# directly.
TRT_PIN="tensorrt-cu13-libs==10.16.1.11"
TRT_INDEX="https://pypi.nvidia.com"
# NVIDIA's TensorRT-RTX EP as ONNX Runtime plugin-EP library (CreateEpFactories), hosted through
# epx's adapter from a plugin.toml with [onnxruntime_ep]; CUDA 13 build, its CUDA runtime from the
# nvidia-cuda-runtime wheel above.
RTX_PIN="onnxruntime-ep-nv-tensorrt-rtx-cu13==0.5.0"
RTX_EP="NvTensorRTRTXExecutionProvider"
# numpy for the comparison, only when python3 has none.
NUMPY_PIN_PY311="numpy==2.4.6" # Python 3.11-3.14
NUMPY_PIN_PY310="numpy==2.2.6" # Python 3.10

TD="$ROOT/.testdata"
WHEELS="$TD/gpu-wheels"
SITE="$TD/gpu-site"
PYDEPS="$TD/gpu-py"
PLUGINS="$TD/gpu-plugins"
OUT="$TD/gpu-check/out"
MODEL="examples/models/mnist-cnn.onnx"
INPUT="examples/models/mnist-cnn.input.image.npy"
REFERENCE="examples/models/mnist-cnn.output.probabilities.npy"
TOL="1e-4"
BIN="${PREBUILT:-$ROOT/target/release}"
EPX="$BIN/epx"

# pip download for a manylinux x86-64 CPython 3.11 (the libraries inside do not depend on the
# Python version; this only selects the file), without dependencies and without pip's cache.
PIP_DL=(python3 -m pip download --disable-pip-version-check --no-cache-dir --no-deps
    --only-binary=:all: --python-version 3.11 --implementation cp
    --abi cp311 --abi abi3 --abi none
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
    --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64)

START=$SECONDS
step() { printf '\n=== [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
# Runs a command, or prints it under --dry-run.
run() {
    if ((DRY_RUN)); then
        printf '+ %s\n' "$*"
    else
        "$@"
    fi
}
die() {
    echo "check-cuda.sh: $*" >&2
    exit 2
}

declare -A RESULT=()
declare -A WHY=()
fail() {
    RESULT[$1]=FAIL
    WHY[$1]="$2"
    echo "FAIL $1: $2"
}
skip() {
    RESULT[$1]=SKIP
    WHY[$1]="$2"
    echo "SKIP $1: $2"
}

# --- 1. Prerequisites ---------------------------------------------------------------------------
step "1/8 prerequisites"
if [[ "$(uname -s)/$(uname -m)" != "Linux/x86_64" ]]; then
    die "needs Linux x86-64 (the onnxruntime-gpu and nvidia wheels pinned here are for it)"
fi
command -v python3 >/dev/null || die "\`python3\` is not on PATH"
if [[ -z $PREBUILT ]]; then
    command -v cargo >/dev/null || die "\`cargo\` is not on PATH (or give --prebuilt DIR)"
fi
if ((${#SITES[@]} == 0)); then
    python3 -m pip --version >/dev/null 2>&1 || die "python3 has no pip (python3 -m pip)"
fi
if ((DRY_RUN)); then
    echo "+ nvidia-smi   (must work; CUDA Version >= 13.0, i.e. driver >= 580)"
elif ((NO_GPU)); then
    echo "--no-gpu: not checking for a GPU; the cuda and tensorrt runs are expected to fail"
else
    command -v nvidia-smi >/dev/null || die "nvidia-smi is not on PATH: no NVIDIA driver?"
    smi="$(nvidia-smi)" || die "nvidia-smi failed: is the NVIDIA driver loaded?"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader
    cuda_version="$(sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' <<<"$smi" | head -n1)"
    echo "driver supports CUDA ${cuda_version:-?}"
    if [[ -n "$cuda_version" && "${cuda_version%%.*}" -lt 13 ]]; then
        die "the driver supports CUDA $cuda_version, but onnxruntime-gpu 1.31.1 is built for CUDA 13: install an NVIDIA driver >= 580"
    fi
fi

# Steps 2 and 3, skipped with --site.
fetch_and_unpack() {
# --- 2. Wheels ----------------------------------------------------------------------------------
step "2/8 download the pinned wheels into ${WHEELS#"$ROOT"/}"
run mkdir -p "$WHEELS"
run "${PIP_DL[@]}" -d "$WHEELS" "$ORT_PIN" "${CUDA_PINS[@]}"
RTX_OK=1
if ! run "${PIP_DL[@]}" --retries 1 --timeout 60 -d "$WHEELS" "$RTX_PIN"; then
    RTX_OK=0
    echo "could not download $RTX_PIN; the rtx check will be skipped"
fi
TRT_OK=1
if ((DRY_RUN)); then
    printf '+ %s\n' "${PIP_DL[*]} -d $WHEELS --index-url $TRT_INDEX $TRT_PIN"
elif ! "${PIP_DL[@]}" --retries 1 --timeout 60 -d "$WHEELS" --index-url "$TRT_INDEX" "$TRT_PIN"; then
    TRT_OK=0
    echo "could not download $TRT_PIN from $TRT_INDEX; the tensorrt check will be skipped"
fi

# --- 3. Unpack ----------------------------------------------------------------------------------
# Unzips the shared libraries of each wheel into one site-packages-like folder (the layout
# `pip install --target` makes: onnxruntime/capi/, nvidia/cu13/lib/, nvidia/cudnn/lib/,
# tensorrt_libs/), and adds the libonnxruntime.so.1 name the wheel leaves out.
step "3/8 unpack the libraries into ${SITE#"$ROOT"/}"
if ((DRY_RUN)); then
    echo "+ rm -rf $SITE; unzip {onnxruntime/capi,nvidia/*/lib,tensorrt_libs}/*.so* of every wheel in $WHEELS into $SITE"
    echo "+ ln -s libonnxruntime.so.1.31.1 $SITE/onnxruntime/capi/libonnxruntime.so.1 (and libonnxruntime.so)"
else
    rm -rf "$SITE"
    mkdir -p "$SITE"
    python3 - "$WHEELS" "$SITE" <<'PY'
import fnmatch, glob, os, sys, zipfile
wheels, site = sys.argv[1], sys.argv[2]
keep = ["onnxruntime/capi/*", "nvidia/*/lib/*", "tensorrt_libs/*", "onnxruntime_ep_nv_tensorrt_rtx/*"]
for wheel in sorted(glob.glob(os.path.join(wheels, "*.whl"))):
    n = 0
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            base = os.path.basename(name)
            if info.is_dir() or ".so" not in base or not any(fnmatch.fnmatch(name, k) for k in keep):
                continue
            if name.startswith("onnxruntime/capi/") and not base.startswith("lib"):
                continue  # the Python extension module
            dest = os.path.join(site, name)
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
            os.chmod(dest, 0o755)
            n += 1
    print(f"  {os.path.basename(wheel)}: {n} libraries")
PY
    capi="$SITE/onnxruntime/capi"
    shopt -s nullglob
    ort_libs=("$capi"/libonnxruntime.so.1.*.*)
    shopt -u nullglob
    [[ ${#ort_libs[@]} -eq 1 ]] || die "expected one libonnxruntime.so.1.x.y in $capi, found ${#ort_libs[@]}"
    ln -sf "$(basename "${ort_libs[0]}")" "$capi/libonnxruntime.so.1"
    ln -sf "$(basename "${ort_libs[0]}")" "$capi/libonnxruntime.so"
    if ((TRT_OK)) && [[ ! -e "$SITE/tensorrt_libs/libnvinfer.so.10" ]]; then
        TRT_OK=0
        echo "the TensorRT wheel holds no tensorrt_libs/libnvinfer.so.10; the tensorrt check will be skipped"
    fi
fi
}

if ((${#SITES[@]})); then
    step "2-3/8 offline: libraries from ${SITES[*]}"
    RTX_OK=0
    for d in "${SITES[@]}"; do
        [[ -d $d/onnxruntime_ep_nv_tensorrt_rtx ]] && RTX_OK=1
    done
    TRT_OK=0
    for d in "${SITES[@]}"; do
        [[ -e $d/tensorrt_libs/libnvinfer.so.10 ]] && TRT_OK=1
    done
    ((TRT_OK)) || echo "no tensorrt_libs/libnvinfer.so.10 under the --site folders; the tensorrt check will be skipped"
else
    fetch_and_unpack
fi

# numpy for the comparison (only if python3 lacks it), into its own folder.
if ! python3 -c 'import numpy' 2>/dev/null && ((${#SITES[@]} == 0)); then
    if python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        numpy_pin="$NUMPY_PIN_PY311"
    else
        numpy_pin="$NUMPY_PIN_PY310"
    fi
    run python3 -m pip install --disable-pip-version-check --no-cache-dir --only-binary=:all: \
        --target "$PYDEPS" "$numpy_pin"
fi

# --- 4. Build -----------------------------------------------------------------------------------
step "4/8 build the workspace (release)"
if [[ -n $PREBUILT ]]; then
    echo "--prebuilt: using $BIN"
    for f in epx libepx_cuda.so libepx_tensorrt.so libepx_ort_plugin_ep.so; do
        [[ -f $BIN/$f ]] || die "--prebuilt $BIN has no $f"
    done
elif ! run cargo build --release --workspace; then
    echo "FAIL build: cargo build --release --workspace failed (see above); nothing was run"
    exit 1
fi

# --- 5. Plugin folders --------------------------------------------------------------------------
step "5/8 plugin folders in ${PLUGINS#"$ROOT"/}"
for ep in cuda tensorrt; do
    run mkdir -p "$PLUGINS/$ep"
    run cp "plugins/onnxruntime/eps/$ep/plugin.toml" "$PLUGINS/$ep/plugin.toml"
    run cp "$BIN/libepx_$ep.so" "$PLUGINS/$ep/"
    run chmod 755 "$PLUGINS" "$PLUGINS/$ep"
done

# The TensorRT-RTX plugin-EP library in a plugin folder of its own, with its manifest. The wheel
# has libcudart.so.13.x.y but not the libcudart.so.13 name its library asks for; the CUDA runtime
# wheel's is used when it is there (found by the preflight among the site's nvidia/*/lib).
RTX_DIR="$PLUGINS/rtx"
if ((RTX_OK)) && ((!DRY_RUN)); then
    rtx_src=""
    for d in "${SITES[@]:-$SITE}"; do
        [[ -d $d/onnxruntime_ep_nv_tensorrt_rtx ]] && rtx_src="$d/onnxruntime_ep_nv_tensorrt_rtx"
    done
    rm -rf "$RTX_DIR"
    mkdir -p "$RTX_DIR"
    cp -P "$rtx_src"/*.so* "$RTX_DIR/"
    cat >"$RTX_DIR/plugin.toml" <<TOML
name = "rtx"
version = "0.5.0"
providers = ["rtx"]

[library]
linux = "libonnxruntime_providers_nv_tensorrt_rtx.so"

[onnxruntime_ep]
ep_names = ["$RTX_EP"]
onnxruntime = "1.24"
TOML
    chmod -R go-w "$RTX_DIR"
elif ((!DRY_RUN)); then
    mkdir -p "$RTX_DIR" # empty: nothing to host
else
    echo "+ $RTX_DIR: the $RTX_PIN libraries and a plugin.toml with [onnxruntime_ep] ep_names = [\"$RTX_EP\"]"
fi

# The adapter finds libonnxruntime in EPX_ORT_SEARCH_PATH (<dir>/onnxruntime/capi); epx's
# dependency preflight (doctor) looks in PYTHONPATH's wheel folders; ONNX Runtime itself loads
# libonnxruntime_providers_{cuda,tensorrt}.so from its own folder, and those need the loader to
# find the CUDA, cuDNN and TensorRT libraries: LD_LIBRARY_PATH.
unset EPX_ORT_LIBRARY ORT_DYLIB_PATH
((${#SITES[@]})) || SITES=("$SITE")
joined="$(IFS=:; echo "${SITES[*]}")"
export EPX_ORT_SEARCH_PATH="$joined"
export PYTHONPATH="$joined${PYTHONPATH:+:$PYTHONPATH}"
ld=""
for d in "${SITES[@]}"; do
    for lib in "$d/onnxruntime/capi" "$d"/nvidia/*/lib "$d/tensorrt_libs"; do
        [[ -d $lib ]] && ld="${ld:+$ld:}$lib"
    done
done
export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "EPX_ORT_SEARCH_PATH=$EPX_ORT_SEARCH_PATH"
echo "PYTHONPATH=$PYTHONPATH"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# --- 6. Doctor ----------------------------------------------------------------------------------
step "6/8 epx doctor and epx providers"
for ep in cuda tensorrt; do
    if ((DRY_RUN)); then
        echo "+ $EPX doctor --plugin-dir $PLUGINS/$ep"
    elif ! "$EPX" doctor --plugin-dir "$PLUGINS/$ep"; then
        if [[ $ep == tensorrt ]] && ((!TRT_OK)) && ((!REQUIRE_TRT)); then
            skip tensorrt "epx doctor failed and the TensorRT libraries are not installed"
        else
            fail "$ep" "epx doctor reports a problem with the $ep plugin (see above)"
        fi
    fi
done
run "$EPX" providers --plugin-dir "$PLUGINS/cuda" --plugin-dir "$PLUGINS/tensorrt"
if ((RTX_OK)); then
    # Its devices as ONNX Runtime lists them, or why it lists none / why it was refused.
    run "$EPX" providers --devices --plugin-dir "$RTX_DIR" || true
fi

# --- 7. Runs ------------------------------------------------------------------------------------
# Each EP's run must place nodes on that EP (`--ep` that cannot be set up is an error in epx, never
# a silent fallback; the adapter also forbids ONNX Runtime's own CPU fallback for GPU EPs).
step "7/8 run $MODEL on the CPU EP, cuda and tensorrt"
run rm -rf "$OUT"
run mkdir -p "$OUT"
epx_run() { # NAME EP-ARGS... (NAME: the EP, or EP_variant)
    local name=$1 ep=${1%%_*}
    shift
    local log="$OUT/$name.log"
    if ((DRY_RUN)); then
        echo "+ $EPX run $MODEL --input image=$INPUT $* --output-dir $OUT/$name"
        return 0
    fi
    if ! timeout 300 "$EPX" run "$MODEL" --input "image=$INPUT" "$@" --output-dir "$OUT/$name" \
        --plugin-dir "$PLUGINS/cuda" --plugin-dir "$PLUGINS/tensorrt" \
        --plugin-dir "$RTX_DIR" 2>&1 | tee "$log"; then
        return 1
    fi
    [[ $name == cpu ]] && return 0
    # The placement line: "model: ... (N nodes, K kernels; cuda: N nodes)".
    if ! grep -Eq "^model: .*[(;,] ?$ep: [0-9]+ node" "$log"; then
        # The EP loaded but declined every node (its per-node probes failed): say why.
        echo "no node was placed on $ep; the EP's reasons (RUST_LOG=debug epx partition):"
        RUST_LOG=debug "$EPX" partition "$MODEL" "$@" \
            --plugin-dir "$PLUGINS/cuda" --plugin-dir "$PLUGINS/tensorrt" 2>&1 |
            sed 's/\x1b\[[0-9;]*m//g' | grep -m 3 'declines' | cut -c1-600 || true
        return 1
    fi
    if grep -Eq "^model: .*cpu: [0-9]+ node" "$log"; then
        echo "note: some nodes fell back to epx's CPU EP (see the placement line above)"
    fi
}
if ! epx_run cpu; then
    fail cpu "epx run on the CPU EP failed"
fi
if [[ ${RESULT[cuda]:-} != FAIL ]] && ! epx_run cuda --ep cuda; then
    fail cuda "epx run --ep cuda failed (see $OUT/cuda.log)"
fi
# The cuda plugin keeps tensors in CUDA memory (ONNX Runtime's allocator, IO binding): the
# placement lists the copies between host and cuda memory. Then a split placement: Conv,
# BatchNormalization and Relu on cuda, the rest on epx's CPU EP, so tensors cross both ways.
if [[ ${RESULT[cuda]:-} != FAIL ]]; then
    if ((DRY_RUN)); then
        echo "+ $EPX partition $MODEL --ep cuda"
    else
        "$EPX" partition "$MODEL" --ep cuda --plugin-dir "$PLUGINS/cuda" | tee "$OUT/cuda.partition" || true
        grep -q "cuda" "$OUT/cuda.partition" || echo "note: the partition printout names no cuda copies"
    fi
    if ! epx_run cuda_split --ep "cuda:ops=Conv,BatchNormalization,Relu"; then
        fail cuda_split "epx run with Conv/BatchNormalization/Relu on cuda failed (see $OUT/cuda_split.log)"
    fi
fi
if [[ -z ${RESULT[tensorrt]:-} ]]; then
    if ((!TRT_OK)) && ((!REQUIRE_TRT)); then
        skip tensorrt "TensorRT ($TRT_PIN from $TRT_INDEX) could not be installed"
    elif ! epx_run tensorrt --ep tensorrt; then
        if ((TRT_OK)) || ((REQUIRE_TRT)); then
            fail tensorrt "epx run --ep tensorrt failed (see $OUT/tensorrt.log)"
        else
            skip tensorrt "TensorRT not installed"
        fi
    fi
fi

if ((!RTX_OK)); then
    skip rtx "$RTX_PIN could not be installed"
elif ! epx_run rtx --ep rtx; then
    fail rtx "epx run --ep rtx failed (see $OUT/rtx.log and the providers listing above)"
fi

# --- 8. Compare ---------------------------------------------------------------------------------
step "8/8 compare the outputs (|a - b| <= $TOL)"
compare() { # EP: its outputs against the CPU EP's and the reference
    local ep=$1
    if ((DRY_RUN)); then
        echo "+ python3 (numpy): every $OUT/$ep/*.npy vs $OUT/cpu/ and vs $REFERENCE, tolerance $TOL"
        return 0
    fi
    PYTHONPATH="$PYDEPS${PYTHONPATH:+:$PYTHONPATH}" python3 - "$OUT/$ep" "$OUT/cpu" "$REFERENCE" "$TOL" <<'PY'
import glob, os, sys
import numpy as np
got_dir, cpu_dir, reference, tol = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
files = sorted(glob.glob(os.path.join(got_dir, "*.npy")))
if not files:
    sys.exit(f"  no .npy outputs in {got_dir}")
bad = 0
for f in files:
    name = os.path.basename(f)
    got = np.load(f)
    wants = [("cpu EP", os.path.join(cpu_dir, name))]
    if name == "probabilities.npy":
        wants.append(("reference", reference))
    for what, path in wants:
        want = np.load(path)
        if got.shape != want.shape or got.dtype != want.dtype:
            print(f"  {name} vs {what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}")
            bad += 1
            continue
        diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
        ok = diff <= tol
        bad += not ok
        print(f"  {name} vs {what}: max |diff| = {diff:.3g} {'ok' if ok else 'TOO LARGE'}")
sys.exit(1 if bad else 0)
PY
}
if [[ -z ${RESULT[cpu]:-} ]] && ! compare cpu; then
    fail cpu "the CPU EP's output differs from the reference"
fi
for ep in cuda cuda_split tensorrt rtx; do
    [[ -n ${RESULT[$ep]:-} ]] && continue
    if [[ $ep == cuda_split && ${RESULT[cuda]:-} == FAIL ]]; then
        fail cuda_split "not run: cuda failed"
        continue
    fi
    if [[ ${RESULT[cpu]:-} == FAIL ]]; then
        fail "$ep" "no CPU EP output to compare with"
    elif compare "$ep"; then
        RESULT[$ep]=PASS
    else
        fail "$ep" "outputs differ from the CPU EP's or the reference by more than $TOL"
    fi
done
[[ -z ${RESULT[cpu]:-} ]] && RESULT[cpu]=PASS

# Latency, for the record (not a pass/fail criterion): epx run --repeat prints min/median/max.
if ((!DRY_RUN)); then
    for spec in cpu cuda; do
        [[ $spec == cuda && ${RESULT[cuda]:-} != PASS ]] && continue
        args=()
        [[ $spec != cpu ]] && args=(--ep "$spec")
        echo "latency on $spec:"
        timeout 300 "$EPX" run "$MODEL" --input "image=$INPUT" "${args[@]}" --repeat 200 \
            --plugin-dir "$PLUGINS/cuda" 2>&1 | grep -Ei "median|runs" || true
    done
fi

# --- Summary ------------------------------------------------------------------------------------
printf '\n=== summary (%ds)\n' "$((SECONDS - START))"
status=0
for ep in cpu cuda cuda_split tensorrt rtx; do
    r=${RESULT[$ep]:-FAIL}
    ((DRY_RUN)) && r="(dry run)"
    printf '%-5s %s%s\n' "$r" "$ep" "${WHY[$ep]:+: ${WHY[$ep]}}"
    [[ $r == FAIL ]] && status=1
done
if ((DRY_RUN)); then
    echo "dry run: nothing was downloaded, built or run"
fi
exit "$status"
