"""CUDA paths of the decode room: fp16-autocast video decode and the text encoder on the GPU agree with the CPU."""
from __future__ import annotations

import contextlib

import pytest
import torch

from h3batch.worker.h3.decode import decode_audio, decode_video
from h3batch.worker.h3.text_encoder import TextEncoder
from h3batch.worker.h3.tiny_configs import TINY_TEXT_HIDDEN_LAYER

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")



@contextlib.contextmanager
def on_cuda(module):
    """The session's CPU module moved to CUDA for one test, and back afterwards (other tests share it)."""
    try:
        yield module.to("cuda")
    finally:
        module.to("cpu")

def test_cuda_video_decode_under_fp16_autocast_matches_cpu(tiny_video_vae):
    """On CUDA the video decodes under fp16 autocast (as the references) to frames within 2 levels of the CPU fp32
    decode on 99.9 % of pixels, and returns CPU uint8."""
    latents = torch.randn(1, 24, 7, 8, 16, generator=torch.Generator().manual_seed(0))
    reference = decode_video(tiny_video_vae, latents)
    with on_cuda(tiny_video_vae) as vae:
        frames = decode_video(vae, latents.to("cuda"))
    assert frames.device.type == "cpu" and frames.dtype == torch.uint8 and frames.shape == reference.shape
    close = (frames.int() - reference.int()).abs() <= 2
    assert close.float().mean() > 0.999


def test_cuda_audio_decode_matches_cpu(tiny_audio_vae):
    """The fp32 audio decode on CUDA matches the CPU waveform to 1e-4."""
    rows = torch.randn(2 * 37, 32, generator=torch.Generator().manual_seed(1))
    reference = decode_audio(tiny_audio_vae, rows)
    with on_cuda(tiny_audio_vae) as vae:
        wave = decode_audio(vae, rows.to("cuda"))
    torch.testing.assert_close(wave, reference, atol=1e-4, rtol=0)


def test_cuda_text_encoder_matches_cpu(tiny_text_dirs):
    """Features computed on the GPU in bf16 agree with the CPU ones within bf16 tolerance."""
    prompt = "Waves crash against black rocks while seagulls circle above a lighthouse."
    cpu_features, length = TextEncoder.load(*tiny_text_dirs, TINY_TEXT_HIDDEN_LAYER, "cpu").encode(prompt)
    gpu = TextEncoder.load(*tiny_text_dirs, TINY_TEXT_HIDDEN_LAYER, "cuda")
    gpu_features, gpu_length = gpu.encode(prompt)
    assert gpu_features.device.type == "cuda" and gpu_length == length
    torch.testing.assert_close(gpu_features.cpu().float(), cpu_features.float(), atol=5e-2, rtol=5e-2)
