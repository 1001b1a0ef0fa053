"""decode_video / decode_audio with the tiny diffusers VAEs (spec §11.1, §11.2, §13.22)."""
from __future__ import annotations


import pytest
import torch

from h3batch.worker.h3.decode import IMAGENET_MEAN, IMAGENET_STD, decode_audio, decode_video


def video_latents(t: int, hl: int, wl: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(1, 24, t, hl, wl, generator=generator) * scale  # [1, 24, T, Hl, Wl] fp32


def audio_rows(a: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2 * a, 32, generator=generator)  # [2A, 32] fp32


def manual_frames(vae, latents: torch.Tensor) -> torch.Tensor:
    """The §11.1 recipe spelled out with the raw vae.decode: denormalize, decode, ImageNet revert, clamp, round."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        out = vae.decode(latents * std + mean).sample  # [1, 3, N, H, W]
    pixels = (out * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1))
    return torch.round(pixels.clamp(0, 1) * 255).to(torch.uint8)[0].permute(1, 2, 3, 0)


@pytest.mark.parametrize("t, frames", [(7, 22), (12, 39), (32, 107)])
def test_video_frame_count_is_17n_plus_5(tiny_video_vae, t, frames):
    """T = 5n+2 latents decode to 17n+5 uint8 RGB frames of 16·Hl × 16·Wl."""
    out = decode_video(tiny_video_vae, video_latents(t, 8, 16))
    assert out.shape == (frames, 128, 256, 3)
    assert out.dtype == torch.uint8
    assert out.float().std() > 1.0  # an actual picture, not a constant


def test_video_matches_denormalized_raw_decode_with_clamping(loud_video_vae):
    """decode_video equals raw vae.decode of latent·std+mean with ImageNet revert, clamp and rounding, saturating
    at 0 and 255 without wrap-around; skipping the denormalization gives different frames."""
    latents = video_latents(7, 4, 8, seed=3)
    out = decode_video(loud_video_vae, latents)
    assert torch.equal(out, manual_frames(loud_video_vae, latents))
    assert (out == 0).any() and (out == 255).any()

    with torch.no_grad():
        raw = loud_video_vae.decode(latents).sample
    raw_frames = torch.round(
        (raw * torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1) + torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1))
        .clamp(0, 1) * 255
    ).to(torch.uint8)[0].permute(1, 2, 3, 0)
    assert not torch.equal(out, raw_frames)


def test_video_keeps_release_spatial_tiling(tiny_video_vae):
    """Above 256 px the default blended 256-px tiles are used (as released); untiled decoding would differ."""
    latents = video_latents(7, 4, 32, seed=4)  # 512×64 canvas: two or more tiles across
    assert tiny_video_vae.use_tiling
    tiled = decode_video(tiny_video_vae, latents)
    tiny_video_vae.disable_tiling()
    try:
        untiled = decode_video(tiny_video_vae, latents)
    finally:
        tiny_video_vae.enable_tiling()
    assert tiled.shape == untiled.shape == (22, 64, 512, 3)
    assert not torch.equal(tiled, untiled)


@pytest.mark.parametrize(
    "shape, message",
    [((1, 24, 8, 4, 8), "5n\\+2"), ((1, 24, 2, 4, 8), "5n\\+2"), ((1, 16, 7, 4, 8), "\\[1, 24, T, Hl, Wl\\]"),
     ((2, 24, 7, 4, 8), "\\[1, 24, T, Hl, Wl\\]"), ((24, 7, 4, 8), "\\[1, 24, T, Hl, Wl\\]")],
)
def test_video_rejects_bad_latent_shapes(tiny_video_vae, shape, message):
    """Latents that are not [1, 24, 5n+2, Hl, Wl] raise ValueError quoting the expectation."""
    with pytest.raises(ValueError, match=message):
        decode_video(tiny_video_vae, torch.zeros(shape))


@pytest.mark.parametrize("a", [1, 37, 178])
def test_audio_is_stereo_800_samples_per_latent_in_unit_range(tiny_audio_vae, a):
    """[2A, 32] rows decode to a float32 [2, 800A] waveform within [-1, 1]."""
    wave = decode_audio(tiny_audio_vae, audio_rows(a))
    assert wave.shape == (2, 800 * a)
    assert wave.dtype == torch.float32
    assert wave.abs().max() <= 1.0
    assert wave.std() > 0


def test_audio_rows_are_channel_major_and_denormalized(tiny_audio_vae):
    """Rows 0..A-1 are the left channel and A..2A-1 the right, each denormalized with the config statistics before
    the raw vae.decode; skipping the denormalization changes the waveform."""
    a = 20
    rows = audio_rows(a, seed=5)
    wave = decode_audio(tiny_audio_vae, rows)
    mean = torch.tensor(tiny_audio_vae.config.latents_mean).view(-1, 1)
    std = torch.tensor(tiny_audio_vae.config.latents_std).view(-1, 1)
    with torch.no_grad():
        for channel, block in enumerate((rows[:a], rows[a:])):
            alone = tiny_audio_vae.decode((block.T * std + mean)[None]).sample[0, 0]  # [800A]
            torch.testing.assert_close(wave[channel], alone, atol=1e-6, rtol=0)
        raw = tiny_audio_vae.decode(rows[:a].T[None]).sample[0, 0]
    assert not torch.allclose(wave[0], raw, atol=1e-3)


def test_audio_saturates_at_unit_range(loud_audio_vae):
    """A decoder that overshoots yields samples exactly at ±1 and never beyond."""
    wave = decode_audio(loud_audio_vae, audio_rows(10, seed=7))
    assert wave.abs().max() == 1.0
    assert (wave == 1.0).any() and (wave == -1.0).any()


@pytest.mark.parametrize("shape", [(75, 32), (74, 16), (0, 32), (2, 37, 32)])
def test_audio_rejects_bad_row_shapes(tiny_audio_vae, shape):
    """Rows that are not [2A, 32] with A >= 1 raise ValueError."""
    with pytest.raises(ValueError, match="audio rows must be \\[2A, 32\\]"):
        decode_audio(tiny_audio_vae, torch.zeros(shape))


def test_tiny_decode_of_4_4_second_clip_on_cpu(tiny_video_vae, tiny_audio_vae):
    """The 107-frame 256×128 clip (T=32) and its 178 audio latents decode on CPU to their full shapes (how fast is
    bench/e2e.py's question, not a test's)."""
    frames = decode_video(tiny_video_vae, video_latents(32, 8, 16))
    wave = decode_audio(tiny_audio_vae, audio_rows(178))
    assert frames.shape == (107, 128, 256, 3) and wave.shape == (2, 142_400)
