#!/usr/bin/env bash
# The model benchmark: fetches the models and ONNX Runtime, builds, runs. Arguments go to the
# program (`--runs N`, `--threads 1,2`, `--only det,rec-f16,...`, `--tract`, `--no-micro`, `--isolation`, `--kernel-cache`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
bash tests/bench/fetch-models.sh >/dev/null
bash plugins/onnxruntime/fetch-runtime.sh >/dev/null
bash plugins/openvino/fetch-runtime.sh >/dev/null
cargo build --release -p epx-bench -p epx-cli -p epx-cpu-plugin -p epx-openvino --features epx-bench/bench
EPX_ORT_SEARCH_PATH="${EPX_ORT_SEARCH_PATH:-$PWD/.testdata/onnxruntime/capi}" \
EPX_OPENVINO_SEARCH_PATH="${EPX_OPENVINO_SEARCH_PATH:-$PWD/.testdata/openvino/libs}" \
    exec "${CARGO_TARGET_DIR:-target}/release/epx-bench" "$@"
