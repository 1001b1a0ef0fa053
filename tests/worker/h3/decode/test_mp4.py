"""write_mp4 / probe_mp4, checked by decoding the produced files with PyAV (spec §11.3)."""
from __future__ import annotations

import os
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from h3batch.worker.h3.decode import decode_audio, decode_video
from h3batch.worker.h3.mp4 import probe_mp4, write_mp4

FPS, RATE = 24, 32_000


def gradient_frames(n: int, height: int, width: int) -> np.ndarray:
    """Smooth moving colour ramps (H.264-friendly): uint8 [N, H, W, 3]."""
    y, x = np.mgrid[0:height, 0:width]
    frames = np.empty((n, height, width, 3), dtype=np.uint8)
    for i in range(n):
        frames[i, ..., 0] = (x * 255 // (width - 1) + 3 * i) % 256
        frames[i, ..., 1] = y * 255 // (height - 1)
        frames[i, ..., 2] = 128 + 60 * np.sin(2 * np.pi * (x + y + 4 * i) / 97)
    return frames


def tones(samples: int) -> np.ndarray:
    """440 Hz left, 220 Hz right: float32 [2, samples]."""
    t = np.arange(samples) / RATE
    return np.stack([0.5 * np.sin(2 * np.pi * 440 * t), 0.3 * np.sin(2 * np.pi * 220 * t)]).astype(np.float32)


def decoded_audio(path) -> np.ndarray:
    with av.open(os.fspath(path)) as container:
        return np.concatenate([frame.to_ndarray() for frame in container.decode(audio=0)], axis=1)  # [2, n] fltp


def decoded_frames(path) -> np.ndarray:
    with av.open(os.fspath(path)) as container:
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)])


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    """A 22-frame 256×128 clip with A=37 latents' worth of audio (29,600 samples) and three metadata tags."""
    path = tmp_path_factory.mktemp("mp4") / "clip.mp4"
    frames, audio = gradient_frames(22, 128, 256), tones(800 * 37)
    metadata = {"job_id": "0f3c9a", "seed": "1234", "prompt_sha256": "9b74c9897bac770ffc029102a200c5de"}
    write_mp4(path, frames, audio, metadata=metadata)
    return path, frames, audio, metadata


def test_streams_match_the_contract(clip):
    """One H.264 yuv420p stream of N frames at W×H and 24/1 fps; one AAC fltp stream, stereo, 32 kHz."""
    path, frames, _, _ = clip
    info = probe_mp4(path)
    assert info["video_codec"] == "h264" and info["pix_fmt"] == "yuv420p"
    assert (info["frames"], info["width"], info["height"]) == (22, 256, 128)
    assert info["average_fps"] == Fraction(24, 1)
    assert info["video_duration_s"] == pytest.approx(22 / 24)
    assert info["audio_codec"] == "aac" and info["audio_format"] == "fltp"
    assert (info["channels"], info["sample_rate"]) == (2, 32_000)


def test_audio_duration_within_one_frame_after_priming(clip):
    """Audio lasts 800A/32000 s within 1/24 s: the 1024 priming samples are trimmed by the edit list on decode."""
    path, _, audio, _ = clip
    info = probe_mp4(path)
    expected_s = audio.shape[1] / RATE
    assert abs(info["audio_duration_s"] - expected_s) < 1 / 24
    assert abs(info["audio_samples"] - audio.shape[1]) < RATE / 24
    assert abs(info["duration_s"] - expected_s) < 1 / 24


def test_decoded_content_matches_input(clip):
    """Decoded frames are close to the input pixels and each decoded channel carries its own tone, time-aligned."""
    path, frames, audio, _ = clip
    pixels = decoded_frames(path)
    assert pixels.shape == frames.shape
    assert np.abs(pixels.astype(np.int16) - frames.astype(np.int16)).mean() < 3.0

    sound = decoded_audio(path)[:, : audio.shape[1]]
    middle = slice(2048, audio.shape[1] - 2048)  # skip encoder edge effects
    for channel in range(2):
        error = sound[channel, middle] - audio[channel, middle]
        snr_db = 10 * np.log10(np.mean(audio[channel, middle] ** 2) / np.mean(error**2))
        assert snr_db > 30, f"channel {channel}: SNR {snr_db:.1f} dB"


def test_metadata_round_trips(clip):
    """Every metadata tag written is read back unchanged from the container."""
    path, _, _, metadata = clip
    tags = probe_mp4(path)["metadata"]
    assert {key: tags.get(key) for key in metadata} == metadata


