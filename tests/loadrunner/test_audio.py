"""Input WAV identity, decoding, resampling, tail and framing (§5.3) and append messages (§4.1)."""
from __future__ import annotations

import base64
import hashlib
import json

import numpy as np
import pytest

from h3batch.loadrunner.audio import append_message, decode_wav, input_identity, load_input_samples, split_frames
from h3batch.loadrunner.protocol import realtime_url
from tests.loadrunner.harness import write_wav


def test_sha_mismatch_names_both_digests(fixture_wav):
    """A wrong --expected-input-sha256 raises before any session, naming expected, actual and path."""
    actual = hashlib.sha256(fixture_wav.read_bytes()).hexdigest()
    with pytest.raises(ValueError) as info:
        input_identity(fixture_wav, "AB" * 32)
    assert str(info.value) == (f"input WAV SHA-256 mismatch: expected={'ab' * 32}, actual={actual}, "
                               f"path={fixture_wav.resolve()}")
    assert input_identity(fixture_wav, actual.upper()).sha256 == actual


@pytest.mark.parametrize("width,value,expected", [(1, 192, 0.5), (2, 16384, 0.5), (4, 2**30, 0.5)])
def test_sample_width_scaling(tmp_path, width, value, expected):
    """8-bit unsigned, 16-bit and 32-bit PCM decode to the same float."""
    samples, rate = decode_wav(write_wav(tmp_path / "w.wav", np.full(10, value), width=width))
    assert rate == 24000 and samples == pytest.approx(np.full(10, expected))


def test_unsupported_width(tmp_path):
    """24-bit WAV is refused with the width named."""
    import wave
    path = tmp_path / "w24.wav"
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1), wav.setsampwidth(3), wav.setframerate(24000), wav.writeframes(bytes(30))
    with pytest.raises(ValueError, match="unsupported WAV sample width: 3"):
        decode_wav(path)


def test_odd_16k_input_rounds_half_to_even(tmp_path):
    """An odd-length 16 kHz input resamples to round-half-even(n*1.5) samples over both end points."""
    path = write_wav(tmp_path / "w.wav", np.arange(5) * 1000, rate=16000)
    samples = load_input_samples(path, 0.0)
    assert len(samples) == round(7.5) == 8
    assert samples[0] == 0 and samples[-1] == pytest.approx(4000 / 32768)


def test_empty_input_refused(tmp_path):
    """A WAV without samples cannot drive a session."""
    with pytest.raises(ValueError, match="input WAV must contain finite audio"):
        load_input_samples(write_wav(tmp_path / "e.wav", np.zeros(0)), 0.0)


def test_tail_and_framing(fixture_wav):
    """The default 2 s tail adds 25 frames; the last frame is zero-padded; load frames truncate."""
    samples = load_input_samples(fixture_wav, 2.0)
    assert len(samples) == 3840 + 48000
    frames = split_frames(samples)
    assert len(frames) == 27 and all(len(f) == 1920 for f in frames)
    assert len(split_frames(samples, 5)) == 5


def test_append_message_fields():
    """Each append carries base64 float32 LE, rate, duration, end time and the RMS speech hint."""
    frame = np.full(1920, 0.5, dtype=np.float32)
    msg = json.loads(append_message(3, frame))
    assert msg["type"] == "input_audio_buffer.append" and msg["format"] == "pcm_f32le"
    assert msg["sample_rate_hz"] == 24000 and msg["duration_ms"] == 80 and msg["audio_end_ms"] == 320
    assert len(msg["audio"]) == 10240 and np.frombuffer(base64.b64decode(msg["audio"]), "<f4")[0] == 0.5
    assert msg["is_speech"] is True
    assert json.loads(append_message(0, np.zeros(1920, np.float32)))["is_speech"] is False


@pytest.mark.parametrize("base,expected", [
    ("ws://127.0.0.1:8099/v1/realtime?duplex=1",
     "ws://127.0.0.1:8099/v1/realtime?duplex=1&model=nvidia%2Fpersonaplex-7b-v1&autostart=0"),
    ("wss://u:p@h:1/x?a=1&model=old&b=&a=2#frag",
     "wss://u:p@h:1/x?a=2&model=nvidia%2Fpersonaplex-7b-v1&b=&duplex=1&autostart=0#frag"),
])
def test_url_construction(base, expected):
    """Query keys keep their first position and last value; duplex/model/autostart are set or appended."""
    assert realtime_url(base, "nvidia/personaplex-7b-v1") == expected
