"""Input audio for the driver (spec §5.3, §4.1): WAV identity, decoding, resampling, tail, 80 ms framing.

Pure functions over bytes and numpy arrays; nothing here touches a socket. The stdlib `wave` module parses the
container; the sample-width scaling and the linear resampler are written out because the spec fixes their exact
arithmetic (e.g. round-half-to-even of the target length), which a general resampler would not reproduce.
"""
from __future__ import annotations

import base64
import hashlib
import json
import math
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SAMPLE_RATE_HZ = 24_000
FRAME_SAMPLES = 1_920  # 80 ms at 24 kHz
FRAME_PERIOD_S = 0.080
PCM16_FRAME_BYTES = FRAME_SAMPLES * 2
SPEECH_RMS_THRESHOLD = 1e-4  # `is_speech` hint on each append (§4.1)


@dataclass(frozen=True)
class InputIdentity:
    """Resolved absolute path and SHA-256 hex digest of the input WAV file."""

    path: str
    sha256: str


def input_identity(path: str | Path, expected_sha256: str | None = None) -> InputIdentity:
    """Hash the file; raise ValueError on a mismatch with `expected_sha256` (compared lower-case)."""
    resolved = Path(path).resolve()
    digest = hashlib.sha256(resolved.read_bytes()).hexdigest()
    if expected_sha256 is not None and digest != expected_sha256.lower():
        raise ValueError(
            f"input WAV SHA-256 mismatch: expected={expected_sha256.lower()}, actual={digest}, path={resolved}")
    return InputIdentity(path=str(resolved), sha256=digest)


def decode_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Mono float64 samples in [-1, 1) and the file's sample rate; channels are averaged."""
    with wave.open(str(path), "rb") as wav:
        width, channels, rate = wav.getsampwidth(), wav.getnchannels(), wav.getframerate()
        raw = wav.readframes(wav.getnframes())
    if width == 1:
        samples = (np.frombuffer(raw, dtype=np.uint8).astype(np.float64) - 128.0) / 128.0
    elif width == 2:
        samples = np.frombuffer(raw, dtype="<i2").astype(np.float64) / 32768.0
    elif width == 4:
        samples = np.frombuffer(raw, dtype="<i4").astype(np.float64) / 2.0**31
    else:
        raise ValueError(f"unsupported WAV sample width: {width}")
    usable = len(samples) - len(samples) % channels
    return samples[:usable].reshape(-1, channels).mean(axis=1), rate


def resample_linear(samples: np.ndarray, rate: int) -> np.ndarray:
    """Linear interpolation onto max(1, round(n*24000/rate)) evenly spaced positions over indices 0..n-1."""
    n = len(samples)
    if rate == SAMPLE_RATE_HZ or n == 0:
        return samples
    target = max(1, round(n * SAMPLE_RATE_HZ / rate))
    positions = np.linspace(0.0, n - 1, target)
    return np.interp(positions, np.arange(n, dtype=np.float64), samples)


def load_input_samples(path: str | Path, tail_s: float) -> np.ndarray:
    """Decode, resample to 24 kHz, check finiteness and append `round(tail_s*24000)` zeros."""
    samples, rate = decode_wav(path)
    samples = resample_linear(samples, rate)
    if len(samples) == 0 or not np.all(np.isfinite(samples)):
        raise ValueError("input WAV must contain finite audio")
    if tail_s > 0:
        samples = np.concatenate([samples, np.zeros(round(tail_s * SAMPLE_RATE_HZ))])
    return samples


def split_frames(samples: np.ndarray, max_frames: int | None = None) -> list[np.ndarray]:
    """ceil(n/1920) float32 frames of 1920 samples, the last zero-padded; optionally the first `max_frames`."""
    count = math.ceil(len(samples) / FRAME_SAMPLES)
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.float32)
    padded[: len(samples)] = samples
    frames = [padded[i * FRAME_SAMPLES:(i + 1) * FRAME_SAMPLES] for i in range(count)]
    return frames if max_frames is None else frames[:max_frames]


def frame_is_speech(frame: np.ndarray) -> bool:
    """The append's `is_speech` hint: padded-frame RMS >= 1e-4."""
    return float(np.sqrt(np.mean(np.square(frame.astype(np.float64))))) >= SPEECH_RMS_THRESHOLD


def append_message(seq: int, frame: np.ndarray) -> str:
    """The JSON text of one `input_audio_buffer.append` for frame `seq` (0-based)."""
    return json.dumps({
        "type": "input_audio_buffer.append",
        "audio": base64.b64encode(frame.astype("<f4").tobytes()).decode("ascii"),
        "format": "pcm_f32le",
        "sample_rate_hz": SAMPLE_RATE_HZ,
        "duration_ms": 80,
        "audio_end_ms": (seq + 1) * 80,
        "is_speech": frame_is_speech(frame),
    })


def write_pcm16_wav(path: str | Path, pcm: bytes) -> None:
    """Write PCM16 LE mono 24 kHz bytes as a WAV file (lifecycle artifacts)."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE_HZ)
        wav.writeframes(pcm)
