"""Native (MiniMax remote-code) VAE format <-> diffusers VAEs: key table, strictness, config translation, loading."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from h3batch.worker.h3 import vae_checkpoint_convert
from h3batch.worker.h3.base_vae_fetch import fetch_base_vaes
from h3batch.worker.h3.tiny_configs import TINY_AUDIO_VAE, TINY_VIDEO_VAE
from h3batch.worker.h3.tiny_release import random_audio_vae, random_video_vae
from h3batch.worker.h3.vae_checkpoint_convert import (
    AUDIO_VAE_RULES,
    VIDEO_VAE_RULES,
    diffusers_to_native,
    load_audio_vae,
    load_video_vae,
    native_to_diffusers,
)

SEED = 0
HEADS = TINY_VIDEO_VAE["decoder_num_attention_heads"]


@pytest.fixture(scope="module")
def video_state():
    return random_video_vae(SEED).state_dict()


@pytest.fixture(scope="module")
def audio_state():
    return random_audio_vae(SEED).state_dict()


@pytest.fixture
def fl2va_copy(tiny, tmp_path):
    """A mutable copy of the fetched FL2VA root (real files, not cache symlinks)."""
    return shutil.copytree(fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache), tmp_path / "FL2VA")


def _shapes(state):
    return {k: v.shape for k, v in state.items()}


def _to_diffusers_video(native, video_state):
    return native_to_diffusers(sorted(native.items()), VIDEO_VAE_RULES, _shapes(video_state), qkv_heads=HEADS)


def test_video_round_trip_is_exact(video_state):
    """diffusers -> native -> diffusers returns every video-VAE tensor bit for bit."""
    native = diffusers_to_native(video_state, VIDEO_VAE_RULES, qkv_heads=HEADS)
    back = _to_diffusers_video(native, video_state)
    assert back.keys() == video_state.keys()
    assert all(torch.equal(back[k], video_state[k]) for k in video_state)


def test_audio_round_trip_is_exact(audio_state):
    """The audio mapping is the identity on names and tensors, and round-trips exactly."""
    native = diffusers_to_native(audio_state, AUDIO_VAE_RULES)
    assert native.keys() == audio_state.keys()
    back = native_to_diffusers(native.items(), AUDIO_VAE_RULES, _shapes(audio_state))
    assert all(torch.equal(back[k], audio_state[k]) for k in audio_state)


def test_native_names_follow_the_conversion_script(video_state):
    """Native names use the original spelling: down.i.block.j, nin_shortcut, downsample, x_embedder, to_qkv, w1/w2."""
    native = diffusers_to_native(video_state, VIDEO_VAE_RULES, qkv_heads=HEADS)
    for name in (
        "encoder.down.0.block.0.conv1.weight",
        "encoder.down.1.block.0.nin_shortcut.weight",
        "encoder.down.0.downsample.conv.weight",
        "decoder.x_embedder.weight",
        "decoder.transformer_blocks.1.attn.to_qkv.bias",
        "decoder.transformer_blocks.1.attn.to_out.weight",
        "decoder.transformer_blocks.0.ff.w1.weight",
        "decoder.transformer_blocks.0.ff.w2.bias",
        "decoder.register_tokens",
        "quant_conv.weight",
    ):
        assert name in native, name
    # Per ViT block (2 here) the six q/k/v weights and biases fuse into one to_qkv weight and bias.
    assert len(native) == len(video_state) - 4 * TINY_VIDEO_VAE["decoder_num_layers"]


def test_qkv_is_split_per_head_interleaved():
    """Spec §3.2 fixture: 2 heads x 2 dims, rows [h0 q k v, h1 q k v] -> q rows 0,1,6,7; k 2,3,8,9; v 4,5,10,11."""
    rule_key = "decoder.transformer_blocks.0.attn.to_qkv.weight"
    fused = torch.arange(12, dtype=torch.float32)[:, None].repeat(1, 3)
    shapes = {f"decoder.transformer_blocks.0.attn.to_{p}.weight": torch.Size([4, 3]) for p in "qkv"}
    out = native_to_diffusers([(rule_key, fused)], VIDEO_VAE_RULES, shapes, qkv_heads=2)
    assert out["decoder.transformer_blocks.0.attn.to_q.weight"][:, 0].tolist() == [0, 1, 6, 7]
    assert out["decoder.transformer_blocks.0.attn.to_k.weight"][:, 0].tolist() == [2, 3, 8, 9]
    assert out["decoder.transformer_blocks.0.attn.to_v.weight"][:, 0].tolist() == [4, 5, 10, 11]
    assert torch.equal(diffusers_to_native(out, VIDEO_VAE_RULES, qkv_heads=2)[rule_key], fused)


def test_ff_halves_are_swapped():
    """Spec §3.3 fixture: native w1 [gate; up] (6x3) becomes diffusers [up; gate] = cat(W[3:], W[:3])."""
    w = torch.arange(18, dtype=torch.float32).reshape(6, 3)
    key = "decoder.transformer_blocks.0.ff.net.0.proj.weight"
    out = native_to_diffusers(
        [("decoder.transformer_blocks.0.ff.w1.weight", w)], VIDEO_VAE_RULES, {key: torch.Size([6, 3])}
    )
    assert torch.equal(out[key], torch.cat([w[3:], w[:3]]))


def test_mask_token_is_dropped(video_state):
    """The native decoder's unused mask token maps to nothing and is not reported as unknown."""
    native = diffusers_to_native(video_state, VIDEO_VAE_RULES, qkv_heads=HEADS)
    native["decoder.mask_token"] = torch.zeros(1, 1, 32)
    assert _to_diffusers_video(native, video_state).keys() == video_state.keys()