def test_no_temporary_file_is_left_behind(clip):
    """After a successful write the directory holds only the target file."""
    path, _, _, _ = clip
    assert sorted(os.listdir(path.parent)) == [path.name]


class FailingFrames(np.ndarray):
    """uint8 frames whose iteration fails after a few frames, recording what the directory looked like then."""

    def __iter__(self):
        for index in range(self.shape[0]):
            if index == 5:
                self.seen = sorted(os.listdir(self.watch_dir))
                raise RuntimeError("frame source broke mid-write")
            yield np.asarray(self[index])


def test_failure_mid_write_leaves_no_target_and_no_temp(tmp_path):
    """A failure while encoding removes the partial temp file and never creates the target; the partial data went
    to a hidden temp file beside the target, not to the target."""
    frames = gradient_frames(12, 64, 64).view(FailingFrames)
    frames.watch_dir = tmp_path
    target = tmp_path / "out.mp4"
    with pytest.raises(RuntimeError, match="mid-write"):
        write_mp4(target, frames, tones(800 * 20))
    assert len(frames.seen) == 1 and frames.seen[0].startswith(".out.mp4.") and frames.seen[0].endswith(".partial")
    assert os.listdir(tmp_path) == []


def test_failed_rewrite_keeps_previous_file_intact(tmp_path):
    """If rewriting an existing target fails, the old complete MP4 is still there and still decodes."""
    target = tmp_path / "out.mp4"
    write_mp4(target, gradient_frames(5, 64, 64), tones(800 * 9))
    before = target.read_bytes()
    frames = gradient_frames(12, 64, 64).view(FailingFrames)
    frames.watch_dir = tmp_path
    with pytest.raises(RuntimeError):
        write_mp4(target, frames, tones(800 * 20))
    assert target.read_bytes() == before
    assert probe_mp4(target)["frames"] == 5
    assert os.listdir(tmp_path) == ["out.mp4"]


@pytest.mark.parametrize(
    "frames, audio, kwargs, message",
    [
        (np.zeros((3, 64, 64, 3), np.float32), tones(800), {}, "frames must be uint8"),
        (np.zeros((3, 64, 64), np.uint8), tones(800), {}, "frames must be uint8"),
        (np.zeros((3, 63, 64, 3), np.uint8), tones(800), {}, "must be even"),
        (np.zeros((3, 64, 64, 3), np.uint8), tones(800)[:1], {}, "audio must be float32 \\[2"),
        (np.zeros((3, 64, 64, 3), np.uint8), tones(800).astype(np.float64), {}, "audio must be float32"),
        (np.zeros((3, 64, 64, 3), np.uint8), tones(800), {"metadata": {"seed": 7}}, "metadata must map"),
        (np.zeros((3, 64, 64, 3), np.uint8), tones(800), {"fps": 0}, "fps and sample_rate"),
    ],
)
def test_rejects_malformed_inputs_before_writing(tmp_path, frames, audio, kwargs, message):
    """Malformed frames, audio, fps or metadata raise ValueError and nothing is written."""
    with pytest.raises(ValueError, match=message):
        write_mp4(tmp_path / "bad.mp4", frames, audio, **kwargs)
    assert os.listdir(tmp_path) == []


def test_decoded_tiny_clip_muxes_to_a_correct_mp4(tiny_video_vae, tiny_audio_vae, tmp_path):
    """§13.22 end to end: T=32 and A=178 latents decode and mux to 107 frames at 256×128 and 142,400 stereo
    samples (4.45 s), accepting torch tensors as they come out of the decoders."""
    generator = torch.Generator().manual_seed(0)
    frames = decode_video(tiny_video_vae, torch.randn(1, 24, 32, 8, 16, generator=generator))
    wave = decode_audio(tiny_audio_vae, torch.randn(356, 32, generator=generator))
    path = write_mp4(tmp_path / "tiny.mp4", frames, wave, metadata={"job_id": "tiny"})
    info = probe_mp4(path)
    assert (info["frames"], info["width"], info["height"]) == (107, 256, 128)
    assert info["average_fps"] == Fraction(24, 1)
    assert (info["channels"], info["sample_rate"]) == (2, 32_000)
    assert abs(info["audio_duration_s"] - 142_400 / RATE) < 1 / 24
    assert info["metadata"]["job_id"] == "tiny"
