"""faster-whisper: its Silero VAD (silero_vad_v6.onnx shipped in the wheel), via
faster_whisper.vad.get_speech_timestamps (Whisper itself runs on CTranslate2, not ONNX)."""
import synth

CATEGORY = "audio (VAD)"
PACKAGE = "faster-whisper"


def run() -> dict:
    from faster_whisper.vad import VadOptions, get_speech_timestamps, get_vad_model
    audio = synth.scene()
    out = {}
    out["default"] = get_speech_timestamps(audio)
    out["strict"] = get_speech_timestamps(audio, VadOptions(threshold=0.7, min_silence_duration_ms=100))
    model = get_vad_model()
    probs = model(audio[: 16000 * 4])
    out["probs"] = synth.r(probs.reshape(-1)[::8], 5)
    return out


def summary(result: dict) -> str:
    return "segments " + " ".join(f"{s['start']/16000:.2f}-{s['end']/16000:.2f}" for s in result["default"])


def compare(ort: dict, epx: dict) -> list:
    import compare as c
    # Sample offsets of speech segments: 512-sample windows, so allow one window.
    problems = c.compare(ort["default"], epx.get("default"), where="default", px=512, _box=True)
    problems += c.compare(ort["strict"], epx.get("strict"), where="strict", px=512, _box=True)
    problems += c.compare(ort["probs"], epx.get("probs"), where="probs", atol=2e-3)
    return problems
