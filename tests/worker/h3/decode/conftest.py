"""Tiny reused models for the decode/encode room: a Qwen3-VL text encoder + byte-level BPE tokenizer saved to disk,
and the two MiniMax-H3 VAEs with seeded random weights, all built from worker/h3/tiny_configs.py."""
from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3VLConfig, Qwen3VLForConditionalGeneration

from h3batch.worker.h3.tiny_configs import TINY_AUDIO_VAE, TINY_TEXT_ENCODER, TINY_VIDEO_VAE

CORPUS = [
    "A red fox runs across a snowy field at dawn, its breath steaming in the cold air.",
    "Waves crash against black rocks while seagulls circle above a lighthouse.",
    "A jazz trio plays in a dim club; the drummer brushes the snare softly.",
    "Rain falls on a tin roof as a kettle whistles in the kitchen.",
] * 8

BOS = "<|bos|>"


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE (Qwen-like) trained on a fixed corpus, with a BOS post-processor so that
    ``add_special_tokens`` visibly matters."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=[BOS], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS)


def randomize_(module: torch.nn.Module, seed: int, scale: float = 0.05) -> torch.nn.Module:
    """Overwrite every parameter with seeded N(0, scale²) noise (the VAEs initialise some residual scales to 0)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return module


@pytest.fixture(scope="session")
def tiny_text_dirs(tmp_path_factory):
    """(text_encoder_dir, tokenizer_dir) of a seeded tiny Qwen3-VL saved in bf16 and its tokenizer."""
    root = tmp_path_factory.mktemp("tiny_text")
    torch.manual_seed(0)
    model = Qwen3VLForConditionalGeneration(Qwen3VLConfig(**TINY_TEXT_ENCODER)).to(torch.bfloat16)
    model.save_pretrained(root / "text_encoder")
    build_tokenizer().save_pretrained(root / "tokenizer")
    return root / "text_encoder", root / "tokenizer"


@pytest.fixture(scope="session")
def tiny_video_vae():
    return randomize_(AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE), seed=1).eval()


def audio_vae_with_gain(gain: float, seed: int) -> AutoencoderKLMiniMaxH3Audio:
    """Random tiny audio VAE whose weight-normalised convolutions all have norm ``gain``: with plain N(0, 0.05²)
    norms the latents barely reach the output, 0.7 keeps them audible below clipping, 1.0 clips."""
    vae = randomize_(AutoencoderKLMiniMaxH3Audio(**TINY_AUDIO_VAE), seed=seed).eval()
    with torch.no_grad():
        for name, parameter in vae.named_parameters():
            if name.endswith("weight_g"):
                parameter.fill_(gain)
    return vae


@pytest.fixture(scope="session")
def tiny_audio_vae():
    return audio_vae_with_gain(0.7, seed=2)


@pytest.fixture(scope="session")
def loud_audio_vae():
    return audio_vae_with_gain(1.0, seed=2)


@pytest.fixture(scope="session")
def loud_video_vae():
    """A tiny video VAE whose output projection is 40× larger, so decoded pixels overshoot [0, 1] and clamp."""
    vae = randomize_(AutoencoderKLMiniMaxH3(**TINY_VIDEO_VAE), seed=6).eval()
    with torch.no_grad():
        vae.decoder.proj_out.weight.mul_(40.0)
    return vae
