"""Denoised latents -> uint8 RGB frames and a stereo waveform with the diffusers MiniMax-H3 VAEs (spec §11.1, §11.2).

The VAEs themselves are reused unchanged (``AutoencoderKLMiniMaxH3``, ``AutoencoderKLMiniMaxH3Audio``, spatial tiling
left at its on-by-default release setting). What is written here is the post-processing that diffusers keeps in its
modular ``decoders.py`` blocks (which need a whole ``ModularPipeline`` state to run): per-channel latent
denormalization, ImageNet pixel de-normalization, clamping, uint8 rounding, and the stereo-rows unpacking.
"""

from __future__ import annotations

import contextlib

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
AUDIO_CHANNELS = 2  # stereo; the mono audio VAE takes the two channels as a batch of 2


def _latent_stats(config, name: str, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    mean, std = config.latents_mean, config.latents_std
    if mean is None or std is None or len(mean) != channels or len(std) != channels:
        raise ValueError(
            f"{name} config must hold {channels} latents_mean and latents_std values, got "
            f"{None if mean is None else len(mean)} and {None if std is None else len(std)}"
        )
    return torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)


@torch.inference_mode()
def decode_video(
    vae,
    latents: torch.Tensor,
    cuda_autocast_dtype: torch.dtype | None = torch.float16,
) -> torch.Tensor:
    """Decode ``[1, 24, T, Hl, Wl]`` normalized latents (T = 5n+2, n >= 1) to uint8 frames ``[17n+5, 16Hl, 16Wl, 3]``.

    Steps: ``z = latents·std + mean`` (per channel, from ``vae.config``); ``vae.decode(z)`` -> ``[1, 3, N, H, W]`` in
    ImageNet-normalized space; ``x·imagenet_std + imagenet_mean``; clamp to [0, 1]; ``round(255·x)``. On CUDA the
    decode runs under autocast in ``cuda_autocast_dtype`` (fp16, as the references do; None for full fp32). The
    returned frames are on the CPU.
    """
    channels = vae.config.latent_channels
    if latents.ndim != 5 or latents.shape[0] != 1 or latents.shape[1] != channels:
        raise ValueError(f"video latents must be [1, {channels}, T, Hl, Wl], got {list(latents.shape)}")
    num_latent_frames = latents.shape[2]
    if num_latent_frames < 7 or (num_latent_frames - 2) % 5 != 0:
        raise ValueError(f"video latent frames must be 5n+2 with n >= 1 (7, 12, ..., 32, ...), got {num_latent_frames}")

    device = latents.device
    mean, std = _latent_stats(vae.config, "video VAE", channels)
    z = latents.float() * std.to(device).view(1, -1, 1, 1, 1) + mean.to(device).view(1, -1, 1, 1, 1)

    if device.type == "cuda" and cuda_autocast_dtype is not None:
        precision = torch.autocast("cuda", dtype=cuda_autocast_dtype)
    else:
        precision = contextlib.nullcontext()
    with precision:
        video = vae.decode(z, return_dict=False)[0]  # [1, 3, N, H, W], ImageNet-normalized

    pixel_mean = torch.tensor(IMAGENET_MEAN, device=video.device).view(1, 3, 1, 1, 1)
    pixel_std = torch.tensor(IMAGENET_STD, device=video.device).view(1, 3, 1, 1, 1)
    pixels = (video.float() * pixel_std + pixel_mean).clamp(0.0, 1.0)
    frames = torch.round(pixels * 255.0).to(torch.uint8)  # [1, 3, N, H, W]
    return frames[0].permute(1, 2, 3, 0).contiguous().cpu()  # [N, H, W, 3]


@torch.inference_mode()
def decode_audio(audio_vae, audio_rows: torch.Tensor) -> torch.Tensor:
    """Decode the ``[2A, 32]`` channel-major audio rows to a float32 stereo waveform ``[2, 800A]`` in [-1, 1].

    Rows ``0..A-1`` are the left channel's latents, ``A..2A-1`` the right's; they are unpacked to ``[2, 32, A]``,
    denormalized per channel with ``audio_vae.config`` statistics, and decoded with the stereo channels as the batch.
    The VAE runs in its own dtype (fp32 in the release; bf16 decodes come out ~20 dB quieter). Returned on the CPU.
    """
    channels = audio_vae.config.latent_channels
    if audio_rows.ndim != 2 or audio_rows.shape[1] != channels or audio_rows.shape[0] % AUDIO_CHANNELS != 0:
        raise ValueError(f"audio rows must be [2A, {channels}] with A >= 1, got {list(audio_rows.shape)}")
    num_latents = audio_rows.shape[0] // AUDIO_CHANNELS
    if num_latents < 1:
        raise ValueError(f"audio rows must be [2A, {channels}] with A >= 1, got {list(audio_rows.shape)}")

    device = audio_rows.device
    latents = audio_rows.float().reshape(AUDIO_CHANNELS, num_latents, channels).permute(0, 2, 1)  # [2, 32, A]
    mean, std = _latent_stats(audio_vae.config, "audio VAE", channels)
    z = latents * std.to(device).view(1, -1, 1) + mean.to(device).view(1, -1, 1)

    waveform = audio_vae.decode(z, return_dict=False)[0]  # [2, 1, 800A]
    return waveform.float().clamp(-1.0, 1.0)[:, 0, :].contiguous().cpu()  # [2, 800A]
