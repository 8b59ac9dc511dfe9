#!/usr/bin/env bash
# Checks the deployment recipes (packaging/check.py): the KServe manifests against the API types
# of `kserve` from PyPI, installed with PyYAML into .testdata/kserve-venv (kept between runs; the
# serving benchmark's KServe server uses the same one), and the container recipe.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv=.testdata/kserve-venv
if ! "$venv/bin/python" -c 'import kserve, yaml' 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        kserve==0.21.0 pyyaml onnxruntime==1.31.1
fi
exec "$venv/bin/python" packaging/check.py
