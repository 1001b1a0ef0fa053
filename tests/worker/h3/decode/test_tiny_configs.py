"""The tiny configs keep the release contracts while shrinking widths (worker/h3/tiny_configs.py)."""
from __future__ import annotations

import math

import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from h3batch.worker.h3.tiny_configs import (
    TINY_AUDIO_VAE,
    TINY_TEXT_DIM,
    TINY_TEXT_ENCODER,
    TINY_TEXT_HIDDEN_LAYER,
    TINY_VIDEO_VAE,
)


def test_video_vae_geometry_matches_release():
    """24 latent channels, ×16 spatial, ×4 temporal, 17/3 chunking, default 256-px tiling on, non-trivial stats."""
    vae = AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE)
    assert vae.config.latent_channels == 24
    assert (vae.spatial_compression_ratio, vae.temporal_compression_ratio) == (16, 4)
    assert (vae.config.clip_length, vae.config.token_drop) == (17, 3)
    assert vae.use_tiling and vae.tile_sample_min_width == vae.tile_sample_min_height == 256
    assert vae._split_tiles(256, 256, 64) == ([0], [256], [])  # a 256×128 canvas is one tile
    assert len(set(vae.config.latents_mean)) > 1 and all(s != 1.0 for s in vae.config.latents_std)
    assert sum(p.numel() for p in vae.decoder.parameters()) < 200_000


def test_audio_vae_geometry_matches_release():
    """32 latent channels, hop 800 (40 latents/s at 32 kHz), decoder narrowing to one output channel."""
    vae = AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE)
    assert vae.config.latent_channels == 32
    assert vae.hop_length == 800 == math.prod(vae.config.decoder_rates)
    assert vae.config.sampling_rate == 32_000
    assert len(vae.config.latents_mean) == len(vae.config.latents_std) == 32
    assert sum(p.numel() for p in vae.parameters()) < 1_000_000


def test_text_encoder_shape_contracts():
    """Hidden 80 (tiny DiT text_dim), heads·head_dim ≠ hidden, mRoPE sections sum to head_dim/2, the conditioning
    layer below the top, vision ids inside the vocab."""
    config = Qwen3VLConfig(**TINY_TEXT_ENCODER)
    text = config.text_config
    assert text.hidden_size == TINY_TEXT_DIM == 80
    assert text.num_attention_heads * text.head_dim != text.hidden_size
    assert text.num_attention_heads % text.num_key_value_heads == 0
    assert sum(text.rope_parameters["mrope_section"]) == text.head_dim // 2
    assert 1 <= TINY_TEXT_HIDDEN_LAYER < text.num_hidden_layers
    assert max(config.image_token_id, config.video_token_id, config.vision_start_token_id) < text.vocab_size


def test_text_encoder_hidden_states_layout():
    """The tiny model returns num_layers+1 hidden states whose last entry is the normed output (the §8 pitfall),
    while hidden_states[TINY_TEXT_HIDDEN_LAYER] is not normed."""
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**TINY_TEXT_ENCODER)).eval()
    ids = torch.arange(1, 13)[None]
    with torch.no_grad():
        out = model.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False,
                          output_hidden_states=True)
    assert len(out.hidden_states) == model.config.text_config.num_hidden_layers + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    rms = out.hidden_states[TINY_TEXT_HIDDEN_LAYER].pow(2).mean(-1).sqrt()
    assert not torch.allclose(rms, torch.ones_like(rms), atol=0.05)
