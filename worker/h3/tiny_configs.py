"""Tiny configurations of the reused models (video VAE, audio VAE, Qwen3-VL text encoder) for CPU tests.

Each dict holds constructor kwargs:

* ``TINY_VIDEO_VAE``   -> ``diffusers.AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE)``
* ``TINY_AUDIO_VAE``   -> ``diffusers.AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE)``
* ``TINY_TEXT_ENCODER`` -> ``transformers.Qwen3VLConfig(**TINY_TEXT_ENCODER)``, then
  ``Qwen3VLForConditionalGeneration(config)``

They keep every contract the serving path relies on (spec §2.2, §8, §11) and shrink only widths and depths:

* video VAE: 24 latent channels, x16 spatial (2·2·2·2), x4 temporal (1·2·2·1), clip_length 17 / token_drop 3, so
  T = 5n+2 latents decode to exactly 17n+5 frames; ViT decoder 2 layers x 2 heads x 16 (width 32), 4 registers.
  Spatial tiling stays at the class default (on, 256-px tiles, 64-px minimum overlap): a 256x128 canvas fits in
  one tile, so tiling is a no-op there, while a canvas wider or taller than 256 px exercises the blended tiles
  exactly as the release does.
* audio VAE: 32 latent channels, encoder strides 2·4·4·5·5 and decoder rates 5·5·2·2·2·2·2 (hop 800 at 32 kHz),
  decoder width 128 so the seven halvings end at 1 channel, one AMP kernel per stage instead of three.
* text encoder: hidden 80 (= the tiny DiT's ``text_dim``), 3 decoder layers, 4 query / 2 KV heads x 16 (heads x
  head_dim = 64 != hidden, like 64x128 != 5120 in the release), per-head q/k RMSNorm eps 1e-6, RoPE theta 5e6 with
  interleaved mRoPE sections [4, 2, 2] (sum = head_dim/2, as [24, 20, 20] is for 128), vocab 512. The vision tower
  is required by ``Qwen3VLForConditionalGeneration`` and is made as small as it allows; it is never run.

``TINY_TEXT_HIDDEN_LAYER`` is the ``hidden_states`` index the tiny pipeline conditions on: 2 = the residual after
decoder layer 1, before the final norm, one layer short of the top just as 50 is short of the release's depth
(§8 pitfall: the last ``hidden_states`` entry is post-norm).

Latent statistics are non-trivial on purpose (mean != 0, std != 1) so tests can see that denormalization happens.
Note the video ViT decoder initialises its residual scales (``scale1``/``scale2``) to zero, so a freshly built tiny
video VAE's blocks are identities until its weights are randomised or loaded.
"""

from __future__ import annotations

VIDEO_LATENT_CHANNELS = 24
AUDIO_LATENT_CHANNELS = 32
TINY_TEXT_DIM = 80

TINY_VIDEO_VAE: dict = {
    "in_channels": 3,
    "out_channels": 3,
    "latent_channels": VIDEO_LATENT_CHANNELS,
    "block_out_channels": (8, 16, 16, 32),
    "layers_per_block": 1,
    "spatial_downsample_factors": (2, 2, 2, 2),
    "temporal_downsample_factors": (1, 2, 2, 1),
    "norm_num_groups": 4,
    "norm_eps": 1e-6,
    "spatial_padding_mode": "reflect",
    "decoder_num_layers": 2,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16,
    "decoder_num_register_tokens": 4,
    "decoder_ffn_mult": 2,
    "decoder_rope_theta": 100.0,
    "decoder_rope_dim_ratio": 0.75,  # 12 of 16 head channels rotated; 12 divisible by 2·3 axes
    "decoder_norm_eps": 1e-5,
    "clip_length": 17,
    "token_drop": 3,
    # Per-channel latent statistics: mean in [-0.24, 0.22], std in [0.5, 0.96].
    "latents_mean": tuple(round(0.02 * (c - 12), 4) for c in range(VIDEO_LATENT_CHANNELS)),
    "latents_std": tuple(round(0.5 + 0.02 * c, 4) for c in range(VIDEO_LATENT_CHANNELS)),
}

TINY_AUDIO_VAE: dict = {
    "encoder_dim": 4,
    "encoder_rates": (2, 4, 4, 5, 5),  # hop 800
    "latent_dim": 64,  # must be a multiple of latent_channels
    "latent_channels": AUDIO_LATENT_CHANNELS,
    "num_attention_heads": 2,
    "decoder_dim": 128,  # halved by each of the 7 upsamplers: 64, 32, 16, 8, 4, 2, 1
    "decoder_rates": (5, 5, 2, 2, 2, 2, 2),  # product 800
    "decoder_kernel_sizes": (9, 9, 4, 4, 4, 4, 4),
    "resblock_kernel_sizes": (3,),
    "resblock_dilation_sizes": ((1, 3),),
    "sampling_rate": 32000,
    "latents_mean": [round(0.03 * (c - 16), 4) for c in range(AUDIO_LATENT_CHANNELS)],
    "latents_std": [round(0.6 + 0.02 * c, 4) for c in range(AUDIO_LATENT_CHANNELS)],
}

TINY_TEXT_VOCAB = 512

TINY_TEXT_ENCODER: dict = {
    "text_config": {
        "vocab_size": TINY_TEXT_VOCAB,
        "hidden_size": TINY_TEXT_DIM,
        "intermediate_size": 160,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 5_000_000.0,
            "mrope_section": [4, 2, 2],
            "mrope_interleaved": True,
        },
    },
    "vision_config": {
        "depth": 1,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_heads": 2,
        "patch_size": 16,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": TINY_TEXT_DIM,
        "num_position_embeddings": 16,
        "deepstack_visual_indexes": [0],
    },
    # Vision special tokens placed at the top of the tiny vocab (the release uses 151652..151656).
    "vision_start_token_id": TINY_TEXT_VOCAB - 4,
    "vision_end_token_id": TINY_TEXT_VOCAB - 3,
    "image_token_id": TINY_TEXT_VOCAB - 2,
    "video_token_id": TINY_TEXT_VOCAB - 1,
    "tie_word_embeddings": False,
}

TINY_TEXT_HIDDEN_LAYER = 2
"""``hidden_states`` index for the tiny encoder: residual after decoder layer index 1, pre-final-norm."""
