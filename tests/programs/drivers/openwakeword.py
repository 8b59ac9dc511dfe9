"""openwakeword 0.4.0: melspectrogram + embedding + wake-word models, and its Silero VAD
(all shipped in the 0.4.0 wheel)."""
import numpy as np

import synth

CATEGORY = "audio"
PACKAGE = "openwakeword"


def run() -> dict:
    from openwakeword.model import Model
    model = Model(vad_threshold=0.5)
    speech = np.concatenate([synth.silence(0.5), synth.speak("Alexa, what time is it?"),
                             synth.silence(0.7), synth.speak("Hey Jarvis, turn on the lights."),
                             synth.silence(0.7), synth.speak("Hey Mycroft, what's the weather like?"),
                             synth.silence(0.7)])
    audio = (speech * 32767).astype(np.int16)
    frames = model.predict_clip(audio)
    out = {"frames": len(frames)}
    for name in sorted(frames[0]):
        series = np.array([f[name] for f in frames], dtype=np.float64)
        out[name] = {"max": round(float(series.max()), 6), "mean": round(float(series.mean()), 6),
                     "first": [round(float(x), 6) for x in series[:: max(1, len(series) // 10)]]}
    model.reset()
    # Streaming, 80 ms chunks, and the VAD's raw scores.
    last = None
    for i in range(0, 16000 * 3, 1280):
        last = model.predict(audio[i:i + 1280])
    out["stream_last"] = {k: round(float(v), 6) for k, v in sorted(last.items())}
    out["vad_max"] = round(float(np.max(model.vad.prediction_buffer)), 6) if hasattr(model, "vad") else None
    return out


def summary(result: dict) -> str:
    return f"{result['frames']} frames; " + " ".join(
        f"{k}={v['max']:.3f}" for k, v in result.items() if isinstance(v, dict) and "max" in v)
