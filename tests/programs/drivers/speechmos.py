"""speechmos: Microsoft's DNSMOS (two ONNX models) and PLCMOS quality estimators."""
import synth

CATEGORY = "audio"
PACKAGE = "speechmos"


def run() -> dict:
    from speechmos import dnsmos, plcmos
    audio = synth.scene()
    out = {}
    out["dnsmos"] = synth.r(dict(sorted(dnsmos.run(audio, 16000).items())), 6)
    out["dnsmos_personalized"] = synth.r(dict(sorted(dnsmos.run(audio, 16000, model_type="dnsmos_personalized").items())), 6)
    # PLCMOS averages over random rater embeddings (np.random.normal, unseeded): seed it.
    import numpy as np
    np.random.seed(1234)
    res = plcmos.run(synth.speechlike(6.0, f0=160, seed=5), 16000)
    out["plcmos"] = synth.r(dict(sorted(res.items())) if isinstance(res, dict) else res, 6)
    return out


def summary(result: dict) -> str:
    d = result["dnsmos"]
    return f"ovrl={d.get('ovrl_mos', 0):.3f} sig={d.get('sig_mos', 0):.3f} bak={d.get('bak_mos', 0):.3f} plcmos={result['plcmos']}"