@pytest.fixture
def video_native(video_state):
    return diffusers_to_native(video_state, VIDEO_VAE_RULES, qkv_heads=HEADS)


def test_unknown_key_raises(video_state, video_native):
    """A native name no rule knows raises `unsupported native VAE weight` naming it."""
    video_native["decoder.transformer_blocks.0.attn.not_a_projection.weight"] = torch.zeros(2)
    name = r"decoder\.transformer_blocks\.0\.attn\.not_a_projection\.weight"
    with pytest.raises(ValueError, match=rf"unsupported native VAE weight: {name}"):
        _to_diffusers_video(video_native, video_state)


def test_key_without_model_parameter_raises(video_state, video_native):
    """A well-formed name for a block the model lacks raises naming both spellings."""
    video_native["decoder.transformer_blocks.7.norm1.weight"] = torch.zeros(32)
    with pytest.raises(ValueError, match=r"no model parameter: decoder\.transformer_blocks\.7\.norm1\.weight -> "):
        _to_diffusers_video(video_native, video_state)


def test_duplicate_key_raises(video_state, video_native):
    """The same native name twice (e.g. from two weight files) raises `duplicate native VAE weight`."""
    items = sorted(video_native.items()) + [("quant_conv.bias", video_native["quant_conv.bias"])]
    with pytest.raises(ValueError, match=r"duplicate native VAE weight: quant_conv\.bias"):
        native_to_diffusers(items, VIDEO_VAE_RULES, _shapes(video_state), qkv_heads=HEADS)


def test_shape_mismatch_raises(video_state, video_native):
    """A tensor whose mapped shape differs from the model's raises naming the key, got and expected shapes."""
    video_native["decoder.x_embedder.weight"] = torch.zeros(32, 23)
    expected = r"decoder\.x_embedder\.weight -> decoder\.proj_in\.weight: got \[32, 23\] vs expected \[32, 24\]"
    with pytest.raises(ValueError, match=rf"shape mismatch .*{expected}"):
        _to_diffusers_video(video_native, video_state)


def test_missing_key_raises(video_state, video_native, audio_state):
    """An absent native tensor raises `missing` naming the diffusers key(s) left empty, for both VAEs."""
    del video_native["decoder.transformer_blocks.1.attn.to_qkv.bias"]
    with pytest.raises(ValueError, match=r"missing .*decoder\.transformer_blocks\.1\.attn\.to_k\.bias"):
        _to_diffusers_video(video_native, video_state)
    audio = dict(audio_state)
    gone = sorted(audio)[0]
    del audio[gone]
    with pytest.raises(ValueError, match=rf"missing native VAE weights for diffusers keys: {gone}$"):
        native_to_diffusers(audio.items(), AUDIO_VAE_RULES, _shapes(audio_state))


