"""Deterministic inputs for the drivers: images with drawn text, shapes, and audio signals.

Everything here is made from fixed numbers (no randomness without a fixed seed, no files from
the network), so the ONNX Runtime run and the epx run of a driver see the same bytes."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw, ImageFont


def font(size: int = 40) -> ImageFont.FreeTypeFont:
    """Pillow's bundled FreeType font (the same on every machine)."""
    return ImageFont.load_default(size=size)


def text_image(lines, size=(640, 200), font_size=40, fg=(0, 0, 0), bg=(255, 255, 255),
               origin=(20, 20), spacing=1.5) -> Image.Image:
    """An RGB image with `lines` of text drawn one under another."""
    img = Image.new("RGB", size, bg)
    draw = ImageDraw.Draw(img)
    f = font(font_size)
    x, y = origin
    for line in lines:
        draw.text((x, y), line, fill=fg, font=f)
        y += int(font_size * spacing)
    return img


def captcha_image(text: str, size=(160, 60), font_size=36, seed=7) -> Image.Image:
    """A simple captcha-like image: text on a light background with a few fixed noise lines."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", size, (235, 235, 235))
    draw = ImageDraw.Draw(img)
    for _ in range(4):
        xy = [int(v) for v in rng.integers(0, [size[0], size[1], size[0], size[1]])]
        draw.line(xy, fill=tuple(int(c) for c in rng.integers(120, 200, 3)), width=1)
    draw.text((10, (size[1] - font_size) // 2 - 4), text, fill=(30, 30, 90), font=font(font_size))
    return img


def shapes_image(size=(640, 480), seed=3) -> Image.Image:
    """A colourful scene of rectangles and ellipses (no people, nothing that means anything)."""
    rng = np.random.default_rng(seed)
    img = Image.new("RGB", size, (200, 220, 240))
    draw = ImageDraw.Draw(img)
    for i in range(12):
        x0, y0 = int(rng.integers(0, size[0] - 80)), int(rng.integers(0, size[1] - 80))
        w, h = int(rng.integers(30, 200)), int(rng.integers(30, 200))
        colour = tuple(int(c) for c in rng.integers(0, 255, 3))
        (draw.rectangle if i % 2 else draw.ellipse)([x0, y0, x0 + w, y0 + h], fill=colour)
    return img


def skin_image(size=(480, 640)) -> Image.Image:
    """A smooth skin-toned gradient with a darker ellipse: gives detectors something to score."""
    w, h = size
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    r = 200 + 40 * np.sin(xx / 60.0) * np.cos(yy / 80.0)
    g = 150 + 30 * np.cos(xx / 50.0)
    b = 120 + 25 * np.sin(yy / 70.0)
    arr = np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)
    img = Image.fromarray(arr, "RGB")
    draw = ImageDraw.Draw(img)
    draw.ellipse([w * 0.3, h * 0.3, w * 0.7, h * 0.6], fill=(150, 90, 70))
    return img


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def bgr(img: Image.Image) -> np.ndarray:
    """The image as OpenCV's HxWx3 uint8 BGR array."""
    return np.ascontiguousarray(np.asarray(img.convert("RGB"))[:, :, ::-1])


# Audio -------------------------------------------------------------------------------------

def tone(freq: float, seconds: float, sr: int = 16000, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sr), dtype=np.float64) / sr
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def chirp(f0: float, f1: float, seconds: float, sr: int = 16000, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * sr), dtype=np.float64) / sr
    k = (f1 - f0) / seconds
    return (amp * np.sin(2 * np.pi * (f0 * t + 0.5 * k * t * t))).astype(np.float32)


def noise(seconds: float, sr: int = 16000, amp: float = 0.05, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (amp * rng.standard_normal(int(seconds * sr))).astype(np.float32)


def speechlike(seconds: float, sr: int = 16000, f0: float = 140.0, seed: int = 1) -> np.ndarray:
    """A voiced, syllable-modulated harmonic signal: a glottal-like pulse train through a few
    formant resonances, switched on and off at about 4 Hz. Crude, but voice detectors react."""
    from scipy.signal import lfilter
    rng = np.random.default_rng(seed)
    n = int(seconds * sr)
    t = np.arange(n) / sr
    pitch = f0 * (1 + 0.1 * np.sin(2 * np.pi * 0.7 * t))
    phase = np.cumsum(pitch / sr)
    pulses = (np.diff(np.floor(phase), prepend=0) > 0).astype(np.float64)
    sig = pulses
    for formant, bw in ((700, 130), (1220, 70), (2600, 160)):
        r = np.exp(-np.pi * bw / sr)
        theta = 2 * np.pi * formant / sr
        sig = lfilter([1 - r], [1, -2 * r * np.cos(theta), r * r], sig)
    envelope = 0.5 * (1 + np.sign(np.sin(2 * np.pi * 4.0 * t + 0.3)))
    sig = sig * envelope + 0.002 * rng.standard_normal(n)
    sig = sig / (np.max(np.abs(sig)) + 1e-9) * 0.6
    return sig.astype(np.float32)


def silence(seconds: float, sr: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * sr), dtype=np.float32)


def wav_bytes(samples: np.ndarray, sr: int = 16000) -> bytes:
    """16-bit PCM WAV of float samples in [-1, 1]."""
    import wave
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sr)
        w.writeframes(pcm)
    return buf.getvalue()


