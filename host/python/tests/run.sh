#!/usr/bin/env bash
# The Python tests, as a user gets epx: a fresh virtual environment, the built wheel installed
# with pip (no Rust, no repository on sys.path), ONNX Runtime and RapidOCR from PyPI beside it
# for the comparisons, then pytest on host/python/tests.
#
#   bash host/python/tests/run.sh [WHEEL] [pytest args...]
#
# WHEEL defaults to target/wheels/epx-*.whl (packaging/wheel.sh). EPX_TEST_FIXTURES (default:
# target/debug) is where the fixture plugins are; the tests that install a plugin skip without.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
wheel="${1:-}"
[[ $# -gt 0 ]] && shift
if [[ -z "$wheel" ]]; then
    wheels=(target/wheels/epx-*.whl)
    wheel="${wheels[0]}"
fi
[[ -f "$wheel" ]] || { echo "run.sh: no wheel at $wheel; build it with packaging/wheel.sh" >&2; exit 1; }
venv=.testdata/wheel-venv
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all:)
"${pip[@]}" "$wheel"
# The same ONNX Runtime the adapter tests use, the third-party package of test_rapidocr.py, and
# the Open Inference Protocol clients of test_serve.py.
"${pip[@]}" "pytest>=8,<9" onnxruntime==1.31.1 rapidocr-onnxruntime==1.4.4 \
    "tritonclient[http,grpc]==2.60.0"
export EPX_REPO="$PWD"
export EPX_TEST_FIXTURES="${EPX_TEST_FIXTURES:-$PWD/target/debug}"
# Run from outside the repository, so that `import epx` can only be the installed wheel.
cd "$venv"
exec bin/python -m pytest -q -p no:cacheprovider \
    --rootdir "$EPX_REPO/host/python/tests" "$EPX_REPO/host/python/tests" "$@"
