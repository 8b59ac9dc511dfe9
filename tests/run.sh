#!/usr/bin/env bash
# The project's test command: fetches the test data, builds every crate (the plugin fixtures the
# tests load are cdylibs), runs the unit and integration tests, then the ONNX conformance suite
# with its per-op table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tests/fetch-testdata.sh
bash plugins/onnxruntime/fetch-runtime.sh
bash plugins/openvino/fetch-runtime.sh
# numpy for the Python module tests (tests/capi.rs, tests/packaging.rs), when python3 has none.
python3 -c 'import numpy' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        --target .testdata/py numpy==2.4.6
cargo build --workspace --all-targets
cargo test --workspace -- --skip onnx_node_tests_on_the_cpu_ep
cargo test -p epx-tests --test conformance -- --nocapture