def test_configs_translate_both_ways():
    """Native configs written for the tiny VAEs read back as exactly the tiny diffusers kwargs."""
    wrapper, source = vae_checkpoint_convert.video_config_to_native(TINY_VIDEO_VAE)
    assert source["ch"] == 8 and source["ch_mult"] == [1, 2, 2, 4] and source["vit_decoder_kwargs"]["heads"] == 2
    assert vae_checkpoint_convert.video_config_from_native(wrapper, source, "video_vae") == {
        k: vae_checkpoint_convert._norm(v) for k, v in TINY_VIDEO_VAE.items()
    }
    metadata, audio_wrapper = vae_checkpoint_convert.audio_config_to_native(TINY_AUDIO_VAE)
    assert metadata["metadata"]["kwargs"]["vae_latent_channels"] == 32 and audio_wrapper["sample_rate"] == 32000
    assert vae_checkpoint_convert.audio_config_from_native(metadata, audio_wrapper, "audio_vae") == {
        k: vae_checkpoint_convert._norm(v) for k, v in TINY_AUDIO_VAE.items()
    }
    assert vae_checkpoint_convert.bigvgan_kernel_sizes([5, 5, 2, 2, 2, 2, 2]) == [9, 9, 4, 4, 4, 4, 4]


def test_loaded_vaes_equal_the_randomised_originals(tiny, video_state, audio_state):
    """load_video_vae / load_audio_vae from the fetched base repo reproduce the diffusers VAEs' weights exactly."""
    root = fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache)
    video, audio = load_video_vae(root), load_audio_vae(root)
    for model, original in ((video, video_state), (audio, audio_state)):
        loaded = model.state_dict()
        assert loaded.keys() == original.keys()
        assert all(torch.equal(loaded[k], original[k]) for k in original)
    assert list(video.config.block_out_channels) == list(TINY_VIDEO_VAE["block_out_channels"])
    assert video.use_tiling and video.tile_sample_min_height == 256 and video.tile_sample_min_overlap_width == 64
    assert list(audio.config.latents_mean) == TINY_AUDIO_VAE["latents_mean"]


def test_loaded_vaes_decode_to_the_contract_lengths(tiny):
    """T = 7 latents decode to 22 frames x 16 px per latent; A = 37 audio latents to 800·37 samples (§11)."""
    root = fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache)
    with torch.no_grad():
        frames = load_video_vae(root).decode(torch.randn(1, 24, 7, 8, 16)).sample
        wave = load_audio_vae(root).decode(torch.randn(2, 32, 37)).sample
    assert frames.shape == (1, 3, 22, 128, 256) and torch.isfinite(frames).all() and frames.std() > 0.05
    assert wave.shape == (2, 1, 29600) and wave.abs().max() <= 1 and wave.std() > 0.01


def test_bf16_load_keeps_pinned_modules_fp32(tiny):
    """A bf16 video VAE keeps diffusers' fp32-pinned modules (encoder, norms, scales) in fp32."""
    root = fetch_base_vaes(tiny.release_dir, cache_dir=tiny.hf_cache)
    vae = load_video_vae(root, dtype=torch.bfloat16)
    assert vae.decoder.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    assert vae.decoder.transformer_blocks[0].norm1.weight.dtype == torch.float32
    assert vae.encoder.conv_in.weight.dtype == torch.float32


def test_native_architecture_switch_is_refused(fl2va_copy):
    """A native config that describes a different architecture (CNN decoder, non-BigVGAN audio) is refused."""
    source_cfg = fl2va_copy / "video_vae" / "source" / "config.json"
    data = json.loads(source_cfg.read_text())
    data["use_vit_decoder"] = False
    source_cfg.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="use_vit_decoder=False, expected True"):
        load_video_vae(fl2va_copy)
    metadata = fl2va_copy / "audio_vae" / "metadata.json"
    data = json.loads(metadata.read_text())
    data["metadata"]["kwargs"]["decoder_type"] = "hifigan"
    metadata.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="decoder_type='hifigan', expected 'bigvgan'"):
        load_audio_vae(fl2va_copy)


def test_loader_rejects_unknown_tensor_in_weight_file(fl2va_copy):
    """An extra tensor in the native video weights file makes load_video_vae raise naming it."""
    weights = fl2va_copy / "video_vae" / "source" / "model.safetensors"
    tensors = load_file(str(weights))
    tensors["decoder.extra_head.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(weights))
    with pytest.raises(ValueError, match=r"unsupported native VAE weight: decoder\.extra_head\.weight"):
        load_video_vae(fl2va_copy)
