"""Native MiniMax-H3 parity: h3batch's pipeline (our DiT, sampler, packing, text encoder, conditioning) against
diffusers 0.42.1's `MiniMaxH3ModularPipeline` on the tiny native release, fp32 on the CPU.

The latents after the denoising loop (video [1, 24, T, Hl, Wl] and audio [2, 32, A]) are compared with
`torch.equal`: bit-identical, no tolerance. Two adaptations of the oracle to tiny size, neither touching its numbers:
its `text_encoder_layer` (a constant 50) reads layer 2 of the 3-layer tiny encoder, as the release's
h3batch_sampling.json says; and its `processor` (a `Qwen3VLProcessor`, whose constructor needs torchvision, absent
here) is assembled around the same PIL image processor and tokenizer the worker loads.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from h3batch.core.geometry import RequestGeometry
from h3batch.worker.h3 import contract, packing
from h3batch.worker.h3.loader import load_transformer
from h3batch.worker.h3.text_encoder import TextEncoder
from h3batch.worker.pipeline import Pipeline, RenderRequest, load_native_vaes, load_vision

WIDTH, HEIGHT, SECONDS, SEED = 256, 128, 5.0, 7  # 5 s: the native release's shortest clip
PROMPT = "a red fox runs across the snow"
_rng = np.random.default_rng(0)
FIRST = Image.fromarray(_rng.integers(0, 256, (100, 180, 3), dtype=np.uint8))  # another aspect: stretched
LAST = Image.fromarray(_rng.integers(0, 256, (150, 200, 3), dtype=np.uint8))  # with FIRST: cover-cropped

CASES = {
    "t2va": ("t2va", {}, {}),
    "fl2va-first": ("fl2va", {"image": FIRST}, {"first_frame": FIRST}),
    "fl2va-last": ("fl2va", {"last_image": LAST}, {"last_frame": LAST}),
    "fl2va-both": ("fl2va", {"image": FIRST, "last_image": LAST}, {"first_frame": FIRST, "last_frame": LAST}),
    "ref2va": ("ref2va", {}, {"references": (FIRST, LAST)}),
}


def _oracle(release, workflow: str, monkeypatch):
    from diffusers import ModularPipeline
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline
    from transformers import Qwen2VLImageProcessorPil, Qwen3VLProcessor

    monkeypatch.setattr(MiniMaxH3ModularPipeline, "text_encoder_layer", property(lambda self: 2))
    pipe = ModularPipeline.from_pretrained(str(release), workflow=workflow)
    pipe.load_components(torch_dtype=torch.float32)
    processor = object.__new__(Qwen3VLProcessor)  # see the module docstring
    processor.image_processor = Qwen2VLImageProcessorPil.from_pretrained(release / contract.PROCESSOR_DIR)
    processor.tokenizer = pipe.tokenizer
    processor.image_token_id = pipe.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    processor.video_token_id = pipe.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    pipe.update_components(processor=processor)
    return pipe


@pytest.fixture(scope="module")
def ours(native):
    """h3batch's pipeline on the tiny native release with every model in fp32 (Pipeline.load serves bf16)."""
    root = native.release_dir
    info = contract.validate_release(root)
    dit = load_transformer(root / "transformer", vsa_gates=False, dtype=torch.float32)
    text = TextEncoder.load(root / "text_encoder", root / "tokenizer", info.text_hidden_layer, "cpu",
                            dtype=torch.float32)
    video_vae, audio_vae = load_native_vaes(root)
    pipe = Pipeline(info, dit, text, video_vae, audio_vae, torch.device("cpu"))
    pipe.vision = load_vision(root, torch.device("cpu"))
    pipe.ref_dit = load_transformer(root / "transformer_ref", vsa_gates=False, dtype=torch.float32)
    return pipe


def _our_latents(pipe, task, images):
    geo = RequestGeometry(WIDTH, HEIGHT, SECONDS)
    clip = pipe.denoise(RenderRequest(prompt=PROMPT, seconds=SECONDS, width=WIDTH, height=HEIGHT, seed=SEED,
                                      task=task, **images))
    video = packing.unpatchify_video(clip.video, geo.latent_frames, geo.latent_height, geo.latent_width)
    return video, packing.unpack_audio(clip.audio[0])


@pytest.mark.parametrize("case", list(CASES))
def test_latents_after_the_loop_equal_diffusers(native, ours, case, monkeypatch):
    """t2va, fl2va (first, last, both keyframes) and ref2va (two image references, on transformer_ref/): our
    latents after the loop are bit-identical to diffusers' MiniMaxH3ModularPipeline's for the same prompt, canvas,
    frame count, seed and 4-point grid."""
    task, oracle_images, our_images = CASES[case]
    oracle = _oracle(native.release_dir, task, monkeypatch)
    geo = RequestGeometry(WIDTH, HEIGHT, SECONDS)
    if task == "ref2va":  # diffusers' reference dataclass, in the order the prompt reads them
        from diffusers.modular_pipelines.minimax_h3.references import MiniMaxH3ImageReference

        oracle_images = {"references": [MiniMaxH3ImageReference(image=FIRST), MiniMaxH3ImageReference(image=LAST)]}
    out = oracle(prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=geo.num_frames,
                 generator=torch.Generator().manual_seed(SEED), num_inference_steps=4, **oracle_images,
                 output=["latents", "audio_latents"])
    video, audio = _our_latents(ours, task, our_images)
    assert torch.equal(video, out["latents"]) and torch.equal(audio, out["audio_latents"])


def test_keyframes_change_the_clip(ours):
    """The images are conditioning, not decoration: each fl2va variant's and ref2va's latents differ from t2va's and
    from each other's (same prompt and seed)."""
    results = {case: _our_latents(ours, task, images)[0] for case, (task, _, images) in CASES.items()}
    cases = list(results)
    for i, a in enumerate(cases):
        for b in cases[i + 1:]:
            assert not torch.equal(results[a], results[b]), (a, b)


def test_native_ladder_is_the_schedulers(native):
    """The native ladders equal MiniMaxH3Scheduler.set_timesteps on the release's own scheduler configs, for the
    tiny 4-point grid and the published 50-point one (49 forwards)."""
    from diffusers import MiniMaxH3Scheduler

    from h3batch.worker.h3.sampler import SigmaLadder

    video = MiniMaxH3Scheduler.from_pretrained(native.release_dir / "scheduler")
    audio = MiniMaxH3Scheduler.from_pretrained(native.release_dir / "audio_scheduler")
    for points in (4, 50):
        ladder = SigmaLadder.native(points, video.config.shift, audio.config.shift)
        video.set_timesteps(points)
        audio.set_timesteps(points)
        assert torch.equal(ladder.video_sigmas, video.sigmas) and torch.equal(ladder.audio_sigmas, audio.sigmas)
        assert ladder.num_steps == points - 1