def r(x, digits: int = 6):
    """Rounds floats (also inside lists/tuples/numpy arrays) for JSON results."""
    if isinstance(x, np.ndarray):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [r(v, digits) for v in x]
    if isinstance(x, dict):
        return {str(k): r(v, digits) for k, v in x.items()}
    if isinstance(x, (np.floating, float)):
        return round(float(x), digits)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.bool_):
        return bool(x)
    return x


def face_image(size=(320, 400), skin=(224, 172, 140), seed=0) -> Image.Image:
    """A crude frontal face: head, hair, eyes, brows, nose, mouth, neck and shoulders."""
    w, h = size
    img = Image.new("RGB", size, (235, 235, 230))
    d = ImageDraw.Draw(img)
    cx = w // 2
    d.rectangle([cx - 130, int(h * 0.78), cx + 130, h], fill=(60, 80, 140))           # shirt
    d.rectangle([cx - 30, int(h * 0.62), cx + 30, int(h * 0.8)], fill=skin)            # neck
    d.ellipse([cx - 95, int(h * 0.08), cx + 95, int(h * 0.3)], fill=(60, 40, 25))      # hair
    d.ellipse([cx - 85, int(h * 0.12), cx + 85, int(h * 0.7)], fill=skin)              # face
    for ex in (cx - 38, cx + 38):
        d.ellipse([ex - 16, int(h * 0.33), ex + 16, int(h * 0.38)], fill=(255, 255, 255))
        d.ellipse([ex - 7, int(h * 0.335), ex + 7, int(h * 0.375)], fill=(70, 50, 30))
        d.line([ex - 20, int(h * 0.3), ex + 20, int(h * 0.295)], fill=(60, 40, 25), width=5)
    d.line([cx, int(h * 0.38), cx - 8, int(h * 0.5), cx + 6, int(h * 0.51)], fill=(170, 120, 100), width=3)
    d.chord([cx - 35, int(h * 0.52), cx + 35, int(h * 0.6)], 0, 180, fill=(180, 70, 70))
    return img


def sample_path(name: str) -> str:
    """A photo shipped inside scikit-image's wheel (skimage/data): astronaut.png, camera.png,
    chelsea.png, coffee.png, page.png, text.png, rocket.jpg, ... (read locally, never fetched)."""
    import importlib.util
    import os
    spec = importlib.util.find_spec("skimage")
    path = os.path.join(os.path.dirname(spec.origin), "data", name)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


def sample_image(name: str) -> Image.Image:
    return Image.open(sample_path(name)).convert("RGB")


def scene(sr: int = 16000) -> np.ndarray:
    """About 9 s: silence, a spoken sentence, noise, another sentence (lower voice), a tone,
    silence. The speech comes from eSpeak NG (see speak())."""
    parts = [silence(1.0, sr), speak("Hello, this is a test of the voice activity detector.", sr),
             noise(1.0, sr, 0.02, seed=2),
             speak("Second sentence, spoken a little later.", sr, pitch=30),
             tone(440, 0.5, sr, 0.3), silence(1.0, sr)]
    return np.concatenate(parts).astype(np.float32)


_ESPEAK = None


def speak(text: str, sr: int = 16000, voice: str = "en-us", rate: int = 160,
          pitch: int = 50) -> np.ndarray:
    """Speech synthesised by eSpeak NG (the library and voice data come in the espeakng-loader
    wheel), resampled to `sr`; float32 in [-1, 1]. Deterministic."""
    global _ESPEAK
    import ctypes
    import os
    import espeakng_loader
    from scipy.signal import resample_poly
    chunks: list = []
    CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                                ctypes.c_void_p)
    if _ESPEAK is None:
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        data = os.path.dirname(espeakng_loader.get_data_path())
        lib.espeak_Initialize.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_int]
        rate_hz = lib.espeak_Initialize(2, 0, data.encode(), 0)  # AUDIO_OUTPUT_SYNCHRONOUS
        if rate_hz <= 0:
            raise RuntimeError("espeak_Initialize failed")

        def on_audio(wav, n, events):
            if n > 0 and wav:
                chunks_ref = _ESPEAK["chunks"]
                chunks_ref.append(np.ctypeslib.as_array(wav, shape=(n,)).copy())
            return 0

        cb = CALLBACK(on_audio)
        lib.espeak_SetSynthCallback(cb)
        _ESPEAK = {"lib": lib, "rate": rate_hz, "cb": cb, "chunks": chunks}
    lib = _ESPEAK["lib"]
    _ESPEAK["chunks"] = chunks
    lib.espeak_SetVoiceByName(voice.encode())
    lib.espeak_SetParameter(1, rate, 0)   # espeakRATE
    lib.espeak_SetParameter(3, pitch, 0)  # espeakPITCH
    raw = text.encode("utf-8") + b"\0"
    lib.espeak_Synth.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint, ctypes.c_int,
                                 ctypes.c_uint, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p]
    lib.espeak_Synth(raw, len(raw), 0, 1, 0, 0, None, None)
    lib.espeak_Synchronize()
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
    audio = pcm.astype(np.float64) / 32768.0
    src = _ESPEAK["rate"]
    if src != sr:
        from math import gcd
        g = gcd(src, sr)
        audio = resample_poly(audio, sr // g, src // g)
    return audio.astype(np.float32)
