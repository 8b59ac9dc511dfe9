#!/usr/bin/env bash
# The project's test command: fetches the test data, builds every crate (the plugin fixtures the
# tests load are cdylibs), runs the unit and integration tests, then the ONNX conformance suite
# with its per-op table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tests/fetch-testdata.sh
bash plugins/onnxruntime/fetch-runtime.sh
bash plugins/openvino/fetch-runtime.sh
cargo build --workspace --all-targets
cargo test --workspace -- --skip onnx_node_tests_on_the_cpu_ep
cargo test -p epx-tests --test conformance -- --nocapture
